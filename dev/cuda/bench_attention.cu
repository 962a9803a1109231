// Times the flash attention kernels (BF16 build) at GPT-2 shapes and prints one line per shape:
//   shape B NH T HS, forward ms, backward ms, forward and backward TFLOP/s
// Causal FLOPs as FlashAttention counts them: 2*B*NH*T*T*HS forward (half of 4*B*NH*T*T*HS),
// 2.5 times that backward. Inputs are random (never zeros) and rotate among several sets so
// that the timed runs do not read from a warm L2. dev/cuda/bench_attention.py runs this next to
// PyTorch's scaled_dot_product_attention.
//   ./build/bench_attention [B NH T HS]...
#include "dev/cuda/kernel_test.h"

#include <memory>

struct BenchShape {
  int B, NH, T, HS;
};

void bench(const BenchShape& s) {
  const int C = s.NH * s.HS, kSets = 3, kReps = 20;
  const size_t n = (size_t)s.B * s.T * C, n_lse = (size_t)s.B * s.NH * s.T;
  llmc::Rng rng(7);
  std::vector<std::unique_ptr<DeviceArray<floatX>>> qkv, dout;
  for (int i = 0; i < kSets; i++) {
    qkv.emplace_back(new DeviceArray<floatX>(random_stored(rng, 3 * n, 0.0f, 1.0f)));
    dout.emplace_back(new DeviceArray<floatX>(random_stored(rng, n, 0.0f, 1.0f)));
  }
  DeviceArray<floatX> out(n), dqkv(3 * n);
  DeviceArray<float> lse(n_lse), dot(n_lse);
  DeviceArray<floatX> ds(attention_flash_ds_count(s.B, s.T, s.NH));
  DeviceArray<float> tile_sums((size_t)attention_flash_tile_rows(s.B, s.T) * 3 * C);  // as the trainer
  // Each run between its own events, all queued back to back and synchronised once at the end,
  // so the launches' host time overlaps the GPU's work instead of being counted in it.
  constexpr int kWarmups = 3;
  std::vector<cudaEvent_t> events(3 * (kReps + kWarmups));
  for (cudaEvent_t& e : events) cudaCheck(cudaEventCreate(&e));
  const float scale = attention_default_scale(s.HS);
  for (int rep = 0; rep < kReps + kWarmups; rep++) {
    const int k = rep % kSets;
    cudaCheck(cudaEventRecord(events[3 * rep]));
    attention_forward_flash(out, lse, *qkv[k], s.B, s.T, C, s.NH, scale, 0);
    cudaCheck(cudaEventRecord(events[3 * rep + 1]));
    attention_backward_flash(dqkv, tile_sums, dot, ds, *dout[k], *qkv[k], out, lse, s.B, s.T, C, s.NH, scale,
                             0);
    cudaCheck(cudaEventRecord(events[3 * rep + 2]));
  }
  cudaCheck(cudaEventSynchronize(events.back()));
  std::vector<float> forward_ms, backward_ms;
  for (int rep = kWarmups; rep < kReps + kWarmups; rep++) {
    float f = 0.0f, b = 0.0f;
    cudaCheck(cudaEventElapsedTime(&f, events[3 * rep], events[3 * rep + 1]));
    cudaCheck(cudaEventElapsedTime(&b, events[3 * rep + 1], events[3 * rep + 2]));
    forward_ms.push_back(f);
    backward_ms.push_back(b);
  }
  for (cudaEvent_t e : events) cudaCheck(cudaEventDestroy(e));
  const double flops = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
  const float f = median_ms(forward_ms), b = median_ms(backward_ms);
  printf("shape %d %d %d %d forward_ms %.3f backward_ms %.3f forward_tflops %.1f backward_tflops %.1f\n",
         s.B, s.NH, s.T, s.HS, f, b, flops / f / 1e9, 2.5 * flops / b / 1e9);
}

int main(int argc, char** argv) {
  std::vector<BenchShape> shapes = {{64, 12, 1024, 64}, {8, 25, 1024, 64}, {32, 6, 1024, 128}};
  if (argc > 1) {
    if ((argc - 1) % 4 != 0) {
      fprintf(stderr, "usage: %s [B NH T HS]...  (each shape as four numbers)\n", argv[0]);
      return 2;
    }
    shapes.clear();
    for (int i = 1; i < argc; i += 4) {
      shapes.push_back({atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3])});
    }
  }
  return run_kernel_tests("bench_attention", [&] {
    for (const BenchShape& s : shapes) {
      REQUIRE(s.B > 0 && s.NH > 0 && s.T > 0 && attention_flash_supported(s.HS),
              "shape %d %d %d %d: need positive B, NH, T and head size 64 or 128 in a BF16 build",
              s.B, s.NH, s.T, s.HS);
      bench(s);
    }
  });
}
