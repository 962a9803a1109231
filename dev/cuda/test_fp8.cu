// Tests the FP8 kernels and linear layers of section 5 (-fp8 1 and 2).
// Kernels, bitwise: fp8_amax and fp8_cast_transpose in both formats against a CPU
// reference of the same rounding (itself checked against cuda_fp8.h's host conversion on every
// BF16 value and on random floats), with the power-of-two scale checked against an independent
// search; shapes with R = 1000 tokens (not a multiple of 16: padded transposes) and C = 1600, odd
// small ones, zeros, NaN and Inf, magnitudes that clamp the scale; every kernel run twice for
// identical bits. Delayed scaling (-fp8 2): the casts with a given scale (saturating,
// underflowing and FP32-overflowing ones included) and their recorded amax, bitwise;
// fp8_update_scales against a CPU reference of the history, partly empty and full; the first
// step's amax kept over micro steps; the model's history over 22 steps with skips, restored from
// a state file's copy, and evaluation's amaxes forgotten. Layers (BF16 builds): matmul_forward_fp8 /
// matmul_backward_fp8 against the BF16 layer (matmul_forward / matmul_backward) on the same inputs,
// at GPT-2 small, d12 and d48 shapes, the GELU epilogue included, and the fc layer's GELU' or
// ReLU^2' taken into its output gradient (in place with current scaling; in the delayed
// cast-transpose: the bits of the activation's backward, then of the cast, and the bias gradient
// from the cast's column sums; the kernel alone: its casts and each tile's column sums
// bitwise against gelu_backward_inplace's values); run twice, and with cuBLASLt's first
// heuristic, for identical bits. The activations (GELU, ReLU^2) and norms (LayerNorm, RMSNorm with
// and without a gain) in the input casts, and the activations' derivatives in the output
// gradient's (delayed scaling): the kernels and the fcproj layer against the activations' and
// norms' own passes followed by the plain cast, bit for bit, and the model's wiring of them (GPT-2
// over two layers, the speedrun over its twelve). The speedrun
// head's layer with fixed scales: its casts bitwise against the CPU reference (both builds), its
// three products (BF16 builds) against the CPU's double products of the same FP8 values, at
// C = 768 and 128, OC = 50304 and 272, N = 64, 100 and 333; twice, and untuned, for the same bits.
// fp8_transpose (the head's gradient, which the classifier casts) bitwise on random bytes, R odd
// and C a multiple of 16 but not of the tile's 128 columns.
#include "dev/cuda/kernel_test.h"

namespace fp8_tests {

// ---- CPU reference of the casts ----

struct Fp8Spec {
  int bias, mantissa_bits;
  double max;
  uint8_t max_code;
};

Fp8Spec fp8_spec(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Fp8Spec{7, 3, 448.0, 0x7e} : Fp8Spec{15, 2, 57344.0, 0x7b};
}

// x to FP8, rounded to nearest with ties to even, saturating at +-fp8_max; NaN and Inf to NaN
// (0x7f), as the kernels write them. Computed in double, where every step is exact.
uint8_t fp8_reference(float x, Fp8Format f) {
  const Fp8Spec spec = fp8_spec(f);
  if (!std::isfinite(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs((double)x);
  const double min_normal = std::ldexp(1.0, 1 - spec.bias);
  int exponent = 0;  // a = m * 2^exponent, m in [1, 2)
  std::frexp(a, &exponent);
  exponent -= 1;
  const double quantum = a < min_normal ? std::ldexp(min_normal, -spec.mantissa_bits)
                                        : std::ldexp(1.0, exponent - spec.mantissa_bits);
  const double rounded = std::nearbyint(a / quantum) * quantum;  // the default mode: ties to even
  if (rounded == 0.0) return sign;
  if (rounded >= spec.max) return sign | spec.max_code;
  if (rounded < min_normal) return sign | (uint8_t)(rounded / std::ldexp(min_normal, -spec.mantissa_bits));
  std::frexp(rounded, &exponent);
  exponent -= 1;
  const int mantissa = (int)((rounded / std::ldexp(1.0, exponent) - 1.0) * (1 << spec.mantissa_bits));
  return sign | (uint8_t)((exponent + spec.bias) << spec.mantissa_bits) | (uint8_t)mantissa;
}

// The scale's exponent by search, independent of fp8_scale_exponent: the largest e <= 126 with
// amax * 2^e <= fp8_max; 0 for an amax of 0, NaN or Inf.
int scale_exponent_reference(float amax, Fp8Format f) {
  if (amax == 0.0f || !std::isfinite(amax)) return 0;
  int e = 126;
  while ((double)amax * std::ldexp(1.0, e) > fp8_spec(f).max) e--;
  return e;
}

uint32_t abs_bits(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7fffffffu;
}

float float_of_bits(uint32_t bits) {
  float x;
  memcpy(&x, &bits, sizeof(x));
  return x;
}

// The scale a delayed cast is given for s = 2^e (its amax not yet recorded).
Fp8Scale given_scale(int e, Fp8Format f) {
  return {(float)std::ldexp(1.0, -e), 0u, (float)std::ldexp(1.0, e), fp8_emax(f)};
}

// The scale current scaling would pick for the n values at x (from the GPU's amax pass), as given
// to a delayed cast; *amax_bits: their amax.
Fp8Scale current_scale_given(const floatX* x, size_t n, Fp8Format f, uint32_t* amax_bits) {
  DeviceArray<Fp8Scale> scale(1);
  fp8_amax(scale, x, n, 0);
  *amax_bits = scale.raw()[0].amax_bits;
  return given_scale(fp8_scale_exponent(float_of_bits(*amax_bits), f), f);
}

bool check_bytes(const std::string& name, const std::vector<uint8_t>& got, const std::vector<uint8_t>& ref) {
  REQUIRE(got.size() == ref.size(), "%s: %zu bytes compared with %zu", name.c_str(), got.size(), ref.size());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (got[i] != ref[i] && differ++ == 0) first = i;
  }
  if (differ == 0) {
    printf("ok   %-34s n=%-10zu bitwise equal to the CPU reference\n", name.c_str(), got.size());
  } else {
    printf("FAIL %-34s n=%-10zu %zu differ, the first [%zu] got %02x ref %02x\n", name.c_str(), got.size(),
           differ, first, got[first], ref[first]);
  }
  return testing::check(differ == 0, name);
}

// The CPU reference against cuda_fp8.h's host conversion (round to nearest even, saturating) on
// every finite BF16 value and on a million finite random bit patterns.
void test_reference_conversion(llmc::Rng& rng) {
  printf("\nCPU reference conversion against cuda_fp8.h\n");
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const __nv_fp8_interpretation_t kind = f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
    size_t compared = 0, differ = 0;
    auto compare = [&](float x) {
      if (!std::isfinite(x)) return;
      compared++;
      if (fp8_reference(x, f) != (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind) && differ++ < 5) {
        printf("     %s %.9g: reference %02x, cuda_fp8.h %02x\n", fp8_format_name(f), x, fp8_reference(x, f),
               (unsigned)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind));
      }
    };
    for (uint32_t b = 0; b < 65536; b++) compare(float_of_bits(b << 16));
    for (int i = 0; i < 1000000; i++) compare(float_of_bits(rng.u32()));
    testing::check_verbose(differ == 0, llmc::strformat("%s reference = cuda_fp8.h on %zu values (%zu differ)",
                                                        fp8_format_name(f), compared, differ));
  }
}

// ---- the kernels, bitwise ----

// The R x C values x cast with the FP32 factor s (2^e, or a fixed scale's 1/s): ref row-major,
// ref_t transposed with fp8_padded(R) columns (zeros past R), as the cast and cast-transpose
// kernels write them: NaN and Inf to NaN, and a finite value whose product with the scale
// overflows FP32 saturated as any beyond fp8_max.
void cast_reference(const std::vector<float>& x, int R, int C, float s, Fp8Format f,
                    std::vector<uint8_t>* ref, std::vector<uint8_t>* ref_t) {
  const int ld_t = fp8_padded(R);
  ref->assign((size_t)R * C, 0);
  ref_t->assign((size_t)C * ld_t, 0);
  for (int r = 0; r < R; r++) {
    for (int c = 0; c < C; c++) {
      const float v = x[(size_t)r * C + c];
      const float scaled = (float)((double)v * s);  // x * s in FP32 (exact in double): Inf past FLT_MAX
      const uint8_t saturated = (std::signbit(v) ? 0x80 : 0) | fp8_spec(f).max_code;
      const uint8_t q = !std::isfinite(v) ? 0x7f : std::isinf(scaled) ? saturated : fp8_reference(scaled, f);
      (*ref)[(size_t)r * C + c] = q;
      (*ref_t)[(size_t)c * ld_t + r] = q;
    }
  }
}

// The casts of x (stored values, R x C) in format f against the CPU reference of scale 2^e:
// fp8_cast_transpose with and without the row-major output, each twice for the same
// bits. reset() sets the scale each launch starts from (delayed: the given s; current: the amax,
// which the cast turns into its s); scale_ok(what) checks what a launch left in it.
void check_cast_kernels(const std::string& label, const std::vector<float>& x, int R, int C, Fp8Format f,
                        int e, bool delayed, DeviceArray<Fp8Scale>& scale,
                        const std::function<void()>& reset, const std::function<bool(const char*)>& scale_ok) {
  const size_t n = (size_t)R * C;
  const int ld_t = fp8_padded(R);
  DeviceArray<floatX> d_x(x);
  DeviceArray<uint8_t> out(n), out_t((size_t)C * ld_t);
  std::vector<uint8_t> ref, ref_t;
  cast_reference(x, R, C, (float)std::ldexp(1.0, e), f, &ref, &ref_t);
  auto cast_transpose = [&](bool rows) {
    reset();
    out.poison();
    out_t.poison();
    fp8_cast_transpose(rows ? (uint8_t*)out : nullptr, out_t, scale, d_x, R, C, f, delayed, 0);
    return std::make_pair(out.raw(), out_t.raw());
  };
  const auto both = cast_transpose(true);
  check_bytes(label + " cast-transpose rows", both.first, ref);
  check_bytes(label + " cast-transpose, transposed", both.second, ref_t);
  scale_ok("cast-transpose");
  check_bytes(label + " transpose alone", cast_transpose(false).second, ref_t);
  testing::check_verbose(cast_transpose(true) == both, label + " cast-transpose twice: the same bits");
}

