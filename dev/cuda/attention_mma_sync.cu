// The attention suites of the kernel tests alone, as build/test_attention_mma_sync: built for the
// plain compute capability, without sm_90a's wgmma, it tests the mma.sync path of the flash kernels
// and of the composed attention's tile forward (GPUs before Hopper) on any GPU. Alone, it compiles
// faster than every suite would.
#include "dev/cuda/kernel_test.h"

#include "dev/cuda/test_attention.cu"
#include "dev/cuda/test_composed_attention.cu"

int main(int argc, char** argv) {
  return run_kernel_suites(
      {{"attention", attention_tests::run}, {"composed_attention", composed_attention_tests::run}}, argc, argv);
}
