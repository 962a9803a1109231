// The CPU reference of QK-norm and the half-truncated rotary (qk_norm_rotary_forward and _backward)
// in double precision, written from the definition; test_qk_rotary checks its backward against
// central differences of its forward. Included by the kernel tests that use it. Pair j of a head is
// dims (j, j + HS/2), or with adjacent (record #89's layout) (2j, 2j + 1), whose (cos, sin) are
// rounded to BF16 (RotaryFrequencies::bf16_tables).
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// freq[j] = (1/1024)^(j / (HS/4 - 1)) for j < HS/4 and 0 for HS/4 <= j < HS/2, kept in FP32.
inline std::vector<float> reference_frequencies(int HS) {
  std::vector<float> freq(HS / 2, 0.0f);
  for (int j = 0; j < HS / 4; j++) freq[j] = (float)std::pow(1.0 / 1024.0, (double)j / (HS / 4 - 1));
  return freq;
}

// The frequencies as YaRN could leave them: each rotated pair's times a factor from 1/2 to nearly 1 (its
// s + w (1 - s) at a doubling of the window), in FP32; the unturned pairs' stay 0.
inline std::vector<float> reference_rescaled_frequencies(int HS) {
  std::vector<float> freq = reference_frequencies(HS);
  for (int j = 0; j < HS / 4; j++) freq[j] *= 0.5f + 0.5f * (float)j / (float)(HS / 4);
  return freq;
}

// BF16's nearest value to x (round to nearest even; x finite).
inline double reference_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  float rounded;
  std::memcpy(&rounded, &bits, sizeof(rounded));
  return rounded;
}

// The rotation of pair j at position t: theta = t * freq[j] in FP32 (torch.outer(pos, freq)), then
// its cosine and sine in double precision; bf16_tables (record #89's layout): each as FP32 rounds
// it, then rounded to BF16, as the reference's tables hold them.
inline void reference_angle(double* c, double* s, int t, int j, const std::vector<float>& freq,
                            bool bf16_tables = false) {
  const float theta = (float)t * freq[j];
  *c = std::cos((double)theta);
  *s = std::sin((double)theta);
  if (bf16_tables) {
    *c = reference_bf16((float)*c);
    *s = reference_bf16((float)*s);
  }
}

// The dims of pair j of a head: its first, and its partner.
inline int reference_first(int j, bool adjacent) { return adjacent ? 2 * j : j; }
inline int reference_second(int j, int HS, bool adjacent) { return adjacent ? 2 * j + 1 : j + HS / 2; }

// One head's q or k at position t: y = rotary(x * rstd); returns rstd.
inline double reference_forward(double* y, const double* x, int HS, int t, const std::vector<float>& freq,
                                bool adjacent = false) {
  const int half = HS / 2;
  double squares = 0.0;
  for (int i = 0; i < HS; i++) squares += x[i] * x[i];
  const double rstd = 1.0 / std::sqrt(squares / HS + FLT_EPSILON);
  for (int j = 0; j < half; j++) {
    double c, s;
    reference_angle(&c, &s, t, j, freq, adjacent);
    const int i1 = reference_first(j, adjacent), i2 = reference_second(j, HS, adjacent);
    const double a = x[i1] * rstd, b = x[i2] * rstd;
    y[i1] = a * c + b * s;
    y[i2] = -a * s + b * c;
  }
  return rstd;
}

// The analytic gradient of reference_forward w.r.t. x from dy, from x itself: dxhat = R^T dy,
// dx = rstd * (dxhat - xhat * mean(dxhat * xhat)).
inline void reference_backward(double* dx, const double* dy, const double* x, int HS, int t,
                               const std::vector<float>& freq, bool adjacent = false) {
  const int half = HS / 2;
  double squares = 0.0;
  for (int i = 0; i < HS; i++) squares += x[i] * x[i];
  const double rstd = 1.0 / std::sqrt(squares / HS + FLT_EPSILON);
  std::vector<double> dxhat(HS);
  double dot = 0.0;
  for (int j = 0; j < half; j++) {
    double c, s;
    reference_angle(&c, &s, t, j, freq, adjacent);
    const int i1 = reference_first(j, adjacent), i2 = reference_second(j, HS, adjacent);
    dxhat[i1] = c * dy[i1] - s * dy[i2];
    dxhat[i2] = s * dy[i1] + c * dy[i2];
    dot += dxhat[i1] * x[i1] * rstd + dxhat[i2] * x[i2] * rstd;
  }
  for (int i = 0; i < HS; i++) dx[i] = rstd * (dxhat[i] - x[i] * rstd * dot / HS);
}
