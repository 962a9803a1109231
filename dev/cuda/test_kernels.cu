// The kernel tests of dev/cuda/test_*.cu as one program, so that the trainer is compiled once for
// all of them (once a precision: build/test_kernels, BF16, and build/test_kernels_fp32):
//   build/test_kernels [--list | SUITE...]   (no SUITE: every suite, in the order below)
// Each suite is its file's namespace and run(), and ends with its own line of counts; the exit
// status is 1 when any check failed (kernel_test.h: run_kernel_suites).
#include "dev/cuda/kernel_test.h"

#include "dev/cuda/test_attention.cu"
#include "dev/cuda/test_classifier.cu"
#include "dev/cuda/test_composed_attention.cu"
#include "dev/cuda/test_encoder.cu"
#include "dev/cuda/test_fp8.cu"
#include "dev/cuda/test_fp8_mlp.cu"
#include "dev/cuda/test_gelu.cu"
#include "dev/cuda/test_gemm.cu"
#include "dev/cuda/test_host_copy.cu"
#include "dev/cuda/test_layernorm.cu"
#include "dev/cuda/test_matmul.cu"
#include "dev/cuda/test_mudd_connections.cu"
#include "dev/cuda/test_muon.cu"
#include "dev/cuda/test_optimizer.cu"
#include "dev/cuda/test_qk_rotary.cu"
#include "dev/cuda/test_rmsnorm.cu"
#include "dev/cuda/test_smear_bigram.cu"
#include "dev/cuda/test_sparse_rows.cu"
#include "dev/cuda/test_speedrun_steps.cu"

int main(int argc, char** argv) {
  const std::vector<KernelSuite> suites = {
      {"attention", attention_tests::run},
      {"classifier", classifier_tests::run},
      {"composed_attention", composed_attention_tests::run},
      {"encoder", encoder_tests::run},
      {"fp8", fp8_tests::run, fp8_tests::kComputeCapability},
      {"fp8_mlp", fp8_mlp_tests::run, fp8_tests::kComputeCapability},  // the FP32 build runs nothing
      {"gelu", gelu_tests::run},
      {"gemm", gemm_tests::run},
      {"host_copy", host_copy_tests::run},
      {"layernorm", layernorm_tests::run},
      {"matmul", matmul_tests::run},
      {"mudd_connections", mudd_connections_tests::run},
      {"muon", muon_tests::run},
      {"optimizer", optimizer_tests::run},
      {"qk_rotary", qk_rotary_tests::run},
      {"rmsnorm", rmsnorm_tests::run},
      {"smear_bigram", smear_bigram_tests::run},
      {"sparse_rows", sparse_rows_tests::run},
      {"speedrun_steps", speedrun_steps_tests::run},
  };
  return run_kernel_suites(suites, argc, argv);
}
