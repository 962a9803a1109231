// Tests global_norm_squared against cpu::global_norm and adamw_update against cpu::adamw_update
// (with the clipping factor applied to the CPU's gradients first), one tensor per launch and
// several tensors of a shard in one launch: sizes from a few elements
// to more than the norm's fixed grid covers in one pass, with and without FP32 master weights,
// with and without weight decay, from random non-zero moments at step 3. Each runs twice with
// the same seed for identical bits; in BF16 builds another seed must change some roundings and
// the stochastic rounding of the parameters must be unbiased. A slice with BF16 state (the
// speedrun's embeddings): every value BF16, rounded to nearest. An update that puts the new state
// in other arrays (the step after a checkpoint) gives in place's bits and leaves the old state.
// The FP8 head's weight: each BF16 copy casts to its master weight's E4M3 byte. The cautious
// decay (record #89's): against the CPU, and bit for bit against its formula from the GPU's new
// moments, on weights and steps of both signs and zeros of each, where u = 0 leaves the weight
// as it was (the strict mask).
// The shard's moments are compact arrays of the AdamW tensors' parts (state_layout, with a tensor
// of Muon's between them), and state_file_copies and state_file_zero_gaps give the state files'
// flat layout.
#include "dev/cuda/kernel_test.h"

namespace optimizer_tests {

// offset: x starts that many elements into its allocation (a shard's gradients need not start on
// a 16-byte boundary).
void test_global_norm(size_t n, size_t offset, llmc::Rng& rng) {
  printf("\nglobal_norm_squared n=%zu offset=%zu\n", n, offset);
  const std::vector<float> x = random_stored(rng, n + offset, 0.0f, 0.1f);
  DeviceArray<floatX> d_x(x);
  DeviceArray<float> out(1), partials(kNormBlocks);
  auto run = [&] {
    out.poison();
    global_norm_squared(out, partials, (floatX*)d_x + offset, n, 0);
  };
  run();
  // Compared as norms: the CPU sums the squares in double and returns the square root.
  check_close("norm", {std::sqrt(out.download()[0])}, {cpu::global_norm(x.data() + offset, n)},
              kTolFP32);
  const Snapshot bits(out);
  run();
  check_same_bits("twice", bits, Snapshot(out));
}

// runs_norm_squared over runs of one buffer (-od 1's norm: the runs a process counts), some at
// odd offsets, one crossing the grid's pass: against the CPU over the runs; one run the whole
// buffer gives global_norm_squared's bits.
void test_runs_norm(llmc::Rng& rng) {
  printf("\nruns_norm_squared\n");
  const size_t n = 2000003;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 0.1f);
  const std::vector<size_t> runs = {5, 1000, 4096, 700001, 900000, 1, 1000003, 999999};
  DeviceArray<floatX> d_x(x);
  DeviceArray<size_t> d_runs(runs);
  DeviceArray<float> out(1), partials(kNormBlocks);
  auto run = [&](const size_t* pairs, int count) {
    out.poison();
    runs_norm_squared(out, partials, d_x, pairs, count, 0);
    return Snapshot(out);
  };
  const Snapshot first = run(d_runs, (int)runs.size() / 2);
  double squares = 0.0;
  for (size_t r = 0; r < runs.size(); r += 2) {
    const double norm = cpu::global_norm(x.data() + runs[r], runs[r + 1]);
    squares += norm * norm;
  }
  check_close("norm", {std::sqrt(out.download()[0])}, {(float)std::sqrt(squares)}, kTolFP32);
  check_same_bits("twice", first, run(d_runs, (int)runs.size() / 2));
  DeviceArray<size_t> whole(std::vector<size_t>{0, n});
  const Snapshot one_run = run(whole, 1);
  global_norm_squared(out, partials, d_x, n, 0);
  check_same_bits("one run, the whole buffer", one_run, Snapshot(out));
}

// A slice's rates and what the update shares.
struct AdamWCase {
  AdamWRates rates;
  AdamWParams hp;

  AdamWRates with_decay(float weight_decay) const {
    AdamWRates r = rates;
    r.weight_decay = weight_decay;
    return r;
  }
};

// GPT-2's AdamW settings at a later step, with gradient clipping in effect (grad_scale < 1).
AdamWCase test_hyperparameters(float grad_scale, int step) {
  AdamWCase t;
  t.rates = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  t.hp.grad_scale = grad_scale;
  t.hp.step = step;
  return t;
}

cpu::AdamWConfig cpu_config(const AdamWRates& r) {
  cpu::AdamWConfig config;
  config.beta1 = r.beta1;
  config.beta2 = r.beta2;
  config.eps = r.eps;
  config.weight_decay = r.weight_decay;
  return config;
}

