// Tests record #89's FP8 MLP (-fm 1, section 5) against a CPU reference of its reference's roundings.
// The weights' casts (fp8_mlp_cast_weights) over three layers, once under the bootstrap (W2 under
// its own scale; a zero W2, the recipe's init, among them) and once under given delayed scales (one
// small enough to saturate): s1, s2, the next delayed scale and W1's codes bitwise; W2's codes
// within Triton's division (div.full.f32, which the PTX manual bounds at 2 ulps of the rounded
// quotient: a code either side of an E4M3 rounding midpoint that close is accepted, and the count
// of such codes printed). A training forward of a layer (fp8_mlp_forward), twice, the second under
// the activation scale the first set (fp8_mlp_end_forward): x's cast within the division's ulps,
// the up product's scale d bitwise, the up product against the CPU's double product of the GPU's
// FP8 codes, ReLU^2's output bitwise from the GPU's product, its cast within the division's ulps,
// its amax and the next activation scale bitwise, the down product against the CPU's double
// product; every forward run twice for the same bits. Shapes: C = 64 with N = 333 (rows not a
// multiple of anything), and d12's C = 768 with N = 1000. BF16 builds only, as -fm 1.
#include "dev/cuda/kernel_test.h"

namespace fp8_mlp_tests {

#if !defined(ENABLE_FP32)
using fp8_tests::as_float;
using fp8_tests::check_bytes;
using fp8_tests::fp8_product_reference;
using fp8_tests::fp8_reference;

// x moved by k FP32 ulps (k may be negative).
float ulps_away(float x, int k) {
  for (int i = 0; i < std::abs(k); i++) x = std::nextafter(x, k > 0 ? INFINITY : -INFINITY);
  return x;
}

// Codes whose reference depends on a quotient q by div.full.f32: got must be the code of f(q')
// for q' the rounded quotient q moved by at most 2 ulps (f monotone, so the two ends bound it).
// Counts the codes where the ends differ (a midpoint within the division's error) in *slack.
bool division_code_ok(uint8_t got, float q, const std::function<float(float)>& f, size_t* slack) {
  const uint8_t lo = fp8_reference(f(ulps_away(q, -2)), Fp8Format::kE4M3);
  const uint8_t hi = fp8_reference(f(ulps_away(q, 2)), Fp8Format::kE4M3);
  if (lo != hi) (*slack)++;
  return got == lo || got == hi || got == fp8_reference(f(q), Fp8Format::kE4M3);
}

// Checks codes against per-element division references (see division_code_ok).
bool check_division_codes(const std::string& name, const std::vector<uint8_t>& got,
                          const std::function<bool(size_t, size_t*)>& ok) {
  size_t differ = 0, first = 0, slack = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!ok(i, &slack) && differ++ == 0) first = i;
  }
  if (differ == 0) {
    printf("ok   %-40s n=%-9zu the reference's codes (%zu within the division's 2 ulps of a midpoint)\n",
           name.c_str(), got.size(), slack);
  } else {
    printf("FAIL %-40s n=%-9zu %zu differ, the first [%zu] got %02x\n", name.c_str(), got.size(), differ, first,
           got[first]);
  }
  return testing::check(differ == 0, name);
}

