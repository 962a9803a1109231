// Random numbers that reproduce PyTorch's CPU generator bit for bit, so that a
// model initialised here from a seed equals the one train_gpt2.py initialises
// with torch.manual_seed(seed) (SPEC.md "Random numbers").
//
// - Rng is MT19937 seeded like torch.manual_seed (init_genrand with the low 32
//   bits of the seed); u32() is the standard tempered output.
// - uniform_float() is torch's float uniform_ on [0, 1): the low 24 bits of one
//   u32 times 2^-24; uniform() fills n of them on [from, to). uniform_double() is torch's double uniform_: the low 53 bits of a
//   64-bit draw (first u32 high, second low) times 2^-53.
// - normal() reproduces torch.Tensor.normal_(mean, std) on a contiguous float32
//   CPU tensor of n values:
//   * n >= 16: all n uniforms are drawn first, then a 16-wide Box-Muller turns
//     x[i..i+15] into normals (u1 = 1 - x[i+k], u2 = x[i+k+8], k < 8; cos goes
//     to i+k, sin to i+k+8). When n % 16 != 0 the last 16 positions are
//     refilled with 16 fresh uniforms and transformed again (overwriting the
//     tail of the last full block).
//   * n < 16: one double-precision Box-Muller pair per two values, drawn from
//     two 53-bit uniforms (u1 for the angle, u2 for the radius via
//     log(1 - u2)); the second value of a pair is kept in the generator and
//     returned by the next scalar draw, even one in a later call. Seeding
//     clears it.
//   PyTorch computes the n >= 16 case in one of several ways, picked at run
//   time by CPU capability (torch.backends.cpu.get_cpu_capability(), which the
//   ATEN_CPU_CAPABILITY environment variable overrides):
//     AVX2:    8-lane cephes polynomials for log and sincos, the final
//              x * std + mean fused                      -> NormalKernel::kAvx2
//     DEFAULT: the C library's logf/cosf/sinf, the final multiply and add
//              rounded separately (x86 builds)           -> NormalKernel::kLibm
//     AVX512:  yet another variant that neither kernel reproduces; with
//              ATEN_CPU_CAPABILITY=avx2 such a CPU runs the AVX2 one.
//   Both kernels were checked bit for bit against PyTorch 1.13 and 2.11.
//   kAvx2 reproduces the cephes code lane by lane, including every place
//   where the compiler fused a multiply into the following add. Each kernel
//   spells its fused multiply-adds out with std::fma and leaves no plain
//   multiply feeding an add, so no compiler flag (-march=native, FMA
//   contraction) can change its bits.
// - state()/restore() capture everything that determines future draws (the
//   624 MT words, the position in them and the kept normal), as a plain struct
//   that checkpoints can store byte for byte.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "utils.h"

