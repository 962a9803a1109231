// Tests matmul_forward (plain, with bias, with the GELU epilogue with and without bias) and
// matmul_backward (with and without bias, with and without the GELU gradient of pre_gelu) against
// cpu::matmul_forward / cpu::matmul_backward and cpu::gelu_forward / cpu::gelu_backward: the
// GPT-2 small and d48 layer shapes, the lm head over the padded vocabulary (Vp = 50304), and a
// small odd shape; weight and bias gradients accumulated onto random non-zero ones, dinp and
// the forward outputs poisoned first, every call run twice for identical bits, and once more
// with cuBLASLt's first heuristic in place of the algorithm tuning chose, for the same bits.
#include "dev/cuda/kernel_test.h"

namespace matmul_tests {

// Products are FP32 sums of up to 50304 terms in cuBLAS's own order, held to kTolSum. cuBLASLt's
// GELU epilogues (tanh approximation) need not evaluate tanh as tanhf does: a fast tanh (the
// hardware's has relative error ~2^-11) has its error multiplied by up to ~10 in GELU's
// derivative near |x| = 4, which alone stays under 5e-3.
#if defined(ENABLE_FP32)
constexpr float kTolGelu = 1e-2f;
#else
// Plus, in the fallback path, GELU of the stored pre-activation (or gradient): two roundings to
// nearest instead of one, 2 * 2^-8.
constexpr float kTolGelu = 2e-2f;
#endif

void test_matmul(const MatmulCase& m, llmc::Rng& rng) {
  const int N = m.N, C = m.C, OC = m.OC;
  m.print("matmul");
  // Weights of std 1/sqrt(C) keep the outputs near unit size, where GELU is curved.
  const std::vector<float> inp = random_stored(rng, (size_t)N * C, 0.0f, 1.0f);
  const std::vector<float> weight = random_stored(rng, (size_t)OC * C, 0.0f, 1.0f / sqrtf(C));
  const std::vector<float> bias = random_stored(rng, OC, 0.0f, 1.0f);
  DeviceArray<floatX> d_inp(inp), d_weight(weight), d_bias(bias);
  floatX* bias_ptr = m.bias ? (floatX*)d_bias : nullptr;

  std::vector<float> ref((size_t)N * OC);
  cpu::matmul_forward(ref.data(), inp.data(), weight.data(), m.bias ? bias.data() : nullptr, N, C,
                      OC);
  DeviceArray<floatX> out(ref.size()), pre(ref.size());
  auto forward = [&] {
    out.poison();
    pre.poison();
    matmul_forward(out, d_inp, d_weight, bias_ptr, N, C, OC, m.gelu_out ? (floatX*)pre : nullptr,
                   0);
  };
  forward();
  if (m.gelu_out) {
    std::vector<float> ref_gelu(ref.size());
    cpu::gelu_forward(ref_gelu.data(), ref.data(), ref.size());
    check_close("forward pre_gelu", pre.download(), ref, kTolSum);
    check_close("forward out = GELU", out.download(), ref_gelu, kTolGelu);
  } else {
    check_close("forward out", out.download(), ref, kTolSum);
  }
  const Snapshot forward_bits(out, pre);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out, pre));
  // The first call chose among cuBLASLt's candidates by time: its bits are the first heuristic's.
  matmul_tuning = false;
  forward();
  matmul_tuning = true;
  check_same_bits("forward tuned = heuristic", forward_bits, Snapshot(out, pre));

  const std::vector<float> dout = random_stored(rng, (size_t)N * OC, 0.0f, 1.0f);
  const std::vector<float> pre_gelu = random_stored(rng, (size_t)N * C, 0.0f, 1.5f);
  const std::vector<float> dweight0 = random_stored(rng, (size_t)OC * C, 0.0f, 1.0f);
  const std::vector<float> dbias0 = random_stored(rng, OC, 0.0f, 1.0f);
  DeviceArray<floatX> d_dout(dout), d_pre_gelu(pre_gelu), dinp(inp.size());
  DeviceArray<floatX> dweight(dweight0.size()), dbias(dbias0.size());
  DeviceArray<float> partials((size_t)kRowBlocks * OC);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    dinp.poison();
    dweight.upload(dweight0);
    dbias.upload(dbias0);
    matmul_backward(dinp, dweight, m.bias ? (floatX*)dbias : nullptr, partials, d_dout, d_inp,
                    d_weight, m.gelu_in ? (floatX*)d_pre_gelu : nullptr, N, C, OC, seed, 0);
  };
  backward();
  std::vector<float> ref_dinp(inp.size(), 0.0f), ref_dweight = dweight0, ref_dbias = dbias0;
  cpu::matmul_backward(ref_dinp.data(), ref_dweight.data(), m.bias ? ref_dbias.data() : nullptr,
                       dout.data(), inp.data(), weight.data(), N, C, OC);
  if (m.gelu_in) {
    std::vector<float> ref_dpre(inp.size(), 0.0f);
    cpu::gelu_backward(ref_dpre.data(), pre_gelu.data(), ref_dinp.data(), ref_dpre.size());
    check_close("backward dinp (dGELU)", dinp.download(), ref_dpre, kTolGelu);
  } else {
    check_close("backward dinp", dinp.download(), ref_dinp, kTolSum);
  }
  check_close("backward dweight", dweight.download(), ref_dweight, kTolSum);
  if (m.bias) check_close("backward dbias", dbias.download(), ref_dbias, kTolSum);
  const Snapshot backward_bits(dinp, dweight, dbias);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dinp, dweight, dbias));
  matmul_tuning = false;
  backward();
  matmul_tuning = true;
  check_same_bits("backward tuned = heuristic", backward_bits, Snapshot(dinp, dweight, dbias));
}

