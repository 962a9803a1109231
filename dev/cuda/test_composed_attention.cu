// Record #89's composed attention (train_gpt2.cu section 6, "Record #89's composed attention") against
// a CPU reference in double with the kernels' roundings, on random inputs: six heads of 128 over rows
// of documents (one of a token, one across a row's end) and two heads of 64 over odd rows without
// documents, a window shorter than a row, one longer and the longest; the forward's output (also in place) and
// log-sum-exp, the backward's q, k and v gradients (added to the flash backward's) and the two gates'
// rows; each twice, bit for bit. The reference's gradients are checked first against finite
// differences of its own forward (no rounding), so that the formulas both sides use are the
// forward's derivative.
#include "dev/cuda/kernel_test.h"

namespace composed_attention_tests {

struct Case {
  int rows, T, NH, C, window;
  bool documents;
};

// The inputs, as the device sees them (rounded to floatX), and each token's document.
struct Inputs {
  int N, NH, C, HS, T, window;
  float scale;
  std::vector<float> qkv, y, w_in, w_out, dout, dqkv0;  // w_in, w_out [N, NH]
  std::vector<int> documents;                            // empty: one a row
  bool sees(int t, int j) const {
    return j <= t && t - j < window && j / T == t / T && (documents.empty() || documents[j] == documents[t]);
  }
  double q(int t, int h, int d) const { return qkv[(size_t)t * 3 * C + h * HS + d]; }
  double k(int t, int h, int d) const { return qkv[(size_t)t * 3 * C + C + h * HS + d]; }
  double v(int t, int h, int d) const { return qkv[(size_t)t * 3 * C + 2 * C + h * HS + d]; }
};

Inputs make_inputs(const Case& c, llmc::Rng& rng) {
  Inputs in;
  in.N = c.rows * c.T;
  in.NH = c.NH;
  in.C = c.C;
  in.HS = c.C / c.NH;
  in.T = c.T;
  in.window = c.window;
  in.scale = 0.12f;
  in.qkv = random_stored(rng, (size_t)in.N * 3 * c.C, 0.0f, 1.0f);
  in.y = random_stored(rng, (size_t)in.N * c.C, 0.0f, 0.5f);
  in.w_in = random_stored(rng, (size_t)in.N * c.NH, 0.5f, 1.0f);
  in.w_out = random_stored(rng, (size_t)in.N * c.NH, 0.0f, 0.5f);
  in.dout = random_stored(rng, (size_t)in.N * c.C, 0.0f, 1.0f);
  in.dqkv0 = random_stored(rng, (size_t)in.N * 3 * c.C, 0.0f, 0.1f);
  if (c.documents) {  // documents opening at 0, 50, 51 (one token), 170 of each row, the last running on
    in.documents.resize(in.N);
    for (int t = 0; t < in.N; t++) {
      const int p = t % c.T;
      in.documents[t] = 4 * (t / c.T) + (p >= 50) + (p >= 51) + (p >= 170);
    }
  }
  return in;
}

// The reference's forward of query t: each head's probabilities over the offsets o = t - j, A, the
// normed w_in (FP32, and rounded as the kernel rounds it where `rounded`), its 1 / rms.
struct QueryForward {
  std::vector<std::vector<double>> P;  // [NH][window]
  std::vector<double> A, wn, wn32, lse;
  double inv;
};

QueryForward query_forward(const Inputs& in, int t, bool rounded) {
  QueryForward f;
  f.P.assign(in.NH, std::vector<double>(in.window, 0.0));
  f.A.assign(in.window, 0.0);
  double squares = 0.0;
  for (int h = 0; h < in.NH; h++) squares += (double)in.w_in[(size_t)t * in.NH + h] * in.w_in[(size_t)t * in.NH + h];
  f.inv = 1.0 / std::sqrt(squares / in.NH + kComposedNormEps);
  for (int h = 0; h < in.NH; h++) {
    f.wn32.push_back(in.w_in[(size_t)t * in.NH + h] * f.inv);
    f.wn.push_back(rounded ? (double)(float)(floatX)(float)f.wn32.back() : f.wn32.back());
    double max_score = -INFINITY;
    std::vector<double> s(in.window, -INFINITY);
    for (int o = 0; o < in.window && o <= t; o++) {
      if (!in.sees(t, t - o)) continue;
      double dot = 0.0;
      for (int d = 0; d < in.HS; d++) dot += in.q(t, h, d) * in.k(t - o, h, d);
      s[o] = in.scale * dot;
      max_score = std::max(max_score, s[o]);
    }
    double sum = 0.0;
    for (int o = 0; o < in.window; o++) sum += s[o] == -INFINITY ? 0.0 : std::exp(s[o] - max_score);
    for (int o = 0; o < in.window; o++) f.P[h][o] = s[o] == -INFINITY ? 0.0 : std::exp(s[o] - max_score) / sum;
    f.lse.push_back(max_score + std::log(sum));
  }
  for (int o = 0; o < in.window; o++) {
    for (int h = 0; h < in.NH; h++) f.A[o] += f.wn[h] * f.P[h][o];
  }
  return f;
}

double round_if(double x, bool rounded) { return rounded ? (double)(float)(floatX)(float)x : x; }

// out [N, C] and lse [N, NH].
void reference_forward(const Inputs& in, bool rounded, std::vector<double>* out, std::vector<double>* lse) {
  out->assign((size_t)in.N * in.C, 0.0);
  lse->assign((size_t)in.N * in.NH, 0.0);
  for (int t = 0; t < in.N; t++) {
    const QueryForward f = query_forward(in, t, rounded);
    for (int h = 0; h < in.NH; h++) {
      (*lse)[(size_t)t * in.NH + h] = f.lse[h];
      const double wo = in.w_out[(size_t)t * in.NH + h];
      for (int d = 0; d < in.HS; d++) {
        double acc = 0.0;
        for (int o = 0; o < in.window && o <= t; o++) {
          if (in.sees(t, t - o)) acc += round_if(wo * f.A[o], rounded) * in.v(t - o, h, d);
        }
        const size_t at = (size_t)t * in.C + h * in.HS + d;
        (*out)[at] = round_if(in.y[at] + acc, rounded);
      }
    }
  }
}

// The gradients of sum(dout * out): dqkv (without dqkv0), dw_in, dw_out [N, NH].
struct Grads {
  std::vector<double> dqkv, dw_in, dw_out;
};

Grads reference_backward(const Inputs& in, bool rounded) {
  Grads g;
  g.dqkv.assign(in.qkv.size(), 0.0);
  g.dw_in.assign(in.w_in.size(), 0.0);
  g.dw_out.assign(in.w_out.size(), 0.0);
  const int C = in.C, HS = in.HS, NH = in.NH;
  for (int t = 0; t < in.N; t++) {
    const QueryForward f = query_forward(in, t, rounded);
    std::vector<std::vector<double>> G(NH, std::vector<double>(in.window, 0.0));
    std::vector<double> dA(in.window, 0.0), dwn(NH, 0.0);
    for (int o = 0; o < in.window && o <= t; o++) {
      if (!in.sees(t, t - o)) continue;
      for (int h = 0; h < NH; h++) {
        for (int d = 0; d < HS; d++) G[h][o] += (double)in.dout[(size_t)t * C + h * HS + d] * in.v(t - o, h, d);
        dA[o] += in.w_out[(size_t)t * NH + h] * G[h][o];
      }
    }
    for (int h = 0; h < NH; h++) {
      const double wo = in.w_out[(size_t)t * NH + h];
      double dwo = 0.0;
      for (int o = 0; o < in.window; o++) {
        dwo += f.A[o] * G[h][o];
        dwn[h] += dA[o] * f.P[h][o];
      }
      g.dw_out[(size_t)t * NH + h] = dwo;
      const double D = f.wn[h] * dwn[h];
      for (int o = 0; o < in.window && o <= t; o++) {
        const int j = t - o;
        if (!in.sees(t, j)) continue;
        // dS enters the tensor cores' products with K and Q as a floatX, as P V's weights do.
        const double ds = round_if(f.P[h][o] * (f.wn[h] * dA[o] - D), rounded);
        const double weight = round_if(wo * f.A[o], rounded);
        for (int d = 0; d < HS; d++) {
          g.dqkv[(size_t)t * 3 * C + h * HS + d] += in.scale * ds * in.k(j, h, d);
          g.dqkv[(size_t)j * 3 * C + C + h * HS + d] += in.scale * ds * in.q(t, h, d);
          g.dqkv[(size_t)j * 3 * C + 2 * C + h * HS + d] += weight * in.dout[(size_t)t * C + h * HS + d];
        }
      }
    }
    double mean = 0.0;
    for (int h = 0; h < NH; h++) mean += dwn[h] * f.wn32[h];
    mean /= NH;
    for (int h = 0; h < NH; h++) g.dw_in[(size_t)t * NH + h] = (dwn[h] - f.wn32[h] * mean) * f.inv;
  }
  return g;
}

// The unrounded reference's gradients against central differences of sum(dout * out) along random
// directions of qkv, w_in and w_out.
void test_reference_derivative() {
  printf("\nthe reference's gradients against finite differences\n");
  llmc::Rng rng(71);
  Inputs in = make_inputs({2, 24, 3, 24, 10, true}, rng);
  in.documents.assign(in.N, 0);
  for (int t = 0; t < in.N; t++) in.documents[t] = (t % 24 >= 9) + 2 * (t / 24);
  const Grads g = reference_backward(in, false);
  auto loss = [&](const Inputs& x) {
    std::vector<double> out, lse;
    reference_forward(x, false, &out, &lse);
    double sum = 0.0;
    for (size_t i = 0; i < out.size(); i++) sum += out[i] * x.dout[i];
    return sum;
  };
  const double eps = 1e-4;
  for (int which = 0; which < 3; which++) {
    std::vector<float>* target = which == 0 ? &in.qkv : which == 1 ? &in.w_in : &in.w_out;
    const std::vector<double>& grad = which == 0 ? g.dqkv : which == 1 ? g.dw_in : g.dw_out;
    std::vector<float> u(target->size());
    rng.normal(u.data(), u.size(), 0.0f, 1.0f);
    const std::vector<float> base = *target;
    double analytic = 0.0;
    for (size_t i = 0; i < u.size(); i++) analytic += grad[i] * u[i];
    for (size_t i = 0; i < u.size(); i++) (*target)[i] = (float)(base[i] + eps * u[i]);
    const double plus = loss(in);
    for (size_t i = 0; i < u.size(); i++) (*target)[i] = (float)(base[i] - eps * u[i]);
    const double minus = loss(in);
    *target = base;
    // The inputs are floats: each step is eps u rounded, about 1e-7 of the value, so the difference
    // quotient is good to a few 1e-3 of the derivative.
    const double numeric = (plus - minus) / (2 * eps);
    const char* name = which == 0 ? "qkv" : which == 1 ? "w_in" : "w_out";
    testing::check_verbose(std::fabs(numeric - analytic) <= 1e-2 * std::fabs(analytic) + 1e-3,
          llmc::strformat("d/d%s along a random direction: %.6f analytic, %.6f by differences", name, analytic,
                          numeric));
  }
}

std::vector<float> as_float(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

// The gates' rows as the model keeps them: NH values at a column of rows kMuddGateStride apart.
constexpr int kStride = llmc::kMuddGateStride, kInColumn = llmc::kMuddComposedInColumn;
constexpr int kOutColumn = llmc::kMuddComposedOutColumn;

void test_case(const Case& c, uint64_t seed) {
  printf("\ncomposed attention, %d rows of %d, NH=%d C=%d, window %d, %s\n", c.rows, c.T, c.NH, c.C, c.window,
         c.documents ? "documents" : "no documents");
  llmc::Rng rng(seed);
  const Inputs in = make_inputs(c, rng);
  const int N = in.N, NH = c.NH, C = c.C;
  std::vector<float> rows((size_t)N * kStride, kGateFill);
  for (int t = 0; t < N; t++) {
    for (int h = 0; h < NH; h++) {
      rows[(size_t)t * kStride + kInColumn + h] = in.w_in[(size_t)t * NH + h];
      rows[(size_t)t * kStride + kOutColumn + h] = in.w_out[(size_t)t * NH + h];
    }
  }
  DeviceArray<floatX> d_qkv(in.qkv), d_y(in.y), d_rows(rows), d_dout(in.dout), out((size_t)N * C);
  DeviceArray<floatX> dqkv(in.qkv.size()), drows(rows.size());
  DeviceArray<float> lse((size_t)N * NH), D((size_t)N * NH);
  DeviceArray<int> documents(in.documents.empty() ? std::vector<int>(1, 0) : in.documents);
  const int* docs = in.documents.empty() ? nullptr : (const int*)documents;
  const GateRows w_in{(floatX*)d_rows + kInColumn, kStride}, w_out{(floatX*)d_rows + kOutColumn, kStride};
  auto forward = [&](floatX* target, const floatX* base) {
    lse.poison();
    composed_attention_forward(target, lse, base, d_qkv, w_in, w_out, docs, c.T, c.window, in.scale, N, NH, C, 0);
  };
  out.poison();
  forward(out, d_y);
  std::vector<double> ref_out, ref_lse;
  reference_forward(in, true, &ref_out, &ref_lse);
  check_close("forward out = y + w_out_h (A v_h)", out.download(), as_float(ref_out), kTolSum);
  check_close("forward lse", lse.download(), as_float(ref_lse), kTolFP32);
  const Snapshot forward_bits(out, lse);
  forward(out, d_y);
  check_same_bits("forward twice", forward_bits, Snapshot(out, lse));
  DeviceArray<floatX> in_place(in.y);
  forward(in_place, in_place);
  check_same_bits("forward in place (out = y)", Snapshot(out), Snapshot(in_place));

  const std::vector<float> drows0(rows.size(), kGateFill);
  auto backward = [&] {
    dqkv.upload(in.dqkv0);
    drows.upload(drows0);
    D.poison();
    const GateGradient dw_in{(floatX*)drows + kInColumn, kStride}, dw_out{(floatX*)drows + kOutColumn, kStride};
    composed_attention_backward(dqkv, dw_in, dw_out, D, d_dout, d_qkv, lse, w_in, w_out, docs, c.T, c.window,
                                in.scale, N, NH, C, 0);
  };
  forward(out, d_y);
  backward();
  const Grads g = reference_backward(in, true);
  std::vector<float> ref_dqkv(in.qkv.size());
  for (size_t i = 0; i < ref_dqkv.size(); i++) ref_dqkv[i] = (float)(in.dqkv0[i] + g.dqkv[i]);
  const std::vector<float> got_dqkv = dqkv.download();
  for (int part = 0; part < 3; part++) {
    std::vector<float> got_part, ref_part;
    for (int t = 0; t < N; t++) {
      for (int i = 0; i < C; i++) {
        got_part.push_back(got_dqkv[(size_t)t * 3 * C + part * C + i]);
        ref_part.push_back(ref_dqkv[(size_t)t * 3 * C + part * C + i]);
      }
    }
    check_close(llmc::strformat("backward d%c added to the flash backward's", "qkv"[part]), got_part, ref_part,
                kTolSum);
  }
  const std::vector<float> got_rows = drows.download();
  check_close("backward dw_in, written", gate_columns(got_rows, NH, kStride, kInColumn, true), as_float(g.dw_in),
              kTolSum);
  check_close("backward dw_out, written", gate_columns(got_rows, NH, kStride, kOutColumn, true),
              as_float(g.dw_out), kTolSum);
  std::vector<float> others;
  for (size_t i = 0; i < got_rows.size(); i++) {
    const int col = (int)(i % kStride);
    if (!((col >= kInColumn && col < kInColumn + NH) || (col >= kOutColumn && col < kOutColumn + NH))) {
      others.push_back(got_rows[i]);
    }
  }
  check_close("backward: the rows' other columns untouched", others, std::vector<float>(others.size(), kGateFill),
              0.0f);
  const Snapshot backward_bits(dqkv, drows);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dqkv, drows));
}

