// Tests fused_classifier against cpu::softmax_crossentropy_forward / _backward: the padded GPT-2
// vocabulary (V = 50257 of Vp = 50304 columns) and a vocabulary smaller than one block's pass,
// targets at both ends of the vocabulary, NaN in the padding columns (which must never reach a
// loss and must come back as zero gradients), losses poisoned first, training (dlogits written
// in place) and validation (dloss = 0: logits left bit for bit as they were), twice each.
#include "dev/cuda/kernel_test.h"

void test_classifier(int N, int V, int Vp, llmc::Rng& rng) {
  printf("\nclassifier N=%d V=%d Vp=%d\n", N, V, Vp);
  std::vector<float> logits = random_stored(rng, (size_t)N * Vp, 0.0f, 2.0f);
  for (int r = 0; r < N; r++) {
    for (int i = V; i < Vp; i++) logits[(size_t)r * Vp + i] = NAN;
  }
  std::vector<int> targets = random_ints(rng, N, 0, V);
  targets[0] = 0;
  targets[N - 1] = V - 1;
  const float dloss = 1.0f / N;  // the mean loss over the batch
  DeviceArray<floatX> d_logits(logits.size());
  DeviceArray<float> losses(N);
  DeviceArray<int> d_targets(targets);

  std::vector<float> probs(logits.size()), ref_losses(N), ref_dlogits(logits.size(), 0.0f);
  cpu::softmax_crossentropy_forward(probs.data(), ref_losses.data(), logits.data(), targets.data(),
                                    N, V, Vp);
  cpu::softmax_crossentropy_backward(ref_dlogits.data(), probs.data(), targets.data(), dloss, N, V,
                                     Vp);
  auto run = [&](float scale) {
    d_logits.upload(logits);
    losses.poison();
    fused_classifier(d_logits, losses, d_targets, N, V, Vp, scale, 0);
  };
  run(dloss);
  // Losses are FP32 in both builds, from the same stored logits.
  check_close("training losses", losses.download(), ref_losses, kTolFP32);
  check_close("training dlogits", d_logits.download(), ref_dlogits, kTolStore);
  const Snapshot training_bits(losses, d_logits);
  run(dloss);
  check_same_bits("training twice", training_bits, Snapshot(losses, d_logits));

  d_logits.upload(logits);
  const Snapshot untouched(d_logits);
  run(0.0f);
  check_close("validation losses", losses.download(), ref_losses, kTolFP32);
  check_same_bits("validation keeps logits", untouched, Snapshot(d_logits));
  const Snapshot validation_bits(losses);
  run(0.0f);
  check_same_bits("validation twice", validation_bits, Snapshot(losses));
}

int main() {
  return run_kernel_tests("test_classifier", [] {
    llmc::Rng rng(5);
    test_classifier(64, 50257, 50304, rng);       // GPT-2, padded vocabulary
    test_classifier(3 * 100, 50257, 50304, rng);  // more rows than SMs, T not a power of two
    test_classifier(5, 100, 128, rng);            // most threads of the 1024 see no column
  });
}
