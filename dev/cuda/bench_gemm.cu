// Times gemm (section 6 of train_gpt2.cu) against cuBLASLt (its algorithm tuned as the trainer's)
// at the speedrun's block products over one micro step's tokens: the forward products (a b^T:
// matmul_forward) and the input-gradient ones (dout b: matmul_dinp_product) of qkv (C -> 3C), the
// attention projection (C -> C), fc (C -> 4C) and fcproj (4C -> C); then the two products whose
// ReLU^2 pass the epilogue takes: fc's forward (cuBLASLt + relu2_forward) and fcproj's input
// gradient (cuBLASLt + activation_backward_inplace). Prints the median ms and TFLOP/s of each.
// BF16 builds on Hopper GPUs with an sm_90a build.
//   build/bench_kernels gemm [tokens [reps]]   (default 49152 50)
#include "dev/cuda/kernel_test.h"

namespace gemm_bench {

using flash::GemmB;

void print_row(const char* name, double flops, float lt, float ours) {
  printf("%-16s %12.3f %9.1f %12.3f %9.1f %7.3f\n", name, lt, flops / lt * 1e-9, ours, flops / ours * 1e-9, lt / ours);
}

int run(int argc, char** argv) {
  const int tokens = argc > 1 ? atoi(argv[1]) : 49152, reps = argc > 2 ? atoi(argv[2]) : 50;
  REQUIRE(tokens > 0 && reps > 0, "give positive tokens and reps: [tokens [reps]]");
  REQUIRE(flash::hopper_support().usable, "needs an sm_90a build on a Hopper GPU");
  matmul_setup(false);
  const int C = 768;
  const size_t widest = (size_t)tokens * 4 * C;
  llmc::Rng rng(5);
  DeviceArray<floatX> inp(random_stored(rng, widest, 0.0f, 1.0f)), pre(random_stored(rng, widest, 0.0f, 1.0f));
  DeviceArray<floatX> weight(random_stored(rng, (size_t)4 * C * C, 0.0f, 1.0f / sqrtf(C)));
  DeviceArray<floatX> out(widest), act(widest);
  struct Shape {
    const char* name;
    int in, out;
  };
  const Shape shapes[] = {{"qkv", C, 3 * C}, {"attproj", C, C}, {"fc", C, 4 * C}, {"fcproj", 4 * C, C}};
  printf("%-16s %12s %9s %12s %9s %7s\n", "product", "cuBLASLt ms", "TFLOP/s", "gemm ms", "TFLOP/s", "ratio");
  for (const Shape& s : shapes) {
    const double flops = 2.0 * tokens * s.in * s.out;
    const float lt = median_launch_ms(reps, 5, [&](int) {
      matmul_forward(out, inp, weight, nullptr, tokens, s.in, s.out, nullptr, 0);
    });
    const float ours = median_launch_ms(reps, 5, [&](int) {
      flash::gemm<GemmB::kNK>(inp, weight, tokens, s.out, s.in, flash::GemmStore{out}, 0);
    });
    print_row((std::string(s.name) + " forward").c_str(), flops, lt, ours);
    const float lt_dinp = median_launch_ms(reps, 5, [&](int) {
      matmul_dinp_product(out, weight, false, inp, nullptr, tokens, s.in, s.out, MatmulOperands(), 0);
    });
    const float ours_dinp = median_launch_ms(reps, 5, [&](int) {
      flash::gemm<GemmB::kKN>(inp, weight, tokens, s.in, s.out, flash::GemmStore{out}, 0);
    });
    print_row((std::string(s.name) + " dinp").c_str(), flops, lt_dinp, ours_dinp);
  }
  const double mlp_flops = 2.0 * tokens * C * 4 * C;
  const float lt_fc = median_launch_ms(reps, 5, [&](int) {
    matmul_forward(out, inp, weight, nullptr, tokens, C, 4 * C, nullptr, 0);
    relu2_forward(act, out, widest, 0);
  });
  const float ours_fc = median_launch_ms(reps, 5, [&](int) {
    flash::gemm<GemmB::kNK>(inp, weight, tokens, 4 * C, C, flash::GemmStoreRelu2{out, act}, 0);
  });
  print_row("fc + ReLU^2", mlp_flops, lt_fc, ours_fc);
  const float lt_grad = median_launch_ms(reps, 5, [&](int) {
    matmul_dinp_product(out, weight, false, inp, nullptr, tokens, 4 * C, C, MatmulOperands(), 0);
    activation_backward_inplace(Activation::kRelu2, out, pre, widest, 0);
  });
  const float ours_grad = median_launch_ms(reps, 5, [&](int) {
    flash::gemm<GemmB::kKN>(inp, weight, tokens, 4 * C, C, flash::GemmStoreRelu2Grad{pre, out}, 0);
  });
  print_row("fcproj dinp + ReLU^2'", mlp_flops, lt_grad, ours_grad);
  matmul_teardown();
  return 0;
}

}  // namespace gemm_bench
