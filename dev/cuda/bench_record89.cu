// Times two of record #89's kernels at the shapes of its three stages (N rows a micro step: 16,384,
// 32,768 and 49,152; rows of T 2,048 without documents), the costly ones of a stage's kernel table
// (dev/notes/record89-reference.md): the composed attention (layer 10: six heads of 128, its window of
// 112 keys), forward and backward, in milliseconds and the rate of their useful work (forward 4 HS
// FLOPs a key seen, a token and a head: the scores and the products with v; the backward about 2.5
// times that, counted as such); and the MUDD gate rows' backward (rows of 48 values,
// 41 gated, with a learned scale), in milliseconds and the bytes a second it moves (reads drows and
// pre, writes dpre).
//   build/bench_kernels record89 [N]...   (default: 16384 32768 49152)
#include "dev/cuda/kernel_test.h"

namespace record89_bench {

constexpr int kNH = 6, kC = 768, kT = 2048, kGateColumns = 41;

// The keys a query sees, summed over N rows of T: min(window, position in the row + 1).
double keys_seen(int N) {
  double keys = 0.0;
  for (int t = 0; t < N; t++) keys += std::min(llmc::kComposedWindow, t % kT + 1);
  return keys;
}

void bench_composed(int N, llmc::Rng& rng) {
  const int S = llmc::kMuddGateStride;
  DeviceArray<floatX> qkv(random_stored(rng, (size_t)N * 3 * kC, 0.0f, 1.0f));
  DeviceArray<floatX> y(random_stored(rng, (size_t)N * kC, 0.0f, 1.0f)), out((size_t)N * kC);
  DeviceArray<floatX> dout(random_stored(rng, (size_t)N * kC, 0.0f, 1.0f)), dqkv((size_t)N * 3 * kC);
  DeviceArray<floatX> rows(random_stored(rng, (size_t)N * S, 0.5f, 0.25f)), drows((size_t)N * S);
  DeviceArray<float> lse((size_t)N * kNH), D((size_t)N * kNH);
  const GateRows w_in{(floatX*)rows + llmc::kMuddComposedInColumn, S};
  const GateRows w_out{(floatX*)rows + llmc::kMuddComposedOutColumn, S};
  const GateGradient dw_in{(floatX*)drows + llmc::kMuddComposedInColumn, S};
  const GateGradient dw_out{(floatX*)drows + llmc::kMuddComposedOutColumn, S};
  const float scale = 0.12f;
  const double forward_flops = 4.0 * (kC / kNH) * keys_seen(N) * kNH;
  const float forward_ms = median_launch_ms(10, 2, [&](int) {
    composed_attention_forward(out, lse, y, qkv, w_in, w_out, nullptr, kT, llmc::kComposedWindow, scale, N, kNH, kC,
                               0);
  });
  const float backward_ms = median_launch_ms(10, 2, [&](int) {
    composed_attention_backward(dqkv, dw_in, dw_out, D, dout, qkv, lse, w_in, w_out, nullptr, kT,
                                llmc::kComposedWindow, scale, N, kNH, kC, 0);
  });
  printf("composed attention forward   N %6d  %7.3f ms  %6.2f TFLOPS\n", N, forward_ms,
         forward_flops / forward_ms / 1e9);
  printf("composed attention backward  N %6d  %7.3f ms  %6.2f TFLOPS\n", N, backward_ms,
         2.5 * forward_flops / backward_ms / 1e9);
}

void bench_gate_rows(int N, llmc::Rng& rng) {
  const int S = llmc::kMuddGateStride;
  DeviceArray<floatX> drows(random_stored(rng, (size_t)N * S, 0.0f, 1.0f));
  DeviceArray<floatX> pre(random_stored(rng, (size_t)N * S, 0.0f, 1.0f)), dpre((size_t)N * S);
  DeviceArray<floatX> dbias(kGateColumns), scale(std::vector<float>{0.1f}), dscale(1);
  DeviceArray<float> partials((size_t)kRowBlocks * (kGateColumns + 1));
  const float ms = median_launch_ms(20, 3, [&](int rep) {
    gate_rows_bias_scale_backward(dpre, dbias, dscale, partials, drows, pre, scale, N, kGateColumns, S, rep, 0);
  });
  printf("gate_rows_bias_scale_backward N %6d  %7.4f ms  %6.0f GB/s\n", N, ms,
         3.0 * N * S * sizeof(floatX) / ms / 1e6);
}

int run(int argc, char** argv) {
  std::vector<int> sizes = {16384, 32768, 49152};
  if (argc > 1) {
    sizes.clear();
    for (int i = 1; i < argc; i++) {
      const int N = (int)llmc::parse_int("N", argv[i], kT, 1 << 20);
      if (N % kT != 0) {
        fprintf(stderr, "error: bench_kernels record89: N %d: give a multiple of %d (rows of T)\n", N, kT);
        return 1;
      }
      sizes.push_back(N);
    }
  }
  llmc::Rng rng(89);
  for (int N : sizes) {
    bench_composed(N, rng);
    bench_gate_rows(N, rng);
  }
  return 0;
}

}  // namespace record89_bench