float max_abs(const std::vector<float>& x) {
  float m = 0.0f;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

// The reference's weight scale: bf16(bf16(max(amax, 1e-12)) * fp32(1 / 448)), written out here.
float weight_scale_reference(float amax) {
  const float clamped = (float)(floatX)std::max(amax, 1e-12f);
  const float reciprocal = 1.0f / 448.0f;
  return (float)(floatX)(clamped * reciprocal);
}

// One layer's weights and scales for a test: C channels; W1 [4C, C], W2 [C, 4C].
struct MlpWeights {
  std::vector<std::vector<float>> w1, w2;
};

// The device state of an FP8 MLP of `layers` layers for N rows, its buffers owned here.
struct TestMlp {
  TestMlp(int layers, int N, int C)
      : w1((size_t)layers * 4 * C * C), w2((size_t)layers * 4 * C * C), scales(layers), unit(1),
        pre((size_t)N * 4 * C), x8((size_t)N * C), post8((size_t)N * 4 * C) {
    unit.upload(std::vector<Fp8Scale>{{1.0f, 0u, 1.0f, 0}});
    f = {w1, w2, scales, unit, pre, x8, post8};
  }
  DeviceArray<uint8_t> w1, w2;
  DeviceArray<Fp8MlpScales> scales;
  DeviceArray<Fp8Scale> unit;
  DeviceArray<floatX> pre;
  DeviceArray<uint8_t> x8, post8;
  Fp8Mlp f;
};

// fp8_mlp_cast_weights over the layers of `weights` (C channels) from the scales `given` (their
// w2.scale the delayed one), bootstrap or not, checked against the reference.
void test_weight_casts(const std::string& name, const MlpWeights& weights, int C, bool bootstrap,
                       const std::vector<Fp8MlpScales>& given) {
  const int L = (int)weights.w1.size();
  const size_t n = (size_t)4 * C * C;
  printf("\nFP8 MLP weight casts, %s: %d layers, C=%d, %s\n", name.c_str(), L, C,
         bootstrap ? "bootstrap (W2 under its own scale)" : "delayed W2 scales");
  TestMlp t(L, 1, C);
  std::vector<std::unique_ptr<DeviceArray<floatX>>> w1, w2;
  std::vector<const floatX*> w1_ptrs, w2_ptrs;
  for (int l = 0; l < L; l++) {
    w1.push_back(std::make_unique<DeviceArray<floatX>>(weights.w1[l]));
    w2.push_back(std::make_unique<DeviceArray<floatX>>(weights.w2[l]));
    w1_ptrs.push_back(*w1.back());
    w2_ptrs.push_back(*w2.back());
  }
  auto cast = [&] {
    t.scales.upload(given);
    t.w1.poison();
    t.w2.poison();
    fp8_mlp_cast_weights(t.f, w1_ptrs, w2_ptrs, C, bootstrap, 0);
    return Snapshot(t.w1, t.w2, t.scales);
  };
  const Snapshot first = cast();
  const std::vector<Fp8MlpScales> got = t.scales.raw();
  const std::vector<uint8_t> w1_codes = t.w1.raw(), w2_codes = t.w2.raw();
  for (int l = 0; l < L; l++) {
    const std::string layer = "layer " + std::to_string(l);
    const float s1 = weight_scale_reference(max_abs(weights.w1[l]));
    const float w2_amax = max_abs(weights.w2[l]);
    const float s2 = bootstrap ? weight_scale_reference(w2_amax) : given[l].w2.scale;
    const float next = std::max(w2_amax, 1e-12f) * (float)(1.12 / 448.0);
    testing::check_verbose(got[l].w1.inv_scale == s1, layer + ": s1 = bf16(bf16(amax W1) / 448)");
    testing::check_verbose(got[l].w2.inv_scale == s2, layer + (bootstrap ? ": s2 = bf16(bf16(amax W2) / 448)"
                                                                          : ": s2 = the delayed scale given"));
    testing::check_verbose(got[l].w2.scale == next, layer + ": the next s2 = amax W2 * 1.12 / 448");
    std::vector<uint8_t> ref_w1(n);
    for (size_t i = 0; i < n; i++) ref_w1[i] = fp8_reference((float)(floatX)(weights.w1[l][i] / s1), Fp8Format::kE4M3);
    check_bytes(layer + ": W1 codes", std::vector<uint8_t>(w1_codes.begin() + l * n, w1_codes.begin() + (l + 1) * n),
                ref_w1);
    const auto clamp448 = [](float q) { return std::min(std::max(q, -448.0f), 448.0f); };
    check_division_codes(layer + ": W2 codes", std::vector<uint8_t>(w2_codes.begin() + l * n,
                                                                    w2_codes.begin() + (l + 1) * n),
                         [&](size_t i, size_t* slack) {
                           return division_code_ok(w2_codes[l * n + i], weights.w2[l][i] / s2, clamp448, slack);
                         });
  }
  check_same_bits("weight casts twice", first, cast());
}

std::vector<float> random_weight(llmc::Rng& rng, size_t n, float std) { return random_stored(rng, n, 0.0f, std); }

void test_weight_cast_cases(llmc::Rng& rng, int C) {
  const size_t n = (size_t)4 * C * C;
  MlpWeights w;
  for (int l = 0; l < 3; l++) {
    w.w1.push_back(random_weight(rng, n, 0.02f));
    w.w2.push_back(l == 0 ? std::vector<float>(n, 0.0f) : random_weight(rng, n, 0.01f));
  }
  w.w1[1][5] = stored({0.75f})[0];  // an outlier sets layer 1's scale
  std::vector<Fp8MlpScales> given(3);
  for (Fp8MlpScales& s : given) s.act.inv_scale = s.w2.scale = 1.0f;
  test_weight_casts("the start", w, C, true, given);
  for (int l = 0; l < 3; l++) given[l].w2.scale = std::max(max_abs(w.w2[l]), 1e-12f) * (float)(1.12 / 448.0);
  given[2].w2.scale *= 0.25f;  // the weights grew 4.5x since the last cast: its largest saturate
  test_weight_casts("delayed", w, C, false, given);
}

// The up product's tolerance against the CPU's double product, as the head's forward in test_fp8:
// BF16 rounding and fast accumulation over C terms.
constexpr float kTolProduct = 1e-2f;

// One layer's training forward over N rows, twice in a row (the second under the activation
// scale the first set), each checked at every step and run again for the same bits.
void test_forward(llmc::Rng& rng, int N, int C) {
  printf("\nFP8 MLP training forward: N=%d C=%d\n", N, C);
  const size_t n = (size_t)4 * C * C, nx = (size_t)N * C, nh = 4 * nx;
  const std::vector<float> w1 = random_weight(rng, n, std::sqrt(3.0f) * 0.5f / std::sqrt((float)C));
  const std::vector<float> w2 = random_weight(rng, n, 0.02f);
  const std::vector<float> x = fp8_tests::rms_normed_rows(rng, N, C);
  TestMlp t(1, N, C);
  DeviceArray<floatX> d_w1(w1), d_w2(w2), d_x(x), out(nx), post(nh);
  std::vector<Fp8MlpScales> start(1);
  start[0].act.inv_scale = start[0].w2.scale = 1.0f;
  t.scales.upload(start);
  fp8_mlp_cast_weights(t.f, {(const floatX*)d_w1}, {(const floatX*)d_w2}, C, true, 0);
  const std::vector<uint8_t> w1_codes = t.w1.raw(), w2_codes = t.w2.raw();
  const float x_amax = max_abs(x);
  for (int pass = 1; pass <= 2; pass++) {
    const std::string label = "forward " + std::to_string(pass);
    const std::vector<Fp8MlpScales> before = t.scales.raw();
    auto forward = [&] {
      t.scales.upload(before);
      for (DeviceArray<floatX>* a : {&out, &post, &t.pre}) a->poison();
      t.x8.poison();
      t.post8.poison();
      fp8_mlp_forward(t.f, out, post, d_x, 0, N, C, 0);
      return Snapshot(out, post, t.pre, t.x8, t.post8, t.scales);
    };
    const Snapshot bits = forward();
    const Fp8MlpScales s = t.scales.raw()[0];
    const std::vector<uint8_t> x8 = t.x8.raw(), post8 = t.post8.raw();
    check_division_codes(label + ": x codes", x8, [&](size_t i, size_t* slack) {
      return division_code_ok(x8[i], 1.0f / x_amax, [&](float r) { return x[i] * (r * 448.0f); }, slack);
    });
    testing::check_verbose(s.input.inv_scale == (before[0].w1.inv_scale * x_amax) * (float)(1.0 / 448.0),
                           label + ": d = s1 amax_x / 448");
    const std::vector<float> pre = t.pre.download();
    check_close(label + ": up product (BF16, fast accumulation)", pre,
                as_float(fp8_product_reference(x8, Fp8Format::kE4M3, w1_codes, Fp8Format::kE4M3, N, 4 * C, C,
                                               s.input.inv_scale)),
                kTolProduct);
    std::vector<float> ref_post(nh);
    for (size_t i = 0; i < nh; i++) ref_post[i] = (float)(floatX)(std::max(pre[i], 0.0f) * std::max(pre[i], 0.0f));
    const std::vector<float> got_post = post.download();
    check_close(label + ": post = bf16(relu(pre)^2) (bitwise)", got_post, ref_post, 0.0f);
    const float a = before[0].act.inv_scale;
    check_division_codes(label + ": post codes", post8, [&](size_t i, size_t* slack) {
      return division_code_ok(post8[i], 1.0f / a, [&](float inv) { return std::min(ref_post[i] * inv, 448.0f); },
                              slack);
    });
    const float post_amax = max_abs(ref_post);
    testing::check_verbose(s.act.amax_bits == fp8_tests::abs_bits(post_amax), label + ": amax of post");
    check_close(label + ": down product (BF16, fast accumulation)", out.download(),
                as_float(fp8_product_reference(post8, Fp8Format::kE4M3, w2_codes, Fp8Format::kE4M3, N, C, 4 * C,
                                               (double)a * s.w2.inv_scale)),
                kTolProduct);
    check_same_bits(label + " twice", bits, forward());
    fp8_mlp_end_forward(t.f, 1, 0);
    const Fp8MlpScales after = t.scales.raw()[0];
    testing::check_verbose(after.act.inv_scale == std::max(post_amax, 1e-12f) * (float)(1.8 / 448.0) &&
                               after.act.amax_bits == 0,
                           label + ": the next activation scale amax * 1.8 / 448, the amax cleared");
  }
}
#endif

void run() {
#if defined(ENABLE_FP32)
  printf("skip the FP8 MLP: it needs the BF16 build (-fm 1)\n");
#else
  llmc::Rng rng(89);
  test_weight_cast_cases(rng, 64);
  test_weight_cast_cases(rng, 768);
  test_forward(rng, 333, 64);
  test_forward(rng, 1000, 768);
#endif
}

}  // namespace fp8_mlp_tests
