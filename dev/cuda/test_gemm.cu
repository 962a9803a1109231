// Tests gemm (section 6 of train_gpt2.cu), the Hopper product with an epilogue: out[M, N] =
// a[M, K] op(b) against cpu::matmul_forward, with b[N, K] (op(b) = b^T, the forward products) and
// b[K, N] (op(b) = b, the input-gradient products), at the speedrun's layer shapes over 2,048 tokens
// and at odd shapes whose rows, columns and depth end inside a tile (one row; N = 264, past one
// 256-column tile; K = 136, two 64-deep steps and a part), and 400 tiles of one step (three or four
// for each block of the persistent grid, through its one staging buffer). The epilogues against the
// passes they replace, bit for bit: GemmStoreRelu2's pre holds GemmStore's bits and its out
// relu2_forward's of them (and with pre null, -mr 1's, the same out); GemmStoreRelu2Grad's out is
// GemmStore's bits through activation_backward_inplace's ReLU^2 pass, or from_output (-mr 1) through
// relu2_backward_from_output_inplace's; each call twice for the same bits, outputs poisoned
// first. At the trainer's MLP shapes, the bits of cuBLASLt's products. BF16 builds on Hopper GPUs
// with an sm_90a build only: elsewhere the test says that it skips.
#include "dev/cuda/kernel_test.h"

