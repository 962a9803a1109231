// Tests the speedrun block's steps around the layers (SPEC "The speedrun architecture") against
// double-precision CPU references written here from their definitions:
//  - residual_mix_norm_forward/residual_mix_backward: out = l0 (x + w skip) + l1 x0, with and
//    without the U-net's skip, x the same tensor as x0 (the first layer), and out itself (the
//    decoder's mix in place); the RMSNorm of out fused with it, with and without a gain and
//    without its output, bitwise against rmsnorm_forward of the rounded out; dx in place over dout;
//  - record #89's residual lambdas: fused_residual_rmsnorm_forward's r x + p y (and r x + y, p null)
//    with its norm bitwise against rmsnorm_forward of the rounded sum; the mix's add first with
//    scales, bitwise the scaled add and then the mix; bigram_gate_forward's p in + g b, also in
//    place; sublayer_lambdas_backward's dy = p dout, dx = r dout in place, dr and dp;
//  - record #89's gated skip: gated_skip_scale's s = round(round(sigmoid(l)) g) for a few (l, g);
//    the add x + s kept through fused_residual_rmsnorm_forward (scales {null, s}), bitwise, its norm
//    bitwise rmsnorm_forward's; gated_skip_backward's dkept += s dout rounded as the kernel does, and
//    d skip_lambda = g sig (1 - sig) S, dg = sig S, S the sum of dout . kept, in double;
//  - value_mix_forward/backward: qkv's v = a v + b ve[token] (or a v), v_pre kept, q and k left
//    alone; dve through the encoder's bucketed backward, tokens repeated and some never seen; with
//    record #89's gates (2 sigmoid(W[h] . [hn[:6], ve[:6]]) a head in b's place): dW, dhn's first 6
//    columns (rows apart by more than 6), dve's first 6 with the gates' part, heads of 136, 128, 64
//    and 8 channels (4 in the FP32 build, where the first 6 channels span two heads); all without a
//    (record #89's plan: v + b ve, scales (b), v and dv left as they are, nothing kept in v_pre);
//  - attention_gate_forward/apply/backward: y times sigmoid(W hn[:, :C/64]) per head, head size
//    128 (C 768 with 6 heads, 256 with 2, 128 with 1: G = 12, 4, 2) and 136 with one head; apply
//    must give the forward's bits; dy in place over dyg; dhn's gate columns alone (rows G apart)
//    added by add_columns_inplace with add_inplace's bits;
//  - xsa_forward/backward (record #89's XSA): y - tanh(alpha_h) (y . v / max(|v|^2, 1e-8)) v per head,
//    v a qkv row's v columns (rows 3C apart), the reference rounding where the kernel does; a zero
//    v row and zero heads (the clamp), 6 and 12 heads of 64 and 128; dy in place over dout, dv,
//    dalpha summed over row blocks;
//  - head_gate_forward/backward (record #89's head gates): y times g_h per head, the product rounded
//    once, bitwise; dy = g_h dout in place and apart, dg_h the sum of dout . y over the head's columns
//    and the rows; 6 heads of 128, 2 of 64, one of 136, 12 of 64;
//  - attention_lambda_scale/backward (record #89's attention lambdas): W' = s W rounded once, exact;
//    dW = s dW' in place, ds += sum dW' W over the row blocks; d12's and tiny's qkv and output
//    projection, rows of 17 pieces, one piece.
//  - record #89's MUDD gates, a gate a row (rows of 48 values, the gates from odd columns): the
//    gated skip's s_n and its add (bitwise, and rows of one g bitwise the shared g), dkept, dg_n =
//    sig S_n and d skip_lambda from the sum of g_n S_n; XSA's and the head gates' forward and
//    backward as above with alpha_n,h and g_n,h, each row's gradient written into its columns alone.
// Row counts below, at and above the backward's 256 fixed row blocks, with short and empty blocks;
// outputs poisoned first, gradients accumulated onto random ones, every kernel run twice for
// identical bits. Scalar and weight gradients are sums over all rows: kTolSum.
#include "dev/cuda/kernel_test.h"

