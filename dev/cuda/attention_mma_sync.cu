// The attention suite of the kernel tests alone, as build/test_attention_mma_sync: built for the
// plain compute capability, without sm_90a's wgmma, it tests the flash kernels' mma.sync path
// (GPUs before Hopper) on any GPU. Alone, it compiles faster than every suite would.
#include "dev/cuda/kernel_test.h"

#include "dev/cuda/test_attention.cu"

int main(int argc, char** argv) {
  return run_kernel_suites({{"attention", attention_tests::run}}, argc, argv);
}