namespace gemm_tests {

#if !defined(ENABLE_FP32)
using flash::GemmB;

struct GemmCase {
  const char* name;
  int M, N, K;
};

// b[N, K] as b[K, N].
std::vector<float> transposed(const std::vector<float>& b, int N, int K) {
  std::vector<float> t(b.size());
  for (int n = 0; n < N; n++) {
    for (int k = 0; k < K; k++) t[(size_t)k * N + n] = b[(size_t)n * K + k];
  }
  return t;
}

template <GemmB kB>
void test_gemm(const GemmCase& g, llmc::Rng& rng) {
  printf("\ngemm %s, b[%s]: M=%d N=%d K=%d\n", g.name, kB == GemmB::kNK ? "N, K" : "K, N", g.M, g.N, g.K);
  const size_t n_out = (size_t)g.M * g.N;
  // b of std 1/sqrt(K) keeps the outputs near unit size, where ReLU^2 is curved.
  const std::vector<float> a = random_stored(rng, (size_t)g.M * g.K, 0.0f, 1.0f);
  const std::vector<float> b = random_stored(rng, (size_t)g.N * g.K, 0.0f, 1.0f / sqrtf(g.K));
  const std::vector<float> pre_values = random_stored(rng, n_out, 0.0f, 1.0f);
  DeviceArray<floatX> d_a(a), d_b(kB == GemmB::kNK ? b : transposed(b, g.N, g.K)), d_pre(pre_values);
  DeviceArray<floatX> out(n_out), pre(n_out), act(n_out), expected(n_out);
  std::vector<float> ref(n_out);
  cpu::matmul_forward(ref.data(), a.data(), b.data(), nullptr, g.M, g.K, g.N);

  auto plain = [&] {
    out.poison();
    flash::gemm<kB>(d_a, d_b, g.M, g.N, g.K, flash::GemmStore{out}, 0);
  };
  plain();
  check_close("out", out.download(), ref, kTolSum);
  const Snapshot out_bits(out);
  plain();
  check_same_bits("out twice", out_bits, Snapshot(out));

  auto relu2 = [&] {
    pre.poison();
    act.poison();
    flash::gemm<kB>(d_a, d_b, g.M, g.N, g.K, flash::GemmStoreRelu2{pre, act}, 0);
  };
  relu2();
  check_same_bits("ReLU^2: pre = out", out_bits, Snapshot(pre));
  relu2_forward(expected, out, n_out, 0);
  check_same_bits("ReLU^2 = relu2_forward", Snapshot(expected), Snapshot(act));
  const Snapshot relu2_bits(pre, act);
  relu2();
  check_same_bits("ReLU^2 twice", relu2_bits, Snapshot(pre, act));
  act.poison();
  flash::gemm<kB>(d_a, d_b, g.M, g.N, g.K, flash::GemmStoreRelu2{nullptr, act}, 0);
  check_same_bits("ReLU^2 without pre (-mr 1) = relu2_forward", Snapshot(expected), Snapshot(act));

  auto relu2_grad = [&] {
    act.poison();
    flash::gemm<kB>(d_a, d_b, g.M, g.N, g.K, flash::GemmStoreRelu2Grad{d_pre, act}, 0);
  };
  relu2_grad();
  expected.upload(out.download());
  activation_backward_inplace(Activation::kRelu2, expected, d_pre, n_out, 0);
  check_same_bits("ReLU^2' = its pass", Snapshot(expected), Snapshot(act));
  const Snapshot grad_bits(act);
  relu2_grad();
  check_same_bits("ReLU^2' twice", grad_bits, Snapshot(act));

  // From ReLU^2's stored output (-mr 1): here pre's values squared, as relu2_forward stores them.
  DeviceArray<floatX> d_post(n_out);
  relu2_forward(d_post, d_pre, n_out, 0);
  auto relu2_grad_from_output = [&] {
    act.poison();
    flash::gemm<kB>(d_a, d_b, g.M, g.N, g.K, flash::GemmStoreRelu2Grad{d_post, act, true}, 0);
  };
  relu2_grad_from_output();
  expected.upload(out.download());
  relu2_backward_from_output_inplace(expected, d_post, n_out, 0);
  check_same_bits("ReLU^2' from its output = its pass", Snapshot(expected), Snapshot(act));
  const Snapshot from_output_bits(act);
  relu2_grad_from_output();
  check_same_bits("ReLU^2' from its output twice", from_output_bits, Snapshot(act));
}

// The two products the trainer's MLP takes from gemm, at its micro step of 49,152 tokens, against
// cuBLASLt's (matmul_forward, matmul_dinp_product, whose choice of algorithm keeps the first
// heuristic's bits): fc's forward and fcproj's input gradient. The same bits, so that the choice
// between them changes no result of the trainer.
void test_cublaslt_bits(llmc::Rng& rng) {
  const int N = 49152, C = 768;
  printf("\ngemm against cuBLASLt, N=%d C=%d\n", N, C);
  DeviceArray<floatX> inp(random_stored(rng, (size_t)N * C, 0.0f, 1.0f));
  DeviceArray<floatX> weight(random_stored(rng, (size_t)4 * C * C, 0.0f, 1.0f / sqrtf(C)));
  DeviceArray<floatX> ours((size_t)N * 4 * C), theirs((size_t)N * 4 * C);
  ours.poison();
  theirs.poison();
  flash::gemm<GemmB::kNK>(inp, weight, N, 4 * C, C, flash::GemmStore{ours}, 0);
  matmul_forward(theirs, inp, weight, nullptr, N, C, 4 * C, nullptr, 0);
  check_same_bits("fc forward = cuBLASLt's", Snapshot(theirs), Snapshot(ours));
  ours.poison();
  theirs.poison();
  flash::gemm<GemmB::kKN>(inp, weight, N, 4 * C, C, flash::GemmStore{ours}, 0);
  matmul_dinp_product(theirs, weight, false, inp, nullptr, N, 4 * C, C, MatmulOperands(), 0);
  check_same_bits("fcproj input gradient = cuBLASLt's", Snapshot(theirs), Snapshot(ours));
}
#endif

void run() {
#if defined(ENABLE_FP32)
  printf("\nskip gemm: its products are BF16 (the BF16 build's)\n");
#else
  if (!flash::hopper_support().usable) {
    printf("\nskip gemm: it needs an sm_90a build on a Hopper GPU\n");
    return;
  }
  llmc::Rng rng(31);
  const GemmCase cases[] = {
      {"one row", 1, 8, 8},
      {"odd", 200, 264, 136},
      {"one step", 300, 512, 64},
      {"three tiles a block", 51200, 256, 64},
      {"qkv", 2048, 2304, 768},
      {"fc", 2048, 3072, 768},
      {"fcproj", 2048, 768, 3072},
  };
  for (const GemmCase& g : cases) test_gemm<GemmB::kNK>(g, rng);
  for (const GemmCase& g : cases) test_gemm<GemmB::kKN>(g, rng);
  test_cublaslt_bits(rng);
#endif
}

}  // namespace gemm_tests