namespace speedrun_steps_tests {

// ---- Residual mix ----

struct ResidualMixCase {
  int N, C;
  bool skip;     // the U-net's second half
  bool x_is_x0;  // the first layer: x is x0 itself
};

void test_residual_mix(const ResidualMixCase& s, llmc::Rng& rng) {
  const int N = s.N, C = s.C;
  printf("\nresidual mix N=%d C=%d%s%s\n", N, C, s.skip ? ", skip" : "", s.x_is_x0 ? ", x = x0" : "");
  const size_t n = (size_t)N * C;
  const std::vector<float> x0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> x = s.x_is_x0 ? x0 : random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> skip = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> lambdas = stored({0.9f, 0.35f}), skip_weight = stored({0.7f});
  const double l0 = lambdas[0], l1 = lambdas[1], w = s.skip ? skip_weight[0] : 0.0;
  DeviceArray<floatX> d_x0(x0), d_x(x), d_skip(skip), d_lambdas(lambdas), d_skip_weight(skip_weight), out(n);
  const floatX* x_in = s.x_is_x0 ? (floatX*)d_x0 : (floatX*)d_x;
  const floatX* skip_in = s.skip ? (floatX*)d_skip : nullptr;
  const floatX* skip_weight_in = s.skip ? (floatX*)d_skip_weight : nullptr;

  std::vector<double> mixed(n);  // s = x + w skip, in double
  std::vector<float> ref_out(n);
  for (size_t i = 0; i < n; i++) {
    mixed[i] = x[i] + w * skip[i];
    ref_out[i] = (float)(l0 * mixed[i] + l1 * x0[i]);
  }
  // The fused norm: against rmsnorm_forward of the rounded out, with a gain and without.
  const std::vector<float> gain = random_stored(rng, C, 1.0f, 0.3f);
  DeviceArray<floatX> d_gain(gain), normed(n), ref_normed(n);
  DeviceArray<float> rstd(N), ref_rstd(N);
  for (const bool weighted : {false, true}) {
    const floatX* weight = weighted ? (floatX*)d_gain : nullptr;
    const std::string with = weighted ? " (norm with a gain)" : "";
    auto forward = [&](floatX* norm_out) {
      out.poison();
      normed.poison();
      rstd.poison();
      residual_mix_norm_forward(out, norm_out, rstd, x_in, d_x0, skip_in, d_lambdas, skip_weight_in, weight, N, C,
                                0);
    };
    forward(normed);
    check_close("forward out" + with, out.download(), ref_out, kTolStore);
    rmsnorm_forward(ref_normed, ref_rstd, out, weight, N, C, 0);
    check_same_bits("forward norm = rmsnorm_forward of out" + with, Snapshot(ref_normed, ref_rstd),
                    Snapshot(normed, rstd));
    const Snapshot forward_bits(out, normed, rstd);
    forward(normed);
    check_same_bits("forward twice" + with, forward_bits, Snapshot(out, normed, rstd));
    forward(nullptr);
    check_same_bits("forward without the norm's output: rstd" + with, Snapshot(ref_rstd),
                    Snapshot(rstd));
  }
  // In place (the decoder's): out is x's own memory.
  if (!s.x_is_x0) {
    DeviceArray<floatX> in_place(x);
    residual_mix_norm_forward(in_place, normed, rstd, in_place, d_x0, skip_in, d_lambdas, skip_weight_in, nullptr,
                              N, C, 0);
    rmsnorm_forward(ref_normed, ref_rstd, in_place, nullptr, N, C, 0);
    check_close("forward in place: out", in_place.download(), ref_out, kTolStore);
    check_same_bits("forward in place: the norm", Snapshot(ref_normed, ref_rstd), Snapshot(normed, rstd));
  }
  // The block before's residual add first (ResidualAddFirst): x + part rounded into sum, then mixed:
  // fused_residual_rmsnorm_forward's sum and the mix of that sum, bit for bit; with a skip, also the
  // skip being that sum itself (the U-net's first skip, the block before's output).
  for (const bool skip_is_sum : {false, true}) {
    if (skip_is_sum && !s.skip) continue;
    const std::vector<float> part = random_stored(rng, n, 0.0f, 1.0f);
    std::vector<float> ref_x_sum(n);
    for (size_t i = 0; i < n; i++) ref_x_sum[i] = x[i] + part[i];
    DeviceArray<floatX> d_part(part), sum(n), ref_sum(n), ref_mixed(n);
    DeviceArray<float> stats(N);
    fused_residual_rmsnorm_forward(ref_sum, nullptr, stats, x_in, d_part, nullptr, N, C, 0);
    residual_mix_norm_forward(ref_mixed, ref_normed, ref_rstd, ref_sum, d_x0, skip_is_sum ? ref_sum : skip_in,
                              d_lambdas, skip_weight_in, nullptr, N, C, 0);
    sum.poison();
    out.poison();
    normed.poison();
    rstd.poison();
    residual_mix_norm_forward(out, normed, rstd, x_in, d_x0, skip_is_sum ? sum : skip_in, d_lambdas, skip_weight_in,
                              nullptr, N, C, 0, ResidualAddFirst{d_part, sum});
    const std::string which = skip_is_sum ? " (the skip is the sum)" : "";
    check_close("forward with the add first: the sum" + which, sum.download(), ref_x_sum, kTolStore);
    check_same_bits("forward with the add first = the add, then the mix" + which,
                    Snapshot(ref_sum, ref_mixed, ref_normed, ref_rstd), Snapshot(sum, out, normed, rstd));
  }

  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dx0_0 = random_stored(rng, n, 0.0f, 1.0f), dskip0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dlambdas0 = random_stored(rng, 2, 0.0f, 1.0f), dskip_weight0 = random_stored(rng, 1, 0.0f, 1.0f);
  std::vector<float> ref_dx(n), ref_dx0(n), ref_dskip = dskip0;
  double sums[3] = {};  // dlambda0, dlambda1, dskip_weight
  for (size_t i = 0; i < n; i++) {
    const double g = dout[i], ds = l0 * g;
    ref_dx[i] = (float)ds;
    ref_dx0[i] = (float)(dx0_0[i] + l1 * g);
    if (s.skip) ref_dskip[i] = (float)(dskip0[i] + w * ds);
    sums[0] += g * mixed[i];
    sums[1] += g * x0[i];
    sums[2] += ds * skip[i];
  }
  const std::vector<float> ref_dlambdas = {(float)(dlambdas0[0] + sums[0]), (float)(dlambdas0[1] + sums[1])};
  const std::vector<float> ref_dskip_weight = {s.skip ? (float)(dskip_weight0[0] + sums[2]) : dskip_weight0[0]};

  DeviceArray<floatX> d_dout(dout), dx(n), dx0(n), dskip(n), dlambdas(2), dskip_weight(1);
  DeviceArray<float> partials((size_t)kRowBlocks * 3);
  const uint32_t seed = rng.u32();
  // in_place: dx is dout's own memory (d_dout holds dout again first).
  auto backward = [&](bool in_place) {
    d_dout.upload(dout);
    dx.poison();
    dx0.upload(dx0_0);
    dskip.upload(dskip0);
    dlambdas.upload(dlambdas0);
    dskip_weight.upload(dskip_weight0);
    partials.poison();
    residual_mix_backward(in_place ? (floatX*)d_dout : (floatX*)dx, dx0, s.skip ? (floatX*)dskip : nullptr,
                          dlambdas, s.skip ? (floatX*)dskip_weight : nullptr, partials, d_dout, x_in, d_x0,
                          skip_in, d_lambdas, skip_weight_in, N, C, seed, 0);
  };
  backward(false);
  check_close("backward dx", dx.download(), ref_dx, kTolStore);
  check_close("backward dx0", dx0.download(), ref_dx0, kTolStore);
  check_close(s.skip ? "backward dskip" : "backward dskip untouched", dskip.download(), ref_dskip,
              s.skip ? kTolStore : 0.0f);
  check_close("backward dlambdas", dlambdas.download(), ref_dlambdas, kTolSum);
  check_close(s.skip ? "backward dskip_weight" : "backward dskip_weight untouched", dskip_weight.download(),
              ref_dskip_weight, s.skip ? kTolSum : 0.0f);
  const Snapshot backward_bits(dx, dx0, dskip, dlambdas, dskip_weight);
  backward(false);
  check_same_bits("backward twice", backward_bits, Snapshot(dx, dx0, dskip, dlambdas, dskip_weight));
  backward(true);
  check_same_bits("backward dx in place", backward_bits, Snapshot(d_dout, dx0, dskip, dlambdas, dskip_weight));

  // A gradient joining dx after the mix (GradientJoin): the mix's backward, then add_inplace of it
  // under the join's seed, bit for bit: another tensor's gradient, x0's (dx0 as this pass leaves
  // it), and with a skip the kept output's (dskip as this pass leaves it).
  const std::vector<float> other = random_stored(rng, n, 0.0f, 1.0f);
  DeviceArray<floatX> d_other(other);
  const uint32_t join_seed = rng.u32();
  for (const int which : {0, 1, 2}) {
    if (which == 2 && !s.skip) continue;
    const char* names[] = {"another tensor's", "dx0's", "dskip's"};
    const floatX* add = which == 0 ? (floatX*)d_other : which == 1 ? (floatX*)dx0 : (floatX*)dskip;
    backward(true);
    add_inplace(d_dout, add, n, join_seed, 0);
    const Snapshot joined_bits(d_dout, dx0, dskip, dlambdas, dskip_weight);
    d_dout.upload(dout);
    dx0.upload(dx0_0);
    dskip.upload(dskip0);
    dlambdas.upload(dlambdas0);
    dskip_weight.upload(dskip_weight0);
    partials.poison();
    residual_mix_backward(d_dout, dx0, s.skip ? (floatX*)dskip : nullptr, dlambdas,
                          s.skip ? (floatX*)dskip_weight : nullptr, partials, d_dout, x_in, d_x0, skip_in, d_lambdas,
                          skip_weight_in, N, C, seed, 0, GradientJoin{add, join_seed});
    check_same_bits(std::string("backward with ") + names[which] + " gradient joining = the mix, then add_inplace",
                    joined_bits, Snapshot(d_dout, dx0, dskip, dlambdas, dskip_weight));
  }
}

// ---- Record #89's residual lambdas ----

void test_sublayer_lambdas(int N, int C, llmc::Rng& rng) {
  printf("\nresidual lambdas N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f), y = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> bigram = random_stored(rng, n, 0.0f, 1.0f), x0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> scalars = stored({1.0488088f, 0.8125f, 0.05f});  // r, p, the bigram gate
  const double r = scalars[0], p = scalars[1], g = scalars[2];
  DeviceArray<floatX> d_x(x), d_y(y), d_bigram(bigram), d_x0(x0), d_scalars(scalars), sum(n), normed(n);
  DeviceArray<floatX> ref_normed(n), ref_sum(n), mixed(n), ref_mixed(n);
  DeviceArray<float> rstd(N), ref_rstd(N);
  const floatX* r_in = d_scalars;
  const floatX* p_in = (floatX*)d_scalars + 1;
  const floatX* gate = (floatX*)d_scalars + 2;
  for (const bool with_p : {true, false}) {
    const SublayerScales scales{r_in, with_p ? p_in : nullptr};
    const std::string which = with_p ? " r x + p y" : " r x + y";
    std::vector<float> ref(n);
    for (size_t i = 0; i < n; i++) ref[i] = (float)(r * x[i] + (with_p ? p : 1.0) * y[i]);
    auto forward = [&] {
      sum.poison();
      normed.poison();
      rstd.poison();
      fused_residual_rmsnorm_forward(sum, normed, rstd, d_x, d_y, nullptr, N, C, 0, scales);
    };
    forward();
    check_close("fused add" + which, sum.download(), ref, kTolStore);
    rmsnorm_forward(ref_normed, ref_rstd, sum, nullptr, N, C, 0);
    check_same_bits("fused add's norm = rmsnorm_forward of the sum" + which, Snapshot(ref_normed, ref_rstd),
                    Snapshot(normed, rstd));
    const Snapshot bits(sum, normed, rstd);
    forward();
    check_same_bits("fused add twice" + which, bits, Snapshot(sum, normed, rstd));
    // The block before's add inside the next block's mix: the scaled add's bits, then the mix's.
    const std::vector<float> lambdas = stored({0.9f, 0.35f});
    DeviceArray<floatX> d_lambdas(lambdas);
    fused_residual_rmsnorm_forward(ref_sum, nullptr, ref_rstd, d_x, d_y, nullptr, N, C, 0, scales);
    residual_mix_norm_forward(ref_mixed, ref_normed, ref_rstd, ref_sum, d_x0, nullptr, d_lambdas, nullptr, nullptr, N,
                              C, 0);
    sum.poison();
    mixed.poison();
    residual_mix_norm_forward(mixed, normed, rstd, d_x, d_x0, nullptr, d_lambdas, nullptr, nullptr, N, C, 0,
                              ResidualAddFirst{d_y, sum, scales});
    check_same_bits("the mix's add first" + which + " = the scaled add, then the mix",
                    Snapshot(ref_sum, ref_mixed, ref_normed, ref_rstd), Snapshot(sum, mixed, normed, rstd));
  }
  // The bigram term beside p's product: p y + round(g b), once rounded; in place the same bits.
  std::vector<float> gb(n), ref_bigram(n);
  for (size_t i = 0; i < n; i++) gb[i] = (float)(g * bigram[i]);
  gb = stored(gb);
  for (size_t i = 0; i < n; i++) ref_bigram[i] = (float)(p * y[i] + gb[i]);
  DeviceArray<floatX> gated(n), in_place(y);
  gated.poison();
  bigram_gate_forward(gated, d_y, d_bigram, {gate, 0}, N, C, 0, p_in);
  check_close("bigram term beside p y", gated.download(), ref_bigram, kTolStore);
  bigram_gate_forward(in_place, in_place, d_bigram, {gate, 0}, N, C, 0, p_in);
  check_same_bits("bigram term beside p y, in place", Snapshot(gated), Snapshot(in_place));

  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f), d0 = random_stored(rng, 2, 0.0f, 1.0f);
  std::vector<float> ref_dx(n), ref_dy(n);
  double sums[2] = {};
  for (size_t i = 0; i < n; i++) {
    ref_dx[i] = (float)(r * dout[i]);
    ref_dy[i] = (float)(p * dout[i]);
    sums[0] += (double)dout[i] * x[i];
    sums[1] += (double)dout[i] * y[i];
  }
  const std::vector<float> ref_dr = {(float)(d0[0] + sums[0])}, ref_dp = {(float)(d0[1] + sums[1])};
  DeviceArray<floatX> d_dout(dout), dy(n), dr(1), dp(1);
  DeviceArray<float> partials((size_t)kRowBlocks * 2);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    d_dout.upload(dout);
    dy.poison();
    dr.upload(std::vector<float>{d0[0]});
    dp.upload(std::vector<float>{d0[1]});
    partials.poison();
    sublayer_lambdas_backward(dy, d_dout, dr, dp, partials, d_x, d_y, SublayerScales{r_in, p_in}, N, C, seed, 0);
  };
  backward();
  check_close("backward dx = r dout, in place", d_dout.download(), ref_dx, kTolStore);
  check_close("backward dy = p dout", dy.download(), ref_dy, kTolStore);
  check_close("backward dr", dr.download(), ref_dr, kTolSum);
  check_close("backward dp", dp.download(), ref_dp, kTolSum);
  const Snapshot bits(d_dout, dy, dr, dp);
  backward();
  check_same_bits("backward twice", bits, Snapshot(d_dout, dy, dr, dp));
}

// ---- Record #89's gated skip ----

// The BF16 build rounds the sigmoid to 8 bits, which the GPU's expf (a few units of 6e-8 off) cannot
// move where the sigmoid lies away from a rounding midpoint, as it does (by over 1e-4 of its value)
// for every skip_lambda below: exact. The FP32 build keeps expf's error.
#if defined(ENABLE_FP32)
constexpr float kTolSkipScale = kTolStore;
#else
constexpr float kTolSkipScale = 0.0f;
#endif

// Rows of record #89's MUDD gates as the model keeps them (kMuddGateStride values), the gates read
// from odd columns; kGateFill elsewhere.
constexpr int kGateStride = llmc::kMuddGateStride;

// sigmoid(l) rounded to the storage type, as the kernels round it.
double rounded_sigmoid(float l) { return (float)(floatX)(float)(1.0 / (1.0 + std::exp(-(double)l))); }

// s = round(round(sigmoid(l)) g) from skip_gate's two values (l, g); the cases after the first (the
// initial values) are ones where rounding the sigmoid first changes s in the BF16 build.
void test_gated_skip_scale() {
  printf("\ngated skip scale\n");
  const std::vector<std::pair<float, float>> cases = {{-1.5f, 0.5f},  {-1.5f, 1.3f}, {-2.25f, 0.7f},
                                                      {1.5f, -0.8f},  {3.0f, 1.9f},  {-0.375f, 0.45f}};
  std::vector<float> got, ref;
  for (const auto& [l, g] : cases) {
    const std::vector<float> skip_gate = stored({l, g});
    DeviceArray<floatX> d_skip_gate(skip_gate), scale(1);
    scale.poison();
    gated_skip_scale(scale, d_skip_gate, {(floatX*)d_skip_gate + 1, 0}, 1, 0);
    got.push_back(scale.download()[0]);
    ref.push_back((float)(floatX)(float)(rounded_sigmoid(skip_gate[0]) * skip_gate[1]));
    printf("     l=%g g=%g: s=%.9g, reference %.9g\n", skip_gate[0], skip_gate[1], got.back(), ref.back());
  }
  check_close("gated skip scale", got, ref, kTolSkipScale);
}

