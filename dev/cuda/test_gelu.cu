// Tests gelu_forward and gelu_backward_inplace (the fallbacks of the matmul's GELU epilogues and
// the recomputation of -r 1) against cpu::gelu_forward / cpu::gelu_backward: inputs of std 2 so
// both tails are covered, sizes of whole and partial launch blocks, the forward output poisoned
// first, and both kernels run twice for identical bits.
#include "dev/cuda/kernel_test.h"

void test_gelu(size_t n, llmc::Rng& rng) {
  printf("\ngelu n=%zu\n", n);
  const std::vector<float> inp = random_stored(rng, n, 0.0f, 2.0f);
  DeviceArray<floatX> d_inp(inp), out(n);
  std::vector<float> ref(n);
  cpu::gelu_forward(ref.data(), inp.data(), n);
  auto forward = [&] {
    out.poison();
    gelu_forward(out, d_inp, n, 0);
  };
  forward();
  check_close("forward out", out.download(), ref, kTolStore);
  const Snapshot forward_bits(out);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out));

  // In place: the gradient of GELU's output becomes the gradient of its input.
  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  DeviceArray<floatX> d(n);
  auto backward = [&] {
    d.upload(dout);
    gelu_backward_inplace(d, d_inp, n, 0);
  };
  backward();
  std::vector<float> ref_dinp(n, 0.0f);
  cpu::gelu_backward(ref_dinp.data(), inp.data(), dout.data(), n);
  check_close("backward dinp", d.download(), ref_dinp, kTolStore);
  const Snapshot backward_bits(d);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(d));
}

int main() {
  return run_kernel_tests("test_gelu", [] {
    llmc::Rng rng(11);
    test_gelu((size_t)4 * 64 * 4 * 768, rng);    // GPT-2 small fch
    test_gelu((size_t)3 * 100 * 4 * 1600, rng);  // d48 fch, T=100
    test_gelu((size_t)8 * 12347, rng);           // the last launch block partly used
  });
}
