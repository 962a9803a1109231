// Times the flash attention kernels (BF16 build) and prints one line per case:
//   build/bench_kernels attention [B NH T HS]...
// causal attention at GPT-2 shapes: shape B NH T HS, forward ms, backward ms, forward and
// backward TFLOP/s. Causal FLOPs as FlashAttention counts them: 2*B*NH*T*T*HS forward (half of
// 4*B*NH*T*T*HS), 2.5 times that backward.
//   build/bench_kernels attention --window TOKENS NH HS W...
// document-causal attention within windows of W blocks of 128 tokens (attention_forward_window,
// attention_backward_window) over one sequence, the int32 token ids in the file TOKENS (documents
// open with token 50256): window W, visible blocks, forward ms, backward ms, TFLOP/s counted on the
// visible blocks (4 * 128^2 * HS FLOPs per block and head forward, 2.5 times that backward).
//   build/bench_kernels attention --window-tokens TOKENS NH HS W...
// the same with each window of W blocks counted in tokens (-awt 1: W x 128 tokens back from each
// query, its edge blocks masked token by token), the edge blocks among the visible ones.
// Inputs are random (never zeros) and rotate among several sets so that the timed runs do not
// read from a warm L2. dev/cuda/bench_attention.py and dev/cuda/bench_window_attention.py run these
// next to PyTorch's attention.
#include "dev/cuda/kernel_test.h"

#include <fstream>
#include <memory>