void test_gated_skip(int N, int C, llmc::Rng& rng) {
  printf("\ngated skip N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f), kept = random_stored(rng, n, 0.5f, 1.0f);
  const std::vector<float> skip_gate = stored({-1.5f, 1.3f});  // skip_lambda, g
  DeviceArray<floatX> d_x(x), d_kept(kept), d_skip_gate(skip_gate), scale(1), sum(n), normed(n), ref_normed(n);
  DeviceArray<float> rstd(N), ref_rstd(N);
  gated_skip_scale(scale, d_skip_gate, {(floatX*)d_skip_gate + 1, 0}, N, 0);
  const double s = scale.download()[0];

  // The add x + s kept, s's product rounded to FP32 and the sum once to the storage type.
  std::vector<float> ref_sum(n);
  for (size_t i = 0; i < n; i++) ref_sum[i] = (float)(floatX)(x[i] + (float)(s * kept[i]));
  auto forward = [&] {
    sum.poison();
    normed.poison();
    rstd.poison();
    fused_residual_rmsnorm_forward(sum, normed, rstd, d_x, d_kept, nullptr, N, C, 0, SublayerScales{nullptr, scale});
  };
  forward();
  check_close("x + s kept (exact)", sum.download(), ref_sum, 0.0f);
  rmsnorm_forward(ref_normed, ref_rstd, sum, nullptr, N, C, 0);
  check_same_bits("its norm = rmsnorm_forward of the sum", Snapshot(ref_normed, ref_rstd), Snapshot(normed, rstd));
  const Snapshot forward_bits(sum, normed, rstd);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(sum, normed, rstd));

  // dout's and kept's means keep S = sum dout . kept positive, and the gradients accumulated onto
  // positive values: no cancellation for the FP32 sums' error to stand out in.
  const std::vector<float> dout = random_stored(rng, n, 0.5f, 1.0f), dkept0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dskip0 = random_stored(rng, 2, 1.0f, 0.25f);
  // dkept0 + s dout is exact in double (products of stored values), so rounding it to FP32 and then to
  // the storage type gives the kernel's bits in BF16 (FMA or not); FP32 may round the product first.
  std::vector<float> ref_dkept(n);
  double S = 0.0;
  for (size_t i = 0; i < n; i++) {
    ref_dkept[i] = (float)(floatX)(float)(dkept0[i] + s * dout[i]);
    S += (double)dout[i] * kept[i];
  }
  const double sig = rounded_sigmoid(skip_gate[0]), g = skip_gate[1];
  const std::vector<float> ref_dlambda = {(float)(dskip0[0] + g * sig * (1.0 - sig) * S)};
  const std::vector<float> ref_dg = {(float)(dskip0[1] + sig * S)};
  DeviceArray<floatX> d_dout(dout), dkept(n), dskip(2);
  DeviceArray<float> partials(kRowBlocks);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    dkept.upload(dkept0);
    dskip.upload(dskip0);
    partials.poison();
    gated_skip_backward(dkept, dskip, {(floatX*)dskip + 1, 0}, partials, d_dout, d_kept, scale, d_skip_gate,
                        {(floatX*)d_skip_gate + 1, 0}, N, C, seed, 0);
  };
  backward();
#if defined(ENABLE_FP32)
  check_close("backward dkept += s dout", dkept.download(), ref_dkept, kTolStore);
#else
  check_close("backward dkept += s dout (exact)", dkept.download(), ref_dkept, 0.0f);
#endif
  const std::vector<float> dskip_got = dskip.download();
  check_close("backward d skip_lambda", {dskip_got[0]}, ref_dlambda, kTolSum);
  check_close("backward dg", {dskip_got[1]}, ref_dg, kTolSum);
  const Snapshot backward_bits(dkept, dskip);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dkept, dskip));
}

// The gated skip with MUDD's g_n a row (at column kSkipColumn): s_n = round(round(sigmoid(l)) g_n) a
// row, the add x + s_n kept (SublayerScales' p a row) exactly and its norm bitwise rmsnorm_forward's;
// rows all holding one g give the shared g's bits. Backward: dkept += s_n dout, dg_n = sig S_n
// written (S_n the row's dout . kept), d skip_lambda += sig (1 - sig) (the sum of g_n S_n).
constexpr int kSkipColumn = 27;

void test_gated_skip_rows(int N, int C, llmc::Rng& rng) {
  printf("\ngated skip, g a row, N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f), kept = random_stored(rng, n, 0.5f, 1.0f);
  const std::vector<float> skip_lambda = stored({-1.5f}), g = random_stored(rng, N, 1.0f, 0.25f);
  const std::vector<float> rows = gate_rows(g, 1, kGateStride, kSkipColumn, kGateFill);
  DeviceArray<floatX> d_x(x), d_kept(kept), d_lambda(skip_lambda), d_rows(rows), scale(N), sum(n), normed(n);
  DeviceArray<floatX> ref_normed(n);
  DeviceArray<float> rstd(N), ref_rstd(N);
  const GateRows g_rows{(floatX*)d_rows + kSkipColumn, kGateStride};
  scale.poison();
  gated_skip_scale(scale, d_lambda, g_rows, N, 0);
  const std::vector<float> s = scale.download();
  const double sig = rounded_sigmoid(skip_lambda[0]);
  std::vector<float> ref_s(N);
  for (int t = 0; t < N; t++) ref_s[t] = (float)(floatX)(float)(sig * g[t]);
  check_close("s_n = round(round(sigmoid(l)) g_n)", s, ref_s, kTolSkipScale);

  std::vector<float> ref_sum(n);
  for (size_t i = 0; i < n; i++) ref_sum[i] = (float)(floatX)(x[i] + (float)((double)s[i / C] * kept[i]));
  auto forward = [&](const SublayerScales& scales) {
    sum.poison();
    normed.poison();
    rstd.poison();
    fused_residual_rmsnorm_forward(sum, normed, rstd, d_x, d_kept, nullptr, N, C, 0, scales);
  };
  forward(SublayerScales{nullptr, scale, 1});
  check_close("x + s_n kept (exact)", sum.download(), ref_sum, 0.0f);
  rmsnorm_forward(ref_normed, ref_rstd, sum, nullptr, N, C, 0);
  check_same_bits("its norm = rmsnorm_forward of the sum", Snapshot(ref_normed, ref_rstd), Snapshot(normed, rstd));
  const Snapshot forward_bits(sum, normed, rstd);
  forward(SublayerScales{nullptr, scale, 1});
  check_same_bits("forward twice", forward_bits, Snapshot(sum, normed, rstd));

  // Every row's g the same: the shared g's bits, the scale and the add.
  const std::vector<float> skip_gate = {skip_lambda[0], g[0]};
  DeviceArray<floatX> d_skip_gate(skip_gate), same_rows(gate_rows(std::vector<float>(N, g[0]), 1, kGateStride,
                                                                  kSkipColumn, kGateFill));
  DeviceArray<floatX> shared_scale(1);
  gated_skip_scale(shared_scale, d_skip_gate, {(floatX*)d_skip_gate + 1, 0}, N, 0);
  gated_skip_scale(scale, d_skip_gate, {(floatX*)same_rows + kSkipColumn, kGateStride}, N, 0);
  forward(SublayerScales{nullptr, shared_scale});
  const Snapshot shared_bits(sum, normed, rstd);
  forward(SublayerScales{nullptr, scale, 1});
  check_same_bits("rows of one g = the shared g", shared_bits, Snapshot(sum, normed, rstd));
  gated_skip_scale(scale, d_lambda, g_rows, N, 0);

  // dout's and kept's means keep each S_n positive, g_n near 1: no cancellation in the sum of g_n S_n.
  const std::vector<float> dout = random_stored(rng, n, 0.5f, 1.0f), dkept0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dlambda0 = random_stored(rng, 1, 1.0f, 0.25f);
  const std::vector<float> drows0(rows.size(), kGateFill);
  std::vector<float> ref_dkept(n), ref_dg(N);
  std::vector<double> S(N, 0.0);
  for (size_t i = 0; i < n; i++) {
    ref_dkept[i] = (float)(floatX)(float)(dkept0[i] + (double)s[i / C] * dout[i]);
    S[i / C] += (double)dout[i] * kept[i];
  }
  double weighted = 0.0;
  for (int t = 0; t < N; t++) {
    ref_dg[t] = (float)(sig * S[t]);
    weighted += g[t] * S[t];
  }
  const std::vector<float> ref_dlambda = {(float)(dlambda0[0] + sig * (1.0 - sig) * weighted)};
  DeviceArray<floatX> d_dout(dout), dkept(n), dlambda(1), drows(drows0);
  DeviceArray<float> partials(kRowBlocks);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    dkept.upload(dkept0);
    dlambda.upload(dlambda0);
    drows.upload(drows0);
    partials.poison();
    gated_skip_backward(dkept, dlambda, {(floatX*)drows + kSkipColumn, kGateStride}, partials, d_dout, d_kept, scale,
                        d_lambda, g_rows, N, C, seed, 0);
  };
  backward();
#if defined(ENABLE_FP32)
  check_close("backward dkept += s_n dout", dkept.download(), ref_dkept, kTolStore);
#else
  check_close("backward dkept += s_n dout (exact)", dkept.download(), ref_dkept, 0.0f);
#endif
  const std::vector<float> got = drows.download();
  check_close("backward dg_n = sig S_n, written", gate_columns(got, 1, kGateStride, kSkipColumn, true), ref_dg,
              kTolSum);
  check_close("backward: the rows' other columns untouched", gate_columns(got, 1, kGateStride, kSkipColumn, false),
              gate_columns(drows0, 1, kGateStride, kSkipColumn, false), 0.0f);
  check_close("backward d skip_lambda", dlambda.download(), ref_dlambda, kTolSum);
  const Snapshot backward_bits(dkept, dlambda, drows);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dkept, dlambda, drows));
}

// ---- Record #89's head gates ----

struct HeadGateCase {
  int N, NH, C;
  bool rows = false;  // MUDD's gates, NH a row from column kHeadGateColumn
};
constexpr int kHeadGateColumn = 13;