namespace llmc {

constexpr int kMtStateWords = 624;
constexpr double kPi = 3.14159265358979323846;

enum class NormalKernel {
  kAvx2,  // PyTorch with CPU capability AVX2: cephes log/sincos
  kLibm,  // PyTorch on x86 with capability DEFAULT: C library logf/cosf/sinf
};

inline const char* normal_kernel_name(NormalKernel kernel) {
  return kernel == NormalKernel::kAvx2 ? "avx2" : "libm";
}

// `flag` names the command-line flag the name came from, for the error message.
inline NormalKernel parse_normal_kernel(const std::string& name, const char* flag) {
  if (name == "avx2") return NormalKernel::kAvx2;
  if (name == "libm") return NormalKernel::kLibm;
  LLMC_FAIL("unknown normal kernel '%s' for %s: use avx2 or libm (PyTorch's CPU capability "
            "AVX2 or DEFAULT)", name.c_str(), flag);
}

struct RngState {
  uint32_t words[kMtStateWords];
  uint32_t position;           // next word to temper; kMtStateWords means regenerate first
  uint32_t has_kept_normal;    // 0 or 1
  double kept_normal;          // second value of the last scalar Box-Muller pair (mean 0, std 1)
};

namespace detail {

inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

inline float float_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// Natural log for x in (0, 1], evaluated exactly as PyTorch's AVX2 build does:
// cephes logf (frexp, a degree-8 polynomial, the exponent added in two parts),
// with fused multiply-adds wherever GCC contracted a multiply whose only use
// is an add. Inputs here are never zero, negative or subnormal.
inline float log_avx2(float x) {
  const uint32_t bits = float_bits(x);
  float exponent = (float)((int)(bits >> 23) - 127) + 1.0f;
  float m = float_from_bits((bits & ~0x7f800000u) | float_bits(0.5f));  // in [0.5, 1)
  // Map the mantissa to [sqrt(1/2) - 1, sqrt(2) - 1) so the polynomial stays accurate.
  const bool below_sqrt_half = m < 0.707106781186547524f;
  const float extra = below_sqrt_half ? m : 0.0f;
  m = m - 1.0f;
  exponent = exponent - (below_sqrt_half ? 1.0f : 0.0f);
  m = m + extra;
  const float m2 = m * m;
  float y = 7.0376836292e-2f;
  y = std::fma(y, m, -1.1514610310e-1f);
  y = std::fma(y, m, 1.1676998740e-1f);
  y = std::fma(y, m, -1.2420140846e-1f);
  y = std::fma(y, m, 1.4249322787e-1f);
  y = std::fma(y, m, -1.6668057665e-1f);
  y = std::fma(y, m, 2.0000714765e-1f);
  y = std::fma(y, m, -2.4999993993e-1f);
  y = std::fma(y, m, 3.3333331174e-1f);
  y = y * m;
  y = std::fma(y, m2, exponent * -2.12194440e-4f);
  y = std::fma(-m2, 0.5f, y);
  return std::fma(exponent, 0.693359375f, m + y);
}

// sin and cos for x >= 0, evaluated exactly as PyTorch's AVX2 build does:
// cephes sincosf (octant reduction by 4/pi, pi/4 split in three parts, one
// polynomial for sin and one for cos on [-pi/4, pi/4]).
inline void sincos_avx2(float x, float* sin_out, float* cos_out) {
  const int octant = ((int)(x * 1.27323954473516f) + 1) & ~1;
  const float y = (float)octant;
  x = std::fma(y, -0.78515625f, x);
  x = std::fma(y, -2.4187564849853515625e-4f, x);
  x = std::fma(y, -3.77489497744594108e-8f, x);
  const float x2 = x * x;
  float cos_poly = 2.443315711809948e-5f;
  cos_poly = std::fma(cos_poly, x2, -1.388731625493765e-3f);
  cos_poly = std::fma(cos_poly, x2, 4.166664568298827e-2f);
  cos_poly = cos_poly * x2;
  cos_poly = std::fma(cos_poly, x2, -(x2 * 0.5f));
  cos_poly = cos_poly + 1.0f;
  float sin_poly = -1.9515295891e-4f;
  sin_poly = std::fma(sin_poly, x2, 8.3321608736e-3f);
  sin_poly = std::fma(sin_poly, x2, -1.6666654611e-1f);
  sin_poly = sin_poly * x2;
  sin_poly = std::fma(sin_poly, x, x);
  const bool polys_swapped = (octant & 2) != 0;
  float s = polys_swapped ? cos_poly : sin_poly;
  float c = polys_swapped ? sin_poly : cos_poly;
  if (octant & 4) s = -s;
  if (((octant - 2) & 4) == 0) c = -c;
  *sin_out = s;
  *cos_out = c;
}

// p + mean rounded once, written as an fma with factor 1 (exact: p * 1 = p) so
// that no compiler fuses the multiply that produced p into this add.
inline float add_unfused(float p, float mean) { return std::fma(p, 1.0f, mean); }

// The 16-wide Box-Muller step on uniforms in [0, 1): lanes k and k + 8 become
// one pair of normals.
inline void box_muller16(float* x, float mean, float std, NormalKernel kernel) {
  const float two_pi = (float)(2.0 * kPi);
  for (int k = 0; k < 8; k++) {
    const float u1 = 1.0f - x[k];  // (0, 1]: log never sees zero
    const float u2 = x[k + 8];
    float radius, s, c;
    if (kernel == NormalKernel::kAvx2) {
      radius = std::sqrt(-2.0f * log_avx2(u1));
      sincos_avx2(two_pi * u2, &s, &c);
    } else {
      radius = std::sqrt(-2.0f * std::log(u1));
      // PyTorch forms the angle in double and rounds it to float.
      const float theta = (float)(2.0 * kPi * (double)u2);
      s = std::sin(theta);
      c = std::cos(theta);
    }
    if (kernel == NormalKernel::kAvx2) {
      x[k] = std::fma(radius * c, std, mean);
      x[k + 8] = std::fma(radius * s, std, mean);
    } else {
      x[k] = add_unfused(radius * c * std, mean);
      x[k + 8] = add_unfused(radius * s * std, mean);
    }
  }
}

}  // namespace detail

class Rng {
 public:
  explicit Rng(uint64_t seed) { this->seed(seed); }

  // torch.manual_seed(seed): init_genrand with the low 32 bits.
  void seed(uint64_t seed) {
    s_.words[0] = (uint32_t)seed;
    for (uint32_t i = 1; i < kMtStateWords; i++) {
      const uint32_t prev = s_.words[i - 1];
      s_.words[i] = 1812433253u * (prev ^ (prev >> 30)) + i;
    }
    s_.position = kMtStateWords;
    s_.has_kept_normal = 0;
    s_.kept_normal = 0.0;
  }

