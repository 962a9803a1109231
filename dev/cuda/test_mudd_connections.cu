// Tests the kernels of record #89's MUDD dense connections (train_gpt2.cu section 10, "Record #89's MUDD
// dense connections") against references written here from their definitions, the coefficients read
// from rows of the generators' stride (llmc::kMuddGateStride) with kGateFill in the columns no kernel
// reads:
//  - gated_sum_forward: s in + five gated terms (the final mix), s a row's 1 + m rounded (the stream's
//    scale of out9) or none, and the terms alone (in null: the value terms); each product rounded, the
//    sum in FP32 in order, rounded once: exact; in place the same bits;
//  - gated_term_rows_backward with an offset gate (the stream's 1 + m): dterm += round(1 + m) dout,
//    dm_n = dout . term over the row, written into its column alone;
//  - the residual lambdas a row (the last layer's r and p): fused_residual_rmsnorm_forward's r_n x +
//    p_n y exact, its norm bitwise rmsnorm_forward's; sublayer_row_lambdas_backward's dy = p_n dout,
//    dx = r_n dout in place, dr_n and dp_n written into their columns;
//  - value_mix_rows_forward/backward: qkv's v + (g_h e + extra), g_h each half of the heads' gate, q and
//    k left alone, exact; dextra = dv, each half's dg_n, dve[token] through the encoder's bucketed
//    backward (tokens repeated); 6 heads of 128, 2 of 64, 4 of 8 (FP32: 4).
// Row counts below, at and above the backward's 256 row blocks, with short and empty blocks; outputs
// poisoned first, gradients accumulated onto random ones, every kernel run twice for identical bits.
#include "dev/cuda/kernel_test.h"

namespace mudd_connections_tests {

constexpr int kStride = llmc::kMuddGateStride;

// N rows of the generators' stride with coefficient k's values g[k] (N each) in column k.
std::vector<float> coefficient_rows(const std::vector<std::vector<float>>& g, int N) {
  std::vector<float> rows((size_t)N * kStride, kGateFill);
  for (size_t k = 0; k < g.size(); k++) {
    for (int n = 0; n < N; n++) rows[(size_t)n * kStride + k] = g[k][n];
  }
  return rows;
}

// Column k of such rows.
std::vector<float> coefficient_column(const std::vector<float>& rows, int k) {
  return gate_columns(rows, 1, kStride, k, true);
}

// [s] in + the terms, rounded as gated_terms_forward_kernel (float sums of rounded float products).
std::vector<float> gated_sum_reference(const std::vector<float>* in, const std::vector<float>* scale,
                                       const std::vector<std::vector<float>>& terms,
                                       const std::vector<std::vector<float>>& gates, int C) {
  const size_t n = terms[0].size();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i++) {
    float v = 0.0f;
    if (in) v = scale ? (float)(floatX)(1.0f + (*scale)[i / C]) * (*in)[i] : (*in)[i];
    for (size_t t = 0; t < terms.size(); t++) v += (float)(floatX)(gates[t][i / C] * terms[t][i]);
    out[i] = (float)(floatX)v;
  }
  return out;
}