void test_head_gates(const HeadGateCase& c, llmc::Rng& rng) {
  printf("\nhead gates N=%d NH=%d C=%d%s\n", c.N, c.NH, c.C, c.rows ? ", gates a row" : "");
  const size_t n = (size_t)c.N * c.C;
  const int HS = c.C / c.NH;
  const std::vector<float> y = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> gate = random_stored(rng, (size_t)(c.rows ? c.N : 1) * c.NH, 0.25f, 0.5f);
  auto gate_at = [&](size_t i) { return gate[(c.rows ? (i / c.C) * c.NH : 0) + (i % c.C) / HS]; };
  DeviceArray<floatX> d_y(y), out(n), in_place(n);
  DeviceArray<floatX> d_gate(c.rows ? gate_rows(gate, c.NH, kGateStride, kHeadGateColumn, kGateFill) : gate);
  const GateRows gates = c.rows ? GateRows{(floatX*)d_gate + kHeadGateColumn, kGateStride} : GateRows{d_gate, 0};
  std::vector<float> ref_out(n);
  for (size_t i = 0; i < n; i++) ref_out[i] = (float)(floatX)(float)((double)y[i] * gate_at(i));
  auto forward = [&] {
    out.poison();
    head_gate_forward(out, d_y, gates, c.N, c.NH, c.C, 0);
  };
  forward();
  check_close("y g_h (exact)", out.download(), ref_out, 0.0f);
  const Snapshot forward_bits(out);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out));
  in_place.upload(y);
  head_gate_forward(in_place, in_place, gates, c.N, c.NH, c.C, 0);
  check_same_bits("forward in place", forward_bits, Snapshot(in_place));

  // dout's and y's means keep each head's sum away from cancelling; a shared gate's gradient
  // accumulates onto random values, a row's is written over kGateFill.
  const std::vector<float> dout = random_stored(rng, n, 0.5f, 1.0f);
  const std::vector<float> dgate0 = c.rows ? std::vector<float>((size_t)c.N * kGateStride, kGateFill)
                                           : random_stored(rng, c.NH, 0.0f, 1.0f);
  std::vector<float> ref_dy(n);
  std::vector<double> sums((size_t)(c.rows ? c.N : 1) * c.NH, 0.0);
  for (size_t i = 0; i < n; i++) {
    ref_dy[i] = (float)(floatX)(float)((double)dout[i] * gate_at(i));
    sums[(c.rows ? (i / c.C) * c.NH : 0) + (i % c.C) / HS] += (double)dout[i] * y[i];
  }
  std::vector<float> ref_dgate(sums.size());
  for (size_t k = 0; k < sums.size(); k++) ref_dgate[k] = (float)((c.rows ? 0.0 : dgate0[k]) + sums[k]);
  DeviceArray<floatX> d_dout(dout), dy(n), dgate(dgate0);
  const GateGradient dgates =
      c.rows ? GateGradient{(floatX*)dgate + kHeadGateColumn, kGateStride} : GateGradient{dgate, 0};
  DeviceArray<float> partials((size_t)kRowBlocks * c.NH);
  const uint32_t seed = rng.u32();
  auto backward = [&](floatX* target, bool over_dout) {
    if (over_dout) d_dout.upload(dout);
    else dy.poison();
    dgate.upload(dgate0);
    partials.poison();
    head_gate_backward(target, dgates, partials, d_dout, d_y, gates, c.N, c.NH, c.C, seed, 0);
  };
  backward(dy, false);
  check_close("dy = g_h dout (exact)", dy.download(), ref_dy, 0.0f);
  if (c.rows) {
    const std::vector<float> got = dgate.download();
    check_close("dg_n,h, written", gate_columns(got, c.NH, kGateStride, kHeadGateColumn, true), ref_dgate, kTolSum);
    check_close("the rows' other columns untouched", gate_columns(got, c.NH, kGateStride, kHeadGateColumn, false),
                gate_columns(dgate0, c.NH, kGateStride, kHeadGateColumn, false), 0.0f);
  } else {
    check_close("dg_h", dgate.download(), ref_dgate, kTolSum);
  }
  const Snapshot backward_bits(dy, dgate);
  backward(dy, false);
  check_same_bits("backward twice", backward_bits, Snapshot(dy, dgate));
  backward(d_dout, true);
  check_same_bits("backward in place over dout", backward_bits, Snapshot(d_dout, dgate));
}

// ---- Record #89's attention lambdas ----

// W' = round(s W) of a [rows, cols] weight, exact (a product of two stored values is exact in FP32
// in the BF16 build, correctly rounded in the FP32 one); the backward's dW = s dW' in place and
// ds += sum dW' W over the row blocks.
void test_attention_lambdas(int rows, int cols, llmc::Rng& rng) {
  printf("\nattention lambdas rows=%d cols=%d\n", rows, cols);
  const size_t n = (size_t)rows * cols;
  const std::vector<float> w = random_stored(rng, n, 0.0f, 0.05f), lambda = stored({0.7f, 1.3f});
  DeviceArray<floatX> d_w(w), d_lambda(lambda), scaled(n);
  for (int k = 0; k < 2; k++) {
    std::vector<float> ref(n);
    for (size_t i = 0; i < n; i++) ref[i] = (float)(floatX)(float)((double)lambda[k] * w[i]);
    auto forward = [&] {
      scaled.poison();
      attention_lambda_scale(scaled, d_w, (floatX*)d_lambda + k, n, 0);
    };
    forward();
    check_close(k == 0 ? "W' = s0 W (exact)" : "W' = s1 W (exact)", scaled.download(), ref, 0.0f);
    const Snapshot bits(scaled);
    forward();
    check_same_bits("forward twice", bits, Snapshot(scaled));
  }
  // dW' and W with positive means keep the sum away from cancelling; ds accumulates onto a random value.
  const std::vector<float> dscaled = random_stored(rng, n, 0.5f, 1.0f), w_pos = random_stored(rng, n, 0.5f, 1.0f);
  const std::vector<float> ds0 = random_stored(rng, 1, 0.0f, 1.0f);
  std::vector<float> ref_dw(n);
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) {
    ref_dw[i] = (float)((double)lambda[1] * dscaled[i]);
    sum += (double)dscaled[i] * w_pos[i];
  }
  const std::vector<float> ref_ds = {(float)(ds0[0] + sum)};
  DeviceArray<floatX> dw(n), ds(1), d_w_pos(w_pos);
  DeviceArray<float> partials(kRowBlocks);
  const uint32_t seed = rng.u32(), seed_lambda = rng.u32();
  auto backward = [&] {
    dw.upload(dscaled);
    ds.upload(ds0);
    partials.poison();
    attention_lambda_backward(dw, ds, partials, d_w_pos, (floatX*)d_lambda + 1, rows, cols, seed, seed_lambda, 0);
  };
  backward();
  check_close("backward dW = s dW', in place", dw.download(), ref_dw, kTolSum);
  check_close("backward ds += sum dW' W", ds.download(), ref_ds, kTolSum);
  const Snapshot bits(dw, ds);
  backward();
  check_same_bits("backward twice", bits, Snapshot(dw, ds));
}

// ---- Value mix ----

struct ValueMixCase {
  int N, C, Vp;
  bool ve;  // a layer with a value embedding
  bool learned_a = true;  // v scaled by a; else record #89's plan's mix, v + b ve (scales (b))
};

// The scales a case's mix reads, (a, b) or (b), and its a (1 without one).
std::vector<float> value_mix_scales(bool learned_a) { return learned_a ? stored({0.6f, 0.45f}) : stored({0.45f}); }

void test_value_mix(const ValueMixCase& s, llmc::Rng& rng) {
  const int N = s.N, C = s.C, Vp = s.Vp;
  const bool learned_a = s.learned_a;
  printf("\nvalue mix N=%d C=%d Vp=%d%s%s\n", N, C, Vp, s.ve ? ", value embedding" : "", learned_a ? "" : ", no a");
  const size_t n = (size_t)N * C, n3 = 3 * n;
  const std::vector<float> qkv = random_stored(rng, n3, 0.0f, 1.0f);
  const std::vector<float> ve = random_stored(rng, (size_t)Vp * C, 0.0f, 1.0f);
  // Tokens from all but the last id, so at least one row of ve is never read and dve's stays.
  const std::vector<int> tokens = random_ints(rng, N, 0, std::max(1, Vp - 1));
  const std::vector<float> scales = value_mix_scales(learned_a);
  const double a = learned_a ? scales[0] : 1.0, b = scales.back();
  const size_t nscales = scales.size(), b_at = nscales - 1;
  DeviceArray<floatX> d_qkv(n3), v_pre(n), d_ve(ve), d_scales(scales);
  DeviceArray<int> d_tokens(tokens);
  const floatX* ve_in = s.ve ? (floatX*)d_ve : nullptr;

  auto v_at = [&](const std::vector<float>& rows, size_t t, int c) { return rows[t * 3 * C + 2 * C + c]; };
  std::vector<float> ref_qkv = qkv, ref_v_pre(n);
  for (size_t t = 0; t < (size_t)N; t++) {
    for (int c = 0; c < C; c++) {
      const double v = v_at(qkv, t, c);
      ref_v_pre[t * C + c] = (float)v;
      const double e = s.ve ? ve[(size_t)tokens[t] * C + c] : 0.0;
      ref_qkv[t * 3 * C + 2 * C + c] = (float)(a * v + b * e);
    }
  }
  floatX* v_kept = learned_a ? (floatX*)v_pre : nullptr;
  auto forward = [&] {
    d_qkv.upload(qkv);
    v_pre.poison();
    value_mix_forward(d_qkv, v_kept, ve_in, d_tokens, d_scales, N, C, 0, {}, learned_a);
  };
  forward();
  const std::vector<float> got = d_qkv.download();
  check_close("forward q, k unchanged", columns(got, N, 3 * C, 0, 2 * C), columns(qkv, N, 3 * C, 0, 2 * C), 0.0f);
  // Without a nor a value embedding, v exactly as it was: nothing is done.
  check_close("forward v", columns(got, N, 3 * C, 2 * C, 3 * C), columns(ref_qkv, N, 3 * C, 2 * C, 3 * C),
              learned_a || s.ve ? kTolStore : 0.0f);
  if (learned_a) check_close("forward v_pre", v_pre.download(), ref_v_pre, 0.0f);
  const Snapshot forward_bits(d_qkv, v_pre);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(d_qkv, v_pre));

  // Backward from the forward's v_pre (the stored v, exactly ref_v_pre).
  const std::vector<float> dqkv = random_stored(rng, n3, 0.0f, 1.0f);
  const std::vector<float> dscales0 = random_stored(rng, nscales, 0.0f, 1.0f);
  const std::vector<float> dve0 = random_stored(rng, (size_t)Vp * C, 0.0f, 1.0f);
  std::vector<float> ref_dqkv = dqkv;
  std::vector<double> dve_sum((size_t)Vp * C, 0.0);
  double da = 0.0, db = 0.0;
  for (size_t t = 0; t < (size_t)N; t++) {
    for (int c = 0; c < C; c++) {
      const double g = v_at(dqkv, t, c), e = ve[(size_t)tokens[t] * C + c];
      ref_dqkv[t * 3 * C + 2 * C + c] = (float)(a * g);
      da += g * ref_v_pre[t * C + c];
      db += g * e;
      dve_sum[(size_t)tokens[t] * C + c] += b * g;
    }
  }
  std::vector<float> ref_dscales = dscales0;
  if (learned_a) ref_dscales[0] = (float)(dscales0[0] + da);
  if (s.ve) ref_dscales[b_at] = (float)(dscales0[b_at] + db);
  std::vector<float> ref_dve = dve0;
  if (s.ve) {
    for (size_t i = 0; i < ref_dve.size(); i++) ref_dve[i] = (float)(dve0[i] + dve_sum[i]);
  }

  DeviceArray<floatX> d_dqkv(n3), dscales(nscales), dve((size_t)Vp * C), scratch(n);
  DeviceArray<float> partials((size_t)kRowBlocks * 2);
  const DeviceEncoderPlan plan(tokens, C);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    d_dqkv.upload(dqkv);
    dscales.upload(dscales0);
    dve.upload(dve0);
    scratch.poison();
    partials.poison();
    value_mix_backward(d_dqkv, dscales, s.ve ? (floatX*)dve : nullptr, s.ve ? (floatX*)scratch : nullptr, partials,
                       v_kept, ve_in, d_tokens, d_scales, s.ve ? &plan.plan : nullptr, N, C, seed, 0, {}, learned_a);
  };
  backward();
  const std::vector<float> got_d = d_dqkv.download();
  check_close("backward dq, dk unchanged", columns(got_d, N, 3 * C, 0, 2 * C), columns(dqkv, N, 3 * C, 0, 2 * C),
              0.0f);
  // Without a, dv is v's gradient as it is: exactly.
  check_close(learned_a ? "backward dv_pre" : "backward dv unchanged", columns(got_d, N, 3 * C, 2 * C, 3 * C),
              columns(ref_dqkv, N, 3 * C, 2 * C, 3 * C), learned_a ? kTolStore : 0.0f);
  // db without a value embedding: untouched (exact); the sums: kTolSum.
  const std::vector<float> got_dscales = dscales.download();
  if (learned_a) check_close("backward da", {got_dscales[0]}, {ref_dscales[0]}, kTolSum);
  check_close(s.ve ? "backward db" : "backward db untouched", {got_dscales[b_at]}, {ref_dscales[b_at]},
              s.ve ? kTolSum : 0.0f);
  // The last id is never a token: its row must come back exactly, whatever the tolerance above.
  const std::vector<float> got_dve = dve.download();
  check_close(s.ve ? "backward dve" : "backward dve untouched", got_dve, ref_dve, s.ve ? kTolSum : 0.0f);
  check_close("backward dve of an unseen token", std::vector<float>(got_dve.end() - C, got_dve.end()),
              std::vector<float>(dve0.end() - C, dve0.end()), 0.0f);
  const Snapshot backward_bits(d_dqkv, dscales, dve);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(d_dqkv, dscales, dve));
}