// fp8_transpose of R x C random bytes (every code, NaN's too: it moves bytes) against the CPU's
// transpose with fp8_padded(R) columns, zeros past R; the output poisoned first; twice.
void test_transpose(llmc::Rng& rng, int R, int C) {
  const int ld_t = fp8_padded(R);
  std::vector<uint8_t> rows((size_t)R * C), ref_t((size_t)C * ld_t, 0);
  for (uint8_t& b : rows) b = (uint8_t)rng.u32();
  for (int r = 0; r < R; r++) {
    for (int c = 0; c < C; c++) ref_t[(size_t)c * ld_t + r] = rows[(size_t)r * C + c];
  }
  DeviceArray<uint8_t> d_rows(rows), out_t(ref_t.size());
  auto transpose = [&] {
    out_t.poison();
    fp8_transpose(out_t, d_rows, R, C, 0);
    return out_t.raw();
  };
  const std::vector<uint8_t> first = transpose();
  check_bytes(llmc::strformat("transpose R=%d C=%d", R, C), first, ref_t);
  testing::check_verbose(transpose() == first, llmc::strformat("transpose R=%d C=%d twice: the same bits", R, C));
}

// x: the stored values of an R x C tensor. Checks fp8_amax, then the casts with current scaling
// (the scale from that amax) in both formats.
void test_casts(const std::string& name, int R, int C, const std::vector<float>& x) {
  printf("\ncasts, %s: R=%d C=%d\n", name.c_str(), R, C);
  const size_t n = (size_t)R * C;
  DeviceArray<floatX> d_x(x);
  DeviceArray<Fp8Scale> scale(1);
  uint32_t amax_bits = 0;
  for (float v : x) amax_bits = std::max(amax_bits, abs_bits(v));
  auto amax = [&] {
    scale.poison();
    fp8_amax(scale, d_x, n, 0);
    return scale.raw()[0].amax_bits;
  };
  const uint32_t got_amax = amax();
  testing::check_verbose(got_amax == amax_bits, llmc::strformat("amax bits %08x = CPU's %08x (%g)", got_amax,
                                                                amax_bits, float_of_bits(amax_bits)));
  testing::check_verbose(amax() == got_amax, "amax twice: the same bits");
  const std::vector<Fp8Scale> measured = scale.raw();  // the amax, which each cast scales from

  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const char* fmt = fp8_format_name(f);
    const int e = scale_exponent_reference(float_of_bits(amax_bits), f);
    testing::check_verbose(fp8_scale_exponent(float_of_bits(amax_bits), f) == e,
                           llmc::strformat("%s scale 2^%d = the search's", fmt, e));
    check_cast_kernels(fmt, x, R, C, f, e, false, scale, [&] { scale.upload(measured); }, [&](const char* what) {
      const float got = scale.raw()[0].inv_scale;
      return testing::check(got == (float)std::ldexp(1.0, -e),
                            llmc::strformat("%s %s: inv_scale %g, expected 2^%d", fmt, what, got, -e));
    });
  }
}

// Delayed scaling: the casts use the scale they are given (here 2^shift times the one current
// scaling would pick, at most 2^126: shift > 0 saturates the largest values, shift < 0 underflows
// the smallest), leave 1/s as it was and record max |x| in amax_bits; each twice, for the same bits.
void test_delayed_casts(const std::string& name, int R, int C, const std::vector<float>& x, int shift) {
  printf("\ndelayed-scaling casts, %s: R=%d C=%d, scale 2^%d x current's\n", name.c_str(), R, C, shift);
  DeviceArray<Fp8Scale> scale(1);
  uint32_t amax_bits = 0;
  for (float v : x) amax_bits = std::max(amax_bits, abs_bits(v));
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const char* fmt = fp8_format_name(f);
    const int e = std::min(126, scale_exponent_reference(float_of_bits(amax_bits), f) + shift);
    const Fp8Scale given = given_scale(e, f);
    const std::string label = llmc::strformat("%s delayed", fmt);
    check_cast_kernels(label, x, R, C, f, e, true, scale, [&] { scale.upload(std::vector<Fp8Scale>{given}); },
                       [&](const char* what) {
                         const Fp8Scale got = scale.raw()[0];
                         return testing::check(got.amax_bits == amax_bits && got.inv_scale == given.inv_scale &&
                                                   got.scale == given.scale,
                                               llmc::strformat("%s %s: amax %08x (CPU %08x), s and 1/s as given",
                                                               label.c_str(), what, got.amax_bits, amax_bits));
                       });
  }
}

// fp8_update_scales against a CPU reference: a history of random amaxes, the step's amaxes
// recorded or not (a skipped update), s from the history's maximum by the independent search, the
// amax restarted at 0. The step's amax replaces the oldest entry (slot): where that entry is the
// history's largest and the new amax smaller, the scale grows, which a history that only ever
// takes maxima would miss. A non-finite amax leaves 0 in its slot. Once with slots still zero (the
// first steps of a run), once full.
void test_update_scales(llmc::Rng& rng, bool full) {
  printf("\ndelayed scaling: fp8_update_scales, %s history\n", full ? "a full" : "a partly empty");
  const int count = 37;
  const int slot = full ? 5 : kFp8History - 2;
  std::vector<uint32_t> history((size_t)kFp8History * count, 0);
  for (int k = 0; k < (full ? kFp8History : kFp8History - 3); k++) {
    for (int i = 0; i < count; i++) {
      history[(size_t)k * count + i] = abs_bits(std::ldexp((float)rng.u32() / 4294967296.0f + 0.01f, (int)(rng.u32() % 40) - 30));
    }
  }
  for (int i = 0; i < count; i += 3) history[(size_t)slot * count + i] = abs_bits(1e12f);  // the largest, replaced
  std::vector<Fp8Scale> scales(count);
  for (int i = 0; i < count; i++) {
    const float amax = std::ldexp((float)rng.u32() / 4294967296.0f + 0.01f, (int)(rng.u32() % 40) - 20);
    scales[i] = {0.5f, abs_bits(amax), 2.0f, fp8_emax(i % 2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3)};
  }
  scales[3].amax_bits = 0x7f800000u;  // Inf
  scales[4].amax_bits = 0x7fc00000u;  // NaN
  for (bool record : {true, false}) {
    DeviceArray<Fp8Scale> d_scales(scales);
    DeviceArray<uint32_t> d_history(history);
    fp8_update_scales(d_scales, d_history, count, slot, record, 0);
    const std::vector<Fp8Scale> got = d_scales.raw();
    const std::vector<uint32_t> got_history = d_history.raw();
    std::vector<uint32_t> want_history = history;
    bool ok = true;
    for (int i = 0; i < count; i++) {
      if (record) {
        want_history[(size_t)slot * count + i] = scales[i].amax_bits <= kFp8MaxFiniteBits ? scales[i].amax_bits : 0u;
      }
      uint32_t amax = 0;
      for (int k = 0; k < kFp8History; k++) amax = std::max(amax, want_history[(size_t)k * count + i]);
      const Fp8Format f = i % 2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
      const int e = scale_exponent_reference(float_of_bits(amax), f);
      ok = ok && got[i].scale == (float)std::ldexp(1.0, e) && got[i].inv_scale == (float)std::ldexp(1.0, -e) &&
           got[i].amax_bits == 0 && got[i].emax == scales[i].emax;
    }
    testing::check_verbose(ok && got_history == want_history,
                           llmc::strformat("%s: the history %s, s = 2^e of its maximum, amax restarted",
                                           record ? "recorded" : "not recorded (a skipped update)",
                                           record ? "takes the step's amaxes (0 for a non-finite one)" : "unchanged"));
  }
}

