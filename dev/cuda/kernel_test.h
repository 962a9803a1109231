// Shared by the kernel tests in dev/cuda/: brings in the whole CUDA trainer (TESTING leaves out
// its main) and, in namespace cpu, the FP32 CPU trainer whose layer functions are the reference;
// then device arrays that upload and download FP32 host vectors, random inputs rounded to the
// storage type (so the CPU sees exactly what the GPU sees), NaN poisoning, the tolerances of
// each build, and checks that print what they compared: check_close for values,
// check_same_bits for two runs of a kernel, which the trainer promises are bitwise identical.
#pragma once

#ifndef TESTING
#define TESTING
#endif

// train_gpt2.cpp's standard headers that train_gpt2.cu does not pull in. Included here, at global
// scope, so that train_gpt2.cpp's own #includes inside namespace cpu are skipped by their guards
// instead of declaring parts of std inside cpu::.
#include <cerrno>
#include <chrono>
#include <climits>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "train_gpt2.cu"
namespace cpu {
#include "train_gpt2.cpp"
}  // namespace cpu

#include "dev/test/testing.h"

// Tolerances, as `tol` in check_close: |got - ref| <= tol * (|ref| + rms(ref)).
#if defined(ENABLE_FP32)
// The GPU evaluates the same FP32 expressions as the CPU; only the order of additions, FMA
// contraction and the math library differ (a few units of 6e-8 per operation).
constexpr float kTolStore = 1e-5f;  // one result per element, computed from a few inputs
constexpr float kTolSum = 1e-4f;    // sums over up to thousands of terms in another order
#else
// BF16 keeps 8 significant bits. Round to nearest is within 2^-8 = 3.9e-3 of the value, stochastic
// rounding within one ulp, at most 2^-7 = 7.8e-3. Each bound is doubled to leave room for the
// FP32 arithmetic before the rounding.
constexpr float kTolStore = 8e-3f;  // an FP32 result rounded to nearest once
constexpr float kTolSum = 1.6e-2f;  // an FP32 sum written with stochastic rounding
#endif
// Results kept in FP32 in both builds (layernorm statistics, losses, norms, AdamW state and
// master weights), computed from the same stored inputs: a few FP32 roundings apart.
constexpr float kTolFP32 = 1e-5f;

// x rounded to the storage type (to nearest, as the kernels' plain stores and upload do).
inline std::vector<float> stored(std::vector<float> x) {
  for (float& v : x) v = (float)(floatX)v;
  return x;
}

// n values of N(mean, std) rounded to the storage type: exactly the values the GPU will see.
inline std::vector<float> random_stored(llmc::Rng& rng, size_t n, float mean, float std) {
  std::vector<float> x(n);
  rng.normal(x.data(), n, mean, std);
  return stored(std::move(x));
}

