// Times two of record #89's kernels at the shapes of its three stages (N rows a micro step: 16,384,
// 32,768 and 49,152; rows of T 2,048 without documents), the costly ones of a stage's kernel table
// (dev/notes/record89-reference.md): the composed attention (layer 10: six heads of 128, its window of
// 112 keys), forward and backward, in milliseconds and the rate of their useful work (forward 4 HS
// FLOPs a key seen, a token and a head: the scores and the products with v; the backward about 2.5
// times that, counted as such); the MUDD gate rows' backward (rows of 48 values,
// 41 gated, with a learned scale), in milliseconds and the bytes a second it moves (reads drows and
// pre, writes dpre); and the passes over [N, C] rows around each attention layer's add (the gated
// terms' forward and backward, the residual lambdas' backward), each in milliseconds and the bytes
// a second of the rows it reads and writes, against the GPU's memory bandwidth.
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

// ms and GB/s of one pass over `sets` [N, kC] BF16 row sets.
void print_row_pass(const char* name, int N, int sets, float ms) {
  printf("%-36s N %6d  %7.4f ms  %6.0f GB/s\n", name, N, ms, (double)sets * N * kC * sizeof(floatX) / ms / 1e6);
}

// The row passes of an attention layer in record #89's plan, with its gates a row (MUDD's columns):
// the forward's two gated terms (the bigram's and x0's: reads in and both terms, writes out), a
// term's backward with a gate a row and with one shared gate (reads dout, the term and dterm, writes
// dterm), and the residual lambdas' backward (reads dout, x and y, writes dout and dy).
void bench_row_passes(int N, llmc::Rng& rng) {
  const int S = llmc::kMuddGateStride;
  const size_t n = (size_t)N * kC;
  DeviceArray<floatX> in(random_stored(rng, n, 0.0f, 1.0f)), t0(random_stored(rng, n, 0.0f, 1.0f));
  DeviceArray<floatX> t1(random_stored(rng, n, 0.0f, 1.0f)), out(n), dterm(random_stored(rng, n, 0.0f, 1.0f));
  DeviceArray<floatX> dout(random_stored(rng, n, 0.0f, 1.0f)), dy(n);
  DeviceArray<floatX> rows(random_stored(rng, (size_t)N * S, 0.5f, 0.25f)), drows((size_t)N * S);
  DeviceArray<floatX> gate(std::vector<float>{0.3f}), dgate(1), r(std::vector<float>{1.1f});
  DeviceArray<floatX> p(std::vector<float>{0.9f}), dr(1), dp(1);
  DeviceArray<float> partials((size_t)kRowBlocks * 2);
  const GateRows g0{(const floatX*)rows, S}, g1{(const floatX*)rows + 1, S};
  print_row_pass("gated_terms_forward (2 terms a row)", N, 4, median_launch_ms(20, 3, [&](int) {
    gated_terms_forward(out, in, nullptr, {t0, g0}, {t1, g1}, N, kC, 0);
  }));
  print_row_pass("gated_term_rows_backward (a row)", N, 4, median_launch_ms(20, 3, [&](int) {
    gated_term_rows_backward(dterm, {drows, S}, nullptr, dout, t0, g0, N, kC, 0);
  }));
  print_row_pass("bigram_gate_backward (shared)", N, 4, median_launch_ms(20, 3, [&](int rep) {
    bigram_gate_backward(dterm, {dgate, 0}, partials, dout, t0, {gate, 0}, N, kC, rep, 0);
  }));
  print_row_pass("sublayer_lambdas_backward", N, 5, median_launch_ms(20, 3, [&](int rep) {
    sublayer_lambdas_backward(dy, dout, dr, dp, partials, in, t0, {r, p}, N, kC, rep, 0);
  }));
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
    bench_row_passes(N, rng);
  }
  return 0;
}

}  // namespace record89_bench
