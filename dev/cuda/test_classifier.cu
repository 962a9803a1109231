// Tests fused_classifier against cpu::softmax_crossentropy_forward / _backward, and its capped
// forms (softmax and loss of y = cap(z), gradient with respect to z: the modern head's
// y = c * z / sqrt(z^2 + c^2), the speedrun's y = c * sigmoid((z + shift) / s) over the whole padded
// vocabulary, record #28's unshifted and record #89's shifted) against a reference written here
// (the CPU trainer has no cap): the padded GPT-2 vocabulary (V = 50257 of Vp = 50304 columns), odd
// vocabularies padded to an odd number of 16-byte pieces, a vocabulary smaller than one block's
// pass, targets at both ends of the vocabulary, NaN in the padding columns (which must never reach
// a loss and must come back as zero gradients), logits far past the caps' bends (the sigmoid's
// exponential overflows there), losses poisoned first, training (dlogits written in place) and
// validation (dloss = 0: logits left bit for bit as they were, the cap's evaluation()), twice each;
// which kernel ran, confirmed (capped logits take the one that keeps the gradients on GPUs with
// clusters). BF16 builds: the FP8 head's gradient (ClassifierFp8Grad) bitwise the E5M2 cast of the
// dlogits the same kernel wrote in place (cuda_fp8.h's conversion on the host, which test_fp8
// checks), the same losses, the logits left as they were, twice. The shift is added to z exactly:
// the shifted cap of z gives the bits of the unshifted cap of z + shift where that sum is exact;
// record #89's sigmoid rounded to BF16 (-lc 23,5,bf16) against the reference's rounding of the
// exact sigmoid in training, its FP32 sigmoid in validation. The training loss's terms
// (ClassifierTerms: later targets of the row's sequence, the target's prefix token) against a
// reference in double: sequences whose last rows lose their later targets, targets repeated within
// a row's terms, tokens without a prefix, each kernel, twice, and (BF16) their FP8 gradient.
#include "dev/cuda/kernel_test.h"