// Decoding over a KV cache [NH, max_t, HS] gives, position by position, the bits of the rows' forward
// (one row whose second document starts at `first`).
void test_decode() {
  const int T = 150, NH = 6, C = 768, HS = C / NH, first = 20, max_t = 160;
  printf("\ncomposed attention decoding, positions %d to %d of a cache of %d\n", first, T - 1, max_t);
  llmc::Rng rng(14);
  Inputs in = make_inputs({1, T, NH, C, llmc::kComposedWindow, false}, rng);
  in.documents.assign(T, 1);
  for (int t = 0; t < first; t++) in.documents[t] = 0;
  std::vector<float> rows((size_t)T * kStride, kGateFill), k_cache((size_t)NH * max_t * HS, 0.0f),
      v_cache(k_cache.size(), 0.0f);
  for (int t = 0; t < T; t++) {
    for (int h = 0; h < NH; h++) {
      rows[(size_t)t * kStride + kInColumn + h] = in.w_in[(size_t)t * NH + h];
      rows[(size_t)t * kStride + kOutColumn + h] = in.w_out[(size_t)t * NH + h];
      for (int d = 0; d < HS; d++) {
        k_cache[((size_t)h * max_t + t) * HS + d] = (float)in.k(t, h, d);
        v_cache[((size_t)h * max_t + t) * HS + d] = (float)in.v(t, h, d);
      }
    }
  }
  DeviceArray<floatX> d_qkv(in.qkv), d_y(in.y), d_rows(rows), out((size_t)T * C), d_k(k_cache), d_v(v_cache);
  DeviceArray<floatX> token_out(C);
  DeviceArray<float> lse((size_t)T * NH), token_lse(NH);
  DeviceArray<int> documents(in.documents);
  const GateRows w_in{(floatX*)d_rows + kInColumn, kStride}, w_out{(floatX*)d_rows + kOutColumn, kStride};
  composed_attention_forward(out, lse, d_y, d_qkv, w_in, w_out, documents, T, llmc::kComposedWindow, in.scale, T,
                             NH, C, 0);
  const std::vector<floatX> full = out.raw();
  bool same = true;
  for (int t = first; t < T; t++) {
    const size_t row = (size_t)t * kStride;
    composed_attention_decode(token_out, token_lse, (floatX*)d_y + (size_t)t * C, (floatX*)d_qkv + (size_t)t * 3 * C,
                              d_k, d_v, {(floatX*)d_rows + row + kInColumn, kStride},
                              {(floatX*)d_rows + row + kOutColumn, kStride}, first, t, max_t, llmc::kComposedWindow,
                              in.scale, NH, C, 0);
    const std::vector<floatX> token = token_out.raw();
    same = same && std::memcmp(token.data(), full.data() + (size_t)t * C, C * sizeof(floatX)) == 0;
  }
  testing::check_verbose(same, "each position decoded from the cache has the bits of the rows' forward");
}