namespace attention_bench {

struct BenchShape {
  int B, NH, T, HS;
};

struct PassTimes {
  float forward_ms, backward_ms;
};

// Median times of forward(set) and backward(set) over kReps runs after kWarmups, set rotating
// among kSets input sets. Each run between its own events, all queued back to back and
// synchronised once at the end, so the launches' host time overlaps the GPU's work instead of
// being counted in it.
constexpr int kSets = 3;
PassTimes time_passes(const std::function<void(int)>& forward, const std::function<void(int)>& backward) {
  constexpr int kReps = 20, kWarmups = 3;
  std::vector<cudaEvent_t> events(3 * (kReps + kWarmups));
  for (cudaEvent_t& e : events) cudaCheck(cudaEventCreate(&e));
  for (int rep = 0; rep < kReps + kWarmups; rep++) {
    cudaCheck(cudaEventRecord(events[3 * rep]));
    forward(rep % kSets);
    cudaCheck(cudaEventRecord(events[3 * rep + 1]));
    backward(rep % kSets);
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
  return {median_ms(forward_ms), median_ms(backward_ms)};
}

// kSets random qkv and dout sets of B x T x C.
struct BenchInputs {
  std::vector<std::unique_ptr<DeviceArray<floatX>>> qkv, dout;
  BenchInputs(size_t n) {
    llmc::Rng rng(7);
    for (int i = 0; i < kSets; i++) {
      qkv.emplace_back(new DeviceArray<floatX>(random_stored(rng, 3 * n, 0.0f, 1.0f)));
      dout.emplace_back(new DeviceArray<floatX>(random_stored(rng, n, 0.0f, 1.0f)));
    }
  }
};

void bench(const BenchShape& s) {
  const int C = s.NH * s.HS;
  const size_t n = (size_t)s.B * s.T * C, n_lse = (size_t)s.B * s.NH * s.T;
  const BenchInputs in(n);
  DeviceArray<floatX> out(n), dqkv(3 * n);
  DeviceArray<float> lse(n_lse), dot(n_lse);
  DeviceArray<floatX> ds(attention_flash_ds_count(s.B, s.T, s.NH));
  DeviceArray<float> tile_sums((size_t)attention_flash_tile_rows(s.B, s.T) * 3 * C);  // as the trainer
  const float scale = attention_default_scale(s.HS);
  const PassTimes times = time_passes(
      [&](int k) { attention_forward_flash(out, lse, *in.qkv[k], s.B, s.T, C, s.NH, scale, 0); },
      [&](int k) {
        attention_backward_flash(dqkv, tile_sums, dot, ds, *in.dout[k], *in.qkv[k], out, lse, s.B, s.T, C, s.NH,
                                 scale, 0);
      });
  const double flops = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
  const float f = times.forward_ms, b = times.backward_ms;
  printf("shape %d %d %d %d forward_ms %.3f backward_ms %.3f forward_tflops %.1f backward_tflops %.1f\n",
         s.B, s.NH, s.T, s.HS, f, b, flops / f / 1e9, 2.5 * flops / b / 1e9);
}

// The windowed kernels over one sequence of `tokens`, at each window (blocks, counted in `unit`),
// with the modern recipe's scale and no qkv bias (no tile sums), as the speedrun trains.
void bench_window(const std::vector<int>& tokens, int NH, int HS, const std::vector<int>& windows,
                  llmc::WindowUnit unit) {
  const int T = (int)tokens.size(), C = NH * HS, blocks = T / llmc::kAttentionBlock;
  const size_t n = (size_t)T * C, n_lse = (size_t)NH * T;
  const BenchInputs in(n);
  std::vector<int> documents(T);
  std::vector<llmc::AttentionBlockSpan> spans(blocks);
  for (int t = 0, document = 0; t < T; t++) documents[t] = document += tokens[t] == llmc::kDocumentStartToken;
  llmc::attention_block_spans(tokens.data(), T, llmc::kDocumentStartToken, spans.data());
  DeviceArray<int> d_documents(documents);
  DeviceArray<llmc::AttentionBlockSpan> d_spans(spans.size());
  cudaCheck(cudaMemcpy(d_spans, spans.data(), spans.size() * sizeof(spans[0]), cudaMemcpyHostToDevice));
  DeviceArray<floatX> out(n), dqkv(3 * n);
  DeviceArray<float> lse(n_lse), dot(n_lse);
  const int widest = *std::max_element(windows.begin(), windows.end());
  DeviceArray<floatX> ds(attention_window_ds_count(1, T, NH, llmc::AttentionWindow::of_blocks(widest, unit)));
  for (int window : windows) {
    const DocumentWindow dw = {d_spans, d_documents, llmc::AttentionWindow::of_blocks(window, unit)};
    long visible = 0;
    for (int q = 0; q < blocks; q++) {
      const llmc::AttentionBlockSelection sel = llmc::attention_window_select(spans[q], q, dw.window);
      visible += sel.full + sel.partial;
    }
    const PassTimes times = time_passes(
        [&](int k) { attention_forward_window(out, lse, *in.qkv[k], 1, T, C, NH, 0.12f, dw, 0); },
        [&](int k) {
          attention_backward_window(dqkv, nullptr, dot, ds, *in.dout[k], *in.qkv[k], out, lse, 1, T, C, NH, 0.12f,
                                    dw, 0);
        });
    const double flops = 4.0 * llmc::kAttentionBlock * llmc::kAttentionBlock * HS * NH * (double)visible;
    const float f = times.forward_ms, b = times.backward_ms;
    printf("window %d%s visible %ld forward_ms %.3f backward_ms %.3f forward_tflops %.1f backward_tflops %.1f\n",
           window, unit == llmc::WindowUnit::kTokens ? " (tokens)" : "", visible, f, b, flops / f / 1e9,
           2.5 * flops / b / 1e9);
  }
}

std::vector<int> read_tokens(const char* path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  REQUIRE(file, "--window %s: cannot open the token file", path);
  const std::streamsize bytes = file.tellg();
  REQUIRE(bytes > 0 && bytes % (4 * llmc::kAttentionBlock) == 0,
          "--window %s: need int32 tokens, a multiple of %d of them", path, llmc::kAttentionBlock);
  std::vector<int> tokens(bytes / 4);
  file.seekg(0);
  file.read(reinterpret_cast<char*>(tokens.data()), bytes);
  return tokens;
}

int run(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--window" || std::string(argv[1]) == "--window-tokens")) {
    const llmc::WindowUnit unit =
        std::string(argv[1]) == "--window" ? llmc::WindowUnit::kBlocks : llmc::WindowUnit::kTokens;
    if (argc < 6) {
      fprintf(stderr, "error: bench_kernels attention %s: give TOKENS NH HS W... (int32 token ids, windows "
                      "in blocks)\n", argv[1]);
      return 1;
    }
    const int NH = atoi(argv[3]), HS = atoi(argv[4]);
    std::vector<int> windows;
    for (int i = 5; i < argc; i++) windows.push_back(atoi(argv[i]));
    return run_kernel_tests("bench_kernels attention", [&] {
      REQUIRE(NH > 0 && attention_flash_supported(HS), "--window: need NH > 0 and head size 64 or 128 in a BF16 build");
      bench_window(read_tokens(argv[2]), NH, HS, windows, unit);
    });
  }
  std::vector<BenchShape> shapes = {{64, 12, 1024, 64}, {8, 25, 1024, 64}, {32, 6, 1024, 128}};
  if (argc > 1) {
    if ((argc - 1) % 4 != 0) {
      fprintf(stderr, "error: bench_kernels attention: give each shape as four numbers, B NH T HS\n");
      return 1;
    }
    shapes.clear();
    for (int i = 1; i < argc; i += 4) {
      shapes.push_back({atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3])});
    }
  }
  return run_kernel_tests("bench_kernels attention", [&] {
    for (const BenchShape& s : shapes) {
      REQUIRE(s.B > 0 && s.NH > 0 && s.T > 0 && attention_flash_supported(s.HS),
              "shape %d %d %d %d: need positive B, NH, T and head size 64 or 128 in a BF16 build",
              s.B, s.NH, s.T, s.HS);
      bench(s);
    }
  });
}

}  // namespace attention_bench