// Moments as after a few steps: m around zero, v positive.
void random_moments(llmc::Rng& rng, std::vector<float>& m, std::vector<float>& v) {
  rng.normal(m.data(), m.size(), 0.0, 0.1);
  for (float& x : v) x = 0.01f + 0.1f * rng.uniform_float();
}

void test_adamw(size_t n, bool master, bool decay, llmc::Rng& rng) {
  printf("\nadamw n=%zu, %s master weights, %s weight decay\n", n, master ? "with" : "without",
         decay ? "with" : "without");
  const AdamWCase t = test_hyperparameters(0.5f, 3);
  const AdamWParams& hp = t.hp;
  // GPT-2-like weights, std 0.02: the update (about lr) is several BF16 ulps of a weight.
  const std::vector<float> master0 = random_stored(rng, n, 0.0f, 0.02f);
  const std::vector<float> grads = random_stored(rng, n, 0.0f, 1.0f);
  std::vector<float> m0(n), v0(n);
  random_moments(rng, m0, v0);
  // Master weights are not storage-rounded on the GPU; perturb them below BF16 resolution.
  std::vector<float> master_values = master0;
  for (float& p : master_values) p *= 1.0f + 1e-3f * (rng.uniform_float() - 0.5f);
  const std::vector<float>& start = master ? master_values : master0;

  std::vector<float> ref_params = start, ref_m = m0, ref_v = v0, scaled(n);
  for (size_t i = 0; i < n; i++) scaled[i] = grads[i] * hp.grad_scale;
  cpu::adamw_update(ref_params.data(), scaled.data(), ref_m.data(), ref_v.data(), n, t.rates.lr,
                    cpu_config(t.rates), decay, hp.step);

  DeviceArray<floatX> params(n), d_grads(grads);
  DeviceArray<float> d_master(n), m(n), v(n);
  // In place, or moved into `to` (the step after a checkpoint), from the same starting state.
  auto run = [&](uint32_t seed, const OptimizerArrays& to = OptimizerArrays()) {
    params.upload(master0);
    d_master.upload(master_values);
    m.upload(m0);
    v.upload(v0);
    AdamWSlices slices;
    slices.add(0, n, 0, 0, t.with_decay(decay ? t.rates.weight_decay : 0.0f), seed);
    OptimizerArrays from;
    from.adam_m = m;
    from.adam_v = v;
    from.master = master ? (float*)d_master : nullptr;
    adamw_update(params, d_grads, from, 0, slices, hp, 0, to);
  };
  const uint32_t seed = rng.u32();
  run(seed);
  const std::vector<float> got_params = params.download();
  check_close("m", m.download(), ref_m, kTolFP32);
  check_close("v", v.download(), ref_v, kTolFP32);
  if (master) check_close("master", d_master.download(), ref_params, kTolFP32);
  // Stochastic rounding of the FP32 result: within one ulp (kTolSum).
  check_close("params", got_params, ref_params, kTolSum);
  const Snapshot bits(params, d_master, m, v);
  run(seed);
  check_same_bits("twice", bits, Snapshot(params, d_master, m, v));
  const Snapshot in_place = master ? Snapshot(params, d_master, m, v) : Snapshot(params, m, v);
  // Moved (the step after a checkpoint): the new state in other arrays, the same bits as in place,
  // and the old state left as it was.
  {
    DeviceArray<float> to_master(n), to_m(n), to_v(n);
    to_master.poison();
    to_m.poison();
    to_v.poison();
    OptimizerArrays to;
    to.adam_m = to_m;
    to.adam_v = to_v;
    if (master) to.master = to_master;
    run(seed, to);
    check_same_bits("moved: the new state = in place's", in_place,
                    master ? Snapshot(params, to_master, to_m, to_v) : Snapshot(params, to_m, to_v));
    check_same_bits("moved: the old state as it was",
                    Snapshot(DeviceArray<float>(master_values), DeviceArray<float>(m0), DeviceArray<float>(v0)),
                    Snapshot(d_master, m, v));
  }

  if (sizeof(floatX) == sizeof(float) || n < 1000) return;
  // Rounding error in ulps, signed towards larger magnitude: unbiased rounding averages to 0
  // (std ~0.4 per element), truncation to -0.5, round-half-up to a positive value.
  double sum_ulps = 0.0;
  for (size_t i = 0; i < n; i++) {
    const float ulp = std::ldexp(1.0f, std::ilogb(ref_params[i]) - 7);
    sum_ulps += (got_params[i] - ref_params[i]) / ulp * (ref_params[i] < 0 ? -1.0 : 1.0);
  }
  const double mean_ulps = sum_ulps / n;
  testing::check_verbose(std::fabs(mean_ulps) < 0.01,
                         llmc::strformat("unbiased rounding: mean error %+.4f ulp", mean_ulps));
  run(seed + 1);
  const std::vector<float> other = params.download();
  size_t changed = 0;
  for (size_t i = 0; i < n; i++) changed += other[i] != got_params[i];
  // Two independent stochastic roundings disagree for about a third of the elements.
  testing::check_verbose(changed > n / 10,
                         llmc::strformat("another seed changes %zu of %zu roundings", changed, n));
}