// ---- Value mix with record #89's gates ----

struct ValueMixGateCase {
  int N, NH, C, Vp;
  bool learned_a = true;  // as ValueMixCase's
};

// v = a v + g_h ve[token] per head (v + g_h ve[token] without a), g_h = 2 sigmoid(W[h] . [hn[:6],
// ve[token][:6]]); the backward's dW, the gates' part of dhn's first 6 columns (rows ld apart, the 2
// after them left alone) and of dve's, b's gradient untouched.
// ve's gradient is each row's term, stored in floatX, summed over a token's rows: with the gates'
// terms in the first columns, rows can cancel, and the stored terms' rounding (half a unit of each)
// then shows against a small sum. Each element is held to kTolSum of its value and a unit of
// floatX of the sum of its rows' sizes.
void check_dve_rows(const std::string& name, const std::vector<float>& got, const std::vector<float>& ref,
                    const std::vector<double>& row_sizes) {
  const double unit = sizeof(floatX) == 2 ? 1.0 / 256 : 1.0 / (1 << 23);
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < got.size(); i++) {
    const double bound = kTolSum * std::fabs(ref[i]) + unit * row_sizes[i] + 1e-6;
    const double ratio = std::fabs((double)got[i] - ref[i]) / bound;
    if (!(ratio <= 1.0)) bad++;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  testing::check_verbose(bad == 0, llmc::strformat("%s within %g of its value and a unit of its rows' sizes (%zu bad; "
                                                   "worst [%zu] got %.7g ref %.7g, %.2f of its bound)", name.c_str(),
                                                   kTolSum, bad, worst, got[worst], ref[worst], worst_ratio));
}

void test_value_mix_gates(const ValueMixGateCase& s, llmc::Rng& rng) {
  const int N = s.N, NH = s.NH, C = s.C, Vp = s.Vp, HS = C / NH, ld = kVeGateInputs + 2;
  const bool learned_a = s.learned_a;
  printf("\nvalue mix with gates N=%d NH=%d C=%d (head size %d) Vp=%d%s\n", N, NH, C, HS, Vp,
         learned_a ? "" : ", no a");
  const size_t n = (size_t)N * C, n3 = 3 * n, weights = (size_t)NH * kVeGateWidth;
  const std::vector<float> qkv = random_stored(rng, n3, 0.0f, 1.0f);
  const std::vector<float> ve = random_stored(rng, (size_t)Vp * C, 0.0f, 1.0f);
  const std::vector<float> hn = random_stored(rng, n, 0.0f, 1.0f);
  // z of a unit or so, so that the gates spread over (0, 2).
  const std::vector<float> W = random_stored(rng, weights, 0.0f, 0.4f);
  const std::vector<int> tokens = random_ints(rng, N, 0, std::max(1, Vp - 1));
  const std::vector<float> scales = value_mix_scales(learned_a);
  const double a = learned_a ? scales[0] : 1.0;
  const size_t nscales = scales.size(), b_at = nscales - 1;
  DeviceArray<floatX> d_qkv(n3), v_pre(n), d_ve(ve), d_hn(hn), d_W(W), d_scales(scales);
  floatX* v_kept = learned_a ? (floatX*)v_pre : nullptr;
  DeviceArray<int> d_tokens(tokens);

  // Each row's gate inputs, gates and the mixed v.
  std::vector<double> inputs((size_t)N * kVeGateWidth), gate((size_t)N * NH);
  std::vector<float> ref_qkv = qkv;
  for (int t = 0; t < N; t++) {
    const float* e = ve.data() + (size_t)tokens[t] * C;
    for (int j = 0; j < kVeGateInputs; j++) {
      inputs[(size_t)t * kVeGateWidth + j] = hn[(size_t)t * C + j];
      inputs[(size_t)t * kVeGateWidth + kVeGateInputs + j] = e[j];
    }
    for (int h = 0; h < NH; h++) {
      double z = 0.0;
      for (int j = 0; j < kVeGateWidth; j++) z += (double)W[h * kVeGateWidth + j] * inputs[(size_t)t * kVeGateWidth + j];
      gate[(size_t)t * NH + h] = 2.0 / (1.0 + std::exp(-z));
    }
    for (int c = 0; c < C; c++) {
      const size_t at = (size_t)t * 3 * C + 2 * C + c;
      ref_qkv[at] = (float)(a * qkv[at] + gate[(size_t)t * NH + c / HS] * e[c]);
    }
  }
  const ValueMixGates forward_gates = {d_W, d_hn, NH};
  auto forward = [&] {
    d_qkv.upload(qkv);
    v_pre.poison();
    value_mix_forward(d_qkv, v_kept, d_ve, d_tokens, d_scales, N, C, 0, forward_gates, learned_a);
  };
  forward();
  const std::vector<float> got = d_qkv.download();
  check_close("forward q, k unchanged", columns(got, N, 3 * C, 0, 2 * C), columns(qkv, N, 3 * C, 0, 2 * C), 0.0f);
  check_close("forward v", columns(got, N, 3 * C, 2 * C, 3 * C), columns(ref_qkv, N, 3 * C, 2 * C, 3 * C),
              kTolStore);
  if (learned_a) check_close("forward v_pre", v_pre.download(), columns(qkv, N, 3 * C, 2 * C, 3 * C), 0.0f);
  const Snapshot forward_bits(d_qkv, v_pre);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(d_qkv, v_pre));

  const std::vector<float> dqkv = random_stored(rng, n3, 0.0f, 1.0f);
  const std::vector<float> dscales0 = random_stored(rng, nscales, 0.0f, 1.0f);
  const std::vector<float> dve0 = random_stored(rng, (size_t)Vp * C, 0.0f, 1.0f);
  const std::vector<float> dW0 = random_stored(rng, weights, 0.0f, 1.0f);
  // dhn's own gradient small beside the gates' part, so that theirs is what is measured.
  const std::vector<float> dhn0 = random_stored(rng, (size_t)N * ld, 0.0f, 0.1f);
  std::vector<float> ref_dqkv = dqkv, ref_dhn = dhn0;
  std::vector<double> dve_sum((size_t)Vp * C, 0.0), dve_size((size_t)Vp * C, 0.0), dW_sum(weights, 0.0), dz(NH);
  double da = 0.0;
  for (int t = 0; t < N; t++) {
    const float* e = ve.data() + (size_t)tokens[t] * C;
    const size_t v_at = (size_t)t * 3 * C + 2 * C;
    for (int h = 0; h < NH; h++) {
      double dg = 0.0;
      for (int c = h * HS; c < (h + 1) * HS; c++) dg += (double)dqkv[v_at + c] * e[c];
      const double g = gate[(size_t)t * NH + h];
      dz[h] = dg * g * (1.0 - 0.5 * g);
      for (int j = 0; j < kVeGateWidth; j++) dW_sum[h * kVeGateWidth + j] += dz[h] * inputs[(size_t)t * kVeGateWidth + j];
    }
    for (int c = 0; c < C; c++) {
      const double d = dqkv[v_at + c];
      ref_dqkv[v_at + c] = (float)(a * d);
      da += d * qkv[v_at + c];
      double dve = gate[(size_t)t * NH + c / HS] * d;
      for (int h = 0; c < kVeGateInputs && h < NH; h++) dve += dz[h] * W[h * kVeGateWidth + kVeGateInputs + c];
      dve_sum[(size_t)tokens[t] * C + c] += dve;
      dve_size[(size_t)tokens[t] * C + c] += std::fabs(dve);
    }
    for (int j = 0; j < kVeGateInputs; j++) {
      double sum = 0.0;
      for (int h = 0; h < NH; h++) sum += dz[h] * W[h * kVeGateWidth + j];
      ref_dhn[(size_t)t * ld + j] = (float)(dhn0[(size_t)t * ld + j] + sum);
    }
  }
  std::vector<float> ref_dve(dve0.size()), ref_dW(weights);
  for (size_t i = 0; i < ref_dve.size(); i++) ref_dve[i] = (float)(dve0[i] + dve_sum[i]);
  for (size_t e = 0; e < weights; e++) ref_dW[e] = (float)(dW0[e] + dW_sum[e]);

  DeviceArray<floatX> d_dqkv(n3), dscales(nscales), dve((size_t)Vp * C), scratch(n), dW(weights), dhn((size_t)N * ld);
  DeviceArray<float> partials(value_mix_backward_partials(NH));
  const DeviceEncoderPlan plan(tokens, C);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    d_dqkv.upload(dqkv);
    dscales.upload(dscales0);
    dve.upload(dve0);
    dW.upload(dW0);
    dhn.upload(dhn0);
    scratch.poison();
    partials.poison();
    value_mix_backward(d_dqkv, dscales, dve, scratch, partials, v_kept, d_ve, d_tokens, d_scales, &plan.plan, N, C,
                       seed, 0, ValueMixGates{d_W, d_hn, NH, dW, dhn, ld}, learned_a);
  };
  backward();
  const std::vector<float> got_d = d_dqkv.download();
  check_close("backward dq, dk unchanged", columns(got_d, N, 3 * C, 0, 2 * C), columns(dqkv, N, 3 * C, 0, 2 * C),
              0.0f);
  check_close(learned_a ? "backward dv_pre" : "backward dv unchanged", columns(got_d, N, 3 * C, 2 * C, 3 * C),
              columns(ref_dqkv, N, 3 * C, 2 * C, 3 * C), learned_a ? kTolStore : 0.0f);
  const std::vector<float> got_dscales = dscales.download();
  if (learned_a) check_close("backward da", {got_dscales[0]}, {(float)(dscales0[0] + da)}, kTolSum);
  check_close("backward db untouched (the gates take b's place)", {got_dscales[b_at]}, {dscales0[b_at]}, 0.0f);
  check_close("backward dW", dW.download(), ref_dW, kTolSum);
  const std::vector<float> got_dhn = dhn.download();
  check_close("backward dhn[:, :6]", columns(got_dhn, N, ld, 0, kVeGateInputs), columns(ref_dhn, N, ld, 0, kVeGateInputs),
              kTolStore);
  check_close("backward dhn[:, 6:8] unchanged", columns(got_dhn, N, ld, kVeGateInputs, ld),
              columns(dhn0, N, ld, kVeGateInputs, ld), 0.0f);
  const std::vector<float> got_dve = dve.download();
  check_dve_rows("backward dve", got_dve, ref_dve, dve_size);
  check_close("backward dve of an unseen token", std::vector<float>(got_dve.end() - C, got_dve.end()),
              std::vector<float>(dve0.end() - C, dve0.end()), 0.0f);
  const Snapshot backward_bits(d_dqkv, dscales, dve, dW, dhn);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(d_dqkv, dscales, dve, dW, dhn));
}