void test_gated_sum(int N, int C, llmc::Rng& rng) {
  printf("\ngated sum N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const int T = llmc::kMuddFinalCoefficients;
  std::vector<std::vector<float>> terms, gates;
  for (int t = 0; t < T; t++) {
    terms.push_back(random_stored(rng, n, 0.0f, 1.0f));
    gates.push_back(random_stored(rng, N, 0.0f, 0.5f));
  }
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f), m5 = random_stored(rng, N, 0.0f, 0.5f);
  std::vector<std::vector<float>> columns = gates;
  columns.push_back(m5);
  std::vector<float> all_terms;
  for (const std::vector<float>& t : terms) all_terms.insert(all_terms.end(), t.begin(), t.end());
  DeviceArray<floatX> d_rows(coefficient_rows(columns, N)), d_x(x), out(n), d_terms(all_terms);
  GatedTerms device_terms;
  for (int t = 0; t < T; t++) device_terms.terms[t] = {(floatX*)d_terms + t * n, {(floatX*)d_rows + t, kStride}};
  device_terms.count = T;
  const GateRows scale{(floatX*)d_rows + T, kStride, 1.0f};

  for (const bool with_in : {true, false}) {
    const std::string which = with_in ? " (1 + m) x + five terms" : " five terms alone";
    auto forward = [&] {
      out.poison();
      gated_sum_forward(out, with_in ? (const floatX*)d_x : nullptr, with_in ? scale : GateRows{}, device_terms, N, C,
                        0);
    };
    forward();
    const std::vector<float> ref = gated_sum_reference(with_in ? &x : nullptr, with_in ? &m5 : nullptr, terms, gates, C);
    check_close("forward (exact)" + which, out.download(), ref, 0.0f);
    const Snapshot bits(out);
    forward();
    check_same_bits("forward twice" + which, bits, Snapshot(out));
  }
  DeviceArray<floatX> in_place(x);
  gated_sum_forward(in_place, in_place, scale, device_terms, N, C, 0);
  check_close("forward in place (exact)", in_place.download(), gated_sum_reference(&x, &m5, terms, gates, C), 0.0f);

  // The stream's scale's backward: dx += round(1 + m) dout, dm_n = dout . x.
  const std::vector<float> dout = random_stored(rng, n, 0.5f, 1.0f), dx0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> drows0((size_t)N * kStride, kGateFill);
  std::vector<float> ref_dx(n), ref_dm(N, 0.0f);
  std::vector<double> sums(N, 0.0);
  for (size_t i = 0; i < n; i++) {
    ref_dx[i] = (float)(floatX)(dx0[i] + (float)(floatX)(1.0f + m5[i / C]) * dout[i]);
    sums[i / C] += (double)dout[i] * x[i];
  }
  for (int t = 0; t < N; t++) ref_dm[t] = (float)sums[t];
  DeviceArray<floatX> d_dout(dout), dx(n), drows(drows0);
  auto backward = [&] {
    dx.upload(dx0);
    drows.upload(drows0);
    gated_term_rows_backward(dx, {(floatX*)drows + T, kStride}, nullptr, d_dout, d_x, scale, N, C, 0);
  };
  backward();
  check_close("backward dx += round(1 + m) dout", dx.download(), ref_dx, kTolStore);
  const std::vector<float> got = drows.download();
  check_close("backward dm_n = dout . x, written", coefficient_column(got, T), ref_dm, kTolSum);
  check_close("backward: the rows' other columns untouched", gate_columns(got, 1, kStride, T, false),
              gate_columns(drows0, 1, kStride, T, false), 0.0f);
  const Snapshot backward_bits(dx, drows);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dx, drows));
}

