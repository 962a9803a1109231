// Tests fused_classifier against cpu::softmax_crossentropy_forward / _backward, and its soft-capped
// form (the modern architecture's head: softmax and loss of y = c * z / sqrt(z^2 + c^2), gradient
// with respect to z) against a reference written here (the CPU trainer has no cap): the padded
// GPT-2 vocabulary (V = 50257 of Vp = 50304 columns), odd vocabularies padded to an odd number of
// 16-byte pieces, a vocabulary smaller than one block's pass, targets at both ends of the
// vocabulary, NaN in the padding columns (which must never reach a loss and must come back as
// zero gradients), losses poisoned first, training (dlogits written in place) and validation
// (dloss = 0: logits left bit for bit as they were), twice each.
#include "dev/cuda/kernel_test.h"

// losses[r] = logsumexp(y) - y[target] over the V real columns, y the capped logits; dlogits =
// dloss * (softmax(y) - onehot(target)) * dy/dz, zero in the padding. In double: more exact than
// either build.
void softcapped_classifier_reference(std::vector<float>& losses, std::vector<float>& dlogits,
                                     const std::vector<float>& logits,
                                     const std::vector<int>& targets, float dloss, float cap, int N,
                                     int V, int Vp) {
  std::vector<double> y(V), slope(V);
  for (int r = 0; r < N; r++) {
    const float* z = &logits[(size_t)r * Vp];
    double m = -INFINITY;
    for (int i = 0; i < V; i++) {
      const double root = std::sqrt((double)z[i] * z[i] + (double)cap * cap);
      y[i] = cap * z[i] / root;
      slope[i] = std::pow(cap / root, 3);
      m = std::max(m, y[i]);
    }
    double s = 0.0;
    for (int i = 0; i < V; i++) s += std::exp(y[i] - m);
    const int t = targets[r];
    losses[r] = (float)(std::log(s) + m - y[t]);
    float* d = &dlogits[(size_t)r * Vp];
    for (int i = 0; i < Vp; i++) {
      d[i] = i < V ? (float)(dloss * (std::exp(y[i] - m) / s - (i == t)) * slope[i]) : 0.0f;
    }
  }
}

// softcap = 0: GPT-2's uncapped classifier, logits of std 2. Otherwise logits of std 20, so that
// most are well into the cap's bend, and dloss = 1 (the modern recipe backpropagates the sum of
// the token losses).
void test_classifier(int N, int V, int Vp, float softcap, llmc::Rng& rng) {
  printf("\nclassifier N=%d V=%d Vp=%d softcap=%g\n", N, V, Vp, softcap);
  std::vector<float> logits = random_stored(rng, (size_t)N * Vp, 0.0f, softcap > 0.0f ? 20.0f : 2.0f);
  for (int r = 0; r < N; r++) {
    for (int i = V; i < Vp; i++) logits[(size_t)r * Vp + i] = NAN;
  }
  std::vector<int> targets = random_ints(rng, N, 0, V);
  targets[0] = 0;
  targets[N - 1] = V - 1;
  const float dloss = softcap > 0.0f ? 1.0f : 1.0f / N;
  DeviceArray<floatX> d_logits(logits.size());
  DeviceArray<float> losses(N);
  DeviceArray<int> d_targets(targets);

  std::vector<float> ref_losses(N), ref_dlogits(logits.size(), 0.0f);
  if (softcap > 0.0f) {
    softcapped_classifier_reference(ref_losses, ref_dlogits, logits, targets, dloss, softcap, N, V, Vp);
  } else {
    std::vector<float> probs(logits.size());
    cpu::softmax_crossentropy_forward(probs.data(), ref_losses.data(), logits.data(), targets.data(),
                                      N, V, Vp);
    cpu::softmax_crossentropy_backward(ref_dlogits.data(), probs.data(), targets.data(), dloss, N, V,
                                       Vp);
  }
  // The cap's y = z * c * rsqrtf(z^2 + c^2) is within about 3 ulp of the exact value (rsqrtf: 2),
  // up to 5e-6 near |y| = 15: each exponential moves by up to 6e-6 relative, and their sum too,
  // so an FP32 build is held to 4e-5 instead of kTolStore's 1e-5. BF16's rounding dwarfs it.
  const float tol_dlogits = softcap > 0.0f ? std::max(kTolStore, 4e-5f) : kTolStore;
  auto run = [&](float scale) {
    d_logits.upload(logits);
    losses.poison();
    fused_classifier(d_logits, losses, d_targets, N, V, Vp, scale, 0, softcap);
  };
  run(dloss);
  // Losses are FP32 in both builds, from the same stored logits.
  check_close("training losses", losses.download(), ref_losses, kTolFP32);
  check_close("training dlogits", d_logits.download(), ref_dlogits, tol_dlogits);
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
    test_classifier(64, 50257, 50304, 0.0f, rng);       // GPT-2, padded vocabulary
    test_classifier(3 * 100, 50257, 50304, 0.0f, rng);  // more rows than SMs, T not a power of two
    test_classifier(5, 100, 128, 0.0f, rng);            // most threads of the 512 see no column
    test_classifier(64, 50257, 50304, 15.0f, rng);      // the modern head's cap
    test_classifier(3 * 101, 1001, 1016, 15.0f, rng);   // 127 BF16 pieces: one straddles V, one is padding
    test_classifier(5, 99, 136, 15.0f, rng);            // 17 pieces, most threads idle
    test_classifier(7, 333, 344, 30.0f, rng);           // another cap
  });
}