  uint32_t u32() {
    if (s_.position >= (uint32_t)kMtStateWords) regenerate();
    uint32_t y = s_.words[s_.position++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }

  // PyTorch's 64-bit draw: the first u32 is the high half.
  uint64_t u64() {
    const uint64_t high = u32();
    return (high << 32) | u32();
  }

  float uniform_float() { return (float)(u32() & 0xffffffu) * (1.0f / 16777216.0f); }

  double uniform_double() {
    return (double)(u64() & 0x1fffffffffffffull) * (1.0 / 9007199254740992.0);
  }

  // One standard normal from PyTorch's scalar double path (with the kept
  // second value of a pair), before mean and std are applied.
  double standard_normal_double() {
    if (s_.has_kept_normal) {
      s_.has_kept_normal = 0;
      return s_.kept_normal;
    }
    const double u1 = uniform_double();
    const double u2 = uniform_double();
    const double radius = std::sqrt(-2.0 * std::log(1.0 - u2));
    const double theta = 2.0 * kPi * u1;
    s_.kept_normal = radius * std::sin(theta);
    s_.has_kept_normal = 1;
    return radius * std::cos(theta);
  }

  // torch.empty(n).normal_(mean, std) after the same draws from this generator.
  // mean and std are doubles because PyTorch's scalar path uses them unrounded;
  // its 16-wide path rounds them to float first.
  void normal(float* out, size_t n, double mean, double std,
              NormalKernel kernel = NormalKernel::kAvx2) {
    if (n < 16) {
      for (size_t i = 0; i < n; i++) {
        const double z = standard_normal_double();
        // Compiled for AVX2, PyTorch's z * std + mean is fused.
        out[i] = kernel == NormalKernel::kAvx2 ? (float)std::fma(z, std, mean)
                                               : (float)std::fma(z * std, 1.0, mean);
      }
      return;
    }
    const float mean_f = (float)mean, std_f = (float)std;
    for (size_t i = 0; i < n; i++) out[i] = uniform_float();
    // Blocks are independent once the uniforms are drawn, so threads cannot
    // change the result; a GPT-2 1.5B initialisation is 1.6e9 values.
    const long num_blocks = (long)(n / 16);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (num_blocks >= 4096)
#endif
    for (long block = 0; block < num_blocks; block++) {
      detail::box_muller16(out + block * 16, mean_f, std_f, kernel);
    }
    if (n % 16 != 0) {
      float* tail = out + n - 16;
      for (int i = 0; i < 16; i++) tail[i] = uniform_float();
      detail::box_muller16(tail, mean_f, std_f, kernel);
    }
  }

  // torch.empty(n).uniform_(from, to) after the same draws: x * (to - from) + from in float, x
  // one uniform_float() each, from and to rounded to float first. PyTorch's AVX2 build fuses the
  // multiply-add (kAvx2), its DEFAULT one does not (kLibm), as for normal().
  void uniform(float* out, size_t n, double from, double to, NormalKernel kernel = NormalKernel::kAvx2) {
    const float low = (float)from, range = (float)to - low;
    for (size_t i = 0; i < n; i++) {
      const float x = uniform_float();
      out[i] = kernel == NormalKernel::kAvx2 ? std::fma(x, range, low) : detail::add_unfused(x * range, low);
    }
  }

  const RngState& state() const { return s_; }

  void restore(const RngState& state) {
    if (state.position > (uint32_t)kMtStateWords || state.has_kept_normal > 1) {
      LLMC_FAIL("corrupt RNG state (position %u of %d, kept-normal flag %u): the checkpoint "
                "holding it is damaged; resume from another checkpoint",
                state.position, kMtStateWords, state.has_kept_normal);
    }
    s_ = state;
  }

 private:
  // The standard MT19937 twist of all 624 words, split where the neighbours
  // wrap around so no index needs a modulo.
  void regenerate() {
    constexpr int n = kMtStateWords, m = 397;
    uint32_t* w = s_.words;
    auto twist = [](uint32_t upper, uint32_t lower, uint32_t far) {
      const uint32_t y = (upper & 0x80000000u) | (lower & 0x7fffffffu);
      return far ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    };
    int i = 0;
    for (; i < n - m; i++) w[i] = twist(w[i], w[i + 1], w[i + m]);
    for (; i < n - 1; i++) w[i] = twist(w[i], w[i + 1], w[i + m - n]);
    w[n - 1] = twist(w[n - 1], w[0], w[m - 1]);
    s_.position = 0;
  }

  RngState s_;
};

// SPEC.md permutation(n): start from 0..n-1; for i = n-1 down to 1, swap a[i]
// with a[u32() % (i + 1)].
inline std::vector<int> random_permutation(Rng& rng, int n) {
  std::vector<int> order(n > 0 ? n : 0);
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = n - 1; i >= 1; i--) {
    const uint32_t j = rng.u32() % (uint32_t)(i + 1);
    const int swapped = order[i];
    order[i] = order[j];
    order[j] = swapped;
  }
  return order;
}

}  // namespace llmc