// The last layer's residual adds with r and p a row, forward and backward.
void test_row_lambdas(int N, int C, llmc::Rng& rng) {
  printf("\nresidual lambdas a row N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const int kR = llmc::kMuddMlpR, kP = llmc::kMuddMlpP;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f), y = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> r = random_stored(rng, N, 1.0f, 0.25f), p = random_stored(rng, N, 1.0f, 0.25f);
  std::vector<std::vector<float>> columns(kP + 1, std::vector<float>(N, kGateFill));
  columns[kR] = r;
  columns[kP] = p;
  DeviceArray<floatX> d_rows(coefficient_rows(columns, N)), d_x(x), d_y(y), sum(n), normed(n), ref_normed(n);
  DeviceArray<float> rstd(N), ref_rstd(N);
  const SublayerScales scales{(floatX*)d_rows + kR, (floatX*)d_rows + kP, kStride, kStride};
  std::vector<float> ref_sum(n);
  for (size_t i = 0; i < n; i++) ref_sum[i] = (float)(floatX)std::fma(r[i / C], x[i], p[i / C] * y[i]);
  auto forward = [&] {
    sum.poison();
    normed.poison();
    rstd.poison();
    fused_residual_rmsnorm_forward(sum, normed, rstd, d_x, d_y, nullptr, N, C, 0, scales);
  };
  forward();
  check_close("r_n x + p_n y (exact)", sum.download(), ref_sum, 0.0f);
  rmsnorm_forward(ref_normed, ref_rstd, sum, nullptr, N, C, 0);
  check_same_bits("its norm = rmsnorm_forward of the sum", Snapshot(ref_normed, ref_rstd), Snapshot(normed, rstd));
  const Snapshot forward_bits(sum, normed, rstd);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(sum, normed, rstd));

  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> drows0((size_t)N * kStride, kGateFill);
  std::vector<float> ref_dx(n), ref_dy(n), ref_dr(N), ref_dp(N);
  std::vector<double> sum_x(N, 0.0), sum_y(N, 0.0);
  for (size_t i = 0; i < n; i++) {
    ref_dx[i] = (float)(floatX)(r[i / C] * dout[i]);
    ref_dy[i] = (float)(floatX)(p[i / C] * dout[i]);
    sum_x[i / C] += (double)dout[i] * x[i];
    sum_y[i / C] += (double)dout[i] * y[i];
  }
  for (int t = 0; t < N; t++) {
    ref_dr[t] = (float)sum_x[t];
    ref_dp[t] = (float)sum_y[t];
  }
  DeviceArray<floatX> d_dout(dout), dy(n), drows(drows0);
  auto backward = [&] {
    d_dout.upload(dout);
    dy.poison();
    drows.upload(drows0);
    sublayer_row_lambdas_backward(dy, d_dout, {(floatX*)drows + kR, kStride}, {(floatX*)drows + kP, kStride}, d_x,
                                  d_y, scales, N, C, 0);
  };
  backward();
  check_close("backward dx = r_n dout, in place (exact)", d_dout.download(), ref_dx, 0.0f);
  check_close("backward dy = p_n dout (exact)", dy.download(), ref_dy, 0.0f);
  const std::vector<float> got = drows.download();
  check_close("backward dr_n", coefficient_column(got, kR), ref_dr, kTolSum);
  check_close("backward dp_n", coefficient_column(got, kP), ref_dp, kTolSum);
  check_close("backward: the rows' other columns untouched", gate_columns(got, 2, kStride, kR, false),
              gate_columns(drows0, 2, kStride, kR, false), 0.0f);
  const Snapshot backward_bits(d_dout, dy, drows);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(d_dout, dy, drows));
}

struct ValueRowsCase {
  int N, NH, C, vocab;
};