// ---- Attention gate ----

struct GateCase {
  int N, NH, C;
};

void test_attention_gate(const GateCase& s, llmc::Rng& rng) {
  const int N = s.N, NH = s.NH, C = s.C, G = C / kAttentionGateDivisor, HS = C / NH;
  printf("\nattention gate N=%d NH=%d C=%d (G=%d, head size %d)\n", N, NH, C, G, HS);
  const size_t n = (size_t)N * C;
  const std::vector<float> y = random_stored(rng, n, 0.0f, 1.0f), hn = random_stored(rng, n, 0.0f, 1.0f);
  // z = W . hn[:G] of a few units, so that gates spread over (0, 1).
  const std::vector<float> W = random_stored(rng, (size_t)NH * G, 0.0f, 2.0f / std::sqrt((float)G));
  DeviceArray<floatX> d_y(y), d_hn(hn), d_W(W), yg(n);
  DeviceArray<float> g((size_t)N * NH);

  std::vector<double> gate((size_t)N * NH);
  std::vector<float> ref_g(gate.size()), ref_yg(n);
  for (int t = 0; t < N; t++) {
    for (int h = 0; h < NH; h++) {
      double z = 0.0;
      for (int j = 0; j < G; j++) z += (double)W[h * G + j] * hn[(size_t)t * C + j];
      gate[t * NH + h] = 1.0 / (1.0 + std::exp(-z));
      ref_g[t * NH + h] = (float)gate[t * NH + h];
    }
    for (int c = 0; c < C; c++) ref_yg[(size_t)t * C + c] = (float)(y[(size_t)t * C + c] * gate[t * NH + c / HS]);
  }
  auto forward = [&] {
    yg.poison();
    g.poison();
    attention_gate_forward(yg, g, d_y, d_hn, d_W, N, NH, C, 0);
  };
  forward();
  check_close("forward yg", yg.download(), ref_yg, kTolStore);
  check_close("forward g", g.download(), ref_g, kTolFP32);
  const Snapshot forward_bits(yg, g);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(yg, g));
  yg.poison();
  attention_gate_apply(yg, d_y, g, N, NH, C, 0);
  check_same_bits("apply as the forward", forward_bits, Snapshot(yg, g));

  // Backward from the forward's g.
  const std::vector<float> dyg = random_stored(rng, n, 0.0f, 1.0f);
  // dhn's own gradient small beside the gate's, so that the gate's part is what is measured.
  const std::vector<float> dhn0 = random_stored(rng, n, 0.0f, 0.1f);
  const std::vector<float> dW0 = random_stored(rng, (size_t)NH * G, 0.0f, 1.0f);
  std::vector<float> ref_dy(n), ref_dhn = dhn0;
  std::vector<double> dW_sum((size_t)NH * G, 0.0), dz(NH);
  for (int t = 0; t < N; t++) {
    const size_t base = (size_t)t * C;
    for (int h = 0; h < NH; h++) {
      double dot = 0.0;
      for (int d = 0; d < HS; d++) dot += (double)dyg[base + h * HS + d] * y[base + h * HS + d];
      const double gh = gate[t * NH + h];
      dz[h] = dot * gh * (1.0 - gh);
      for (int d = 0; d < HS; d++) ref_dy[base + h * HS + d] = (float)(gh * dyg[base + h * HS + d]);
      for (int j = 0; j < G; j++) dW_sum[h * G + j] += dz[h] * hn[base + j];
    }
    for (int j = 0; j < G; j++) {
      double sum = 0.0;
      for (int h = 0; h < NH; h++) sum += dz[h] * W[h * G + j];
      ref_dhn[base + j] = (float)(dhn0[base + j] + sum);
    }
  }
  std::vector<float> ref_dW(dW0.size());
  for (size_t e = 0; e < ref_dW.size(); e++) ref_dW[e] = (float)(dW0[e] + dW_sum[e]);

  DeviceArray<floatX> d_dyg(dyg), dy(n), dhn(n), dW((size_t)NH * G);
  DeviceArray<float> partials(attention_gate_backward_partials(N, NH, C));
  const uint32_t seed = rng.u32();
  // in_place: dy is dyg's own memory (d_dyg holds dyg again first).
  auto backward = [&](bool in_place) {
    d_dyg.upload(dyg);
    dy.poison();
    dhn.upload(dhn0);
    dW.upload(dW0);
    partials.poison();
    attention_gate_backward(in_place ? (floatX*)d_dyg : (floatX*)dy, dhn, C, dW, partials, d_dyg, d_y, g, d_hn, d_W,
                            N, NH, C, seed, 0);
  };
  backward(false);
  check_close("backward dy", dy.download(), ref_dy, kTolStore);
  const std::vector<float> got_dhn = dhn.download();
  check_close("backward dhn[:, :G]", columns(got_dhn, N, C, 0, G), columns(ref_dhn, N, C, 0, G), kTolStore);
  check_close("backward dhn[:, G:] unchanged", columns(got_dhn, N, C, G, C), columns(dhn0, N, C, G, C), 0.0f);
  check_close("backward dW", dW.download(), ref_dW, kTolSum);
  const Snapshot backward_bits(dy, dhn, dW);
  backward(false);
  check_same_bits("backward twice", backward_bits, Snapshot(dy, dhn, dW));
  backward(true);
  check_same_bits("backward dy in place", backward_bits, Snapshot(d_dyg, dhn, dW));

  // With the flash backward's row dots: the same gradients, and each head's dy . y with
  // backward_row_dots' bits on the dy the gate wrote (and near the CPU's dot of its dy and y).
  if (attention_gate_row_dots_supported(NH, C)) {
    const int B = N % 3 == 0 ? 3 : N % 7 == 0 ? 7 : 1, T = N / B;
    DeviceArray<float> dots((size_t)N * NH);
    d_dyg.upload(dyg);
    dy.poison();
    dhn.upload(dhn0);
    dW.upload(dW0);
    dots.poison();
    attention_gate_backward(dy, dhn, C, dW, partials, d_dyg, d_y, g, d_hn, d_W, N, NH, C, seed, 0,
                            AttentionRowDots{dots, T});
    check_same_bits("backward with the row dots: the same dy, dhn and dW", backward_bits, Snapshot(dy, dhn, dW));
    const std::vector<float> got_dy = dy.download();
    std::vector<float> ref_dots((size_t)N * NH);
    for (int t = 0; t < N; t++) {
      for (int h = 0; h < NH; h++) {
        double dot = 0.0;
        for (int d = 0; d < HS; d++) dot += (double)got_dy[(size_t)t * C + h * HS + d] * y[(size_t)t * C + h * HS + d];
        ref_dots[((size_t)(t / T) * NH + h) * T + t % T] = (float)dot;
      }
    }
    check_close("row dots", dots.download(), ref_dots, kTolSum);
#if !defined(ENABLE_FP32)  // the flash kernels are BF16's
    DeviceArray<float> flash_dots((size_t)N * NH);
    flash_dots.poison();
    if (HS == 128) flash::backward_row_dots<128>(flash_dots, dy, d_y, B, T, NH, 0);
    else flash::backward_row_dots<64>(flash_dots, dy, d_y, B, T, NH, 0);
    check_same_bits("row dots: backward_row_dots' bits", Snapshot(flash_dots), Snapshot(dots));
#endif
  }

  // The trainer's way: the gate's columns alone (rows G apart, zeroed), then added into a full
  // gradient by add_columns_inplace: add_inplace's bits of the full dhn onto the same gradient.
  DeviceArray<floatX> compact((size_t)N * G), full_gate(n), sum_full(dhn0), sum_columns(dhn0);
  compact.upload(std::vector<float>((size_t)N * G, 0.0f));
  full_gate.upload(std::vector<float>(n, 0.0f));
  attention_gate_backward(dy, compact, G, dW, partials, d_dyg, d_y, g, d_hn, d_W, N, NH, C, seed, 0);
  attention_gate_backward(dy, full_gate, C, dW, partials, d_dyg, d_y, g, d_hn, d_W, N, NH, C, seed, 0);
  check_close("backward dhn, rows G apart = rows C apart", compact.download(), columns(full_gate.download(), N, C, 0, G),
              0.0f);
  const uint32_t add_seed = rng.u32();
  add_inplace(sum_full, full_gate, n, add_seed, 0);
  add_columns_inplace(sum_columns, C, compact, G, N, G, add_seed, 0);
  check_same_bits("add_columns_inplace = add_inplace of the zero-padded columns", Snapshot(sum_full),
                  Snapshot(sum_columns));
}