float bf16_value(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// One AdamW slice of n elements with FP32 master weights, run from the same start each time: the
// parameters and master weights at `start`, the moments at m0 and v0.
struct MasterSlice {
  std::vector<float> start, m0, v0;
  DeviceArray<floatX> params, grads;
  DeviceArray<float> master, m, v;

  MasterSlice(const std::vector<float>& start, const std::vector<float>& grads, const std::vector<float>& m0,
              const std::vector<float>& v0)
      : start(start), m0(m0), v0(v0), params(start.size()), grads(grads), master(start.size()), m(start.size()),
        v(start.size()) {}
  // fp8_head_to_fp8: the FP8 head's weight factor 1 / w_s (AdamWSlices::fp8_head_to_fp8), 0: none.
  void run(const AdamWCase& t, float decay, uint32_t seed, llmc::AdamBf16 bf16, float fp8_head_to_fp8) {
    params.upload(start);
    master.upload(start);
    m.upload(m0);
    v.upload(v0);
    AdamWSlices slices;
    slices.add(0, start.size(), 0, 0, t.with_decay(decay), seed, bf16, fp8_head_to_fp8);
    OptimizerArrays from;
    from.adam_m = m;
    from.adam_v = v;
    from.master = master;
    adamw_update(params, grads, from, 0, slices, t.hp, 0);
  }
  Snapshot bits() const { return Snapshot(params, master, m, v); }
};

// A slice whose steps are BF16's (AdamWSlices::bf16): from BF16 weights and master weights, and
// moments BF16 (kAll, record #28's embeddings) or FP32 (kWeight, record #89's BF16 tensors), the new
// master and parameters hold BF16 values (each FP32 value rounds to itself), and so do m and v with
// kAll; the parameters equal the master weights, each within one BF16 ulp of the CPU's FP32 step
// rounded to nearest, and so are m and v with kAll (with kWeight within the FP32 step's tolerance,
// and one of them at least not a BF16 value); another seed changes nothing (rounded to nearest, not
// stochastically); twice, the same bits.
void test_adamw_bf16(size_t n, llmc::AdamBf16 kind, llmc::Rng& rng) {
  const bool all = kind == llmc::AdamBf16::kAll;
  printf("\nadamw n=%zu, the %s rounded to nearest BF16\n", n, all ? "moments and weights" : "weights alone");
  const AdamWCase t = test_hyperparameters(0.5f, 3);
  const AdamWParams& hp = t.hp;
  std::vector<float> start = random_stored(rng, n, 0.0f, 1.0f), m0(n), v0(n);
  random_moments(rng, m0, v0);
  for (std::vector<float>* x : {&start, &m0, &v0}) {
    if (x == &start || all) {
      for (float& e : *x) e = bf16_value(e);
    }
  }
  const std::vector<float> grads = random_stored(rng, n, 0.0f, 1.0f);
  std::vector<float> ref_params = start, ref_m = m0, ref_v = v0, scaled(n);
  for (size_t i = 0; i < n; i++) scaled[i] = grads[i] * hp.grad_scale;
  cpu::adamw_update(ref_params.data(), scaled.data(), ref_m.data(), ref_v.data(), n, t.rates.lr, cpu_config(t.rates),
                    true, hp.step);
  for (std::vector<float>* x : {&ref_params, &ref_m, &ref_v}) {
    if (x == &ref_params || all) {
      for (float& e : *x) e = bf16_value(e);
    }
  }
  MasterSlice slice(start, grads, m0, v0);
  auto run = [&](uint32_t seed) { slice.run(t, t.rates.weight_decay, seed, kind, 0.0f); };
  const uint32_t seed = rng.u32();
  run(seed);
  const std::vector<float> got_m = slice.m.download(), got_v = slice.v.download();
  const std::vector<float> got_master = slice.master.download(), got_params = slice.params.download();
  auto bf16_values = [](const std::vector<const std::vector<float>*>& arrays) {
    bool all_bf16 = true;
    for (const std::vector<float>* x : arrays) {
      for (float e : *x) all_bf16 = all_bf16 && bf16_value(e) == e;
    }
    return all_bf16;
  };
  testing::check_verbose(bf16_values({&got_master, &got_params}), "master and parameters hold BF16 values");
  testing::check_verbose(bf16_values({&got_m, &got_v}) == all,
                         all ? "m and v hold BF16 values" : "m and v are FP32's (not all BF16 values)");
  check_close("parameters = master weights", got_params, got_master, 0.0f);
  const float ulp = std::ldexp(1.0f, -7);  // one BF16 ulp, relative
  check_close("m", got_m, ref_m, all ? ulp : kTolFP32);
  check_close("v", got_v, ref_v, all ? ulp : kTolFP32);
  check_close("master", got_master, ref_params, ulp);
  const Snapshot bits = slice.bits();
  run(seed);
  check_same_bits("twice", bits, slice.bits());
  run(seed + 1);
  check_same_bits("another seed: the same bits (no stochastic rounding)", bits, slice.bits());
}

// The weight after AdamW's cautious decay on the CPU, in adamw_cautious_decay's order, each
// operation an FP32 rounding (no fused multiply-add on the host).
float cpu_cautious_decay(float old, float u, float rate) {
  const float mask = u * old > 0.0f ? 1.0f : 0.0f;
  return old - (u + rate * old * mask);
}

// AdamW's step u = lr mhat / (sqrt(vhat) + eps) from the new moments, as the kernel computes it:
// no product is added to another, so no fused multiply-add moves its bits.
float cpu_adamw_direction(float m, float v, const AdamWRates& r, float beta1_correction, float beta2_correction) {
  return r.lr * ((m / beta1_correction) / (sqrtf(v / beta2_correction) + r.eps));
}

// A slice with the cautious decay: weights of both signs with every 7th zero, steps of both signs
// (each gradient of its moment's sign) with every 5th zero (m and g zero), a rate and decay at which lr^2 wd p is many FP32 ulps of p.
// The moments and master weights against the CPU's whole step (kTolFP32); the master weights
// bit for bit against the cautious formula from the GPU's new moments, which checks each mask (a
// weight the step moves away from zero, and one whose step is zero, keeps its value past u); the
// parameters within one ulp; each case (u p > 0, u p < 0, u = 0 with p != 0, p = 0) present;
// twice, the same bits.
void test_adamw_cautious(size_t n, llmc::Rng& rng) {
  printf("\nadamw n=%zu, the cautious weight decay\n", n);
  AdamWCase t = test_hyperparameters(0.5f, 3);
  t.rates.lr = 1e-2f;
  t.rates.weight_decay = 2.0f;
  t.rates.decay = llmc::WeightDecayKind::kCautious;
  const AdamWRates& r = t.rates;
  const AdamWParams& hp = t.hp;
  std::vector<float> start = random_stored(rng, n, 0.0f, 0.02f), grads = random_stored(rng, n, 0.0f, 1.0f), m0(n),
                     v0(n);
  random_moments(rng, m0, v0);
  // Each gradient of its first moment's sign: the new moment cancels nowhere, so the GPU's fused
  // roundings of it and the CPU's give the step one sign, and the CPU's masks are the GPU's.
  for (size_t i = 0; i < n; i++) grads[i] = std::copysign(grads[i], m0[i]);
  for (size_t i = 0; i < n; i += 7) start[i] = 0.0f;
  for (size_t i = 3; i < n; i += 5) m0[i] = grads[i] = 0.0f;
  const float beta1_correction = 1.0f - powf(r.beta1, (float)hp.step);
  const float beta2_correction = 1.0f - powf(r.beta2, (float)hp.step);
  const float rate = (float)((double)r.lr * r.lr * r.weight_decay);
  std::vector<float> ref_m = m0, ref_v = v0, ref_master = start;
  size_t cases[4] = {};  // u p > 0, u p < 0, u = 0 with p != 0, p = 0
  for (size_t i = 0; i < n; i++) {
    const float g = grads[i] * hp.grad_scale;
    ref_m[i] = r.beta1 * ref_m[i] + (1.0f - r.beta1) * g;
    ref_v[i] = r.beta2 * ref_v[i] + (1.0f - r.beta2) * g * g;
    const float u = cpu_adamw_direction(ref_m[i], ref_v[i], r, beta1_correction, beta2_correction);
    cases[start[i] == 0.0f ? 3 : u == 0.0f ? 2 : u * start[i] > 0.0f ? 0 : 1]++;
    ref_master[i] = cpu_cautious_decay(start[i], u, rate);
  }
  MasterSlice slice(start, grads, m0, v0);
  auto run = [&] {
    slice.params.upload(start);
    slice.master.upload(start);
    slice.m.upload(m0);
    slice.v.upload(v0);
    AdamWSlices slices;
    slices.add(0, n, 0, 0, r, 1234u);
    OptimizerArrays from;
    from.adam_m = slice.m;
    from.adam_v = slice.v;
    from.master = slice.master;
    adamw_update(slice.params, slice.grads, from, 0, slices, hp, 0);
  };
  run();
  const std::vector<float> got_m = slice.m.download(), got_v = slice.v.download();
  const std::vector<float> got_master = slice.master.download();
  check_close("m", got_m, ref_m, kTolFP32);
  check_close("v", got_v, ref_v, kTolFP32);
  check_close("master", got_master, ref_master, kTolFP32);
  std::vector<float> from_moments(n);
  for (size_t i = 0; i < n; i++) {
    const float u = cpu_adamw_direction(got_m[i], got_v[i], r, beta1_correction, beta2_correction);
    from_moments[i] = cpu_cautious_decay(start[i], u, rate);
  }
  check_close("master = the formula from the GPU's moments", got_master, from_moments, 0.0f);
  check_close("params", slice.params.download(), ref_master, kTolSum);
  testing::check_verbose(cases[0] > 0 && cases[1] > 0 && cases[2] > 0 && cases[3] > 0,
                         llmc::strformat("u p > 0 (decayed): %zu, u p < 0: %zu, u = 0 with p != 0: %zu, p = 0: %zu",
                                         cases[0], cases[1], cases[2], cases[3]));
  const Snapshot bits = slice.bits();
  run();
  check_same_bits("twice", bits, slice.bits());
}

// E4M3's byte for x / w_s, the FP8 head's weight cast (fp8_fixed_weight_cast) with its factor
// to_fp8 = 1 / w_s, on the host.
__nv_fp8_storage_t head_weight_byte(float x, float to_fp8) {
  return __nv_cvt_float_to_fp8(x * to_fp8, __NV_SATFINITE, __NV_E4M3);
}

// The FP8 head's weight (AdamWSlices::fp8_head_to_fp8; fp8_head_weight_copy) under the scales
// given: each BF16 copy casts to the E4M3 byte its master weight casts to, and is within one BF16
// ulp of it; the same step as a slice without the factor except where that slice's copy casts
// otherwise (some must, or nothing was tested), and there one ulp from it. Head-like weights (std
// 0.02: E4M3 steps of 2^-9 near 0.02 at w_s = 2^-9, of 1/560 at record #89's 1.6/448, whose
// midpoints are not BF16 numbers). The vector path (n a multiple of 8) and the element one (n = 7);
// twice, the same bits. Then gpt2_init's host copy of FP32 values: rounded to nearest and moved alike.
void test_adamw_fp8_head(size_t n, const llmc::Fp8HeadScales& scales, llmc::Rng& rng) {
  const float to_fp8 = fp8_head_weight_factor(scales);
  printf("\nadamw n=%zu, the FP8 head's weight at w_s = %s/448: BF16 copies that cast as the master weights do\n", n,
         llmc::strformat("%g", scales.weight).c_str());
  const AdamWCase t = test_hyperparameters(0.01f, 3);
  const std::vector<float> master0 = random_stored(rng, n, 0.0f, 0.02f), grads = random_stored(rng, n, 0.0f, 1.0f);
  std::vector<float> m0(n), v0(n);
  random_moments(rng, m0, v0);
  MasterSlice slice(master0, grads, m0, v0);
  const uint32_t seed = rng.u32();
  slice.run(t, 0.0f, seed, llmc::AdamBf16::kNone, 0.0f);
  const std::vector<float> plain = slice.params.download();
  slice.run(t, 0.0f, seed, llmc::AdamBf16::kNone, to_fp8);
  const std::vector<float> got = slice.params.download(), updated = slice.master.download();
  size_t mismatched = 0, moved = 0, far = 0, plain_mismatched = 0;
  for (size_t i = 0; i < n; i++) {
    const float ulp = std::ldexp(1.0f, std::ilogb(updated[i]) - 7);
    mismatched += head_weight_byte(got[i], to_fp8) != head_weight_byte(updated[i], to_fp8);
    plain_mismatched += head_weight_byte(plain[i], to_fp8) != head_weight_byte(updated[i], to_fp8);
    far += std::fabs(got[i] - updated[i]) > ulp;
    if (got[i] != plain[i]) moved += head_weight_byte(plain[i], to_fp8) == head_weight_byte(updated[i], to_fp8) ||
                                     std::fabs(got[i] - plain[i]) > ulp;  // counts wrong moves
  }
  testing::check_verbose(mismatched == 0 && far == 0,
                         llmc::strformat("every copy casts as its master (%zu do not) within one ulp (%zu are not)",
                                         mismatched, far));
  testing::check_verbose(moved == 0 && (n < 1000 || plain_mismatched > 0),
                         llmc::strformat("only the %zu copies a plain slice casts otherwise move, one ulp (%zu others)",
                                         plain_mismatched, moved));
  const Snapshot bits = slice.bits();
  slice.run(t, 0.0f, seed, llmc::AdamBf16::kNone, to_fp8);
  check_same_bits("twice", bits, slice.bits());
  if (n < 1000) return;
  std::vector<floatX> host(n);
  float_to_floatX(host.data(), updated.data(), n);  // FP32 values, as a checkpoint's
  size_t init_mismatched = 0, init_moved = 0;
  for (size_t i = 0; i < n; i++) {
    const floatX copy = fp8_head_weight_copy(host[i], updated[i], to_fp8);
    init_mismatched += head_weight_byte((float)copy, to_fp8) != head_weight_byte(updated[i], to_fp8);
    init_moved += (float)copy != (float)host[i];
  }
  testing::check_verbose(init_mismatched == 0 && init_moved > 0,
                         llmc::strformat("the host's copies of FP32 values cast as they do (%zu do not; %zu moved)",
                                         init_mismatched, init_moved));
}

// The moments of `flat` (one value per shard element) at the AdamW parts' places of the compact
// arrays, and back.
std::vector<float> compact_moments(const StateLayout& l, const std::vector<float>& flat) {
  std::vector<float> compact(l.adamw_size, 0.0f);
  for (int i = 0; i < l.count; i++) {
    if (l.owner[i] != StateOwner::kAdamW) continue;
    const size_t at = l.begin[i] - l.shard_offset;
    std::copy(flat.begin() + at, flat.begin() + at + l.size[i], compact.begin() + l.state[i]);
  }
  return compact;
}

std::vector<float> flat_moments(const StateLayout& l, const std::vector<float>& compact, std::vector<float> flat) {
  for (int i = 0; i < l.count; i++) {
    if (l.owner[i] != StateOwner::kAdamW) continue;
    const size_t at = l.begin[i] - l.shard_offset;
    std::copy(compact.begin() + l.state[i], compact.begin() + l.state[i] + l.size[i], flat.begin() + at);
  }
  return flat;
}

// A ZeRO-like shard of five tensors, starting and ending mid-tensor, the middle one Muon's: every
// part keeps its residue modulo kStateAlign, the parts do not overlap and fit their arrays.
struct ShardCase {
  std::vector<size_t> sizes = {1000003, 4096, 77, 5, 300001};
  std::vector<bool> decayed = {true, false, true, false, true};
  std::vector<size_t> offsets;
  size_t total = 0, shard_offset = 640, shard_end = 0;
  StateLayout layout;

  ShardCase() {
    for (size_t n : sizes) offsets.push_back(total), total += n;
    shard_end = total - 1000;
    const bool muon[] = {false, false, true, false, false};
    layout = state_layout((int)sizes.size(), offsets.data(), sizes.data(), muon, shard_offset, shard_end - shard_offset);
  }
  size_t shard() const { return shard_end - shard_offset; }
};

void check_layout(const ShardCase& c) {
  const StateLayout& l = c.layout;
  bool residues = true, inside = true;
  size_t adamw_end = 0, muon_end = 0;
  for (int i = 0; i < l.count; i++) {
    const size_t begin = std::max(c.offsets[i], c.shard_offset);
    inside = inside && l.begin[i] == begin && l.size[i] == std::min(c.offsets[i] + c.sizes[i], c.shard_end) - begin;
    residues = residues && l.state[i] % kStateAlign == (begin - c.shard_offset) % kStateAlign;
    size_t& end = l.owner[i] == StateOwner::kMuon ? muon_end : adamw_end;
    inside = inside && l.state[i] >= end;  // after the previous part of its array
    end = l.state[i] + l.size[i];
  }
  testing::check_verbose(inside && adamw_end == l.adamw_size && muon_end == l.muon_size &&
                             l.owner[2] == StateOwner::kMuon && l.size[2] == c.sizes[2],
                         llmc::strformat("state_layout: the parts in order, disjoint, AdamW's %zu and Muon's %zu "
                                         "elements", l.adamw_size, l.muon_size));
  testing::check_verbose(residues, "state_layout: each part keeps its residue modulo kStateAlign");
}

// One launch over the AdamW tensors of the shard (odd sizes and alignments, each with its own
// rate, betas, eps, decay and seed, as a table's roles) against the CPU per tensor, and bit for bit
// against one launch per slice; the Muon tensor's parameters and master weights are not touched.
void test_adamw_slices(llmc::Rng& rng) {
  const ShardCase c;
  const StateLayout& l = c.layout;
  printf("\nadamw over %zu tensors, shard [%zu, %zu) of %zu\n", c.sizes.size(), c.shard_offset, c.shard_end, c.total);
  check_layout(c);
  const AdamWCase t = test_hyperparameters(0.7f, 5);
  const AdamWParams& hp = t.hp;
  const size_t shard = c.shard();
  const std::vector<float> params0 = random_stored(rng, c.total, 0.0f, 0.02f);
  const std::vector<float> grads = random_stored(rng, c.total, 0.0f, 1.0f);
  std::vector<float> m0(shard), v0(shard), master0(params0.begin() + c.shard_offset, params0.begin() + c.shard_end);
  random_moments(rng, m0, v0);
  AdamWSlices slices;
  std::vector<float> ref_master = master0, ref_m = m0, ref_v = v0;
  for (int i = 0; i < l.count; i++) {
    if (l.owner[i] != StateOwner::kAdamW) continue;
    AdamWRates rates = t.with_decay(c.decayed[i] ? t.rates.weight_decay : 0.0f);
    rates.lr *= 1.0f + 0.5f * (float)i;
    if (i % 2 == 1) {  // the speedrun's betas and eps beside GPT-2's
      rates.beta1 = 0.8f;
      rates.eps = 1e-10f;
    }
    if (i == 3) rates.beta2 = 0.99f;
    slices.add(l.begin[i], l.size[i], l.begin[i] - c.offsets[i], l.state[i], rates, rng.u32());
    const size_t st = l.begin[i] - c.shard_offset, n = l.size[i];
    std::vector<float> scaled(grads.begin() + l.begin[i], grads.begin() + l.begin[i] + n);
    for (float& g : scaled) g *= hp.grad_scale;
    cpu::adamw_update(ref_master.data() + st, scaled.data(), ref_m.data() + st, ref_v.data() + st, n,
                      rates.lr, cpu_config(rates), c.decayed[i], hp.step);
  }
  DeviceArray<floatX> params(c.total), d_grads(grads);
  DeviceArray<float> master(shard), m(l.adamw_size), v(l.adamw_size);
  OptimizerArrays state;
  state.adam_m = m;
  state.adam_v = v;
  state.master = master;
  auto start = [&] {
    params.upload(params0);
    master.upload(master0);
    m.upload(compact_moments(l, m0));
    v.upload(compact_moments(l, v0));
  };
  auto run = [&](bool one_launch) {
    start();
    if (one_launch) {
      adamw_update(params, d_grads, state, c.shard_offset, slices, hp, 0);
      return;
    }
    for (int i = 0; i < slices.count; i++) {
      AdamWSlices one;
      one.add(slices.begin[i], slices.size[i], slices.index_offset[i], slices.state[i], slices.rates[i],
              slices.seed[i]);
      adamw_update(params, d_grads, state, c.shard_offset, one, hp, 0);
    }
  };
  run(true);
  check_close("m", flat_moments(l, m.download(), m0), ref_m, kTolFP32);
  check_close("v", flat_moments(l, v.download(), v0), ref_v, kTolFP32);
  check_close("master (Muon's part as it was)", master.download(), ref_master, kTolFP32);
  const std::vector<float> got = params.download();
  std::vector<float> expected(params0.begin() + c.shard_offset, params0.begin() + c.shard_end);
  for (size_t k = 0; k < shard; k++) {
    const size_t p = c.shard_offset + k;
    if (p < c.offsets[2] || p >= c.offsets[3]) expected[k] = ref_master[k];
  }
  check_close("params in the shard (Muon's as they were)",
              std::vector<float>(got.begin() + c.shard_offset, got.begin() + c.shard_end), expected, kTolSum);
  check_close("params outside the shard untouched",
              std::vector<float>(got.begin(), got.begin() + c.shard_offset),
              std::vector<float>(params0.begin(), params0.begin() + c.shard_offset), 0.0f);
  const Snapshot bits(params, master, m, v);
  run(false);
  check_same_bits("one launch = one launch per tensor", bits, Snapshot(params, master, m, v));
  // Moved into other arrays (the step after a checkpoint): in place's bits.
  DeviceArray<float> to_master(shard), to_m(l.adamw_size), to_v(l.adamw_size);
  to_master.upload(master0);  // Muon's part is copied by gpt2_muon_copy_state
  to_m.upload(std::vector<float>(l.adamw_size, 0.0f));
  to_v.upload(std::vector<float>(l.adamw_size, 0.0f));
  start();
  OptimizerArrays to;
  to.adam_m = to_m;
  to.adam_v = to_v;
  to.master = to_master;
  adamw_update(params, d_grads, state, c.shard_offset, slices, hp, 0, to);
  check_same_bits("moved over the slices = in place", bits, Snapshot(params, to_master, to_m, to_v));
}

// The state files' layout from the compact arrays: m holds AdamW's first moments and Muon's
// momentum, v AdamW's second moments and zeros for Muon's tensor and the shard's tail past the
// tensors, master the master weights.
void test_state_file_layout(llmc::Rng& rng) {
  ShardCase c;
  c.shard_end = c.total + 3000;  // a last ZeRO shard: its tail holds no tensor
  const bool muon[] = {false, false, true, false, false};
  c.layout = state_layout((int)c.sizes.size(), c.offsets.data(), c.sizes.data(), muon, c.shard_offset, c.shard());
  const StateLayout& l = c.layout;
  const size_t n = c.shard();
  printf("\nstate file layout: shard [%zu, %zu), %zu past the tensors\n", c.shard_offset, c.shard_end,
         c.shard_end - c.total);
  std::vector<float> m0(l.adamw_size), v0(l.adamw_size), momentum0(l.muon_size), master0(n);
  for (std::vector<float>* x : {&m0, &v0, &momentum0, &master0}) rng.normal(x->data(), x->size(), 0.0, 1.0);
  DeviceArray<float> m(m0), v(v0), momentum(momentum0), master(master0);
  const OptimizerArrays arrays = {m, v, momentum, master};
  std::vector<float> file(3 * n);
  rng.normal(file.data(), file.size(), 0.0, 1.0);  // what a loaded file left in the buffer
  state_file_zero_gaps(l, file.data());
  for (const StateCopy& copy : state_file_copies(l, arrays)) {
    cudaCheck(cudaMemcpy(file.data() + copy.array * n + copy.at, copy.device, copy.count * sizeof(float),
                         cudaMemcpyDeviceToHost));
  }
  std::vector<float> expected(3 * n, 0.0f);
  for (int i = 0; i < l.count; i++) {
    const size_t at = l.begin[i] - c.shard_offset;
    for (size_t k = 0; k < l.size[i]; k++) {
      if (l.owner[i] == StateOwner::kMuon) {
        expected[at + k] = momentum0[l.state[i] + k];
      } else {
        expected[at + k] = m0[l.state[i] + k];
        expected[n + at + k] = v0[l.state[i] + k];
      }
    }
  }
  std::copy(master0.begin(), master0.end(), expected.begin() + 2 * n);
  check_close("the file's m, v and master", file, expected, 0.0f);
}

void run() {
  llmc::Rng rng(9);
  test_global_norm(7, 0, rng);                // fewer elements than one block's threads
  test_global_norm(100003, 0, rng);           // less than the grid's one pass
  test_global_norm(12345679, 0, rng);         // ~24 elements per thread, and a tail
  test_global_norm(100003, 3, rng);           // not 16-byte aligned: one element at a time
  test_runs_norm(rng);
  test_adamw(1000003, true, true, rng);       // the BF16 trainer's path
  test_adamw(1000003, false, false, rng);     // FP32 trainer (and BF16 with -w 0), no decay
  test_adamw(5, true, false, rng);            // a partial block only
  test_adamw_bf16(1000003, llmc::AdamBf16::kAll, rng);     // record #28's embeddings
  test_adamw_bf16(7, llmc::AdamBf16::kAll, rng);
  test_adamw_bf16(1000003, llmc::AdamBf16::kWeight, rng);  // record #89's BF16 tensors
  test_adamw_bf16(7, llmc::AdamBf16::kWeight, rng);
  test_adamw_cautious(1000003, rng);          // the vector path and a tail
  test_adamw_cautious(29, rng);               // a partial block only
  if (sizeof(floatX) == 2) {                  // BF16 copies of FP32 masters
    const llmc::Fp8HeadScales record28, record89 = {100.0, 1.6, 0.75};
    for (const llmc::Fp8HeadScales& scales : {record28, record89}) {
      test_adamw_fp8_head(1000003 - 3, scales, rng);
      test_adamw_fp8_head(7, scales, rng);
    }
  }
  test_adamw_slices(rng);
  test_state_file_layout(rng);
}

}  // namespace optimizer_tests
