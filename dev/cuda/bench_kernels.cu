// The kernel timings of dev/cuda/bench_*.cu as one program (BF16), so that the trainer is compiled
// once for all of them:
//   build/bench_kernels NAME [ARGS...]   (build/bench_kernels --list: the names)
// ARGS are the benchmark's own, described at the top of dev/cuda/bench_NAME.cu.
#include "dev/cuda/kernel_test.h"

#include "dev/cuda/bench_attention.cu"
#include "dev/cuda/bench_fp8_cast.cu"
#include "dev/cuda/bench_gemm.cu"
#include "dev/cuda/bench_muon.cu"
#include "dev/cuda/bench_overlap.cu"
#include "dev/cuda/bench_products.cu"
#include "dev/cuda/bench_record89.cu"

// A benchmark: its name on the command line, and its main, which reads the arguments after the
// name (argv[0] is the name).
struct Benchmark {
  const char* name;
  int (*run)(int argc, char** argv);
};

const Benchmark kBenchmarks[] = {
    {"attention", attention_bench::run}, {"fp8_cast", fp8_cast_bench::run}, {"gemm", gemm_bench::run},
    {"muon", muon_bench::run},           {"overlap", overlap_bench::run},
    {"products", products_bench::run},   {"record89", record89_bench::run},
};

int main(int argc, char** argv) {
  std::string names;
  for (const Benchmark& b : kBenchmarks) names += (names.empty() ? "" : ", ") + std::string(b.name);
  const std::string first = argc > 1 ? argv[1] : "";
  if (first == "--list") {
    for (const Benchmark& b : kBenchmarks) printf("%s\n", b.name);
    return 0;
  }
  for (const Benchmark& b : kBenchmarks) {
    if (first != b.name) continue;
    try {
      return b.run(argc - 1, argv + 1);
    } catch (const llmc::Error& e) {
      fprintf(stderr, "error: bench_kernels %s: %s\n", b.name, e.what());
      return 1;
    }
  }
  if (first.empty()) {
    fprintf(stderr, "error: bench_kernels: give a benchmark's name, one of %s, and its arguments\n", names.c_str());
  } else {
    fprintf(stderr, "error: bench_kernels: no benchmark '%s': give one of %s (bench_kernels --list)\n",
            first.c_str(), names.c_str());
  }
  return 1;
}