// The median of a timing program's runs (dev/cuda/bench_*.cu).
inline float median_ms(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median milliseconds of `reps` runs of launch(rep) on the default stream, each between its
// own events, queued back to back after `warmups` runs and synchronised once.
template <typename Launch>
float median_launch_ms(int reps, int warmups, const Launch& launch) {
  std::vector<cudaEvent_t> events(2 * (reps + warmups));
  for (cudaEvent_t& e : events) cudaCheck(cudaEventCreate(&e));
  for (int rep = 0; rep < reps + warmups; rep++) {
    cudaCheck(cudaEventRecord(events[2 * rep]));
    launch(rep);
    cudaCheck(cudaEventRecord(events[2 * rep + 1]));
  }
  cudaCheck(cudaEventSynchronize(events.back()));
  std::vector<float> ms;
  for (int rep = warmups; rep < reps + warmups; rep++) {
    float t = 0.0f;
    cudaCheck(cudaEventElapsedTime(&t, events[2 * rep], events[2 * rep + 1]));
    ms.push_back(t);
  }
  for (cudaEvent_t e : events) cudaCheck(cudaEventDestroy(e));
  return median_ms(ms);
}

inline std::vector<int> random_ints(llmc::Rng& rng, size_t n, int lo, int hi) {
  std::vector<int> x(n);
  for (int& v : x) v = lo + (int)(rng.u32() % (uint32_t)(hi - lo));
  return x;
}

// Columns [from, to) of each row of a [rows, width] matrix.
std::vector<float> columns(const std::vector<float>& x, size_t rows, int width, int from, int to) {
  std::vector<float> out;
  out.reserve(rows * (to - from));
  for (size_t r = 0; r < rows; r++) {
    const float* row = x.data() + r * width;
    out.insert(out.end(), row + from, row + to);
  }
  return out;
}

// One linear layer of the matmul tests: out[N, OC] = inp[N, C] @ weight[OC, C]^T (+ bias).
struct MatmulCase {
  const char* name;
  int N, C, OC;
  bool bias;
  bool gelu_out;  // forward: out = GELU(inp @ weight^T + bias), pre_gelu kept
  bool gelu_in;   // backward: dinp multiplied by GELU'(pre_gelu) of the input
  bool gelu_dout = false;  // backward (FP8): dout multiplied by GELU'(pre_gelu) of the output first

  void print(const char* what) const {
    printf("\n%s %s: N=%d C=%d OC=%d%s%s%s%s\n", what, name, N, C, OC, bias ? ", bias" : "",
           gelu_out ? ", GELU epilogue" : "", gelu_in ? ", GELU gradient" : "",
           gelu_dout ? ", GELU gradient into dout" : "");
  }
};

// A device buffer of n elements of T; converts to T* for the launchers.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n), ptr_(device_alloc<T>(n, "a test tensor")) {}
  template <class U>
  explicit DeviceArray(const std::vector<U>& host) : DeviceArray(host.size()) {
    upload(host);
  }
  ~DeviceArray() { device_free(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  operator T*() const { return ptr_; }
  size_t size() const { return n_; }

  // Converts each host value to T (rounding FP32 to BF16 to nearest).
  template <class U>
  void upload(const std::vector<U>& host) {
    REQUIRE(host.size() == n_, "upload of %zu values into a device array of %zu", host.size(), n_);
    const std::vector<T> converted(host.begin(), host.end());
    cudaCheck(cudaMemcpy(ptr_, converted.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> raw() const {
    std::vector<T> host(n_);
    cudaCheck(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  std::vector<float> download() const {
    const std::vector<T> host = raw();
    return std::vector<float>(host.begin(), host.end());
  }
  // All bits set: NaN in FP32 and BF16, so an element a kernel leaves unwritten fails any check.
  // Waits for the memset: it runs on the legacy default stream, which work on a non-blocking
  // stream does not wait for, so on a busy GPU a copy there could land before the poison.
  void poison() {
    cudaCheck(cudaMemset(ptr_, 0xff, n_ * sizeof(T)));
    cudaCheck(cudaDeviceSynchronize());
  }

 private:
  size_t n_;
  T* ptr_;
};

// The encoder backward's plan (encoder_backward_plan) of host `tokens`, for C channels, on the GPU.
struct DeviceEncoderPlan {
  DeviceEncoderPlan(const std::vector<int>& tokens, int C)
      : buckets(tokens.size() * encoder_plan_groups(C)), positions(tokens.size()),
        slice_sums(encoder_plan_max_slices((int)tokens.size(), C) * kEncoderGroupWidth) {
    const int n = (int)tokens.size();
    std::vector<int4> host_buckets(buckets.size());
    std::vector<int> host_positions(n);
    plan.buckets = buckets;
    plan.positions = positions;
    plan.slice_sums = slice_sums;
    encoder_backward_plan(&plan, host_buckets.data(), host_positions.data(), tokens.data(), n, C);
    REQUIRE((size_t)plan.num_slices <= encoder_plan_max_slices(n, C), "the plan's %d slices overflow their bound",
            plan.num_slices);
    buckets.upload(host_buckets);
    positions.upload(host_positions);
  }
  DeviceArray<int4> buckets;
  DeviceArray<int> positions;
  DeviceArray<float> slice_sums;
  EncoderBackwardPlan plan;
};

// Elementwise |got - ref| <= tol * (|ref| + rms(ref)): relative for ordinary elements, relative to
// the tensor's typical size for elements near zero, whose own relative error cancellation makes
// meaningless. tol = 0 asks for exact equality. NaN (a poisoned, unwritten element) always fails.
inline bool check_close(const std::string& name, const std::vector<float>& got,
                        const std::vector<float>& ref, float tol) {
  REQUIRE(got.size() == ref.size(), "%s: %zu values compared with %zu", name.c_str(), got.size(),
          ref.size());
  double squares = 0.0;
  for (float r : ref) squares += (double)r * r;
  const float rms = (float)std::sqrt(squares / std::max<size_t>(1, ref.size()));
  return testing::check_tensor(name, got.data(), ref.data(), got.size(), tol * rms, tol);
}

// What gate_rows puts in the rows' other columns: exact in BF16 and small, so that a gradient
// added onto them, or a gate read from the wrong column, would show.
constexpr float kGateFill = 3.0f;

// Record #89's MUDD gates as the kernels read them (GateRows, stride > 0): N rows of `stride` values,
// a gate's `width` values a row (one, or one a head) from `column` on, `fill` everywhere else.
inline std::vector<float> gate_rows(const std::vector<float>& gates, int width, int stride, int column, float fill) {
  const size_t N = gates.size() / width;
  std::vector<float> rows(N * stride, fill);
  for (size_t n = 0; n < N; n++) {
    for (int h = 0; h < width; h++) rows[n * stride + column + h] = gates[n * width + h];
  }
  return rows;
}

// The gate's values of such rows (inside), or all the others.
inline std::vector<float> gate_columns(const std::vector<float>& rows, int width, int stride, int column,
                                       bool inside) {
  std::vector<float> out;
  for (size_t i = 0; i < rows.size(); i++) {
    const int c = (int)(i % stride);
    if ((c >= column && c < column + width) == inside) out.push_back(rows[i]);
  }
  return out;
}

// The raw bytes of some device arrays, to check that a second run reproduces the first.
class Snapshot {
 public:
  template <class... T>
  explicit Snapshot(const DeviceArray<T>&... arrays) {
    (add(arrays), ...);
  }
  size_t count() const { return bytes_.size(); }
  const std::vector<unsigned char>& bytes(size_t i) const { return bytes_[i]; }
  size_t element_size(size_t i) const { return element_sizes_[i]; }

 private:
  template <class T>
  void add(const DeviceArray<T>& a) {
    bytes_.emplace_back(a.size() * sizeof(T));
    std::vector<unsigned char>& b = bytes_.back();
    cudaCheck(cudaMemcpy(b.data(), (T*)a, b.size(), cudaMemcpyDeviceToHost));
    element_sizes_.push_back(sizeof(T));
  }
  std::vector<std::vector<unsigned char>> bytes_;
  std::vector<size_t> element_sizes_;
};

// Passes when every array holds the same bits in both snapshots; otherwise names the first
// array that differs (by its position in the snapshot), how many elements and the first index.
inline bool check_same_bits(const std::string& what, const Snapshot& first,
                            const Snapshot& second) {
  std::string detail;
  for (size_t a = 0; a < first.count() && detail.empty(); a++) {
    const size_t size = first.element_size(a), n = first.bytes(a).size() / size;
    size_t differ = 0, first_index = 0;
    for (size_t i = 0; i < n; i++) {
      if (memcmp(&first.bytes(a)[i * size], &second.bytes(a)[i * size], size) != 0) {
        if (differ++ == 0) first_index = i;
      }
    }
    if (differ > 0) {
      detail = llmc::strformat("array %zu: %zu of %zu elements differ, the first at [%zu]", a,
                               differ, n, first_index);
    }
  }
  if (detail.empty()) printf("ok   %-24s bitwise identical to the first run\n", what.c_str());
  return testing::check(detail.empty(), what + ": " + detail);
}

// Opens the first CUDA device for a kernel test or benchmark program: prints a line naming the
// build and the GPU and sets up cuBLAS (TF32 off, so FP32 builds compare exact FP32 products).
// Returns its compute capability (89 for 8.9), or 0 without a device, which a failed check names.
inline int open_test_device(const char* program) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    testing::check(false, "a CUDA device is needed to run the kernel tests");
    return 0;
  }
  cudaDeviceProp prop;
  cudaCheck(cudaGetDeviceProperties(&prop, 0));
  printf("%s: %s build on %s\n", program, PRECISION_NAME, prop.name);
  matmul_setup(false);
  return prop.major * 10 + prop.minor;
}

// Runs `checks`, turning an llmc::Error into a failed check.
inline void run_checks(const std::function<void()>& checks) {
  try {
    checks();
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("error: ") + e.what());
  }
}

// main() of a benchmark of dev/cuda/bench_*.cu: the device opened, the timings run, and
// testing::summary's line and exit status (an llmc::Error is a failure).
inline int run_kernel_tests(const char* program, const std::function<void()>& tests) {
  if (open_test_device(program) > 0) {
    run_checks(tests);
    matmul_teardown();
  }
  return testing::summary(program);
}

// One suite of a kernel test program: the name that runs it (its file's: dev/cuda/test_NAME.cu),
// the function that runs its checks, and the compute capability its kernels need (0: any GPU).
struct KernelSuite {
  const char* name;
  void (*run)();
  int compute_capability = 0;
};

// The suites' names, "a, b, c".
inline std::string suite_names(const std::vector<KernelSuite>& suites) {
  std::string names;
  for (const KernelSuite& s : suites) names += (names.empty() ? "" : ", ") + std::string(s.name);
  return names;
}

// The suites that `program NAME...` names, all of them without names, in the order given; nullopt
// after an error line naming an unknown one.
inline std::optional<std::vector<KernelSuite>> chosen_suites(const char* program,
                                                              const std::vector<KernelSuite>& suites,
                                                              int argc, char** argv) {
  if (argc < 2) return suites;
  std::vector<KernelSuite> chosen;
  for (int i = 1; i < argc; i++) {
    auto found = std::find_if(suites.begin(), suites.end(),
                              [&](const KernelSuite& s) { return std::string(s.name) == argv[i]; });
    if (found == suites.end()) {
      fprintf(stderr, "error: %s: no suite '%s': the suites are %s (%s --list)\n", program, argv[i],
              suite_names(suites).c_str(), program);
      return std::nullopt;
    }
    chosen.push_back(*found);
  }
  return chosen;
}

// main() of a kernel test program (dev/cuda/test_kernels.cu): `PROGRAM [--list | SUITE...]` runs
// the suites named, or all. Each suite ends with its own line of counts, "NAME: N passed, M
// failed"; an llmc::Error fails its suite and the next one runs. A suite whose kernels need a newer
// GPU is skipped with a line saying so. Ends with testing::summary's line and exit status.
inline int run_kernel_suites(const std::vector<KernelSuite>& suites, int argc, char** argv) {
  const char* slash = strrchr(argv[0], '/');
  const char* program = slash ? slash + 1 : argv[0];
  const std::string first = argc > 1 ? argv[1] : "";
  if (argc == 2 && (first == "--list" || first == "-h" || first == "--help")) {
    if (first != "--list") printf("usage: %s [--list | SUITE...]   (no SUITE: every suite, in this order)\n", program);
    for (const KernelSuite& s : suites) printf("%s\n", s.name);
    return 0;
  }
  const std::optional<std::vector<KernelSuite>> chosen = chosen_suites(program, suites, argc, argv);
  if (!chosen) return 1;
  const int compute_capability = open_test_device(program);
  if (compute_capability == 0) return testing::summary(program);
  for (const KernelSuite& suite : *chosen) {
    if (compute_capability < suite.compute_capability) {
      printf("\nskip %s: its kernels need compute capability %d.%d or newer, this GPU has %d.%d\n", suite.name,
             suite.compute_capability / 10, suite.compute_capability % 10, compute_capability / 10,
             compute_capability % 10);
      continue;
    }
    printf("\n=== suite %s\n", suite.name);
    const int passed = testing::passed_count(), failed = testing::failed_count();
    run_checks(suite.run);
    printf("%s: %d passed, %d failed\n", suite.name, testing::passed_count() - passed,
           testing::failed_count() - failed);
  }
  matmul_teardown();
  return testing::summary(program);
}