void test_value_rows(const ValueRowsCase& s, llmc::Rng& rng) {
  const int N = s.N, NH = s.NH, C = s.C, HS = C / NH;
  printf("\nvalue rows N=%d NH=%d C=%d vocab=%d\n", N, NH, C, s.vocab);
  const size_t n = (size_t)N * C;
  const int kFirst = llmc::kMuddVeGateFirst, kSecond = llmc::kMuddVeGateSecond;
  const std::vector<float> qkv = random_stored(rng, 3 * n, 0.0f, 1.0f), extra = random_stored(rng, n, 0.0f, 0.5f);
  const std::vector<float> ve = random_stored(rng, (size_t)s.vocab * C, 0.0f, 1.0f);
  const std::vector<int> tokens = random_ints(rng, N, 0, s.vocab);
  const std::vector<float> first = random_stored(rng, N, 1.0f, 0.5f), second = random_stored(rng, N, 1.0f, 0.5f);
  std::vector<std::vector<float>> columns(kSecond + 1, std::vector<float>(N, kGateFill));
  columns[kFirst] = first;
  columns[kSecond] = second;
  DeviceArray<floatX> d_rows(coefficient_rows(columns, N)), d_qkv(3 * n), d_extra(extra), d_ve(ve);
  DeviceArray<int> d_tokens(tokens);
  const ValueRowGates gates{{(floatX*)d_rows + kFirst, kStride}, {(floatX*)d_rows + kSecond, kStride}, NH};
  auto gate = [&](size_t row, int c) { return c / HS < NH / 2 ? first[row] : second[row]; };
  std::vector<float> ref = qkv;
  for (size_t i = 0; i < n; i++) {
    const size_t row = i / C;
    const int c = (int)(i % C);
    const float e = ve[(size_t)tokens[row] * C + c];
    const float term = (float)(floatX)((float)(floatX)(gate(row, c) * e) + extra[i]);
    float& v = ref[row * 3 * C + 2 * C + c];
    v = (float)(floatX)(v + term);
  }
  auto forward = [&] {
    d_qkv.upload(qkv);
    value_mix_rows_forward(d_qkv, d_ve, d_tokens, gates, d_extra, N, C, 0);
  };
  forward();
  check_close("forward v + (g_h e + extra), q and k alone (exact)", d_qkv.download(), ref, 0.0f);
  const Snapshot forward_bits(d_qkv);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(d_qkv));

  const std::vector<float> dqkv = random_stored(rng, 3 * n, 0.0f, 1.0f);
  const std::vector<float> dve0 = random_stored(rng, ve.size(), 0.0f, 1.0f);
  const std::vector<float> drows0((size_t)N * kStride, kGateFill);
  std::vector<float> ref_dextra(n);
  std::vector<double> dve_sums(dve0.begin(), dve0.end()), dfirst(N, 0.0), dsecond(N, 0.0);
  for (size_t i = 0; i < n; i++) {
    const size_t row = i / C;
    const int c = (int)(i % C);
    const float dv = dqkv[row * 3 * C + 2 * C + c];
    const float e = ve[(size_t)tokens[row] * C + c];
    ref_dextra[i] = dv;
    dve_sums[(size_t)tokens[row] * C + c] += (float)(floatX)(gate(row, c) * dv);
    (c / HS < NH / 2 ? dfirst : dsecond)[row] += (double)dv * e;
  }
  const std::vector<float> ref_dve(dve_sums.begin(), dve_sums.end());
  const std::vector<float> ref_dfirst(dfirst.begin(), dfirst.end()), ref_dsecond(dsecond.begin(), dsecond.end());
  DeviceArray<floatX> d_dqkv(dqkv), dextra(n), dve(ve.size()), scratch(n), drows(drows0);
  DeviceEncoderPlan plan(tokens, C);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    dextra.poison();
    scratch.poison();
    dve.upload(dve0);
    drows.upload(drows0);
    value_mix_rows_backward(dextra, dve, {(floatX*)drows + kFirst, kStride}, {(floatX*)drows + kSecond, kStride},
                            scratch, d_dqkv, d_ve, d_tokens, gates, plan.plan, N, C, seed, 0);
  };
  backward();
  check_close("backward dextra = dv (exact)", dextra.download(), ref_dextra, 0.0f);
  check_close("backward dve[token] += g_h dv", dve.download(), ref_dve, kTolSum);
  const std::vector<float> got = drows.download();
  check_close("backward the first half's dg_n", coefficient_column(got, kFirst), ref_dfirst, kTolSum);
  check_close("backward the second half's dg_n", coefficient_column(got, kSecond), ref_dsecond, kTolSum);
  check_close("backward: the rows' other columns untouched", gate_columns(got, 2, kStride, kFirst, false),
              gate_columns(drows0, 2, kStride, kFirst, false), 0.0f);
  check_close("backward: dqkv read alone", d_dqkv.download(), dqkv, 0.0f);
  const Snapshot backward_bits(dextra, dve, drows);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dextra, dve, drows));
}

void run() {
  llmc::Rng rng(89);
  test_gated_sum(4 * 64 + 1, 768, rng);  // d12 width; one row per backward block, one more
  test_gated_sum(3999, 768, rng);        // 16 rows per block: each warp two, some one
  test_gated_sum(37, 128, rng);          // tiny width; most blocks empty
  test_gated_sum(7, 136, rng);           // a row of 17 pieces: a partial warp
  test_row_lambdas(4 * 64 + 1, 768, rng);
  test_row_lambdas(3999, 768, rng);
  test_row_lambdas(37, 128, rng);
  test_row_lambdas(1, 768, rng);  // one row: every block but the first empty
  test_value_rows({4 * 64 + 1, 6, 768, 64}, rng);  // d12: 6 heads of 128; tokens repeated about four times
  test_value_rows({3999, 6, 768, 301}, rng);
  test_value_rows({37, 2, 128, 5}, rng);           // tiny: 2 heads of 64; a few ids, many repeats
  test_value_rows({301, 4, 4 * x128::size, 7}, rng);  // heads of one piece
}

}  // namespace mudd_connections_tests
