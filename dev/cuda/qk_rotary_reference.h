// The CPU reference of QK-norm and the half-truncated rotary (qk_norm_rotary_forward and _backward)
// in double precision, written from the definition; test_qk_rotary checks its backward against
// central differences of its forward. Included by the kernel tests that use it.
#pragma once
#include <cfloat>
#include <cmath>
#include <vector>

// freq[j] = (1/1024)^(j / (HS/4 - 1)) for j < HS/4 and 0 for HS/4 <= j < HS/2, kept in FP32.
inline std::vector<float> reference_frequencies(int HS) {
  std::vector<float> freq(HS / 2, 0.0f);
  for (int j = 0; j < HS / 4; j++) freq[j] = (float)std::pow(1.0 / 1024.0, (double)j / (HS / 4 - 1));
  return freq;
}

// The rotation of pair j at position t: theta = t * freq[j] in FP32 (torch.outer(pos, freq)), then
// its cosine and sine in double precision.
inline void reference_angle(double* c, double* s, int t, int j, const std::vector<float>& freq) {
  const float theta = (float)t * freq[j];
  *c = std::cos((double)theta);
  *s = std::sin((double)theta);
}

// One head's q or k at position t: y = rotary(x * rstd); returns rstd.
inline double reference_forward(double* y, const double* x, int HS, int t, const std::vector<float>& freq) {
  const int half = HS / 2;
  double squares = 0.0;
  for (int i = 0; i < HS; i++) squares += x[i] * x[i];
  const double rstd = 1.0 / std::sqrt(squares / HS + FLT_EPSILON);
  for (int j = 0; j < half; j++) {
    double c, s;
    reference_angle(&c, &s, t, j, freq);
    const double a = x[j] * rstd, b = x[j + half] * rstd;
    y[j] = a * c + b * s;
    y[j + half] = -a * s + b * c;
  }
  return rstd;
}

// The analytic gradient of reference_forward w.r.t. x from dy, from x itself: dxhat = R^T dy,
// dx = rstd * (dxhat - xhat * mean(dxhat * xhat)).
inline void reference_backward(double* dx, const double* dy, const double* x, int HS, int t,
                        const std::vector<float>& freq) {
  const int half = HS / 2;
  double squares = 0.0;
  for (int i = 0; i < HS; i++) squares += x[i] * x[i];
  const double rstd = 1.0 / std::sqrt(squares / HS + FLT_EPSILON);
  std::vector<double> dxhat(HS);
  double dot = 0.0;
  for (int j = 0; j < half; j++) {
    double c, s;
    reference_angle(&c, &s, t, j, freq);
    dxhat[j] = c * dy[j] - s * dy[j + half];
    dxhat[j + half] = s * dy[j] + c * dy[j + half];
    dot += dxhat[j] * x[j] * rstd + dxhat[j + half] * x[j + half] * rstd;
  }
  for (int i = 0; i < HS; i++) dx[i] = rstd * (dxhat[i] - x[i] * rstd * dot / HS);
}