namespace classifier_tests {

// Row z's capped logits y and their slopes dy/dz over its V real columns; returns the softmax's
// max m and sum s of exp(y - m).
std::pair<double, double> capped_row(const float* z, const llmc::LogitCap& cap, int V, std::vector<double>& y,
                                     std::vector<double>& slope) {
  double m = -INFINITY;
  for (int i = 0; i < V; i++) {
    y[i] = cap.apply((double)z[i], &slope[i]);
    m = std::max(m, y[i]);
  }
  double s = 0.0;
  for (int i = 0; i < V; i++) s += std::exp(y[i] - m);
  return {m, s};
}

// losses[r] = logsumexp(y) - y[target] over the first V columns, y the capped logits; dlogits =
// dloss * (softmax(y) - onehot(target)) * dy/dz, zero in the padding. In double (LogitCap::apply):
// more exact than either build.
void capped_classifier_reference(std::vector<float>& losses, std::vector<float>& dlogits,
                                 const std::vector<float>& logits, const std::vector<int>& targets, float dloss,
                                 const llmc::LogitCap& cap, int N, int V, int Vp) {
  std::vector<double> y(V), slope(V);
  for (int r = 0; r < N; r++) {
    const float* z = &logits[(size_t)r * Vp];
    const auto [m, s] = capped_row(z, cap, V, y, slope);
    const int t = targets[r];
    losses[r] = (float)(std::log(s) + m - y[t]);
    float* d = &dlogits[(size_t)r * Vp];
    for (int i = 0; i < Vp; i++) {
      d[i] = i < V ? (float)(dloss * (std::exp(y[i] - m) / s - (i == t)) * slope[i]) : 0.0f;
    }
  }
}

// Whether this GPU runs the capped kernel that keeps each column's gradient: compute capability
// 9.0+ (clusters), read here rather than from the launcher's own query.
bool gpu_has_clusters() {
  int device = 0, major = 0;
  cudaCheck(cudaGetDevice(&device));
  cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

// Logits far outside the cap's bend, which a trained head can reach: past -88.7 s the sigmoid
// cap's exponential overflows FP32 (a NaN gradient unless clamped); the largest BF16 values too.
constexpr float kExtremeLogits[] = {-700.0f, -1000.0f, -3.0e4f, -3.0e38f, 700.0f, 3.0e38f};

// The FP8 head's gradient (BF16 builds), after a training run whose losses and in-place dlogits
// are `training`: the rows hold e5m2(dlogits * 448) (the speedrun's grad_s = 1/448), the losses are
// the same bits, the logits are left as they were; twice. With the loss's terms where given.
void test_fp8_gradient(const Snapshot& training, const std::vector<float>& logits, DeviceArray<floatX>& d_logits,
                       DeviceArray<float>& losses, const DeviceArray<int>& d_targets, int N, int V, int Vp,
                       float dloss, const llmc::LogitCap& cap, bool recompute, const std::string& kernel,
                       const ClassifierTerms& terms = {}) {
  const size_t n = logits.size();
  const Fp8Scale fixed = fp8_fixed_scale(1.0 / 448.0);
  DeviceArray<Fp8Scale> scale(std::vector<Fp8Scale>{fixed});
  DeviceArray<uint8_t> rows(n);
  std::vector<uint8_t> expected(n);
  const std::vector<unsigned char>& dlogits = training.bytes(1);
  for (size_t i = 0; i < n; i++) {
    floatX d;
    memcpy(&d, &dlogits[i * sizeof(floatX)], sizeof(floatX));
    expected[i] = (uint8_t)__nv_cvt_float_to_fp8((float)d * fixed.scale, __NV_SATFINITE, __NV_E5M2);
  }
  auto run = [&] {
    d_logits.upload(logits);
    losses.poison();
    rows.poison();
    fused_classifier(d_logits, losses, d_targets, N, V, Vp, dloss, 0, cap, recompute, {rows, scale}, terms);
    return Snapshot(losses, rows);
  };
  const Snapshot first = run();
  const std::vector<uint8_t> got = rows.raw();
  size_t differ = 0, first_index = 0;
  for (size_t i = 0; i < n; i++) {
    if (got[i] != expected[i] && differ++ == 0) first_index = i;
  }
  testing::check_verbose(differ == 0, llmc::strformat("FP8 gradient%s: the E5M2 cast of the dlogits (%zu of %zu "
                                                      "bytes differ, the first at [%zu])", kernel.c_str(), differ, n,
                                                      first_index));
  testing::check_verbose(memcmp(first.bytes(0).data(), training.bytes(0).data(), N * sizeof(float)) == 0,
                         "FP8 gradient: the losses of the BF16 gradient's run" + kernel);
  DeviceArray<floatX> untouched(logits);
  check_same_bits("FP8 gradient keeps logits" + kernel, Snapshot(untouched), Snapshot(d_logits));
  check_same_bits("FP8 gradient twice" + kernel, first, run());
}

// A BF16 sigmoid cap rounds s = sigmoid((z + shift) / scale) to BF16: the kernel's s is within a few
// FP32 units of the exact one, so where the exact s lies that close to a BF16 rounding edge the
// two round apart, either rightly, and the column's y moves by a BF16 step. Such logits (those
// within 2^-16 of an edge, relatively: about one in 250) are moved up a stored step or more until
// clear of it; the extremes are far from every edge.
void keep_off_bf16_sigmoid_edges(std::vector<float>& logits, const llmc::LogitCap& cap) {
  if (!cap.bf16_sigmoid) return;
  auto near_edge = [&](float z) {
    const double s = 1.0 / (1.0 + std::exp(-((double)z + cap.shift) / cap.scale)), margin = 1.0 / 65536;
    return llmc::float_to_bf16_bits((float)(s * (1 - margin))) != llmc::float_to_bf16_bits((float)(s * (1 + margin)));
  };
  for (float& z : logits) {
    while (std::isfinite(z) && near_edge(z)) z = (float)(floatX)(z + std::max(std::fabs(z), 1.0f) / 128);
  }
}

// No cap: GPT-2's classifier, logits of std 2. Capped: logits of std 20, so that most are well
// into the cap's bend, and dloss = 1 (the modern recipes backpropagate the sum of the token
// losses). extremes: each row's first real columns (the target's excepted) hold kExtremeLogits.
void test_classifier(int N, int V, int Vp, const llmc::LogitCap& cap, llmc::Rng& rng, bool extremes = false) {
  const bool capped = cap.kind != llmc::LogitCap::kNone;
  printf("\nclassifier N=%d V=%d Vp=%d, logits %s%s\n", N, V, Vp, cap.describe().c_str(),
         extremes ? ", with extreme logits" : "");
  std::vector<float> logits = random_stored(rng, (size_t)N * Vp, 0.0f, capped ? 20.0f : 2.0f);
  for (int r = 0; r < N; r++) {
    for (int i = V; i < Vp; i++) logits[(size_t)r * Vp + i] = NAN;
  }
  keep_off_bf16_sigmoid_edges(logits, cap);
  std::vector<int> targets = random_ints(rng, N, 0, V);
  targets[0] = 0;
  targets[N - 1] = V - 1;
  if (extremes) {
    const int count = (int)(sizeof(kExtremeLogits) / sizeof(float));
    REQUIRE(V > count + 1, "extreme logits need more than %d columns", count + 1);
    for (int r = 0; r < N; r++) {
      for (int i = 0, col = 0; i < count; col++) {
        if (col != targets[r]) logits[(size_t)r * Vp + col] = (float)(floatX)kExtremeLogits[i++];
      }
    }
  }
  const float dloss = capped ? 1.0f : 1.0f / N;
  DeviceArray<floatX> d_logits(logits.size());
  DeviceArray<float> losses(N);
  DeviceArray<int> d_targets(targets);

  std::vector<float> ref_losses(N), ref_dlogits(logits.size(), 0.0f), ref_validation_losses(N);
  if (capped) {
    capped_classifier_reference(ref_losses, ref_dlogits, logits, targets, dloss, cap, N, V, Vp);
    std::vector<float> zero_dlogits(logits.size());  // dloss = 0: the validation pass's
    capped_classifier_reference(ref_validation_losses, zero_dlogits, logits, targets, 0.0f, cap.evaluation(), N, V,
                                Vp);
  } else {
    std::vector<float> probs(logits.size());
    cpu::softmax_crossentropy_forward(probs.data(), ref_losses.data(), logits.data(), targets.data(),
                                      N, V, Vp);
    cpu::softmax_crossentropy_backward(ref_dlogits.data(), probs.data(), targets.data(), dloss, N, V,
                                       Vp);
    ref_validation_losses = ref_losses;
  }
  // The caps' y are within about 3 ulp of the exact values (the rational's rsqrtf: 2; the
  // sigmoid's exponential and reciprocal: 2 and 1), up to 5e-6 near |y| = 15 and 1e-5 near 30:
  // each exponential moves by as much relative, and their sum too, so an FP32 build is held to
  // 4e-5 instead of kTolStore's 1e-5. BF16's rounding dwarfs it.
  const float tol_dlogits = capped ? std::max(kTolStore, 4e-5f) : kTolStore;
  // Capped logits: both kernels (the one that keeps each column's gradient, and the one that
  // recomputes it, which GPUs with less shared memory run).
  for (const bool recompute : capped ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
    const std::string kernel = !capped ? "" : recompute ? " (recomputing kernel)" : " (keeping kernel)";
    ClassifierKernel ran = ClassifierKernel::kRecomputing;
    auto run = [&](float scale) {
      d_logits.upload(logits);
      losses.poison();
      ran = fused_classifier(d_logits, losses, d_targets, N, V, Vp, scale, 0, cap, recompute);
    };
    run(dloss);
    if (capped && !recompute) {
      const bool keeping = ran == ClassifierKernel::kKeeping;
      testing::check_verbose(keeping == gpu_has_clusters(),
                             gpu_has_clusters() ? "a GPU with clusters ran the keeping kernel"
                                                : "a GPU without clusters fell back to the recomputing kernel");
    } else {
      testing::check_verbose(ran == ClassifierKernel::kRecomputing, "the recomputing kernel ran");
    }
    // Losses are FP32 in both builds, from the same stored logits.
    check_close("training losses" + kernel, losses.download(), ref_losses, kTolFP32);
    check_close("training dlogits" + kernel, d_logits.download(), ref_dlogits, tol_dlogits);
    const Snapshot training_bits(losses, d_logits);
    run(dloss);
    check_same_bits("training twice" + kernel, training_bits, Snapshot(losses, d_logits));

    d_logits.upload(logits);
    const Snapshot untouched(d_logits);
    run(0.0f);
    check_close("validation losses" + kernel, losses.download(), ref_validation_losses, kTolFP32);
    check_same_bits("validation keeps logits" + kernel, untouched, Snapshot(d_logits));
    const Snapshot validation_bits(losses);
    run(0.0f);
    check_same_bits("validation twice" + kernel, validation_bits, Snapshot(losses));
    if (sizeof(floatX) == 2) {
      test_fp8_gradient(training_bits, logits, d_logits, losses, d_targets, N, V, Vp, dloss, cap, recompute, kernel);
    }
  }
}

// A sigmoid cap with a shift on logits z against the same cap without it on z + shift: integer
// logits, so that z + shift is exact in either build, and the kernels' results must be the same
// bits (the losses, and the dlogits, which are with respect to z in both), each kernel.
void test_shift_is_added(int N, int V, int Vp, const llmc::LogitCap& shifted, llmc::Rng& rng) {
  printf("\nclassifier N=%d V=%d Vp=%d, %s against the unshifted cap of z + %g\n", N, V, Vp,
         shifted.describe().c_str(), shifted.shift);
  llmc::LogitCap unshifted = shifted;
  unshifted.shift = 0.0f;
  std::vector<float> logits = random_stored(rng, (size_t)N * Vp, 0.0f, 20.0f), moved(logits.size());
  for (size_t i = 0; i < logits.size(); i++) {
    logits[i] = std::nearbyint(std::min(std::max(logits[i], -100.0f), 100.0f));
    moved[i] = logits[i] + shifted.shift;
    REQUIRE((float)(floatX)moved[i] == moved[i], "test_shift_is_added: %g + %g is not exact", logits[i], shifted.shift);
  }
  const DeviceArray<int> targets(random_ints(rng, N, 0, V));
  DeviceArray<floatX> d_logits(logits.size());
  DeviceArray<float> losses(N);
  for (const bool recompute : {false, true}) {
    auto run = [&](const std::vector<float>& z, const llmc::LogitCap& cap) {
      d_logits.upload(z);
      losses.poison();
      fused_classifier(d_logits, losses, targets, N, V, Vp, 1.0f, 0, cap, recompute);
      return Snapshot(losses, d_logits);
    };
    const Snapshot with_shift = run(logits, shifted);
    check_same_bits(recompute ? "shift added to z (recomputing kernel)" : "shift added to z (keeping kernel)",
                    with_shift, run(moved, unshifted));
  }
}

// The loss with terms: row r at position t = r % T has the terms of the targets r + k, k < weights'
// count and t + k < T, then of prefix[targets[r]] where it is not -1; loss = sum of w (lse - y[c]),
// dlogits = dloss * (S softmax - W(column)) * dy/dz, S the sum of the row's weights, W a column's.
void terms_classifier_reference(std::vector<float>& losses, std::vector<float>& dlogits,
                                const std::vector<float>& logits, const std::vector<int>& targets,
                                const std::vector<int>& prefix, const llmc::PredictionWeights& next_tokens,
                                float prefix_weight, float dloss, const llmc::LogitCap& cap, int N, int T, int V,
                                int Vp) {
  std::vector<double> y(V), slope(V), column_weight(V);
  for (int r = 0; r < N; r++) {
    std::vector<std::pair<int, double>> terms;
    for (int k = 0; k < next_tokens.count && r % T + k < T; k++) terms.emplace_back(targets[r + k], next_tokens.weight[k]);
    if (prefix_weight > 0.0f && prefix[targets[r]] >= 0) terms.emplace_back(prefix[targets[r]], prefix_weight);
    const float* z = &logits[(size_t)r * Vp];
    const auto [m, s] = capped_row(z, cap, V, y, slope);
    const double lse = std::log(s) + m;
    double loss = 0.0, total = 0.0;
    std::fill(column_weight.begin(), column_weight.end(), 0.0);
    for (const auto& [column, weight] : terms) {
      loss += weight * (lse - y[column]);
      total += weight;
      column_weight[column] += weight;
    }
    losses[r] = (float)loss;
    float* d = &dlogits[(size_t)r * Vp];
    for (int i = 0; i < Vp; i++) {
      d[i] = i < V ? (float)(dloss * (total * std::exp(y[i] - m) / s - column_weight[i]) * slope[i]) : 0.0f;
    }
  }
}

// The loss's terms over B sequences of T rows: targets of which every fifth repeats the one before
// (a row's terms then share a column), a prefix table of random tokens with a third of the tokens
// without one, the first row's prefix its own next target; against the reference, each kernel
// (capped: both), twice.
void test_classifier_terms(int B, int T, int V, int Vp, const llmc::LogitCap& cap,
                           const llmc::PredictionWeights& next_tokens, float prefix_weight, llmc::Rng& rng) {
  const int N = B * T;
  const bool capped = cap.kind != llmc::LogitCap::kNone;
  printf("\nclassifier terms B=%d T=%d V=%d Vp=%d, logits %s, next tokens %s, prefix %g\n", B, T, V, Vp,
         cap.describe().c_str(), llmc::prediction_weights_text(next_tokens).c_str(), prefix_weight);
  std::vector<float> logits = random_stored(rng, (size_t)N * Vp, 0.0f, capped ? 20.0f : 2.0f);
  for (int r = 0; r < N; r++) {
    for (int i = V; i < Vp; i++) logits[(size_t)r * Vp + i] = NAN;
  }
  keep_off_bf16_sigmoid_edges(logits, cap);
  std::vector<int> targets = random_ints(rng, N, 0, V);
  for (int r = 1; r < N; r += 5) targets[r] = targets[r - 1];
  std::vector<int> prefix = random_ints(rng, Vp, 0, V);
  const std::vector<int> without = random_ints(rng, Vp, 0, 3);
  for (int i = 0; i < Vp; i++) prefix[i] = i >= V || without[i] == 0 ? -1 : prefix[i];
  if (N > 1) prefix[targets[0]] = targets[1];
  const float dloss = capped ? 1.0f : 1.0f / N;
  std::vector<float> ref_losses(N), ref_dlogits(logits.size());
  terms_classifier_reference(ref_losses, ref_dlogits, logits, targets, prefix, next_tokens, prefix_weight, dloss, cap,
                             N, T, V, Vp);
  DeviceArray<floatX> d_logits(logits.size());
  DeviceArray<float> losses(N);
  const DeviceArray<int> d_targets(targets), d_prefix(prefix);
  ClassifierTerms terms;
  terms.row_length = T;
  terms.predict = next_tokens.count;
  std::copy(next_tokens.weight, next_tokens.weight + llmc::kMaxPredictedTokens, terms.weights);
  terms.prefix = prefix_weight > 0.0f ? (const int*)d_prefix : nullptr;
  terms.prefix_weight = prefix_weight;
  const float tol_dlogits = capped ? std::max(kTolStore, 4e-5f) : kTolStore;
  for (const bool recompute : capped ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
    const std::string kernel = !capped ? "" : recompute ? " (recomputing kernel)" : " (keeping kernel)";
    auto run = [&] {
      d_logits.upload(logits);
      losses.poison();
      fused_classifier(d_logits, losses, d_targets, N, V, Vp, dloss, 0, cap, recompute, {}, terms);
      return Snapshot(losses, d_logits);
    };
    const Snapshot first = run();
    check_close("terms' losses" + kernel, losses.download(), ref_losses, kTolFP32);
    check_close("terms' dlogits" + kernel, d_logits.download(), ref_dlogits, tol_dlogits);
    check_same_bits("terms twice" + kernel, first, run());
    if (sizeof(floatX) == 2) {
      test_fp8_gradient(first, logits, d_logits, losses, d_targets, N, V, Vp, dloss, cap, recompute, " with terms" + kernel,
                        terms);
    }
  }
}

void run() {
  llmc::Rng rng(5);
  const llmc::LogitCap none, modern{llmc::LogitCap::kRational, 15.0f};
  const llmc::LogitCap speedrun{llmc::LogitCap::kSigmoid, 30.0f, 7.5f};
  test_classifier(64, 50257, 50304, none, rng);       // GPT-2, padded vocabulary
  test_classifier(3 * 100, 50257, 50304, none, rng);  // more rows than SMs, T not a power of two
  test_classifier(5, 100, 128, none, rng);            // most threads of the 512 see no column
  test_classifier(64, 50257, 50304, modern, rng);     // the modern head's cap
  test_classifier(3 * 101, 1001, 1016, modern, rng);  // 127 BF16 pieces: one straddles V, one is padding
  test_classifier(5, 99, 136, modern, rng);           // 17 pieces, most threads idle
  test_classifier(7, 333, 344, {llmc::LogitCap::kRational, 30.0f}, rng);  // another cap
  // The speedrun's head: the sigmoid cap over every padded column; then over the real ones, with
  // a piece straddling V, and another scale.
  test_classifier(64, 50304, 50304, speedrun, rng);
  test_classifier(3 * 101, 1001, 1016, speedrun, rng);
  test_classifier(5, 99, 136, {llmc::LogitCap::kSigmoid, 15.0f, 3.0f}, rng);
  test_classifier(9, 50304, 50304, speedrun, rng, true);
  test_classifier(9, 1001, 1016, modern, rng, true);
  // Record #89's cap, 23 sigmoid((z + 5) / 7.5): every padded column, a piece straddling V, the
  // extremes, a negative shift; and the shift's exact place.
  const llmc::LogitCap shifted{llmc::LogitCap::kSigmoid, 23.0f, 7.5f, 5.0f};
  test_classifier(64, 50304, 50304, shifted, rng);
  test_classifier(3 * 101, 1001, 1016, shifted, rng);
  test_classifier(9, 50304, 50304, shifted, rng, true);
  test_classifier(5, 99, 136, {llmc::LogitCap::kSigmoid, 15.0f, 3.0f, -2.5f}, rng);
  test_shift_is_added(7, 1001, 1016, shifted, rng);
  test_shift_is_added(3, 50304, 50304, shifted, rng);
  // Its sigmoid rounded to BF16 before the cap (-lc 23,5,bf16): y and dy/dz of the rounded s, in
  // both kernels and with the loss's terms.
  llmc::LogitCap rounded = shifted;
  rounded.bf16_sigmoid = true;
  test_classifier(64, 50304, 50304, rounded, rng);
  test_classifier(3 * 101, 1001, 1016, rounded, rng);
  test_classifier(9, 50304, 50304, rounded, rng, true);
  // Record #89's loss terms: three next tokens and the prefix on its cap over the padded vocabulary;
  // two with the prefix's weight 0, odd sizes (sequences shorter than the terms, of 1 row), the
  // other caps.
  const llmc::PredictionWeights three = {3, {1.0f, 0.5f, 0.25f}}, two = {2, {1.0f, 0.5f}};
  test_classifier_terms(4, 16, 50304, 50304, shifted, three, 0.25f, rng);
  test_classifier_terms(3, 37, 1001, 1016, shifted, two, 0.0f, rng);
  test_classifier_terms(4, 16, 50304, 50304, rounded, three, 0.25f, rng);
  test_classifier_terms(5, 2, 1001, 1016, speedrun, three, 0.25f, rng);
  test_classifier_terms(7, 1, 99, 136, modern, three, 1.0f, rng);
  test_classifier_terms(2, 33, 50257, 50304, none, {3, {0.0f, 1.0f, 0.5f}}, 0.25f, rng);
}

}  // namespace classifier_tests