// ---- Record #89's XSA ----

struct XsaCase {
  int N, NH, C;
  bool rows = false;  // MUDD's strengths, NH a row from column kXsaColumn
};
constexpr int kXsaColumn = 7;

// The forward's scalars of one row and head, rounded where the kernel (and train_gpt2.py) round:
// each product, the dots, the ratio, s and s times the ratio; the sums in double.
struct XsaHeadRef {
  double dot, den, coef, s, t;
  bool clamped;
};

float to_stored(double x) { return (float)(floatX)(float)x; }

XsaHeadRef xsa_head_ref(const float* y, const float* v, int HS, float alpha) {
  double yv = 0.0, vv = 0.0;
  for (int d = 0; d < HS; d++) {
    yv += to_stored((double)y[d] * v[d]);
    vv += to_stored((double)v[d] * v[d]);
  }
  XsaHeadRef r;
  r.t = std::tanh((double)alpha);
  r.s = to_stored(r.t);
  r.dot = to_stored(yv);
  const double squares = to_stored(vv), floor = to_stored(kXsaMinSquares);
  r.clamped = squares < floor;
  r.den = r.clamped ? floor : squares;
  r.coef = to_stored(r.s * to_stored(r.dot / r.den));
  return r;
}

void test_xsa(const XsaCase& s, llmc::Rng& rng) {
  const int N = s.N, NH = s.NH, C = s.C, HS = C / NH, ld_v = 3 * C;
  printf("\nXSA N=%d NH=%d C=%d (head size %d)%s\n", N, NH, C, HS, s.rows ? ", strengths a row" : "");
  const size_t n = (size_t)N * C;
  const std::vector<float> y = random_stored(rng, n, 0.0f, 1.0f);
  // v inside a qkv row [N, 3C] (q and k random), columns [2C, 3C): a whole zero row, and head 0 of
  // every 5th row zero (the clamp of |v|^2).
  std::vector<float> qkv = random_stored(rng, (size_t)N * ld_v, 0.0f, 1.0f);
  for (int t = 0; t < N; t++) {
    for (int c = 0; c < C; c++) {
      if (t == N / 2 || (t % 5 == 0 && c < HS)) qkv[(size_t)t * ld_v + 2 * C + c] = 0.0f;
    }
  }
  const std::vector<float> alpha = random_stored(rng, (size_t)(s.rows ? N : 1) * NH, 0.0f, 1.0f);
  auto alpha_at = [&](int t, int h) { return alpha[(s.rows ? (size_t)t * NH : 0) + h]; };
  DeviceArray<floatX> d_y(y), d_qkv(qkv), out(n);
  DeviceArray<floatX> d_alpha(s.rows ? gate_rows(alpha, NH, kGateStride, kXsaColumn, kGateFill) : alpha);
  const GateRows alphas = s.rows ? GateRows{(floatX*)d_alpha + kXsaColumn, kGateStride} : GateRows{d_alpha, 0};
  const floatX* d_v = (floatX*)d_qkv + 2 * C;
  auto v_at = [&](int t, int c) { return qkv[(size_t)t * ld_v + 2 * C + c]; };

  std::vector<XsaHeadRef> heads((size_t)N * NH);
  std::vector<float> ref_out(n);
  std::vector<float> vrow(HS);
  for (int t = 0; t < N; t++) {
    for (int h = 0; h < NH; h++) {
      for (int d = 0; d < HS; d++) vrow[d] = v_at(t, h * HS + d);
      const XsaHeadRef r = xsa_head_ref(&y[(size_t)t * C + h * HS], vrow.data(), HS, alpha_at(t, h));
      heads[(size_t)t * NH + h] = r;
      for (int d = 0; d < HS; d++) {
        ref_out[(size_t)t * C + h * HS + d] = (float)(y[(size_t)t * C + h * HS + d] - to_stored(r.coef * vrow[d]));
      }
    }
  }
  auto forward = [&] {
    out.poison();
    xsa_forward(out, d_y, d_v, ld_v, alphas, N, NH, C, 0);
  };
  forward();
  const std::vector<float> got_out = out.download();
  check_close("forward out", got_out, ref_out, kTolStore);
  std::vector<float> zero_row_out(got_out.begin() + (size_t)(N / 2) * C, got_out.begin() + (size_t)(N / 2 + 1) * C);
  check_close("forward out = y where v is zero (the clamp)", zero_row_out,
              std::vector<float>(y.begin() + (size_t)(N / 2) * C, y.begin() + (size_t)(N / 2 + 1) * C), 0.0f);
  const Snapshot forward_bits(out);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out));

  // Backward from the forward's scalars: dy = g - a v, dv = -coef g - a y + b v (b 0 where clamped),
  // a = s (g . v) / den, b = 2 s (g . v) dot / den^2, dalpha += -(dot / den) (g . v) (1 - t^2).
  const std::vector<float> g = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dalpha0 =
      s.rows ? std::vector<float>((size_t)N * kGateStride, kGateFill) : random_stored(rng, NH, 0.0f, 1.0f);
  std::vector<float> ref_dy(n), ref_dv(n);
  std::vector<double> dalpha_sum((size_t)(s.rows ? N : 1) * NH, 0.0);
  for (int t = 0; t < N; t++) {
    for (int h = 0; h < NH; h++) {
      const XsaHeadRef& r = heads[(size_t)t * NH + h];
      const size_t base = (size_t)t * C + h * HS;
      double gv = 0.0;
      for (int d = 0; d < HS; d++) gv += (double)g[base + d] * v_at(t, h * HS + d);
      const double a = r.s * gv / r.den, b = r.clamped ? 0.0 : 2.0 * r.s * gv * r.dot / (r.den * r.den);
      for (int d = 0; d < HS; d++) {
        const double vd = v_at(t, h * HS + d);
        ref_dy[base + d] = (float)(g[base + d] - a * vd);
        ref_dv[base + d] = (float)(-r.coef * g[base + d] - a * y[base + d] + b * vd);
      }
      dalpha_sum[(s.rows ? (size_t)t * NH : 0) + h] += -(r.dot / r.den) * gv * (1.0 - r.t * r.t);
    }
  }
  std::vector<float> ref_dalpha(dalpha_sum.size());
  for (size_t k = 0; k < ref_dalpha.size(); k++) ref_dalpha[k] = (float)((s.rows ? 0.0 : dalpha0[k]) + dalpha_sum[k]);

  DeviceArray<floatX> d_g(g), dy(n), dv(n), dalpha(dalpha0);
  const GateGradient dalphas =
      s.rows ? GateGradient{(floatX*)dalpha + kXsaColumn, kGateStride} : GateGradient{dalpha, 0};
  DeviceArray<float> partials(xsa_backward_partials(NH));
  const uint32_t seed = rng.u32();
  // in_place: dy is dout's own memory (d_g holds g again first).
  auto backward = [&](bool in_place) {
    d_g.upload(g);
    dy.poison();
    dv.poison();
    dalpha.upload(dalpha0);
    partials.poison();
    xsa_backward(in_place ? (floatX*)d_g : (floatX*)dy, dv, dalphas, partials, d_g, d_y, d_v, ld_v, alphas, N, NH, C,
                 seed, 0);
  };
  backward(false);
  check_close("backward dy", dy.download(), ref_dy, kTolStore);
  check_close("backward dv", dv.download(), ref_dv, kTolStore);
  if (s.rows) {
    const std::vector<float> got = dalpha.download();
    check_close("backward dalpha_n,h, written", gate_columns(got, NH, kGateStride, kXsaColumn, true), ref_dalpha,
                kTolSum);
    check_close("backward: the rows' other columns untouched", gate_columns(got, NH, kGateStride, kXsaColumn, false),
                gate_columns(dalpha0, NH, kGateStride, kXsaColumn, false), 0.0f);
  } else {
    check_close("backward dalpha", dalpha.download(), ref_dalpha, kTolSum);
  }
  const Snapshot backward_bits(dy, dv, dalpha);
  backward(false);
  check_same_bits("backward twice", backward_bits, Snapshot(dy, dv, dalpha));
  backward(true);
  check_same_bits("backward dy in place over dout", backward_bits, Snapshot(d_g, dv, dalpha));
}