// At training sizes cuBLASLt offers several candidates (8 for GPT-2 small's fc products): the
// choice tuning makes among them keeps the first heuristic's bits.
void test_tuned_bits(const char* name, int N, int C, int OC, llmc::Rng& rng) {
  printf("\ntuned algorithms, %s: N=%d C=%d OC=%d\n", name, N, C, OC);
  DeviceArray<floatX> inp(random_stored(rng, (size_t)N * C, 0.0f, 1.0f));
  DeviceArray<floatX> weight(random_stored(rng, (size_t)OC * C, 0.0f, 1.0f / sqrtf(C)));
  DeviceArray<floatX> bias(random_stored(rng, OC, 0.0f, 1.0f));
  DeviceArray<floatX> dout(random_stored(rng, (size_t)N * OC, 0.0f, 1.0f));
  DeviceArray<floatX> out((size_t)N * OC), pre((size_t)N * OC), dinp((size_t)N * C), dweight((size_t)OC * C);
  DeviceArray<float> partials((size_t)kRowBlocks * OC);
  auto run = [&](bool tuning) {
    matmul_tuning = tuning;
    matmul_forward(out, inp, weight, bias, N, C, OC, pre, 0);
    // The input gradient of a product whose input was a GELU output, with its pre-activation.
    matmul_backward(dinp, dweight, nullptr, partials, out, inp, weight, inp, N, C, OC, 0, 0);
    matmul_tuning = true;
    return Snapshot(out, pre, dinp);
  };
  const Snapshot tuned = run(true);
  check_same_bits("tuned = heuristic", tuned, run(false));
}

void run() {
  llmc::Rng rng(7);
  const MatmulCase cases[] = {
      {"qkv, GPT-2 small", 4 * 64, 768, 3 * 768, true, false, false},
      {"fc, GPT-2 small", 3 * 100, 768, 4 * 768, true, true, false},
      {"fcproj, GPT-2 small", 3 * 100, 4 * 768, 768, true, false, true},
      {"attproj, d48", 2 * 100, 1600, 1600, true, false, false},
      {"fc, d48", 64, 1600, 4 * 1600, true, true, false},
      {"lm head, padded vocab", 100, 768, 50304, false, false, false},
      {"odd, no bias", 37, 136, 72, false, true, true},
  };
  for (const MatmulCase& m : cases) test_matmul(m, rng);
  test_tuned_bits("fc, GPT-2 small", 16384, 768, 4 * 768, rng);
  test_tuned_bits("fcproj, GPT-2 small", 16384, 4 * 768, 768, rng);
}

}  // namespace matmul_tests
