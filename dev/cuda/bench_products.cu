// Times the block products of one speedrun micro step, alone and for long enough that the GPU
// settles at the clock it holds under sustained load (a 700 W Hopper's power cap:
// dev/notes/speedrun-pairs.md, "the power cap"). Per layer, as the trainer calls them
// (matmul_forward, matmul_backward; BF16, no biases): qkv (C -> 3C) and the attention projection
// (C -> C) where the layer has attention (the layer plan's LayerSpec::attention), fc (C -> 4C) and
// fcproj (4C -> C),
// the forward products of every layer and then the backward ones (input and weight gradients) in
// reverse. Micro steps run back to back for the given seconds; prints the median ms and TFLOP/s of
// the first and of the last tenth of them, so that the boost clock's rate and the capped one's are
// side by side. Sample the clock beside it, for example with
// nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv -lms 200.
// The algorithms: `tuned` (the default) as the trainer chooses them, each product's candidates timed
// at its first call, on a GPU that has been idle; `first`, cuBLASLt's first heuristic for every
// product; `hot`, timed at the first call after `seconds` of micro steps on the first heuristic, so
// at the clock the power cap holds (then `seconds` more are timed). The choices never change a bit
// (section Matmul of train_gpt2.cu); only which is fastest under the cap may.
//   build/bench_kernels products [tokens [seconds [tuned|first|hot]]]   (default 49152 30 tuned)
#include "dev/cuda/kernel_test.h"

#include <memory>

namespace products_bench {

// One linear layer of a block: its shape, and whether only the layers with attention have it.
struct BlockProduct {
  int in, out;  // in multiples of C
  bool attention;
};
// qkv, attproj, fc, fcproj.
const BlockProduct kBlockProducts[] = {{1, 3, true}, {1, 1, true}, {1, 4, false}, {4, 1, false}};

// The buffers every layer shares (the values do not change the work; each is larger than the L2,
// as a layer's own would be), and the products' FLOPs a micro step.
struct ProductStep {
  llmc::GPT2Config config;
  llmc::LayerPlan plan;
  int N;
  std::unique_ptr<DeviceArray<floatX>> inp, out, dinp, dout, weight, dweight;
  double flops = 0.0;

  ProductStep(const llmc::GPT2Config& c, int tokens, llmc::Rng& rng)
      : config(c), plan(llmc::layer_plan(c)), N(tokens) {
    const size_t C = c.channels, widest = 4 * C;
    const std::vector<float> activations = random_stored(rng, (size_t)N * widest, 0.0f, 1.0f);
    inp.reset(new DeviceArray<floatX>(activations));
    dout.reset(new DeviceArray<floatX>(activations));
    out.reset(new DeviceArray<floatX>((size_t)N * widest));
    dinp.reset(new DeviceArray<floatX>((size_t)N * widest));
    weight.reset(new DeviceArray<floatX>(random_stored(rng, widest * C, 0.0f, 0.02f)));
    dweight.reset(new DeviceArray<floatX>(widest * C));
    for (int l = 0; l < c.num_layers; l++) {
      for (const BlockProduct& p : kBlockProducts) {
        if (present(p, l)) flops += 3 * 2.0 * N * (p.in * C) * (p.out * C);  // forward, dinp, dweight
      }
    }
  }
  bool present(const BlockProduct& p, int l) const { return !p.attention || plan[l].attention; }

  void run() const {
    const int C = config.channels, L = config.num_layers;
    for (int l = 0; l < L; l++) {
      for (const BlockProduct& p : kBlockProducts) {
        if (present(p, l)) matmul_forward(*out, *inp, *weight, nullptr, N, p.in * C, p.out * C, nullptr, 0);
      }
    }
    for (int l = L - 1; l >= 0; l--) {
      for (int i = (int)(sizeof(kBlockProducts) / sizeof(kBlockProducts[0])) - 1; i >= 0; i--) {
        const BlockProduct& p = kBlockProducts[i];
        if (!present(p, l)) continue;
        matmul_backward(*dinp, *dweight, nullptr, nullptr, *dout, *inp, *weight, nullptr, N, p.in * C, p.out * C,
                        0u, 0);
      }
    }
  }
};

// Runs step after step for `seconds`, each between its own events, the host waiting once every
// kStepsQueued steps (a bubble of microseconds in 8 steps of tens of milliseconds); their
// milliseconds in order.
std::vector<float> run_for(const ProductStep& step, double seconds) {
  constexpr int kStepsQueued = 8;
  std::vector<cudaEvent_t> events(kStepsQueued + 1);
  for (cudaEvent_t& e : events) cudaCheck(cudaEventCreate(&e));
  std::vector<float> ms;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    cudaCheck(cudaEventRecord(events[0]));
    for (int i = 1; i <= kStepsQueued; i++) {
      step.run();
      cudaCheck(cudaEventRecord(events[i]));
    }
    cudaCheck(cudaEventSynchronize(events[kStepsQueued]));
    for (int i = 1; i <= kStepsQueued; i++) {
      float t = 0.0f;
      cudaCheck(cudaEventElapsedTime(&t, events[i - 1], events[i]));
      ms.push_back(t);
    }
  }
  for (cudaEvent_t e : events) cudaCheck(cudaEventDestroy(e));
  return ms;
}

void bench(int tokens, double seconds, const std::string& algorithms) {
  llmc::Rng rng(7);
  llmc::GPT2Config c;
  c.arch = llmc::Arch::kSpeedrun;
  c.num_layers = 12;
  c.num_heads = 6;
  c.channels = 768;
  const ProductStep step(c, tokens, rng);
  matmul_tuning = algorithms != "first";
  if (algorithms == "hot") {
    matmul_tuning = false;
    run_for(step, seconds);
    matmul_tuning = true;
  }
  step.run();  // the choice of algorithms, untimed
  cudaCheck(cudaDeviceSynchronize());
  const std::vector<float> ms = run_for(step, seconds);
  REQUIRE(ms.size() >= 20, "%zu micro steps in %.0f s: give more seconds", ms.size(), seconds);
  const size_t tenth = ms.size() / 10;
  const float first = median_ms(std::vector<float>(ms.begin(), ms.begin() + tenth));
  const float last = median_ms(std::vector<float>(ms.end() - tenth, ms.end()));
  printf("speedrun d12 block products, %d tokens a micro step: %.2f TFLOP; algorithms %s; %zu micro steps in "
         "%.0f s\n", tokens, step.flops / 1e12, algorithms.c_str(), ms.size(), seconds);
  printf("  first tenth: %8.2f ms, %6.1f TFLOP/s\n", first, step.flops / first / 1e9);
  printf("  last tenth:  %8.2f ms, %6.1f TFLOP/s\n", last, step.flops / last / 1e9);
}

int run(int argc, char** argv) {
  const int tokens = argc > 1 ? atoi(argv[1]) : 49152;
  const double seconds = argc > 2 ? atof(argv[2]) : 30.0;
  const std::string algorithms = argc > 3 ? argv[3] : "tuned";
  if (argc > 4 || tokens <= 0 || tokens % 8 != 0 || !(seconds > 0) ||
      (algorithms != "tuned" && algorithms != "first" && algorithms != "hot")) {
    fprintf(stderr, "error: bench_kernels products: give [tokens [seconds [tuned|first|hot]]], tokens a positive "
                    "multiple of 8, seconds positive\n");
    return 1;
  }
  return run_kernel_tests("bench_kernels products", [&] { bench(tokens, seconds, algorithms); });
}

}  // namespace products_bench
