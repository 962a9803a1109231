// Tests encoder_forward and encoder_backward (with its CPU half, encoder_backward_plan) against
// cpu::encoder_forward / cpu::encoder_backward: the full GPT-2 vocabulary, the d48 width
// C=1600 (whose last channel group covers only part of a warp), T not a power of two, batches in
// which one to three token ids fill every position or one id a share of them (the long buckets'
// kernels beside the short ones', up to a speedrun micro step's 49,152 positions, half of them one
// id), gradients accumulated onto random non-zero
// ones, forward outputs poisoned first, and every kernel run twice for identical bits.
#include "dev/cuda/kernel_test.h"

namespace encoder_tests {

struct EncoderShape {
  int B, T, C, V;
  int distinct;          // token ids are drawn from the last `distinct` ids of the vocabulary
  int frequent_percent;  // then this share of the positions takes the first of them (long buckets)
};

void test_encoder(const EncoderShape& s, llmc::Rng& rng) {
  const int B = s.B, T = s.T, C = s.C, V = s.V, BT = B * T;
  printf("\nencoder B=%d T=%d C=%d V=%d, token ids from the last %d, %d%% of them the first\n", B, T, C, V,
         s.distinct, s.frequent_percent);
  std::vector<int> tokens = random_ints(rng, BT, V - s.distinct, V);
  for (int& t : tokens) {
    if ((int)(rng.u32() % 100) < s.frequent_percent) t = V - s.distinct;
  }
  const std::vector<float> wte = random_stored(rng, (size_t)V * C, 0.0f, 1.0f);
  const std::vector<float> wpe = random_stored(rng, (size_t)T * C, 0.0f, 1.0f);
  DeviceArray<int> d_tokens(tokens);
  DeviceArray<floatX> d_wte(wte), d_wpe(wpe), out((size_t)BT * C);

  std::vector<float> ref((size_t)BT * C);
  cpu::encoder_forward(ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  auto forward = [&] {
    out.poison();
    encoder_forward(out, d_tokens, d_wte, d_wpe, B, T, C, 0);
  };
  forward();
  // The same FP32 sum rounded to nearest on both sides: exact.
  check_close("forward out", out.download(), stored(ref), 0.0f);
  const Snapshot forward_bits(out);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out));

  const std::vector<float> dout = random_stored(rng, (size_t)BT * C, 0.0f, 1.0f);
  const std::vector<float> dwte0 = random_stored(rng, (size_t)V * C, 0.0f, 1.0f);
  const std::vector<float> dwpe0 = random_stored(rng, (size_t)T * C, 0.0f, 1.0f);
  DeviceArray<floatX> d_dout(dout), dwte(dwte0.size()), dwpe(dwpe0.size());
  const DeviceEncoderPlan plan(tokens, C);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    dwte.upload(dwte0);
    dwpe.upload(dwpe0);
    encoder_backward(dwte, dwpe, plan.plan, d_dout, B, T, C, seed, 0);
  };
  backward();
  std::vector<float> ref_dwte = dwte0, ref_dwpe = dwpe0;
  cpu::encoder_backward(ref_dwte.data(), ref_dwpe.data(), dout.data(), tokens.data(), B, T, C);
  check_close("backward dwte", dwte.download(), ref_dwte, kTolSum);
  check_close("backward dwpe", dwpe.download(), ref_dwpe, kTolSum);
  const Snapshot backward_bits(dwte, dwpe);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dwte, dwpe));
}

void run() {
  llmc::Rng rng(1337);
  test_encoder({4, 64, 768, 50257, 50257, 0}, rng);  // GPT-2 small, every token id possible
  test_encoder({3, 100, 1600, 1000, 1000, 0}, rng);  // d48 width
  test_encoder({4, 1000, 768, 5000, 3, 0}, rng);     // three ids, ~1300 positions each (long buckets)
  test_encoder({2, 777, 64, 50257, 1, 0}, rng);      // one id everywhere; C < one warp's group
  // One id in a share of the positions (a long bucket, as indentation in source code), the rest
  // in short ones: both kernels in one backward; the d48 width's part-warp group in the long one.
  test_encoder({1, 8192, 768, 50257, 50257, 10}, rng);
  test_encoder({3, 100, 1600, 1000, 1000, 50}, rng);
  // Two ids of about 260 positions each (slices ending mid-slice). A micro step of the
  // speedrun's, half of 49,152 positions one id (384 slices of 64 summed by one block), in BF16
  // builds: the CPU reference sums its 24,576 terms in FP32, rounding by up to ~1e-3 where the
  // FP32 build's tolerance for an element near zero is 1.4e-4.
  test_encoder({1, 521, 768, 50257, 2, 0}, rng);
  if (sizeof(floatX) == 2) test_encoder({1, 49152, 768, 50257, 50257, 50}, rng);
}

}  // namespace encoder_tests