// Shapes the kernels cannot take are refused with a message naming them.
void test_bad_shapes() {
  DeviceArray<floatX> a(3 * 768), b(3 * 768);
  DeviceArray<float> g(8);
  testing::check_throws([&] { attention_gate_forward(a, g, b, b, b, 1, 5, 768, 0); }, "head size",
                        "attention_gate_forward with 5 heads of 768 channels");
  testing::check_throws([&] { attention_gate_apply(a, b, g, 1, 1, 32, 0); }, "C at least 64",
                        "attention_gate_apply at C = 32");
  testing::check_throws([&] { residual_mix_norm_forward(a, a, g, b, b, b, b, nullptr, nullptr, 1, 768, 0); },
                        "skip_weight", "residual_mix_norm_forward with a skip but no skip weight");
  testing::check_throws(
      [&] {
        residual_mix_norm_forward(a, a, g, b, b, nullptr, b, nullptr, nullptr, 1, 768, 0, ResidualAddFirst{b, a});
      },
      "x_sum apart", "residual_mix_norm_forward with the add's sum into out");
  testing::check_throws(
      [&] { sublayer_lambdas_backward(a, b, a, a, g, b, b, SublayerScales{b, nullptr}, 1, 768, 1, 0); },
      "both scales", "sublayer_lambdas_backward without p");
  DeviceArray<floatX> dx0(3 * 768), scalars(2);
  DeviceArray<float> mix_partials((size_t)kRowBlocks * 3);
  testing::check_throws(
      [&] {
        residual_mix_backward(a, dx0, nullptr, scalars, nullptr, mix_partials, a, b, b, nullptr, b, nullptr, 1, 768,
                              1, 0, GradientJoin{a, 2});
      },
      "joining dx", "residual_mix_backward with dx itself joining it");
  testing::check_throws([&] { value_mix_forward(a, b, b, nullptr, b, 1, 768, 0); }, "tokens",
                        "value_mix_forward with a value embedding but no tokens");
  DeviceArray<int> tokens(1);
  testing::check_throws([&] { value_mix_forward(a, nullptr, b, tokens, b, 1, 768, 0); }, "needs v_pre",
                        "value_mix_forward with a learned a but nowhere to keep v");
  testing::check_throws([&] { value_mix_forward(a, b, nullptr, tokens, b, 1, 768, 0, ValueMixGates{b, b, 6}); },
                        "need a value embedding", "value_mix_forward with gates but no value embedding");
  testing::check_throws([&] { value_mix_forward(a, b, b, tokens, b, 1, 768, 0, ValueMixGates{b, b, 5}); },
                        "NH=5 heads", "value_mix_forward with gates over 5 heads of 768 channels");
  DeviceArray<float> dots(8), partials(attention_gate_backward_partials(8, 1, 136));
  testing::check_throws(
      [&] { attention_gate_backward(a, b, 2, b, partials, a, b, g, b, b, 8, 1, 136, 1, 0, AttentionRowDots{dots, 8}); },
      "row dots", "attention_gate_backward's row dots at head size 136 (a row's pieces not whole warps)");
  testing::check_throws([&] { xsa_forward(a, b, b, 768, {b, 0}, 1, 5, 768, 0); }, "head size",
                        "xsa_forward with 5 heads of 768 channels");
  testing::check_throws([&] { xsa_forward(a, b, a, 768, {b, 0}, 1, 6, 768, 0); }, "out must not",
                        "xsa_forward writing over v");
  DeviceArray<float> xsa_partials(xsa_backward_partials(6));
  testing::check_throws([&] { xsa_backward(a, a, {b, 0}, xsa_partials, b, b, b, 2304, {b, 0}, 1, 6, 768, 1, 0); },
                        "dv apart",
                        "xsa_backward with dv over dy");
  DeviceArray<float> skip_partials(kRowBlocks);
  testing::check_throws([&] { gated_skip_backward(a, b, {b, 0}, skip_partials, a, b, b, b, {b, 0}, 3, 768, 1, 0); },
                        "apart from dout", "gated_skip_backward with dkept over dout");
  testing::check_throws([&] { head_gate_forward(a, b, {b, 0}, 3, 33, 768, 0); }, "up to 32 heads",
                        "head_gate_forward with 33 heads");
  testing::check_throws([&] { head_gate_forward(a, b, {b, 0}, 3, 6, 100, 0); }, "multiple of",
                        "head_gate_forward with heads of 100 / 6 channels");
  testing::check_throws([&] { attention_lambda_scale(a, b, b, 10, 0); }, "multiple of",
                        "attention_lambda_scale of 10 values");
  testing::check_throws([&] { attention_lambda_backward(a, b, g, b, b, 2, 6, 1, 2, 0); }, "not a multiple",
                        "attention_lambda_backward of rows of 6 columns");
  testing::check_throws([&] { xsa_forward(a, b, b, 2304, {b, 3}, 1, 6, 768, 0); }, "stride of 0 or at least 6",
                        "xsa_forward with rows of strengths 3 apart for 6 heads");
  DeviceArray<float> head_partials((size_t)kRowBlocks * 6);
  testing::check_throws([&] { head_gate_backward(a, {a, 0}, head_partials, b, b, {b, 48}, 3, 6, 768, 1, 0); },
                        "gradient needs", "head_gate_backward with gates a row but a shared gradient");
  testing::check_throws(
      [&] { sublayer_lambdas_backward(a, b, a, a, g, b, b, SublayerScales{b, b, 1}, 1, 768, 1, 0); },
      "one value each", "sublayer_lambdas_backward with p a row");
}

void run() {
  llmc::Rng rng(28);
  for (bool skip : {false, true}) {
    test_residual_mix({4 * 64 + 1, 768, skip, false}, rng);  // d12 width; one row per backward block, one more
    test_residual_mix({3999, 768, skip, false}, rng);        // 16 rows per block; one short, six empty
    test_residual_mix({37, 128, skip, false}, rng);          // tiny width; most blocks empty
  }
  test_residual_mix({1001, 256, false, true}, rng);  // the first layer: x is x0
  test_sublayer_lambdas(4 * 64 + 1, 768, rng);  // d12 width; one row per backward block, one more
  test_sublayer_lambdas(3999, 768, rng);        // 16 rows per block; one short, six empty
  test_sublayer_lambdas(37, 128, rng);          // tiny width; most blocks empty
  test_gated_skip_scale();
  llmc::Rng skip_rng(89);  // its own draws, so that the later cases keep their inputs
  test_gated_skip(4 * 64 + 1, 768, skip_rng);  // d12 width; one row per backward block, one more
  test_gated_skip(3999, 768, skip_rng);        // 16 rows per block; one short, six empty
  test_gated_skip(37, 128, skip_rng);          // tiny width; most blocks empty
  test_gated_skip(1, 768, skip_rng);           // one row: every block but the first empty

  for (bool ve : {true, false}) {
    test_value_mix({4 * 64 + 1, 768, 64, ve}, rng);  // tokens repeated about four times
    test_value_mix({3999, 768, 301, ve}, rng);
    test_value_mix({37, 128, 5, ve}, rng);           // a few ids, many repeats
  }
  test_value_mix({7, 136, 3, true}, rng);  // 17 pieces of a row: a partial warp
  test_value_mix_gates({4 * 64 + 1, 6, 768, 64}, rng);  // d12: 6 heads of 128; one row per block, one more
  test_value_mix_gates({3999, 6, 768, 301}, rng);       // 16 rows per block: each warp two, some one
  test_value_mix_gates({37, 2, 128, 5}, rng);           // tiny: 2 heads of 64; most blocks empty
  test_value_mix_gates({7, 1, 136, 3}, rng);            // 17 pieces of a row: a partial warp
  test_value_mix_gates({301, 64 / x128::size, 64, 7}, rng);  // heads of one piece: 8 channels (FP32: 4)
  // Record #89's plan: no a (v + b ve, v as it is in a layer without a value embedding); draws of
  // their own, so that the later cases keep their inputs.
  llmc::Rng no_a_rng(892);
  for (bool ve : {true, false}) test_value_mix({3999, 768, 301, ve, false}, no_a_rng);
  test_value_mix({7, 136, 3, true, false}, no_a_rng);
  test_value_mix_gates({3999, 6, 768, 301, false}, no_a_rng);
  test_value_mix_gates({37, 2, 128, 5, false}, no_a_rng);

  test_attention_gate({4 * 64 + 1, 6, 768}, rng);  // d12: head size 128, G = 12
  test_attention_gate({3999, 6, 768}, rng);
  test_attention_gate({1001, 2, 256}, rng);  // G = 4
  test_attention_gate({37, 1, 128}, rng);    // tiny: one head, G = 2
  test_attention_gate({7, 1, 136}, rng);     // head size 136: 17 pieces, G = 2

  test_xsa({4 * 64 + 1, 6, 768}, rng);  // d12: 6 heads of 128; one row per backward block, one more
  test_xsa({3999, 6, 768}, rng);        // 16 rows per block: each warp two, some one
  test_xsa({1001, 12, 768}, rng);       // 12 heads of 64
  test_xsa({37, 2, 128}, rng);          // tiny: 2 heads of 64; most blocks empty
  test_xsa({301, 6, 384}, rng);         // 6 heads of 64, 48 pieces a row: a warp and a half
  test_xsa({513, 12, 1536}, rng);       // 12 heads of 128
  llmc::Rng head_gate_rng(3);  // its own draws, so that the later cases keep their inputs
  test_head_gates({4 * 64 + 1, 6, 768}, head_gate_rng);  // d12: 6 heads of 128; one row per block, one more
  test_head_gates({3999, 6, 768}, head_gate_rng);        // 16 rows per block; one short, six empty
  test_head_gates({37, 2, 128}, head_gate_rng);          // tiny: 2 heads of 64; most blocks empty
  test_head_gates({7, 1, 136}, head_gate_rng);           // one head of 17 pieces
  test_head_gates({1001, 12, 768}, head_gate_rng);       // 12 heads of 64
  llmc::Rng attn_lambda_rng(5);  // its own draws, so that the later cases keep their inputs
  test_attention_lambdas(3 * 768, 768, attn_lambda_rng);  // d12's qkv: 9 rows a backward block
  test_attention_lambdas(768, 768, attn_lambda_rng);      // d12's output projection: 3 rows a block
  test_attention_lambdas(3 * 128, 128, attn_lambda_rng);  // tiny's qkv: 2 rows a block, some blocks empty
  test_attention_lambdas(136, 136, attn_lambda_rng);      // 17 pieces a row; one row a block, most empty
  test_attention_lambdas(1, 8, attn_lambda_rng);          // one piece: every block but the first empty

  llmc::Rng rows_rng(48);  // record #89's MUDD gates, a gate a row: draws of their own
  test_gated_skip_rows(4 * 64 + 1, 768, rows_rng);  // d12 width; one row per backward block, one more
  test_gated_skip_rows(3999, 768, rows_rng);        // 16 rows per block: each warp two, some one
  test_gated_skip_rows(37, 128, rows_rng);          // tiny width; most blocks empty
  test_gated_skip_rows(7, 136, rows_rng);           // a row of 17 pieces: a partial warp
  test_gated_skip_rows(1, 768, rows_rng);           // one row: every block but the first empty
  test_xsa({4 * 64 + 1, 6, 768, true}, rows_rng);   // d12: 6 heads of 128
  test_xsa({3999, 6, 768, true}, rows_rng);
  test_xsa({37, 2, 128, true}, rows_rng);           // tiny: 2 heads of 64
  test_xsa({513, 12, 1536, true}, rows_rng);        // 12 heads of 128
  test_head_gates({4 * 64 + 1, 6, 768, true}, rows_rng);  // d12: 6 heads of 128
  test_head_gates({3999, 6, 768, true}, rows_rng);
  test_head_gates({37, 2, 128, true}, rows_rng);          // tiny: 2 heads of 64
  test_head_gates({7, 1, 136, true}, rows_rng);           // one head of 17 pieces
  test_head_gates({1001, 12, 768, true}, rows_rng);       // 12 heads of 64
  test_bad_shapes();
}

}  // namespace speedrun_steps_tests
