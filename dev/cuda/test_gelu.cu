// Tests the MLP's activations: gelu_forward and gelu_backward_inplace (the fallbacks of the
// matmul's GELU epilogues and the recomputation of -r 1) against cpu::gelu_forward /
// cpu::gelu_backward, and relu2_forward and relu2_backward_inplace (the modern architecture's
// relu(x)^2) against a reference written here (the CPU trainer has GELU only): inputs of std 2 so
// both tails (and ReLU's zero side) are covered, sizes of whole and partial launch blocks, the
// forward output poisoned first, and both kernels run twice for identical bits.
#include "dev/cuda/kernel_test.h"

namespace gelu_tests {

using ActivationLauncher = void (*)(floatX*, const floatX*, size_t, cudaStream_t);
// ref[i] = act(inp[i]); ref_dinp[i] = dout[i] * act'(inp[i]), in FP32 as the kernels compute.
using ActivationReference = std::function<void(std::vector<float>& ref, std::vector<float>& ref_dinp,
                                               const std::vector<float>& inp,
                                               const std::vector<float>& dout)>;

void gelu_reference(std::vector<float>& ref, std::vector<float>& ref_dinp,
                    const std::vector<float>& inp, const std::vector<float>& dout) {
  cpu::gelu_forward(ref.data(), inp.data(), inp.size());
  std::fill(ref_dinp.begin(), ref_dinp.end(), 0.0f);  // cpu::gelu_backward accumulates
  cpu::gelu_backward(ref_dinp.data(), inp.data(), dout.data(), inp.size());
}

void relu2_reference(std::vector<float>& ref, std::vector<float>& ref_dinp,
                     const std::vector<float>& inp, const std::vector<float>& dout) {
  for (size_t i = 0; i < inp.size(); i++) {
    const float r = std::max(inp[i], 0.0f);
    ref[i] = r * r;
    ref_dinp[i] = dout[i] * (2.0f * r);
  }
}

void test_activation(const char* name, ActivationLauncher forward_launch,
                     ActivationLauncher backward_launch, const ActivationReference& reference,
                     size_t n, llmc::Rng& rng) {
  printf("\n%s n=%zu\n", name, n);
  const std::vector<float> inp = random_stored(rng, n, 0.0f, 2.0f);
  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  std::vector<float> ref(n), ref_dinp(n);
  reference(ref, ref_dinp, inp, dout);
  DeviceArray<floatX> d_inp(inp), out(n);
  auto forward = [&] {
    out.poison();
    forward_launch(out, d_inp, n, 0);
  };
  forward();
  check_close("forward out", out.download(), ref, kTolStore);
  const Snapshot forward_bits(out);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out));

  // In place: the gradient of the activation's output becomes the gradient of its input.
  DeviceArray<floatX> d(n);
  auto backward = [&] {
    d.upload(dout);
    backward_launch(d, d_inp, n, 0);
  };
  backward();
  check_close("backward dinp", d.download(), ref_dinp, kTolStore);
  const Snapshot backward_bits(d);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(d));
}

void run() {
  llmc::Rng rng(11);
  const size_t sizes[] = {
      (size_t)4 * 64 * 4 * 768,    // GPT-2 small fch
      (size_t)3 * 100 * 4 * 1600,  // d48 fch, T=100
      (size_t)8 * 12347,           // the last launch block partly used
  };
  for (size_t n : sizes) {
    test_activation("gelu", gelu_forward, gelu_backward_inplace, gelu_reference, n, rng);
  }
  for (size_t n : sizes) {
    test_activation("relu2", relu2_forward, relu2_backward_inplace, relu2_reference, n, rng);
  }
}

}  // namespace gelu_tests