// The model's side of delayed scaling over 22 steps against a CPU model of it: the step's amaxes
// go into slot (recorded steps mod 16) of the history only when the update was applied (a
// non-finite one as 0), so the 17th recorded step replaces the first; s = 2^e from the history's
// maximum; a run is on current scaling (keeping each step's amax over its micro steps) until its
// first applied step, a skipped first step included. Then the history through a state file's
// Fp8History into a second model gives the same scales, a history of another model's size is
// refused, and evaluation's amaxes are forgotten with the scales left alone. BF16 builds.
void test_delayed_steps(llmc::Rng& rng) {
  printf("\ndelayed scaling over 22 steps: gpt2_fp8_end_step against a CPU model of the history\n");
  const llmc::GPT2Config config = llmc::make_config(2, 2, 64, 32, 96);
  auto make_model = [&](GPT2& m) {
    gpt2_init(m, config, llmc::init_params_from_seed(config, 5), StateSpec(), 5);
    gpt2_allocate(m, 2, 32, 0, 2);
  };
  GPT2 m;
  make_model(m);
  const int count = m.fp8_act_scale_count();
  auto format = [&](int i) { return i % 2 == 0 ? Fp8Format::kE4M3 : m.fp8_grad_format; };
  std::vector<uint32_t> history((size_t)kFp8History * count, 0);
  int recorded = 0;
  bool ok = m.fp8_scaling() == Fp8Scaling::kCurrentStepMax;
  std::string first_failure;
  for (int step = 0; step < 22; step++) {
    const bool applied = step != 0 && step % 7 != 3;  // the first step and steps 3, 10, 17 skipped
    std::vector<Fp8Scale> scales(count);
    cudaCheck(cudaMemcpy(scales.data(), m.fp8_act_scales, count * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
    for (int i = 0; i < count; i++) {
      scales[i].amax_bits = abs_bits(std::ldexp((float)rng.u32() / 4294967296.0f + 0.01f, (int)(rng.u32() % 30) - 15));
    }
    if (step == 12) scales[5].amax_bits = 0x7f800000u;  // an Inf on an applied step
    cudaCheck(cudaMemcpy(m.fp8_act_scales, scales.data(), count * sizeof(Fp8Scale), cudaMemcpyHostToDevice));
    gpt2_fp8_end_step(m, applied);
    if (applied) {
      for (int i = 0; i < count; i++) {
        const uint32_t a = scales[i].amax_bits;
        history[(size_t)(recorded % kFp8History) * count + i] = a <= kFp8MaxFiniteBits ? a : 0u;
      }
      recorded++;
    }
    std::vector<Fp8Scale> got(count);
    std::vector<uint32_t> got_history(history.size());
    cudaCheck(cudaMemcpy(got.data(), m.fp8_act_scales, count * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(got_history.data(), m.fp8_history, history.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    bool step_ok = got_history == history && m.fp8_recorded_steps == recorded &&
                   m.fp8_scaling() == (recorded > 0 ? Fp8Scaling::kDelayed : Fp8Scaling::kCurrentStepMax);
    for (int i = 0; i < count; i++) {
      uint32_t amax = 0;
      for (int k = 0; k < kFp8History; k++) amax = std::max(amax, history[(size_t)k * count + i]);
      const int e = scale_exponent_reference(float_of_bits(amax), format(i));
      step_ok = step_ok && got[i].scale == (float)std::ldexp(1.0, e) &&
                got[i].inv_scale == (float)std::ldexp(1.0, -e) && got[i].amax_bits == 0;
    }
    if (!step_ok && first_failure.empty()) first_failure = llmc::strformat(" (first wrong at step %d)", step);
    ok = ok && step_ok;
  }
  testing::check_verbose(ok && recorded == kFp8History + 2, "22 steps, 3 of them and the first skipped (18 recorded): the history, "
                         "the recorded steps, current scaling until the first applied step, s = 2^e of "
                         "the history's maximum" + first_failure);

  const llmc::Fp8History saved = gpt2_fp8_history(m);
  GPT2 resumed;
  make_model(resumed);
  gpt2_fp8_restore_history(resumed, saved, "state.bin");
  std::vector<Fp8Scale> a(count), b(count);
  cudaCheck(cudaMemcpy(a.data(), m.fp8_act_scales, count * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
  cudaCheck(cudaMemcpy(b.data(), resumed.fp8_act_scales, count * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
  testing::check_verbose(memcmp(a.data(), b.data(), count * sizeof(Fp8Scale)) == 0 &&
                             saved.recorded_steps == recorded && resumed.fp8_recorded_steps == recorded &&
                             gpt2_fp8_history(resumed).amax == saved.amax &&
                             resumed.fp8_scaling() == Fp8Scaling::kDelayed,
                         "the history restored into a new model: the same scales, history and step count");
  llmc::Fp8History short_history = saved;
  short_history.amax.pop_back();
  testing::check_throws([&] { gpt2_fp8_restore_history(resumed, short_history, "state.bin"); },
                        llmc::strformat("state.bin: an FP8 amax history of %zu entries, but this model keeps %zu",
                                        short_history.amax.size(), saved.amax.size()),
                        "a history of another model's size");

  for (Fp8Scale& sc : a) sc.amax_bits = abs_bits(3.0f);
  cudaCheck(cudaMemcpy(m.fp8_act_scales, a.data(), count * sizeof(Fp8Scale), cudaMemcpyHostToDevice));
  gpt2_fp8_forget_eval_amax(m);
  cudaCheck(cudaMemcpy(b.data(), m.fp8_act_scales, count * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
  bool forgotten = true;
  for (int i = 0; i < count; i++) {
    forgotten = forgotten && b[i].amax_bits == 0 && b[i].scale == a[i].scale && b[i].inv_scale == a[i].inv_scale;
  }
  testing::check_verbose(forgotten, "evaluation's amaxes forgotten, the scales left as they were");
  gpt2_free(m);
  gpt2_free(resumed);
}

// ---- GELU in fcproj's input cast (delayed scaling) ----

// A fused delayed cast against the passes it replaces: cast(fused) writes rows and rows_t with
// the scale given (uploaded first; rows poisoned): the fused kernel, or the reference's passes.
// The fused rows and transpose must be the reference's bit for bit, the amax it records
// amax_bits (s and 1/s left as given), and a second fused run's the same. The last run is a
// fused one, for checks of what else it wrote.
void check_fused_cast(const std::string& what, const std::string& reference, DeviceArray<Fp8Scale>& scale,
                      const Fp8Scale& given, uint32_t amax_bits, DeviceArray<uint8_t>& rows,
                      DeviceArray<uint8_t>& rows_t, const std::function<void(bool fused)>& cast) {
  auto run = [&](bool fused) {
    scale.upload(std::vector<Fp8Scale>{given});
    rows.poison();
    rows_t.poison();
    cast(fused);
    return std::make_pair(rows.raw(), rows_t.raw());
  };
  const auto ref = run(false);
  const auto fused = run(true);
  check_bytes(what + ": rows = " + reference + ", cast", fused.first, ref.first);
  check_bytes(what + ": transposed = " + reference + ", cast", fused.second, ref.second);
  const Fp8Scale got = scale.raw()[0];
  testing::check_verbose(got.amax_bits == amax_bits && got.scale == given.scale && got.inv_scale == given.inv_scale,
                         llmc::strformat("%s: amax %08x recorded (%s %08x), s and 1/s as given", what.c_str(),
                                         got.amax_bits, reference.c_str(), amax_bits));
  testing::check_verbose(run(true) == fused, what + " twice: the same bits");
}

const char* activation_name(Activation act) { return act == Activation::kGelu ? "GELU" : "ReLU^2"; }

// fp8_source_cast_transpose of the activation's input pre (GELU or ReLU^2 in the cast) against the
// two passes it replaces, gelu_forward or relu2_forward then the delayed fp8_cast_transpose
// (itself checked against the CPU above), with the scale current scaling would pick for the
// activation's values: the same rows, transpose and recorded amax, bit for bit; pre left as it
// was; twice, the same bits.
void test_activation_cast(llmc::Rng& rng, int R, int C, Activation act) {
  const std::string name = std::string(activation_name(act)) + " in the cast";
  printf("\n%s (delayed scaling): R=%d C=%d\n", name.c_str(), R, C);
  const size_t n = (size_t)R * C;
  const Fp8Format f = Fp8Format::kE4M3;
  const std::vector<float> pre = random_stored(rng, n, 0.0f, 1.5f);
  DeviceArray<floatX> d_pre(pre), d_act(n);
  if (act == Activation::kGelu) gelu_forward(d_act, d_pre, n, 0);
  else relu2_forward(d_act, d_pre, n, 0);
  uint32_t amax_bits = 0;
  const Fp8Scale given = current_scale_given(d_act, n, f, &amax_bits);
  DeviceArray<Fp8Scale> scale(1);
  const int ld_t = fp8_padded(R);
  DeviceArray<uint8_t> rows(n), rows_t((size_t)C * ld_t);
  const std::string forward = act == Activation::kGelu ? "gelu_forward's" : "relu2_forward's";
  check_fused_cast(name, forward, scale, given, amax_bits, rows, rows_t, [&](bool fused) {
    if (fused) {
      fp8_source_cast_transpose(rows, rows_t, scale, d_pre, fp8_activation_source(act), R, C, f, true, 0);
    } else {
      fp8_cast_transpose(rows, rows_t, scale, d_act, R, C, f, true, 0);
    }
  });
  check_close(name + ": its input left as it was", d_pre.download(), pre, 0.0f);
}

// ---- The activation's derivative in the fc output gradient's cast (delayed scaling) ----

// fp8_activation_backward_cast_transpose of dout and the activation's input pre (GELU' or ReLU^2')
// against the passes it replaces, gelu_backward_inplace or relu2_backward_inplace then the delayed
// fp8_cast_transpose, with the scale current scaling would pick: the same rows, transpose and
// recorded amax, bit for bit; dout left as it was; the column sums of each 128-row tile bitwise
// against a CPU sum of the backward's values in the kernel's order (in BF16 builds each thread's
// rows g, g + 32, g + 64, g + 96, then the 32 threads g in order); twice, the same bits.
void test_activation_backward_cast(llmc::Rng& rng, int R, int C, Activation act) {
  const std::string name = std::string(activation_name(act)) + "' in the cast";
  printf("\n%s of the output gradient (delayed scaling): R=%d C=%d\n", name.c_str(), R, C);
  const size_t n = (size_t)R * C;
  const Fp8Format f = Fp8Format::kE5M2;
  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> pre = random_stored(rng, n, 0.0f, 1.5f);
  DeviceArray<floatX> d_dout(dout), d_pre(pre), d_ref(dout);
  activation_backward_inplace(act, d_ref, d_pre, n, 0);
  const std::vector<float> ref_values = d_ref.download();
  uint32_t amax_bits = 0;
  const Fp8Scale given = current_scale_given(d_ref, n, f, &amax_bits);
  DeviceArray<Fp8Scale> scale(1);
  const int tiles = fp8_tile_rows(R);
  DeviceArray<uint8_t> rows(n), rows_t((size_t)C * fp8_padded(R));
  DeviceArray<float> partials((size_t)tiles * C);
  auto fused_cast = [&] {
    partials.poison();
    fp8_activation_backward_cast_transpose(rows, rows_t, scale, d_dout, d_pre, act, partials, R, C, f, 0);
  };
  auto cast = [&](bool fused) {
    if (fused) {
      fused_cast();
    } else {
      fp8_cast_transpose(rows, rows_t, scale, d_ref, R, C, f, true, 0);
    }
  };
  const std::string backward = act == Activation::kGelu ? "gelu_backward_inplace's" : "relu2_backward_inplace's";
  check_fused_cast(name, backward, scale, given, amax_bits, rows, rows_t, cast);
  check_close(name + ": dout left as it was", d_dout.download(), dout, 0.0f);
  // The kernel's threads: each holds the column piece of x128::size values threadIdx % kPieces of
  // the rows group, group + kGroups, ... (group = threadIdx / kPieces).
  constexpr int kPieces = kFp8TileCols / x128::size, kGroups = kFp8Threads / kPieces;
  constexpr int kRowsPerThread = kFp8TileRows / kGroups;
  std::vector<float> ref_sums((size_t)tiles * C);
  for (int t = 0; t < tiles; t++) {
    for (int c = 0; c < C; c++) {
      float total = 0.0f;
      for (int g = 0; g < kGroups; g++) {
        float thread_sum = 0.0f;
        for (int j = 0; j < kRowsPerThread; j++) {
          const int row = t * kFp8TileRows + g + kGroups * j;
          thread_sum += row < R ? ref_values[(size_t)row * C + c] : 0.0f;
        }
        total += thread_sum;
      }
      ref_sums[(size_t)t * C + c] = total;
    }
  }
  check_close(name + ": each tile's column sums, in the kernel's order", partials.download(), ref_sums, 0.0f);
  const Snapshot sums(partials);
  scale.upload(std::vector<Fp8Scale>{given});
  fused_cast();
  check_same_bits(name + " twice: the column sums", sums, Snapshot(partials));
}

// The norms the casts compute: LayerNorm, RMSNorm with a gain, RMSNorm without (the speedrun's).
enum class CastNorm { kLayerNorm, kRmsNorm, kRmsNormNoGain };

// A norm in the cast: fp8_source_cast_transpose of the norm's input x, from the statistics the
// norm's forward kept without writing its output, against that forward's output cast by the
// delayed fp8_cast_transpose: the same rows, transpose and amax, bit for bit; the statistics the
// same with and without the output; twice, the same bits.
void test_norm_cast(llmc::Rng& rng, int R, int C, CastNorm kind) {
  const char* names[] = {"LayerNorm", "RMSNorm", "RMSNorm without a gain"};
  const std::string name = std::string(names[(int)kind]) + " in the cast";
  printf("\n%s (delayed scaling): R=%d C=%d\n", name.c_str(), R, C);
  const size_t n = (size_t)R * C;
  const Fp8Format f = Fp8Format::kE4M3;
  DeviceArray<floatX> d_x(random_stored(rng, n, 0.3f, 2.0f)), d_ln(n);
  DeviceArray<floatX> d_w(random_stored(rng, C, 1.0f, 0.2f)), d_b(random_stored(rng, C, 0.0f, 0.2f));
  DeviceArray<float> mean(R), rstd(R), mean2(R), rstd2(R);
  const bool layernorm = kind == CastNorm::kLayerNorm;
  const floatX* weight = kind == CastNorm::kRmsNormNoGain ? nullptr : (const floatX*)d_w;
  if (layernorm) {
    layernorm_forward(d_ln, mean, rstd, d_x, d_w, d_b, R, C, 0);
    layernorm_forward(nullptr, mean2, rstd2, d_x, d_w, d_b, R, C, 0);
  } else {
    rmsnorm_forward(d_ln, rstd, d_x, weight, R, C, 0);
    rmsnorm_forward(nullptr, rstd2, d_x, weight, R, C, 0);
  }
  check_same_bits("norm statistics without the output = with it", Snapshot(rstd), Snapshot(rstd2));
  if (layernorm) check_same_bits("layernorm means without the output = with it", Snapshot(mean), Snapshot(mean2));
  uint32_t amax_bits = 0;
  const Fp8Scale given = current_scale_given(d_ln, n, f, &amax_bits);
  DeviceArray<Fp8Scale> scale(1);
  const Fp8CastSource source =
      fp8_norm_source(layernorm ? (const float*)mean2 : nullptr, rstd2, weight, layernorm ? (const floatX*)d_b : nullptr);
  DeviceArray<uint8_t> rows(n), rows_t((size_t)C * fp8_padded(R));
  auto cast = [&](bool fused) {
    if (fused) {
      fp8_source_cast_transpose(rows, rows_t, scale, d_x, source, R, C, f, true, 0);
    } else {
      fp8_cast_transpose(rows, rows_t, scale, d_ln, R, C, f, true, 0);
    }
  };
  check_fused_cast(name, layernorm ? "layernorm_forward's" : "rmsnorm_forward's", scale, given, amax_bits, rows,
                   rows_t, cast);
  testing::check_throws([&] { fp8_source_cast_transpose(rows, rows_t, scale, d_x, source, R, C, f, false, 0); },
                        "needs delayed scaling", name + " with current scaling is refused");
}

// ---- the layers, against the BF16 layer ----

// Bounds on ||fp8 - bf16|| / ||bf16|| for the layers' outputs. Rounding to a format of p
// mantissa bits has relative error u with E[u^2] = 2^-2p / 12 * E[1/m^2] = 0.0451 * 2^-2p for a
// mantissa m spread log-uniformly over [1, 2): rms 0.0265 for E4M3 (p = 3), 0.0531 for E5M2
// (p = 2). A product's error adds both operands' independent errors, so its relative norm error
// is sqrt(u_a^2 + u_b^2): 0.0375 forward (E4M3 x E4M3), 0.0594 backward (E4M3 x E5M2 for dinp and
// dweight; GELU and its derivative scale each element's error with the element). The bounds leave
// a third on top; the BF16 reference's own rounding (2^-9) is far below it.
constexpr double kBoundForward = 0.05, kBoundBackward = 0.08;
// Each element's error is a sum of many such terms, near-Gaussian with sigma of about 0.06 of the
// tensor's rms: the elementwise check (relative to |ref| + rms, as check_close) only catches
// outliers far beyond the ~5.5 sigma a million-element tensor reaches.
constexpr float kTolElement = 0.5f;

bool check_layer_tensor(const std::string& name, const std::vector<float>& got, const std::vector<float>& ref,
                        double bound) {
  const bool norm = testing::check_tensor_norm(name, got.data(), ref.data(), got.size(), bound);
  return check_close(name + " (elements)", got, ref, kTolElement) && norm;
}

// dout_act: the activation whose derivative goes into dout where lc.gelu_dout says (ReLU^2 in the
// modern and speedrun MLPs).
void test_layer(const MatmulCase& lc, llmc::Rng& rng, Fp8Format grad_format = Fp8Format::kE5M2,
                Activation dout_act = Activation::kGelu) {
  const int N = lc.N, C = lc.C, OC = lc.OC, Np = fp8_padded(N);
  const std::string what = std::string(grad_format == Fp8Format::kE5M2 ? "FP8 layer" : "FP8 layer, E4M3 output "
                                       "gradients (-fp8g 1)") +
                           (dout_act == Activation::kGelu ? "" : ", ReLU^2' into dout");
  lc.print(what.c_str());
  const std::vector<float> inp = random_stored(rng, (size_t)N * C, 0.0f, 1.0f);
  const std::vector<float> weight = random_stored(rng, (size_t)OC * C, 0.0f, 1.0f / sqrtf(C));
  const std::vector<float> bias = random_stored(rng, OC, 0.0f, 1.0f);
  const std::vector<float> dout = random_stored(rng, (size_t)N * OC, 0.0f, 1.0f);
  // The FP8 layers take GELU's gradient into their output gradient (the fc layer's), not into dinp.
  REQUIRE(!lc.gelu_in, "test_layer: the FP8 layers apply GELU' to dout (gelu_dout), not to dinp");
  const std::vector<float> pre_gelu = random_stored(rng, (size_t)N * OC, 0.0f, 1.5f);
  const std::vector<float> dweight0 = random_stored(rng, (size_t)OC * C, 0.0f, 1.0f);
  DeviceArray<floatX> d_inp(inp), d_weight(weight), d_bias(bias), d_dout(dout), d_pre_gelu(pre_gelu);
  floatX* bias_ptr = lc.bias ? (floatX*)d_bias : nullptr;
  const floatX* pre_dout = lc.gelu_dout ? (floatX*)d_pre_gelu : nullptr;
  DeviceArray<float> partials((size_t)kRowBlocks * OC);
  const uint32_t seed = rng.u32();

  // The BF16 layer, on dout * act'(pre_gelu) from the activation's backward in place with gelu_dout.
  DeviceArray<floatX> ref_out((size_t)N * OC), ref_pre((size_t)N * OC), ref_dinp((size_t)N * C);
  DeviceArray<floatX> ref_dweight((size_t)OC * C), ref_dbias(OC), ref_dout(dout);
  if (pre_dout) activation_backward_inplace(dout_act, ref_dout, pre_dout, (size_t)N * OC, 0);
  matmul_forward(ref_out, d_inp, d_weight, bias_ptr, N, C, OC, lc.gelu_out ? (floatX*)ref_pre : nullptr, 0);
  ref_dweight.upload(std::vector<float>((size_t)OC * C, 0.0f));
  ref_dbias.upload(std::vector<float>(OC, 0.0f));
  matmul_backward(ref_dinp, ref_dweight, lc.bias ? (floatX*)ref_dbias : nullptr, partials, ref_dout, d_inp,
                  d_weight, nullptr, N, C, OC, seed, 0);

  // The FP8 layer: scales 0 weight, 1 input, 2 output gradient.
  DeviceArray<uint8_t> w8((size_t)OC * C), w8t((size_t)OC * C);
  DeviceArray<uint8_t> rows((size_t)N * std::max(C, OC)), dout_t((size_t)OC * Np), inp_t((size_t)C * Np);
  DeviceArray<Fp8Scale> scales(3);
  scales.poison();
  const Fp8Weight w = {w8, w8t, (Fp8Scale*)scales};
  Fp8Buffers buffers;
  buffers.rows = rows;
  buffers.dout_t = dout_t;
  Fp8Scale* inp_scale = (Fp8Scale*)scales + 1;
  Fp8Scale* dout_scale = (Fp8Scale*)scales + 2;
  fp8_weight_cast(w, d_weight, OC, C, 0);
  DeviceArray<floatX> out((size_t)N * OC), pre((size_t)N * OC), dinp((size_t)N * C);
  DeviceArray<floatX> dweight((size_t)OC * C), dbias(OC), layer_dout((size_t)N * OC);
  auto forward = [&](Fp8Scaling scaling = Fp8Scaling::kCurrent) {
    out.poison();
    pre.poison();
    inp_t.poison();
    matmul_forward_fp8(out, d_inp, w, bias_ptr, N, C, OC, lc.gelu_out ? (floatX*)pre : nullptr,
                       inp_scale, rows, inp_t, scaling, 0);
    return Snapshot(out, pre, inp_t);
  };
  auto backward = [&](const std::vector<float>& dweight_start, Fp8Scaling scaling = Fp8Scaling::kCurrent) {
    dinp.poison();
    dweight.upload(dweight_start);
    dbias.upload(std::vector<float>(OC, 0.0f));
    layer_dout.upload(dout);  // current scaling applies the activation's derivative in place
    matmul_backward_fp8(dinp, dweight, lc.bias ? (floatX*)dbias : nullptr, partials, layer_dout, inp_t, w,
                        pre_dout, dout_act, inp_scale, dout_scale, buffers, N, C, OC, seed, grad_format, scaling,
                        0);
    return Snapshot(dinp, dweight, dbias, layer_dout);
  };

  const Snapshot forward_bits = forward();
  if (lc.gelu_out) {
    check_layer_tensor("forward pre_gelu", pre.download(), ref_pre.download(), kBoundForward);
    check_layer_tensor("forward out = GELU", out.download(), ref_out.download(), kBoundForward);
  } else {
    check_layer_tensor("forward out", out.download(), ref_out.download(), kBoundForward);
  }
  check_same_bits("forward twice", forward_bits, forward());
  matmul_tuning = false;
  check_same_bits("forward tuned = heuristic", forward_bits, forward());
  matmul_tuning = true;

  const std::vector<float> zeros((size_t)OC * C, 0.0f);
  const Snapshot backward_bits = backward(zeros);
  const Snapshot backward_products(dinp, dweight);
  const std::vector<float> current_dbias = dbias.download();
  check_layer_tensor("backward dinp", dinp.download(), ref_dinp.download(), kBoundBackward);
  const std::vector<float> product = dweight.download();
  check_layer_tensor("backward dweight", product, ref_dweight.download(), kBoundBackward);
  // The bias gradient is the BF16 layer's code on the same BF16 dout (GELU' applied).
  if (lc.bias) check_close("backward dbias = BF16's", dbias.download(), ref_dbias.download(), 0.0f);
  check_same_bits("backward twice", backward_bits, backward(zeros));
  matmul_tuning = false;
  check_same_bits("backward tuned = heuristic", backward_bits, backward(zeros));
  matmul_tuning = true;
  // Delayed scaling with the scales current scaling picked gives the same bits, and records the
  // same amaxes.
  {
    const std::vector<Fp8Scale> current = scales.raw();
    std::vector<Fp8Scale> given = current;
    for (int i : {1, 2}) {
      given[i].scale = 1.0f / current[i].inv_scale;
      given[i].amax_bits = 0;
    }
    scales.upload(given);
    check_same_bits("delayed forward, current's scale", forward_bits, forward(Fp8Scaling::kDelayed));
    if (pre_dout) {
      // Delayed scaling applies GELU' in the cast-transpose, which also sums the bias gradient's
      // columns per tile and writes no BF16 output gradient (current: gelu_backward_inplace over
      // dout, then matmul_dbias's column sums): the products' bits, dbias within a sum's rounding.
      backward(zeros, Fp8Scaling::kDelayed);
      check_same_bits("delayed backward, current's scales: dinp, dweight", backward_products,
                      Snapshot(dinp, dweight));
      if (lc.bias) {
        check_close("delayed backward: dbias from the cast's column sums", dbias.download(), current_dbias,
                    kTolSum);
      }
      check_close("delayed: dout left as it was", layer_dout.download(), dout, 0.0f);
    } else {
      check_same_bits("delayed backward, current's scales", backward_bits, backward(zeros, Fp8Scaling::kDelayed));
    }
    const std::vector<Fp8Scale> recorded = scales.raw();
    testing::check_verbose(recorded[1].amax_bits == current[1].amax_bits &&
                               recorded[2].amax_bits == current[2].amax_bits,
                           "delayed: the input's and the output gradient's amaxes recorded");
    // The first step of delayed scaling: an earlier micro step's larger amax stays (the step's
    // amax, for the history), a smaller one gives way; with amaxes no larger than this micro
    // step's, the bits of current scaling.
    std::vector<Fp8Scale> earlier = current;
    for (int i : {1, 2}) earlier[i].amax_bits = abs_bits(4.0f * float_of_bits(current[i].amax_bits));
    scales.upload(earlier);
    forward(Fp8Scaling::kCurrentStepMax);
    backward(zeros, Fp8Scaling::kCurrentStepMax);
    const std::vector<Fp8Scale> kept = scales.raw();
    testing::check_verbose(kept[1].amax_bits == earlier[1].amax_bits && kept[2].amax_bits == earlier[2].amax_bits,
                           "first delayed step: a larger amax of an earlier micro step is kept");
    std::vector<Fp8Scale> smaller = current;
    for (int i : {1, 2}) smaller[i].amax_bits = abs_bits(0.25f * float_of_bits(current[i].amax_bits));
    scales.upload(smaller);
    check_same_bits("first delayed step, smaller earlier amaxes: forward = current's", forward_bits,
                    forward(Fp8Scaling::kCurrentStepMax));
    check_same_bits("first delayed step, smaller earlier amaxes: backward = current's", backward_bits,
                    backward(zeros, Fp8Scaling::kCurrentStepMax));
    const std::vector<Fp8Scale> grown = scales.raw();
    testing::check_verbose(grown[1].amax_bits == current[1].amax_bits && grown[2].amax_bits == current[2].amax_bits,
                           "first delayed step: this micro step's larger amax replaces a smaller one");
    scales.upload(current);
  }
  // Accumulation (beta = 1): the old gradient plus the product, rounded once.
  backward(dweight0);
  std::vector<float> expected(product.size());
  for (size_t i = 0; i < expected.size(); i++) expected[i] = dweight0[i] + product[i];
  check_close("dweight += (beta = 1)", dweight.download(), expected, kTolStore);
}

#if !defined(ENABLE_FP32)
// The fcproj layer's forward with GELU in its input cast (a kGelu source) against the same layer
// on gelu_forward's values, both with delayed scaling and the same scales: the same output and
// transposed input, bit for bit. Current scaling cannot take GELU into the cast (its amax pass
// would need the values first) and refuses.
void test_gelu_input_layer(llmc::Rng& rng, int N, int C, int OC) {
  printf("\nfcproj with GELU in its input cast: N=%d C=%d OC=%d\n", N, C, OC);
  const int Np = fp8_padded(N);
  DeviceArray<floatX> d_pre(random_stored(rng, (size_t)N * C, 0.0f, 1.5f)), d_gelu((size_t)N * C);
  DeviceArray<floatX> d_weight(random_stored(rng, (size_t)OC * C, 0.0f, 1.0f / sqrtf(C)));
  DeviceArray<floatX> d_bias(random_stored(rng, OC, 0.0f, 1.0f));
  gelu_forward(d_gelu, d_pre, (size_t)N * C, 0);
  DeviceArray<uint8_t> w8((size_t)OC * C), w8t((size_t)OC * C), rows((size_t)N * C), inp_t((size_t)C * Np);
  DeviceArray<Fp8Scale> scales(2);
  const Fp8Weight w = {w8, w8t, (Fp8Scale*)scales};
  Fp8Scale* inp_scale = (Fp8Scale*)scales + 1;
  fp8_weight_cast(w, d_weight, OC, C, 0);
  std::vector<Fp8Scale> given = scales.raw();
  uint32_t amax_bits = 0;
  given[1] = current_scale_given(d_gelu, (size_t)N * C, Fp8Format::kE4M3, &amax_bits);
  DeviceArray<floatX> out((size_t)N * OC);
  const Fp8CastSource gelu{Fp8CastInput::kGelu};
  auto forward = [&](bool gelu_in_cast) {
    scales.upload(given);
    out.poison();
    inp_t.poison();
    matmul_forward_fp8(out, gelu_in_cast ? (floatX*)d_pre : (floatX*)d_gelu, w, d_bias, N, C, OC, nullptr,
                       inp_scale, rows, inp_t, Fp8Scaling::kDelayed, 0,
                       gelu_in_cast ? gelu : Fp8CastSource());
    return Snapshot(out, inp_t);
  };
  const Snapshot unfused = forward(false);
  check_same_bits("fcproj, GELU in the cast = on gelu_forward's values", unfused, forward(true));
  testing::check_throws([&] {
    matmul_forward_fp8(out, d_pre, w, d_bias, N, C, OC, nullptr, inp_scale, rows, inp_t, Fp8Scaling::kCurrent, 0, gelu);
  }, "an activation or a norm in the input's cast needs delayed scaling", "GELU in the cast with current scaling is refused");
}

// The model's wiring of the norms and activations in the casts: after a -fp8 2 step has been
// recorded, a forward pass takes the delayed path, and each layer's inputs as its weight gradients
// will read them (transposed) are: fcproj's activation of that layer's kFch (GPT-2's GELU, the
// speedrun's ReLU^2), fc's norm of kResidual2 with that layer's statistics and parameters (GPT-2's
// LayerNorm, the speedrun's RMSNorm without a gain), and qkv's: GPT-2's LayerNorm of the layer's
// input, the speedrun's ln1 as written (its gates read it), each cast under that layer's scale.
void test_sources_in_model(llmc::Rng& rng, llmc::Arch arch) {
  const bool speedrun = arch == llmc::Arch::kSpeedrun;
  printf("\nNorms and activations in the casts inside the %s model (-fp8 2, after a recorded step)\n",
         llmc::arch_spec(arch).name);
  const llmc::GPT2Config config = llmc::make_config(speedrun ? llmc::kSpeedrunLayers : 2, 2, 64, 32, 96, arch);
  const int B = 2, T = 32, N = B * T, C4 = 4 * config.channels, Np = fp8_padded(N);
  // Each layer's layernorm weights and biases differ (the seeded ones are all 1 and 0), so that
  // another layer's or the other layernorm's would show.
  std::vector<float> values = llmc::init_params_from_seed(config, 7);
  size_t offsets[llmc::kNumParamTensors];
  llmc::param_offsets(config, offsets);
  const size_t C = config.channels;
  for (int i : {llmc::kLn1w, llmc::kLn1b, llmc::kLn2w, llmc::kLn2b}) {
    if (speedrun) break;  // weightless norms
    const bool weight = i == llmc::kLn1w || i == llmc::kLn2w;
    const std::vector<float> random = random_stored(rng, config.num_layers * C, weight ? 1.0f : 0.0f, 0.3f);
    std::copy(random.begin(), random.end(), values.begin() + offsets[i]);
  }
  GPT2 m;
  gpt2_init(m, config, values, StateSpec(), 7);
  gpt2_allocate(m, B, T, 0, 2);
  std::vector<int> inputs(N);
  for (int& t : inputs) t = (int)(rng.u32() % config.vocab_size);
  gpt2_forward(m, inputs.data(), B, T);
  gpt2_fp8_end_step(m, true);
  const bool delayed = m.fp8_scaling() == Fp8Scaling::kDelayed;
  gpt2_forward(m, inputs.data(), B, T);
  DeviceArray<uint8_t> rows((size_t)N * C4), rows_t((size_t)C4 * Np);
  DeviceArray<Fp8Scale> scale(1);
  // The kept transposed input of `linear` at layer l against x [N, width] cast as source says.
  auto kept_is = [&](int linear, int l, const floatX* x, int width, const Fp8CastSource& source) {
    cudaCheck(cudaMemcpy(scale, m.fp8_input_scale(linear, l), sizeof(Fp8Scale), cudaMemcpyDeviceToDevice));
    fp8_source_cast_transpose(rows, rows_t, scale, x, source, N, width, Fp8Format::kE4M3, true, m.stream);
    std::vector<uint8_t> kept((size_t)width * Np), ref = rows_t.raw();
    cudaCheck(cudaMemcpy(kept.data(), m.fp8_input_t(linear, l), kept.size(), cudaMemcpyDeviceToHost));
    return std::equal(kept.begin(), kept.end(), ref.begin());
  };
  // The norm of x with layer l's parameters, its statistics computed here (not the model's).
  DeviceArray<float> mean(N), rstd(N);
  DeviceArray<floatX> ln1((size_t)N * C);
  auto norm = [&](const floatX* x, int weight, int bias, int l) {
    if (speedrun) {
      rmsnorm_forward(nullptr, rstd, x, nullptr, N, (int)C, m.stream);
      return fp8_norm_source(nullptr, rstd, nullptr, nullptr);
    }
    layernorm_forward(nullptr, mean, rstd, x, m.param(weight, l), m.param(bias, l), N, (int)C, m.stream);
    return fp8_norm_source(mean, rstd, m.param(weight, l), m.param(bias, l));
  };
  const Fp8CastSource act = fp8_activation_source(speedrun ? Activation::kRelu2 : Activation::kGelu);
  bool act_same = delayed, ln1_same = delayed, ln2_same = delayed;
  for (int l = 0; l < config.num_layers; l++) {
    act_same = act_same && kept_is(kLinearFcproj, l, m.act(kFch, l), C4, act);
    if (speedrun && m.plan[l].attention) {
      // The model writes ln1 (the gates read it) and casts it: here the norm of the block's mixed
      // input, written by rmsnorm_forward and cast.
      rmsnorm_forward(ln1, rstd, block_mixed(m, l), nullptr, N, (int)C, m.stream);
      ln1_same = ln1_same && kept_is(kLinearQkv, l, ln1, (int)C, Fp8CastSource());
    } else if (!speedrun) {
      const floatX* residual = block_input(m, l);
      ln1_same = ln1_same && kept_is(kLinearQkv, l, residual, (int)C, norm(residual, llmc::kLn1w, llmc::kLn1b, l));
    }
    ln2_same = ln2_same && kept_is(kLinearFc, l, m.act(kResidual2, l), (int)C,
                                   norm(m.act(kResidual2, l), llmc::kLn2w, llmc::kLn2b, l));
  }
  const char* act_name = speedrun ? "ReLU^2" : "GELU";
  const char* norm_name = speedrun ? "RMSNorm" : "LayerNorm";
  testing::check_verbose(act_same, llmc::strformat("delayed forward: every layer's fcproj input = %s(its kFch) cast "
                                                   "under its scale", act_name));
  testing::check_verbose(ln1_same, speedrun ? "delayed forward: every attention layer's qkv input = RMSNorm(its "
                                              "mixed input), cast under its scale"
                                            : "delayed forward: every layer's qkv input = LayerNorm(its input) "
                                              "cast under its scale");
  testing::check_verbose(ln2_same, llmc::strformat("delayed forward: every layer's fc input = %s(its kResidual2) "
                                                   "cast under its scale", norm_name));
  gpt2_free(m);
}
#endif

// ---- the speedrun head: FP8 with fixed scales ----

// The value of an FP8 code (not NaN), decoded from its fields in double.
double fp8_value(uint8_t q, Fp8Format f) {
  const Fp8Spec spec = fp8_spec(f);
  const int exponent = (q & 0x7f) >> spec.mantissa_bits, mantissa = q & ((1 << spec.mantissa_bits) - 1);
  const double magnitude = exponent == 0
                               ? std::ldexp((double)mantissa, 1 - spec.bias - spec.mantissa_bits)
                               : std::ldexp(1.0 + std::ldexp((double)mantissa, -spec.mantissa_bits), exponent - spec.bias);
  return q & 0x80 ? -magnitude : magnitude;
}

// fp8_value against fp8_reference: every code but NaN (and E5M2's infinities) decodes to a value
// that rounds back to it.
void test_fp8_decoder() {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    int differ = 0, decoded = 0;
    for (int q = 0; q < 256; q++) {
      const bool special = f == Fp8Format::kE4M3 ? (q & 0x7f) == 0x7f : (q & 0x7c) == 0x7c;
      if (special) continue;
      decoded++;
      differ += fp8_reference((float)fp8_value((uint8_t)q, f), f) != q;
    }
    testing::check_verbose(differ == 0, llmc::strformat("%s decoder: %d codes round back to themselves (%d differ)",
                                                        fp8_format_name(f), decoded, differ));
  }
}

// The head's inputs as the recipe's: rows of x RMS-normed (mean x^2 = 1, so |x| <= sqrt(C)), one
// of them all zeros but one value of sqrt(C) (BF16 rounds sqrt(768) up to 27.75, 448.6 x_s, whose
// nearest E4M3 value is still 448); w ~ N(0, 0.02) with some values near +-0.875 = 448 w_s; g like
// the gradient of a summed cross-entropy: small everywhere, near -1 at one column of each row.
std::vector<float> rms_normed_rows(llmc::Rng& rng, int N, int C) {
  std::vector<float> x(random_stored(rng, (size_t)N * C, 0.0f, 1.0f));
  for (int r = 0; r < N; r++) {
    double squares = 0.0;
    for (int c = 0; c < C; c++) squares += (double)x[(size_t)r * C + c] * x[(size_t)r * C + c];
    const float rstd = (float)(1.0 / std::sqrt(squares / C));
    for (int c = 0; c < C; c++) x[(size_t)r * C + c] *= rstd;
  }
  std::fill(x.begin(), x.begin() + C, 0.0f);
  x[C / 3] = std::sqrt((float)C);
  return stored(x);
}

std::vector<float> head_weight(llmc::Rng& rng, int OC, int C) {
  std::vector<float> w = random_stored(rng, (size_t)OC * C, 0.0f, 0.02f);
  const float near[] = {0.875f, -0.875f, 0.87109375f, -0.87890625f, 0.8671875f};
  for (int i = 0; i < 40; i++) w[(size_t)(rng.u32() % w.size())] = near[i % 5];
  return stored(w);
}

std::vector<float> head_gradient(llmc::Rng& rng, int N, int OC) {
  std::vector<float> g = random_stored(rng, (size_t)N * OC, 0.0f, 3e-5f);
  for (int r = 0; r < N; r++) g[(size_t)r * OC + rng.u32() % OC] = -0.5f - 0.5f * (float)(rng.u32() % 1000) / 1000.0f;
  return stored(g);
}

// fp8_fixed_cast_transpose of x [R, C] in format f under fp8_fixed_scale(s), against the CPU
// reference of x times the scale's FP32 factor 1/s (rounded once from double): rows and
// transpose bitwise, max |x| recorded, s and 1/s left as given; twice, the same bits. Prints how
// many values an IEEE division by s would have cast otherwise (a note, not a check).
void test_fixed_cast(const std::string& name, const std::vector<float>& x, int R, int C, Fp8Format f, double s) {
  const Fp8Scale fixed = fp8_fixed_scale(s);
  const std::string label = llmc::strformat("fixed %s %s", fp8_format_name(f), name.c_str());
  testing::check_verbose(fixed.inv_scale == (float)s && fixed.scale == (float)(1.0 / s) && fixed.amax_bits == 0,
                         llmc::strformat("%s: inv_scale = s = %.9g, scale = 1/s = %.9g (FP32)", label.c_str(),
                                         fixed.inv_scale, fixed.scale));
  const int ld_t = fp8_padded(R);
  DeviceArray<floatX> d_x(x);
  DeviceArray<Fp8Scale> scale(1);
  DeviceArray<uint8_t> out((size_t)R * C), out_t((size_t)C * ld_t);
  auto cast = [&] {
    scale.upload(std::vector<Fp8Scale>{fixed});
    out.poison();
    out_t.poison();
    fp8_fixed_cast_transpose(out, out_t, scale, d_x, R, C, f, 0);
    return std::make_pair(out.raw(), out_t.raw());
  };
  const auto got = cast();
  std::vector<uint8_t> ref, ref_t;
  cast_reference(x, R, C, fixed.scale, f, &ref, &ref_t);
  check_bytes(label + " rows", got.first, ref);
  check_bytes(label + " transposed", got.second, ref_t);
  uint32_t amax_bits = 0;
  for (float v : x) amax_bits = std::max(amax_bits, abs_bits(v));
  const Fp8Scale after = scale.raw()[0];
  testing::check_verbose(after.amax_bits == amax_bits && after.inv_scale == fixed.inv_scale && after.scale == fixed.scale,
                         llmc::strformat("%s: amax %08x recorded (CPU %08x), s and 1/s as given", label.c_str(),
                                         after.amax_bits, amax_bits));
  testing::check_verbose(cast() == got, label + " twice: the same bits");
  size_t division_differs = 0;
  for (size_t i = 0; i < x.size(); i++) {
    division_differs += fp8_reference((float)((double)x[i] / (float)s), f) != ref[i];
  }
  printf("     note: x / s in FP32 (IEEE division) would cast %zu of %zu values otherwise\n", division_differs,
         x.size());
}

void test_fixed_casts(llmc::Rng& rng, int N, int C, int OC) {
  printf("\nthe speedrun head's casts with fixed scales: N=%d C=%d OC=%d\n", N, C, OC);
  test_fixed_cast("x (RMS-normed rows), x_s = sqrt(C)/448", rms_normed_rows(rng, N, C), N, C, Fp8Format::kE4M3,
                  std::sqrt((double)C) / 448.0);
  test_fixed_cast("w, w_s = 2^-9", head_weight(rng, OC, C), OC, C, Fp8Format::kE4M3, std::ldexp(1.0, -9));
  test_fixed_cast("g, grad_s = 1/448", head_gradient(rng, N, OC), N, OC, Fp8Format::kE5M2, 1.0 / 448.0);
}

#if !defined(ENABLE_FP32)
// a [rows, K] and b [cols, K] FP8 codes: the [rows, cols] products sum_k a b in double of their
// decoded values, times scale (the products' two FP32 scales, multiplied in double).
std::vector<double> fp8_product_reference(const std::vector<uint8_t>& a, Fp8Format fa, const std::vector<uint8_t>& b,
                                          Fp8Format fb, int rows, int cols, int K, double scale) {
  std::vector<double> va(a.size()), vb(b.size()), out((size_t)rows * cols);
  for (size_t i = 0; i < a.size(); i++) va[i] = fp8_value(a[i], fa);
  for (size_t i = 0; i < b.size(); i++) vb[i] = fp8_value(b[i], fb);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) {
      double acc = 0.0;
      for (int k = 0; k < K; k++) acc += va[(size_t)r * K + k] * vb[(size_t)c * K + k];
      out[(size_t)r * cols + c] = acc * scale;
    }
  }
  return out;
}

// The [C, R] transpose of x [R, C] (FP8 codes).
std::vector<uint8_t> transposed(const std::vector<uint8_t>& x, int R, int C) {
  std::vector<uint8_t> t(x.size());
  for (int r = 0; r < R; r++) {
    for (int c = 0; c < C; c++) t[(size_t)c * R + r] = x[(size_t)r * C + c];
  }
  return t;
}

std::vector<float> as_float(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

// Tolerances of the head's products against the CPU's double product of the same FP8 values (as
// check_close: relative to |ref| + rms(ref)). The forward: BF16 rounding (2^-9) and fast
// accumulation in the tensor cores' own accumulator (about 2^-14 of a partial sum's size at each
// addition, over C terms). The input gradient: BF16 rounding and FP32 accumulation. The weight
// gradient's FP32 output: the tensor cores' accumulation over blocks of tokens, promoted to FP32,
// far below BF16's 2^-9; after its stochastic rounding into the BF16 gradient, one BF16 ulp.
// Wrong codes, scales or layouts miss all of them by far more (an FP8 code's step is 2^-3).
constexpr float kTolHeadForward = 1e-2f, kTolHeadDinp = 8e-3f, kTolHeadDweightFp32 = 2e-3f;

// The head's layer (BF16 builds): fp8_fixed_weight_cast, matmul_forward_fp8_fixed and
// matmul_backward_fp8_fixed on the recipe's scales and inputs, the backward from the CPU's cast of
// the gradient g8 (the classifier's, which test_classifier checks). The casts each writes (w8 and
// its transpose, x8 and its transpose) and g8's transpose bitwise against the CPU reference; out,
// dinp and the FP32 weight gradient against the CPU's double products of the reference's FP8
// values; dweight = dweight0 + the FP32 product rounded stochastically; every pass twice, and
// with cuBLASLt's first heuristic, for the same bits.
void test_head_layer(llmc::Rng& rng, int N, int C, int OC) {
  printf("\nthe speedrun head's FP8 layer, fixed scales: N=%d C=%d OC=%d\n", N, C, OC);
  const int Np = fp8_padded(N);
  const double x_s = std::sqrt((double)C) / 448.0, w_s = std::ldexp(1.0, -9), grad_s = 1.0 / 448.0;
  const std::vector<float> x = rms_normed_rows(rng, N, C), weight = head_weight(rng, OC, C);
  const std::vector<float> g = head_gradient(rng, N, OC);
  const std::vector<float> dweight0 = random_stored(rng, (size_t)OC * C, 0.0f, 0.05f);
  const uint32_t seed = rng.u32();
  // Scales: 0 the weight's, 1 the input's, 2 the output gradient's.
  const std::vector<Fp8Scale> fixed = {fp8_fixed_scale(w_s), fp8_fixed_scale(x_s), fp8_fixed_scale(grad_s)};
  DeviceArray<Fp8Scale> scales(fixed);
  DeviceArray<floatX> d_x(x), d_weight(weight);
  DeviceArray<uint8_t> w8((size_t)OC * C), w8t((size_t)OC * C), inp8((size_t)N * C), inp8_t((size_t)C * Np);
  DeviceArray<uint8_t> rows((size_t)N * std::max(C, OC)), dout_t((size_t)OC * Np);
  DeviceArray<floatX> out((size_t)N * OC), dinp((size_t)N * C), dweight((size_t)OC * C);
  DeviceArray<float> dweight_fp32((size_t)OC * C);
  const Fp8Weight w = {w8, w8t, (Fp8Scale*)scales};
  Fp8Scale* inp_scale = (Fp8Scale*)scales + 1;
  Fp8Scale* dout_scale = (Fp8Scale*)scales + 2;
  Fp8Buffers buffers;
  buffers.rows = rows;
  buffers.dout_t = dout_t;

  w8.poison();
  w8t.poison();
  fp8_fixed_weight_cast(w, d_weight, OC, C, 0);
  std::vector<uint8_t> ref_w8, ref_w8t, ref_x8, ref_x8t, ref_g8, ref_g8t;
  cast_reference(weight, OC, C, fixed[0].scale, Fp8Format::kE4M3, &ref_w8, &ref_w8t);
  cast_reference(x, N, C, fixed[1].scale, Fp8Format::kE4M3, &ref_x8, &ref_x8t);
  cast_reference(g, N, OC, fixed[2].scale, Fp8Format::kE5M2, &ref_g8, &ref_g8t);
  std::vector<uint8_t> g8_rows(rows.size(), 0xff);  // the gradient's rows, poison past them
  std::copy(ref_g8.begin(), ref_g8.end(), g8_rows.begin());
  check_bytes("weight cast w8", w8.raw(), ref_w8);
  check_bytes("weight cast, transposed w8t", w8t.raw(), ref_w8t);

  auto forward = [&] {
    out.poison();
    inp8.poison();
    inp8_t.poison();
    matmul_forward_fp8_fixed(out, d_x, w, N, C, OC, inp_scale, inp8, inp8_t, 0);
    return Snapshot(out, inp8, inp8_t);
  };
  auto backward = [&] {
    dinp.poison();
    dweight_fp32.poison();
    dout_t.poison();
    rows.upload(g8_rows);
    dweight.upload(dweight0);
    matmul_backward_fp8_fixed(dinp, dweight, dweight_fp32, inp8_t, w, inp_scale, dout_scale, buffers, N, C, OC,
                              seed, 0);
    return Snapshot(dinp, dweight, dweight_fp32, rows, dout_t);
  };
  const Snapshot forward_bits = forward();
  check_bytes("forward: x8", inp8.raw(), ref_x8);
  check_bytes("forward: x8 transposed, padded", inp8_t.raw(), ref_x8t);
  const double out_scale = (double)fixed[1].inv_scale * fixed[0].inv_scale;
  const std::vector<double> ref_out =
      fp8_product_reference(ref_x8, Fp8Format::kE4M3, ref_w8, Fp8Format::kE4M3, N, OC, C, out_scale);
  check_close("forward out (BF16, fast accumulation)", out.download(), as_float(ref_out), kTolHeadForward);
  check_same_bits("forward twice", forward_bits, forward());
  matmul_tuning = false;
  check_same_bits("forward tuned = heuristic", forward_bits, forward());
  matmul_tuning = true;

  const Snapshot backward_bits = backward();
  check_bytes("backward: g8 transposed, padded", dout_t.raw(), ref_g8t);
  const double dinp_scale = (double)fixed[2].inv_scale * fixed[0].inv_scale;
  const std::vector<double> ref_dinp = fp8_product_reference(ref_g8, Fp8Format::kE5M2, ref_w8t, Fp8Format::kE4M3,
                                                             N, C, OC, dinp_scale);
  check_close("backward dinp (BF16)", dinp.download(), as_float(ref_dinp), kTolHeadDinp);
  const double dweight_scale = (double)fixed[1].inv_scale * fixed[2].inv_scale;
  const std::vector<double> ref_dweight = fp8_product_reference(transposed(ref_g8, N, OC), Fp8Format::kE5M2,
                                                                transposed(ref_x8, N, C), Fp8Format::kE4M3, OC, C,
                                                                N, dweight_scale);
  check_close("backward dweight product (FP32)", dweight_fp32.download(), as_float(ref_dweight),
              kTolHeadDweightFp32);
  std::vector<float> accumulated(dweight0.size());
  for (size_t i = 0; i < accumulated.size(); i++) accumulated[i] = (float)(dweight0[i] + ref_dweight[i]);
  check_close("dweight += product (stochastic)", dweight.download(), accumulated, kTolSum);
  check_same_bits("backward twice", backward_bits, backward());
  matmul_tuning = false;
  check_same_bits("backward tuned = heuristic", backward_bits, backward());
  matmul_tuning = true;
  const std::vector<Fp8Scale> after = scales.raw();
  bool kept = true;
  for (int i = 0; i < 3; i++) kept = kept && after[i].inv_scale == fixed[i].inv_scale && after[i].scale == fixed[i].scale;
  testing::check_verbose(kept, "the fixed scales' s and 1/s left as they were");
}
#endif

// The compute capability the suite needs: 8.9 for the BF16 build's FP8 products; the FP32 build
// checks only the casts, which any GPU runs.
#if defined(ENABLE_FP32)
constexpr int kComputeCapability = 0;
#else
constexpr int kComputeCapability = 89;
#endif

void run() {
  llmc::Rng rng(21);
  test_reference_conversion(rng);
  test_casts("T=1000, d48 width", 1000, 1600, random_stored(rng, (size_t)1000 * 1600, 0.0f, 1.0f));
  test_casts("GPT-2 small fc weight", 4 * 768, 768, random_stored(rng, (size_t)4 * 768 * 768, 0.0f, 0.02f));
  test_casts("odd", 37, 136, random_stored(rng, (size_t)37 * 136, 0.5f, 3.0f));
  test_casts("one row", 1, 8, random_stored(rng, 8, 0.0f, 1.0f));
  test_casts("large values", 129, 72, random_stored(rng, (size_t)129 * 72, 0.0f, 1e30f));
  test_casts("tiny values (scale clamped at 2^126)", 64, 64, random_stored(rng, 64 * 64, 0.0f, 1e-37f));
  test_casts("zeros", 48, 64, std::vector<float>(48 * 64, 0.0f));
  std::vector<float> with_nan = random_stored(rng, (size_t)100 * 96, 0.0f, 1.0f);
  with_nan[1234] = NAN;
  test_casts("a NaN", 100, 96, stored(with_nan));  // the NaN the GPU sees (BF16's own)
  std::vector<float> with_inf = random_stored(rng, (size_t)100 * 96, 0.0f, 1.0f);
  with_inf[4321] = -INFINITY;
  test_casts("an Inf", 100, 96, with_inf);
  test_delayed_casts("T=1000, d48 width", 1000, 1600, random_stored(rng, (size_t)1000 * 1600, 0.0f, 1.0f), 0);
  test_delayed_casts("saturating", 129, 72, random_stored(rng, (size_t)129 * 72, 0.0f, 2.0f), 3);
  test_delayed_casts("underflowing", 37, 136, random_stored(rng, (size_t)37 * 136, 0.0f, 1e-3f), -6);
  // A scale of 2^126 (a history of tiny amaxes) on values up to about 8: x * s overflows FP32
  // and must saturate, not become NaN; NaN, -Inf and -0 as in current scaling.
  std::vector<float> overflowing = random_stored(rng, (size_t)100 * 96, 0.0f, 2.0f);
  overflowing[17] = NAN;
  overflowing[4000] = -INFINITY;
  overflowing[5000] = -0.0f;
  test_delayed_casts("overflowing FP32, NaN, -Inf, -0", 100, 96, stored(overflowing), 200);
  test_update_scales(rng, false);
  test_update_scales(rng, true);
  for (const Activation act : {Activation::kGelu, Activation::kRelu2}) {
    test_activation_cast(rng, 1000, 4 * 1600, act);
    test_activation_cast(rng, 37, 136, act);
  }
  for (const CastNorm norm : {CastNorm::kLayerNorm, CastNorm::kRmsNorm, CastNorm::kRmsNormNoGain}) {
    test_norm_cast(rng, 1000, 1600, norm);
    test_norm_cast(rng, 37, 136, norm);
  }
  for (const Activation act : {Activation::kGelu, Activation::kRelu2}) {
    test_activation_backward_cast(rng, 1000, 4 * 1600, act);
    test_activation_backward_cast(rng, 37, 136, act);
  }
  test_fp8_decoder();
  printf("\ntranspose of bytes (the FP8 head's gradient)\n");
  test_transpose(rng, 1000, 1600);
  test_transpose(rng, 37, 144);
  test_transpose(rng, 129, 64);
  test_transpose(rng, 1, 16);
  test_transpose(rng, 333, 272);
  test_fixed_casts(rng, 64, 768, 50304);
  test_fixed_casts(rng, 333, 128, 272);
#if defined(ENABLE_FP32)
  printf("\nskip FP8 linear layers: they need the BF16 build (their outputs and bias are BF16)\n");
#else
  const MatmulCase layers[] = {
      {"qkv, GPT-2 small, T=1000", 1000, 768, 3 * 768, true, false, false},
      {"attproj, GPT-2 small", 4 * 1024, 768, 768, true, false, false},
      {"fc, d48, T=1000", 1000, 1600, 4 * 1600, true, true, false, true},
      {"fcproj, d48, T=1000", 1000, 4 * 1600, 1600, true, false, false},
      {"odd, no bias", 37, 144, 80, false, true, false, true},
  };
  for (const MatmulCase& lc : layers) test_layer(lc, rng);
  test_layer(layers[2], rng, Fp8Format::kE4M3);  // the GELU gradient's range in E4M3
  // The modern and speedrun fc layers: ReLU^2' into dout (in place with -fp8 1, in the cast with 2).
  test_layer({"fc, ReLU^2, odd, no bias", 37, 144, 80, false, false, false, true}, rng, Fp8Format::kE5M2,
             Activation::kRelu2);
  test_layer({"fc, ReLU^2, d12, T=1000", 1000, 768, 4 * 768, false, false, false, true}, rng, Fp8Format::kE5M2,
             Activation::kRelu2);
  test_delayed_steps(rng);
  test_gelu_input_layer(rng, 1000, 4 * 1600, 1600);
  test_sources_in_model(rng, llmc::Arch::kGpt2);
  test_sources_in_model(rng, llmc::Arch::kSpeedrun);
  test_head_layer(rng, 64, 768, 50304);
  test_head_layer(rng, 333, 768, 272);
  test_head_layer(rng, 100, 128, 50304);
  test_head_layer(rng, 333, 128, 272);
#endif
}

}  // namespace fp8_tests