void test_bad_shapes() {
  printf("\nbad shapes\n");
  DeviceArray<floatX> qkv(3 * 768 * 4), y(768 * 4), rows(48 * 4);
  DeviceArray<float> lse(24);
  const GateRows w{(floatX*)rows, kStride}, shared{(floatX*)rows, 0};
  auto forward = [&](int T, int window, const GateRows& w_in) {
    composed_attention_forward(y, lse, y, qkv, w_in, w, nullptr, T, window, 0.1f, 4, 6, 768, 0);
  };
  testing::check_throws([&] { forward(3, 112, w); }, "N a multiple of T", "rows of T that do not divide N are refused");
  testing::check_throws([&] { forward(4, 129, w); }, "a window of 1 to 128 keys", "a window of 129 is refused");
  testing::check_throws([&] { forward(4, 112, shared); }, "w_in and w_out are a row's",
                        "shared weights (stride 0) are refused");
}

void run() {
  test_reference_derivative();
  test_case({2, 300, 6, 768, llmc::kComposedWindow, true}, 11);
  test_case({3, 37, 2, 128, llmc::kComposedWindow, false}, 12);
  test_case({2, 96, 6, 768, 17, true}, 13);
  test_case({1, 200, 2, 128, kComposedMaxWindow, true}, 15);
  test_decode();
  test_bad_shapes();
}

}  // namespace composed_attention_tests
