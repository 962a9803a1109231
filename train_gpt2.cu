// Training GPT-2-like models in one CUDA file: GPT-2's architecture, a modern one (modded-nanogpt's
// baseline: RMSNorm, QK-norm and rotary positions, ReLU^2, an untied head, a soft cap) and its
// speedrun record's block (value embeddings, x0 lambdas, U-net skips, gated heads), every forward
// and backward kernel, the model, the optimizers (AdamW, and Muon for the blocks' matrices),
// gradient accumulation, the multi-GPU loop and the command line. test_gpt2.cu, profile_gpt2.cu
// and the kernel tests in dev/cuda/ #define TESTING and #include this file.
//
// Contents
//   1. Utilities and precision   floatX, error checks, 128-bit vectors, stochastic rounding
//   2. Column reduction           deterministic FP32 sums over rows (bias and layernorm grads) and
//                                 over row blocks (scalar grads)
//   3. Encoder                    token + position embedding, bucketed deterministic backward;
//                                 record #89's smear and bigram hash embedding, the gated adds
//                                 into the stream (the bigram embedding, x0) and its gated skip
//   4. Normalisation              LayerNorm and RMSNorm (with or without a gain): forward, fused
//                                 residual + forward, fused backward; the speedrun's residual mix
//                                 (U-net skip, x0 lambdas)
//   5. Matmul                     cuBLASLt with bias / GELU epilogues, bias gradient; FP8 linear
//                                 layers (amax, casts, cast-transpose, scaled FP8 products); the
//                                 speedrun head's FP8 layer with fixed scales (its gradient's
//                                 bytes transposed); record #89's attention lambdas (the
//                                 attention's weights scaled, their gradients)
//   6. Attention                  QK-norm and rotary positions; the speedrun's value mix and head
//                                 gates, record #89's XSA and head gates; causal attention, or within
//                                 documents and a window of 128-token blocks or of tokens: flash
//                                 kernels (BF16), batched GEMMs; one query against a KV cache; on
//                                 Hopper, a product of our own (TMA, wgmma) with the MLP's ReLU^2
//                                 and ReLU^2' in its epilogue; record #89's composed attention
//   7. GELU and ReLU^2            forward and backward; record #89's MUDD gate rows (the generators'
//                                 bias and scale)
//   8. Classifier                 fused softmax + cross-entropy + dlogits (or, for the FP8 head,
//                                 their E5M2 cast), optional soft cap, the later tokens' and the
//                                 prefix tokens' loss terms
//   9. Norms and optimizers       global gradient norm, AdamW with stochastic rounding, Muon
//                                 (batched BF16 Newton-Schulz, NorMuon's second moment)
//  10. Model                      parameter and activation tables, the architectures' steps
//                                 (GPT-2's, the modern or the speedrun's), the block features
//                                 (the value mix, the attention gate, the residual mix: each one
//                                 group of its rows, forward, backward and decoding), the block
//                                 (forward and backward, written once), the attention's documents
//                                 and windows, record #89's MUDD gate generators and dense
//                                 connections, the training passes, the optimizers' update (the
//                                 embedding tied to the head up to an untie step)
//  11. Generation                 decoding with a KV cache through the block, temperature and
//                                 top-k sampling
//  12. Checkpoints                model, optimizer state, RNGs and data position; exact resume
//  13. Multi-GPU                  NCCL data parallel (overlapped reduction, ZeRO-1, the optimizers
//                                 divided, the embedding tables' rows sent to their owners),
//                                 launched by mpirun, srun or by hand (rendezvous), no-progress
//                                 watchdog
//  14. Command line and main      (#ifndef TESTING)
//
// Determinism: no kernel uses floating-point atomics or a launch shape derived from the GPU's
// SM count for a reduction, so the same seed and configuration give bitwise-identical results
// on one GPU model with the same library versions. Not across models of one architecture: an
// H100's runs and an H200's differ, cuBLASLt's heuristic (whose algorithm fixes a product's bits)
// being free to choose by model.
#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <csignal>
#include <sys/mman.h>
#include <unistd.h>

#include <cooperative_groups.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <omp.h>

#include "llmc/attention_blocks.h"
#include "llmc/bigram_hash.h"
#include "llmc/checkpoint_files.h"
#include "llmc/checkpoint_writer.h"
#include "llmc/dataloader.h"
#include "llmc/flags.h"
#include "llmc/gpt2.h"
#include "llmc/hellaswag.h"
#include "llmc/logger.h"
#include "llmc/outlier.h"
#include "llmc/progress.h"
#include "llmc/rand.h"
#include "llmc/recipe.h"
#include "llmc/record_flags.h"
#include "llmc/rendezvous.h"
#include "llmc/reshard.h"
#include "llmc/schedulers.h"
#include "llmc/sparse_rows.h"
#include "llmc/tokenizer.h"
#include "llmc/train_state.h"
#include "llmc/utils.h"
#include "llmc/watchdog.h"
#include "llmc/yarn.h"

// ============================================================================
// 1. Utilities and precision
// ============================================================================

#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "FP32"
constexpr cudaDataType_t kCudaFloatX = CUDA_R_32F;
constexpr int kCheckpointVersionFloatX = llmc::kCheckpointVersionFP32;
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "BF16"
constexpr cudaDataType_t kCudaFloatX = CUDA_R_16BF;
constexpr int kCheckpointVersionFloatX = llmc::kCheckpointVersionBF16;
#endif

constexpr int WARP_SIZE = 32;

inline void cuda_check(cudaError_t error, const char* file, int line) {
  if (error != cudaSuccess) {
    LLMC_FAIL("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(error));
  }
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
// After every kernel launch: catches bad launch configurations at the launch site.
#define cudaCheckLaunch() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

inline void cublas_check(cublasStatus_t status, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    LLMC_FAIL("cuBLAS error %d at %s:%d", (int)status, file, line);
  }
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)

#define REQUIRE(cond, ...) \
  do {                     \
    if (!(cond)) LLMC_FAIL(__VA_ARGS__); \
  } while (0)

// Dynamic shared memory a block may opt into on this GPU, queried once.
inline int shared_memory_optin() {
  static const int bytes = [] {
    int device = 0, optin = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return optin;
  }();
  return bytes;
}

// Device allocations go through here so that running out of memory says how much was asked
// for, how much is free, and what to change. The sizes are kept so that the trainer can report
// its peak memory, the figure PyTorch's max_memory_allocated gives for the peer.
struct DeviceMemoryStats {
  std::unordered_map<void*, size_t> sizes;
  size_t current = 0, peak = 0;
} g_device_memory;

template <class T>
T* device_alloc(size_t count, const char* what) {
  void* p = nullptr;
  size_t bytes = count * sizeof(T);
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    LLMC_FAIL("not enough GPU memory for %s: needs %.1f MiB, %.1f MiB free of %.1f MiB; "
              "reduce the micro batch (-b) or sequence length (-t), or recompute more (-r 1)",
              what, bytes / 1048576.0, free_bytes / 1048576.0, total_bytes / 1048576.0);
  }
  cudaCheck(err);
  g_device_memory.sizes[p] = bytes;
  g_device_memory.current += bytes;
  g_device_memory.peak = std::max(g_device_memory.peak, g_device_memory.current);
  return (T*)p;
}

// As device_alloc, for memory the trainer can do without: nullptr when the GPU has less than
// `bytes` free beyond `spare` (for what is allocated later: the decoder's cache, libraries).
void* device_try_alloc(size_t bytes, size_t spare) {
  size_t free_bytes = 0, total_bytes = 0;
  cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < bytes + spare) return nullptr;
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // a refused allocation is not an error for the next launch check to report
    return nullptr;
  }
  g_device_memory.sizes[p] = bytes;
  g_device_memory.current += bytes;
  g_device_memory.peak = std::max(g_device_memory.peak, g_device_memory.current);
  return p;
}

// The device bytes that allocate() adds, for the start-up table's memory by owner.
template <class Allocate>
size_t device_bytes_of(Allocate allocate) {
  const size_t before = g_device_memory.current;
  allocate();
  return g_device_memory.current - before;
}

void device_free(void* p) {
  if (!p) return;
  auto it = g_device_memory.sizes.find(p);
  if (it != g_device_memory.sizes.end()) {
    g_device_memory.current -= it->second;
    g_device_memory.sizes.erase(it);
  }
  cudaCheck(cudaFree(p));
}

// Host memory pinned for a run's checkpoints (21.8 GB at d48). cudaMallocHost zeroes and locks
// every 4 KiB page on one thread (8-13 s at d48 before the first step); here the pages are
// transparent huge pages where the kernel allows (512 times fewer to fault and lock), first
// touched on several threads, then locked with cudaHostRegister. Memory the host does not have
// available is refused up front, as a failed pin, rather than left for the kernel's OOM killer
// to find while the pages are touched. Free with pinned_host_free and the same size.
size_t host_available_bytes() {
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) return SIZE_MAX;  // unknown: cudaHostRegister decides
  char line[256];
  size_t kib = SIZE_MAX;
  while (fgets(line, sizeof(line), f)) {
    unsigned long long value = 0;
    if (sscanf(line, "MemAvailable: %llu kB", &value) == 1) kib = (size_t)value;
  }
  fclose(f);
  return kib == SIZE_MAX ? SIZE_MAX : kib << 10;
}

cudaError_t pinned_host_alloc(void** out, size_t bytes) {
  *out = nullptr;
  if (bytes > host_available_bytes()) return cudaErrorMemoryAllocation;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
  madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without transparent huge pages, 4 KiB pages
  constexpr size_t kPage = 4096;
  const long pages = (long)((bytes + kPage - 1) / kPage);
#pragma omp parallel for num_threads(llmc::host_pass_threads()) schedule(static)
  for (long i = 0; i < pages; i++) ((volatile char*)p)[(size_t)i * kPage] = 0;
  const cudaError_t error = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (error != cudaSuccess) {
    cudaGetLastError();  // a refused pin is not an error for the next launch check to report
    munmap(p, bytes);
    return error;
  }
  *out = p;
  return cudaSuccess;
}

void pinned_host_free(void* p, size_t bytes) {
  if (!p) return;
  cudaCheck(cudaHostUnregister(p));
  munmap(p, bytes);
}

// Runs piece(at, bytes) over the 4 MiB pieces of `bytes` on several threads: a host pass over
// gigabytes.
template <class Piece>
void host_pass_parallel(size_t bytes, Piece piece) {
  constexpr size_t kBlock = 4ul << 20;
  const long blocks = (long)((bytes + kBlock - 1) / kBlock);
#pragma omp parallel for num_threads(llmc::host_pass_threads()) schedule(static)
  for (long i = 0; i < blocks; i++) {
    const size_t at = (size_t)i * kBlock;
    piece(at, std::min(kBlock, bytes - at));
  }
}

void host_zero_parallel(void* dst, size_t bytes) {
  host_pass_parallel(bytes, [&](size_t at, size_t n) { memset((char*)dst + at, 0, n); });
}

// Copies between the GPU and pageable host memory through two pinned pieces, returning once done.
// The driver's own path for pageable memory runs at a small fraction of the speed of copies from
// pinned memory (dev/notes/code-structure.md): here the host side is a memcpy on several threads,
// which overlaps the other piece's transfer. Small copies, and hosts that cannot pin the pieces,
// take the direct path.
constexpr size_t kPinnedPieceBytes = 64ul << 20;

void host_copy_parallel(void* dst, const void* src, size_t bytes) {
  host_pass_parallel(bytes, [&](size_t at, size_t n) { memcpy((char*)dst + at, (const char*)src + at, n); });
}

// The two pieces and their events; ok is false where they could not be had (then nothing is held).
struct PinnedPieces {
  char* pieces[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};  // the transfer of each piece
  cudaStream_t stream = nullptr;
  bool ok = false;
  explicit PinnedPieces(cudaStream_t s) : stream(s) {
    ok = cudaMallocHost(&pieces[0], 2 * kPinnedPieceBytes) == cudaSuccess;
    for (cudaEvent_t& e : done) ok = ok && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess;
    if (!ok) {
      cudaGetLastError();  // the direct path instead; not an error for a later check to report
      release();
      return;
    }
    pieces[1] = pieces[0] + kPinnedPieceBytes;
  }
  PinnedPieces(const PinnedPieces&) = delete;
  PinnedPieces& operator=(const PinnedPieces&) = delete;
  // Also on the way out of a failed copy, so nothing here may throw: the transfers still queued
  // end before their pieces are freed.
  ~PinnedPieces() {
    if (ok) cudaStreamSynchronize(stream);
    release();
  }
  void release() {
    for (cudaEvent_t& e : done) {
      if (e) cudaEventDestroy(e);
      e = nullptr;
    }
    if (pieces[0]) cudaFreeHost(pieces[0]);
    pieces[0] = pieces[1] = nullptr;
  }
};

// Returns whether the copy went through the pinned pieces (the tests check that it does).
bool copy_pageable(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  REQUIRE(kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost,
          "copy_pageable copies between the host and the GPU only");
  std::unique_ptr<PinnedPieces> pinned;
  if (bytes > kPinnedPieceBytes) pinned.reset(new PinnedPieces(stream));
  if (!pinned || !pinned->ok) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, kind, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    return false;
  }
  PinnedPieces& staging = *pinned;
  const size_t count = (bytes + kPinnedPieceBytes - 1) / kPinnedPieceBytes;
  auto span = [&](size_t i) { return std::min(kPinnedPieceBytes, bytes - i * kPinnedPieceBytes); };
  char* d = (char*)dst;
  const char* s = (const char*)src;
  if (kind == cudaMemcpyHostToDevice) {
    for (size_t i = 0; i < count; i++) {
      const size_t at = i * kPinnedPieceBytes;
      if (i >= 2) cudaCheck(cudaEventSynchronize(staging.done[i % 2]));  // its last transfer has read it
      host_copy_parallel(staging.pieces[i % 2], s + at, span(i));
      cudaCheck(cudaMemcpyAsync(d + at, staging.pieces[i % 2], span(i), kind, stream));
      cudaCheck(cudaEventRecord(staging.done[i % 2], stream));
    }
  } else {
    auto transfer = [&](size_t i) {
      cudaCheck(cudaMemcpyAsync(staging.pieces[i % 2], s + i * kPinnedPieceBytes, span(i), kind, stream));
      cudaCheck(cudaEventRecord(staging.done[i % 2], stream));
    };
    transfer(0);
    for (size_t i = 0; i < count; i++) {
      if (i + 1 < count) transfer(i + 1);  // into the piece emptied by the step before
      cudaCheck(cudaEventSynchronize(staging.done[i % 2]));
      host_copy_parallel(d + i * kPinnedPieceBytes, staging.pieces[i % 2], span(i));
    }
  }
  cudaCheck(cudaStreamSynchronize(stream));
  return true;
}

// A pinned host buffer a stream copies to the GPU from, without the host waiting for the stream's
// other work: a copy from pageable memory may wait for all of it (the driver stages it in order),
// one from pinned memory is only queued. The host writes the buffer (upload_staging_host) once the
// stream has read the last upload from it (its event), not before. The training passes upload
// their inputs, targets, encoder plan and the mask's metadata through these, so the host prepares
// the next micro step while the GPU still runs this one.
struct UploadStaging {
  void* host = nullptr;
  size_t capacity = 0;  // bytes
  cudaEvent_t read = nullptr;  // the last upload's copy
};

void upload_staging_free(UploadStaging& s) {
  if (s.read) {
    cudaCheck(cudaEventSynchronize(s.read));
    cudaCheck(cudaEventDestroy(s.read));
  }
  if (s.host) cudaCheck(cudaFreeHost(s.host));
  s = UploadStaging();
}

// At least `bytes` of buffer, in place of a smaller one (whose last upload is waited for).
void upload_staging_allocate(UploadStaging& s, size_t bytes) {
  if (bytes <= s.capacity) return;
  upload_staging_free(s);
  cudaCheck(cudaMallocHost(&s.host, bytes));
  cudaCheck(cudaEventCreateWithFlags(&s.read, cudaEventDisableTiming));
  s.capacity = bytes;
}

// The buffer, for the host to write the next upload into, once the last one has been read.
template <class T>
T* upload_staging_host(UploadStaging& s) {
  cudaCheck(cudaEventSynchronize(s.read));
  return (T*)s.host;
}

// Queues the copy of the buffer's first `bytes` to `device` on `stream`.
void upload_staging_copy(UploadStaging& s, void* device, size_t bytes, cudaStream_t stream) {
  REQUIRE(bytes <= s.capacity, "an upload of %zu bytes from a staging buffer of %zu", bytes, s.capacity);
  cudaCheck(cudaMemcpyAsync(device, s.host, bytes, cudaMemcpyHostToDevice, stream));
  cudaCheck(cudaEventRecord(s.read, stream));
}

__host__ __device__ inline int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

// 16 bytes of T, loaded and stored with one instruction.
template <class T>
struct alignas(16) Packed128 {
  static constexpr int size = 16 / sizeof(T);
  T payload[size];
  __device__ T& operator[](int i) { return payload[i]; }
  __device__ const T& operator[](int i) const { return payload[i]; }
};
typedef Packed128<floatX> x128;
typedef Packed128<float> f128;

template <class T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {
  return *reinterpret_cast<const Packed128<T>*>(p);
}
// Streaming load for data read exactly once (keeps it from evicting reused data).
template <class T>
__device__ __forceinline__ Packed128<T> load128cs(const T* p) {
  Packed128<T> out;
  *reinterpret_cast<int4*>(&out) = __ldcs(reinterpret_cast<const int4*>(p));
  return out;
}
template <class T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& v) {
  *reinterpret_cast<Packed128<T>*>(p) = v;
}

// FP32 values rounded to the storage type (to nearest even); in BF16 builds a pair at a time: a
// cast apiece is an instruction of the SM's 16-lane conversion unit for each value (the unit the
// exponentials take), one packing conversion for two is not.
__device__ __forceinline__ x128 round_x128(const float f[x128::size]) {
  x128 out;
#if defined(ENABLE_FP32)
#pragma unroll
  for (int k = 0; k < x128::size; k++) out[k] = f[k];
#else
#pragma unroll
  for (int k = 0; k < x128::size; k += 2) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(f[k], f[k + 1]);
    out[k] = pair.x;
    out[k + 1] = pair.y;
  }
#endif
  return out;
}

// 16 bytes global -> shared without passing through registers (cp.async, cached in L2 only);
// with valid false nothing is read and the 16 bytes are filled with zeros.
template <class T>
__device__ __forceinline__ void copy_async_16(T* dst, const T* src, bool valid) {
  const uint32_t addr = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void copy_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// 2^x in one instruction (MUFU.EX2). Results below 2^-126 flush to zero, which a softmax
// probability summed in FP32 never notices; exp2f adds a denormal-range fix-up around it.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1/x in one instruction (MUFU.RCP, within 1 ulp), results below 2^-126 flushed to zero; 1.0f / x
// adds a Newton step and a slow path for IEEE rounding.
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_reduce_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}
__device__ __forceinline__ float warp_reduce_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
  return v;
}

// Sum over the block in a fixed tree; every thread gets the result. `shared` holds 32 floats.
__device__ float block_reduce_sum(float v, float* shared) {
  const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
  const int num_warps = blockDim.x / WARP_SIZE;
  v = warp_reduce_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < num_warps ? shared[lane] : 0.0f;
  return warp_reduce_sum(v);
}

// Stochastic rounding to the storage type: adds 16 random bits below the BF16 mantissa and
// truncates, so the expected value of the rounded number equals the FP32 input. The random bits
// are a hash of (seed, element index), not of the thread, so results do not depend on the launch
// shape. In FP32 builds this is a plain store.
__device__ __forceinline__ uint32_t hash_u32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ floatX round_stochastic(float x, uint32_t seed, size_t index) {
#if defined(ENABLE_FP32)
  return x;
#else
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);  // Inf and NaN
  uint32_t r = hash_u32((uint32_t)index ^ hash_u32(seed ^ (uint32_t)(index >> 32) * 0x9e3779b9u));
  bits += r & 0xffffu;
  return __ushort_as_bfloat16((unsigned short)(bits >> 16));
#endif
}

// The storage type's value of x cut toward zero: in BF16 builds its high 16 bits, the weight that
// record #89's reference keeps beside a 16-bit mantissa (the two its FP32 master; Inf and NaN
// rounded as they are). In FP32 builds a plain store.
__device__ __forceinline__ floatX round_toward_zero(float x) {
#if defined(ENABLE_FP32)
  return x;
#else
  const uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);
  return __ushort_as_bfloat16((unsigned short)(bits >> 16));
#endif
}

// Host-side conversions between the storage type and FP32 (a d48 model's 1.56B parameters at a
// start or resume: on several threads).
void floatX_to_float(float* dst, const floatX* src, size_t n) {
#pragma omp parallel for num_threads(llmc::host_pass_threads()) schedule(static)
  for (long i = 0; i < (long)n; i++) dst[i] = (float)src[i];
}
void float_to_floatX(floatX* dst, const float* src, size_t n) {
#pragma omp parallel for num_threads(llmc::host_pass_threads()) schedule(static)
  for (long i = 0; i < (long)n; i++) dst[i] = (floatX)src[i];
}

// Copies n device values of the storage type into a host FP32 vector.
std::vector<float> device_to_host_float(const floatX* d, size_t n) {
  std::vector<floatX> tmp(n);
  cudaCheck(cudaMemcpy(tmp.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  floatX_to_float(out.data(), tmp.data(), n);
  return out;
}

// dst[i] = round(dst[i] + src[i]) with stochastic rounding. Floor: 3 passes over n elements.
__global__ void add_inplace_kernel(floatX* dst, const floatX* src, size_t n, uint32_t seed) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= n) return;
  const x128 a = load128(dst + i), b = load128cs(src + i);
  x128 out;
  for (int k = 0; k < x128::size; k++) out[k] = round_stochastic((float)a[k] + (float)b[k], seed, i + k);
  store128(dst + i, out);
}

void add_inplace(floatX* dst, const floatX* src, size_t n, uint32_t seed, cudaStream_t stream) {
  REQUIRE(n % x128::size == 0, "add_inplace: n=%zu must be a multiple of %d", n, x128::size);
  add_inplace_kernel<<<ceil_div(n / x128::size, 256), 256, 0, stream>>>(dst, src, n, seed);
  cudaCheckLaunch();
}

// dst[r, j] = round(dst[r, j] + src[r, j]) for j < cols with stochastic rounding, dst's rows
// ld_dst apart and src's ld_src: add_inplace's bits where src's other columns would be zero (each
// element draws the same random bits, from its index in dst; adding zero changes no BF16 value).
__global__ void add_columns_inplace_kernel(floatX* dst, int ld_dst, const floatX* src, int ld_src, int rows,
                                           int cols, uint32_t seed) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * cols) return;
  const size_t r = i / cols, j = i % cols, at = r * ld_dst + j;
  dst[at] = round_stochastic((float)dst[at] + (float)src[r * ld_src + j], seed, at);
}

void add_columns_inplace(floatX* dst, int ld_dst, const floatX* src, int ld_src, int rows, int cols, uint32_t seed,
                         cudaStream_t stream) {
  REQUIRE(rows > 0 && cols > 0 && cols <= ld_dst && cols <= ld_src,
          "add_columns_inplace: %d rows of %d columns, rows %d and %d apart", rows, cols, ld_dst, ld_src);
  add_columns_inplace_kernel<<<ceil_div((long)rows * cols, 256), 256, 0, stream>>>(dst, ld_dst, src, ld_src, rows,
                                                                                   cols, seed);
  cudaCheckLaunch();
}

// ============================================================================
// 2. Column reduction
// ============================================================================
// Bias gradients and layernorm dgamma/dbeta are sums over all B*T rows. They are reduced in two
// fixed-order stages: each of kRowBlocks row blocks writes FP32 partial sums, then a finalize
// kernel adds the partials in block order and adds the total into the gradient with one
// stochastic rounding. kRowBlocks is a constant (not the SM count) so results do not depend on
// which GPU runs them. Floor: one read of the N x C input, C writes. Where a kernel already holds
// the rows it writes, it writes the partials itself and the finalize is all that remains: the
// layernorm backward for the projections' bias gradients (section 4), the flash backward per
// 64-row tile for the qkv bias (section 6). Scalar gradients (the speedrun's lambdas, skip and
// value-scale weights) are sums over all N x C elements, reduced the same way: each row block's
// threads add their elements in order, the block adds the threads in block_reduce_sum's fixed tree
// and writes one partial per scalar (row_block_sums_store), and column_sum_finalize adds the
// kRowBlocks partials with one column per scalar.

constexpr int kRowBlocks = 256;

__host__ __device__ inline int rows_per_block(int N) { return ceil_div(N, kRowBlocks); }

// partials[block][c] = sum of inp[r][c] over the rows r of the block, C a multiple of 8.
// grid (ceil(C / 256), kRowBlocks), block (32, kColumnSumRowLanes): thread (x, y) reads 16-byte
// pieces (8 columns) x of rows y, y + kColumnSumRowLanes, ... of the row block, four rows' loads in
// flight at a time, and adds them in row order; the row lanes' sums are then added in lane order.
constexpr int kColumnSumRowLanes = 8;

__global__ void column_sum_partials_kernel(float* partials, const floatX* inp, int N, int C) {
  __shared__ float lane_sums[kColumnSumRowLanes][x128::size][WARP_SIZE];
  const int c = (blockIdx.x * WARP_SIZE + threadIdx.x) * x128::size;
  const int rpb = rows_per_block(N);
  const int r0 = blockIdx.y * rpb, r1 = min(N, r0 + rpb);
  float sum[x128::size] = {};
  if (c < C) {
    constexpr int kInFlight = 4;
    int row = r0 + threadIdx.y;
    for (; row + (kInFlight - 1) * kColumnSumRowLanes < r1; row += kInFlight * kColumnSumRowLanes) {
      x128 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; u++) v[u] = load128(inp + (size_t)(row + u * kColumnSumRowLanes) * C + c);
#pragma unroll
      for (int u = 0; u < kInFlight; u++) {
        for (int k = 0; k < x128::size; k++) sum[k] += (float)v[u][k];
      }
    }
    for (; row < r1; row += kColumnSumRowLanes) {
      const x128 v = load128(inp + (size_t)row * C + c);
      for (int k = 0; k < x128::size; k++) sum[k] += (float)v[k];
    }
  }
  for (int k = 0; k < x128::size; k++) lane_sums[threadIdx.y][k][threadIdx.x] = sum[k];
  __syncthreads();
  // Thread t adds up piece t % 32's element t / 32 over the row lanes.
  const int t = threadIdx.y * WARP_SIZE + threadIdx.x;
  if (t >= x128::size * WARP_SIZE) return;
  const int piece = t % WARP_SIZE, k = t / WARP_SIZE;
  const int col = (blockIdx.x * WARP_SIZE + piece) * x128::size + k;
  if (col >= C) return;
  float total = 0.0f;
  for (int y = 0; y < kColumnSumRowLanes; y++) total += lane_sums[y][k][piece];
  partials[(size_t)blockIdx.y * C + col] = total;
}

// dst[c] = round(dst[c] + sum over blocks of partials[block * stride + c]), blocks 0..rows-1.
// grid ceil(C / 32), block (32, kColumnSumRowLanes): lane y adds blocks y, y + kColumnSumRowLanes,
// ... in order, then the lanes' sums are added in lane order.
__global__ void column_sum_finalize_kernel(floatX* dst, const float* partials, int stride, int C,
                                           int rows, uint32_t seed) {
  __shared__ float lane_sums[kColumnSumRowLanes][WARP_SIZE];
  const int c = blockIdx.x * WARP_SIZE + threadIdx.x;
  float sum = 0.0f;
  if (c < C) {
#pragma unroll 8
    for (int b = threadIdx.y; b < rows; b += kColumnSumRowLanes) sum += partials[(size_t)b * stride + c];
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float total = 0.0f;
  for (int y = 0; y < kColumnSumRowLanes; y++) total += lane_sums[y][threadIdx.x];
  dst[c] = round_stochastic((float)dst[c] + total, seed, c);
}

void column_sum_finalize(floatX* dst, const float* partials, int stride, int C, int rows,
                         uint32_t seed, cudaStream_t stream) {
  column_sum_finalize_kernel<<<ceil_div(C, WARP_SIZE), dim3(WARP_SIZE, kColumnSumRowLanes), 0, stream>>>(
      dst, partials, stride, C, rows, seed);
  cudaCheckLaunch();
}

// The elements [begin, end) of row block blockIdx.x of an [N, C] tensor: its rows_per_block(N)
// rows (none for the blocks past N).
struct RowBlockRange {
  size_t begin, end;
};
__device__ __forceinline__ RowBlockRange row_block_range(int N, int C) {
  const long rpb = rows_per_block(N);
  const long r0 = min((long)N, blockIdx.x * rpb), r1 = min((long)N, r0 + rpb);
  return {(size_t)r0 * C, (size_t)r1 * C};
}

// partials[blockIdx.x * K + k] = the sum of sums[k] over the block's threads (a 1-D block of whole
// warps), in block_reduce_sum's fixed tree: one partial per scalar for column_sum_finalize.
template <int K>
__device__ void row_block_sums_store(float* partials, const float (&sums)[K]) {
  __shared__ float shared[WARP_SIZE];
  for (int k = 0; k < K; k++) {
    const float total = block_reduce_sum(sums[k], shared);
    if (threadIdx.x == 0) partials[blockIdx.x * K + k] = total;
  }
}

// ============================================================================
// 3. Encoder
// ============================================================================
// Forward: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] (wte alone where the architecture has no
// learned positions: wpe null). Floor: read B*T*C of each table, write B*T*C.
// Backward, deterministic and without atomics:
//  - dwpe[t,:] += sum over b of dout[b,t,:], each (t, channel) summed over b in order (none
//    without wpe);
//  - dwte by buckets: a bucket is (token id, group of channels one warp covers); the CPU plans
//    the buckets from the inputs (positions in increasing order, buckets sorted largest first so
//    the long ones start early), each warp sums its bucket in FP32 and writes the row once; a
//    bucket of more than 128 positions is cut into slices of 64, each slice summed by a warp of
//    its own (every long bucket's slices at once, over the whole GPU), then one block a bucket
//    adds its slices' sums: its warps contiguous runs of them in order, then the runs in warp
//    order.

__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte,
                                       const floatX* wpe, int B, int T, int C) {
  const size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (idx >= (size_t)B * T * C) return;
  const int bt = idx / C, c = idx % C, t = bt % T;
  const x128 w = load128(wte + (size_t)inp[bt] * C + c);
  if (!wpe) {
    store128(out + idx, w);
    return;
  }
  const x128 p = load128(wpe + (size_t)t * C + c);
  x128 o;
  for (int k = 0; k < x128::size; k++) o[k] = (floatX)((float)w[k] + (float)p[k]);
  store128(out + idx, o);
}

void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B,
                     int T, int C, cudaStream_t stream) {
  REQUIRE(C % x128::size == 0, "encoder_forward: C=%d must be a multiple of %d", C, x128::size);
  const int threads = 256;
  encoder_forward_kernel<<<ceil_div((long)B * T * C / x128::size, threads), threads, 0, stream>>>(
      out, inp, wte, wpe, B, T, C);
  cudaCheckLaunch();
}

__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C,
                                            uint32_t seed) {
  const int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (idx >= T * C) return;
  float acc[x128::size] = {};
  for (int b = 0; b < B; b++) {
    const x128 d = load128cs(dout + (size_t)b * T * C + idx);
    for (int k = 0; k < x128::size; k++) acc[k] += (float)d[k];
  }
  x128 w = load128(dwpe + idx);
  for (int k = 0; k < x128::size; k++) w[k] = round_stochastic((float)w[k] + acc[k], seed, idx + k);
  store128(dwpe + idx, w);
}

// A bucket is {first position index, count, token id, channel group}; its positions are summed
// in order. A warp's lanes cover the group's channels [c, c + 8) each.
__device__ void encoder_bucket_sum(float (&acc)[x128::size], const int* positions, int first, int count,
                                   const floatX* dout, int C, int c) {
  // Unrolled so the loads of several positions are in flight at once; the adds keep their order.
#pragma unroll 4
  for (int i = first; i < first + count; i++) {
    const x128 d = load128(dout + (size_t)positions[i] * C + c);
    for (int k = 0; k < x128::size; k++) acc[k] += (float)d[k];
  }
}

__device__ void encoder_row_add(floatX* dwte, const int4& bk, int C, int c, const float (&acc)[x128::size],
                                uint32_t seed) {
  const size_t row = (size_t)bk.z * C + c;
  x128 w = load128(dwte + row);
  for (int k = 0; k < x128::size; k++) w[k] = round_stochastic((float)w[k] + acc[k], seed, row + k);
  store128(dwte + row, w);
}

// One warp per bucket.
__global__ void encoder_backward_wte_kernel(floatX* dwte, const int4* buckets, int num_buckets,
                                            const int* positions, const floatX* dout, int C,
                                            uint32_t seed) {
  const int bucket = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
  if (bucket >= num_buckets) return;
  const int lane = threadIdx.x % WARP_SIZE;
  const int4 bk = buckets[bucket];
  const int c = bk.w * WARP_SIZE * x128::size + lane * x128::size;
  if (c >= C) return;
  float acc[x128::size] = {};
  encoder_bucket_sum(acc, positions, bk.x, bk.y, dout, C, c);
  encoder_row_add(dwte, bk, C, c, acc, seed);
}

// Buckets of more than kEncoderLongBucket positions (a frequent token, such as indentation in
// source code: one warp summing thousands of positions in turn took milliseconds, several times a
// micro step; one block a bucket, 0.43 ms a call, its largest bucket's chain) take two kernels:
// encoder_backward_wte_slices_kernel sums each slice of kEncoderSlice positions of every long
// bucket on a warp of its own into slice_sums, then encoder_backward_wte_long_kernel, one block
// per bucket, has warp w sum the w-th of kEncoderLongWarps contiguous runs of the bucket's slice
// sums in order and adds the runs in warp order. The plan fixes the slices, so the order of every
// sum is the same on any GPU.
constexpr int kEncoderLongBucket = 128;
constexpr int kEncoderSlice = 64;
constexpr int kEncoderLongWarps = 16;
constexpr int kEncoderGroupWidth = WARP_SIZE * x128::size;  // the channels of a bucket's group

// The long bucket whose slices hold global slice `slice`: slice_starts [num_long + 1] ascending.
__device__ __forceinline__ int encoder_slice_bucket(const int* slice_starts, int num_long, int slice) {
  int lo = 0, hi = num_long - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (slice_starts[mid] <= slice) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// One warp per slice; slice_sums [num_slices, kEncoderGroupWidth] FP32.
__global__ void encoder_backward_wte_slices_kernel(float* slice_sums, const int4* buckets, const int* slice_starts,
                                                   int num_long, int num_slices, const int* positions,
                                                   const floatX* dout, int C) {
  const int slice = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
  if (slice >= num_slices) return;
  const int lane = threadIdx.x % WARP_SIZE;
  const int b = encoder_slice_bucket(slice_starts, num_long, slice);
  const int4 bk = buckets[b];
  const int c = bk.w * kEncoderGroupWidth + lane * x128::size;
  float acc[x128::size] = {};
  if (c < C) {
    const int begin = (slice - slice_starts[b]) * kEncoderSlice;
    encoder_bucket_sum(acc, positions, bk.x + begin, min(kEncoderSlice, bk.y - begin), dout, C, c);
  }
  float* out = slice_sums + (size_t)slice * kEncoderGroupWidth + lane * x128::size;
  for (int k = 0; k < x128::size; k++) out[k] = acc[k];
}

__global__ void __launch_bounds__(kEncoderLongWarps * WARP_SIZE)
    encoder_backward_wte_long_kernel(floatX* dwte, const int4* buckets, const int* slice_starts,
                                     const float* slice_sums, int C, uint32_t seed) {
  __shared__ float run_sums[kEncoderLongWarps][kEncoderGroupWidth];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int4 bk = buckets[blockIdx.x];
  const int c = bk.w * kEncoderGroupWidth + lane * x128::size;
  const int first = slice_starts[blockIdx.x], slices = slice_starts[blockIdx.x + 1] - first;
  float acc[x128::size] = {};
  const int begin = first + (int)((long)slices * warp / kEncoderLongWarps);
  const int end = first + (int)((long)slices * (warp + 1) / kEncoderLongWarps);
#pragma unroll 4
  for (int i = begin; i < end; i++) {
    const float* sums = slice_sums + (size_t)i * kEncoderGroupWidth + lane * x128::size;
    for (int k = 0; k < x128::size; k++) acc[k] += sums[k];
  }
  for (int k = 0; k < x128::size; k++) run_sums[warp][lane * x128::size + k] = acc[k];
  __syncthreads();
  if (warp != 0 || c >= C) return;
  for (int w = 1; w < kEncoderLongWarps; w++) {
    for (int k = 0; k < x128::size; k++) acc[k] += run_sums[w][lane * x128::size + k];
  }
  encoder_row_add(dwte, bk, C, c, acc, seed);
}

// A plan (encoder_backward_plan) of `tokens` positions on the GPU. buckets holds num_buckets
// buckets, then, where there are long buckets, their slice_starts: num_long + 1 ints, the first
// slice of each and the total, num_slices (upload encoder_plan_upload_count(plan) int4s of it).
struct EncoderBackwardPlan {
  int4* buckets = nullptr;
  int* positions = nullptr;
  float* slice_sums = nullptr;  // encoder_plan_max_slices(tokens, C) x kEncoderGroupWidth
  int num_buckets = 0;
  int num_long = 0;  // the first num_long buckets hold more than kEncoderLongBucket positions
  int num_slices = 0;
  int tokens = 0;
  const int* slice_starts() const { return reinterpret_cast<const int*>(buckets + num_buckets); }
};

// The CPU half of the wte backward: groups the positions of each token into buckets, written to
// positions [BT] and buckets [BT * encoder_plan_groups(C)] on the host, the largest first, then
// the long buckets' slice starts; sets plan's counts (its arrays are the GPU's copies, for the
// caller to upload). The slice starts fit: each long bucket stands for more than 128 positions.
int encoder_plan_groups(int C) { return ceil_div(C, kEncoderGroupWidth); }

// The most slices BT positions make: each long bucket's positions in slices of 64, plus one
// partial slice each (at most BT / 129 long tokens), in each group.
size_t encoder_plan_max_slices(int BT, int C) {
  return (size_t)encoder_plan_groups(C) * (ceil_div(BT, kEncoderSlice) + BT / (kEncoderLongBucket + 1) + 1);
}

int encoder_plan_upload_count(const EncoderBackwardPlan& plan) {
  return plan.num_buckets + (plan.num_long > 0 ? ceil_div(plan.num_long + 1, 4) : 0);
}

void encoder_backward_plan(EncoderBackwardPlan* plan, int4* buckets, int* positions, const int* inputs, int BT,
                           int C) {
  const int groups = encoder_plan_groups(C);
  for (int i = 0; i < BT; i++) positions[i] = i;
  // Positions grouped by token id, increasing position within a token: a fixed summation order.
  std::stable_sort(positions, positions + BT, [&](int a, int b) { return inputs[a] < inputs[b]; });
  int num_buckets = 0;
  for (int start = 0; start < BT;) {
    int end = start;
    while (end < BT && inputs[positions[end]] == inputs[positions[start]]) end++;
    for (int g = 0; g < groups; g++) {
      buckets[num_buckets++] = make_int4(start, end - start, inputs[positions[start]], g);
    }
    start = end;
  }
  std::stable_sort(buckets, buckets + num_buckets, [](const int4& a, const int4& b) { return a.y > b.y; });
  int num_long = 0;
  while (num_long < num_buckets && buckets[num_long].y > kEncoderLongBucket) num_long++;
  int num_slices = 0;
  if (num_long > 0) {  // else every position may be a bucket of its own: no room, and none needed
    int* slice_starts = reinterpret_cast<int*>(buckets + num_buckets);
    slice_starts[0] = 0;
    for (int b = 0; b < num_long; b++) slice_starts[b + 1] = slice_starts[b] + ceil_div(buckets[b].y, kEncoderSlice);
    num_slices = slice_starts[num_long];
  }
  plan->num_buckets = num_buckets;
  plan->num_long = num_long;
  plan->num_slices = num_slices;
  plan->tokens = BT;
}

// Queues the backward of B x T positions through `plan` (of those B*T positions); waits for nothing.
void encoder_backward(floatX* dwte, floatX* dwpe, const EncoderBackwardPlan& plan, const floatX* dout, int B,
                      int T, int C, uint32_t seed, cudaStream_t stream) {
  REQUIRE(C % x128::size == 0, "encoder_backward: C=%d must be a multiple of %d", C, x128::size);
  REQUIRE(plan.tokens == B * T, "encoder_backward: a plan of %d positions for B*T=%d", plan.tokens, B * T);
  const int threads = 256;
  if (dwpe) {
    encoder_backward_wpe_kernel<<<ceil_div(T * C / x128::size, threads), threads, 0, stream>>>(
        dwpe, dout, B, T, C, seed);
    cudaCheckLaunch();
  }
  const uint32_t seed_wte = seed ^ 0x5bd1e995u;
  if (plan.num_long > 0) {
    const int warps_per_block = threads / WARP_SIZE;
    encoder_backward_wte_slices_kernel<<<ceil_div(plan.num_slices, warps_per_block), threads, 0, stream>>>(
        plan.slice_sums, plan.buckets, plan.slice_starts(), plan.num_long, plan.num_slices, plan.positions, dout, C);
    cudaCheckLaunch();
    encoder_backward_wte_long_kernel<<<plan.num_long, kEncoderLongWarps * WARP_SIZE, 0, stream>>>(
        dwte, plan.buckets, plan.slice_starts(), plan.slice_sums, C, seed_wte);
    cudaCheckLaunch();
  }
  const int short_buckets = plan.num_buckets - plan.num_long;
  if (short_buckets > 0) {
    const int warps_per_block = threads / WARP_SIZE;
    encoder_backward_wte_kernel<<<ceil_div(short_buckets, warps_per_block), threads, 0, stream>>>(
        dwte, plan.buckets + plan.num_long, short_buckets, plan.positions, dout, C, seed_wte);
    cudaCheckLaunch();
  }
}

// ---- Record #89's smear (SPEC "Record #89's embedding"): each token's embedding takes a gated
// share of the one before ----
// x [N, C] the embedding of a forward's tokens as one flat sequence (rows cross documents and the
// B rows of a batch, as the reference's one sequence a forward does); w [kSmearWidth] and lambda
// are parameters' values on the device. Row t >= 1, in the reference's BF16 steps, each rounded:
// z = w . x_t[:12] (FP32, in order), s = sigmoid(z), g = lambda s, out_t = x_t + g x_{t-1}; row 0
// is copied. gates [N] (FP32) keeps s, 0 at row 0, for the backward. One warp a row; out apart
// from x (row t reads x_{t-1}). Backward, dx apart from dout (row t reads dout_{t+1}): a = dout_t
// . x_{t-1} (each lane's 16-byte pieces in order, then the warp's fixed tree), dz = lambda a s (1 -
// s), dx_t = dout_t + g_{t+1} dout_{t+1} (+ dz w in the first 12 channels), dw += sum of dz x_t[:12]
// and dlambda += sum of a s over rows, by row blocks (section 2): deterministic. Floor: forward
// reads 2NC values, writes NC; backward reads 3NC, writes NC; memory-bound.
using llmc::kSmearWidth;  // the channels the smear's gate reads
constexpr int kSmearThreads = 256;

// Row t's rounded gate s = sigmoid(w . x_t[:12]), 0 at row 0.
__device__ __forceinline__ float smear_gate(const floatX* x, const floatX* w, int row, int C) {
  if (row == 0) return 0.0f;
  const floatX* xt = x + (size_t)row * C;
  float z = 0.0f;
  for (int j = 0; j < kSmearWidth; j++) z += (float)w[j] * (float)xt[j];
  z = (float)(floatX)z;
  return (float)(floatX)(1.0f / (1.0f + expf(-z)));
}

// g = lambda s, rounded as the forward adds it.
__device__ __forceinline__ float smear_share(float lambda, float s) { return (float)(floatX)(lambda * s); }

__global__ void smear_forward_kernel(floatX* out, float* gates, const floatX* x, const floatX* w,
                                     const floatX* lambda, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
  if (row >= N) return;
  const int lane = threadIdx.x % WARP_SIZE;
  const float s = smear_gate(x, w, row, C), g = smear_share((float)lambda[0], s);
  if (lane == 0) gates[row] = s;
  const floatX* xt = x + (size_t)row * C;
  floatX* o = out + (size_t)row * C;
  for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
    const x128 v = load128(xt + c);
    if (row == 0) {
      store128(o + c, v);
      continue;
    }
    const x128 p = load128(xt - C + c);
    x128 r;
    // The product rounded on its own (never fused into the add), as the reference's two steps.
    for (int k = 0; k < x128::size; k++) r[k] = (floatX)((float)v[k] + (float)(floatX)__fmul_rn(g, (float)p[k]));
    store128(o + c, r);
  }
}

// grid kRowBlocks, 1-D blocks of whole warps: warp i of a block takes its rows i, i + warps, ...
// in order; partials [kRowBlocks, kSmearWidth + 1] (dw's 12, then dlambda's).
__global__ void smear_backward_kernel(floatX* dx, float* partials, const floatX* dout, const floatX* x,
                                      const float* gates, const floatX* w, const floatX* lambda, int N, int C) {
  const int warps = blockDim.x / WARP_SIZE, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int rpb = rows_per_block(N);
  const int r0 = min(N, (int)blockIdx.x * rpb), r1 = min(N, r0 + rpb);
  const float l = (float)lambda[0];
  float sums[kSmearWidth + 1] = {};
  for (int row = r0 + warp; row < r1; row += warps) {
    const floatX* d = dout + (size_t)row * C;
    const float s = gates[row];
    float a = 0.0f;
    if (row > 0) {
      for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 dd = load128(d + c), p = load128(x + (size_t)(row - 1) * C + c);
        for (int k = 0; k < x128::size; k++) a += (float)dd[k] * (float)p[k];
      }
      a = warp_reduce_sum(a);
    }
    const float dz = l * a * s * (1.0f - s);
    const bool next = row + 1 < N;
    const float g_next = next ? smear_share(l, gates[row + 1]) : 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
      const x128 dd = load128(d + c), dn = next ? load128(d + C + c) : dd;  // dn unread without a next row
      x128 r;
      for (int k = 0; k < x128::size; k++) {
        float v = (float)dd[k];
        if (next) v += g_next * (float)dn[k];
        if (c + k < kSmearWidth) v += dz * (float)w[c + k];
        r[k] = (floatX)v;
      }
      store128(dx + (size_t)row * C + c, r);
    }
    if (lane == 0 && row > 0) {
      for (int j = 0; j < kSmearWidth; j++) sums[j] += dz * (float)x[(size_t)row * C + j];
      sums[kSmearWidth] += a * s;
    }
  }
  row_block_sums_store(partials, sums);
}

void smear_check(const char* name, const void* out, const void* in, int N, int C) {
  REQUIRE(N > 0 && C >= kSmearWidth && C % x128::size == 0,
          "%s: N=%d must be positive and C=%d a multiple of %d of at least %d", name, N, C, x128::size, kSmearWidth);
  REQUIRE(out != in, "%s: the output must be apart from the input (row t reads row t +- 1 of it)", name);
}

// out [N, C] = x smeared (above), gates [N] its gates s. w [12], lambda [1] on the device.
void smear_forward(floatX* out, float* gates, const floatX* x, const floatX* w, const floatX* lambda, int N, int C,
                   cudaStream_t stream) {
  smear_check("smear_forward", out, x, N, C);
  const int warps_per_block = kSmearThreads / WARP_SIZE;
  smear_forward_kernel<<<ceil_div(N, warps_per_block), kSmearThreads, 0, stream>>>(out, gates, x, w, lambda, N, C);
  cudaCheckLaunch();
}

// From dout, the gradient of smear_forward's out: dx [N, C] (written), dw [12] and dlambda [1]
// (added, with stochastic rounding from seed). gates: the forward's. partials: kRowBlocks * 13 floats.
void smear_backward(floatX* dx, floatX* dw, floatX* dlambda, float* partials, const floatX* dout, const floatX* x,
                    const float* gates, const floatX* w, const floatX* lambda, int N, int C, uint32_t seed,
                    cudaStream_t stream) {
  smear_check("smear_backward", dx, dout, N, C);
  smear_backward_kernel<<<kRowBlocks, kSmearThreads, 0, stream>>>(dx, partials, dout, x, gates, w, lambda, N, C);
  cudaCheckLaunch();
  column_sum_finalize(dw, partials, kSmearWidth + 1, kSmearWidth, kRowBlocks, seed, stream);
  column_sum_finalize(dlambda, partials + kSmearWidth, kSmearWidth + 1, 1, kRowBlocks, seed ^ 0x27d4eb2fu, stream);
}

// ---- Record #89's bigram hash embedding (SPEC "Record #89's embedding") ----
// Each token's (previous token, token) pair picks a row of a table [R, C] (R = Vp 15 / 2: 377,280
// at Vp 50,304) and a row of a sign table [llmc::kBigramSignRows, C] of +-1; the embedding is their
// product, exact in either precision. The rows come from the tokens on the host (llmc/bigram_hash.h),
// as the encoder's plan does: the table's gradient is the encoder's bucketed backward (section 3)
// of dout times the signs, keyed by the table's rows: deterministic, no atomics. Floor: forward
// reads 2NC values, writes NC; backward reads 2NC, writes NC (the scratch, which the encoder reads).

// out[t] = rows[ids[t]] * signs[sign_rows[t]]; without ids rows[t] (the backward's dout).
__global__ void bigram_signed_kernel(floatX* out, const floatX* rows, const int* ids, const floatX* signs,
                                     const int* sign_rows, int N, int C) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= (size_t)N * C) return;
  const size_t t = i / C;
  const int c = (int)(i % C);
  const x128 v = load128(rows + (ids ? (size_t)ids[t] * C + c : i));
  const x128 sg = load128(signs + (size_t)sign_rows[t] * C + c);
  x128 o;
  for (int k = 0; k < x128::size; k++) o[k] = (floatX)((float)v[k] * (float)sg[k]);
  store128(out + i, o);
}

constexpr int kBigramThreads = 256;

void bigram_check(const char* name, int N, int C) {
  REQUIRE(N > 0 && C > 0 && C % x128::size == 0, "%s: N=%d must be positive and C=%d a positive multiple of %d",
          name, N, C, x128::size);
}

// out [N, C] = table[ids[t]] * signs[sign_rows[t]] (ids, sign_rows [N] on the device: llmc::bigram_rows').
void bigram_forward(floatX* out, const floatX* table, const int* ids, const floatX* signs, const int* sign_rows,
                    int N, int C, cudaStream_t stream) {
  bigram_check("bigram_forward", N, C);
  const size_t pieces = (size_t)N * C / x128::size;
  bigram_signed_kernel<<<ceil_div(pieces, kBigramThreads), kBigramThreads, 0, stream>>>(out, table, ids, signs,
                                                                                       sign_rows, N, C);
  cudaCheckLaunch();
}

// dtable[ids[t]] += dout[t] * signs[sign_rows[t]] summed over each row's tokens, with stochastic
// rounding (seed): scratch [N, C] (overwritten) takes the signed gradient, then the encoder's
// backward through plan, made of the ids (encoder_backward_plan with the ids as its tokens).
void bigram_backward(floatX* dtable, floatX* scratch, const floatX* dout, const floatX* signs, const int* sign_rows,
                     const EncoderBackwardPlan& plan, int N, int C, uint32_t seed, cudaStream_t stream) {
  bigram_check("bigram_backward", N, C);
  REQUIRE(scratch != dout, "bigram_backward: the scratch must be apart from dout");
  const size_t pieces = (size_t)N * C / x128::size;
  bigram_signed_kernel<<<ceil_div(pieces, kBigramThreads), kBigramThreads, 0, stream>>>(scratch, dout, nullptr,
                                                                                       signs, sign_rows, N, C);
  cudaCheckLaunch();
  encoder_backward(dtable, nullptr, plan, scratch, 1, N, C, seed, stream);
}

// ---- Gates: a learned value a layer (or NH, one a head) that every row shares, or record #89's
// MUDD gates, a value per token: a row of a gate generator's output (section 10) ----
// stride 0: values' one value (or NH) for every row, the scalar parameters; stride > 0: row n's at
// values + n * stride, its NH heads consecutive. offset: the gate is offset + value, rounded to floatX
// (record #89's MUDD stream coefficient 1 + m), whose gradient is the value's.
struct GateRows {
  const floatX* values = nullptr;
  int stride = 0;
  float offset = 0.0f;
  __device__ __forceinline__ float at(size_t row, int h = 0) const {
    const float v = (float)values[row * stride + h];
    return offset == 0.0f ? v : (float)(floatX)(offset + v);
  }
};
// A gate's gradient: stride 0, values += the sum over the rows (row-block partials, then
// column_sum_finalize's stochastic rounding, as every scalar parameter's); stride > 0, row n's
// gradient written (not accumulated) at values + n * stride, rounded once to floatX.
struct GateGradient {
  floatX* values = nullptr;
  int stride = 0;
};

// A gate of width values a row (1, or NH) and its gradient, read and written with the same kind of
// stride (both 0, or both at least the width).
void gate_check(const char* name, const GateRows& gate, const GateGradient* dgate, int width) {
  REQUIRE(gate.values && gate.stride >= 0 && (gate.stride == 0 || gate.stride >= width),
          "%s: the gate needs its values and a stride of 0 or at least %d (stride %d)", name, width, gate.stride);
  if (!dgate) return;
  REQUIRE(dgate->values && (dgate->stride == 0) == (gate.stride == 0) &&
              (dgate->stride == 0 || dgate->stride >= width),
          "%s: the gate's gradient needs its values and a stride of 0 with the gate's 0, at least %d with rows "
          "(strides %d and %d)", name, width, gate.stride, dgate->stride);
}

// ---- The gated adds into the residual stream: record #89's bigram embedding, x0 and MUDD's terms ----
// out [N, C] = in + (g t) + (g' t') + ..., each term t [N, C] (the bigram embedding b, record #89's
// plan's x0, MUDD's kept rows) times its gate g (GateRows: one value, or one a row): each product
// rounded on its own, then the sum in FP32 in the terms' order (the reference's steps; the x0 term
// first, then the bigram's), rounded once; out may be in (the attention's output in place). With a
// scale of in (GateRows: record #89's residual lambdas' p, the attention's post lambda, or MUDD's 1 +
// m a row) out = s in + (g t) + ..., the terms beside s's product, as the reference adds them; in
// null: the terms alone (MUDD's value terms).
// Backward of a term: dt += g dout (each value's sum rounded; dt accumulates the layers' parts); a
// shared gate's dg += the sum of dout . t over the rows, by row blocks (section 2), a row's gate's
// dg_n = dout_n . t_n over the row, one warp's tree: deterministic. Floor: forward reads (1 + terms)
// NC values, writes NC; backward reads 3NC, writes NC; memory-bound.
constexpr int kBigramGateThreads = 256;
constexpr int kGateRowWarps = 8;

// A gated term g t of the sum; none where values is null.
struct GatedTerm {
  const floatX* values = nullptr;
  GateRows gate;
};

// The terms of a sum, the first `count` of terms (record #89's final MUDD mix has five).
constexpr int kMaxGatedTerms = 5;
struct GatedTerms {
  GatedTerm terms[kMaxGatedTerms];
  int count = 0;
};

// v plus the term's value k of its 16 bytes `loaded` (unread without the term), g its gate's value.
__device__ __forceinline__ float gated_term_add(float v, const GatedTerm& t, float g, const x128& loaded, int k) {
  return t.values ? v + (float)(floatX)__fmul_rn(g, (float)loaded[k]) : v;
}

__global__ void gated_terms_forward_kernel(floatX* out, const floatX* in, GateRows in_scale, GatedTerms terms,
                                           size_t n, int C) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= n) return;
  const size_t row = i / C;
  float sum[x128::size] = {};
  if (in) {
    const float p = in_scale.values ? in_scale.at(row) : 1.0f;
    const x128 x = load128(in + i);
    for (int k = 0; k < x128::size; k++) sum[k] = in_scale.values ? __fmul_rn(p, (float)x[k]) : (float)x[k];
  }
  // Unrolled over the array's size, not the run-time count: an index known only at run time made
  // every thread copy the terms from the parameters into local memory (128 bytes of stack).
#pragma unroll
  for (int t = 0; t < kMaxGatedTerms; t++) {
    const GatedTerm& term = terms.terms[t];
    if (t >= terms.count || !term.values) continue;
    const x128 loaded = load128(term.values + i);
    const float g = term.gate.at(row);
    for (int k = 0; k < x128::size; k++) sum[k] = gated_term_add(sum[k], term, g, loaded, k);
  }
  x128 o;
  for (int k = 0; k < x128::size; k++) o[k] = (floatX)sum[k];
  store128(out + i, o);
}

// A shared gate: grid kRowBlocks, 1-D blocks: block j takes its rows' values in 16-byte pieces,
// thread by thread.
__global__ void bigram_gate_backward_kernel(floatX* dbigram, float* partials, const floatX* dout,
                                            const floatX* bigram, const floatX* gate, int N, int C) {
  const int rpb = rows_per_block(N);
  const int r0 = min(N, (int)blockIdx.x * rpb), r1 = min(N, r0 + rpb);
  const float g = (float)gate[0];
  float sums[1] = {0.0f};
  for (size_t i = ((size_t)r0 * C) + threadIdx.x * x128::size; i < (size_t)r1 * C; i += blockDim.x * x128::size) {
    const x128 d = load128(dout + i), b = load128(bigram + i), acc = load128(dbigram + i);
    x128 o;
    for (int k = 0; k < x128::size; k++) {
      sums[0] += (float)d[k] * (float)b[k];
      o[k] = (floatX)((float)acc[k] + g * (float)d[k]);
    }
    store128(dbigram + i, o);
  }
  row_block_sums_store(partials, sums);
}

// Record #89's gated skip's sigmoid(skip_lambda), rounded as the reference's BF16 tensor.
__device__ __forceinline__ float skip_sigmoid(const floatX* skip_lambda) {
  return (float)(floatX)(1.0f / (1.0f + expf(-(float)skip_lambda[0])));
}

// A gate a row: grid kRowBlocks of kGateRowWarps warps, warp w taking its block's rows w, w + 8, ...
// in turn, a lane its 16-byte pieces in order: dterm += g_n dout and S_n = dout . term over row n
// (the lanes' sums in warp_reduce_sum's tree), written into dgate times sigmoid(skip_lambda) with
// the gated skip (skip_lambda given; times 1 otherwise). With weights (the skip's g rows) given,
// partials[block] = the sum of weight_n S_n over the block's rows, each warp's in order, then the
// warps in order.
__global__ void gated_term_row_gates_backward_kernel(floatX* dterm, GateGradient dgate, float* partials,
                                                     const floatX* dout, const floatX* term, GateRows gate,
                                                     const floatX* skip_lambda, GateRows weights, int N, int C) {
  __shared__ float warp_sums[kGateRowWarps];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const float factor = skip_lambda ? skip_sigmoid(skip_lambda) : 1.0f;
  const int rpb = rows_per_block(N);
  const int r0 = min(N, (int)blockIdx.x * rpb), r1 = min(N, r0 + rpb);
  float weighted = 0.0f;
  for (int row = r0 + warp; row < r1; row += kGateRowWarps) {
    const size_t base = (size_t)row * C;
    const float g = gate.at(row);
    float sum = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
      const x128 d = load128(dout + base + c), t = load128(term + base + c), acc = load128(dterm + base + c);
      x128 o;
      for (int k = 0; k < x128::size; k++) {
        sum += (float)d[k] * (float)t[k];
        o[k] = (floatX)((float)acc[k] + g * (float)d[k]);
      }
      store128(dterm + base + c, o);
    }
    const float S = warp_reduce_sum(sum);
    if (lane == 0) dgate.values[(size_t)row * dgate.stride] = (floatX)(factor * S);
    if (weights.values) weighted += weights.at(row) * S;
  }
  if (!weights.values) return;
  if (lane == 0) warp_sums[warp] = weighted;
  __syncthreads();
  if (threadIdx.x != 0) return;
  float total = 0.0f;
  for (int w = 0; w < kGateRowWarps; w++) total += warp_sums[w];
  partials[blockIdx.x] = total;
}

// out = [s] in + the terms (above), [N, C]; in_scale: s, none (values null), one value or one a row;
// in null: the terms alone.
void gated_sum_forward(floatX* out, const floatX* in, GateRows in_scale, const GatedTerms& terms, int N, int C,
                       cudaStream_t stream) {
  const char* name = "gated_sum_forward";
  bigram_check(name, N, C);
  REQUIRE(terms.count >= 0 && terms.count <= kMaxGatedTerms, "%s: %d terms, at most %d", name, terms.count,
          kMaxGatedTerms);
  if (in_scale.values) gate_check(name, in_scale, nullptr, 1);
  for (int t = 0; t < terms.count; t++) {
    if (terms.terms[t].values) gate_check(name, terms.terms[t].gate, nullptr, 1);
  }
  const size_t n = (size_t)N * C;
  gated_terms_forward_kernel<<<ceil_div(n / x128::size, kBigramGateThreads), kBigramGateThreads, 0, stream>>>(
      out, in, in_scale, terms, n, C);
  cudaCheckLaunch();
}

// out = in + (first) + (second), [N, C]; in_scale (one value on the device, or null): out = in_scale * in + ...
void gated_terms_forward(floatX* out, const floatX* in, const floatX* in_scale, GatedTerm first, GatedTerm second,
                         int N, int C, cudaStream_t stream) {
  GatedTerms terms;
  terms.terms[0] = first;
  terms.terms[1] = second;
  terms.count = 2;
  gated_sum_forward(out, in, {in_scale, 0}, terms, N, C, stream);
}

// out = in + gate * bigram, or in_scale * in + gate * bigram (gated_terms_forward's one term).
void bigram_gate_forward(floatX* out, const floatX* in, const floatX* bigram, GateRows gate, int N, int C,
                         cudaStream_t stream, const floatX* in_scale = nullptr) {
  gated_terms_forward(out, in, in_scale, {bigram, gate}, {}, N, C, stream);
}

// The rows' part of a term's backward: dterm += gate dout; a shared gate's row blocks' sums of
// dout . term into partials (kRowBlocks floats) for a finalize to add up, or a row's gate's sum
// written into dgate (partials unused).
void gated_term_rows_backward(floatX* dterm, GateGradient dgate, float* partials, const floatX* dout,
                              const floatX* term, GateRows gate, int N, int C, cudaStream_t stream) {
  const char* name = "gated_term_rows_backward";
  bigram_check(name, N, C);
  gate_check(name, gate, gate.stride > 0 ? &dgate : nullptr, 1);
  REQUIRE(dterm != dout, "%s: the term's gradient must be apart from dout", name);
  if (gate.stride == 0) {
    bigram_gate_backward_kernel<<<kRowBlocks, kBigramGateThreads, 0, stream>>>(dterm, partials, dout, term,
                                                                               gate.values, N, C);
  } else {
    gated_term_row_gates_backward_kernel<<<kRowBlocks, kGateRowWarps * WARP_SIZE, 0, stream>>>(
        dterm, dgate, nullptr, dout, term, gate, nullptr, {}, N, C);
  }
  cudaCheckLaunch();
}

// From dout, the gradient of a term's part of gated_terms_forward's out (the bigram embedding's, or
// x0's): dbigram += gate dout, and the gate's gradient (GateGradient: a shared gate's += the sum of
// dout . bigram, stochastic rounding from seed; a row's written); partials: kRowBlocks floats.
void bigram_gate_backward(floatX* dbigram, GateGradient dgate, float* partials, const floatX* dout,
                          const floatX* bigram, GateRows gate, int N, int C, uint32_t seed, cudaStream_t stream) {
  gate_check("bigram_gate_backward", gate, &dgate, 1);
  gated_term_rows_backward(dbigram, dgate, partials, dout, bigram, gate, N, C, stream);
  if (gate.stride == 0) column_sum_finalize(dgate.values, partials, 1, 1, kRowBlocks, seed, stream);
}

// ---- Record #89's gated skip: x + s kept, s = sigmoid(skip_lambda) g, each step rounded as the
// reference's BF16 tensors are, g skip_gate's second value (GateRows, stride 0) or MUDD's g_n a row
// (s_n a row); the add itself is a residual add with scales (section 4's, p = s, a row's with
// p_stride 1). Backward: dkept += s dout (gated_term_rows_backward), S (S_n) the sum of dout . kept
// (over row n): d skip_lambda += g sig (1 - sig) S and dg += sig S, sig the rounded sigmoid; with
// rows dg_n = sig S_n written and d skip_lambda += sig (1 - sig) (the sum of g_n S_n over row blocks,
// then blocks in order). The scale: one thread a value.

__global__ void gated_skip_scale_kernel(floatX* scale, const floatX* skip_lambda, GateRows g, int N) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= N) return;
  scale[row] = (floatX)(skip_sigmoid(skip_lambda) * g.at(row));
}

// With a shared g: dskip_lambda and dg.values[0] += the gradients from the kRowBlocks partial sums S,
// added in block order; with g's rows, dskip_lambda alone from the partial sums of g_n S_n.
__global__ void gated_skip_gradient_kernel(floatX* dskip_lambda, GateGradient dg, const float* partials,
                                           const floatX* skip_lambda, GateRows g, uint32_t seed) {
  float S = 0.0f;
  for (int b = 0; b < kRowBlocks; b++) S += partials[b];
  const float sig = skip_sigmoid(skip_lambda);
  if (g.stride > 0) {
    dskip_lambda[0] = round_stochastic((float)dskip_lambda[0] + sig * (1.0f - sig) * S, seed, 0);
    return;
  }
  dskip_lambda[0] = round_stochastic((float)dskip_lambda[0] + g.at(0) * sig * (1.0f - sig) * S, seed, 0);
  dg.values[0] = round_stochastic((float)dg.values[0] + sig * S, seed, 1);
}

// scale = sigmoid(skip_lambda[0]) g: one value on the device with a shared g (skip_gate's second
// value), N (scale [N], a row's) with g's rows.
void gated_skip_scale(floatX* scale, const floatX* skip_lambda, GateRows g, int N, cudaStream_t stream) {
  gate_check("gated_skip_scale", g, nullptr, 1);
  REQUIRE(N > 0, "gated_skip_scale: N=%d must be positive", N);
  const int values = g.stride == 0 ? 1 : N;
  gated_skip_scale_kernel<<<ceil_div(values, kBigramGateThreads), kBigramGateThreads, 0, stream>>>(scale,
                                                                                                  skip_lambda, g,
                                                                                                  values);
  cudaCheckLaunch();
}

// From dout, the gradient of x + scale kept [N, C] (scale from gated_skip_scale): dkept += scale dout,
// dskip_lambda's and g's gradients (dg: GateGradient, stride g's); stochastic rounding of the shared
// values from seed. partials: kRowBlocks floats.
void gated_skip_backward(floatX* dkept, floatX* dskip_lambda, GateGradient dg, float* partials, const floatX* dout,
                         const floatX* kept, const floatX* scale, const floatX* skip_lambda, GateRows g, int N,
                         int C, uint32_t seed, cudaStream_t stream) {
  const char* name = "gated_skip_backward";
  gate_check(name, g, &dg, 1);
  if (g.stride == 0) {
    gated_term_rows_backward(dkept, {}, partials, dout, kept, {scale, 0}, N, C, stream);
  } else {
    bigram_check(name, N, C);
    REQUIRE(dkept != dout, "%s: the kept output's gradient must be apart from dout", name);
    gated_term_row_gates_backward_kernel<<<kRowBlocks, kGateRowWarps * WARP_SIZE, 0, stream>>>(
        dkept, dg, partials, dout, kept, {scale, 1}, skip_lambda, g, N, C);
    cudaCheckLaunch();
  }
  gated_skip_gradient_kernel<<<1, 1, 0, stream>>>(dskip_lambda, dg, partials, skip_lambda, g, seed);
  cudaCheckLaunch();
}

// ============================================================================
// 4. Normalisation
// ============================================================================
// LayerNorm (GPT-2) and RMSNorm (the modern architecture) share their kernels through a template
// flag RMS: RMSNorm subtracts no mean, has no bias, and rstd = 1/sqrt(mean(x^2) + FLT_EPSILON).
// Forward: one warp per row of C; mean (LayerNorm) and rstd kept in FP32 for the backward pass;
// variance by a second pass over the row (not E[x^2]-E[x]^2) for accuracy. Floor: read N*C,
// write N*C. The fused variant first writes residual = a + b (rounded to the storage type) and
// normalises the rounded values, so forward and backward see the same residual.
// Backward: one warp per row computes dx and adds it into the residual-stream gradient dresidual
// (in place); dgamma (and LayerNorm's dbeta) partial sums go to per-warp shared-memory rows, are
// added in warp order per row block, and finalized over the fixed kRowBlocks blocks.
// RMSNorm without a gain (the speedrun's: weight nullptr, template flag WEIGHTED false) computes
// y = x * rstd and has no dgamma; the weighted kernels' arithmetic is the same with either flag.

constexpr float kLayerNormEps = 1e-5f;
// PyTorch's F.rms_norm default (eps=None): the FP32 machine epsilon, for BF16 inputs too.
constexpr float kRmsNormEps = FLT_EPSILON;

// A norm's output from its input x and row statistics: LayerNorm's, or RMSNorm's (no mean, no
// bias), weighted or not. The FP8 casts that normalise as they read x (Fp8CastInput::kNorm) call it
// too, so their values are these bits.
__device__ __forceinline__ float norm_value(float x, float mean, float rstd, float weight, float bias, bool layernorm,
                                            bool weighted) {
  if (layernorm) return (x - mean) * rstd * weight + bias;
  return weighted ? x * rstd * weight : x * rstd;
}

// mean_out and bias are not used with RMS (nullptr there), weight not without WEIGHTED.
template <bool RMS, bool WEIGHTED>
__device__ void layernorm_row(floatX* out, float* mean_out, float* rstd_out, const floatX* x,
                              const floatX* weight, const floatX* bias, int C, int lane) {
  float mean = 0.0f;
  if (!RMS) {
    float sum = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
      const x128 v = load128(x + c);
      for (int k = 0; k < x128::size; k++) sum += (float)v[k];
    }
    mean = warp_reduce_sum(sum) / C;
  }
  float var = 0.0f;
  for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
    const x128 v = load128(x + c);
    for (int k = 0; k < x128::size; k++) {
      const float d = (float)v[k] - mean;
      var += d * d;
    }
  }
  const float rstd = rsqrtf(warp_reduce_sum(var) / C + (RMS ? kRmsNormEps : kLayerNormEps));
  // No out: the statistics only, for an FP8 cast that normalises as it reads x
  // (Fp8CastInput::kNorm, through norm_value too).
  for (int c = lane * x128::size; out && c < C; c += WARP_SIZE * x128::size) {
    const x128 v = load128(x + c);
    const x128 w = WEIGHTED ? load128(weight + c) : x128();
    const x128 b = RMS ? x128() : load128(bias + c);
    x128 o;
    for (int k = 0; k < x128::size; k++) {
      o[k] = (floatX)norm_value((float)v[k], mean, rstd, (float)w[k], (float)b[k], !RMS, WEIGHTED);
    }
    store128(out + c, o);
  }
  if (lane == 0) {
    if (!RMS) *mean_out = mean;
    *rstd_out = rstd;
  }
}

template <bool RMS, bool WEIGHTED>
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
  if (row >= N) return;
  layernorm_row<RMS, WEIGHTED>(out ? out + (size_t)row * C : nullptr, RMS ? nullptr : mean + row, rstd + row,
                     inp + (size_t)row * C, weight, bias, C, threadIdx.x % WARP_SIZE);
}

// Record #89's residual lambdas: a residual add x + y becomes r x + p y, r and p one value each on
// the device (null: 1), a layer's and sublayer's (section 10, "The residual lambdas"); p may instead
// be a value a row, row n's at p + n * p_stride (record #89's gated skip with MUDD gates, s_n), and r
// likewise at r + n * r_stride (with p, record #89's MUDD dense connections' last layer). The sum is
// rounded once; without scales it is x + y, the plain add's bits.
struct SublayerScales {
  const floatX* r = nullptr;
  const floatX* p = nullptr;
  int p_stride = 0;
  int r_stride = 0;
  __host__ __device__ bool any() const { return r || p; }
};
struct SublayerScaleValues {
  bool scaled;
  float r, p;
};
__device__ __forceinline__ SublayerScaleValues sublayer_scale_values(const SublayerScales& s, size_t row) {
  return {s.any(), s.r ? (float)s.r[row * s.r_stride] : 1.0f, s.p ? (float)s.p[row * s.p_stride] : 1.0f};
}
__device__ __forceinline__ float sublayer_add(float x, float y, const SublayerScaleValues& s) {
  return s.scaled ? __fmaf_rn(s.r, x, __fmul_rn(s.p, y)) : x + y;
}

template <bool RMS, bool WEIGHTED>
__global__ void fused_residual_layernorm_forward_kernel(floatX* residual, floatX* out, float* mean,
                                                        float* rstd, const floatX* a,
                                                        const floatX* b, const floatX* weight,
                                                        const floatX* bias, SublayerScales scales, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
  if (row >= N) return;
  const int lane = threadIdx.x % WARP_SIZE;
  const size_t base = (size_t)row * C;
  const SublayerScaleValues s = sublayer_scale_values(scales, row);
  for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
    const x128 va = load128(a + base + c), vb = load128(b + base + c);
    x128 r;
    for (int k = 0; k < x128::size; k++) r[k] = (floatX)sublayer_add((float)va[k], (float)vb[k], s);
    store128(residual + base + c, r);
  }
  // Each lane reads back only what it wrote, so no barrier is needed before normalising.
  layernorm_row<RMS, WEIGHTED>(out ? out + base : nullptr, RMS ? nullptr : mean + row, rstd + row,
                     residual + base, weight, bias, C, lane);
}

constexpr int kLayerNormForwardThreads = 256;

// residual == nullptr: the plain forward of inp (a); otherwise the fused one of a + b (with scales
// r a + p b). RMSNorm with weight nullptr: without a gain.
template <bool RMS>
void norm_launch_forward(const char* name, floatX* residual, floatX* out, float* mean, float* rstd,
                  const floatX* a, const floatX* b, const floatX* weight, const floatX* bias, int N,
                  int C, cudaStream_t stream, const SublayerScales& scales = {}) {
  REQUIRE(C % x128::size == 0, "%s: C=%d must be a multiple of %d", name, C, x128::size);
  REQUIRE(RMS || weight, "%s: LayerNorm needs its weight (only RMSNorm may have none)", name);
  const int blocks = ceil_div(N, kLayerNormForwardThreads / WARP_SIZE);
  auto launch = [&](auto weighted) {
    constexpr bool WEIGHTED = decltype(weighted)::value;
    if (residual) {
      fused_residual_layernorm_forward_kernel<RMS, WEIGHTED><<<blocks, kLayerNormForwardThreads, 0, stream>>>(
          residual, out, mean, rstd, a, b, weight, bias, scales, N, C);
    } else {
      layernorm_forward_kernel<RMS, WEIGHTED><<<blocks, kLayerNormForwardThreads, 0, stream>>>(
          out, mean, rstd, a, weight, bias, N, C);
    }
    cudaCheckLaunch();
  };
  if (weight) {
    launch(std::true_type());
  } else if constexpr (RMS) {
    launch(std::false_type());
  }
}

// out == nullptr: the row statistics only.
void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                       const floatX* weight, const floatX* bias, int N, int C,
                       cudaStream_t stream) {
  norm_launch_forward<false>("layernorm_forward", nullptr, out, mean, rstd, inp, nullptr, weight, bias, N,
                      C, stream);
}

void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                      const floatX* a, const floatX* b, const floatX* weight,
                                      const floatX* bias, int N, int C, cudaStream_t stream) {
  norm_launch_forward<false>("fused_residual_layernorm_forward", residual, out, mean, rstd, a, b, weight,
                      bias, N, C, stream);
}

// weight nullptr: out = inp * rstd, without a gain (also in fused_residual_rmsnorm_forward).
void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N,
                     int C, cudaStream_t stream) {
  norm_launch_forward<true>("rmsnorm_forward", nullptr, out, nullptr, rstd, inp, nullptr, weight, nullptr,
                     N, C, stream);
}

// scales: r a + p b (record #89's residual lambdas) in place of a + b.
void fused_residual_rmsnorm_forward(floatX* residual, floatX* out, float* rstd, const floatX* a,
                                    const floatX* b, const floatX* weight, int N, int C,
                                    cudaStream_t stream, const SublayerScales& scales = {}) {
  norm_launch_forward<true>("fused_residual_rmsnorm_forward", residual, out, nullptr, rstd, a, b, weight,
                     nullptr, N, C, stream, scales);
}

constexpr int kLayerNormBackwardWarps = 8;

// The column sums the backward keeps per channel: dweight (WEIGHTED), LayerNorm's dbias, and with
// SUM_DRESIDUAL the updated dresidual's, in this order in shared memory and in the partials.
__host__ __device__ constexpr int layernorm_backward_sums(bool rms, bool sum_dresidual, bool weighted) {
  return (weighted ? 1 : 0) + (rms ? 0 : 1) + (sum_dresidual ? 1 : 0);
}

// grid kRowBlocks, block kLayerNormBackwardWarps warps, dynamic shared memory
// layernorm_backward_shared_bytes(C, RMS, SUM_DRESIDUAL, WEIGHTED). partials: [kRowBlocks][sums * C], the
// sums of layernorm_backward_sums: the dresidual's are the bias gradient of the projection that
// produced the residual branch. RMS: no mean (norm = x * rstd), no dbias, and no mean of dnorm
// in dx; mean is then not read. Without WEIGHTED (RMSNorm only): dnorm = dout, no dweight sums.
// Each lane keeps its CHUNKS 16-byte pieces of the row (C <= CHUNKS * 256 elements) in registers,
// so dout, inp and dresidual are read once, all loads of a row in flight together.
// Each warp accumulates dweight and dbias over its rows in its own shared-memory rows of
// CHUNKS * 256 slots. Element k of lane `lane`'s chunk i lives in slot (i * 8 + k) * 32 + lane:
// for each (i, k) the 32 lanes touch 32 consecutive words, one per bank. (Indexing the slots by
// channel instead puts every fourth lane on the same bank: an 8-way conflict on each of the 32
// shared-memory updates per chunk and row, which was most of this kernel's time.)
template <int CHUNKS, bool SUM_DRESIDUAL, bool RMS, bool WEIGHTED>
__global__ void layernorm_backward_kernel(floatX* dresidual, float* partials, const floatX* dout,
                                          const floatX* inp, const floatX* weight,
                                          const float* mean, const float* rstd, int N, int C) {
  static_assert(RMS || WEIGHTED, "LayerNorm has a weight");
  constexpr int kSlots = CHUNKS * WARP_SIZE * x128::size;
  constexpr int kSums = layernorm_backward_sums(RMS, SUM_DRESIDUAL, WEIGHTED);
  extern __shared__ float shared[];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  float* dweight_acc = shared + warp * kSums * kSlots;        // WEIGHTED only
  float* dbias_acc = dweight_acc + kSlots;                    // LayerNorm only
  float* dresidual_acc = dweight_acc + (kSums - 1) * kSlots;  // SUM_DRESIDUAL only
  for (int j = lane; j < kSums * kSlots; j += WARP_SIZE) dweight_acc[j] = 0.0f;
  __syncwarp();
  x128 w[CHUNKS];
#pragma unroll
  for (int i = 0; i < CHUNKS; i++) {
    const int c = (i * WARP_SIZE + lane) * x128::size;
    if (WEIGHTED && c < C) w[i] = load128(weight + c);
  }
  const int rpb = rows_per_block(N);
  const int r0 = blockIdx.x * rpb, r1 = min(N, r0 + rpb);
  for (int row = r0 + warp; row < r1; row += kLayerNormBackwardWarps) {
    const size_t base = (size_t)row * C;
    x128 d[CHUNKS], x[CHUNKS], r[CHUNKS];
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
      const int c = (i * WARP_SIZE + lane) * x128::size;
      if (c < C) {
        d[i] = load128(dout + base + c);
        x[i] = load128(inp + base + c);
        r[i] = load128(dresidual + base + c);
      }
    }
    const float m = RMS ? 0.0f : mean[row], s = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
      const int c = (i * WARP_SIZE + lane) * x128::size;
      if (c >= C) continue;
#pragma unroll
      for (int k = 0; k < x128::size; k++) {
        const float norm = ((float)x[i][k] - m) * s;
        const float dnorm = WEIGHTED ? (float)w[i][k] * (float)d[i][k] : (float)d[i][k];
        if (!RMS) dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
        const int slot = (i * x128::size + k) * WARP_SIZE + lane;
        if (!RMS) dbias_acc[slot] += (float)d[i][k];
        if (WEIGHTED) dweight_acc[slot] += norm * (float)d[i][k];
      }
    }
    const float dnorm_mean = RMS ? 0.0f : warp_reduce_sum(dnorm_sum) / C;
    const float dnorm_norm_mean = warp_reduce_sum(dnorm_norm_sum) / C;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
      const int c = (i * WARP_SIZE + lane) * x128::size;
      if (c >= C) continue;
      for (int k = 0; k < x128::size; k++) {
        const float norm = ((float)x[i][k] - m) * s;
        const float dnorm = WEIGHTED ? (float)w[i][k] * (float)d[i][k] : (float)d[i][k];
        const float dx = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        r[i][k] = (floatX)((float)r[i][k] + dx);
        if (SUM_DRESIDUAL) dresidual_acc[(i * x128::size + k) * WARP_SIZE + lane] += (float)r[i][k];
      }
      store128(dresidual + base + c, r[i]);
    }
  }
  __syncthreads();
  // Add the warps' rows in warp order, slot by slot, and write each slot's channel.
  for (int j = threadIdx.x; j < kSums * kSlots; j += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kLayerNormBackwardWarps; w++) sum += shared[w * kSums * kSlots + j];
    const int slot = j % kSlots, piece = slot / WARP_SIZE, slot_lane = slot % WARP_SIZE;
    const int c = ((piece / x128::size) * WARP_SIZE + slot_lane) * x128::size + piece % x128::size;
    if (c < C) partials[(size_t)blockIdx.x * kSums * C + (j / kSlots) * C + c] = sum;
  }
}

constexpr int kLayerNormBackwardMaxChunks = 2048 / (WARP_SIZE * x128::size);

template <bool SUM_DRESIDUAL, bool RMS, bool WEIGHTED, int... I>
constexpr auto layernorm_backward_kernels(std::integer_sequence<int, I...>) {
  using Kernel = void (*)(floatX*, float*, const floatX*, const floatX*, const floatX*,
                          const float*, const float*, int, int);
  return std::array<Kernel, sizeof...(I)>{layernorm_backward_kernel<I + 1, SUM_DRESIDUAL, RMS, WEIGHTED>...};
}

size_t layernorm_backward_shared_bytes(int C, bool rms, bool sum_dresidual, bool weighted) {
  const int slots = ceil_div(C, WARP_SIZE * x128::size) * WARP_SIZE * x128::size;
  return (size_t)kLayerNormBackwardWarps * layernorm_backward_sums(rms, sum_dresidual, weighted) * slots *
         sizeof(float);
}

// The backward of either norm (dbias and mean nullptr for RMSNorm; weight and dweight nullptr for
// RMSNorm without a gain); see layernorm_backward.
template <bool RMS>
void norm_launch_backward(const char* name, floatX* dresidual, floatX* dweight, floatX* dbias,
                   floatX* dresidual_dbias, float* partials, const floatX* dout, const floatX* inp,
                   const floatX* weight, const float* mean, const float* rstd, int N, int C,
                   uint32_t seed, cudaStream_t stream) {
  REQUIRE(C % x128::size == 0, "%s: C=%d must be a multiple of %d", name, C, x128::size);
  const bool sum_dresidual = dresidual_dbias != nullptr, weighted = weight != nullptr;
  REQUIRE(RMS || weighted, "%s: LayerNorm needs its weight (only RMSNorm may have none)", name);
  REQUIRE(weighted == (dweight != nullptr), "%s: give both weight and dweight, or neither (no gain)", name);
  const size_t shared = layernorm_backward_shared_bytes(C, RMS, sum_dresidual, weighted);
  const int chunks = ceil_div(C, WARP_SIZE * x128::size);
  // One instantiation per register footprint, for C up to 2048 (GPT-2's widths go to 1600).
  REQUIRE(chunks <= kLayerNormBackwardMaxChunks,
          "%s: C=%d is above the largest supported width 2048", name, C);
  constexpr auto chunk_counts = std::make_integer_sequence<int, kLayerNormBackwardMaxChunks>();
  auto pick = [&](auto weighted_flag) {
    constexpr bool WEIGHTED = decltype(weighted_flag)::value;
    return sum_dresidual ? layernorm_backward_kernels<true, RMS, WEIGHTED>(chunk_counts)[chunks - 1]
                         : layernorm_backward_kernels<false, RMS, WEIGHTED>(chunk_counts)[chunks - 1];
  };
  auto kernel = pick(std::true_type());
  if constexpr (RMS) {
    if (!weighted) kernel = pick(std::false_type());
  }
  cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  kernel<<<kRowBlocks, kLayerNormBackwardWarps * WARP_SIZE, shared, stream>>>(
      dresidual, partials, dout, inp, weight, mean, rstd, N, C);
  cudaCheckLaunch();
  const int stride = layernorm_backward_sums(RMS, sum_dresidual, weighted) * C;
  if (weighted) column_sum_finalize(dweight, partials, stride, C, kRowBlocks, seed, stream);
  if (!RMS) column_sum_finalize(dbias, partials + C, stride, C, kRowBlocks, seed ^ 0x68e31da4u, stream);
  if (sum_dresidual) {
    column_sum_finalize(dresidual_dbias, partials + (stride - C), stride, C, kRowBlocks,
                        seed ^ 0x3c6ef372u, stream);
  }
}

// dresidual += dx; dweight += sum(norm * dout); dbias += sum(dout); and, when given,
// dresidual_dbias += column sums of the updated dresidual: the bias gradient of the projection
// whose output is added to the residual stream here, so that projection's backward need not read
// dresidual again. partials: kRowBlocks * 3C floats.
void layernorm_backward(floatX* dresidual, floatX* dweight, floatX* dbias, floatX* dresidual_dbias,
                        float* partials, const floatX* dout, const floatX* inp, const floatX* weight,
                        const float* mean, const float* rstd, int N, int C, uint32_t seed,
                        cudaStream_t stream) {
  norm_launch_backward<false>("layernorm_backward", dresidual, dweight, dbias, dresidual_dbias, partials,
                       dout, inp, weight, mean, rstd, N, C, seed, stream);
}

// As layernorm_backward, with dx = rstd * (dnorm - norm * mean(dnorm * norm)), dnorm = weight *
// dout, norm = x * rstd; no dbias. partials: kRowBlocks * 2C floats (kRowBlocks * C without
// dresidual_dbias). weight and dweight nullptr: no gain (dnorm = dout); partials then hold only
// dresidual_dbias's sums (kRowBlocks * C floats; none without it: partials may be nullptr).
void rmsnorm_backward(floatX* dresidual, floatX* dweight, floatX* dresidual_dbias, float* partials,
                      const floatX* dout, const floatX* inp, const floatX* weight, const float* rstd,
                      int N, int C, uint32_t seed, cudaStream_t stream) {
  norm_launch_backward<true>("rmsnorm_backward", dresidual, dweight, nullptr, dresidual_dbias, partials,
                      dout, inp, weight, nullptr, rstd, N, C, seed, stream);
}

// ---- The speedrun's residual mix before each block (SPEC "The speedrun architecture") ----
// out = lambdas[0] * s + lambdas[1] * x0, with s = x + skip_weight * skip in the U-net's second
// half (skip: an earlier layer's output) and s = x elsewhere (skip nullptr). x, x0, skip, out
// [N, C]; lambdas (2 values) and skip_weight (1) are read from the parameters on the device. s is
// kept in FP32 (not rounded), in the forward and as the backward recomputes it; out is rounded
// once. The forward is fused with the block's first norm (an RMSNorm), which reads the rounded
// out back as fused_residual_layernorm_forward_kernel does (one warp a row); the backward
// (residual_mix_backward) is elementwise, and its scalar gradients are section 2's row-block
// sums: deterministic. The multiply-adds are written out, so that both passes and every build
// evaluate them alike. The forward may first finish the block before: its residual add, whose sum
// is the stream this block mixes (ResidualAddFirst); the backward may add a gradient that joins the
// stream's there (GradientJoin). Floor: forward reads 2-3 NC values and writes 2 NC (out and the
// norm's), one more of each with the add; backward reads 4-6 NC (one more with a join) and writes
// 2-3 NC; under 10 FLOPs a value, so memory-bound.

// s = x + w * skip, and out = l0 * s + l1 * x0 before its rounding.
__device__ __forceinline__ float residual_mix_skipped(float x, float skip, float w) { return __fmaf_rn(w, skip, x); }
__device__ __forceinline__ float residual_mix_value(float s, float x0, float l0, float l1) {
  return __fmaf_rn(l0, s, l1 * x0);
}

template <bool WEIGHTED>
__global__ void residual_mix_norm_forward_kernel(floatX* out, floatX* norm_out, float* rstd, const floatX* x,
                                                 const floatX* x_add, floatX* x_sum, const floatX* x0,
                                                 const floatX* skip, const floatX* lambdas,
                                                 const floatX* skip_weight, const floatX* weight,
                                                 SublayerScales add_scales, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
  if (row >= N) return;
  const int lane = threadIdx.x % WARP_SIZE;
  const size_t base = (size_t)row * C;
  const float l0 = (float)lambdas[0], l1 = (float)lambdas[1];
  const float w = skip ? (float)skip_weight[0] : 0.0f;
  const SublayerScaleValues s = sublayer_scale_values(add_scales, row);
  for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
    x128 vx = load128(x + base + c);
    const x128 v0 = load128(x0 + base + c);
    if (x_add) {  // the residual add before the mix, as fused_residual_layernorm_forward_kernel's
      const x128 va = load128(x_add + base + c);
      for (int k = 0; k < x128::size; k++) vx[k] = (floatX)sublayer_add((float)vx[k], (float)va[k], s);
      store128(x_sum + base + c, vx);
    }
    // The skip may be the sum itself (the U-net's first skip adds the block before's output).
    const x128 vs = !skip ? x128() : skip == x_sum ? vx : load128(skip + base + c);
    x128 o;
    for (int k = 0; k < x128::size; k++) {
      const float s = skip ? residual_mix_skipped((float)vx[k], (float)vs[k], w) : (float)vx[k];
      o[k] = (floatX)residual_mix_value(s, (float)v0[k], l0, l1);
    }
    store128(out + base + c, o);
  }
  // Each lane reads back only what it wrote, so no barrier is needed before normalising.
  layernorm_row<true, WEIGHTED>(norm_out ? norm_out + base : nullptr, nullptr, rstd + row, out + base, weight,
                                nullptr, C, lane);
}

// A gradient that joins dx after the mix's backward, dx = round(dx + add) with stochastic rounding
// under seed (add_inplace's bits), or none (add nullptr): the stream's gradient from another path
// (the U-net's kept output, or x0's), in the pass that writes dx anyway.
struct GradientJoin {
  const floatX* add = nullptr;
  uint32_t seed = 0;
};

// grid kRowBlocks, 1-D blocks: each block's elements in order, then its partials
// (dlambda0, dlambda1, dskip_weight).
__global__ void residual_mix_backward_kernel(floatX* dx, floatX* dx0, floatX* dskip, float* partials,
                                             const floatX* dout, const floatX* x, const floatX* x0,
                                             const floatX* skip, const floatX* lambdas,
                                             const floatX* skip_weight, GradientJoin join, int N, int C) {
  const float l0 = (float)lambdas[0], l1 = (float)lambdas[1];
  const float w = skip ? (float)skip_weight[0] : 0.0f;
  float sums[3] = {};
  const RowBlockRange range = row_block_range(N, C);
  for (size_t i = range.begin + threadIdx.x * x128::size; i < range.end; i += blockDim.x * x128::size) {
    const x128 d = load128(dout + i), vx = load128(x + i), v0 = load128(x0 + i), g0 = load128(dx0 + i);
    const x128 vs = skip ? load128(skip + i) : x128(), gs = skip ? load128(dskip + i) : x128();
    x128 ox, o0, os;
    for (int k = 0; k < x128::size; k++) {
      const float g = (float)d[k], ds = l0 * g;  // ds: the gradient of s
      float s = (float)vx[k];
      if (skip) {
        s = residual_mix_skipped(s, (float)vs[k], w);
        sums[2] += ds * (float)vs[k];
        os[k] = (floatX)((float)gs[k] + w * ds);
      }
      sums[0] += g * s;
      sums[1] += g * (float)v0[k];
      ox[k] = (floatX)ds;
      o0[k] = (floatX)((float)g0[k] + l1 * g);
    }
    if (join.add) {  // add_inplace's bits; the gradient joining may be dx0's or dskip's, just written
      const x128 a = join.add == dx0 ? o0 : join.add == dskip ? os : load128(join.add + i);
      for (int k = 0; k < x128::size; k++) ox[k] = round_stochastic((float)ox[k] + (float)a[k], join.seed, i + k);
    }
    store128(dx + i, ox);
    store128(dx0 + i, o0);
    if (skip) store128(dskip + i, os);
  }
  row_block_sums_store(partials, sums);
}

constexpr int kResidualMixThreads = 256;

void residual_mix_check(const char* name, int N, int C, const floatX* skip, const floatX* skip_weight) {
  REQUIRE(N > 0 && C > 0 && C % x128::size == 0, "%s: N=%d must be positive and C=%d a positive multiple of %d",
          name, N, C, x128::size);
  REQUIRE((skip == nullptr) == (skip_weight == nullptr), "%s: give skip and skip_weight together, or neither", name);
}

// out [N, C] = lambdas[0] * (x + skip_weight * skip) + lambdas[1] * x0 (skip, skip_weight nullptr:
// no skip; x may be x0, the first layer, or out itself), then norm_out [N, C] (nullptr: rstd alone)
// and rstd [N] of out's RMSNorm, rmsnorm_forward's bits (weight nullptr: without a gain). With
// add.x_add, x is first replaced by x + x_add (with add.scales r x + p x_add), rounded
// (fused_residual_rmsnorm_forward's bits), and written into add.x_sum: the residual add that ends
// the block before (its output) in this pass, which reads them anyway; skip may be add.x_sum (that
// output is the U-net's skip).
struct ResidualAddFirst {
  const floatX* x_add = nullptr;
  floatX* x_sum = nullptr;
  SublayerScales scales;
};
void residual_mix_norm_forward(floatX* out, floatX* norm_out, float* rstd, const floatX* x, const floatX* x0,
                               const floatX* skip, const floatX* lambdas, const floatX* skip_weight,
                               const floatX* weight, int N, int C, cudaStream_t stream,
                               const ResidualAddFirst& add = {}) {
  const char* name = "residual_mix_norm_forward";
  residual_mix_check(name, N, C, skip, skip_weight);
  REQUIRE((add.x_add == nullptr) == (add.x_sum == nullptr) && (!add.x_sum || (add.x_sum != out && add.x_sum != x0)),
          "%s: give x_add and x_sum together, x_sum apart from out and x0", name);
  const int blocks = ceil_div(N, kLayerNormForwardThreads / WARP_SIZE);
  const auto kernel = weight ? residual_mix_norm_forward_kernel<true> : residual_mix_norm_forward_kernel<false>;
  kernel<<<blocks, kLayerNormForwardThreads, 0, stream>>>(out, norm_out, rstd, x, add.x_add, add.x_sum, x0, skip,
                                                          lambdas, skip_weight, weight, add.scales, N, C);
  cudaCheckLaunch();
}

// From dout, the gradient of residual_mix_norm_forward's out, with ds = lambdas[0] * dout (FP32), the
// gradient of s = x + skip_weight * skip:
//   dx = ds, written (the gradient of x; dx may be dout itself, not dx0 or dskip);
//   dx0 += lambdas[1] * dout;  dskip += skip_weight * ds (skip given);
//   dlambdas[0] += sum(dout * s), dlambdas[1] += sum(dout * x0), dskip_weight += sum(ds * skip),
// the scalar sums with stochastic rounding (seed). partials: kRowBlocks * 3 floats. join.add given:
// then dx += join.add (GradientJoin; join.add may be dx0 or dskip, their values after this pass).
void residual_mix_backward(floatX* dx, floatX* dx0, floatX* dskip, floatX* dlambdas, floatX* dskip_weight,
                           float* partials, const floatX* dout, const floatX* x, const floatX* x0,
                           const floatX* skip, const floatX* lambdas, const floatX* skip_weight, int N, int C,
                           uint32_t seed, cudaStream_t stream, const GradientJoin& join = {}) {
  const char* name = "residual_mix_backward";
  residual_mix_check(name, N, C, skip, skip_weight);
  REQUIRE((skip == nullptr) == (dskip == nullptr) && (skip == nullptr) == (dskip_weight == nullptr),
          "%s: give dskip and dskip_weight with skip, or none of them", name);
  REQUIRE(dx0 != dx && dx0 != dout && (!dskip || (dskip != dx && dskip != dout && dskip != dx0)),
          "%s: dx0 and dskip must not share memory with dx, dout or each other", name);
  REQUIRE(join.add != dx && join.add != dout, "%s: the gradient joining dx must not share memory with dx or dout",
          name);
  residual_mix_backward_kernel<<<kRowBlocks, kResidualMixThreads, 0, stream>>>(
      dx, dx0, dskip, partials, dout, x, x0, skip, lambdas, skip_weight, join, N, C);
  cudaCheckLaunch();
  column_sum_finalize(dlambdas, partials, 3, 2, kRowBlocks, seed, stream);
  if (skip) column_sum_finalize(dskip_weight, partials + 2, 3, 1, kRowBlocks, seed ^ 0x2545f491u, stream);
}

// ---- Record #89's residual lambdas' backward ----
// From dout, the gradient of out = r x + p y (SublayerScales, both given): the gradient of y,
// p dout, into dy; that of x, r dout, in place of dout; dr += the sum of dout x and dp += the sum of
// dout y over the rows, section 2's row-block sums, stochastic rounding under seed: deterministic.
// The products are rounded to nearest, as the forward's sum. Floor: reads 3 NC values, writes 2 NC;
// memory-bound.

// grid kRowBlocks, 1-D blocks: each block's elements in order, then its partials (dr, dp).
__global__ void sublayer_lambdas_backward_kernel(floatX* dy, floatX* dout, float* partials, const floatX* x,
                                                 const floatX* y, SublayerScales scales, int N, int C) {
  const SublayerScaleValues s = sublayer_scale_values(scales, 0);
  float sums[2] = {};
  const RowBlockRange range = row_block_range(N, C);
  for (size_t i = range.begin + threadIdx.x * x128::size; i < range.end; i += blockDim.x * x128::size) {
    const x128 d = load128(dout + i), vx = load128(x + i), vy = load128(y + i);
    x128 ox, oy;
    for (int k = 0; k < x128::size; k++) {
      const float g = (float)d[k];
      sums[0] += g * (float)vx[k];
      sums[1] += g * (float)vy[k];
      ox[k] = (floatX)__fmul_rn(s.r, g);
      oy[k] = (floatX)__fmul_rn(s.p, g);
    }
    store128(dout + i, ox);
    store128(dy + i, oy);
  }
  row_block_sums_store(partials, sums);
}

// Scales a row (SublayerScales' strides): grid kRowBlocks of kGateRowWarps warps, warp w taking its block's
// rows w, w + 8, ... in turn, a lane its 16-byte pieces in order: dy = p_n dout, dout = r_n dout in place,
// and dr_n = dout . x, dp_n = dout . y over row n (the lanes' sums in warp_reduce_sum's tree), written
// into the rows' gradients (GateGradient) rounded once.
__global__ void sublayer_row_lambdas_backward_kernel(floatX* dy, floatX* dout, GateGradient dr, GateGradient dp,
                                                     const floatX* x, const floatX* y, SublayerScales scales, int N,
                                                     int C) {
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int rpb = rows_per_block(N);
  const int r0 = min(N, (int)blockIdx.x * rpb), r1 = min(N, r0 + rpb);
  for (int row = r0 + warp; row < r1; row += kGateRowWarps) {
    const SublayerScaleValues s = sublayer_scale_values(scales, row);
    const size_t base = (size_t)row * C;
    float sum_x = 0.0f, sum_y = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
      const x128 d = load128(dout + base + c), vx = load128(x + base + c), vy = load128(y + base + c);
      x128 ox, oy;
      for (int k = 0; k < x128::size; k++) {
        const float g = (float)d[k];
        sum_x += g * (float)vx[k];
        sum_y += g * (float)vy[k];
        ox[k] = (floatX)__fmul_rn(s.r, g);
        oy[k] = (floatX)__fmul_rn(s.p, g);
      }
      store128(dout + base + c, ox);
      store128(dy + base + c, oy);
    }
    sum_x = warp_reduce_sum(sum_x);
    sum_y = warp_reduce_sum(sum_y);
    if (lane == 0) {
      dr.values[(size_t)row * dr.stride] = (floatX)sum_x;
      dp.values[(size_t)row * dp.stride] = (floatX)sum_y;
    }
  }
}

// The same with scales a row (record #89's MUDD coefficients): their gradients written a row.
void sublayer_row_lambdas_backward(floatX* dy, floatX* dout, GateGradient dr, GateGradient dp, const floatX* x,
                                   const floatX* y, const SublayerScales& scales, int N, int C, cudaStream_t stream) {
  const char* name = "sublayer_row_lambdas_backward";
  REQUIRE(N > 0 && C > 0 && C % x128::size == 0, "%s: N=%d must be positive and C=%d a positive multiple of %d",
          name, N, C, x128::size);
  REQUIRE(scales.r && scales.p && scales.r_stride > 0 && scales.p_stride > 0 && dr.values && dp.values &&
              dr.stride > 0 && dp.stride > 0,
          "%s: give both scales a row and both of their gradients a row", name);
  REQUIRE(dy != dout && dy != x && dy != y && dout != x && dout != y,
          "%s: dy and dout must not share memory with each other, x or y", name);
  sublayer_row_lambdas_backward_kernel<<<kRowBlocks, kGateRowWarps * WARP_SIZE, 0, stream>>>(dy, dout, dr, dp, x, y,
                                                                                            scales, N, C);
  cudaCheckLaunch();
}

// partials: kRowBlocks * 2 floats.
void sublayer_lambdas_backward(floatX* dy, floatX* dout, floatX* dr, floatX* dp, float* partials, const floatX* x,
                               const floatX* y, const SublayerScales& scales, int N, int C, uint32_t seed,
                               cudaStream_t stream) {
  const char* name = "sublayer_lambdas_backward";
  REQUIRE(N > 0 && C > 0 && C % x128::size == 0, "%s: N=%d must be positive and C=%d a positive multiple of %d",
          name, N, C, x128::size);
  REQUIRE(scales.r && scales.p && dr && dp && scales.p_stride == 0 && scales.r_stride == 0,
          "%s: give both scales (one value each) and both of their gradients", name);
  REQUIRE(dy != dout && dy != x && dy != y && dout != x && dout != y,
          "%s: dy and dout must not share memory with each other, x or y", name);
  sublayer_lambdas_backward_kernel<<<kRowBlocks, kResidualMixThreads, 0, stream>>>(dy, dout, partials, x, y, scales,
                                                                                    N, C);
  cudaCheckLaunch();
  column_sum_finalize(dr, partials, 2, 1, kRowBlocks, seed, stream);
  column_sum_finalize(dp, partials + 1, 2, 1, kRowBlocks, seed ^ 0x2545f491u, stream);
}

// ============================================================================
// 5. Matmul
// ============================================================================
// Linear layers out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias through cuBLASLt, in
// column-major terms out^T = weight^T(op T) x inp^T. Epilogues fuse the bias, and GELU (keeping
// the pre-activation in an aux buffer for the backward pass) or the GELU gradient. Weight
// gradients accumulate with beta = 1: cuBLASLt adds the new product to the old gradient in FP32
// and rounds once. Each product runs cuBLASLt's first heuristic algorithm or one checked to give
// its bits (below), and none of them uses atomics, so the products are deterministic. Floor:
// 2*N*C*OC FLOPs.

cublasLtHandle_t cublaslt_handle;
cublasHandle_t cublas_handle;
void* cublaslt_workspace = nullptr;
constexpr size_t kCublasWorkspaceBytes = 32 << 20;
cublasComputeType_t cublas_compute_type = CUBLAS_COMPUTE_32F;

bool matmul_tuning = true;  // off: always cuBLASLt's first heuristic

struct MatmulChoice {
  int m, n, k;
  bool trans_a, trans_b, bias, fast_accum;
  cudaDataType_t type_a, type_b, type_d;
  cublasLtEpilogue_t epilogue;
  cublasLtMatmulAlgo_t algo;
};
std::vector<MatmulChoice> matmul_choices;
unsigned long long* matmul_checksum = nullptr;  // device, one word

void matmul_forget_choices() { matmul_choices.clear(); }

// Fails unless a CUDA GPU is visible; `instead` ends the message (what would run without one).
void require_gpu(const std::string& instead) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    LLMC_FAIL("no CUDA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)%s", instead.c_str());
  }
}

void matmul_setup(bool allow_tf32) {
  require_gpu("");
  cublasCheck(cublasLtCreate(&cublaslt_handle));
  cublasCheck(cublasCreate(&cublas_handle));
  cublaslt_workspace = device_alloc<char>(kCublasWorkspaceBytes, "the cuBLASLt workspace");
  matmul_checksum = device_alloc<unsigned long long>(1, "the matmul tuning checksum");
  // TF32 only matters for FP32 builds; BF16 products always accumulate in FP32.
  cublas_compute_type = allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

void matmul_teardown() {
  matmul_forget_choices();
  device_free(matmul_checksum);
  device_free(cublaslt_workspace);
  cublasCheck(cublasDestroy(cublas_handle));
  cublasCheck(cublasLtDestroy(cublaslt_handle));
}

// cuBLASLt's first heuristic is often not its fastest algorithm (at d12, neither the lm head's nor
// the GELU forward's: dev/notes/code-structure.md), so the first call of each product (beta = 0
// only: it is run several times) times the candidates that split K as the first does, and later
// calls reuse the fastest. Those compute every output with
// the same instruction over K in the same order, so they give the first's bits; each one's output
// is also checked against the first's (a position-weighted sum of its bits) before it may be
// chosen, so the choice, which can differ between runs, never changes a result.
// Integer sums are exact in any order, so the atomic adds make no result depend on scheduling.
__global__ void bits_checksum_kernel(unsigned long long* sum, const uint32_t* words, size_t n) {
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    acc += (unsigned long long)words[i] * (2 * i + 1);
  }
  for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, offset);
  if (threadIdx.x % WARP_SIZE == 0) atomicAdd(sum, acc);
}

unsigned long long bits_checksum(const void* d, size_t bytes, cudaStream_t stream) {
  unsigned long long host = 0;
  cudaCheck(cudaMemsetAsync(matmul_checksum, 0, sizeof(host), stream));
  bits_checksum_kernel<<<512, 256, 0, stream>>>(matmul_checksum, reinterpret_cast<const uint32_t*>(d),
                                               bytes / sizeof(uint32_t));
  cudaCheckLaunch();
  cudaCheck(cudaMemcpyAsync(&host, matmul_checksum, sizeof(host), cudaMemcpyDeviceToHost, stream));
  cudaCheck(cudaStreamSynchronize(stream));
  return host;
}

// Of cuBLASLt's candidates for one product (the first is its heuristic's choice), the fastest
// whose split of K matches the first's and whose output has the first's bits. run(algo) computes
// the product into d (`bytes` long); d is left holding some candidate's output.
template <class Run>
cublasLtMatmulAlgo_t fastest_matching_algo(const Run& run, const cublasLtMatmulHeuristicResult_t* candidates,
                                           int found, const void* d, size_t bytes, cudaStream_t stream) {
  auto split = [](const cublasLtMatmulAlgo_t& algo) {
    int splits = 0, scheme = 0;
    size_t size = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits), &size);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &size);
    return std::make_pair(splits, scheme);
  };
  cudaEvent_t start, stop;
  cudaCheck(cudaEventCreate(&start));
  cudaCheck(cudaEventCreate(&stop));
  unsigned long long first_bits = 0;
  int best = 0;
  float best_ms = INFINITY;
  for (int i = 0; i < found; i++) {
    const cublasLtMatmulAlgo_t& algo = candidates[i].algo;
    if (i > 0 && split(algo) != split(candidates[0].algo)) continue;
    const cublasStatus_t status = run(algo);
    if (i == 0) cublasCheck(status);
    if (status != CUBLAS_STATUS_SUCCESS) continue;
    const unsigned long long bits = bits_checksum(d, bytes, stream);
    if (i == 0) first_bits = bits;
    if (bits != first_bits) continue;
    constexpr int kTimedRuns = 3;
    cudaCheck(cudaEventRecord(start, stream));
    for (int r = 0; r < kTimedRuns; r++) cublasCheck(run(algo));
    cudaCheck(cudaEventRecord(stop, stream));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    if (ms < best_ms) best_ms = ms, best = i;
  }
  cudaCheck(cudaEventDestroy(start));
  cudaCheck(cudaEventDestroy(stop));
  return candidates[best].algo;
}

// A and B of another type than the storage type (the FP8 products at the end of this section):
// their types and dequantisation scales, device floats by which cuBLASLt multiplies the product;
// and D's type: the storage type, or FP32 (the FP8 head's weight gradient, type_d = CUDA_R_32F).
// The scales must be 16-byte aligned: cuBLASLt 13.1 accepts others in its heuristic, then refuses
// to run with CUBLAS_STATUS_NOT_SUPPORTED.
struct MatmulOperands {
  cudaDataType_t type_a = kCudaFloatX, type_b = kCudaFloatX, type_d = kCudaFloatX;
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  // FP8 only: accumulate in the tensor cores' own accumulator, without cuBLASLt's periodic
  // promotion into FP32 (CUBLASLT_MATMUL_DESC_FAST_ACCUM): faster, a little less precise over
  // long sums. The FP8 recipes of Transformer Engine and torchao use it for the forward product
  // and not for the gradients'; ours for the forward and the input gradient (sums over channels),
  // not for the weight gradient, whose sums run over every token.
  bool fast_accum = false;
};

// Column-major D[m, n] = op(A)[m, k] op(B)[k, n] (+ bias[m]) (+ beta * D) with an epilogue.
// A is stored m x k (lda = m) or, transposed, k x m (lda = k); likewise B; D of ops.type_d.
// Returns false when cuBLASLt has no algorithm for this epilogue (the callers then fall back to
// separate kernels).
bool matmul_cublaslt(void* d, const void* a, const void* b, const floatX* bias, int m, int n,
                     int k, bool trans_a, bool trans_b, float beta, cublasLtEpilogue_t epilogue,
                     floatX* aux, cudaStream_t stream, const MatmulOperands& ops = MatmulOperands()) {
  REQUIRE(((uintptr_t)a % 16) == 0 && ((uintptr_t)b % 16) == 0 && ((uintptr_t)d % 16) == 0,
          "matmul: operands must be 16-byte aligned");
  REQUIRE((uintptr_t)ops.scale_a % 16 == 0 && (uintptr_t)ops.scale_b % 16 == 0,
          "matmul: the operands' scales must be 16-byte aligned");
  // FP8 products accumulate in FP32 (cuBLASLt has no TF32 variant of them).
  const bool storage_type = ops.type_a == kCudaFloatX && ops.type_b == kCudaFloatX;
  cublasLtMatmulDesc_t desc;
  cublasCheck(cublasLtMatmulDescCreate(&desc, storage_type ? cublas_compute_type : CUBLAS_COMPUTE_32F,
                                       CUDA_R_32F));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (ops.scale_a) {
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ops.scale_a,
                                               sizeof(ops.scale_a)));
  }
  if (ops.scale_b) {
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ops.scale_b,
                                               sizeof(ops.scale_b)));
  }
  if (ops.fast_accum) {
    const int8_t fast = 1;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  }
  if (bias) {
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof(bias)));
  }
  if (aux) {
    const int64_t ld_aux = m;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                               &aux, sizeof(aux)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux,
                                               sizeof(ld_aux)));
  }
  cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                             sizeof(epilogue)));
  cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
  cublasCheck(cublasLtMatrixLayoutCreate(&layout_a, ops.type_a, trans_a ? k : m, trans_a ? m : k,
                                         trans_a ? k : m));
  cublasCheck(cublasLtMatrixLayoutCreate(&layout_b, ops.type_b, trans_b ? n : k, trans_b ? k : n,
                                         trans_b ? n : k));
  REQUIRE(ops.type_d == kCudaFloatX || (ops.type_d == CUDA_R_32F && !storage_type && !bias && !aux),
          "matmul: an FP32 output is for FP8 products without bias or epilogue");
  cublasCheck(cublasLtMatrixLayoutCreate(&layout_d, ops.type_d, m, n, m));
  const float alpha = 1.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(cublaslt_handle, desc, &alpha, a, layout_a, b, layout_b, &beta, d, layout_d,
                          d, layout_d, &algo, cublaslt_workspace, kCublasWorkspaceBytes, stream);
  };
  const bool tune = matmul_tuning && beta == 0.0f;
  auto known = std::find_if(matmul_choices.begin(), matmul_choices.end(), [&](const MatmulChoice& c) {
    return c.m == m && c.n == n && c.k == k && c.trans_a == trans_a && c.trans_b == trans_b &&
           c.bias == (bias != nullptr) && c.fast_accum == ops.fast_accum && c.type_a == ops.type_a &&
           c.type_b == ops.type_b && c.type_d == ops.type_d && c.epilogue == epilogue;
  });
  bool ok = true;
  if (tune && known != matmul_choices.end()) {
    cublasCheck(run(known->algo));
  } else {
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &kCublasWorkspaceBytes,
                                                     sizeof(kCublasWorkspaceBytes)));
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t heuristics[kCandidates];
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        cublaslt_handle, desc, layout_a, layout_b, layout_d, layout_d, pref, tune ? kCandidates : 1,
        heuristics, &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    ok = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ok) {
      cublasLtMatmulAlgo_t algo = heuristics[0].algo;
      if (tune) {
        const size_t d_bytes = (size_t)m * n * (ops.type_d == CUDA_R_32F ? sizeof(float) : sizeof(floatX));
        algo = fastest_matching_algo(run, heuristics, found, d, d_bytes, stream);
        matmul_choices.push_back({m, n, k, trans_a, trans_b, bias != nullptr, ops.fast_accum, ops.type_a,
                                  ops.type_b, ops.type_d, epilogue, algo});
      }
      cublasCheck(run(algo));
    }
  }
  cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
  cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
  cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
  cublasCheck(cublasLtMatmulDescDestroy(desc));
  return ok;
}

// The MLP's activations (section 7), and record #89's MUDD gate generators' exact GELU.
enum class Activation { kGelu, kRelu2, kGeluErf };
__device__ __forceinline__ float gelu(float x);
__device__ __forceinline__ float gelu_grad(float x);
__device__ __forceinline__ float relu2(float x);
__device__ __forceinline__ float relu2_grad(float x);
__device__ __forceinline__ float relu2_grad_from_output(float y);
void gelu_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream);
void gelu_backward_inplace(floatX* d_in_out, const floatX* inp, size_t n, cudaStream_t stream);
void activation_backward_inplace(Activation act, floatX* d, const floatX* inp, size_t n, cudaStream_t stream);

// The forward product out[N, OC] = b[N, C] @ a[OC, C]^T + bias of the storage-type or the FP8
// operands: with pre_gelu, pre_gelu = that and out = GELU(it), in cuBLASLt's epilogue or after it.
void matmul_forward_product(floatX* out, const void* a, const void* b, const floatX* bias, int N,
                            int C, int OC, floatX* pre_gelu, const MatmulOperands& ops,
                            cudaStream_t stream) {
  if (pre_gelu) {
    const cublasLtEpilogue_t ep = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (matmul_cublaslt(out, a, b, bias, OC, N, C, true, false, 0.0f, ep, pre_gelu, stream, ops)) return;
    matmul_forward_product(pre_gelu, a, b, bias, N, C, OC, nullptr, ops, stream);
    gelu_forward(out, pre_gelu, (size_t)N * OC, stream);
    return;
  }
  const cublasLtEpilogue_t ep = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  REQUIRE(matmul_cublaslt(out, a, b, bias, OC, N, C, true, false, 0.0f, ep, nullptr, stream, ops),
          "cuBLASLt found no algorithm for the %dx%dx%d forward product", N, OC, C);
}

// out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias. With pre_gelu: pre_gelu = that, out = GELU(it).
void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                    int N, int C, int OC, floatX* pre_gelu, cudaStream_t stream) {
  REQUIRE(C % 8 == 0 && OC % 8 == 0, "matmul_forward: C=%d and OC=%d must be multiples of 8", C, OC);
  matmul_forward_product(out, weight, inp, bias, N, C, OC, pre_gelu, MatmulOperands(), stream);
}

// dbias[OC] += column sums of dout[N, OC] (deterministic, section 2).
void matmul_dbias(floatX* dbias, float* partials, const floatX* dout, int N, int OC, uint32_t seed,
                  cudaStream_t stream) {
  REQUIRE(OC % x128::size == 0, "matmul_backward: OC=%d must be a multiple of %d", OC, x128::size);
  column_sum_partials_kernel<<<dim3(ceil_div(OC, WARP_SIZE * x128::size), kRowBlocks),
                               dim3(WARP_SIZE, kColumnSumRowLanes), 0, stream>>>(partials, dout, N, OC);
  cudaCheckLaunch();
  column_sum_finalize(dbias, partials, OC, OC, kRowBlocks, seed, stream);
}

// dinp[N, C] = the product of a and b over k = OC (the column-major C x N result of op(a) b),
// times GELU'(pre_gelu) when given: in cuBLASLt's DGELU epilogue, or after it.
void matmul_dinp_product(floatX* dinp, const void* a, bool trans_a, const void* b,
                         const floatX* pre_gelu, int N, int C, int OC, const MatmulOperands& ops,
                         cudaStream_t stream) {
  if (pre_gelu && matmul_cublaslt(dinp, a, b, nullptr, C, N, OC, trans_a, false, 0.0f,
                                  CUBLASLT_EPILOGUE_DGELU, const_cast<floatX*>(pre_gelu), stream, ops)) {
    return;
  }
  REQUIRE(matmul_cublaslt(dinp, a, b, nullptr, C, N, OC, trans_a, false, 0.0f,
                          CUBLASLT_EPILOGUE_DEFAULT, nullptr, stream, ops),
          "cuBLASLt found no algorithm for the %dx%dx%d input-gradient product", N, C, OC);
  if (pre_gelu) gelu_backward_inplace(dinp, pre_gelu, (size_t)N * C, stream);
}

// dweight[OC, C] += dout[N, OC]^T @ inp[N, C].
void matmul_dweight(floatX* dweight, const floatX* dout, const floatX* inp, int N, int C, int OC, cudaStream_t stream) {
  REQUIRE(matmul_cublaslt(dweight, inp, dout, nullptr, C, OC, N, false, true, 1.0f,
                          CUBLASLT_EPILOGUE_DEFAULT, nullptr, stream),
          "cuBLASLt found no algorithm for the %dx%dx%d weight-gradient product", C, OC, N);
}

// dinp[N, C] = dout[N, OC] @ weight[OC, C] (times GELU'(pre_gelu) when given);
// dweight[OC, C] += dout^T @ inp; dbias[OC] += column sums of dout (deterministic, section 2).
void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* partials,
                     const floatX* dout, const floatX* inp, const floatX* weight,
                     const floatX* pre_gelu, int N, int C, int OC, uint32_t seed,
                     cudaStream_t stream) {
  if (dbias) matmul_dbias(dbias, partials, dout, N, OC, seed, stream);
  matmul_dweight(dweight, dout, inp, N, C, OC, stream);
  matmul_dinp_product(dinp, weight, false, dout, pre_gelu, N, C, OC, MatmulOperands(), stream);
}

// ---- FP8 linear layers (-fp8 1 or 2: BF16 builds, compute capability 8.9 or newer) ----
// The blocks' linear layers can run their three products in FP8 on the tensor cores (cuBLASLt,
// FP32 accumulation, BF16 outputs): weights and activations in E4M3, output gradients in E5M2
// (or E4M3 with -fp8g 1). Each FP8 tensor has one scale from the amax of the BF16 tensor it is cast from
// ("current" scaling): s = 2^floor(log2(fp8_max / amax)), the largest power of two with
// amax * s <= fp8_max, and q = fp8(x * s) rounded to nearest even. A power of two makes x * s and
// q / s exact, so that a reference reproduces every cast bit for bit. The products read 1/s, their
// dequantisation scale, from device memory: nothing waits for the host. cuBLASLt's FP8 kernels
// take only the "TN" layout (both operands contiguous along the summed dimension, leading
// dimensions multiples of 16 bytes), so the backward products read transposed copies: the
// weight's, cast once per update, and the output gradient's and the input's along the tokens,
// padded with zero tokens to a multiple of 16.

enum class Fp8Format { kE4M3, kE5M2 };
constexpr int kFp8TokenAlign = 16;  // FP8 leading dimensions: multiples of 16 one-byte elements

inline const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::kE4M3 ? "E4M3" : "E5M2"; }
inline cudaDataType_t fp8_cuda_type(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}
inline int fp8_padded(int tokens) { return ceil_div(tokens, kFp8TokenAlign) * kFp8TokenAlign; }

// One FP8 tensor's scale, on the device. inv_scale comes first, 16-byte aligned, as cuBLASLt's
// scale pointers must be.
struct alignas(16) Fp8Scale {
  float inv_scale;     // 1/s, the products' dequantisation scale
  uint32_t amax_bits;  // max |x| as FP32 bits: an integer maximum, NaN above Inf above all numbers
  float scale;         // s, with delayed scaling: set from the amax history (fp8_update_scales)
  int emax;            // with delayed scaling: the format's largest exponent (fp8_scale_exponent)
};
static_assert(offsetof(Fp8Scale, inv_scale) == 0, "cuBLASLt reads inv_scale at a 16-byte boundary");

// The exponent e of s = 2^e for a given amax: the largest e with amax * 2^e <= fp8_max, where
// fp8_max = 1.75 * 2^emax (448 = 1.75 * 2^8, 57344 = 1.75 * 2^15), at most 126 so that s and 1/s
// are normal floats. An amax of 0 or not finite gives s = 1: the casts keep NaN and Inf as NaN
// (fp8_pair), so a non-finite tensor shows in the loss and the trainer skips the step.
__host__ __device__ inline int fp8_emax(Fp8Format f) { return f == Fp8Format::kE4M3 ? 8 : 15; }

__host__ __device__ inline int fp8_scale_exponent_for(float amax, int emax) {
  if (!(amax > 0.0f && amax <= FLT_MAX)) return 0;
  int exponent = 0;
  const float mantissa = 2.0f * frexpf(amax, &exponent);  // amax = mantissa * 2^(exponent - 1)
  const int e = (mantissa <= 1.75f ? emax : emax - 1) - (exponent - 1);
  return e < 126 ? e : 126;
}

__host__ __device__ inline int fp8_scale_exponent(float amax, Fp8Format f) {
  return fp8_scale_exponent_for(amax, fp8_emax(f));
}

// The cast's s. Current scaling: from the amax the scale holds (this tensor's), and the first
// thread of the grid stores 1/s. Delayed scaling: the s fp8_update_scales set, 1/s stored with it.
template <bool kDelayed>
__device__ __forceinline__ float fp8_cast_scale(Fp8Scale* scale, Fp8Format f) {
  if (kDelayed) return scale->scale;
  const int e = fp8_scale_exponent(__uint_as_float(scale->amax_bits), f);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) scale->inv_scale = ldexpf(1.0f, -e);
  return ldexpf(1.0f, e);
}

// Two values times s to FP8, x in the low byte, rounded to nearest even. The conversion saturates:
// values beyond fp8_max become +-fp8_max (with delayed scaling, those the history did not foresee,
// even where x * s overflows FP32 under a scale far above the tensor's), and so would Inf, so
// non-finite inputs are made NaN first. kFinite: the caller's values cannot be infinite (a bounded
// gradient; NaN stays NaN through the product), and the check is left out.
template <Fp8Format F, bool kFinite = false>
__device__ __forceinline__ uint16_t fp8_pair(float x, float y, float s) {
  x = kFinite || isfinite(x) ? x * s : NAN;
  y = kFinite || isfinite(y) ? y * s : NAN;
  return __nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE,
                                  F == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

// The FP8 values of one 16-byte piece of the storage type: 8 bytes (BF16) or 4 (FP32).
struct alignas(x128::size) Fp8Piece {
  uint8_t v[x128::size];
};

// The pairs are copied in whole (two to a register), not cut into bytes.
template <Fp8Format F, bool kFinite = false>
__device__ __forceinline__ Fp8Piece fp8_piece(const x128& x, float s) {
  uint16_t pairs[x128::size / 2];
#pragma unroll
  for (int k = 0; k < x128::size; k += 2) pairs[k / 2] = fp8_pair<F, kFinite>((float)x[k], (float)x[k + 1], s);
  Fp8Piece out;
  memcpy(&out, pairs, sizeof(out));
  return out;
}

// ---- FP8 amax: scale->amax_bits = max |x| over n values ----
// A fixed grid strides over x in 16-byte pieces; each block's maximum goes into amax_bits with one
// atomicMax on the FP32 bits of |x|. An integer maximum is exact in any order, so the result does
// not depend on scheduling or on the grid. The launcher zeroes amax_bits first. Floor: one read.
constexpr int kFp8Threads = 256;
constexpr int kFp8AmaxBlocks = 1024;

// max(m, |v[k]|) over a piece, as FP32 bits.
__device__ __forceinline__ uint32_t fp8_piece_amax(uint32_t m, const x128& v) {
  for (int k = 0; k < x128::size; k++) m = max(m, __float_as_uint((float)v[k]) & 0x7fffffffu);
  return m;
}

// The block's maximum of every thread's m, into *amax_bits with one atomicMax. Every thread of
// the block (kFp8Threads) must call it.
__device__ __forceinline__ void fp8_block_amax(uint32_t m, uint32_t* amax_bits) {
  __shared__ uint32_t warp_max[kFp8Threads / WARP_SIZE];
  for (int offset = 16; offset > 0; offset >>= 1) m = max(m, __shfl_xor_sync(0xffffffff, m, offset));
  if (threadIdx.x % WARP_SIZE == 0) warp_max[threadIdx.x / WARP_SIZE] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kFp8Threads / WARP_SIZE; w++) m = max(m, warp_max[w]);
  atomicMax(amax_bits, m);
}

__global__ void __launch_bounds__(kFp8Threads)
    fp8_amax_kernel(Fp8Scale* scale, const floatX* x, size_t pieces) {
  uint32_t m = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < pieces; i += stride) {
    m = fp8_piece_amax(m, load128(x + i * x128::size));
  }
  fp8_block_amax(m, &scale->amax_bits);
}

// keep_max: amax_bits becomes the maximum of its value and x's (not zeroed first).
void fp8_amax(Fp8Scale* scale, const floatX* x, size_t n, cudaStream_t stream, bool keep_max = false) {
  REQUIRE(n % x128::size == 0 && (uintptr_t)x % 16 == 0,
          "fp8_amax: n=%zu must be a multiple of %d and x 16-byte aligned", n, x128::size);
  if (!keep_max) cudaCheck(cudaMemsetAsync(&scale->amax_bits, 0, sizeof(scale->amax_bits), stream));
  const size_t pieces = n / x128::size;
  const int blocks = std::max(1, std::min(kFp8AmaxBlocks, ceil_div(pieces, kFp8Threads)));
  fp8_amax_kernel<<<blocks, kFp8Threads, 0, stream>>>(scale, x, pieces);
  cudaCheckLaunch();
}

// Calls launch(format, delayed) with both as compile-time constants (std::integral_constant), for
// launching the kernel template of a format and scaling.
template <class Launch>
void fp8_dispatch(Fp8Format f, bool delayed, Launch&& launch) {
  using E4M3 = std::integral_constant<Fp8Format, Fp8Format::kE4M3>;
  using E5M2 = std::integral_constant<Fp8Format, Fp8Format::kE5M2>;
  if (f == Fp8Format::kE4M3) {
    delayed ? launch(E4M3(), std::true_type()) : launch(E4M3(), std::false_type());
  } else {
    delayed ? launch(E5M2(), std::true_type()) : launch(E5M2(), std::false_type());
  }
}

// ---- FP8 cast-transpose: x [R, C] -> out [R, C] (optional) and out_t [C, fp8_padded(R)] ----
// out = fp8(x * s). Current scaling: s from scale->amax_bits, scale->inv_scale = 1/s. Delayed
// scaling: s is scale->scale, and max |x| goes into scale->amax_bits (an integer atomicMax, exact
// in any order) for the history. One read of x writes the FP8 values and their transpose, whose
// columns R and up are zeros (the padding tokens of the weight-gradient product). A block
// casts a tile of 128 rows x 64 columns into shared memory, transposed as it goes (each piece's
// bytes in an order rotated by its column, so that a warp's stores fall in distinct banks), then
// writes 128-byte rows of out_t. Deterministic (the amax is an integer maximum). Floor: reads 2
// bytes and writes 2 per value (BF16).
// What the kernel casts (Fp8CastInput): x itself; GELU(x) or ReLU^2(x), x being the activation's
// input, in FP32 and rounded to BF16 as gelu_forward and relu2_forward do (the same bits), never
// written (the fcproj layer's input in the pass that casts it: the fc product writes the
// activation's input alone); the norm of x, x being its input, from the row statistics the norm's
// forward kept and its weight and bias (LayerNorm; RMSNorm without mean and bias, and without a
// weight where it has no gain), as layernorm_row computes it (the same bits), never written (the
// qkv and fc layers' inputs); or, x being a gradient of the activation's output, x * GELU'(pre) or
// x * ReLU^2'(pre), in FP32 and rounded to BF16 as the activations' backward does, never written
// either (the fc layer's output gradient in the pass that casts it: reads 4 bytes a value,
// writes 2). Its only BF16 reader was the fc bias gradient's column sum, so the kernel sums each
// tile's columns instead: col_partials row blockIdx.y holds the sums over the tile's 128 rows,
// each thread's rows in order and then the threads of a column in order (fixed, so
// deterministic), for column_sum_finalize.
enum class Fp8CastInput { kValues, kGelu, kRelu2, kNorm, kTimesGeluGrad, kTimesRelu2Grad };

// Where an FP8 layer's input comes from (matmul_forward_fp8): kValues, kGelu, kRelu2 or kNorm, the
// last with the norm's row statistics [N] and its weight and bias [C] (mean and bias nullptr for
// RMSNorm, weight nullptr without a gain).
struct Fp8CastSource {
  Fp8CastInput kind = Fp8CastInput::kValues;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const floatX* weight = nullptr;
  const floatX* bias = nullptr;
};

Fp8CastSource fp8_norm_source(const float* mean, const float* rstd, const floatX* weight, const floatX* bias) {
  return {Fp8CastInput::kNorm, mean, rstd, weight, bias};
}

Fp8CastSource fp8_activation_source(Activation act) {
  return {act == Activation::kGelu ? Fp8CastInput::kGelu : Fp8CastInput::kRelu2};
}

constexpr int kFp8TileRows = 128, kFp8TileCols = 64;
constexpr int kFp8TilePitch = kFp8TileRows + 16;  // bytes per transposed row in shared memory

// The cast-transposes' shared tiles hold column c of a tile at tile + c * kFp8TilePitch. Piece
// `piece` of tile row r (its kPiece bytes, up to 8, shifted out of one register) goes down kPiece
// of those columns, each piece starting one column further on: byte c of piece p lands in bank
// (4 (kPiece p + c) + r / 4) mod 32 = (4 c + r / 4) mod 32 for 8-byte pieces (a column is 144
// bytes), so a warp's pieces (4 rows of 8) store into 8 distinct banks at each step.
template <int kPiece>
__device__ __forceinline__ void fp8_tile_put_piece(uint8_t* tile, const uint8_t (&bytes)[kPiece], int piece, int r) {
  static_assert(kPiece <= 8, "a piece is up to 8 bytes");
  uint64_t word = 0;
  memcpy(&word, bytes, kPiece);
#pragma unroll
  for (int k = 0; k < kPiece; k++) {
    const int c = (k + piece) % kPiece;
    tile[(piece * kPiece + c) * kFp8TilePitch + r] = (uint8_t)(word >> (8 * c));
  }
}

// After the block's __syncthreads: the tile's columns (tile columns col0 on) become 16-byte pieces
// of rows of out_t [C, ld_t] from row0 on, within C and ld_t.
__device__ __forceinline__ void fp8_tile_store_transposed(uint8_t* out_t, const uint8_t* tile, int row0, int col0,
                                                          int C, int ld_t) {
  constexpr int kSegments = kFp8TileRows / 16;  // 16-byte pieces per row of out_t
  for (int id = threadIdx.x; id < kFp8TileCols * kSegments; id += kFp8Threads) {
    const int segment = id % kSegments, c = id / kSegments;
    const int col = col0 + c, trow = row0 + segment * 16;
    if (col >= C || trow >= ld_t) continue;
    *reinterpret_cast<uint4*>(out_t + (size_t)col * ld_t + trow) =
        *reinterpret_cast<const uint4*>(tile + c * kFp8TilePitch + segment * 16);
  }
}

// The cast-transposes' tile rows over R rows: the rows of col_partials with GELU' in the cast.
int fp8_tile_rows(int R) { return ceil_div(fp8_padded(R), kFp8TileRows); }

template <Fp8Format F, bool kDelayed, Fp8CastInput kInput>
__global__ void __launch_bounds__(kFp8Threads)
    fp8_cast_transpose_kernel(uint8_t* out, uint8_t* out_t, Fp8Scale* scale, const floatX* x,
                              const floatX* pre_act, float* col_partials, Fp8CastSource ln, int R,
                              int C, int ld_t) {
  __shared__ alignas(16) uint8_t tile[kFp8TileCols * kFp8TilePitch];
  const float s = fp8_cast_scale<kDelayed>(scale, F);
  uint32_t m = 0;
  constexpr int kPieces = kFp8TileCols / x128::size;  // pieces per tile row
  constexpr int kLoads = kFp8TileRows * kPieces / kFp8Threads;  // pieces per thread
  static_assert(kLoads * kFp8Threads == kFp8TileRows * kPieces, "a tile is whole pieces per thread");
  const int row0 = blockIdx.y * kFp8TileRows, col0 = blockIdx.x * kFp8TileCols;
  // The loads of a batch of pieces are issued before the first of their stores: the stores to
  // out could alias later loads as far as the compiler knows, so a loop of load, cast, store
  // keeps one piece in flight per thread. The casts batch all of a thread's pieces. With an
  // activation's gradient, two inputs a piece, batches of 4 held too many registers; batches of
  // one piece, unrolled, ran fastest. With a norm (measured with LayerNorm's), batches of 4 hold
  // 80 registers (3 blocks an SM), batches of 2 hold 63 (4 blocks).
  constexpr bool kGeluGrad = kInput == Fp8CastInput::kTimesGeluGrad;
  constexpr bool kActGrad = kGeluGrad || kInput == Fp8CastInput::kTimesRelu2Grad;
  constexpr bool kNorm = kInput == Fp8CastInput::kNorm;
  constexpr int kBatch = kActGrad ? 1 : kNorm ? 2 : kLoads;
  // A thread's pieces share their columns (kFp8Threads is a multiple of kPieces): the norm's
  // weight and bias are loaded once, beside the first loads.
  static_assert(kFp8Threads % kPieces == 0, "a thread's pieces share their columns");
  x128 ln_weight, ln_bias;
  const bool layernorm = ln.mean != nullptr, weighted = ln.weight != nullptr;
  float col_sum[x128::size] = {};  // with an activation's gradient: the thread's column sums over its rows
  if (kNorm) {
    const int col = col0 + (threadIdx.x % kPieces) * x128::size;
    for (int k = 0; k < x128::size; k++) ln_weight[k] = ln_bias[k] = (floatX)0.0f;
    if (col < C && weighted) ln_weight = load128(ln.weight + col);
    if (col < C && layernorm) ln_bias = load128(ln.bias + col);
  }
#pragma unroll
  for (int j0 = 0; j0 < kLoads; j0 += kBatch) {
    x128 loaded[kBatch], act_in[kBatch];
    float ln_mean[kBatch], ln_rstd[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; b++) {
      const int id = threadIdx.x + (j0 + b) * kFp8Threads, piece = id % kPieces, r = id / kPieces;
      const int row = row0 + r, col = col0 + piece * x128::size;
      for (int k = 0; k < x128::size; k++) loaded[b][k] = act_in[b][k] = (floatX)0.0f;
      ln_mean[b] = ln_rstd[b] = 0.0f;
      if (row < R && col < C) {
        loaded[b] = load128(x + (size_t)row * C + col);
        if (kActGrad) act_in[b] = load128(pre_act + (size_t)row * C + col);
        if (kNorm) {
          ln_mean[b] = layernorm ? ln.mean[row] : 0.0f;
          ln_rstd[b] = ln.rstd[row];
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; b++) {
      const int id = threadIdx.x + (j0 + b) * kFp8Threads, piece = id % kPieces, r = id / kPieces;
      const int row = row0 + r, col = col0 + piece * x128::size;
      x128 v = loaded[b];
      if (kInput == Fp8CastInput::kGelu && row < R && col < C) {
        for (int k = 0; k < x128::size; k++) v[k] = (floatX)gelu((float)v[k]);
      }
      if (kInput == Fp8CastInput::kRelu2 && row < R && col < C) {
        for (int k = 0; k < x128::size; k++) v[k] = (floatX)relu2((float)v[k]);
      }
      if (kNorm && row < R && col < C) {
        for (int k = 0; k < x128::size; k++) {
          v[k] = (floatX)norm_value((float)v[k], ln_mean[b], ln_rstd[b], (float)ln_weight[k], (float)ln_bias[k],
                                    layernorm, weighted);
        }
      }
      if (kActGrad && row < R && col < C) {
        for (int k = 0; k < x128::size; k++) {
          const float pre = (float)act_in[b][k];
          v[k] = (floatX)((float)v[k] * (kGeluGrad ? gelu_grad(pre) : relu2_grad(pre)));
        }
      }
      if (kActGrad) {  // zeros outside the tensor
        // __fadd_rn keeps FP32 builds from fusing the product above into this sum: an FMA would
        // add the unrounded products, not the values cast.
        for (int k = 0; k < x128::size; k++) col_sum[k] = __fadd_rn(col_sum[k], (float)v[k]);
      }
      if (kDelayed) m = fp8_piece_amax(m, v);
      const Fp8Piece q = fp8_piece<F>(v, s);
      if (out && row < R && col < C) *reinterpret_cast<Fp8Piece*>(out + (size_t)row * C + col) = q;
      fp8_tile_put_piece(tile, q.v, piece, r);
    }
  }
  // A thread's pieces share their column piece threadIdx.x % kPieces (see above); its rows are
  // group, group + kGroups, ... for group threadIdx.x / kPieces.
  constexpr int kGroups = kFp8Threads / kPieces;
  __shared__ float group_sums[kActGrad ? kGroups : 1][kActGrad ? kFp8TileCols : 1];
  if (kActGrad) {
    for (int k = 0; k < x128::size; k++) {
      group_sums[threadIdx.x / kPieces][(threadIdx.x % kPieces) * x128::size + k] = col_sum[k];
    }
  }
  if (kDelayed) fp8_block_amax(m, &scale->amax_bits);
  __syncthreads();
  if (kActGrad && threadIdx.x < kFp8TileCols && col0 + threadIdx.x < C) {
    float total = 0.0f;
    for (int g = 0; g < kGroups; g++) total += group_sums[g][threadIdx.x];
    col_partials[(size_t)blockIdx.y * C + col0 + threadIdx.x] = total;
  }
  fp8_tile_store_transposed(out_t, tile, row0, col0, C, ld_t);
}

void fp8_cast_transpose_launch(uint8_t* out, uint8_t* out_t, Fp8Scale* scale, const floatX* x,
                               const floatX* pre_act, float* col_partials, int R, int C, Fp8Format f,
                               bool delayed, const Fp8CastSource& source, cudaStream_t stream) {
  const Fp8CastInput input = source.kind;
  const bool act_grad = input == Fp8CastInput::kTimesGeluGrad || input == Fp8CastInput::kTimesRelu2Grad;
  REQUIRE(act_grad == (pre_act != nullptr) && (pre_act != nullptr) == (col_partials != nullptr),
          "fp8_cast_transpose: pre_act and col_partials are given with an activation's gradient in the cast, and "
          "only then");
  REQUIRE(delayed || input == Fp8CastInput::kValues,
          "fp8_cast_transpose: an activation, a norm or an activation's gradient in the cast needs delayed scaling");
  REQUIRE(input != Fp8CastInput::kNorm ||
              (source.rstd && (source.mean == nullptr) == (source.bias == nullptr) &&
               (!source.mean || source.weight) && (uintptr_t)source.weight % 16 == 0 &&
               (uintptr_t)source.bias % 16 == 0),
          "fp8_cast_transpose: a norm in the cast needs its statistics (LayerNorm: its mean, weight and bias), its "
          "weight and bias 16-byte aligned");
  REQUIRE(C % x128::size == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)out % 16 == 0 &&
              (uintptr_t)out_t % 16 == 0 && (uintptr_t)pre_act % 16 == 0,
          "fp8_cast_transpose: C=%d must be a multiple of %d, x, pre_act, out and out_t 16-byte aligned",
          C, x128::size);
  const int ld_t = fp8_padded(R);
  const dim3 grid(ceil_div(C, kFp8TileCols), ceil_div(ld_t, kFp8TileRows));
  REQUIRE(grid.y <= 65535, "fp8_cast_transpose: R=%d rows are more than one launch takes", R);
  fp8_dispatch(f, delayed, [&](auto format, auto is_delayed) {
    constexpr Fp8Format kFormat = decltype(format)::value;
    constexpr bool kDelayed = decltype(is_delayed)::value;
    // Every input but the values themselves is for delayed scaling only (required above).
    auto launch = [&](auto kind) {
      constexpr Fp8CastInput kInput = decltype(kind)::value;
      if constexpr (kDelayed || kInput == Fp8CastInput::kValues) {
        fp8_cast_transpose_kernel<kFormat, kDelayed, kInput>
            <<<grid, kFp8Threads, 0, stream>>>(out, out_t, scale, x, pre_act, col_partials, source, R, C,
                                               ld_t);
      }
    };
    using Input = Fp8CastInput;
    switch (input) {
      case Input::kValues: launch(std::integral_constant<Input, Input::kValues>()); break;
      case Input::kGelu: launch(std::integral_constant<Input, Input::kGelu>()); break;
      case Input::kRelu2: launch(std::integral_constant<Input, Input::kRelu2>()); break;
      case Input::kNorm: launch(std::integral_constant<Input, Input::kNorm>()); break;
      case Input::kTimesGeluGrad: launch(std::integral_constant<Input, Input::kTimesGeluGrad>()); break;
      case Input::kTimesRelu2Grad: launch(std::integral_constant<Input, Input::kTimesRelu2Grad>()); break;
    }
  });
  cudaCheckLaunch();
}

void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, Fp8Scale* scale, const floatX* x, int R,
                        int C, Fp8Format f, bool delayed, cudaStream_t stream) {
  fp8_cast_transpose_launch(out, out_t, scale, x, nullptr, nullptr, R, C, f, delayed, Fp8CastSource(),
                            stream);
}

// source.kind kValues, kGelu, kRelu2 or kNorm: x or what source says of it, cast and transposed as
// by fp8_cast_transpose (with delayed scaling for all but the values).
void fp8_source_cast_transpose(uint8_t* out, uint8_t* out_t, Fp8Scale* scale, const floatX* x,
                               const Fp8CastSource& source, int R, int C, Fp8Format f, bool delayed,
                               cudaStream_t stream) {
  REQUIRE(source.kind != Fp8CastInput::kTimesGeluGrad && source.kind != Fp8CastInput::kTimesRelu2Grad,
          "fp8_source_cast_transpose: an activation's gradient goes through fp8_activation_backward_cast_transpose");
  fp8_cast_transpose_launch(out, out_t, scale, x, nullptr, nullptr, R, C, f, delayed, source, stream);
}

// dx [R, C] * act'(pre_act) (the activation backward's BF16 values, not written), cast and
// transposed as by fp8_cast_transpose in the same pass, with its column sums per tile of 128 rows
// into col_partials [fp8_tile_rows(R), C] (for column_sum_finalize): with delayed scaling only,
// whose scale is known before the product exists.
void fp8_activation_backward_cast_transpose(uint8_t* out, uint8_t* out_t, Fp8Scale* scale, const floatX* dx,
                                            const floatX* pre_act, Activation act, float* col_partials, int R,
                                            int C, Fp8Format f, cudaStream_t stream) {
  const Fp8CastInput input = act == Activation::kGelu ? Fp8CastInput::kTimesGeluGrad : Fp8CastInput::kTimesRelu2Grad;
  fp8_cast_transpose_launch(out, out_t, scale, dx, pre_act, col_partials, R, C, f, true, {input}, stream);
}

// ---- Delayed scaling: the scales of a step from the amaxes of the steps before it ----
// With -fp8 2 the activations' and output gradients' casts use a scale known before the tensor
// exists, s = 2^e from the largest amax of the last kFp8History steps (fp8_scale_exponent), and
// record the tensor's amax as they cast: no separate amax pass. Values beyond what the history
// foresaw saturate at +-fp8_max. After each step, once for all tensors: the step's amax goes into
// the history (slot `slot`, the oldest; 0 for an amax that is not finite) unless the step's update
// was skipped, then s and 1/s are set from the history and the amax restarts at 0. Every operation is an integer
// maximum or a power of two, so the scales are the same bits in any order and on any GPU.
constexpr int kFp8History = 16;
constexpr uint32_t kFp8MaxFiniteBits = 0x7f7fffffu;  // FLT_MAX: |x| bits above it are Inf or NaN

__global__ void fp8_update_scales_kernel(Fp8Scale* scales, uint32_t* history, int count, int slot,
                                         bool record) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  Fp8Scale& sc = scales[i];
  // A non-finite amax on a recorded step (its loss would be NaN, so not seen in training) takes
  // the slot as 0, so that no slot outlives the kFp8History steps.
  if (record) history[(size_t)slot * count + i] = sc.amax_bits <= kFp8MaxFiniteBits ? sc.amax_bits : 0u;
  uint32_t amax = 0;
  for (int k = 0; k < kFp8History; k++) amax = max(amax, history[(size_t)k * count + i]);
  const int e = fp8_scale_exponent_for(__uint_as_float(amax), sc.emax);
  sc.scale = ldexpf(1.0f, e);
  sc.inv_scale = ldexpf(1.0f, -e);
  sc.amax_bits = 0;
}

__global__ void fp8_clear_amax_kernel(Fp8Scale* scales, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) scales[i].amax_bits = 0;
}

void fp8_clear_amax(Fp8Scale* scales, int count, cudaStream_t stream) {
  fp8_clear_amax_kernel<<<ceil_div(count, 256), 256, 0, stream>>>(scales, count);
  cudaCheckLaunch();
}

// history: kFp8History x count amaxes (FP32 bits), zero before the first step.
void fp8_update_scales(Fp8Scale* scales, uint32_t* history, int count, int slot, bool record,
                       cudaStream_t stream) {
  REQUIRE(slot >= 0 && slot < kFp8History, "fp8_update_scales: slot %d of %d", slot, kFp8History);
  fp8_update_scales_kernel<<<ceil_div(count, 256), 256, 0, stream>>>(scales, history, count, slot, record);
  cudaCheckLaunch();
}

// ---- FP8 linear layers: the products of matmul_forward and matmul_backward on FP8 copies ----
// The FP8 copies of a weight [OC, C], cast by fp8_weight_cast after each update: w8 [OC, C] and
// its transpose w8t [C, OC], one scale.
struct Fp8Weight {
  uint8_t* w8;
  uint8_t* w8t;
  Fp8Scale* scale;
};

// Scratch of the FP8 layers, sized for the widest layer of N tokens (in bytes, N padded to
// fp8_padded(N) in the transposed one): rows holds the forward's input [N, C] or the backward's
// output gradient [N, OC], dout_t its transpose [OC, N].
struct Fp8Buffers {
  uint8_t* rows = nullptr;
  uint8_t* dout_t = nullptr;
};

inline MatmulOperands fp8_operands(Fp8Format fa, const Fp8Scale* a, Fp8Format fb, const Fp8Scale* b) {
  MatmulOperands ops;
  ops.type_a = fp8_cuda_type(fa);
  ops.type_b = fp8_cuda_type(fb);
  ops.scale_a = &a->inv_scale;
  ops.scale_b = &b->inv_scale;
  return ops;
}

void fp8_require_layer(int C, int OC) {
  REQUIRE(sizeof(floatX) == 2, "FP8 linear layers need the BF16 build (their outputs are BF16)");
  REQUIRE(C % kFp8TokenAlign == 0 && OC % kFp8TokenAlign == 0,
          "FP8 linear layers: C=%d and OC=%d must be multiples of %d", C, OC, kFp8TokenAlign);
}

// How a layer's input and output-gradient casts scale.
enum class Fp8Scaling {
  kCurrent,         // -fp8 1: from each tensor's own amax, an amax pass before its cast
  kCurrentStepMax,  // -fp8 2's first step: as kCurrent, from the largest amax of the step's micro
                    // steps so far (the step's amax, which the history then records)
  kDelayed,         // -fp8 2: the scale the history set; the cast records the amax
};

void fp8_weight_cast(const Fp8Weight& w, const floatX* weight, int OC, int C, cudaStream_t stream) {
  fp8_require_layer(C, OC);
  fp8_amax(w.scale, weight, (size_t)OC * C, stream);
  fp8_cast_transpose(w.w8, w.w8t, w.scale, weight, OC, C, Fp8Format::kE4M3, false, stream);
}

// matmul_forward with out = fp8(inp) @ w8^T: inp is cast into inp8 for the product and into its
// transpose inp8_t [C, fp8_padded(N)], which the backward pass's weight-gradient product reads (the
// same bytes that pass would cast from inp: one read of inp fewer). Current scaling: inp's amax
// goes into inp_scale first. Delayed: the cast uses inp_scale's s and records the amax. The
// product accumulates fast (MatmulOperands::fast_accum), as the FP8 recipes' forward products do.
// With a source of kind kGelu, kRelu2 or kNorm (delayed scaling only), inp holds the activation's
// or the norm's input, and the layer's input, act(inp) (fcproj) or norm(inp) (qkv, fc), is
// computed in the cast and never written in BF16.
void matmul_forward_fp8(floatX* out, const floatX* inp, const Fp8Weight& w, const floatX* bias,
                        int N, int C, int OC, floatX* pre_gelu, Fp8Scale* inp_scale, uint8_t* inp8,
                        uint8_t* inp8_t, Fp8Scaling scaling, cudaStream_t stream,
                        const Fp8CastSource& source = Fp8CastSource()) {
  fp8_require_layer(C, OC);
  const bool delayed = scaling == Fp8Scaling::kDelayed;
  REQUIRE(delayed || source.kind == Fp8CastInput::kValues,
          "matmul_forward_fp8: an activation or a norm in the input's cast needs delayed scaling");
  if (!delayed) fp8_amax(inp_scale, inp, (size_t)N * C, stream, scaling == Fp8Scaling::kCurrentStepMax);
  fp8_source_cast_transpose(inp8, inp8_t, inp_scale, inp, source, N, C, Fp8Format::kE4M3, delayed, stream);
  MatmulOperands ops = fp8_operands(Fp8Format::kE4M3, w.scale, Fp8Format::kE4M3, inp_scale);
  ops.fast_accum = true;
  matmul_forward_product(out, w.w8, inp8, bias, N, C, OC, pre_gelu, ops, stream);
}

// matmul_backward with FP8 products: dout is cast to grad_format (rows and transposed) with
// dout_scale as `scaling` says; dweight += fp8(dout)^T inp8_t^T over the padded tokens (beta = 1, as
// in BF16), with inp8_t the forward's transposed cast of the input (scale inp_scale), and
// dinp = fp8(dout) w8t^T. dbias is the column sum of the BF16 output gradient, as in
// matmul_backward (partials: max(kRowBlocks, fp8_tile_rows(N)) x OC floats).
// With dout_pre_act, dout holds the gradient of act(dout_pre_act) (the fc layer's output, act
// GELU or ReLU^2), and the layer's output gradient is dout * act'(dout_pre_act). With delayed
// scaling the cast-transpose that reads dout anyway computes it, casts it and sums its columns for
// dbias, and it is never written in BF16; otherwise it is written over dout before the amax. The
// BF16 layers instead apply GELU' in cuBLASLt's DGELU epilogue of fcproj's input gradient; after an
// FP8 product cuBLASLt runs that epilogue as a kernel of its own, one more pass over dout.
void matmul_backward_fp8(floatX* dinp, floatX* dweight, floatX* dbias, float* partials, floatX* dout,
                         const uint8_t* inp8_t, const Fp8Weight& w, const floatX* dout_pre_act, Activation act,
                         Fp8Scale* inp_scale, Fp8Scale* dout_scale, const Fp8Buffers& buffers, int N,
                         int C, int OC, uint32_t seed, Fp8Format grad_format, Fp8Scaling scaling,
                         cudaStream_t stream) {
  fp8_require_layer(C, OC);
  const bool delayed = scaling == Fp8Scaling::kDelayed;
  if (delayed && dout_pre_act) {
    fp8_activation_backward_cast_transpose(buffers.rows, buffers.dout_t, dout_scale, dout, dout_pre_act, act,
                                           partials, N, OC, grad_format, stream);
    if (dbias) column_sum_finalize(dbias, partials, OC, OC, fp8_tile_rows(N), seed, stream);
  } else {
    if (dout_pre_act) activation_backward_inplace(act, dout, dout_pre_act, (size_t)N * OC, stream);
    if (!delayed) fp8_amax(dout_scale, dout, (size_t)N * OC, stream, scaling == Fp8Scaling::kCurrentStepMax);
    fp8_cast_transpose(buffers.rows, buffers.dout_t, dout_scale, dout, N, OC, grad_format, delayed, stream);
    if (dbias) matmul_dbias(dbias, partials, dout, N, OC, seed, stream);
  }
  REQUIRE(matmul_cublaslt(dweight, inp8_t, buffers.dout_t, nullptr, C, OC, fp8_padded(N), true,
                          false, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, nullptr, stream,
                          fp8_operands(Fp8Format::kE4M3, inp_scale, grad_format, dout_scale)),
          "cuBLASLt found no algorithm for the %dx%dx%d FP8 weight-gradient product", C, OC, N);
  // The input gradient's sums run over OC channels, as the forward's over C: fast accumulation
  // there too (the weight gradient's run over every token and keep cuBLASLt's promotions).
  MatmulOperands dinp_ops = fp8_operands(Fp8Format::kE4M3, w.scale, grad_format, dout_scale);
  dinp_ops.fast_accum = true;
  matmul_dinp_product(dinp, w.w8t, true, buffers.rows, nullptr, N, C, OC, dinp_ops, stream);
}

// ---- FP8 with fixed scales: the speedrun head's linear layer (record #28) ----
// out [N, OC] = x [N, C] @ w [OC, C]^T, no bias, its three products in FP8 with scales the recipe
// fixes instead of deriving them from amaxes: x_s = sqrt(C)/448 (x is RMS-normed, so |x| <= sqrt(C)
// and |x| / x_s <= 448), w_s = 2^-9 and grad_s = 1/448 for the output gradient g. As the
// reference's custom op: x8 = e4m3(x / x_s), w8 = e4m3(w / w_s), out = (x8 @ w8^T) x_s w_s in BF16
// with fast accumulation; g8 = e5m2(g / grad_s), grad_x = (g8 @ w8) grad_s w_s in BF16 and
// grad_w = (g8^T @ x8) x_s grad_s in FP32, both with cuBLASLt's promotions (no fast accumulation).
// A fixed scale is an Fp8Scale (fp8_fixed_scale) cast through the delayed-scaling path of the
// cast-transposes above, unchanged: q = fp8(x * scale) rounded to nearest even,
// saturating at +-fp8_max (E4M3 has no infinity; beyond 448 / 57344 a value becomes the largest,
// which the recipe's scales rule out by construction), with 1/x_s etc. as the FP32 factor. The
// reference writes x / x_s, but torch.compile's inductor lowers a division by a constant into a
// product with its reciprocal on CUDA (div_prim), 1/x_s computed in double and rounded once to
// FP32: these bits. (An IEEE division would differ from it by at most one FP32 ulp before the
// FP8 rounding, so only for values within an ulp of a midpoint between two FP8 values.) Each cast
// records max |x| in its scale's amax_bits, an integer maximum kept since the scale was set: with
// amax * scale <= fp8_max nothing saturated.

// A fixed dequantisation scale s: inv_scale = s, the FP32 float cuBLASLt multiplies the products
// by (the reference's scale tensor), and scale = 1/s, computed in double and rounded once, the
// factor the casts multiply by.
Fp8Scale fp8_fixed_scale(double s) {
  Fp8Scale fixed = {};
  fixed.inv_scale = (float)s;
  fixed.scale = (float)(1.0 / s);
  return fixed;
}

// x [R, C] cast to f under a fixed scale into out [R, C] (optional) and out_t [C, fp8_padded(R)]
// (zeros past R): fp8_cast_transpose with the scale given, which records max |x| in amax_bits.
void fp8_fixed_cast_transpose(uint8_t* out, uint8_t* out_t, Fp8Scale* fixed, const floatX* x, int R, int C,
                              Fp8Format f, cudaStream_t stream) {
  fp8_cast_transpose(out, out_t, fixed, x, R, C, f, true, stream);
}

// The head's weight [OC, C] cast under its fixed scale w.scale (fp8_fixed_scale(w_s)) into w.w8
// and w.w8t, once per update (the reference casts it in each forward: the same bits).
void fp8_fixed_weight_cast(const Fp8Weight& w, const floatX* weight, int OC, int C, cudaStream_t stream) {
  fp8_require_layer(C, OC);
  fp8_fixed_cast_transpose(w.w8, w.w8t, w.scale, weight, OC, C, Fp8Format::kE4M3, stream);
}

// out [N, OC] (BF16) = e4m3(inp) @ w8^T under the fixed scales inp_scale and w.scale, with fast
// accumulation, as the reference's forward. inp [N, C] is cast into inp8 [N, C] for the product
// and into inp8_t [C, fp8_padded(N)], which matmul_backward_fp8_fixed reads.
void matmul_forward_fp8_fixed(floatX* out, const floatX* inp, const Fp8Weight& w, int N, int C, int OC,
                              Fp8Scale* inp_scale, uint8_t* inp8, uint8_t* inp8_t, cudaStream_t stream) {
  fp8_require_layer(C, OC);
  fp8_fixed_cast_transpose(inp8, inp8_t, inp_scale, inp, N, C, Fp8Format::kE4M3, stream);
  MatmulOperands ops = fp8_operands(Fp8Format::kE4M3, w.scale, Fp8Format::kE4M3, inp_scale);
  ops.fast_accum = true;
  matmul_forward_product(out, w.w8, inp8, nullptr, N, C, OC, nullptr, ops, stream);
}

// dst [n] += src [n] (FP32), rounded stochastically (round_stochastic: the bits of a seed).
__global__ void add_fp32_inplace_kernel(floatX* dst, const float* src, size_t n, uint32_t seed) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= n) return;
  const x128 a = load128(dst + i);
  x128 out;
  for (int k = 0; k < x128::size; k++) out[k] = round_stochastic((float)a[k] + src[i + k], seed, i + k);
  store128(dst + i, out);
}

// ---- FP8 transpose: rows [R, C] of bytes -> out_t [C, fp8_padded(R)], zeros past R ----
// For the head's gradient, which the classifier casts itself (ClassifierFp8Grad). A block takes a
// tile of 128 rows x 128 columns as 4 x 4 blocks of bytes: each thread loads 4 words of 4 rows
// (a warp one 128-byte line a row), transposes each 4 x 4 block in registers (byte permutes),
// and stores its 4 words into the tile's transposed columns in shared memory, a column 32 words
// (the tile's 128 rows); then each warp writes 128-byte rows of out_t, a word a lane. Word bi of
// column c is kept at bi ^ (c / 4): a warp's stores (one bi, c / 4 its lane) and its loads (one c,
// bi its lane) both fall in 32 distinct banks. Floor: reads and writes each byte once. (Bytes put
// down the columns one at a time, with a 16-byte piece's bytes in local memory, ran at 66% of
// the DRAM's throughput with the L2 97% busy.)
constexpr int kFp8TransposeCols = 128, kFp8TransposeWords = kFp8TileRows / 4;  // a tile column's words
constexpr int kFp8TransposeWarps = kFp8Threads / WARP_SIZE;

// A 4 x 4 block of bytes transposed: a[r] holds row r's 4 bytes (byte k of a[r] is column k); word k
// of the result holds column k's 4 bytes (byte r from row r).
__device__ __forceinline__ void transpose_4x4_bytes(uint32_t (&a)[4]) {
  const uint32_t lo01 = __byte_perm(a[0], a[1], 0x5140), hi01 = __byte_perm(a[0], a[1], 0x7362);
  const uint32_t lo23 = __byte_perm(a[2], a[3], 0x5140), hi23 = __byte_perm(a[2], a[3], 0x7362);
  a[0] = __byte_perm(lo01, lo23, 0x5410);
  a[1] = __byte_perm(lo01, lo23, 0x7632);
  a[2] = __byte_perm(hi01, hi23, 0x5410);
  a[3] = __byte_perm(hi01, hi23, 0x7632);
}

__global__ void __launch_bounds__(kFp8Threads)
    fp8_transpose_kernel(uint8_t* out_t, const uint8_t* rows, int R, int C, int ld_t) {
  __shared__ uint32_t tile[kFp8TransposeCols * kFp8TransposeWords];
  constexpr int kBlocksPerThread = kFp8TransposeWords / kFp8TransposeWarps;  // row groups of 4 a warp
  static_assert(kFp8TransposeCols == 4 * WARP_SIZE && kBlocksPerThread * kFp8TransposeWarps == kFp8TransposeWords,
                "a warp's lanes take a tile row's 128 bytes, the warps all of its row groups");
  const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
  const int row0 = blockIdx.y * kFp8TileRows, col0 = blockIdx.x * kFp8TransposeCols;
  const int col = col0 + 4 * lane;
  uint32_t words[kBlocksPerThread][4];
#pragma unroll
  for (int b = 0; b < kBlocksPerThread; b++) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int row = row0 + 4 * (warp * kBlocksPerThread + b) + r;
      words[b][r] = row < R && col < C ? *reinterpret_cast<const uint32_t*>(rows + (size_t)row * C + col) : 0u;
    }
  }
#pragma unroll
  for (int b = 0; b < kBlocksPerThread; b++) {
    const int bi = warp * kBlocksPerThread + b;
    transpose_4x4_bytes(words[b]);
#pragma unroll
    for (int k = 0; k < 4; k++) tile[(4 * lane + k) * kFp8TransposeWords + (bi ^ lane)] = words[b][k];
  }
  __syncthreads();
  const int trow = row0 + 4 * lane;  // ld_t is a multiple of 16: a word is inside it or past it
  for (int c = warp; c < kFp8TransposeCols; c += kFp8TransposeWarps) {
    if (col0 + c >= C || trow >= ld_t) continue;
    *reinterpret_cast<uint32_t*>(out_t + (size_t)(col0 + c) * ld_t + trow) =
        tile[c * kFp8TransposeWords + (lane ^ (c / 4))];
  }
}

void fp8_transpose(uint8_t* out_t, const uint8_t* rows, int R, int C, cudaStream_t stream) {
  REQUIRE(C % kFp8TokenAlign == 0 && (uintptr_t)rows % 16 == 0 && (uintptr_t)out_t % 16 == 0,
          "fp8_transpose: C=%d must be a multiple of %d, rows and out_t 16-byte aligned", C, kFp8TokenAlign);
  const int ld_t = fp8_padded(R);
  const dim3 grid(ceil_div(C, kFp8TransposeCols), ceil_div(ld_t, kFp8TileRows));
  REQUIRE(grid.y <= 65535, "fp8_transpose: R=%d rows are more than one launch takes", R);
  fp8_transpose_kernel<<<grid, kFp8Threads, 0, stream>>>(out_t, rows, R, C, ld_t);
  cudaCheckLaunch();
}

// The head's backward, buffers.rows [N, OC] holding e5m2(dout) under the fixed scale dout_scale,
// dout being the BF16 gradient of out (the classifier casts it: ClassifierFp8Grad): its transpose
// goes into buffers.dout_t [OC, fp8_padded(N)]; dinp [N, C] = e5m2(dout) @ w8 (BF16); dweight
// [OC, C] += e5m2(dout)^T @ inp8 over the padded tokens, inp8_t being the forward's transposed cast
// under inp_scale. The weight gradient's product is FP32, as the reference's: it goes into
// dweight_fp32 [OC, C] (scratch, beta = 0), then into the BF16 gradient with one stochastic
// rounding (seed), as the other FP32 sums enter the BF16 parameter gradients (sections 2 and 3):
// an unbiased rounding of each micro step's contribution, where cuBLASLt's beta = 1 into BF16
// would round it to nearest. Deterministic: the products use no atomics, and the rounding's
// random bits are a hash of (seed, index).
void matmul_backward_fp8_fixed(floatX* dinp, floatX* dweight, float* dweight_fp32, const uint8_t* inp8_t,
                               const Fp8Weight& w, Fp8Scale* inp_scale, Fp8Scale* dout_scale,
                               const Fp8Buffers& buffers, int N, int C, int OC, uint32_t seed, cudaStream_t stream) {
  fp8_require_layer(C, OC);
  fp8_transpose(buffers.dout_t, buffers.rows, N, OC, stream);
  MatmulOperands dweight_ops = fp8_operands(Fp8Format::kE4M3, inp_scale, Fp8Format::kE5M2, dout_scale);
  dweight_ops.type_d = CUDA_R_32F;
  REQUIRE(matmul_cublaslt(dweight_fp32, inp8_t, buffers.dout_t, nullptr, C, OC, fp8_padded(N), true, false,
                          0.0f, CUBLASLT_EPILOGUE_DEFAULT, nullptr, stream, dweight_ops),
          "cuBLASLt found no algorithm for the %dx%dx%d FP8 weight-gradient product (FP32 output)", C, OC, N);
  const size_t n = (size_t)OC * C;
  add_fp32_inplace_kernel<<<ceil_div(n / x128::size, 256), 256, 0, stream>>>(dweight, dweight_fp32, n, seed);
  cudaCheckLaunch();
  matmul_dinp_product(dinp, w.w8t, true, buffers.rows, nullptr, N, C, OC,
                      fp8_operands(Fp8Format::kE4M3, w.scale, Fp8Format::kE5M2, dout_scale), stream);
}

// The recipe's scales (llmc::Fp8HeadScales, -fhs) as values: x_s, w_s and grad_s.
struct Fp8HeadScaleValues {
  double input, weight, grad;
};
inline Fp8HeadScaleValues fp8_head_scale_values(const llmc::Fp8HeadScales& s, int C) {
  return {(s.input == 0.0 ? std::sqrt((double)C) : s.input) / 448.0, s.weight / 448.0, s.grad / 448.0};
}

// The factor of the head weight's cast, 1 / w_s rounded once to FP32.
inline float fp8_head_weight_factor(const llmc::Fp8HeadScales& s) {
  return fp8_fixed_scale(fp8_head_scale_values(s, 0).weight).scale;
}

// The head's BF16 copy, b, of its master weight u (BF16 builds), made so that the E4M3 cast of
// b / w_s (fp8_fixed_weight_cast, once per update; to_fp8 = 1 / w_s, fp8_head_weight_factor) gives
// the bits of u / w_s cast as the reference casts its FP32 weight. Where rounding u to BF16 crosses
// a midpoint between two E4M3 values (or lands on one, which at w_s = 2^-9 is a BF16 number, and
// E4M3's ties-to-even can take the other side than u's), the cast is one E4M3 unit (12.5%) off;
// then b moves one BF16 unit towards u, to u's side (E4M3's midpoints are at least 14 BF16 units
// apart at any scale, so no other lies between). Everywhere else b is as rounded. With b rounded stochastically some 3% of the weights' casts had gone the other way,
// and every gradient the head sends into the blocks had twice PyTorch's error
// (dev/notes/speedrun-correctness.md).
__host__ __device__ inline floatX fp8_head_weight_copy(floatX b, float u, float to_fp8) {
#if defined(ENABLE_FP32)
  return b;
#else
  const __nv_fp8_storage_t cast = __nv_cvt_float_to_fp8((float)b * to_fp8, __NV_SATFINITE, __NV_E4M3);
  if (cast == __nv_cvt_float_to_fp8(u * to_fp8, __NV_SATFINITE, __NV_E4M3)) return b;
  __nv_bfloat16_raw raw = b;
  const bool larger = u > (float)b, positive = (raw.x & 0x8000u) == 0;  // b is not 0: its cast is u's
  raw.x = (unsigned short)(larger == positive ? raw.x + 1 : raw.x - 1);
  return floatX(raw);
#endif
}

// Whether the layer fits an architecture's head: x_s bounds the output of a weightless RMS norm
// (|x| <= sqrt(C)), and the layer has no bias. Of the architectures, the speedrun's.
bool fp8_head_support(const llmc::ArchSpec& a) {
  return !a.tied_head && !a.biases && a.rms_norm && !a.norm_gains;
}

// ---- Record #89's FP8 MLP (-fm 1): a training forward's two MLP products in E4M3 ----
// The reference (train_gpt.py: quantize_mlp_fp8 and the MLP's forward; triton_kernels.py:
// linear_relu_square and the down weight's cast) scales each tensor by a float of its own, not a
// power of two, and rounds as its own code does: each step below names the rounding it copies.
// Evaluation and the backward pass stay BF16, the backward from ReLU^2's BF16 output (-mr 1).
// - After each update (and before the first step), layer l's up weight W1 [4C, C] gets
//   s1 = bf16(bf16(max(amax |W1|, 1e-12)) * (1 / 448)) (eager BF16 ops; torch divides by a host
//   scalar as a product with its FP32 reciprocal) and W1_8 = e4m3(bf16(W1 / s1)) (an IEEE division,
//   rounded to BF16, then to E4M3). Its down weight W2 (ours [C, 4C], the reference's [4C, C]
//   transposed: the same values) is cast under s2, W2_8 = e4m3(clamp(W2 / s2, +-448)) (Triton's
//   division, div.full.f32); s2 is the last cast's amax |W2| times 1.12 / 448, delayed, except in the
//   forwards of the first 17 steps, which take W2's own bf16 scale as s1's (the reference's bootstrap).
// - A training forward of layer l casts the norm's output x [N, C] under its own amax:
//   x_8 = e4m3(x * (448 / amax_x)) (Inductor's code: 1 / amax_x by div.full.f32, times 448, the
//   product in FP32, no BF16 rounding between), then pre = bf16((x_8 W1_8^T) d) with d = s1 amax_x / 448 (cuBLASLt's FP32 scale),
//   post = bf16(relu(pre)^2) (fch_act, which the backward reads), post_8 = e4m3(min(post (1 / a),
//   448)) under the layer's activation scale a (1 / a by div.full.f32, as the reference's Triton
//   kernel), and the MLP's output bf16((post_8 W2_8^T) a s2); both products accumulate fast (the
//   reference's Triton dot, and its _scaled_mm with use_fast_accum).
// - After the training forward, a = max(amax |post|, 1e-12) * (1.8 / 448) for the next one (1 before
//   the first): the reference's delayed activation scale.
// The E4M3 casts round to nearest even and saturate at +-448 (cvt.rn.satfinite, the instruction
// Triton's and Inductor's casts compile to); amaxes are integer maxima of FP32 bits (fp8_amax), so
// the same in any order. Floors: the weight casts read 2 and write 1 byte a value; a forward's casts
// read x once more (amax, cast) and post's pre once (written as post and post_8).
constexpr int kFp8MlpBootstrapSteps = 16;         // steps 0..15's updates take W2's own scale
constexpr double kFp8MlpDownHeadroom = 1.12;      // W2's delayed scale: amax times this / 448
constexpr double kFp8MlpActivationHeadroom = 1.8; // post's delayed scale
constexpr float kFp8MlpMinAmax = 1e-12f;

// The scales of one layer's FP8 MLP, each an Fp8Scale for cuBLASLt's 16-byte aligned pointers:
// input: amax_bits of x, inv_scale d (the up product's scale); act: inv_scale a, amax_bits of
// post in this forward; w1: inv_scale s1, amax_bits of W1; w2: inv_scale s2 (this cast's),
// scale the next cast's (delayed), amax_bits of W2.
struct Fp8MlpScales {
  Fp8Scale input, act, w1, w2;
};

// a / b as Triton's FP32 `/` compiles it (div.full.f32: within 2 ulps of the rounded quotient).
__device__ __forceinline__ float div_full(float a, float b) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}

// E4M3 of x, rounded to nearest even, saturating (cvt.rn.satfinite.e4m3x2).
__device__ __forceinline__ uint8_t e4m3_satfinite(float x) {
  return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// bf16(bf16(max(amax, 1e-12)) * (1 / 448)): a BF16 weight's scale as the reference's eager ops
// compute it, amax being a BF16 value.
__host__ __device__ inline float fp8_mlp_weight_scale(float amax) {
  const float clamped = (float)(floatX)(amax > kFp8MlpMinAmax ? amax : kFp8MlpMinAmax);
  return (float)(floatX)(clamped * (1.0f / 448.0f));
}

// One thread a layer, after the weights' amaxes: s1; s2 (bootstrap: W2's own scale, else the
// delayed one) and the next cast's from this W2's amax.
__global__ void fp8_mlp_weight_scales_kernel(Fp8MlpScales* scales, int layers, bool bootstrap) {
  const int l = blockIdx.x * blockDim.x + threadIdx.x;
  if (l >= layers) return;
  Fp8MlpScales& s = scales[l];
  s.w1.inv_scale = fp8_mlp_weight_scale(__uint_as_float(s.w1.amax_bits));
  const float w2_amax = __uint_as_float(s.w2.amax_bits);
  s.w2.inv_scale = bootstrap ? fp8_mlp_weight_scale(w2_amax) : s.w2.scale;
  s.w2.scale = fmaxf(w2_amax, kFp8MlpMinAmax) * (float)(kFp8MlpDownHeadroom / 448.0);
}

// out [n] = the E4M3 cast of a layer's weight w [n] under its scales s: kUp, W1's e4m3(bf16(w / s1));
// else W2's e4m3(clamp(w / s2, +-448)) with Triton's division.
template <bool kUp>
__global__ void fp8_mlp_weight_cast_kernel(uint8_t* out, const floatX* w, const Fp8MlpScales* scales, size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= n) return;
  const Fp8MlpScales& s = *scales;
  const x128 v = load128(w + i);
  Fp8Piece q;
  for (int k = 0; k < x128::size; k++) {
    const float x = (float)v[k];
    q.v[k] = kUp ? e4m3_satfinite((float)(floatX)__fdiv_rn(x, s.w1.inv_scale))
                 : e4m3_satfinite(fminf(fmaxf(div_full(x, s.w2.inv_scale), -448.0f), 448.0f));
  }
  *reinterpret_cast<Fp8Piece*>(out + i) = q;
}

// x_8 = e4m3(x * (448 / amax_x)), and (the grid's first thread) d = s1 amax_x / 448 into
// input.inv_scale, as Inductor's code computes them: 448 / amax_x as the reciprocal (Triton's
// division) times 448, and the division of s1 amax_x by the constant as a product with 1 / 448
// rounded once to FP32.
__global__ void fp8_mlp_input_cast_kernel(uint8_t* out, const floatX* x, Fp8MlpScales* scales, size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  const float amax = fmaxf(__uint_as_float(scales->input.amax_bits), kFp8MlpMinAmax);
  if (i == 0) scales->input.inv_scale = (scales->w1.inv_scale * amax) * (float)(1.0 / 448.0);
  if (i >= n) return;
  const float factor = div_full(1.0f, amax) * 448.0f;
  const x128 v = load128(x + i);
  Fp8Piece q;
  for (int k = 0; k < x128::size; k++) q.v[k] = e4m3_satfinite((float)v[k] * factor);
  *reinterpret_cast<Fp8Piece*>(out + i) = q;
}

// post = bf16(relu(pre)^2), post_8 = e4m3(min(post (1 / a), 448)), and max post into act.amax_bits
// (an integer atomicMax: exact in any order). A fixed grid strides over the pieces.
__global__ void __launch_bounds__(kFp8Threads)
    fp8_mlp_relu2_cast_kernel(floatX* post, uint8_t* post8, const floatX* pre, Fp8MlpScales* scales, size_t pieces) {
  const float inverse = div_full(1.0f, scales->act.inv_scale);
  uint32_t m = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < pieces; p += stride) {
    const size_t i = p * x128::size;
    const x128 v = load128(pre + i);
    x128 out;
    Fp8Piece q;
    for (int k = 0; k < x128::size; k++) {
      out[k] = (floatX)relu2((float)v[k]);
      q.v[k] = e4m3_satfinite(fminf((float)out[k] * inverse, 448.0f));
    }
    m = fp8_piece_amax(m, out);
    store128(post + i, out);
    *reinterpret_cast<Fp8Piece*>(post8 + i) = q;
  }
  fp8_block_amax(m, &scales->act.amax_bits);
}

// After a training forward, one thread a layer: a = max(amax |post|, 1e-12) * (1.8 / 448), the
// amax cleared for the next forward.
__global__ void fp8_mlp_activation_scales_kernel(Fp8MlpScales* scales, int layers) {
  const int l = blockIdx.x * blockDim.x + threadIdx.x;
  if (l >= layers) return;
  Fp8Scale& act = scales[l].act;
  act.inv_scale = fmaxf(__uint_as_float(act.amax_bits), kFp8MlpMinAmax) * (float)(kFp8MlpActivationHeadroom / 448.0);
  act.amax_bits = 0;
}

// The FP8 MLP's device state (gpt2_allocate_fp8_mlp): the weights' casts, every layer's scales and a
// unit scale (the up product's weight side: d carries s1), and the forward's scratch: pre [N, 4C]
// (BF16) and the casts x_8 [N, C] and post_8 [N, 4C].
struct Fp8Mlp {
  uint8_t* w1 = nullptr;  // [L, 4C, C]
  uint8_t* w2 = nullptr;  // [L, C, 4C]
  Fp8MlpScales* scales = nullptr;  // [L]
  Fp8Scale* unit = nullptr;
  floatX* pre = nullptr;
  uint8_t* x8 = nullptr;
  uint8_t* post8 = nullptr;
};

// Every layer's weight casts and their scales, from layer l's up weight w1[l] [4C, C] and down
// weight w2[l] [C, 4C] (C channels); bootstrap: each W2 cast under its own scale.
void fp8_mlp_cast_weights(const Fp8Mlp& f, const std::vector<const floatX*>& w1, const std::vector<const floatX*>& w2,
                          int C, bool bootstrap, cudaStream_t stream) {
  const int L = (int)w1.size();
  const size_t n = (size_t)4 * C * C;
  REQUIRE(w2.size() == w1.size() && C % x128::size == 0, "fp8_mlp_cast_weights: %zu and %zu layers, C=%d",
          w1.size(), w2.size(), C);
  for (int l = 0; l < L; l++) {
    fp8_amax(&f.scales[l].w1, w1[l], n, stream);
    fp8_amax(&f.scales[l].w2, w2[l], n, stream);
  }
  fp8_mlp_weight_scales_kernel<<<1, L, 0, stream>>>(f.scales, L, bootstrap);
  cudaCheckLaunch();
  const int blocks = ceil_div(n / x128::size, kFp8Threads);
  for (int l = 0; l < L; l++) {
    fp8_mlp_weight_cast_kernel<true><<<blocks, kFp8Threads, 0, stream>>>(f.w1 + l * n, w1[l], f.scales + l, n);
    cudaCheckLaunch();
    fp8_mlp_weight_cast_kernel<false><<<blocks, kFp8Threads, 0, stream>>>(f.w2 + l * n, w2[l], f.scales + l, n);
    cudaCheckLaunch();
  }
}

// Layer l's MLP in a training forward: out [N, C] from the norm's output x [N, C], post [N, 4C]
// (ReLU^2's output, for the backward) on the way.
void fp8_mlp_forward(const Fp8Mlp& f, floatX* out, floatX* post, const floatX* x, int l, int N, int C,
                     cudaStream_t stream) {
  fp8_require_layer(C, 4 * C);
  Fp8MlpScales* s = f.scales + l;
  const size_t nx = (size_t)N * C, nh = 4 * nx, wn = (size_t)4 * C * C;
  fp8_amax(&s->input, x, nx, stream);
  fp8_mlp_input_cast_kernel<<<ceil_div(nx / x128::size, kFp8Threads), kFp8Threads, 0, stream>>>(f.x8, x, s,
                                                                                                        nx);
  cudaCheckLaunch();
  MatmulOperands up = fp8_operands(Fp8Format::kE4M3, f.unit, Fp8Format::kE4M3, &s->input);
  up.fast_accum = true;
  matmul_forward_product(f.pre, f.w1 + l * wn, f.x8, nullptr, N, C, 4 * C, nullptr, up, stream);
  const size_t pieces = nh / x128::size;
  const int blocks = std::max(1, std::min(kFp8AmaxBlocks, ceil_div(pieces, kFp8Threads)));
  fp8_mlp_relu2_cast_kernel<<<blocks, kFp8Threads, 0, stream>>>(post, f.post8, f.pre, s, pieces);
  cudaCheckLaunch();
  MatmulOperands down = fp8_operands(Fp8Format::kE4M3, &s->w2, Fp8Format::kE4M3, &s->act);
  down.fast_accum = true;
  matmul_forward_product(out, f.w2 + l * wn, f.post8, nullptr, N, 4 * C, C, nullptr, down, stream);
}

// After a training forward of L layers: the next forward's activation scales.
void fp8_mlp_end_forward(const Fp8Mlp& f, int L, cudaStream_t stream) {
  fp8_mlp_activation_scales_kernel<<<1, L, 0, stream>>>(f.scales, L);
  cudaCheckLaunch();
}

// ---- Record #89's attention lambdas (ArchSpec::attn_lambdas) ----
// Each attention layer's qkv and output projections read their weight W scaled by the layer's
// lambda s: attention_lambda_scale writes W' = s W rounded once to the storage type (the reference's
// FP32 scalar times a BF16 matrix, which torch computes as bf16(bf16(s) W); our s is a BF16
// parameter). The products' weight gradient is then dW', summed over the micro steps (s is constant
// within a step); attention_lambda_backward turns it into dW = s dW' in place and ds = sum(dW' W)
// in fixed row blocks (section 2's scalar sums). Floor: one read and one write of W (forward), two
// reads and one write (backward).

// out[i] = round(s * w[i]) (to nearest), s = *lambda; n a multiple of 8.
__global__ void attention_lambda_scale_kernel(floatX* out, const floatX* w, const floatX* lambda, size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= n) return;
  const float s = (float)*lambda;
  const x128 v = load128cs(w + i);
  x128 scaled;
  for (int k = 0; k < x128::size; k++) scaled[k] = (floatX)(s * (float)v[k]);
  store128(out + i, scaled);
}

void attention_lambda_scale(floatX* out, const floatX* w, const floatX* lambda, size_t n, cudaStream_t stream) {
  REQUIRE(n % x128::size == 0, "attention_lambda_scale: n=%zu must be a multiple of %d", n, x128::size);
  attention_lambda_scale_kernel<<<ceil_div(n / x128::size, 256), 256, 0, stream>>>(out, w, lambda, n);
  cudaCheckLaunch();
}

// From dweight = dW' (in place) and w = W, a matrix of n values seen as kRowBlocks row blocks of
// its rows of `cols`: dweight[i] = round(s dW'[i]) stochastically (index i), and each row block's
// sum of dW'[i] W[i] (each thread's 16-byte pieces in order, then block_reduce_sum's tree) into
// partials[blockIdx.x].
__global__ void attention_lambda_backward_kernel(floatX* dweight, float* partials, const floatX* w,
                                                 const floatX* lambda, int rows, int cols, uint32_t seed) {
  const RowBlockRange range = row_block_range(rows, cols);
  const float s = (float)*lambda;
  float sums[1] = {0.0f};
  for (size_t i = range.begin + (size_t)threadIdx.x * x128::size; i < range.end; i += blockDim.x * x128::size) {
    const x128 d = load128(dweight + i), v = load128cs(w + i);
    x128 out;
    for (int k = 0; k < x128::size; k++) {
      sums[0] += (float)d[k] * (float)v[k];
      out[k] = round_stochastic(s * (float)d[k], seed, i + k);
    }
    store128(dweight + i, out);
  }
  row_block_sums_store(partials, sums);
}

// The gradients of W' = s W: dweight (dW' on entry) becomes s dW', and dlambda += sum(dW' W) in
// FP32 (row blocks, then column_sum_finalize: fixed order), rounded once. cols a multiple of 8.
void attention_lambda_backward(floatX* dweight, floatX* dlambda, float* partials, const floatX* w,
                               const floatX* lambda, int rows, int cols, uint32_t seed, uint32_t seed_lambda,
                               cudaStream_t stream) {
  REQUIRE(cols % x128::size == 0, "attention_lambda_backward: %d columns, not a multiple of %d", cols, x128::size);
  attention_lambda_backward_kernel<<<kRowBlocks, 256, 0, stream>>>(dweight, partials, w, lambda, rows, cols, seed);
  cudaCheckLaunch();
  column_sum_finalize(dlambda, partials, 1, 1, kRowBlocks, seed_lambda, stream);
}

// ============================================================================
// 6. Attention
// ============================================================================
// ---- QK-norm and rotary positions (the modern architecture), in place on qkv [B, T, 3C] ----
// Each head's q and k of each token (q in columns [0, C), k in [C, 2C), head h at h*HS; v is left
// alone) gets a weightless RMS norm, xhat = x * rstd with rstd = rsqrt(mean(x^2) + FLT_EPSILON)
// (F.rms_norm's default eps), then the half-truncated rotary of its position t: the pair
// (j, j + HS/2) turns by theta = t * freq[j], freq[j] = (1/1024)^(j / (HS/4 - 1)) for j < HS/4
// and 0 above (a quarter of the pairs pass unrotated); the result is rounded once to floatX. Record
// #89's layout (-rp 1, RotaryFrequencies::adjacent_pairs): pair j is (2j, 2j + 1), so dims HS/2 to
// HS - 1 pass unrotated, and t is the token's place in the forward's rows as one sequence; YaRN
// rescales freq (the model's, passed in).
// rstd [B*T, 2*NH] (q heads, then k heads) is kept for the backward, which recovers xhat from the
// stored output by the inverse rotation (R^T, over c^2 + s^2 with BF16 tables) instead of keeping a
// copy.
// One warp per token, each lane holding pairs j = lane + 32i of a head in registers and forming
// their (cos, sin) itself, once for the token's 2*NH heads (rotary_cos_sin; record #89's rounded to
// BF16 as its tables), so no [T, HS/2] table is stored or read. freq is
// computed on the host in double precision and rounded once. A lane loads a group of heads before
// it uses any (several hundred bytes a warp in flight: the kernels are bound by memory latency
// otherwise); each head's sums in lane order, then a fixed butterfly: deterministic. The sum of
// squares' multiply-add is written out: which square the compiler fuses changes an FP32 build's
// bits (a BF16 value's square is exact). Floor: the forward reads and writes 2C values a token
// (2 * 2C * sizeof(floatX) bytes) and writes 2*NH floats; the backward reads 4C values and 2*NH
// floats and writes 2C; about 10 FLOPs a value, so memory-bound.

constexpr int kQkNormMaxHeadSize = 256;
constexpr int kQkNormWarps = 4;  // tokens a block

// The rotary frequencies freq[p] of pair p < HS/2 and the pairs' layout: a kernel argument
// (__grid_constant__, read in place, not copied per thread). adjacent_pairs: pair p is dims (2p,
// 2p + 1) (record #89's layout, -rp 1) instead of (p, p + HS/2); flat_positions: a token's position
// is its place in the forward's B x T rows as one sequence (b T + t, record #89's, which runs one row
// of all the tokens) instead of t within its row. The frequencies are model state: YaRN rescales them.
// paired_heads: record #89's paired heads (a layer's switch, LayerSpec::paired): head h of the token at
// position t is rotated at 2t + (h & 1), the reference's paired tables.
struct RotaryFrequencies {
  float freq[kQkNormMaxHeadSize / 2];
  bool adjacent_pairs;
  bool flat_positions;
  bool bf16_tables;  // each (cos, sin) rounded to BF16, as record #89's tables hold them
  bool paired_heads;
  // The dims of pair p of a head: its first, and its partner.
  __host__ __device__ int first(int p) const { return adjacent_pairs ? 2 * p : p; }
  __host__ __device__ int second(int p, int HS) const { return adjacent_pairs ? 2 * p + 1 : p + HS / 2; }
  // The position of row b's token t of a forward's rows of T.
  __host__ __device__ int position(int b, int t, int T) const { return flat_positions ? b * T + t : t; }
  // The position head h of a token at position t is rotated at.
  __host__ __device__ int head_position(int t, int h) const { return paired_heads ? 2 * t + (h & 1) : t; }
};

// The base frequencies (1/1024)^(p / (HS/4 - 1)) of the first HS/4 pairs, 0 above; adjacent_pairs:
// record #89's layout (each of RotaryFrequencies's switches).
RotaryFrequencies rotary_frequencies(int HS, bool adjacent_pairs = false) {
  RotaryFrequencies f = {};
  const int rotated = HS / 4;
  for (int j = 0; j < rotated; j++) f.freq[j] = (float)std::pow(1.0 / 1024.0, (double)j / (rotated - 1));
  f.adjacent_pairs = adjacent_pairs;
  f.flat_positions = adjacent_pairs;
  f.bf16_tables = adjacent_pairs;
  return f;
}

// Pair p's (cos, sin) of theta = t freq[p] (t: its position): sincosf, accurate as torch's cos and sin,
// of theta in FP32 as torch.outer(pos, freq); with bf16_tables each rounded to BF16 (record #89 builds
// its tables so in every build; the products that read them stay FP32).
__device__ __forceinline__ void rotary_cos_sin(const RotaryFrequencies& f, int t, int p, float* c, float* s) {
  sincosf((float)t * f.freq[p], s, c);
  if (f.bf16_tables) {
    *c = __bfloat162float(__float2bfloat16_rn(*c));
    *s = __bfloat162float(__float2bfloat16_rn(*s));
  }
}

// The backward's dx = rstd R^T (dy - y mean), mean = mean(dy . y) = mean(dxhat . xhat), takes the
// normalised input xhat back from the stored y as R^T y, exact while R is a rotation; with BF16
// tables R R^T = (c^2 + s^2) I, so the pair's xhat term is mean / (c^2 + s^2).
__device__ __forceinline__ float rotary_unscaled_mean(const RotaryFrequencies& f, float mean, float c, float s) {
  return f.bf16_tables ? mean / __fmaf_rn(s, s, c * c) : mean;
}

// A lane's pairs p = lane + 32i (i < PAIRS = ceil(HS / 64)) of each head, with their cos and sin for
// the even heads and the odd ones (cos_j[h & 1]: the same but with paired heads); kHeads heads are
// loaded at once, an even number, so that a group's h-th head has h's parity.
template <int PAIRS>
struct QkNormLane {
  static constexpr int kHeads = 8 / PAIRS;
  static_assert(kHeads % 2 == 0, "a group of heads starts at an even head");
  float cos_j[2][PAIRS], sin_j[2][PAIRS];
  int id, half;
  bool adjacent;

  // cos and sin of theta = t' * freq[p] for the lane's pairs (1 and 0 past HS/2, unused), t' the
  // position of a head of a token at t (RotaryFrequencies::head_position) of each parity.
  __device__ QkNormLane(const RotaryFrequencies& f, int t, int HS)
      : id(threadIdx.x % WARP_SIZE), half(HS / 2), adjacent(f.adjacent_pairs) {
#pragma unroll
    for (int parity = 0; parity < 2; parity++) {
#pragma unroll
      for (int i = 0; i < PAIRS; i++) {
        cos_j[parity][i] = 1.0f;
        sin_j[parity][i] = 0.0f;
        if (parity == 1 && !f.paired_heads) {
          cos_j[1][i] = cos_j[0][i];
          sin_j[1][i] = sin_j[0][i];
        } else if (pair(i) < half) {
          rotary_cos_sin(f, f.head_position(t, parity), pair(i), &cos_j[parity][i], &sin_j[parity][i]);
        }
      }
    }
  }
  __device__ int pair(int i) const { return id + i * WARP_SIZE; }
  // The columns of pair i within a head (RotaryFrequencies::first and second).
  __device__ int first(int i) const { return adjacent ? 2 * pair(i) : pair(i); }
  __device__ int second(int i) const { return adjacent ? 2 * pair(i) + 1 : pair(i) + half; }
  // The two dims of the lane's pairs of head `head` of a row (0 where the pair is past HS/2, or
  // where the head is past the row's `heads`).
  __device__ void load(float (&x1)[PAIRS], float (&x2)[PAIRS], const floatX* row, int head, int heads,
                       int HS) const {
#pragma unroll
    for (int i = 0; i < PAIRS; i++) {
      const bool in = head < heads && pair(i) < half;
      x1[i] = in ? (float)row[head * HS + first(i)] : 0.0f;
      x2[i] = in ? (float)row[head * HS + second(i)] : 0.0f;
    }
  }
};

template <int PAIRS>
__global__ void qk_norm_rotary_forward_kernel(floatX* qkv, float* qk_rstd, int N, int T, int NH, int HS,
                                              int first_position, const __grid_constant__ RotaryFrequencies f) {
  using Lane = QkNormLane<PAIRS>;
  const int token = blockIdx.x * kQkNormWarps + threadIdx.x / WARP_SIZE;
  if (token >= N) return;
  const Lane lane(f, first_position + f.position(token / T, token % T, T), HS);
  floatX* row = qkv + (size_t)token * 3 * NH * HS;  // q's heads, then k's
  for (int first = 0; first < 2 * NH; first += Lane::kHeads) {
    float x1[Lane::kHeads][PAIRS], x2[Lane::kHeads][PAIRS];
#pragma unroll
    for (int h = 0; h < Lane::kHeads; h++) lane.load(x1[h], x2[h], row, first + h, 2 * NH, HS);
#pragma unroll
    for (int h = 0; h < Lane::kHeads; h++) {
      const int head = first + h;
      if (head >= 2 * NH) break;
      float squares = 0.0f;
#pragma unroll
      for (int i = 0; i < PAIRS; i++) squares += __fmaf_rn(x2[h][i], x2[h][i], x1[h][i] * x1[h][i]);
      const float rstd = rsqrtf(warp_reduce_sum(squares) / HS + FLT_EPSILON);
#pragma unroll
      for (int i = 0; i < PAIRS; i++) {
        if (lane.pair(i) >= lane.half) break;
        const float a = x1[h][i] * rstd, b = x2[h][i] * rstd;
        const float c = lane.cos_j[h & 1][i], s = lane.sin_j[h & 1][i];
        row[head * HS + lane.first(i)] = (floatX)(a * c + b * s);
        row[head * HS + lane.second(i)] = (floatX)(b * c - a * s);
      }
      if (lane.id == 0) qk_rstd[(size_t)token * 2 * NH + head] = rstd;
    }
  }
}

// In place on dqkv's q and k: dxhat = R^T dy, xhat = R^T y (y the stored forward output; with BF16
// tables over c^2 + s^2, R's scale), then dx = rstd * (dxhat - xhat * mean(dxhat * xhat)).
template <int PAIRS>
__global__ void qk_norm_rotary_backward_kernel(floatX* dqkv, const floatX* qkv, const float* qk_rstd, int N, int T,
                                               int NH, int HS, const __grid_constant__ RotaryFrequencies f) {
  using Lane = QkNormLane<PAIRS>;
  const int token = blockIdx.x * kQkNormWarps + threadIdx.x / WARP_SIZE;
  if (token >= N) return;
  const Lane lane(f, f.position(token / T, token % T, T), HS);
  const size_t offset = (size_t)token * 3 * NH * HS;
  floatX* d = dqkv + offset;
  const floatX* y = qkv + offset;
  for (int first = 0; first < 2 * NH; first += Lane::kHeads) {
    float y1[Lane::kHeads][PAIRS], y2[Lane::kHeads][PAIRS], dy1[Lane::kHeads][PAIRS], dy2[Lane::kHeads][PAIRS];
#pragma unroll
    for (int h = 0; h < Lane::kHeads; h++) {
      lane.load(y1[h], y2[h], y, first + h, 2 * NH, HS);
      lane.load(dy1[h], dy2[h], d, first + h, 2 * NH, HS);
    }
#pragma unroll
    for (int h = 0; h < Lane::kHeads; h++) {
      const int head = first + h;
      if (head >= 2 * NH) break;
      float xhat1[PAIRS], xhat2[PAIRS], dxhat1[PAIRS], dxhat2[PAIRS], dot = 0.0f;
#pragma unroll
      for (int i = 0; i < PAIRS; i++) {
        const float c = lane.cos_j[h & 1][i], s = lane.sin_j[h & 1][i];
        xhat1[i] = c * y1[h][i] - s * y2[h][i];
        xhat2[i] = s * y1[h][i] + c * y2[h][i];
        if (f.bf16_tables) {  // R R^T = (c^2 + s^2) I, no longer I: xhat = R^T y / (c^2 + s^2)
          const float k = __fmaf_rn(s, s, c * c);
          xhat1[i] /= k;
          xhat2[i] /= k;
        }
        dxhat1[i] = c * dy1[h][i] - s * dy2[h][i];
        dxhat2[i] = s * dy1[h][i] + c * dy2[h][i];
        dot += dxhat1[i] * xhat1[i] + dxhat2[i] * xhat2[i];
      }
      const float rstd = qk_rstd[(size_t)token * 2 * NH + head], mean_dot = warp_reduce_sum(dot) / HS;
#pragma unroll
      for (int i = 0; i < PAIRS; i++) {
        if (lane.pair(i) >= lane.half) break;
        d[head * HS + lane.first(i)] = (floatX)(rstd * (dxhat1[i] - xhat1[i] * mean_dot));
        d[head * HS + lane.second(i)] = (floatX)(rstd * (dxhat2[i] - xhat2[i] * mean_dot));
      }
    }
  }
}

void qk_norm_rotary_check(const char* name, int B, int T, int NH, int HS, const RotaryFrequencies& f) {
  REQUIRE(B > 0 && T > 0 && NH > 0, "%s: B=%d, T=%d and NH=%d must be positive", name, B, T, NH);
  REQUIRE(!f.paired_heads || NH % 2 == 0, "%s: paired heads of %d heads: a head's parity is its position's, "
          "and k's heads take q's parities only where NH is even", name, NH);
  REQUIRE(HS % 4 == 0 && HS >= 8 && HS <= kQkNormMaxHeadSize,
          "%s: head size %d must be a multiple of 4 from 8 to %d", name, HS, kQkNormMaxHeadSize);
}

// Of a kernel's instances for 1, 2 and 4 pairs a lane, the one for head size HS (ceil(HS / 64) pairs).
template <class Kernel>
Kernel qk_norm_rotary_instance(int HS, Kernel one, Kernel two, Kernel four) {
  const int pairs = ceil_div(HS / 2, WARP_SIZE);
  return pairs == 1 ? one : pairs == 2 ? two : four;
}

// qkv [B, T, 3C]: q and k of every head normalised and rotated (f) in place; qk_rstd [B*T, 2*NH].
// first_position: the position of the sequences' first token (decoding one token at a time).
void qk_norm_rotary_forward(floatX* qkv, float* qk_rstd, int B, int T, int NH, int HS, const RotaryFrequencies& f,
                            cudaStream_t stream, int first_position = 0) {
  qk_norm_rotary_check("qk_norm_rotary_forward", B, T, NH, HS, f);
  const int N = B * T;
  const auto kernel = qk_norm_rotary_instance(HS, qk_norm_rotary_forward_kernel<1>, qk_norm_rotary_forward_kernel<2>,
                                              qk_norm_rotary_forward_kernel<4>);
  kernel<<<ceil_div(N, kQkNormWarps), kQkNormWarps * WARP_SIZE, 0, stream>>>(qkv, qk_rstd, N, T, NH, HS,
                                                                            first_position, f);
  cudaCheckLaunch();
}

// dqkv [B, T, 3C]: the gradient of q and k after the rotary becomes their gradient before the norm,
// in place, from the forward's output qkv and qk_rstd; v's gradient is left alone.
void qk_norm_rotary_backward(floatX* dqkv, const floatX* qkv, const float* qk_rstd, int B, int T, int NH,
                             int HS, const RotaryFrequencies& f, cudaStream_t stream) {
  qk_norm_rotary_check("qk_norm_rotary_backward", B, T, NH, HS, f);
  const int N = B * T;
  const auto kernel = qk_norm_rotary_instance(HS, qk_norm_rotary_backward_kernel<1>,
                                              qk_norm_rotary_backward_kernel<2>, qk_norm_rotary_backward_kernel<4>);
  kernel<<<ceil_div(N, kQkNormWarps), kQkNormWarps * WARP_SIZE, 0, stream>>>(dqkv, qkv, qk_rstd, N, T, NH, HS,
                                                                            f);
  cudaCheckLaunch();
}

// ---- Record #89's paired heads: each token's qkv row regrouped by halves, in place ----
// A token's row [q0 q1 k0 k1 v0 v1] (halves of C/2: heads 0..NH/2-1, then the rest) becomes [q0 k0
// v0 q1 k1 v1] (kPairedForward), so that qkv [N, 3C] reads as [2N, 3C/2]: position 2t holds q, k and
// v of token t's first NH/2 heads, 2t + 1 those of the rest, NH/2 heads each, as the attention
// kernels take them; kPairedInverse puts a row back (the attention's dqkv comes out regrouped). The
// attention's output [2N, C/2] is then [N, C] as it stands. One block a row through shared memory,
// 16 bytes a thread; reads and writes 3C values a token, memory-bound.
enum class PairedDirection { kForward, kInverse };
constexpr int kPairedRegroupThreads = 128;
// Where each of the regrouped row's six halves comes from, in each direction.
__constant__ int kPairedSourceHalf[2][6] = {{0, 2, 4, 1, 3, 5}, {0, 3, 1, 4, 2, 5}};

__global__ void paired_heads_regroup_kernel(floatX* qkv, int half, int direction) {
  extern __shared__ __align__(16) unsigned char paired_row_bytes[];
  floatX* row_copy = reinterpret_cast<floatX*>(paired_row_bytes);
  floatX* row = qkv + (size_t)blockIdx.x * 6 * half;
  for (int i = threadIdx.x * x128::size; i < 6 * half; i += blockDim.x * x128::size) {
    store128(row_copy + i, load128(row + i));
  }
  __syncthreads();
  for (int i = threadIdx.x * x128::size; i < 6 * half; i += blockDim.x * x128::size) {
    const int source = kPairedSourceHalf[direction][i / half] * half + i % half;
    store128(row + i, load128(row_copy + source));
  }
}

// qkv [N, 3C] regrouped in place (above), C/2 a multiple of 16 bytes of values.
void paired_heads_regroup(floatX* qkv, int N, int C, PairedDirection direction, cudaStream_t stream) {
  const size_t shared = 3 * (size_t)C * sizeof(floatX);
  REQUIRE(N > 0 && C > 0 && C % 2 == 0 && (C / 2) % x128::size == 0 && shared <= 48 * 1024,
          "paired_heads_regroup: N=%d must be positive and C=%d even, its half a multiple of %d, its row at "
          "most 48 KiB", N, C, (int)x128::size);
  paired_heads_regroup_kernel<<<N, kPairedRegroupThreads, shared, stream>>>(qkv, C / 2, (int)direction);
  cudaCheckLaunch();
}

// ---- Record #89's key offset, in place on qkv's k [N, 3C] after the rotary ----
// Over the forward's N = B x T rows as one flat sequence (rows continue each other; documents do not
// matter), key n's stationary dims (those the rotary leaves unturned: j and j + HS/2 for
// HS/4 <= j < HS/2; with record #89's adjacent pairs HS/2 to HS - 1) become key n-1's, key 0 keeping its own: a key then also
// carries its predecessor's, which lets one layer find a token's successor (an induction head).
// N x NH x HS/2 values, key_offset_column: head h's s-th stationary dim. The forward gathers them into
// scratch [N, C/2] and writes each one a row on, keeping the last row's (which no key takes) in
// tail [C/2] for the backward; the backward moves the gradient a row back (row 0's own adds to
// row 1's, in FP32 and rounded once; row N-1's is zero) and restores k as the rotary wrote it (row
// N-1's from tail), which QK-norm's backward reads. Copies alone: deterministic. Floor: the forward
// reads and writes NC/2 values twice, the backward NC twice; memory-bound.
// Decoding one token at position p against the cache: the token takes the key stationary dims the
// cache's row p holds, and leaves its own in row p + 1 for the next token (key_offset_decode).

constexpr int kKeyOffsetThreads = 256;

// The column of qkv's row holding head h's s-th stationary key dim (s < HS/2), the pairs of
// rotary_frequencies's zeros: dims HS/4 to HS/2 - 1 and 3HS/4 to HS - 1, or with adjacent pairs
// (record #89's layout) HS/2 to HS - 1.
__host__ __device__ inline int key_offset_column(int h, int s, int C, int HS, bool adjacent_pairs) {
  const int quarter = HS / 4;
  if (adjacent_pairs) return C + h * HS + 2 * quarter + s;
  return C + h * HS + quarter + s + (s >= quarter ? quarter : 0);
}

__global__ void key_offset_gather_kernel(floatX* scratch, floatX* tail, const floatX* qkv, int N, int C, int HS,
                                         bool adjacent_pairs) {
  const int half = C / 2;
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * half) return;
  const int n = (int)(i / half), c = (int)(i % half), S = HS / 2;
  const floatX x = qkv[(size_t)n * 3 * C + key_offset_column(c / S, c % S, C, HS, adjacent_pairs)];
  scratch[i] = x;
  if (tail && n == N - 1) tail[c] = x;
}

__global__ void key_offset_forward_kernel(floatX* qkv, const floatX* scratch, int N, int C, int HS,
                                          bool adjacent_pairs) {
  const int half = C / 2;
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * half) return;
  const int n = (int)(i / half), c = (int)(i % half), S = HS / 2;
  if (n > 0) qkv[(size_t)n * 3 * C + key_offset_column(c / S, c % S, C, HS, adjacent_pairs)] = scratch[i - half];
}

// scratch [2, N, C/2]: the shifted keys' gradient, then the shifted keys.
__global__ void key_offset_backward_kernel(floatX* dqkv, floatX* qkv, const floatX* scratch, const floatX* tail,
                                           int N, int C, int HS, bool adjacent_pairs) {
  const int half = C / 2;
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, count = (size_t)N * half;
  if (i >= count) return;
  const int n = (int)(i / half), c = (int)(i % half), S = HS / 2;
  const size_t at = (size_t)n * 3 * C + key_offset_column(c / S, c % S, C, HS, adjacent_pairs);
  float d = n + 1 < N ? (float)scratch[i + half] : 0.0f;
  if (n == 0) d += (float)scratch[i];
  dqkv[at] = (floatX)d;
  qkv[at] = n + 1 < N ? scratch[count + i + half] : tail[c];
}

__global__ void key_offset_decode_kernel(floatX* qkv, floatX* k_cache, int t, int max_t, int C, int HS,
                                         bool adjacent_pairs) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, S = HS / 2;
  if (c >= C / 2) return;
  const int h = c / S, d = key_offset_column(h, c % S, C, HS, adjacent_pairs) - C - h * HS;
  floatX* keys = k_cache + (size_t)h * max_t * HS + d;
  const floatX own = qkv[C + h * HS + d];
  if (t > 0) qkv[C + h * HS + d] = keys[(size_t)t * HS];
  if (t + 1 < max_t) keys[(size_t)(t + 1) * HS] = own;
}

void key_offset_check(const char* name, int N, int C, int HS) {
  REQUIRE(N > 0 && C > 0 && HS >= 4 && HS % 4 == 0 && C % HS == 0,
          "%s: N=%d and C=%d must be positive, the head size %d a multiple of 4 dividing C", name, N, C, HS);
}

// qkv [N, 3C]: k's stationary dims a row on (row 0 keeps its own); scratch [N, C/2]; tail [C/2]
// gets row N-1's (null: not kept, for a pass without a backward). adjacent_pairs: the rotary's layout
// (RotaryFrequencies::adjacent_pairs), which says which dims are stationary.
void key_offset_forward(floatX* qkv, floatX* scratch, floatX* tail, int N, int C, int HS, bool adjacent_pairs,
                        cudaStream_t stream) {
  key_offset_check("key_offset_forward", N, C, HS);
  const int grid = ceil_div((long)N * (C / 2), kKeyOffsetThreads);
  key_offset_gather_kernel<<<grid, kKeyOffsetThreads, 0, stream>>>(scratch, tail, qkv, N, C, HS, adjacent_pairs);
  cudaCheckLaunch();
  key_offset_forward_kernel<<<grid, kKeyOffsetThreads, 0, stream>>>(qkv, scratch, N, C, HS, adjacent_pairs);
  cudaCheckLaunch();
}

// dqkv [N, 3C]: the gradient of the shifted keys' stationary dims becomes that of the keys before
// the shift, and qkv's keys are put back as the rotary wrote them (row N-1's from tail), both in
// place; scratch [N, C].
void key_offset_backward(floatX* dqkv, floatX* qkv, floatX* scratch, const floatX* tail, int N, int C, int HS,
                         bool adjacent_pairs, cudaStream_t stream) {
  key_offset_check("key_offset_backward", N, C, HS);
  const int grid = ceil_div((long)N * (C / 2), kKeyOffsetThreads);
  key_offset_gather_kernel<<<grid, kKeyOffsetThreads, 0, stream>>>(scratch, nullptr, dqkv, N, C, HS,
                                                                   adjacent_pairs);
  cudaCheckLaunch();
  key_offset_gather_kernel<<<grid, kKeyOffsetThreads, 0, stream>>>(scratch + (size_t)N * (C / 2), nullptr, qkv, N,
                                                                   C, HS, adjacent_pairs);
  cudaCheckLaunch();
  key_offset_backward_kernel<<<grid, kKeyOffsetThreads, 0, stream>>>(dqkv, qkv, scratch, tail, N, C, HS,
                                                                     adjacent_pairs);
  cudaCheckLaunch();
}

// qkv [3C]: the token at position t (< max_t) of a layer's cache k_cache [NH, max_t, HS].
void key_offset_decode(floatX* qkv, floatX* k_cache, int t, int max_t, int C, int HS, bool adjacent_pairs,
                       cudaStream_t stream) {
  key_offset_check("key_offset_decode", 1, C, HS);
  REQUIRE(t >= 0 && t < max_t, "key_offset_decode: position %d outside the cache's %d", t, max_t);
  key_offset_decode_kernel<<<ceil_div(C / 2, kKeyOffsetThreads), kKeyOffsetThreads, 0, stream>>>(qkv, k_cache, t,
                                                                                                 max_t, C, HS,
                                                                                                 adjacent_pairs);
  cudaCheckLaunch();
}

// ---- The speedrun's value mix (SPEC "The speedrun architecture"), in place on qkv's v ----
// v = a v + b ve[token] in the layers with a value embedding (ve [Vp, C], a parameter), v = a v in
// the others; (a, b) = scales, two values read from the parameters on the device. Without a learned
// a (record #89's plan: learned_a false, scales = (b)) v + b ve[token], and v as it is elsewhere
// (nothing to do), nothing kept and dv left as it is. With record #89's
// value-embedding gates (ValueMixGates) b is each head's gate instead: g_h = 2 sigmoid(z_h), z_h =
// W[h] . [hn[:6], e[:6]] (e = ve[token], hn the attention's normed input, W [NH, 12]), its 12
// products added in that order in FP32 (ve_gate_value), recomputed where needed, not stored. qkv
// [N, 3C], q | k | v as the flash attention reads it (v in columns [2C, 3C)), after QK-norm and
// rotary; the mixed v is rounded once. The forward keeps v before the mix in v_pre [N, C] for the
// backward (with a), which writes dv_pre = a dv in place, sums da and db (or dW) over row blocks (section 2)
// and adds dve[token] += b dv (g_h dv, and the gates' part of e[:6]) through the encoder's bucketed
// backward (section 3) of a scratch [N, C]: deterministic. Floor: forward reads 2NC values, writes
// 2NC; backward reads 3NC, writes 2NC (the scratch, which the encoder's backward reads again);
// memory-bound, the gates' 12 products a head and row beside it.

// A layer's value-embedding gates: W [NH, kVeGateWidth] and the attention's normed input hn [N, C];
// for the backward their gradients, dW (stochastic rounding) and dhn, whose first kVeGateInputs
// columns (rows ld_dhn apart) the gates' part is added to, rounded to nearest. W null: no gates.
struct ValueMixGates {
  const floatX* W = nullptr;
  const floatX* hn = nullptr;
  int NH = 0;
  floatX* dW = nullptr;
  floatX* dhn = nullptr;
  int ld_dhn = 0;
};
using llmc::kVeGateInputs;
using llmc::kVeGateWidth;

// 2 sigmoid(w . [hn_row[:6], e_row[:6]]), w a head's kVeGateWidth weights: the forward's and the
// backward's one expression, so that both have the same bits.
__device__ __forceinline__ float ve_gate_value(const floatX* w, const floatX* hn_row, const floatX* e_row) {
  float z = 0.0f;
  for (int j = 0; j < kVeGateInputs; j++) z = __fmaf_rn((float)w[j], (float)hn_row[j], z);
  for (int j = 0; j < kVeGateInputs; j++) z = __fmaf_rn((float)w[kVeGateInputs + j], (float)e_row[j], z);
  return 2.0f / (1.0f + expf(-z));
}

__global__ void value_mix_forward_kernel(floatX* qkv, floatX* v_pre, const floatX* ve, const int* tokens,
                                         const floatX* scales, bool learned_a, ValueMixGates gates, int N, int C) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= (size_t)N * C) return;
  const size_t row = i / C;
  const int c = (int)(i % C);
  floatX* v = qkv + row * 3 * C + 2 * C + c;
  const x128 vv = load128(v);
  if (learned_a) store128(v_pre + i, vv);
  const float a = learned_a ? (float)scales[0] : 1.0f;
  x128 o;
  if (ve) {
    const floatX* e_row = ve + (size_t)tokens[row] * C;
    const float b = gates.W ? ve_gate_value(gates.W + (c / (C / gates.NH)) * kVeGateWidth, gates.hn + row * C, e_row)
                            : (float)scales[learned_a ? 1 : 0];
    const x128 e = load128(e_row + c);
    for (int k = 0; k < x128::size; k++) o[k] = (floatX)(a * (float)vv[k] + b * (float)e[k]);
  } else {
    for (int k = 0; k < x128::size; k++) o[k] = (floatX)(a * (float)vv[k]);
  }
  store128(v, o);
}

// grid kRowBlocks, 1-D blocks: each block's elements in order, then its partials (da, db); without a
// learned a, da is 0 and dv is left as it is.
__global__ void value_mix_backward_kernel(floatX* dqkv, floatX* dve_rows, float* partials, const floatX* v_pre,
                                          const floatX* ve, const int* tokens, const floatX* scales,
                                          bool learned_a, int N, int C) {
  const float a = learned_a ? (float)scales[0] : 1.0f, b = ve ? (float)scales[learned_a ? 1 : 0] : 0.0f;
  float sums[2] = {};
  const RowBlockRange range = row_block_range(N, C);
  for (size_t i = range.begin + threadIdx.x * x128::size; i < range.end; i += blockDim.x * x128::size) {
    const size_t row = i / C;
    const int c = (int)(i % C);
    floatX* dv_at = dqkv + row * 3 * C + 2 * C + c;
    const x128 dv = load128(dv_at), vp = learned_a ? load128(v_pre + i) : x128();
    const x128 e = ve ? load128(ve + (size_t)tokens[row] * C + c) : x128();
    x128 o, scaled;
    for (int k = 0; k < x128::size; k++) {
      const float g = (float)dv[k];
      if (learned_a) {
        sums[0] += g * (float)vp[k];
        o[k] = (floatX)(a * g);
      }
      if (ve) {
        sums[1] += g * (float)e[k];
        scaled[k] = (floatX)(b * g);
      }
    }
    if (learned_a) store128(dv_at, o);
    if (ve) store128(dve_rows + i, scaled);
  }
  row_block_sums_store(partials, sums);
}

// The backward with gates: grid kRowBlocks of kValueMixGateWarps warps, warp w taking its block's
// rows w, w + 8, ... in turn, a 16-byte piece a lane. Dynamic shared memory, in floats: W [NH 12],
// then per warp (value_mix_gate_warp_floats) its dW sums [NH 12], the row's gate inputs [12], gates
// [NH], dz [NH], dv[:6] and its pieces' dv . e [C / x128::size]. Per row: dg_h = the head's piece dots
// in order, dz_h = dg_h g_h (1 - g_h / 2); dhn[j] += sum_h dz_h W[h, j] and the scratch's e[:6]
// columns g dv + sum_h dz_h W[h, 6 + j] (h in order); dW sums dz_h x_j in row order. Then the block's
// da (block_reduce_sum's tree) into partials[block], and dW's warps in order into dw_partials[block].
// Without a learned a, dv is left as it is and da is 0.
constexpr int kValueMixGateWarps = 8;
__host__ __device__ inline int value_mix_gate_warp_floats(int NH, int C) {
  return NH * kVeGateWidth + kVeGateWidth + 2 * NH + kVeGateInputs + C / x128::size;
}

__global__ void value_mix_gated_backward_kernel(floatX* dqkv, floatX* dve_rows, float* partials, float* dw_partials,
                                                const floatX* v_pre, const floatX* ve, const int* tokens,
                                                const floatX* scales, bool learned_a, ValueMixGates gates, int N,
                                                int C) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int NH = gates.NH, HS = C / NH, weights = NH * kVeGateWidth, pieces = C / x128::size;
  float* w_s = shared;
  float* dw_acc = shared + weights + warp * value_mix_gate_warp_floats(NH, C);
  float* inputs = dw_acc + weights;
  float* gate = inputs + kVeGateWidth;
  float* dz = gate + NH;
  float* dv_first = dz + NH;
  float* piece_dot = dv_first + kVeGateInputs;
  for (int e = threadIdx.x; e < weights; e += blockDim.x) w_s[e] = (float)gates.W[e];
  for (int e = lane; e < weights; e += WARP_SIZE) dw_acc[e] = 0.0f;
  __syncthreads();
  const float a = learned_a ? (float)scales[0] : 1.0f;
  float da = 0.0f;
  const int rpb = rows_per_block(N), r0 = blockIdx.x * rpb, r1 = min(N, r0 + rpb);
  for (int row = r0 + warp; row < r1; row += kValueMixGateWarps) {
    const floatX* hn_row = gates.hn + (size_t)row * C;
    const floatX* e_row = ve + (size_t)tokens[row] * C;
    if (lane < kVeGateWidth) inputs[lane] = (float)(lane < kVeGateInputs ? hn_row[lane] : e_row[lane - kVeGateInputs]);
    for (int h = lane; h < NH; h += WARP_SIZE) gate[h] = ve_gate_value(gates.W + h * kVeGateWidth, hn_row, e_row);
    __syncwarp();
    for (int p = lane; p < pieces; p += WARP_SIZE) {
      const int c = p * x128::size;
      const size_t at = (size_t)row * C + c;
      floatX* dv_at = dqkv + (size_t)row * 3 * C + 2 * C + c;
      const x128 dv = load128(dv_at), vp = learned_a ? load128(v_pre + at) : x128(), e = load128(e_row + c);
      const float g = gate[c / HS];
      x128 o, scaled;
      float dot = 0.0f;
      for (int k = 0; k < x128::size; k++) {
        const float d = (float)dv[k];
        if (learned_a) {
          da += d * (float)vp[k];
          o[k] = (floatX)(a * d);
        }
        dot += d * (float)e[k];
        scaled[k] = (floatX)(g * d);
        if (c + k < kVeGateInputs) dv_first[c + k] = d;
      }
      if (learned_a) store128(dv_at, o);
      store128(dve_rows + at, scaled);
      piece_dot[p] = dot;
    }
    __syncwarp();
    for (int h = lane; h < NH; h += WARP_SIZE) {
      float dg = 0.0f;
      for (int p = h * HS / x128::size; p < (h + 1) * HS / x128::size; p++) dg += piece_dot[p];
      dz[h] = dg * gate[h] * (1.0f - 0.5f * gate[h]);
    }
    __syncwarp();
    if (lane < kVeGateWidth) {
      float sum = 0.0f;
      for (int h = 0; h < NH; h++) sum += dz[h] * w_s[h * kVeGateWidth + lane];
      if (lane < kVeGateInputs) {
        floatX& d = gates.dhn[(size_t)row * gates.ld_dhn + lane];
        d = (floatX)((float)d + sum);
      } else {
        const int j = lane - kVeGateInputs;  // after the piece's store: __syncwarp orders them
        dve_rows[(size_t)row * C + j] = (floatX)(gate[j / HS] * dv_first[j] + sum);
      }
    }
    for (int e = lane; e < weights; e += WARP_SIZE) dw_acc[e] += dz[e / kVeGateWidth] * inputs[e % kVeGateWidth];
    __syncwarp();  // the row's shared values are the next row's
  }
  const float sums[1] = {da};
  row_block_sums_store(partials, sums);
  __syncthreads();
  for (int e = threadIdx.x; e < weights; e += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kValueMixGateWarps; w++) {
      sum += shared[weights + w * value_mix_gate_warp_floats(NH, C) + e];
    }
    dw_partials[(size_t)blockIdx.x * weights + e] = sum;
  }
}

constexpr int kValueMixThreads = 256;

void value_mix_check(const char* name, int N, int C, const floatX* ve, const ValueMixGates& gates) {
  REQUIRE(N > 0 && C > 0 && C % x128::size == 0, "%s: N=%d must be positive and C=%d a positive multiple of %d",
          name, N, C, x128::size);
  if (!gates.W) return;
  REQUIRE(ve && gates.hn && gates.NH > 0 && C % gates.NH == 0 && (C / gates.NH) % x128::size == 0 &&
              C >= kVeGateInputs,
          "%s: the value-embedding gates need a value embedding, the normed input hn, and NH=%d heads of a whole "
          "multiple of %d channels in C=%d (at least %d)", name, gates.NH, x128::size, C, kVeGateInputs);
}

// The column-reduction partials value_mix_backward takes for NH heads (with or without gates).
size_t value_mix_backward_partials(int NH) { return (size_t)kRowBlocks * (2 + NH * kVeGateWidth); }

// qkv [N, 3C]: v_pre [N, C] = v, then v = scales[0] v + scales[1] ve[tokens] (ve nullptr: scales[0]
// v), with gates each head's gate in place of scales[1]. Without learned_a: v + scales[0] ve[tokens]
// (the gates in its place), v_pre unused, and nothing at all without ve. tokens [N] on the device
// (read only with ve).
void value_mix_forward(floatX* qkv, floatX* v_pre, const floatX* ve, const int* tokens, const floatX* scales,
                       int N, int C, cudaStream_t stream, const ValueMixGates& gates = {}, bool learned_a = true) {
  value_mix_check("value_mix_forward", N, C, ve, gates);
  REQUIRE(!ve || tokens, "value_mix_forward: a value embedding needs the tokens");
  REQUIRE(!learned_a || v_pre, "value_mix_forward: a learned a needs v_pre, v kept for the backward");
  if (!learned_a && !ve) return;
  const size_t pieces = (size_t)N * C / x128::size;
  value_mix_forward_kernel<<<ceil_div(pieces, kValueMixThreads), kValueMixThreads, 0, stream>>>(
      qkv, v_pre, ve, tokens, scales, learned_a, gates, N, C);
  cudaCheckLaunch();
}

// dqkv [N, 3C]: its v part, dv (the gradient of the mixed v), becomes scales[0] dv, the gradient of
// v_pre, in place; dscales[0] += sum(dv * v_pre). With ve: dscales[1] += sum(dv * ve[tokens]), and
// dve[token] += the sum of scales[1] dv over the token's rows, from scratch [N, C] (overwritten)
// through encoder_backward with plan (of these N tokens, on the GPU). With gates dscales[1] is left
// alone, each head's gate takes scales[1]'s place in dve, the gates' part of e[:6] joins it, and
// gates.dW and gates.dhn[:, :6] take theirs. Scalar sums and dve with stochastic rounding (seed).
// Without learned_a: dv stays (the gradient of v as it was), dscales[0] += sum(dv * ve[tokens]) (not
// with gates), v_pre unused, and nothing at all without ve.
// partials: value_mix_backward_partials(NH) floats. Without ve, dve, scratch and plan are unused.
void value_mix_backward(floatX* dqkv, floatX* dscales, floatX* dve, floatX* scratch, float* partials,
                        const floatX* v_pre, const floatX* ve, const int* tokens, const floatX* scales,
                        const EncoderBackwardPlan* plan, int N, int C, uint32_t seed, cudaStream_t stream,
                        const ValueMixGates& gates = {}, bool learned_a = true) {
  const char* name = "value_mix_backward";
  value_mix_check(name, N, C, ve, gates);
  REQUIRE(!ve || (dve && scratch && tokens && plan),
          "%s: a value embedding needs dve, the scratch, the tokens and the encoder's plan", name);
  REQUIRE(!learned_a || v_pre, "%s: a learned a needs v_pre, v as the forward kept it", name);
  if (!learned_a && !ve) return;
  if (gates.W) {
    REQUIRE(gates.dW && gates.dhn && gates.ld_dhn >= kVeGateInputs,
            "%s: the gates need dW and dhn, its rows at least %d apart (ld_dhn %d)", name, kVeGateInputs, gates.ld_dhn);
    const int weights = gates.NH * kVeGateWidth;
    float* dw_partials = partials + kRowBlocks;
    const size_t shared = sizeof(float) * (weights + (size_t)kValueMixGateWarps * value_mix_gate_warp_floats(gates.NH, C));
    cudaCheck(cudaFuncSetAttribute(value_mix_gated_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)shared));
    value_mix_gated_backward_kernel<<<kRowBlocks, kValueMixGateWarps * WARP_SIZE, shared, stream>>>(
        dqkv, scratch, partials, dw_partials, v_pre, ve, tokens, scales, learned_a, gates, N, C);
    cudaCheckLaunch();
    if (learned_a) column_sum_finalize(dscales, partials, 1, 1, kRowBlocks, seed, stream);
    column_sum_finalize(gates.dW, dw_partials, weights, weights, kRowBlocks, seed ^ 0x85ebca6bu, stream);
  } else {
    value_mix_backward_kernel<<<kRowBlocks, kValueMixThreads, 0, stream>>>(dqkv, scratch, partials, v_pre, ve,
                                                                           tokens, scales, learned_a, N, C);
    cudaCheckLaunch();
    if (learned_a) {
      column_sum_finalize(dscales, partials, 2, ve ? 2 : 1, kRowBlocks, seed, stream);
    } else {
      column_sum_finalize(dscales, partials + 1, 2, 1, kRowBlocks, seed, stream);  // db alone
    }
  }
  if (ve) encoder_backward(dve, nullptr, *plan, scratch, 1, N, C, seed ^ 0x1b873593u, stream);
}

// Record #89's MUDD dense connections' value on the plan's last layer: v + (g_h e + extra), e = ve[token],
// g_h a row's gate of head h's half (first: the first NH/2 heads, second: the rest), extra [N, C] the
// layer's other value terms (section 10): g_h e rounded, its sum with extra rounded, then the sum with
// v rounded, as the reference's steps. Backward (dv is v's gradient as it was): dextra = dv, the rows
// of dve[token] = g_h dv (rounded, for the encoder's bucketed backward) and each half's gate gradient
// dg_n = the sum of dv . e over the half's columns of row n, a warp a row (its pieces in order, then
// warp_reduce_sum's tree): deterministic. Floor: forward reads 3NC, writes NC; backward reads 2NC,
// writes 2NC; memory-bound.
struct ValueRowGates {
  GateRows first, second;
  int NH = 0;
};

__device__ __forceinline__ float value_row_gate(const ValueRowGates& g, size_t row, int c, int C) {
  return c / (C / g.NH) < g.NH / 2 ? g.first.at(row) : g.second.at(row);
}

__global__ void value_mix_rows_forward_kernel(floatX* qkv, const floatX* ve, const int* tokens, ValueRowGates gates,
                                              const floatX* extra, int N, int C) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= (size_t)N * C) return;
  const size_t row = i / C;
  const int c = (int)(i % C);
  floatX* v = qkv + row * 3 * C + 2 * C + c;
  const float g = value_row_gate(gates, row, c, C);
  const x128 vv = load128(v), e = load128(ve + (size_t)tokens[row] * C + c), x = load128(extra + i);
  x128 o;
  for (int k = 0; k < x128::size; k++) {
    const float term = (float)(floatX)((float)(floatX)__fmul_rn(g, (float)e[k]) + (float)x[k]);
    o[k] = (floatX)((float)vv[k] + term);
  }
  store128(v, o);
}

__global__ void value_mix_rows_backward_kernel(floatX* dextra, floatX* dve_rows, GateGradient dfirst,
                                               GateGradient dsecond, const floatX* dqkv, const floatX* ve,
                                               const int* tokens, ValueRowGates gates, int N, int C) {
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int rpb = rows_per_block(N), half = (C / gates.NH) * (gates.NH / 2);
  const int r0 = min(N, (int)blockIdx.x * rpb), r1 = min(N, r0 + rpb);
  for (int row = r0 + warp; row < r1; row += kGateRowWarps) {
    const size_t base = (size_t)row * C;
    const floatX* e_row = ve + (size_t)tokens[row] * C;
    float sums[2] = {};
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
      const float g = value_row_gate(gates, row, c, C);
      const x128 dv = load128(dqkv + (size_t)row * 3 * C + 2 * C + c), e = load128(e_row + c);
      x128 o;
      for (int k = 0; k < x128::size; k++) {
        sums[c < half ? 0 : 1] += (float)dv[k] * (float)e[k];
        o[k] = (floatX)(g * (float)dv[k]);
      }
      store128(dve_rows + base + c, o);
      store128(dextra + base + c, dv);
    }
    const float first = warp_reduce_sum(sums[0]), second = warp_reduce_sum(sums[1]);
    if (lane == 0) {
      dfirst.values[(size_t)row * dfirst.stride] = (floatX)first;
      dsecond.values[(size_t)row * dsecond.stride] = (floatX)second;
    }
  }
}

void value_mix_rows_check(const char* name, const ValueRowGates& gates, int N, int C) {
  REQUIRE(N > 0 && C > 0 && C % x128::size == 0 && gates.NH > 0 && gates.NH % 2 == 0 && C % gates.NH == 0 &&
              (C / gates.NH) % x128::size == 0,
          "%s: N=%d must be positive, NH=%d even and C=%d a multiple of NH whose heads are multiples of %d", name, N,
          gates.NH, C, x128::size);
  REQUIRE(gates.first.stride > 0 && gates.second.stride > 0, "%s: the gates are a value a row", name);
}

// v in qkv [N, 3C] += g_h e + extra (above); ve the layer's value embedding table.
void value_mix_rows_forward(floatX* qkv, const floatX* ve, const int* tokens, const ValueRowGates& gates,
                            const floatX* extra, int N, int C, cudaStream_t stream) {
  value_mix_rows_check("value_mix_rows_forward", gates, N, C);
  const size_t n = (size_t)N * C;
  value_mix_rows_forward_kernel<<<ceil_div(n / x128::size, (size_t)kValueMixThreads), kValueMixThreads, 0, stream>>>(
      qkv, ve, tokens, gates, extra, N, C);
  cudaCheckLaunch();
}

// From dqkv's dv: dextra [N, C] = dv, the gates' row gradients, and dve[token] += g_h dv through
// encoder_backward with plan (scratch [N, C] its rows, overwritten; stochastic rounding from seed).
void value_mix_rows_backward(floatX* dextra, floatX* dve, GateGradient dfirst, GateGradient dsecond, floatX* scratch,
                             const floatX* dqkv, const floatX* ve, const int* tokens, const ValueRowGates& gates,
                             const EncoderBackwardPlan& plan, int N, int C, uint32_t seed, cudaStream_t stream) {
  const char* name = "value_mix_rows_backward";
  value_mix_rows_check(name, gates, N, C);
  REQUIRE(dfirst.stride > 0 && dsecond.stride > 0 && dextra != scratch, "%s: the gates' gradients a row, and dextra "
          "apart from the scratch", name);
  value_mix_rows_backward_kernel<<<kRowBlocks, kGateRowWarps * WARP_SIZE, 0, stream>>>(
      dextra, scratch, dfirst, dsecond, dqkv, ve, tokens, gates, N, C);
  cudaCheckLaunch();
  encoder_backward(dve, nullptr, plan, scratch, 1, N, C, seed, stream);
}

// ---- The speedrun's attention gate (SPEC "The speedrun architecture") ----
// Each head's output times a gate from the attention's normed input hn [N, C]: g[t, h] = sigmoid(z),
// z = sum over j < G of W[h, j] hn[t, j] (G = C / 64: the first G channels; W [NH, G] a parameter),
// yg[t, h HS + d] = y[t, h HS + d] g[t, h]. The forward writes yg (attproj's input) and g [N, NH]
// in FP32, y kept (the flash backward reads it); attention_gate_apply recomputes yg from y and g,
// the same bits. One warp per token; z summed over j in order, each head's dot in the backward over
// its 16-byte pieces in order, dW over per-warp shared rows, added in warp order, then over the row
// blocks by section 2's column sums: deterministic. Floor: forward reads NC + NG values, writes NC
// and N NH floats; backward reads 2NC, writes NC (dhn: N G read and written); memory-bound.

constexpr int kAttentionGateDivisor = 64;  // G = C / 64, as train_gpt2.py's SPEEDRUN_GATE_DIVISOR
constexpr int kAttentionGateWarps = 8;

// The flash backward's row term, each head's dout . out, written [N / T, NH, T] (row b T + t, head
// h at (b NH + h) T + t), by the backward that has dout and out at hand (attention_gate_backward),
// or by the flash backward's own pass (backward_row_dots) where dots is nullptr.
struct AttentionRowDots {
  float* dots = nullptr;
  int T = 0;
};

// A row's dout . out over one head, on the head's lanes (consecutive lanes, a power of two dividing
// 32, every lane of the warp taking part), each with a 16-byte piece: the piece's products in
// order, then a fixed xor tree over the lanes; every lane gets the sum.
__device__ __forceinline__ float attention_row_dot(const x128& dout, const x128& out, int lanes) {
  float sum = 0.0f;
  for (int k = 0; k < x128::size; k++) sum = __fmaf_rn((float)dout[k], (float)out[k], sum);
  for (int offset = lanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  return sum;
}

// Whether attention_gate_backward's warps, a piece a lane over a row, can take each head's row dot:
// a row's pieces fill whole warps and a head's pieces divide a warp.
bool attention_gate_row_dots_supported(int NH, int C) {
  const int head_pieces = C / NH / x128::size;
  return (C / x128::size) % WARP_SIZE == 0 && head_pieces > 0 && WARP_SIZE % head_pieces == 0;
}

// g_out nullptr: g is only read (attention_gate_apply); otherwise g_out = g is computed first.
__global__ void attention_gate_forward_kernel(floatX* yg, float* g_out, const float* g, const floatX* y,
                                              const floatX* hn, const floatX* W, int N, int NH, int C) {
  const int row = blockIdx.x * kAttentionGateWarps + threadIdx.x / WARP_SIZE;
  if (row >= N) return;
  const int lane = threadIdx.x % WARP_SIZE, G = C / kAttentionGateDivisor, HS = C / NH;
  if (g_out) {
    const floatX* hn_row = hn + (size_t)row * C;
    for (int h = lane; h < NH; h += WARP_SIZE) {
      float z = 0.0f;
      for (int j = 0; j < G; j++) z += (float)W[h * G + j] * (float)hn_row[j];
      g_out[(size_t)row * NH + h] = 1.0f / (1.0f + expf(-z));
    }
    __syncwarp();  // orders the lanes' g writes before the reads below
  }
  const float* g_row = g + (size_t)row * NH;
  for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
    const float gate = g_row[c / HS];
    const x128 v = load128(y + (size_t)row * C + c);
    x128 o;
    for (int k = 0; k < x128::size; k++) o[k] = (floatX)((float)v[k] * gate);
    store128(yg + (size_t)row * C + c, o);
  }
}

// The backward in two kernels. attention_gate_backward_rows_kernel: one warp per row, every row at
// once; dynamic shared memory, in floats: W [NH G], then per warp dz [NH] and the dots of its row's
// 16-byte pieces [C / x128::size]. It writes dz [N, NH] (FP32) for
// attention_gate_weight_grad_kernel, which sums dW in the fixed order of row blocks and warps
// (kRowBlocks blocks of kAttentionGateWarps warps, each warp its block's rows warp, warp + 8, ...,
// staged kAttentionGateRowsStaged at a time); per warp its dW sums [NH G], then its staged rows'
// dz and first G normed inputs.
constexpr int kAttentionGateRowsStaged = 32;
__host__ __device__ inline int attention_gate_rows_warp_floats(int NH, int C) { return NH + C / x128::size; }
__host__ __device__ inline int attention_gate_weight_warp_floats(int NH, int C) {
  const int G = C / kAttentionGateDivisor;
  return NH * G + kAttentionGateRowsStaged * (NH + G);
}

__global__ void attention_gate_backward_rows_kernel(floatX* dy, float* dz_out, floatX* dhn, int ld_dhn,
                                                    AttentionRowDots row_dots, const floatX* dyg, const floatX* y,
                                                    const float* g, const floatX* W, int N, int NH, int C) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int G = C / kAttentionGateDivisor, HS = C / NH, weights = NH * G, pieces = C / x128::size;
  float* w_s = shared;
  float* dz = shared + weights + warp * attention_gate_rows_warp_floats(NH, C);
  float* piece_dot = dz + NH;
  for (int e = threadIdx.x; e < weights; e += blockDim.x) w_s[e] = (float)W[e];
  __syncthreads();
  const int row = blockIdx.x * kAttentionGateWarps + warp;
  if (row >= N) return;
  const size_t base = (size_t)row * C;
  const float* g_row = g + (size_t)row * NH;
  for (int p = lane; p < pieces; p += WARP_SIZE) {
    const int c = p * x128::size;
    const float gate = g_row[c / HS];
    const x128 d = load128(dyg + base + c), v = load128(y + base + c);
    x128 o;
    float dot = 0.0f;
    for (int k = 0; k < x128::size; k++) {
      dot += (float)d[k] * (float)v[k];
      o[k] = (floatX)(gate * (float)d[k]);
    }
    store128(dy + base + c, o);
    piece_dot[p] = dot;
    if (row_dots.dots) {
      const int head_pieces = HS / x128::size, h = p / head_pieces;
      const float sum = attention_row_dot(o, v, head_pieces);
      const int b = row / row_dots.T, t = row % row_dots.T;
      if (p % head_pieces == 0) row_dots.dots[((size_t)b * NH + h) * row_dots.T + t] = sum;
    }
  }
  __syncwarp();
  for (int h = lane; h < NH; h += WARP_SIZE) {
    float dot = 0.0f;
    for (int p = h * HS / x128::size; p < (h + 1) * HS / x128::size; p++) dot += piece_dot[p];
    const float gate = g_row[h];
    dz[h] = dot * gate * (1.0f - gate);
    dz_out[(size_t)row * NH + h] = dz[h];
  }
  __syncwarp();
  for (int j = lane; j < G; j += WARP_SIZE) {
    float sum = 0.0f;
    for (int h = 0; h < NH; h++) sum += dz[h] * w_s[h * G + j];
    floatX& d = dhn[(size_t)row * ld_dhn + j];
    d = (floatX)((float)d + sum);
  }
}

// partials[block][e] = the block's sum of dz[t, e / G] hn[t, e % G] over its rows in warp order.
__global__ void attention_gate_weight_grad_kernel(float* partials, const float* dz, const floatX* hn, int N,
                                                  int NH, int C) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int G = C / kAttentionGateDivisor, weights = NH * G, row_floats = NH + G;
  float* dw_acc = shared + warp * attention_gate_weight_warp_floats(NH, C);
  float* staged = dw_acc + weights;  // [kAttentionGateRowsStaged][dz NH, hn G]
  for (int e = lane; e < weights; e += WARP_SIZE) dw_acc[e] = 0.0f;
  const int rpb = rows_per_block(N);
  const int r0 = blockIdx.x * rpb, r1 = min(N, r0 + rpb);
  constexpr int kStride = kAttentionGateRowsStaged * kAttentionGateWarps;
  for (int first = r0 + warp; first < r1; first += kStride) {
    for (int i = lane; i < kAttentionGateRowsStaged * row_floats; i += WARP_SIZE) {
      const int row = first + (i / row_floats) * kAttentionGateWarps, col = i % row_floats;
      if (row < r1) staged[i] = col < NH ? dz[(size_t)row * NH + col] : (float)hn[(size_t)row * C + col - NH];
    }
    __syncwarp();
    for (int r = 0; r < kAttentionGateRowsStaged && first + r * kAttentionGateWarps < r1; r++) {
      const float* row_s = staged + r * row_floats;
      for (int e = lane; e < weights; e += WARP_SIZE) dw_acc[e] += row_s[e / G] * row_s[NH + e % G];
    }
    __syncwarp();  // staged is the next rows'
  }
  __syncthreads();
  for (int e = threadIdx.x; e < weights; e += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAttentionGateWarps; w++) sum += shared[w * attention_gate_weight_warp_floats(NH, C) + e];
    partials[(size_t)blockIdx.x * weights + e] = sum;
  }
}

void attention_gate_check(const char* name, int N, int NH, int C) {
  REQUIRE(N > 0 && NH > 0 && C >= kAttentionGateDivisor && C % NH == 0 && (C / NH) % x128::size == 0,
          "%s: N=%d, NH=%d, C=%d: N and NH must be positive, C at least %d, and the head size C/NH a "
          "whole multiple of %d", name, N, NH, C, kAttentionGateDivisor, x128::size);
}

void attention_gate_launch(floatX* yg, float* g_out, const float* g, const floatX* y, const floatX* hn,
                           const floatX* W, int N, int NH, int C, cudaStream_t stream) {
  attention_gate_forward_kernel<<<ceil_div(N, kAttentionGateWarps), kAttentionGateWarps * WARP_SIZE, 0, stream>>>(
      yg, g_out, g, y, hn, W, N, NH, C);
  cudaCheckLaunch();
}

// yg [N, C] = y gated by g [N, NH] (FP32, written) = sigmoid(hn[:, :G] W^T), W [NH, G], G = C / 64.
void attention_gate_forward(floatX* yg, float* g, const floatX* y, const floatX* hn, const floatX* W, int N,
                            int NH, int C, cudaStream_t stream) {
  attention_gate_check("attention_gate_forward", N, NH, C);
  REQUIRE(hn && W, "attention_gate_forward: the gate needs hn and W");
  attention_gate_launch(yg, g, g, y, hn, W, N, NH, C, stream);
}

// yg [N, C] = y gated by the forward's g [N, NH]: the forward's yg, bit for bit.
void attention_gate_apply(floatX* yg, const floatX* y, const float* g, int N, int NH, int C, cudaStream_t stream) {
  attention_gate_check("attention_gate_apply", N, NH, C);
  attention_gate_launch(yg, nullptr, g, y, nullptr, nullptr, N, NH, C, stream);
}

// From dyg [N, C], the gradient of yg: dy = g dyg (written; dy may be dyg itself), and with
// dz[t, h] = g (1 - g) sum_d dyg y over the head's channels: dW [NH, G] += sum_t dz[t, h] hn[t, j]
// (stochastic rounding, seed), dhn[t, j] += sum_h dz[t, h] W[h, j] for j < G (dhn: the gradient of
// the attention's normed input, which the qkv product's input gradient also goes into; rounded to
// nearest; its rows ld_dhn apart: C, or G for those columns alone). row_dots.dots given (sequences
// of row_dots.T rows; attention_gate_row_dots_supported): each head's dy . y, the flash backward's
// row term, into row_dots.dots [N / T, NH, T], backward_row_dots' bits, so that the flash backward
// need not read dy and y again for it. partials:
// attention_gate_backward_partials(N, NH, C) floats (the row blocks' dW sums, then dz).
size_t attention_gate_backward_partials(int N, int NH, int C) {
  return (size_t)kRowBlocks * NH * (C / kAttentionGateDivisor) + (size_t)N * NH;
}
void attention_gate_backward(floatX* dy, floatX* dhn, int ld_dhn, floatX* dW, float* partials, const floatX* dyg,
                             const floatX* y, const float* g, const floatX* hn, const floatX* W, int N, int NH,
                             int C, uint32_t seed, cudaStream_t stream, const AttentionRowDots& row_dots = {}) {
  const char* name = "attention_gate_backward";
  attention_gate_check(name, N, NH, C);
  REQUIRE(!row_dots.dots || (attention_gate_row_dots_supported(NH, C) && row_dots.T > 0 && N % row_dots.T == 0),
          "%s: the attention's row dots need C / %d pieces a whole number of warps, a head's pieces a divisor of "
          "%d (C=%d, NH=%d), and whole sequences of T=%d (N=%d)", name, x128::size, WARP_SIZE, C, NH, row_dots.T, N);
  REQUIRE(dhn != dy && dhn != dyg, "%s: dhn must not share memory with dy or dyg", name);
  REQUIRE(ld_dhn >= C / kAttentionGateDivisor, "%s: dhn's rows %d apart hold fewer than the gate's %d columns", name,
          ld_dhn, C / kAttentionGateDivisor);
  const int weights = NH * (C / kAttentionGateDivisor);
  float* dz = partials + (size_t)kRowBlocks * weights;
  const size_t rows_shared =
      sizeof(float) * (weights + (size_t)kAttentionGateWarps * attention_gate_rows_warp_floats(NH, C));
  cudaCheck(cudaFuncSetAttribute(attention_gate_backward_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)rows_shared));
  attention_gate_backward_rows_kernel<<<ceil_div(N, kAttentionGateWarps), kAttentionGateWarps * WARP_SIZE,
                                        rows_shared, stream>>>(dy, dz, dhn, ld_dhn, row_dots, dyg, y, g, W, N, NH, C);
  cudaCheckLaunch();
  const size_t weight_shared = sizeof(float) * kAttentionGateWarps * (size_t)attention_gate_weight_warp_floats(NH, C);
  cudaCheck(cudaFuncSetAttribute(attention_gate_weight_grad_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)weight_shared));
  attention_gate_weight_grad_kernel<<<kRowBlocks, kAttentionGateWarps * WARP_SIZE, weight_shared, stream>>>(
      partials, dz, hn, N, NH, C);
  cudaCheckLaunch();
  column_sum_finalize(dW, partials, weights, weights, kRowBlocks, seed, stream);
}

// ---- Record #89's exclusive self-attention (XSA; SPEC "The speedrun architecture") ----
// In the plan's XSA layers each head's attention output y [N, C] loses its part along the value it
// read: out = y - s (y . v / max(|v|^2, 1e-8)) v per row and head, s = tanh(alpha_h), alpha [NH] a
// parameter or MUDD's alpha_n,h a row (GateRows), v [N, C] with rows ld_v apart (qkv's v columns
// after the value mix). Rounded to floatX where train_gpt2.py's tensors are (each product in the two
// dots, the dots, the ratio, s, s times the ratio, its product with v, the difference); the rest
// FP32 in registers. One warp a row, a 16-byte piece a lane; a head's dots over its pieces in order,
// the pieces' products in order. The backward writes dy (over dout, in place) and dv (its own
// rows), and sums a shared dalpha over row blocks (section 2) or writes a row's dalpha_n,h:
// deterministic. Floor: forward reads 2NC values, writes NC; backward reads 3NC, writes 2NC;
// memory-bound.

constexpr int kXsaWarps = 8;
constexpr float kXsaMinSquares = 1e-8f;  // the clamp of |v|^2, the reference's
// Per warp, in floats: its pieces' y . v, v . v and dout . v [C / x128::size each], then each
// head's scalars: the coefficient, dy's and dv's factors of v, and the warp's dalpha sums [NH each].
__host__ __device__ inline int xsa_warp_floats(int NH, int C) { return 3 * (C / x128::size) + 4 * NH; }

// A head's forward scalars, from its pieces' sums.
struct XsaHead {
  float dot, den, coef;
  bool clamped;  // |v|^2 below the clamp, whose gradient then stops
};

__device__ __forceinline__ float xsa_strength(const GateRows& alpha, size_t row, int h) {
  return (float)(floatX)tanhf(alpha.at(row, h));
}

// Each of the row's pieces' rounded products y v and v v, added in order, into piece_yv, piece_vv.
__device__ void xsa_piece_sums(float* piece_yv, float* piece_vv, const floatX* y_row, const floatX* v_row,
                               int pieces, int lane) {
  for (int p = lane; p < pieces; p += WARP_SIZE) {
    const x128 y = load128(y_row + p * x128::size), v = load128(v_row + p * x128::size);
    float yv = 0.0f, vv = 0.0f;
    for (int k = 0; k < x128::size; k++) {
      yv += (float)(floatX)((float)y[k] * (float)v[k]);
      vv += (float)(floatX)((float)v[k] * (float)v[k]);
    }
    piece_yv[p] = yv;
    piece_vv[p] = vv;
  }
}

// Head h's scalars (its head_pieces pieces in order), s its strength: the forward's and the
// backward's one expression, so that both have the same bits.
__device__ XsaHead xsa_head(const float* piece_yv, const float* piece_vv, int h, int head_pieces, float s) {
  float yv = 0.0f, vv = 0.0f;
  for (int p = h * head_pieces; p < (h + 1) * head_pieces; p++) {
    yv += piece_yv[p];
    vv += piece_vv[p];
  }
  XsaHead x;
  x.dot = (float)(floatX)yv;
  const float squares = (float)(floatX)vv, floor = (float)(floatX)kXsaMinSquares;
  x.clamped = squares < floor;
  x.den = x.clamped ? floor : squares;
  const float ratio = (float)(floatX)(x.dot / x.den);
  x.coef = (float)(floatX)(s * ratio);
  return x;
}

__global__ void xsa_forward_kernel(floatX* out, const floatX* y, const floatX* v, int ld_v, GateRows alpha, int N,
                                   int NH, int C) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int pieces = C / x128::size, head_pieces = pieces / NH;
  float* piece_yv = shared + warp * xsa_warp_floats(NH, C);
  float* piece_vv = piece_yv + pieces;
  float* coef = piece_vv + 2 * pieces;
  const int row = blockIdx.x * kXsaWarps + warp;
  if (row >= N) return;
  const floatX* y_row = y + (size_t)row * C;
  const floatX* v_row = v + (size_t)row * ld_v;
  xsa_piece_sums(piece_yv, piece_vv, y_row, v_row, pieces, lane);
  __syncwarp();
  for (int h = lane; h < NH; h += WARP_SIZE) {
    coef[h] = xsa_head(piece_yv, piece_vv, h, head_pieces, xsa_strength(alpha, row, h)).coef;
  }
  __syncwarp();
  for (int p = lane; p < pieces; p += WARP_SIZE) {
    const float cf = coef[p / head_pieces];
    const x128 yy = load128(y_row + p * x128::size), vv = load128(v_row + p * x128::size);
    x128 o;
    for (int k = 0; k < x128::size; k++) o[k] = (floatX)((float)yy[k] - (float)(floatX)(cf * (float)vv[k]));
    store128(out + (size_t)row * C + p * x128::size, o);
  }
}

// With g = dout, per row and head: gv = g . v, a = s gv / den, dy = g - a v, dv = -coef g - a y + b v
// (b = 2 s gv dot / den^2, 0 where clamped), dalpha = -(dot / den) gv (1 - tanh(alpha)^2). Grid
// kRowBlocks of kXsaWarps warps, warp w taking its block's rows w, w + 8, ... in turn; the block's
// dalpha sums, warps in order, into partials[block][NH] with a shared alpha; with alpha's rows each
// row's dalpha written into dalpha_rows (partials unused).
__global__ void xsa_backward_kernel(floatX* dy, floatX* dv, float* partials, const floatX* dout, const floatX* y,
                                    const floatX* v, int ld_v, GateRows alpha, GateGradient dalpha_rows, int N,
                                    int NH, int C) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int pieces = C / x128::size, head_pieces = pieces / NH;
  float* piece_yv = shared + warp * xsa_warp_floats(NH, C);
  float* piece_vv = piece_yv + pieces;
  float* piece_gv = piece_vv + pieces;
  float* coef = piece_gv + pieces;
  float* dy_v = coef + NH;
  float* dv_v = dy_v + NH;
  float* dalpha = dv_v + NH;
  for (int h = lane; h < NH; h += WARP_SIZE) dalpha[h] = 0.0f;
  const int rpb = rows_per_block(N), r0 = blockIdx.x * rpb, r1 = min(N, r0 + rpb);
  for (int row = r0 + warp; row < r1; row += kXsaWarps) {
    const floatX* y_row = y + (size_t)row * C;
    const floatX* v_row = v + (size_t)row * ld_v;
    const floatX* g_row = dout + (size_t)row * C;
    xsa_piece_sums(piece_yv, piece_vv, y_row, v_row, pieces, lane);
    for (int p = lane; p < pieces; p += WARP_SIZE) {
      const x128 g = load128(g_row + p * x128::size), vv = load128(v_row + p * x128::size);
      float gv = 0.0f;
      for (int k = 0; k < x128::size; k++) gv += (float)g[k] * (float)vv[k];
      piece_gv[p] = gv;
    }
    __syncwarp();
    for (int h = lane; h < NH; h += WARP_SIZE) {
      const float t = tanhf(alpha.at(row, h)), s = (float)(floatX)t;
      const XsaHead x = xsa_head(piece_yv, piece_vv, h, head_pieces, s);
      float gv = 0.0f;
      for (int p = h * head_pieces; p < (h + 1) * head_pieces; p++) gv += piece_gv[p];
      coef[h] = x.coef;
      dy_v[h] = s * gv / x.den;
      dv_v[h] = x.clamped ? 0.0f : 2.0f * s * gv * x.dot / (x.den * x.den);
      const float da = -(x.dot / x.den) * gv * (1.0f - t * t);
      if (alpha.stride == 0) {
        dalpha[h] += da;
      } else {
        dalpha_rows.values[(size_t)row * dalpha_rows.stride + h] = (floatX)da;
      }
    }
    __syncwarp();
    for (int p = lane; p < pieces; p += WARP_SIZE) {
      const int c = p * x128::size, h = p / head_pieces;
      const x128 g = load128(g_row + c), yy = load128(y_row + c), vv = load128(v_row + c);
      x128 dy_o, dv_o;
      for (int k = 0; k < x128::size; k++) {
        dy_o[k] = (floatX)((float)g[k] - dy_v[h] * (float)vv[k]);
        dv_o[k] = (floatX)(-coef[h] * (float)g[k] - dy_v[h] * (float)yy[k] + dv_v[h] * (float)vv[k]);
      }
      store128(dy + (size_t)row * C + c, dy_o);
      store128(dv + (size_t)row * C + c, dv_o);
    }
    __syncwarp();  // the row's shared values are the next row's
  }
  if (alpha.stride > 0) return;
  __syncthreads();
  for (int h = threadIdx.x; h < NH; h += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kXsaWarps; w++) sum += shared[w * xsa_warp_floats(NH, C) + 3 * pieces + 3 * NH + h];
    partials[(size_t)blockIdx.x * NH + h] = sum;
  }
}

void xsa_check(const char* name, const floatX* y, const floatX* v, int ld_v, const GateRows& alpha, int N, int NH,
               int C) {
  REQUIRE(y && v && alpha.values, "%s: XSA needs the attention's output, its values and the strengths", name);
  REQUIRE(N > 0 && NH > 0 && C % NH == 0 && (C / NH) % x128::size == 0 && ld_v >= C && ld_v % x128::size == 0,
          "%s: N=%d, NH=%d, C=%d, ld_v=%d: N and NH must be positive, the head size C/NH a whole multiple of %d, "
          "and v's rows at least C apart, a multiple of %d", name, N, NH, C, ld_v, x128::size, x128::size);
  gate_check(name, alpha, nullptr, NH);
}

size_t xsa_shared_bytes(int NH, int C) { return sizeof(float) * kXsaWarps * (size_t)xsa_warp_floats(NH, C); }

// out [N, C] = XSA of y [N, C] with v (rows ld_v apart) and alpha (NH values, shared or a row's); out
// must not be y or v.
void xsa_forward(floatX* out, const floatX* y, const floatX* v, int ld_v, GateRows alpha, int N, int NH, int C,
                 cudaStream_t stream) {
  xsa_check("xsa_forward", y, v, ld_v, alpha, N, NH, C);
  REQUIRE(out != y && out != v, "xsa_forward: out must not share memory with y or v");
  const size_t shared = xsa_shared_bytes(NH, C);
  cudaCheck(cudaFuncSetAttribute(xsa_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  xsa_forward_kernel<<<ceil_div(N, kXsaWarps), kXsaWarps * WARP_SIZE, shared, stream>>>(out, y, v, ld_v, alpha, N,
                                                                                       NH, C);
  cudaCheckLaunch();
}

// From dout [N, C], the gradient of the forward's out: dy [N, C] (written; may be dout itself), dv
// [N, C] (written, rows C apart; not dout), dalpha (GateGradient: a shared alpha's [NH] += the rows'
// sum, stochastic rounding from seed; a row's written). partials: xsa_backward_partials(NH) floats.
size_t xsa_backward_partials(int NH) { return (size_t)kRowBlocks * NH; }
void xsa_backward(floatX* dy, floatX* dv, GateGradient dalpha, float* partials, const floatX* dout, const floatX* y,
                  const floatX* v, int ld_v, GateRows alpha, int N, int NH, int C, uint32_t seed,
                  cudaStream_t stream) {
  const char* name = "xsa_backward";
  xsa_check(name, y, v, ld_v, alpha, N, NH, C);
  gate_check(name, alpha, &dalpha, NH);
  REQUIRE(dy && dv && partials && dv != dout && dv != dy,
          "%s: dy, dv and the partials are needed, dv apart from dout and dy", name);
  const size_t shared = xsa_shared_bytes(NH, C);
  cudaCheck(cudaFuncSetAttribute(xsa_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  xsa_backward_kernel<<<kRowBlocks, kXsaWarps * WARP_SIZE, shared, stream>>>(dy, dv, partials, dout, y, v, ld_v,
                                                                           alpha, dalpha, N, NH, C);
  cudaCheckLaunch();
  if (alpha.stride == 0) column_sum_finalize(dalpha.values, partials, NH, NH, kRowBlocks, seed, stream);
}

// ---- Record #89's composed attention (SPEC "Record #89's composed attention") ----
// On layer 10 each head's attention output y [N, C] gains w_out_h (A v_h) a query t: P_h[t, j] head h's
// softmax of scale q_h[t] . k_h[j] over the keys j with 0 <= t - j < window in t's row and document (its
// own softmax, apart from the flash attention's window), A[t, j] = sum_h w_in_h P_h[t, j] (heads in
// order, FP32), w_in the RMS norm over the heads of a row's NH gate values (eps kComposedNormEps, FP32,
// rounded to floatX), w_out a row's values as they are; w_out_h A rounded to floatX, its products with
// v_h summed in FP32 (keys from t back), added to y and rounded once. q, k, v: qkv [N, 3C] as the
// attention read them. The forward keeps each head's log-sum-exp [N, NH] for the backward, which
// computes the probabilities again: a pass over the queries (dq, the gates' gradients, each head's D =
// sum_j P dP), then one over the keys (dk, dv, summing over the queries that see each), each output
// written by one thread in a fixed order: deterministic. BF16 builds run the kernels on the tensor
// cores, a block a tile of 64 positions (section 6's end); FP32 builds the plain version here: one
// block a query (or key), a warp a head (lanes over the keys for the scores, over the head's
// dimensions for the products), the other side's rows read from global memory (L2 holds a window of
// them: 112 rows of 4.5 KB). Work: 4 window HS FLOPs a token and head forward, about 2.5 times that
// backward.
constexpr float kComposedNormEps = 1e-6f;
constexpr int kComposedMaxWindow = 128;

// Which keys a query sees: the rows are T tokens long; documents (each token's id, or null: one a
// row) as the flash kernels' DocumentWindow holds them; none before `first` (the decoder's document
// start).
struct ComposedKeys {
  const int* documents;
  int T, window, first;
  __device__ __forceinline__ bool sees(int t, int j) const {
    return j <= t && j >= first && t - j < window && j / T == t / T &&
           (!documents || documents[j] == documents[t]);
  }
};

// Where the forward finds its operands: query row r's head h at q + r q_row + h HS, key position j's
// head h at k + j kv_row + h kv_head (v the same): qkv's rows in a training pass (composed_rows_of),
// the token's row and the layer's KV cache [NH, max_t, HS] in decoding.
struct ComposedOperands {
  const floatX* q;
  const floatX* k;
  const floatX* v;
  size_t q_row, kv_row, kv_head;
  __device__ __forceinline__ const floatX* key(int j, int h) const { return k + (size_t)j * kv_row + h * kv_head; }
  __device__ __forceinline__ const floatX* value(int j, int h) const { return v + (size_t)j * kv_row + h * kv_head; }
};

__host__ __device__ inline ComposedOperands composed_rows_of(const floatX* qkv, int C, int HS) {
  return {qkv, qkv + C, qkv + 2 * C, (size_t)3 * C, (size_t)3 * C, (size_t)HS};
}

// A row's w_in normed over the heads: the FP32 value into normed_f32 (the backward's) and its
// floatX rounding, the forward's weight, into normed; returns 1 / sqrt(mean(w^2) + eps).
__device__ float composed_norm(float* normed, float* normed_f32, const GateRows& w_in, size_t row, int NH) {
  float squares = 0.0f;
  for (int h = 0; h < NH; h++) squares += w_in.at(row, h) * w_in.at(row, h);
  const float inv = rsqrtf(squares / (float)NH + kComposedNormEps);
  for (int h = 0; h < NH; h++) {
    normed_f32[h] = w_in.at(row, h) * inv;
    normed[h] = (float)(floatX)normed_f32[h];
  }
  return inv;
}

// FP32 dot of two floatX rows of n values (n a multiple of x128::size), pieces in order.
__device__ __forceinline__ float composed_dot(const floatX* a, const floatX* b, int n) {
  float sum = 0.0f;
  for (int p = 0; p < n; p += x128::size) {
    const x128 x = load128(a + p), y = load128(b + p);
    for (int k = 0; k < x128::size; k++) sum += (float)x[k] * (float)y[k];
  }
  return sum;
}

// Shared floats a block: P [NH, window] and A [window] (the forward), with G [NH, window] and dA
// [window] (the backward), and a few per head.
__host__ __device__ inline int composed_shared_floats(int NH, int window) { return 2 * (NH + 1) * window + 8 * NH; }

// Warp h's probabilities of query row `row` (at position t) over offsets o = t - j < window into P[o]
// (0 where t does not see j), from the scores itself (lse null: the row's max and sum, its log-sum-exp
// into lse_out) or from the forward's log-sum-exp.
__device__ void composed_probs(float* P, const ComposedOperands& ops, int row, int t, int h, int HS, float scale,
                               const ComposedKeys& keys, const float* lse, float* lse_out, int NH) {
  const int lane = threadIdx.x % WARP_SIZE;
  const floatX* q = ops.q + row * ops.q_row + h * HS;
  float max_score = -INFINITY;
  for (int o = lane; o < keys.window; o += WARP_SIZE) {
    const int j = t - o;
    const bool seen = j >= 0 && keys.sees(t, j);
    P[o] = seen ? scale * composed_dot(q, ops.key(j, h), HS) : -INFINITY;
    max_score = fmaxf(max_score, P[o]);
  }
  if (lse) {
    const float l = lse[(size_t)row * NH + h];
    for (int o = lane; o < keys.window; o += WARP_SIZE) P[o] = P[o] == -INFINITY ? 0.0f : expf(P[o] - l);
    return;
  }
  max_score = warp_reduce_max(max_score);  // t sees itself: finite
  float sum = 0.0f;
  for (int o = lane; o < keys.window; o += WARP_SIZE) {
    P[o] = P[o] == -INFINITY ? 0.0f : expf(P[o] - max_score);
    sum += P[o];
  }
  sum = warp_reduce_sum(sum);
  for (int o = lane; o < keys.window; o += WARP_SIZE) P[o] /= sum;
  if (lane == 0) lse_out[(size_t)row * NH + h] = max_score + logf(sum);
}

#if defined(ENABLE_FP32)
// Block r: query row r at position position0 + r (training: 0; decoding: the token's).
__global__ void composed_attention_forward_kernel(floatX* out, float* lse, const floatX* y, ComposedOperands ops,
                                                  int position0, GateRows w_in, GateRows w_out, ComposedKeys keys,
                                                  float scale, int NH, int C) {
  extern __shared__ float shared[];
  const int row = blockIdx.x, t = position0 + row, h = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int HS = C / NH, W = keys.window;
  float* P = shared + h * W;
  float* A = shared + NH * W;
  float* normed = A + W;
  if (threadIdx.x == 0) composed_norm(normed, normed + NH, w_in, row, NH);
  composed_probs(P, ops, row, t, h, HS, scale, keys, nullptr, lse, NH);
  __syncthreads();
  for (int o = threadIdx.x; o < W; o += blockDim.x) {
    float a = normed[0] * shared[o];
    for (int g = 1; g < NH; g++) a += normed[g] * shared[g * W + o];
    A[o] = a;
  }
  __syncthreads();
  const float wo = w_out.at(row, h);
  const int last = min(W, t % keys.T + 1);  // the offsets inside the row
  for (int d = lane * x128::size; d < HS; d += WARP_SIZE * x128::size) {
    float acc[x128::size] = {};
    for (int o = 0; o < last; o++) {
      if (!keys.sees(t, t - o)) continue;
      const float weight = (float)(floatX)(wo * A[o]);
      const x128 v = load128(ops.value(t - o, h) + d);
      for (int k = 0; k < x128::size; k++) acc[k] += weight * (float)v[k];
    }
    const size_t at = (size_t)row * C + h * HS + d;
    const x128 base = load128(y + at);
    x128 o_;
    for (int k = 0; k < x128::size; k++) o_[k] = (floatX)((float)base[k] + acc[k]);
    store128(out + at, o_);
  }
}
// The backward's per-query pass: P again (from lse), G_h[o] = dout_h . v_h[t - o], dA = sum_h w_out_h G_h,
// then dw_out_h = sum_o A G_h, dwn_h = sum_o dA P_h (the normed w_in's gradient; through the norm into
// dw_in), D_h = wn_h dwn_h (kept for the per-key pass), dS_h = P_h (wn_h dA - D_h) and dq_h = scale
// sum_o dS_h k_h[t - o], added into dqkv's q.
__global__ void composed_attention_dq_kernel(floatX* dqkv, float* D, GateGradient dw_in, GateGradient dw_out,
                                             const floatX* dout, const floatX* qkv, const float* lse,
                                             GateRows w_in, GateRows w_out, ComposedKeys keys, float scale,
                                             int NH, int C) {
  extern __shared__ float shared[];
  const int t = blockIdx.x, h = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, HS = C / NH;
  const int W = keys.window;
  float* P = shared;           // [NH, W]
  float* G = P + NH * W;       // [NH, W]
  float* A = G + NH * W;       // [W]
  float* dA = A + W;           // [W]
  float* normed = dA + W;      // [NH] rounded, then [NH] FP32
  float* dwn = normed + 2 * NH;
  float* inv = dwn + NH;
  if (threadIdx.x == 0) inv[0] = composed_norm(normed, normed + NH, w_in, t, NH);
  composed_probs(P + h * W, composed_rows_of(qkv, C, HS), t, t, h, HS, scale, keys, lse, nullptr, NH);
  const floatX* g_row = dout + (size_t)t * C + h * HS;
  for (int o = lane; o < W; o += WARP_SIZE) {
    const int j = t - o;
    G[h * W + o] = j >= 0 && keys.sees(t, j) ? composed_dot(g_row, qkv + (size_t)j * 3 * C + 2 * C + h * HS, HS)
                                               : 0.0f;
  }
  __syncthreads();
  for (int o = threadIdx.x; o < W; o += blockDim.x) {
    float a = normed[0] * P[o], da = w_out.at(t, 0) * G[o];
    for (int g = 1; g < NH; g++) {
      a += normed[g] * P[g * W + o];
      da += w_out.at(t, g) * G[g * W + o];
    }
    A[o] = a;
    dA[o] = da;
  }
  __syncthreads();
  float dwo = 0.0f, dw = 0.0f;
  for (int o = lane; o < W; o += WARP_SIZE) {
    dwo += A[o] * G[h * W + o];
    dw += dA[o] * P[h * W + o];
  }
  dwo = warp_reduce_sum(dwo);
  dw = warp_reduce_sum(dw);
  const float wn = normed[h], d_h = wn * dw;
  if (lane == 0) {
    dwn[h] = dw;
    D[(size_t)t * NH + h] = d_h;
    dw_out.values[(size_t)t * dw_out.stride + h] = (floatX)dwo;
  }
  const int last = min(W, t % keys.T + 1);
  for (int d = lane * x128::size; d < HS; d += WARP_SIZE * x128::size) {
    float acc[x128::size] = {};
    for (int o = 0; o < last; o++) {
      if (!keys.sees(t, t - o)) continue;
      const float ds = P[h * W + o] * (wn * dA[o] - d_h);
      const x128 k = load128(qkv + (size_t)(t - o) * 3 * C + C + h * HS + d);
      for (int i = 0; i < x128::size; i++) acc[i] += ds * (float)k[i];
    }
    floatX* dq = dqkv + (size_t)t * 3 * C + h * HS + d;
    const x128 old = load128(dq);
    x128 sum;
    for (int i = 0; i < x128::size; i++) sum[i] = (floatX)((float)old[i] + scale * acc[i]);
    store128(dq, sum);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // through the norm: dw = (dwn - wn (mean of dwn wn)) / rms, wn in FP32
    const float* wn32 = normed + NH;
    float mean = 0.0f;
    for (int g = 0; g < NH; g++) mean += dwn[g] * wn32[g];
    mean /= (float)NH;
    floatX* row = dw_in.values + (size_t)t * dw_in.stride;
    for (int g = 0; g < NH; g++) row[g] = (floatX)((dwn[g] - wn32[g] * mean) * inv[0]);
  }
}

// Shared floats of the per-key pass: P, G [NH, W], A, dA [W], and each query's wn, w_out and D [W, NH].
__host__ __device__ inline int composed_key_shared_floats(int NH, int window) { return (5 * NH + 2) * window; }

// The backward's per-key pass, key j against the queries t = j + o that see it: P_h, G_h, A, dA as the
// per-query pass has them, then dk_h = scale sum_o dS_h q_h[t] and dv_h = sum_o round(w_out_h A) dout_h[t],
// added into dqkv's k and v.
__global__ void composed_attention_dkdv_kernel(floatX* dqkv, const float* D, const floatX* dout, const floatX* qkv,
                                               const float* lse, GateRows w_in, GateRows w_out, ComposedKeys keys,
                                               float scale, int N, int NH, int C) {
  extern __shared__ float shared[];
  const int j = blockIdx.x, h = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, HS = C / NH;
  const int W = keys.window;
  float* P = shared;             // [NH, W]
  float* G = P + NH * W;         // [NH, W]
  float* A = G + NH * W;         // [W]
  float* dA = A + W;             // [W]
  float* normed = dA + W;        // [W, NH]
  float* wo = normed + W * NH;   // [W, NH]
  float* Dq = wo + W * NH;       // [W, NH]
  for (int o = threadIdx.x; o < W; o += blockDim.x) {
    const int t = j + o;
    if (t >= N || !keys.sees(t, j)) continue;
    float f32[llmc::kMuddGateHeads];
    composed_norm(normed + o * NH, f32, w_in, t, NH);
    for (int g = 0; g < NH; g++) {
      wo[o * NH + g] = w_out.at(t, g);
      Dq[o * NH + g] = D[(size_t)t * NH + g];
    }
  }
  const floatX* k_row = qkv + (size_t)j * 3 * C + C + h * HS;
  const floatX* v_row = k_row + C;
  for (int o = lane; o < W; o += WARP_SIZE) {
    const int t = j + o;
    const bool seen = t < N && keys.sees(t, j);
    P[h * W + o] = seen ? expf(scale * composed_dot(qkv + (size_t)t * 3 * C + h * HS, k_row, HS) -
                               lse[(size_t)t * NH + h])
                        : 0.0f;
    G[h * W + o] = seen ? composed_dot(dout + (size_t)t * C + h * HS, v_row, HS) : 0.0f;
  }
  __syncthreads();
  for (int o = threadIdx.x; o < W; o += blockDim.x) {
    float a = 0.0f, da = 0.0f;
    if (j + o < N && keys.sees(j + o, j)) {
      a = normed[o * NH] * P[o];
      da = wo[o * NH] * G[o];
      for (int g = 1; g < NH; g++) {
        a += normed[o * NH + g] * P[g * W + o];
        da += wo[o * NH + g] * G[g * W + o];
      }
    }
    A[o] = a;
    dA[o] = da;
  }
  __syncthreads();
  const int last = min(W, keys.T - j % keys.T);  // the queries inside the row
  for (int d = lane * x128::size; d < HS; d += WARP_SIZE * x128::size) {
    float dk[x128::size] = {}, dv[x128::size] = {};
    for (int o = 0; o < last; o++) {
      const int t = j + o;
      if (!keys.sees(t, j)) continue;
      const float ds = P[h * W + o] * (normed[o * NH + h] * dA[o] - Dq[o * NH + h]);
      const float weight = (float)(floatX)(wo[o * NH + h] * A[o]);
      const x128 q = load128(qkv + (size_t)t * 3 * C + h * HS + d), g = load128(dout + (size_t)t * C + h * HS + d);
      for (int i = 0; i < x128::size; i++) {
        dk[i] += ds * (float)q[i];
        dv[i] += weight * (float)g[i];
      }
    }
    floatX* dk_at = dqkv + (size_t)j * 3 * C + C + h * HS + d;
    floatX* dv_at = dk_at + C;
    const x128 old_k = load128(dk_at), old_v = load128(dv_at);
    x128 new_k, new_v;
    for (int i = 0; i < x128::size; i++) {
      new_k[i] = (floatX)((float)old_k[i] + scale * dk[i]);
      new_v[i] = (floatX)((float)old_v[i] + dv[i]);
    }
    store128(dk_at, new_k);
    store128(dv_at, new_v);
  }
}
#endif  // ENABLE_FP32: the BF16 build's kernels are the tiles of section 6's end

void composed_check(const char* name, const floatX* qkv, const GateRows& w_in, const GateRows& w_out, int T,
                    int window, int N, int NH, int C) {
  REQUIRE(qkv, "%s: the composed attention needs qkv", name);
  REQUIRE(N > 0 && T > 0 && N % T == 0 && NH > 0 && NH <= llmc::kMuddGateHeads && C % NH == 0 &&
              (C / NH) % x128::size == 0 && window > 0 && window <= kComposedMaxWindow,
          "%s: N=%d T=%d NH=%d C=%d window=%d: N a multiple of T, 1 to %d heads of a size that is a multiple of %d, "
          "a window of 1 to %d keys", name, N, T, NH, C, window, llmc::kMuddGateHeads, x128::size, kComposedMaxWindow);
  gate_check(name, w_in, nullptr, NH);
  gate_check(name, w_out, nullptr, NH);
  REQUIRE(w_in.stride > 0 && w_out.stride > 0, "%s: w_in and w_out are a row's (stride > 0)", name);
}

#if !defined(ENABLE_FP32)
// The forward and backward on the tensor cores (below, after the flash kernels whose tiles they use).
void composed_forward_by_head_size(floatX* out, float* lse, const floatX* y, const ComposedOperands& ops,
                                   const int* documents, int rows, int T, int window, int decode_t, int first,
                                   GateRows w_in, GateRows w_out, float scale, int NH, int C, cudaStream_t stream);
void composed_backward_by_head_size(floatX* dqkv, GateGradient dw_in, GateGradient dw_out, float* D,
                                    const floatX* dout, const floatX* qkv, const float* lse, GateRows w_in,
                                    GateRows w_out, const int* documents, int rows, int T, int window, float scale,
                                    int NH, int C, cudaStream_t stream);
#endif

// out [N, C] = y plus the composition (may be y itself: in place); lse [N, NH] written for the
// backward. documents: each token's document id [N], or null (one document a row of T).
void composed_attention_forward(floatX* out, float* lse, const floatX* y, const floatX* qkv, GateRows w_in,
                                GateRows w_out, const int* documents, int T, int window, float scale, int N, int NH,
                                int C, cudaStream_t stream) {
  composed_check("composed_attention_forward", qkv, w_in, w_out, T, window, N, NH, C);
  REQUIRE(out && lse && y, "composed_attention_forward: out, lse and y are needed");
  const ComposedOperands ops = composed_rows_of(qkv, C, C / NH);
#if defined(ENABLE_FP32)
  const size_t shared = sizeof(float) * composed_shared_floats(NH, window);
  composed_attention_forward_kernel<<<N, NH * WARP_SIZE, shared, stream>>>(out, lse, y, ops, 0, w_in, w_out,
                                                                           {documents, T, window, 0}, scale, NH, C);
  cudaCheckLaunch();
#else
  composed_forward_by_head_size(out, lse, y, ops, documents, N / T, T, window, -1, 0, w_in, w_out, scale, NH, C,
                                stream);
#endif
}

// Decoding: the token at position t (qkv_row [3C], out and y [C], w_in and w_out its rows) against the
// layer's KV cache [NH, max_t, HS], which holds its own key and value already, from first_key (its
// document's start) on; lse: NH floats of scratch. The same kernel as the rows' forward: its bits.
void composed_attention_decode(floatX* out, float* lse, const floatX* y, const floatX* qkv_row, const floatX* k_cache,
                               const floatX* v_cache, GateRows w_in, GateRows w_out, int first_key, int t, int max_t,
                               int window, float scale, int NH, int C, cudaStream_t stream) {
  composed_check("composed_attention_decode", qkv_row, w_in, w_out, max_t, window, max_t, NH, C);
  REQUIRE(out && lse && y && k_cache && v_cache && first_key >= 0 && first_key <= t && t < max_t,
          "composed_attention_decode: out, lse, y and the caches are needed, and 0 <= first key %d <= position "
          "%d < %d", first_key, t, max_t);
  const int HS = C / NH;
  const ComposedOperands ops{qkv_row, k_cache, v_cache, 0, (size_t)HS, (size_t)max_t * HS};
#if defined(ENABLE_FP32)
  const size_t shared = sizeof(float) * composed_shared_floats(NH, window);
  composed_attention_forward_kernel<<<1, NH * WARP_SIZE, shared, stream>>>(
      out, lse, y, ops, t, w_in, w_out, {nullptr, max_t, window, first_key}, scale, NH, C);
  cudaCheckLaunch();
#else
  composed_forward_by_head_size(out, lse, y, ops, nullptr, 1, max_t, window, t, first_key, w_in, w_out, scale, NH,
                                C, stream);
#endif
}

// From dout [N, C], the gradient of the forward's out (y's is dout itself): q's, k's and v's gradients
// added into dqkv [N, 3C]; w_in's and w_out's written into their rows (dw_in, dw_out: a row's NH values);
// D: [N, NH] floats of scratch. lse: the forward's.
void composed_attention_backward(floatX* dqkv, GateGradient dw_in, GateGradient dw_out, float* D, const floatX* dout,
                                 const floatX* qkv, const float* lse, GateRows w_in, GateRows w_out,
                                 const int* documents, int T, int window, float scale, int N, int NH, int C,
                                 cudaStream_t stream) {
  const char* name = "composed_attention_backward";
  composed_check(name, qkv, w_in, w_out, T, window, N, NH, C);
  gate_check(name, w_in, &dw_in, NH);
  gate_check(name, w_out, &dw_out, NH);
  REQUIRE(dqkv && D && dout && lse, "%s: dqkv, the scratch D, dout and lse are needed", name);
#if !defined(ENABLE_FP32)
  composed_backward_by_head_size(dqkv, dw_in, dw_out, D, dout, qkv, lse, w_in, w_out, documents, N / T, T, window,
                                 scale, NH, C, stream);
#else
  const ComposedKeys keys{documents, T, window, 0};
  const size_t shared = sizeof(float) * composed_shared_floats(NH, window);
  composed_attention_dq_kernel<<<N, NH * WARP_SIZE, shared, stream>>>(dqkv, D, dw_in, dw_out, dout, qkv, lse, w_in,
                                                                     w_out, keys, scale, NH, C);
  cudaCheckLaunch();
  const size_t key_shared = sizeof(float) * composed_key_shared_floats(NH, window);
  composed_attention_dkdv_kernel<<<N, NH * WARP_SIZE, key_shared, stream>>>(dqkv, D, dout, qkv, lse, w_in, w_out,
                                                                           keys, scale, N, NH, C);
  cudaCheckLaunch();
#endif
}

// ---- Record #89's head gates (SPEC "Record #89's plan") ----
// In the plan's head-gate layers each head's attention output (XSA's where the layer has it) is
// scaled by its gate before the output projection: out = y g_h, g [NH] on the device (or MUDD's
// g_n,h a row: GateRows), the product rounded once (as train_gpt2.py's tensor product). Backward: dy
// = g_h dout (in place allowed) and a shared gate's dg_h += the sum of dout . y over the head's
// columns and the rows, by row blocks (section 2): each thread its 16-byte pieces in order, a head's
// sums over the block in block_reduce_sum's tree; a row's gate's dg_n,h = the sum over the head's
// columns of the row, one warp a row, its pieces' sums added in order. Floor: forward reads NC,
// writes NC; backward reads 2NC, writes NC; memory-bound.
constexpr int kHeadGateThreads = 256;
constexpr int kHeadGateMaxHeads = 32;

__global__ void head_gate_forward_kernel(floatX* out, const floatX* y, GateRows gate, size_t n, int C, int HS) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= n) return;
  const float g = gate.at(i / C, (int)(i % C) / HS);
  const x128 v = load128(y + i);
  x128 o;
  for (int k = 0; k < x128::size; k++) o[k] = (floatX)((float)v[k] * g);
  store128(out + i, o);
}

// grid kRowBlocks: block b takes its rows' pieces, thread by thread; partials[b][h] its heads' sums.
__global__ void head_gate_backward_kernel(floatX* dy, float* partials, const floatX* dout, const floatX* y,
                                          const floatX* gate, int N, int NH, int C) {
  __shared__ float shared[WARP_SIZE];
  const int HS = C / NH;
  const RowBlockRange range = row_block_range(N, C);
  float sums[kHeadGateMaxHeads] = {};
  for (size_t i = range.begin + threadIdx.x * x128::size; i < range.end; i += blockDim.x * x128::size) {
    const int h = (int)(i % C) / HS;
    const float g = (float)gate[h];
    const x128 d = load128(dout + i), v = load128(y + i);
    x128 o;
    float sum = 0.0f;
    for (int k = 0; k < x128::size; k++) {
      sum += (float)d[k] * (float)v[k];
      o[k] = (floatX)((float)d[k] * g);
    }
    sums[h] += sum;
    store128(dy + i, o);
  }
  for (int h = 0; h < NH; h++) {
    const float total = block_reduce_sum(sums[h], shared);
    if (threadIdx.x == 0) partials[blockIdx.x * NH + h] = total;
  }
}

// A gate a row: one warp a row (kHeadGateThreads / 32 rows a block), a lane its 16-byte pieces in
// order, each piece's sum into the warp's shared floats [C / 8], then lane h adds head h's pieces in
// order and writes dgate's row.
__global__ void head_gate_row_gates_backward_kernel(floatX* dy, GateGradient dgate, const floatX* dout,
                                                    const floatX* y, GateRows gate, int N, int NH, int C) {
  extern __shared__ float piece_sums[];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int pieces = C / x128::size, head_pieces = pieces / NH;
  const int row = blockIdx.x * (kHeadGateThreads / WARP_SIZE) + warp;
  if (row >= N) return;
  float* sums = piece_sums + warp * pieces;
  const size_t base = (size_t)row * C;
  for (int p = lane; p < pieces; p += WARP_SIZE) {
    const int c = p * x128::size;
    const float g = gate.at(row, p / head_pieces);
    const x128 d = load128(dout + base + c), v = load128(y + base + c);
    x128 o;
    float sum = 0.0f;
    for (int k = 0; k < x128::size; k++) {
      sum += (float)d[k] * (float)v[k];
      o[k] = (floatX)((float)d[k] * g);
    }
    sums[p] = sum;
    store128(dy + base + c, o);
  }
  __syncwarp();
  for (int h = lane; h < NH; h += WARP_SIZE) {
    float sum = 0.0f;
    for (int p = h * head_pieces; p < (h + 1) * head_pieces; p++) sum += sums[p];
    dgate.values[(size_t)row * dgate.stride + h] = (floatX)sum;
  }
}

void head_gate_check(const char* name, int N, int NH, int C) {
  REQUIRE(N > 0 && NH > 0 && NH <= kHeadGateMaxHeads && C % NH == 0 && (C / NH) % x128::size == 0,
          "%s: %d rows of %d heads in %d channels (up to %d heads, each a multiple of %d channels)", name, N, NH, C,
          kHeadGateMaxHeads, x128::size);
}

// out [N, C] = y with each head's columns times its gate g (NH values, shared or a row's).
void head_gate_forward(floatX* out, const floatX* y, GateRows gate, int N, int NH, int C, cudaStream_t stream) {
  head_gate_check("head_gate_forward", N, NH, C);
  gate_check("head_gate_forward", gate, nullptr, NH);
  const size_t n = (size_t)N * C;
  head_gate_forward_kernel<<<ceil_div(n / x128::size, kHeadGateThreads), kHeadGateThreads, 0, stream>>>(out, y, gate,
                                                                                                       n, C, C / NH);
  cudaCheckLaunch();
}

// From dout, the gradient of head_gate_forward's out: dy = g dout (dy may be dout), and the gate's
// gradient (GateGradient: a shared gate's += the sums of dout . y by head, stochastic rounding from
// seed; a row's written); partials: kRowBlocks x NH floats (unused with rows).
void head_gate_backward(floatX* dy, GateGradient dgate, float* partials, const floatX* dout, const floatX* y,
                        GateRows gate, int N, int NH, int C, uint32_t seed, cudaStream_t stream) {
  const char* name = "head_gate_backward";
  head_gate_check(name, N, NH, C);
  gate_check(name, gate, &dgate, NH);
  if (gate.stride > 0) {
    const size_t shared = sizeof(float) * (kHeadGateThreads / WARP_SIZE) * (C / x128::size);
    cudaCheck(cudaFuncSetAttribute(head_gate_row_gates_backward_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    head_gate_row_gates_backward_kernel<<<ceil_div(N, kHeadGateThreads / WARP_SIZE), kHeadGateThreads, shared,
                                          stream>>>(dy, dgate, dout, y, gate, N, NH, C);
    cudaCheckLaunch();
    return;
  }
  head_gate_backward_kernel<<<kRowBlocks, kHeadGateThreads, 0, stream>>>(dy, partials, dout, y, gate.values, N, NH,
                                                                         C);
  cudaCheckLaunch();
  column_sum_finalize(dgate.values, partials, NH, NH, kRowBlocks, seed, stream);
}

// ---- Document-causal attention within a window of 128-token blocks (llmc/attention_blocks.h) ----
// A query attends to the earlier keys of its own document inside the run of key blocks that
// attention_window_select gives its 128-token block: modded-nanogpt's block mask, or with a window
// in tokens also only to the keys at most that many tokens back (FlashAttention's window). The
// kernels mask token by token only in a selection's partial blocks, the window's edge among them.
// documents[b][t] is any id that differs between documents (attention_block_spans' tokens give
// them); spans[b][q] is the span of query block q of sequence b. T is a multiple of 128.
struct DocumentWindow {
  const llmc::AttentionBlockSpan* spans;  // [B, T / kAttentionBlock]
  const int* documents;                   // [B, T]
  llmc::AttentionWindow window;           // blocks (0: the query's own block only) or tokens
};

// ---- Causal attention through batched GEMMs (FP32 builds, head sizes flash does not take) ----
// Causal multi-head attention from qkv[B, T, 3, NH, HS]: q, k, v are permuted to [B, NH, T, HS],
// preatt = q k^T by strided batched GEMMs, a fused causal softmax (FP32 math, one warp per row) of
// scale * preatt gives att[B, NH, T, T] (kept for the backward pass), y = att v, and y is
// permuted back to [B, T, C]; attention within documents (DocumentWindow) masks more keys in the
// softmax. FLOPs: 4*B*NH*T*T*HS forward (half of it masked), 8*... backward; bytes: dominated by
// the B*NH*T*T attention matrix. Every attention kernel takes the softmax
// scale from its caller: GPT-2's is attention_default_scale, the modern architecture's 0.12.

// GPT-2's softmax scale, 1/sqrt(HS), in the one expression whose bits every GPT-2 path uses (at
// head sizes 64 and 128 it equals the double-precision 1/sqrt(HS) rounded to float).
inline float attention_default_scale(int head_size) { return 1.0f / sqrtf((float)head_size); }

__global__ void attention_permute_kernel(floatX* q, floatX* k, floatX* v, const floatX* qkv, int B,
                                         int T, int NH, int HS) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)B * NH * T * HS) return;
  // idx indexes [b][h][t][d] of the permuted tensors.
  const int d = idx % HS, t = (idx / HS) % T, h = (idx / HS / T) % NH, b = idx / HS / T / NH;
  const size_t src = (((size_t)b * T + t) * 3 * NH + h) * HS + d;
  const size_t C = (size_t)NH * HS;
  q[idx] = qkv[src];
  k[idx] = qkv[src + C];
  v[idx] = qkv[src + 2 * C];
}

// Inverse of the permute for the gradients: dq, dk, dv [B, NH, T, HS] -> dqkv [B, T, 3, NH, HS].
__global__ void attention_permute_backward_kernel(floatX* dqkv, const floatX* dq, const floatX* dk,
                                                  const floatX* dv, int B, int T, int NH, int HS) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)B * NH * T * HS) return;
  const int d = idx % HS, t = (idx / HS) % T, h = (idx / HS / T) % NH, b = idx / HS / T / NH;
  const size_t dst = (((size_t)b * T + t) * 3 * NH + h) * HS + d;
  const size_t C = (size_t)NH * HS;
  dqkv[dst] = dq[idx];
  dqkv[dst + C] = dk[idx];
  dqkv[dst + 2 * C] = dv[idx];
}

// y [B, NH, T, HS] -> out [B, T, NH, HS], and its inverse for the gradient.
__global__ void attention_unpermute_kernel(floatX* out, const floatX* y, int B, int T, int NH,
                                           int HS, bool inverse) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)B * NH * T * HS) return;
  const int d = idx % HS, t = (idx / HS) % T, h = (idx / HS / T) % NH, b = idx / HS / T / NH;
  const size_t other = (((size_t)b * T + t) * NH + h) * HS + d;
  if (inverse) {
    out[idx] = y[other];
  } else {
    out[other] = y[idx];
  }
}

// One warp per row (b, h, t): att[j] = softmax over the keys j visible to t of scale * preatt[j],
// exactly 0 for the others. Causal (dw.spans null): j <= t. With documents (DocumentWindow) also
// j in t's document, in the run of blocks attention_window_select gives t's block and within a
// token window's reach. A masked key
// then has probability 0, and so the backward through att (attention_backward) gives it no
// gradient unchanged; the causal rows take the same arithmetic as without the mask.
__global__ void attention_softmax_forward_kernel(floatX* att, const floatX* preatt, int rows,
                                                 int T, int NH, float scale, DocumentWindow dw) {
  const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
  if (row >= rows) return;
  const int lane = threadIdx.x % WARP_SIZE, t = row % T;
  const floatX* x = preatt + (size_t)row * T;
  floatX* y = att + (size_t)row * T;
  int first_key = 0, document = 0;
  const int* documents = nullptr;
  if (dw.spans) {
    const int b = row / T / NH, q_block = t / llmc::kAttentionBlock;
    const llmc::AttentionBlockSelection selection = llmc::attention_window_select(
        dw.spans[(size_t)b * (T / llmc::kAttentionBlock) + q_block], q_block, dw.window);
    // t - reach: t less at most INT_MAX, which an int holds.
    first_key = max((q_block - selection.full - selection.partial + 1) * llmc::kAttentionBlock,
                    t - llmc::attention_window_reach(dw.window));
    documents = dw.documents + (size_t)b * T;
    document = documents[t];
  }
  auto visible = [&](int j) { return j >= first_key && (!documents || documents[j] == document); };
  float maxval = -FLT_MAX;
  for (int j = lane; j <= t; j += WARP_SIZE) {
    if (visible(j)) maxval = fmaxf(maxval, scale * (float)x[j]);
  }
  maxval = warp_reduce_max(maxval);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += WARP_SIZE) {
    if (visible(j)) sum += expf(scale * (float)x[j] - maxval);
  }
  const float inv_sum = 1.0f / warp_reduce_sum(sum);
  for (int j = lane; j < T; j += WARP_SIZE) {
    y[j] = j <= t && visible(j) ? (floatX)(expf(scale * (float)x[j] - maxval) * inv_sum) : (floatX)0.0f;
  }
}

// dpreatt[j] = scale * att[j] * (datt[j] - sum_i att[i] datt[i]) for j <= t, 0 above. In place.
__global__ void attention_softmax_backward_kernel(floatX* datt_to_dpreatt, const floatX* att,
                                                  int rows, int T, float scale) {
  const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
  if (row >= rows) return;
  const int lane = threadIdx.x % WARP_SIZE, t = row % T;
  floatX* d = datt_to_dpreatt + (size_t)row * T;
  const floatX* a = att + (size_t)row * T;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += WARP_SIZE) dot += (float)a[j] * (float)d[j];
  dot = warp_reduce_sum(dot);
  for (int j = lane; j < T; j += WARP_SIZE) {
    d[j] = j <= t ? (floatX)(scale * (float)a[j] * ((float)d[j] - dot)) : (floatX)0.0f;
  }
}

// Row-major batched C[M, N] = alpha * op(A)[M, K] op(B)[K, N] + beta * C over `batch` matrices.
void batched_matmul(floatX* c, const floatX* a, const floatX* b, int M, int N, int K, bool trans_a,
                    bool trans_b, long stride_a, long stride_b, long stride_c, int batch,
                    float alpha, float beta, cudaStream_t stream) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T; a row-major matrix is its
  // own transpose in column-major terms, so the operands swap and keep their op flags.
  cublasCheck(cublasSetStream(cublas_handle, stream));
  cublasCheck(cublasGemmStridedBatchedEx(
      cublas_handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N,
      M, K, &alpha, b, kCudaFloatX, trans_b ? K : N, stride_b, a, kCudaFloatX, trans_a ? M : K,
      stride_a, &beta, c, kCudaFloatX, N, stride_c, batch, cublas_compute_type,
      CUBLAS_GEMM_DEFAULT));
}

// out [B, T, C]; qkvr [3, B, NH, T, HS] receives q, k, v (kept for backward); att [B, NH, T, T]
// is kept too; preatt (B*NH*T*T) and y (B*T*C) are scratch. dw (optional): attention within the
// documents and window it gives (T a multiple of 128), else causal.
void attention_forward(floatX* out, floatX* qkvr, floatX* att, floatX* preatt, floatX* y,
                       const floatX* qkv, int B, int T, int C, int NH, float scale, cudaStream_t stream,
                       const DocumentWindow* dw = nullptr) {
  REQUIRE(!dw || T % llmc::kAttentionBlock == 0, "attention within documents takes whole blocks of %d tokens, "
          "not T = %d", llmc::kAttentionBlock, T);
  const int HS = C / NH;
  const size_t n = (size_t)B * T * C;
  floatX *q = qkvr, *k = qkvr + n, *v = qkvr + 2 * n;
  const int threads = 256;
  attention_permute_kernel<<<ceil_div(n, threads), threads, 0, stream>>>(q, k, v, qkv, B, T, NH, HS);
  cudaCheckLaunch();
  const long tt = (long)T * T, ths = (long)T * HS;
  batched_matmul(preatt, q, k, T, T, HS, false, true, ths, ths, tt, B * NH, 1.0f, 0.0f, stream);
  const int rows = B * NH * T, warps_per_block = threads / WARP_SIZE;
  attention_softmax_forward_kernel<<<ceil_div(rows, warps_per_block), threads, 0, stream>>>(
      att, preatt, rows, T, NH, scale, dw ? *dw : DocumentWindow{});
  cudaCheckLaunch();
  batched_matmul(y, att, v, T, HS, T, false, false, tt, ths, ths, B * NH, 1.0f, 0.0f, stream);
  attention_unpermute_kernel<<<ceil_div(n, threads), threads, 0, stream>>>(out, y, B, T, NH, HS,
                                                                           false);
  cudaCheckLaunch();
}

// dqkv [B, T, 3C] from dout [B, T, C]. scratch_datt: B*NH*T*T; scratch_dqkvr: 3*B*T*C + B*T*C.
void attention_backward(floatX* dqkv, floatX* scratch_dqkvr, floatX* scratch_datt,
                        const floatX* dout, const floatX* qkvr, const floatX* att, int B, int T,
                        int C, int NH, float scale, cudaStream_t stream) {
  const int HS = C / NH;
  const size_t n = (size_t)B * T * C;
  const floatX *q = qkvr, *k = qkvr + n, *v = qkvr + 2 * n;
  floatX *dq = scratch_dqkvr, *dk = dq + n, *dv = dq + 2 * n, *dy = dq + 3 * n;
  const int threads = 256;
  attention_unpermute_kernel<<<ceil_div(n, threads), threads, 0, stream>>>(dy, dout, B, T, NH, HS,
                                                                           true);
  cudaCheckLaunch();
  const long tt = (long)T * T, ths = (long)T * HS;
  // datt = dy v^T; dv = att^T dy
  batched_matmul(scratch_datt, dy, v, T, T, HS, false, true, ths, ths, tt, B * NH, 1.0f, 0.0f, stream);
  batched_matmul(dv, att, dy, T, HS, T, true, false, tt, ths, ths, B * NH, 1.0f, 0.0f, stream);
  const int rows = B * NH * T, warps_per_block = threads / WARP_SIZE;
  attention_softmax_backward_kernel<<<ceil_div(rows, warps_per_block), threads, 0, stream>>>(
      scratch_datt, att, rows, T, scale);
  cudaCheckLaunch();
  // dq = dpreatt k; dk = dpreatt^T q
  batched_matmul(dq, scratch_datt, k, T, HS, T, false, false, tt, ths, ths, B * NH, 1.0f, 0.0f, stream);
  batched_matmul(dk, scratch_datt, q, T, HS, T, true, false, tt, ths, ths, B * NH, 1.0f, 0.0f, stream);
  attention_permute_backward_kernel<<<ceil_div(n, threads), threads, 0, stream>>>(dqkv, dq, dk, dv,
                                                                                  B, T, NH, HS);
  cudaCheckLaunch();
}

// ---- Flash attention (BF16 builds, head size 64 or 128) ----
// The same causal attention without the T x T matrix: each warpgroup takes 64 query rows (16 per
// warp) against 64-row key/value tiles through BF16 tensor-core MMAs (wgmma on Hopper, mma.sync
// m16n8k16 elsewhere; FP32 accumulation), with an online softmax in registers (a forward block is
// one or two warpgroups sharing each key/value tile; on Hopper the forward, and at head size 64 the
// backward, are kernels of their own with bulk tensor copies, further below). q, k, v are read
// straight from qkv [B, T, 3, NH, HS] and the output written straight to [B, T, NH, HS]: no
// permutes. The forward keeps the base-2 logsumexp of every row, lse [B, NH, T], so the backward
// rebuilds each probability exactly as the forward made it. The backward avoids atomics with two
// kernels: one per key/value tile (dK, dV, looping over the query tiles at or below the diagonal),
// which also writes each 64x64 tile of dS = P * (dP - rowsum(dO * O)) it forms to a scratch buffer,
// and one per query tile (dQ = dS K, looping over the key tiles), so every sum has a fixed order.
// FLOPs (causal): 2*B*NH*T*T*HS forward, 5/2 of that backward; bytes: qkv, out and their gradients
// once, the K/V (or Q/dO) tiles re-read by each block, and dS written and read once (the 64x64
// tiles at or below the diagonal: about B*NH*T*T/2 BF16 values).

#if !defined(ENABLE_FP32)
namespace flash {

constexpr int kThreads = 128;  // one warpgroup: 4 warps, each owning 16 rows of a 64-row tile
constexpr int kTileRows = 64;

// The warp's index within its warpgroup: the 16-row slice of the warpgroup's 64-row tile it owns.
__device__ __forceinline__ int warp_in_group() { return (threadIdx.x / WARP_SIZE) % 4; }
// The block's warpgroup, through a shuffle, which the compiler knows to give every lane the same
// value: what is made from it (the products' descriptors) is then formed in uniform registers.
// Measured in the windowed dK/dV kernel: 11% fewer instructions, 4% faster.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(~0u, threadIdx.x / kThreads, 0); }

// The work of a block of a causal kernel whose grid is (tiles, heads): the head bh and the rank
// of its tile, 0 for the heaviest (a forward block's last query tile, with the most keys; a dK/dV
// block's first key tile, with the most queries). Blocks start in the order of the linear block
// index. Head after head, each head's tiles heaviest first, keeps the blocks that share a head's
// K and V (or Q and dO) in L2 running together; but then the grid ends on the heavy tiles of its
// last heads while most SMs idle. So the last tail_heads heads go heaviest first across those
// heads, which made the forward and the Hopper dK/dV kernel faster on the d48 shape. Heaviest
// first over all heads loses more to L2 misses than it gains, and so did the tail in the dQ
// kernel and in the dK/dV kernel of head size 128, which keep the order head after head. The tail
// follows the GPU's SM count, but only when a block runs depends on it, not what it computes:
// the bits of every result are the same on any GPU.
struct CausalBlockWork {
  int rank, bh;
};

__host__ __device__ inline CausalBlockWork causal_block_work(int block, int tiles, int heads, int tail_heads) {
  const int tail = tail_heads < heads ? tail_heads : heads, tail_start = (heads - tail) * tiles;
  if (block < tail_start) return {block % tiles, block / tiles};
  return {(block - tail_start) / tail, heads - tail + (block - tail_start) % tail};
}

__device__ __forceinline__ CausalBlockWork causal_block_work(int tail_heads) {
  return causal_block_work(blockIdx.y * gridDim.x + blockIdx.x, gridDim.x, gridDim.y, tail_heads);
}

// Query rows per iteration of the dK/dV kernel: 32 at head size 128 keeps its accumulators
// (dK and dV, 16 x HS each per warp) and score tiles within the register file.
template <int HS>
constexpr int dkdv_query_rows() { return HS == 64 ? 64 : 32; }

// Hopper builds (sm_90a) multiply through wgmma, the warpgroup's asynchronous MMA: a warpgroup's
// 4 warps issue one m64nNk16 product together, A from registers (the same fragments mma.sync
// takes), B read by the tensor cores straight from a shared-memory tile. Other GPUs use mma.sync
// with B fragments loaded by ldmatrix. Both read the same tile layout, and both keep each warp's
// 16 rows of a result as mma.sync C fragments, so the softmax code is shared.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASH_WGMMA 1
#else
#define FLASH_WGMMA 0
#endif

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Shared-memory tiles of R rows by HS columns are made of 1024-byte atoms of 8 rows by 64
// columns, 8-row group major, in which 16-byte piece p of row r sits at piece p ^ r: wgmma's
// 128-byte swizzle, which it reads as a K-major operand (rows of an [N][K] tile) or an MN-major
// one (rows of a [K][N] tile). The 8 rows of any 8x8 matrix fall in 8 different bank groups, so
// neither the row-wise 16-byte copies into a tile nor ldmatrix conflict. wgmma applies the swizzle
// to address bits, so every tile starts on a 1024-byte boundary (the kernels' shared memory is
// 1024-byte aligned and each tile a multiple of 8 KiB).
template <int HS>
__device__ __forceinline__ int tile_offset(int r, int c) {
  return (r / 8) * 8 * HS + (c / 64) * 512 + (r % 8) * 64 + (((c % 64) / 8) ^ (r % 8)) * 8 + c % 8;
}

// Where row r of a sequence lies from its first row, in elements: r * ld for a [T, ld] matrix
// (rows given as size_t ld), or PairedRows' place for paired heads' doubled sequence read in place.
__device__ __forceinline__ size_t row_offset(size_t ld, int r) { return (size_t)r * ld; }

// Record #89's paired heads' doubled sequence in place (section 10's paired_attention_rows): qkv's
// token rows [q0 q1 k0 k1 v0 v1] (halves of `half` = C/2 values: heads 0..NH/2-1, then the rest)
// read as positions 2t + j of [2T, 3 half] rows, row 2t + j's part p (q, k, v) the token's half 2p
// + j. A kernel over the doubled sequence addresses its q, k and v (or their gradients) through
// row_offset and qkv_part (part p at 2p half from q, where [2T, 3 half] rows have it at p half).
struct PairedRows {
  size_t half;
};
__device__ __forceinline__ size_t row_offset(PairedRows p, int r) {
  return (size_t)(r >> 1) * 6 * p.half + (size_t)(r & 1) * p.half;
}

// The rows of a sequence's qkv over C channels a part (PairedRows with kPaired), and the distance
// from a row's q to its k and from its k to its v.
template <bool kPaired>
__device__ __forceinline__ auto qkv_rows(int C) {
  if constexpr (kPaired) {
    return PairedRows{(size_t)C};
  } else {
    return 3 * (size_t)C;
  }
}
template <bool kPaired>
__device__ __forceinline__ size_t qkv_part(int C) {
  return kPaired ? 2 * (size_t)C : (size_t)C;
}

// Where QK-norm's backward finds row p's head h (of NH) of sequence b (of T rows): its q's rstd at
// qk_rstd[rstd_q] (qk_rstd [tokens, 2, a token's heads]: q's, then k's `heads` later), and the
// position the rotary turned it at (RotaryFrequencies of the layer). With kPaired the row is the
// doubled sequence's: token p / 2's head (p % 2) NH + h of its 2 NH.
struct QkNormRow {
  size_t rstd_q;
  int heads;
  int position;
};
template <bool kPaired>
__device__ __forceinline__ QkNormRow qk_norm_row(const RotaryFrequencies& f, int b, int p, int T, int h, int NH) {
  if constexpr (kPaired) {
    const int token = p >> 1, head = (p & 1) * NH + h;
    return {((size_t)b * (T / 2) + token) * 4 * NH + head, 2 * NH, f.head_position(f.position(b, token, T / 2), head)};
  } else {
    return {((size_t)b * T + p) * 2 * NH + h, NH, f.position(b, p, T)};
  }
}

// rows x HS elements of one head from a [T, ld] matrix (or PairedRows), starting at row r0, into a
// tile; the block's THREADS threads share the copies.
template <int HS, int ROWS, int THREADS = kThreads, class Rows>
__device__ __forceinline__ void load_tile(floatX* dst, const floatX* src, Rows rows, int r0, int T) {
  constexpr int kChunks = HS / 8;
  static_assert(ROWS * kChunks % THREADS == 0 && THREADS % (8 * kChunks) == 0,
                "each thread copies the same columns of rows 8 apart");
  // A thread's pieces share their column and row % 8, so their tile offsets differ by a constant.
  const int r = threadIdx.x / kChunks, c = threadIdx.x % kChunks * 8;
  const int offset = tile_offset<HS>(r, c);
#pragma unroll
  for (int k = 0; k < ROWS * kChunks / THREADS; k++) {
    const int row = r + k * (THREADS / kChunks);
    const bool valid = r0 + row < T;
    copy_async_16(dst + offset + k * (THREADS / kChunks) * HS, src + row_offset(rows, valid ? r0 + row : 0) + c, valid);
  }
}

// Waits for this thread's tile copies (all but the newest N groups). wgmma reads shared memory
// through the async proxy, so the copies are ordered before it by a proxy fence; the
// __syncthreads that follows publishes them to the other warps.
template <int N>
__device__ __forceinline__ void wait_tile_copies() {
  copy_async_wait<N>();
#if FLASH_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Four 8x8 matrices of a tile through ldmatrix (kTranspose: each one transposed); each lane gives
// row lane % 8 of matrix lane / 8, whose top-left element is (r, c).
template <int HS, bool kTranspose>
__device__ __forceinline__ void load_matrices(uint32_t x[4], const floatX* tile, int r, int c) {
  const uint32_t addr = (uint32_t)__cvta_generic_to_shared(tile + tile_offset<HS>(r + threadIdx.x % 8, c));
  if (kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(addr));
  }
}

// The A fragment of the 16x16 block of a tile at (r0, c0), in mma.sync's order: (rows 0-7,
// cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
template <int HS>
__device__ __forceinline__ void load_a_fragment(uint32_t a[4], const floatX* tile, int r0, int c0) {
  const int matrix = (threadIdx.x % WARP_SIZE) / 8;
  load_matrices<HS, false>(a, tile, r0 + (matrix % 2) * 8, c0 + (matrix / 2) * 8);
}

// One warp's 16 rows of a tile as A fragments (K = HS).
template <int HS>
__device__ __forceinline__ void load_row_fragments(uint32_t a[HS / 16][4], const floatX* tile) {
  const int warp = warp_in_group();
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) load_a_fragment<HS>(a[kk], tile, warp * 16, kk * 16);
}

// A wgmma shared-memory descriptor, as its two 32-bit words. An offset (in 16-byte units) adds to
// the low word alone, whose bits 0-13 hold the address: shared memory below 256 KiB never carries
// out of them. Added to the 64-bit value, it took an add with carry and two moves to uniform
// registers for every product, a fifth of a tile's instructions in the windowed dK/dV kernel.
struct WgmmaDescriptor {
  uint32_t lo, hi;
  __device__ WgmmaDescriptor operator+(uint32_t units) const { return {lo + units, hi}; }
  __device__ uint64_t bits() const { return (uint64_t)hi << 32 | lo; }
};

#if FLASH_WGMMA
// The descriptor of part of a tile (128-byte swizzle): its address, the byte distance between
// atoms along the leading dimension (N for an MN-major operand; unused for a K-major one) and
// between 8-row groups.
__device__ __forceinline__ WgmmaDescriptor wgmma_descriptor(const floatX* tile, uint32_t leading_bytes,
                                                            uint32_t stride_bytes) {
  const uint32_t addr = (uint32_t)__cvta_generic_to_shared(tile);
  return {((addr & 0x3FFFF) >> 4) | (leading_bytes >> 4) << 16, (stride_bytes >> 4) | 1u << 30};
}

// The asm operands of accumulator fragments d[i] .. d[i + 3] (16 floats, in wgmma's order).
#define FLASH_WGMMA_ACC4(d, i)                                                                     \
  "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3]), "+f"(d[(i) + 1][0]),                 \
      "+f"(d[(i) + 1][1]), "+f"(d[(i) + 1][2]), "+f"(d[(i) + 1][3]), "+f"(d[(i) + 2][0]),          \
      "+f"(d[(i) + 2][1]), "+f"(d[(i) + 2][2]), "+f"(d[(i) + 2][3]), "+f"(d[(i) + 3][0]),          \
      "+f"(d[(i) + 3][1]), "+f"(d[(i) + 3][2]), "+f"(d[(i) + 3][3])

// d[64 x N] += a[64 x 16] b[16 x N] over the warpgroup, for N = 32, 64 or 128. kTransposeB: b is
// N-major (16 rows of a [K][N] tile) rather than K-major (a [N][K] tile). accumulate false (known
// at run time) ignores d's old values, so d needs no zeroing.
template <int N, int kTransposeB>
__device__ __forceinline__ void wgmma_m64k16(float d[N / 8][4], const uint32_t a[4], WgmmaDescriptor b,
                                             bool accumulate = true) {
  static_assert(N == 32 || N == 64 || N == 128, "wgmma_m64k16 is written for N = 32, 64 and 128");
  if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %70, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,"
        "%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, accumulate, 1, 1, %69;\n}\n"
        : FLASH_WGMMA_ACC4(d, 0), FLASH_WGMMA_ACC4(d, 4), FLASH_WGMMA_ACC4(d, 8), FLASH_WGMMA_ACC4(d, 12)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b.bits()), "n"(kTransposeB), "r"((int)accumulate));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, accumulate, 1, 1, %37;\n}\n"
        : FLASH_WGMMA_ACC4(d, 0), FLASH_WGMMA_ACC4(d, 4)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b.bits()), "n"(kTransposeB), "r"((int)accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %22, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, accumulate, 1, 1, %21;\n}\n"
        : FLASH_WGMMA_ACC4(d, 0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b.bits()), "n"(kTransposeB), "r"((int)accumulate));
  }
}

#else
// c[16x8] += a[16x16] b[16x8]; the fragment layouts are PTX's (row g = lane/4, column pair
// 2*(lane%4)): a holds rows g, g+8 at columns 2t and 2t+8, b columns g at rows 2t and 2t+8.
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Products are issued in batches: mma_batch_begin(), the issue_* calls, mma_batch_end(), then
// mma_result(d) for each result before it is read. With wgmma the batch is one asynchronous
// group: a fence opens it (the registers it reads are ready), the end waits for all of it, and
// the empty asm statements of mma_result keep the compiler from reading a result before that
// wait. Independent products in one batch overlap on the tensor cores. With mma.sync each issue_*
// call computes its product at once and the batch calls do nothing.
__device__ __forceinline__ void mma_batch_begin() {
#if FLASH_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

#if FLASH_WGMMA
// The two halves of mma_batch_end, for a kernel with work between issuing a batch and its results.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kRunning of this warpgroup's committed batches are still running.
template <int kRunning>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kRunning) : "memory");
}
#endif

__device__ __forceinline__ void mma_batch_end() {
#if FLASH_WGMMA
  wgmma_commit();
  wgmma_wait<0>();
#endif
}

template <int M>
__device__ __forceinline__ void mma_result(float d[M][4]) {
#if FLASH_WGMMA
#pragma unroll
  for (int i = 0; i < M; i++) {
#pragma unroll
    for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
  }
#else
  (void)d;
#endif
}

// s[N/8][4] = rows of a (as A fragments, K = HS) times the N rows of b_tile (an [N][HS] tile).
template <int HS, int N>
__device__ __forceinline__ void issue_rows_product(float s[N / 8][4], const uint32_t a[HS / 16][4],
                                                   const floatX* b_tile) {
#pragma unroll
  for (int n = 0; n < N / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#if FLASH_WGMMA
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    // K columns 16kk.. start 32 bytes further into their atom's rows; the swizzle is applied to
    // the addresses wgmma forms, as it was to the copies.
    const floatX* b = b_tile + (kk / 4) * 512 + (kk % 4) * 16;
    wgmma_m64k16<N, 0>(s, a[kk], wgmma_descriptor(b, 16, HS * 16));
  }
#else
  const int matrix = (threadIdx.x % WARP_SIZE) / 8;
#pragma unroll
  for (int n = 0; n < N / 16; n++) {
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
      // b[0], b[1]: k rows 0-15 of columns n*16 + 0-7; b[2], b[3]: of columns n*16 + 8-15.
      uint32_t b[4];
      load_matrices<HS, false>(b, b_tile, n * 16 + (matrix / 2) * 8, kk * 16 + (matrix % 2) * 8);
      mma_16816(s[2 * n], a[kk], b[0], b[1]);
      mma_16816(s[2 * n + 1], a[kk], b[2], b[3]);
    }
  }
#endif
}

// acc[HS/8][4] += a (16 x K per warp, as A fragments) times a [K][HS] tile.
template <int HS, int K>
__device__ __forceinline__ void issue_accumulate(float acc[HS / 8][4], const uint32_t a[K / 16][4],
                                                 const floatX* tile) {
#if FLASH_WGMMA
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    // Rows 16kk.. of every 64-column chunk (the chunks 1024 bytes apart: the leading byte offset).
    wgmma_m64k16<HS, 1>(acc, a[kk], wgmma_descriptor(tile + tile_offset<HS>(kk * 16, 0), 1024, HS * 16));
  }
#else
  const int matrix = (threadIdx.x % WARP_SIZE) / 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
#pragma unroll
    for (int dn = 0; dn < HS / 16; dn++) {
      // Transposed loads: b[0], b[1] for columns dn*16 + 0-7, b[2], b[3] for columns dn*16 + 8-15.
      uint32_t b[4];
      load_matrices<HS, true>(b, tile, kk * 16 + (matrix % 2) * 8, dn * 16 + (matrix / 2) * 8);
      mma_16816(acc[2 * dn], a[kk], b[0], b[1]);
      mma_16816(acc[2 * dn + 1], a[kk], b[2], b[3]);
    }
  }
#endif
}

// The A fragments of p (16 x K per warp, score C fragments): the C fragments of each 16x16 block
// of scores are the A fragment that multiplies them, so P stays in registers.
template <int K>
__device__ __forceinline__ void scores_to_fragments(uint32_t a[K / 16][4], const float p[K / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    a[kk][0] = pack_bf16x2(p[2 * kk][0], p[2 * kk][1]);
    a[kk][1] = pack_bf16x2(p[2 * kk][2], p[2 * kk][3]);
    a[kk][2] = pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[kk][3] = pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
  }
}

// One-product batches.
template <int HS, int N>
__device__ __forceinline__ void multiply_by_rows(float s[N / 8][4], const uint32_t a[HS / 16][4],
                                                 const floatX* b_tile) {
  mma_batch_begin();
  issue_rows_product<HS, N>(s, a, b_tile);
  mma_batch_end();
  mma_result<N / 8>(s);
}

template <int HS, int K>
__device__ __forceinline__ void accumulate_fragments(float acc[HS / 8][4], const uint32_t a[K / 16][4],
                                                     const floatX* tile) {
  mma_batch_begin();
  issue_accumulate<HS, K>(acc, a, tile);
  mma_batch_end();
  mma_result<HS / 8>(acc);
}

template <int HS, int K>
__device__ __forceinline__ void accumulate_product(float acc[HS / 8][4], const float p[K / 8][4],
                                                   const floatX* tile) {
  uint32_t a[K / 16][4];
  scores_to_fragments<K>(a, p);
  accumulate_fragments<HS, K>(acc, a, tile);
}

// The dS scratch holds, for each head, the 64x64 tiles (query tile i, key tile j <= i) in row
// order of the lower triangle. A tile is dS^T (keys by queries) cut into 16x8 blocks, key block
// major, each block's 16 rows of 8 queries contiguous: the C fragments of the dK/dV kernel's
// dS^T are then stored as whole 128-byte lines, and each 8x8 matrix the dQ kernel loads with
// ldmatrix is 128 contiguous bytes (no bank conflicts without padding).
constexpr int kDsTileElements = kTileRows * kTileRows;

__device__ __forceinline__ size_t ds_tile_offset(int bh, int i, int j, int tiles) {
  return ((size_t)bh * (tiles * (tiles + 1) / 2) + i * (i + 1) / 2 + j) * kDsTileElements;
}

// Element (key row r of 16-key block kb, query column c of 8-query block qb) of a dS tile.
__device__ __forceinline__ int ds_block_index(int kb, int qb, int r, int c) {
  return ((kb * (kTileRows / 8) + qb) * 16 + r) * 8 + c;
}

// Stores a warp's 16 key rows of dS^T (C fragments over N query columns, starting at query
// column q0 of the tile) into a dS tile.
template <int N>
__device__ __forceinline__ void store_ds_rows(floatX* tile, int q0, const float ds[N / 8][4]) {
  const int warp = warp_in_group(), lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < N / 8; n++) {
    const int qb = q0 / 8 + n;
    *reinterpret_cast<uint32_t*>(tile + ds_block_index(warp, qb, g, 2 * t)) = pack_bf16x2(ds[n][0], ds[n][1]);
    *reinterpret_cast<uint32_t*>(tile + ds_block_index(warp, qb, g + 8, 2 * t)) = pack_bf16x2(ds[n][2], ds[n][3]);
  }
}

// The A fragment of dS (queries 16w..16w+15 by keys 16kk..16kk+15) from a dS tile in shared
// memory: ldmatrix transposes the stored dS^T 8x8 matrices on the way.
__device__ __forceinline__ void load_ds_a_fragment(uint32_t a[4], const floatX* tile, int kk) {
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, matrix = lane / 8;
  const floatX* row = tile + ds_block_index(kk, 2 * warp + matrix % 2, (matrix / 2) * 8 + lane % 8, 0);
  const uint32_t addr = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}

// QK-norm's and the rotary's backward (qk_norm_rotary_backward's) on a warp's 16 x HS accumulator
// of dQ or dK, in place, before it is stored: the gradient after the rotary becomes the gradient
// before the norm without a pass of its own, and from dy unrounded. The thread's rows are g and
// g + 8 (e / 2 of acc[dn][e]); column j = 8 dn + 2t + e % 2 has its rotary partner j + HS/2 in
// acc[dn + HS/16] of the same thread (with record #89's adjacent pairs, j = 2p and j + 1 in acc[dn][e]
// and acc[dn][e + 1], e even: pair p = 4 dn + t), and a row's columns lie in the 4 lanes of a quad. y(row, dn)
// gives the forward's output (the attention's q or k) at columns 8 dn + 2t and + 1 of the thread's
// row 0 or 1; rstd and position are the rows'. A rotation keeps dot products, so with g = scale acc:
// dx = rstd R^T (g - y mean(g y)).
template <int HS, class Y>
__device__ __forceinline__ void qk_norm_rotary_backward_rows(float acc[HS / 8][4], float scale, const Y& y,
                                                             const float (&rstd)[2], const int (&position)[2],
                                                             const RotaryFrequencies& f) {
  constexpr int kPartner = HS / 16;  // acc[dn + kPartner] holds the columns HS/2 further on
  const int t = threadIdx.x % 4;
  float y_acc[HS / 8][4], mean[2] = {0.0f, 0.0f};
#pragma unroll
  for (int dn = 0; dn < HS / 8; dn++) {
#pragma unroll
    for (int row = 0; row < 2; row++) {
      const float2 pair = y(row, dn);
      y_acc[dn][2 * row] = pair.x;
      y_acc[dn][2 * row + 1] = pair.y;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
      acc[dn][e] *= scale;
      mean[e / 2] += acc[dn][e] * y_acc[dn][e];
    }
  }
#pragma unroll
  for (int row = 0; row < 2; row++) {
    mean[row] += __shfl_xor_sync(~0u, mean[row], 1);
    mean[row] += __shfl_xor_sync(~0u, mean[row], 2);
    mean[row] /= HS;
  }
  if (f.adjacent_pairs) {
#pragma unroll
    for (int dn = 0; dn < HS / 8; dn++) {
#pragma unroll
      for (int row = 0; row < 2; row++) {
        const int e = 2 * row, p = dn * 4 + t;
        float c = 1.0f, s = 0.0f;
        if (p < HS / 4) rotary_cos_sin(f, position[row], p, &c, &s);
        const float m = rotary_unscaled_mean(f, mean[row], c, s);
        const float u1 = acc[dn][e] - y_acc[dn][e] * m;
        const float u2 = acc[dn][e + 1] - y_acc[dn][e + 1] * m;
        acc[dn][e] = rstd[row] * (c * u1 - s * u2);
        acc[dn][e + 1] = rstd[row] * (s * u1 + c * u2);
      }
    }
    return;
  }
#pragma unroll
  for (int dn = 0; dn < kPartner; dn++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int row = e / 2, j = dn * 8 + 2 * t + e % 2;
      float c = 1.0f, s = 0.0f;
      if (j < HS / 4) rotary_cos_sin(f, position[row], j, &c, &s);
      const float m = rotary_unscaled_mean(f, mean[row], c, s);
      const float u1 = acc[dn][e] - y_acc[dn][e] * m;
      const float u2 = acc[dn + kPartner][e] - y_acc[dn + kPartner][e] * m;
      acc[dn][e] = rstd[row] * (c * u1 - s * u2);
      acc[dn + kPartner][e] = rstd[row] * (s * u1 + c * u2);
    }
  }
}

// Writes a warp's 16 x HS accumulator, times `scale`, as rows r0 + (0..15) of a [T, ld] matrix (or
// PairedRows).
template <int HS, class Rows>
__device__ __forceinline__ void store_rows(floatX* dst, Rows rows, int r0, int T, const float acc[HS / 8][4],
                                           float scale_lo, float scale_hi) {
  const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int dn = 0; dn < HS / 8; dn++) {
    if (r0 + g < T) {
      *reinterpret_cast<uint32_t*>(dst + row_offset(rows, r0 + g) + dn * 8 + 2 * t) =
          pack_bf16x2(acc[dn][0] * scale_lo, acc[dn][1] * scale_lo);
    }
    if (r0 + g + 8 < T) {
      *reinterpret_cast<uint32_t*>(dst + row_offset(rows, r0 + g + 8) + dn * 8 + 2 * t) =
          pack_bf16x2(acc[dn][2] * scale_hi, acc[dn][3] * scale_hi);
    }
  }
}

// The column sums of the 64 stored rows of one block's tile (rows r >= T left out), as stored (rounded
// to BF16), in a fixed order: each lane adds its two rows, the lanes of a column add theirs by a
// shuffle tree, then the block's four warps add in warp order. warp_sums: 4 * HS floats of shared
// memory that no thread still reads; the caller synchronises before reusing it.
template <int HS>
__device__ __forceinline__ void store_tile_column_sums(float* dst, float* warp_sums, int r0, int T,
                                                       const float acc[HS / 8][4], float scale) {
  const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int dn = 0; dn < HS / 8; dn++) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
      float sum = 0.0f;
      if (r0 + g < T) sum += (float)(floatX)(acc[dn][e] * scale);
      if (r0 + g + 8 < T) sum += (float)(floatX)(acc[dn][2 + e] * scale);
      sum += __shfl_xor_sync(0xffffffff, sum, 4);
      sum += __shfl_xor_sync(0xffffffff, sum, 8);
      sum += __shfl_xor_sync(0xffffffff, sum, 16);
      if (g == 0) warp_sums[warp * HS + dn * 8 + 2 * t + e] = sum;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < HS; c += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kThreads / WARP_SIZE; w++) sum += warp_sums[w * HS + c];
    dst[c] = sum;
  }
}

// One step of the online softmax over a warp's 16 rows and a 64-key tile of scores s (C
// fragments, unscaled; masked scores -inf), its probabilities left in s: the rows' running maxima
// (in base-2 units, scores times scale_log2) and sums, and the output accumulator o, rescaled to the
// new maxima. The running maximum must be finite after the update: each row has a visible key in
// the first tile a kernel takes.
template <int HS>
__device__ __forceinline__ void online_softmax_update(float s[kTileRows / 8][4], float o[HS / 8][4], float row_max[2],
                                                      float row_sum[2], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < kTileRows / 8; n++) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
    const float new_max = fmaxf(row_max[r], tile_max * scale_log2);
    const float correction = exp2_ftz(row_max[r] - new_max);
    row_max[r] = new_max;
    row_sum[r] *= correction;
#pragma unroll
    for (int dn = 0; dn < HS / 8; dn++) {
      o[dn][2 * r] *= correction;
      o[dn][2 * r + 1] *= correction;
    }
#pragma unroll
    for (int n = 0; n < kTileRows / 8; n++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float p = exp2_ftz(fmaf(s[n][2 * r + e], scale_log2, -new_max));
        s[n][2 * r + e] = p;
        row_sum[r] += p;
      }
    }
  }
}

// The end of a forward for a warp's 16 rows from r0: the rows' sums completed over the quad, lse
// (base 2) and out = o / sum stored (rows past T left out). out_g, lse_g: the sequence's and
// head's first row.
template <int HS>
__device__ __forceinline__ void store_forward_rows(floatX* out_g, float* lse_g, int C, int T, int r0,
                                                   const float o[HS / 8][4], const float row_max[2], float row_sum[2]) {
  const int lane = threadIdx.x % WARP_SIZE, row[2] = {r0 + lane / 4, r0 + lane / 4 + 8};
#pragma unroll
  for (int r = 0; r < 2; r++) {
    row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 2);
    if (lane % 4 == 0 && row[r] < T) lse_g[row[r]] = row_max[r] + log2f(row_sum[r]);
  }
  store_rows<HS>(out_g, C, r0, T, o, 1.0f / row_sum[0], 1.0f / row_sum[1]);
}

// Query rows per forward block are 64 per warpgroup: two warpgroups at head size 64 share each
// key/value tile (half the copies and barriers per product of one-warpgroup blocks); at head
// size 128 one warpgroup per block, so that 3 blocks fit an SM's registers.
template <int HS>
constexpr int forward_groups() { return HS == 64 ? 2 : 1; }
template <int HS>
constexpr int forward_threads() { return forward_groups<HS>() * kThreads; }

// Starts copying key/value tile j + 1 of [0, last] into the other buffer, then waits for tile j:
// the copy of the next tile overlaps the products of this one.
template <int HS>
__device__ __forceinline__ void prefetch_next_kv_tile(floatX* k_s, floatX* v_s, const floatX* k_g,
                                                      const floatX* v_g, size_t ld, int j, int last, int T) {
  constexpr int kTile = kTileRows * HS;
  if (j < last) {
    const int next = 1 - j % 2;
    load_tile<HS, kTileRows, forward_threads<HS>()>(k_s + next * kTile, k_g, ld, (j + 1) * kTileRows, T);
    load_tile<HS, kTileRows, forward_threads<HS>()>(v_s + next * kTile, v_g, ld, (j + 1) * kTileRows, T);
    copy_async_commit();
    wait_tile_copies<1>();
  } else {
    wait_tile_copies<0>();
  }
}

// The forward of GPUs without sm_90a's bulk tensor copies and mbarrier waits (and of builds
// for them); Hopper builds launch attention_forward_flash_tma_kernel below.
// Block i takes the query rows of 64-row tiles G*i .. G*i + G-1 (G warpgroups, one tile each) and
// runs over the key/value tiles up to its last query tile; a warpgroup sits out the tiles past its
// own diagonal.
template <int HS>
__global__ void __launch_bounds__(forward_threads<HS>(), HS == 64 ? 2 : 3) attention_forward_flash_kernel(
    floatX* out, float* lse, const floatX* qkv, int T, int NH, int tail_heads, float scale_log2) {
  constexpr int kTile = kTileRows * HS, kGroups = forward_groups<HS>();
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  floatX* q_s = reinterpret_cast<floatX*>(flash_smem);  // one tile per warpgroup
  floatX* k_s = q_s + kGroups * kTile;                  // two buffers
  floatX* v_s = k_s + 2 * kTile;                        // two buffers
  const CausalBlockWork work = causal_block_work(tail_heads);
  const int block_tile = gridDim.x - 1 - work.rank, bh = work.bh, b = bh / NH, h = bh % NH;
  const int q_tile = kGroups * block_tile + threadIdx.x / kThreads;
  const int C = NH * HS, warp = warp_in_group(), lane = threadIdx.x % WARP_SIZE;
  const int g = lane / 4, t = lane % 4, q0 = q_tile * kTileRows;
  const int last = min(kGroups * block_tile + kGroups - 1, ceil_div(T, kTileRows) - 1);
  const size_t ld = 3 * (size_t)C;
  const floatX* q_g = qkv + (size_t)b * T * ld + h * HS;
  const floatX* k_g = q_g + C;
  const floatX* v_g = q_g + 2 * C;

  load_tile<HS, kGroups * kTileRows, forward_threads<HS>()>(q_s, q_g, ld, kGroups * block_tile * kTileRows, T);
  load_tile<HS, kTileRows, forward_threads<HS>()>(k_s, k_g, ld, 0, T);
  load_tile<HS, kTileRows, forward_threads<HS>()>(v_s, v_g, ld, 0, T);
  copy_async_commit();
  const floatX* q_group = q_s + (threadIdx.x / kThreads) * kTile;
  float o[HS / 8][4] = {};
  // The running maximum is kept in base-2 units (scores times scale_log2), the scores unscaled:
  // the scale is applied inside the exponent's multiply-add.
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  for (int j = 0; j <= last; j++) {
    const int buf = j % 2;
    prefetch_next_kv_tile<HS>(k_s, v_s, k_g, v_g, ld, j, last, T);
    __syncthreads();
    if (j <= q_tile) {
      // The A fragments an asynchronous wgmma reads are loaded in the iteration that uses them:
      // Q's fragments carried over from the first iteration were found overwritten by the second
      // (head size 64, sm_90a build).
      uint32_t q_frag[HS / 16][4];
      load_row_fragments<HS>(q_frag, q_group);
      float s[kTileRows / 8][4];
      multiply_by_rows<HS, kTileRows>(s, q_frag, k_s + buf * kTile);
      if (j == q_tile) {  // the diagonal tile: mask the keys after each query
#pragma unroll
        for (int n = 0; n < kTileRows / 8; n++) {
#pragma unroll
          for (int e = 0; e < 4; e++) {
            if (j * kTileRows + n * 8 + 2 * t + e % 2 > row[e / 2]) s[n][e] = -INFINITY;
          }
        }
      }
      // Every row has its key 0 in tile 0, so the maximum is finite from the start.
      online_softmax_update<HS>(s, o, row_max, row_sum, scale_log2);
      accumulate_product<HS, kTileRows>(o, s, v_s + buf * kTile);
    }
    __syncthreads();  // the next iteration's copies overwrite the other buffer
  }
  store_forward_rows<HS>(out + (size_t)b * T * C + h * HS, lse + (size_t)bh * T, C, T, q0 + warp * 16, o, row_max,
                         row_sum);
}

// ---- Which (query tile, key tile) pairs a kernel visits ----
// The backward's mma.sync kernels serve causal attention and document-causal attention within a
// window (DocumentWindow) alike, through a Pairs type: which query rows a key tile's dK/dV block
// visits (in chunks that never straddle a 128-token block), which chunks take a mask and what it
// hides, which key tiles a query tile's dQ block reads, and where a pair's dS tile lives.

// Causal attention over each sequence: every query from the key tile's own on; the chunks that
// reach above the diagonal are masked; the dS scratch holds the lower triangle (ds_tile_offset).
struct CausalPairs {
  int T, tiles;  // tiles: 64-row tiles of a sequence
  __device__ int query_end(int) const { return T; }
  __device__ bool sees(int, int, int) const { return true; }
  __device__ bool masks(int, int q0, int kv_tile) const { return q0 < (kv_tile + 1) * kTileRows; }
  __device__ int key_document(int, int) const { return 0; }
  __device__ bool hidden(int, int q, int key, int) const { return q < key; }
  __device__ int first_key_tile(int, int) const { return 0; }
  __device__ size_t ds_tile(int bh, int q_tile, int kv_tile) const {
    return ds_tile_offset(bh, q_tile, kv_tile, tiles);
  }
};

constexpr int kTilesPerAttentionBlock = llmc::kAttentionBlock / kTileRows;

// dS tiles a windowed backward keeps per query tile: its key tiles nearest first. A selection
// holds at most llmc::attention_window_run(window) blocks, its own last, so a query tile's key
// tiles are at most that many blocks' tiles back from it (and no more than the sequence's).
__host__ __device__ inline int window_ds_slots(llmc::AttentionWindow window, int tiles) {
  const int slots = kTilesPerAttentionBlock * llmc::attention_window_run(window);
  return slots < tiles ? slots : tiles;
}

// Document-causal attention within dw's window: a query block sees the run of key blocks that
// attention_window_select gives it; its full blocks take no mask, its partial ones the position
// (causal, and a token window's reach) and the document. The dS scratch holds window_ds_slots
// tiles per query tile, slot d for key tile q_tile - d. T a multiple of 128.
struct WindowPairs {
  DocumentWindow dw;
  int T, tiles, slots;
  int reach;  // llmc::attention_window_reach(dw.window)
  __device__ llmc::AttentionBlockSelection selection(int b, int q_block) const {
    return llmc::attention_window_select(dw.spans[(size_t)b * (T / llmc::kAttentionBlock) + q_block], q_block,
                                         dw.window);
  }
  __device__ int first_key_block(int b, int q_block) const {
    const llmc::AttentionBlockSelection s = selection(b, q_block);
    return q_block - s.full - s.partial + 1;
  }
  // A key block is seen by query blocks up to attention_window_run - 1 blocks after it.
  __device__ int query_end(int kv_tile) const {
    return min(T, (kv_tile / kTilesPerAttentionBlock + llmc::attention_window_run(dw.window)) *
                      llmc::kAttentionBlock);
  }
  __device__ bool sees(int b, int q0, int kv_tile) const {
    return kv_tile / kTilesPerAttentionBlock >= first_key_block(b, q0 / llmc::kAttentionBlock);
  }
  __device__ bool masks(int b, int q0, int kv_tile) const {
    const int q_block = q0 / llmc::kAttentionBlock, distance = q_block - kv_tile / kTilesPerAttentionBlock;
    return distance < 1 || distance > selection(b, q_block).full;
  }
  __device__ int key_document(int b, int key) const { return dw.documents[(size_t)b * T + key]; }
  __device__ bool hidden(int b, int q, int key, int key_doc) const {
    return hidden_from(q, dw.documents[(size_t)b * T + q], key, key_doc);
  }
  // The same for a query whose document the caller holds. One unsigned compare hides both the
  // keys after q (q - key negative wraps past any reach) and those beyond the reach.
  __device__ bool hidden_from(int q, int q_doc, int key, int key_doc) const {
    return (unsigned)(q - key) > (unsigned)reach || q_doc != key_doc;
  }
  __device__ int first_key_tile(int b, int q_tile) const {
    return first_key_block(b, q_tile / kTilesPerAttentionBlock) * kTilesPerAttentionBlock;
  }
  __device__ size_t ds_tile(int bh, int q_tile, int kv_tile) const {
    return (((size_t)bh * tiles + q_tile) * slots + q_tile - kv_tile) * kDsTileElements;
  }
};

// ---- Document-causal attention within a window (DocumentWindow): the forward ----

template <int HS>
constexpr size_t window_forward_smem_bytes() {
  return 5 * (size_t)kTileRows * HS * sizeof(floatX) + 2 * kTileRows * sizeof(int);
}

// Starts copying key/value tile `tile` and its keys' documents into buffer `buf`.
template <int HS>
__device__ __forceinline__ void load_window_kv_tile(floatX* k_s, floatX* v_s, int* docs_s, const floatX* k_g,
                                                    const floatX* v_g, const int* docs_g, size_t ld, int tile,
                                                    int buf, int T) {
  constexpr int kTile = kTileRows * HS;
  load_tile<HS, kTileRows>(k_s + buf * kTile, k_g, ld, tile * kTileRows, T);
  load_tile<HS, kTileRows>(v_s + buf * kTile, v_g, ld, tile * kTileRows, T);
  if (threadIdx.x < kTileRows) docs_s[buf * kTileRows + threadIdx.x] = docs_g[tile * kTileRows + threadIdx.x];
  copy_async_commit();
}

// Block (i, bh) takes query tile i (64 rows) of head bh and walks the 64-key tiles of its run from
// its own down to the run's first: the first tile holds each row's own key, so the running
// maximum is finite from the start, and a row that a later tile masks whole (keys of an earlier
// document) adds nothing to it. The tiles of full blocks take no mask; the others the document
// and the position. One warpgroup a block, the copies of the causal forward's mma.sync path
// (cp.async); Hopper launches attention_forward_window_tma_kernel below.
template <int HS>
__global__ void __launch_bounds__(kThreads) attention_forward_window_kernel(
    floatX* out, float* lse, const floatX* qkv, int T, int NH, float scale_log2, WindowPairs pairs) {
  constexpr int kTile = kTileRows * HS;
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  floatX* q_s = reinterpret_cast<floatX*>(flash_smem);
  floatX* k_s = q_s + kTile;  // two buffers
  floatX* v_s = k_s + 2 * kTile;
  int* docs_s = reinterpret_cast<int*>(v_s + 2 * kTile);  // the key tiles' documents, two buffers
  const int q_tile = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS, warp = warp_in_group(), lane = threadIdx.x % WARP_SIZE;
  const int g = lane / 4, t = lane % 4, q0 = q_tile * kTileRows;
  const int first_tile = pairs.first_key_tile(b, q_tile);
  const size_t ld = 3 * (size_t)C;
  const floatX* q_g = qkv + (size_t)b * T * ld + h * HS;
  const floatX* k_g = q_g + C;
  const floatX* v_g = q_g + 2 * C;
  const int* docs_g = pairs.dw.documents + (size_t)b * T;
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int row_doc[2] = {docs_g[row[0]], docs_g[row[1]]};

  load_tile<HS, kTileRows>(q_s, q_g, ld, q0, T);
  load_window_kv_tile<HS>(k_s, v_s, docs_s, k_g, v_g, docs_g, ld, q_tile, 0, T);
  float o[HS / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  for (int j = q_tile, buf = 0; j >= first_tile; j--, buf ^= 1) {
    if (j > first_tile) {
      load_window_kv_tile<HS>(k_s, v_s, docs_s, k_g, v_g, docs_g, ld, j - 1, buf ^ 1, T);
      wait_tile_copies<1>();
    } else {
      wait_tile_copies<0>();
    }
    __syncthreads();
    uint32_t q_frag[HS / 16][4];
    load_row_fragments<HS>(q_frag, q_s);
    float s[kTileRows / 8][4];
    multiply_by_rows<HS, kTileRows>(s, q_frag, k_s + buf * kTile);
    if (pairs.masks(b, q0, j)) {  // a partial block: by document and position
#pragma unroll
      for (int n = 0; n < kTileRows / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int c = n * 8 + 2 * t + e % 2, key = j * kTileRows + c;
          if (pairs.hidden_from(row[e / 2], row_doc[e / 2], key, docs_s[buf * kTileRows + c])) s[n][e] = -INFINITY;
        }
      }
    }
    online_softmax_update<HS>(s, o, row_max, row_sum, scale_log2);
    accumulate_product<HS, kTileRows>(o, s, v_s + buf * kTile);
    __syncthreads();  // the next iteration's copies overwrite this buffer
  }
  store_forward_rows<HS>(out + (size_t)b * T * C + h * HS, lse + (size_t)bh * T, C, T, q0 + warp * 16, o, row_max,
                         row_sum);
}

// ---- Flash forward on Hopper: bulk tensor copies, barriers in shared memory, 128-key tiles ----
// The kernel above spends about 400 instructions a warp on each 64x64 tile, more than half of
// them outside the softmax: every thread's share of the tile copies, two block barriers, and
// descriptors built anew for each product. Here one thread starts each tile's copies with the
// tensor memory accelerator (TMA: one instruction a 64 x 64 box, the 128-byte swizzle applied on
// the way in), each stage of the copy ring has an mbarrier that completes when its bytes have
// landed, and the warps read a stage as soon as it is full, with no block barrier: the last warp
// done with a stage starts its refill. Key tiles of 128 rows halve the per-tile costs that
// remain (the barrier waits, the two waits for the products, the row-maximum shuffles and the
// rescale of O) per key. A shared-memory tile holds 64-column chunks of R rows one after another,
// each row 128 bytes with 16-byte piece p at p ^ (row % 8): the TMA's 128-byte swizzle, which wgmma
// reads with 1024 bytes between 8-row groups. At head size 64 this is the layout of tile_offset.
#if FLASH_WGMMA
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// Named barrier `id` of `threads` threads: sync waits for all of them, arrive counts this thread's
// warp in and goes on. Both order this thread's earlier memory accesses before the waiters' later ones.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Initialises n mbarriers, each completed by one arrival and the bytes it expects, and makes
// them visible to the copy engine before any copy is started on them.
__device__ __forceinline__ void copy_barriers_init(uint64_t* bars, int n) {
  for (int i = 0; i < n; i++) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(&bars[i])), "r"(1));
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Arrives on bar and sets the bytes the copies of its current phase will deliver.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}

// Waits until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// One 64 x 64 box of qkv (column, row, sequence) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_box(floatX* dst, const CUtensorMap* map, int column, int row, int seq,
                                             uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(shared_address(dst)),
      "l"((uint64_t)map), "r"(column), "r"(row), "r"(seq), "r"(shared_address(bar))
      : "memory");
}

// One 64-row box of qkv's part `part` (q, k, v) at (column of the part, row, sequence), completing
// on bar: sequence_tensor_map's (C a part's channels), or with kPaired (PairedRows' doubled
// sequence, paired_qkv_tensor_map's 5D view) the same 64 positions as 32 tokens' two halves, from
// the token's halves 2 part and 2 part + 1: the same bytes in the same order into shared memory.
template <bool kPaired>
__device__ __forceinline__ void tma_load_qkv(floatX* dst, const CUtensorMap* map, int C, int part, int column, int row,
                                             int seq, uint64_t* bar) {
  if constexpr (kPaired) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
        "%6}], [%7];\n" ::"r"(shared_address(dst)),
        "l"((uint64_t)map), "r"(column), "r"(0), "r"(part), "r"(row / 2), "r"(seq), "r"(shared_address(bar))
        : "memory");
  } else {
    tma_load_box(dst, map, part * C + column, row, seq, bar);
  }
}

// `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned) into shared memory,
// completing on bar.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}

// d[64 x N] (+)= a[64 x 16] b[16 x N] over the warpgroup, both operands K-major in shared
// memory, for N = 64 or 128. kAccumulate false ignores d's old values, so d needs no zeroing.
template <int N, bool kAccumulate>
__device__ __forceinline__ void wgmma_shared_m64k16(float d[N / 8][4], WgmmaDescriptor a, WgmmaDescriptor b) {
  static_assert(N == 64 || N == 128, "wgmma_shared_m64k16 is written for N = 64 and 128");
  if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
        : FLASH_WGMMA_ACC4(d, 0), FLASH_WGMMA_ACC4(d, 4)
        : "l"(a.bits()), "l"(b.bits()), "n"((int)kAccumulate));
  } else {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,"
        "%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, "
        "accumulate, 1, 1, 0, 0;\n}\n"
        : FLASH_WGMMA_ACC4(d, 0), FLASH_WGMMA_ACC4(d, 4), FLASH_WGMMA_ACC4(d, 8), FLASH_WGMMA_ACC4(d, 12)
        : "l"(a.bits()), "l"(b.bits()), "n"((int)kAccumulate));
  }
}

// acc[64 x HS] (+)= a (64 x K as A fragments) times K rows of a tile in the Hopper kernels' layout
// (an MN-major [K][HS] operand: 64-column chunks of all its rows, 8-row groups 1024 bytes apart),
// whose chunks' distance is desc's leading byte offset, so one m64nHSk16 product a step spans
// them. Without accumulate, acc's old values are ignored.
template <int HS, int K>
__device__ __forceinline__ void issue_accumulate_chunked(float acc[HS / 8][4], const uint32_t a[K / 16][4],
                                                         WgmmaDescriptor desc, bool accumulate = true) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    // Rows 16kk..: two 8-row groups, 2048 bytes further a step.
    wgmma_m64k16<HS, 1>(acc, a[kk], desc + kk * 2048 / 16, accumulate || kk > 0);
  }
}
#endif

// Query rows per block (two warpgroups of 64), keys per tile, and copy-ring stages (3 stages ran
// slower at head size 64: 2 blocks of 112 KiB barely fit an SM).
constexpr int kTmaForwardGroups = 2;
constexpr int kTmaForwardThreads = kTmaForwardGroups * kThreads;
constexpr int kTmaForwardKeys = 128;
constexpr int kTmaForwardStages = 2;

// Shared memory: the query tiles, the stages (a key and a value tile each), a full barrier per
// stage and one for the query tiles, and per stage the count of warps done reading it.
template <int HS>
constexpr size_t tma_forward_tile_bytes() { return (size_t)kTmaForwardKeys * HS * sizeof(floatX); }
template <int HS>
constexpr size_t tma_forward_smem_bytes() {
  return kTmaForwardGroups * kTileRows * HS * sizeof(floatX) + kTmaForwardStages * 2 * tma_forward_tile_bytes<HS>() +
         (kTmaForwardStages + 1) * sizeof(uint64_t) + kTmaForwardStages * sizeof(int);
}

#if FLASH_WGMMA
// The two warpgroups of a forward block take turns to issue their products: each waits for its
// turn on a named barrier of its own (bar.sync) and passes the turn on the other's (bar.arrive)
// once its products are issued. One warpgroup's softmax then runs while the other's products do,
// instead of both waiting on the tensor cores at once and then both leaving them idle. Warpgroup
// 1 gives warpgroup 0 the first turn and holds back its own last pass, so that every barrier's
// arrivals match its waits. At head size 64 only the score products take turns (also alternating
// the value products ran slower); at head size 128 both do (faster than the scores alone).
template <int HS>
constexpr bool value_products_take_turns() { return HS == 128; }

struct ProductTurns {
  int group;        // 0 or 1: the warpgroup
  bool hold_final;  // the warpgroup's last pass, which warpgroup 1 holds back

  __device__ __forceinline__ void wait() const {
    named_barrier_sync(1 + group, kTmaForwardThreads);
  }
  __device__ __forceinline__ void pass(bool final_pass) const {
    if (!(final_pass && hold_final)) {
      named_barrier_arrive(2 - group, kTmaForwardThreads);
    }
  }
};

// What a masked tile of the Hopper forward hides from query `row` (its r-th of the lane's two):
// the keys after it (the causal diagonal), and in DocumentMask also the keys of other documents
// (key_docs: the documents of the tile's keys, c the key's column in the tile) and those beyond
// the reach (WindowPairs::hidden_from's compare).
struct CausalMask {
  __device__ bool hidden(int key, int, int row, int) const { return key > row; }
};
struct DocumentMask {
  const int* key_docs;
  int row_doc[2];
  int reach;
  __device__ bool hidden(int key, int c, int row, int r) const {
    return (unsigned)(row - key) > (unsigned)reach || key_docs[c] != row_doc[r];
  }
};

// One key tile of the Hopper forward for a warpgroup: S = Q K^T over the tile's first KEYS keys
// (of kTileKeys rows in shared memory), the online softmax update of the warp's 16 rows, and
// O += P V. The maxima are in base-2 units (scores times scale_log2), the scale applied inside the
// exponent's multiply-add; every row has its key 0 in tile 0, so the maximum is finite from the
// start (the windowed forward takes each row's own key first). kMask: the tile's keys (key0 its
// first) are masked as `mask` says. turns: the warpgroup's turns at issuing products, the last of
// them in this tile if last_tile.
template <int HS, int kTileKeys, int KEYS, bool kMask, class Mask = CausalMask>
__device__ __forceinline__ void forward_tile(float o[HS / 8][4], float row_max[2], float row_sum[2],
                                             WgmmaDescriptor q_desc, WgmmaDescriptor k_desc, WgmmaDescriptor v_desc,
                                             int key0, const int row[2],
                                             float scale_log2, const ProductTurns& turns, bool last_tile,
                                             const Mask& mask = Mask()) {
  constexpr bool kValueTurns = value_products_take_turns<HS>();
  const int t = threadIdx.x % 4;
  float s[KEYS / 8][4];
  turns.wait();
  mma_batch_begin();
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    // K columns 16kk.. : chunk kk / 4, 32 bytes further into the rows per step within it.
    const uint32_t q_step = (kk / 4) * (kTileRows * 128 / 16) + (kk % 4) * 2;
    const uint32_t k_step = (kk / 4) * (kTileKeys * 128 / 16) + (kk % 4) * 2;
    if (kk == 0) wgmma_shared_m64k16<KEYS, false>(s, q_desc + q_step, k_desc + k_step);
    else wgmma_shared_m64k16<KEYS, true>(s, q_desc + q_step, k_desc + k_step);
  }
  wgmma_commit();
  turns.pass(last_tile && !kValueTurns);
  wgmma_wait<0>();
  mma_result<KEYS / 8>(s);
  if (kMask) {
#pragma unroll
    for (int n = 0; n < KEYS / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int c = n * 8 + 2 * t + e % 2;
        if (mask.hidden(key0 + c, c, row[e / 2], e / 2)) s[n][e] = -INFINITY;
      }
    }
  }
  // The online softmax, maxima in base-2 units (scores times scale_log2). Every row has its key
  // 0 in tile 0, so the maximum is finite from the start. Maxima and sums by four partial
  // results each: short dependence chains, in a fixed order.
  float tile_max[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float m[4] = {s[0][2 * r], s[0][2 * r + 1], s[1][2 * r], s[1][2 * r + 1]};
#pragma unroll
    for (int n = 2; n < KEYS / 8; n++) {
      m[n % 2 * 2] = fmaxf(m[n % 2 * 2], s[n][2 * r]);
      m[n % 2 * 2 + 1] = fmaxf(m[n % 2 * 2 + 1], s[n][2 * r + 1]);
    }
    tile_max[r] = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
  }
  // The quad's lanes hold the rest of each row: both rows' shuffles go out together.
#pragma unroll
  for (int lanes = 1; lanes <= 2; lanes *= 2) {
#pragma unroll
    for (int r = 0; r < 2; r++) tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], lanes));
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float new_max = fmaxf(row_max[r], tile_max[r] * scale_log2);
    const float correction = exp2_ftz(row_max[r] - new_max);
    row_max[r] = new_max;
#pragma unroll
    for (int dn = 0; dn < HS / 8; dn++) {
      o[dn][2 * r] *= correction;
      o[dn][2 * r + 1] *= correction;
    }
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < KEYS / 8; n++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float p = exp2_ftz(fmaf(s[n][2 * r + e], scale_log2, -new_max));
        s[n][2 * r + e] = p;
        part[(2 * n + e) % 4] += p;
      }
    }
    row_sum[r] = row_sum[r] * correction + ((part[0] + part[1]) + (part[2] + part[3]));
  }
  uint32_t p_frag[KEYS / 16][4];
  scores_to_fragments<KEYS>(p_frag, s);
  if (kValueTurns) turns.wait();
  mma_batch_begin();
  issue_accumulate_chunked<HS, KEYS>(o, p_frag, v_desc);
  wgmma_commit();
  if (kValueTurns) turns.pass(last_tile);
  wgmma_wait<0>();
  mma_result<HS / 8>(o);
}
#endif

// Block i takes query rows 128i .. 128i + 127 of one head (64 per warpgroup) and runs over the
// key tiles up to its rows' last key; a warpgroup stops at the tile of its own last row. Every
// warp of the block reads each tile that is refilled (the warpgroups' last tiles differ by at
// most one, and a stage is refilled kStages >= 2 tiles on), so each stage counts the warps done
// with it, and the warp that completes a tile's count starts the copies of the tile kStages
// further on.
template <int HS>
__global__ void __launch_bounds__(kTmaForwardThreads, HS == 64 ? 2 : 1) attention_forward_flash_tma_kernel(
    const __grid_constant__ CUtensorMap qkv_map, floatX* out, float* lse, int T, int NH, int tail_heads,
    float scale_log2) {
#if FLASH_WGMMA
  constexpr int kKeys = kTmaForwardKeys, kStages = kTmaForwardStages, kChunks = HS / 64;
  constexpr int kBlockRows = kTmaForwardGroups * kTileRows;
  constexpr uint32_t kTileBytes = (uint32_t)tma_forward_tile_bytes<HS>();
  static_assert(kStages >= 2 && kKeys >= kTileRows, "every warp reads each tile that is refilled");
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  floatX* q_s = reinterpret_cast<floatX*>(flash_smem);          // a 64-row tile per warpgroup
  floatX* kv_s = q_s + kTmaForwardGroups * kTileRows * HS;       // stage s: key tile, value tile
  uint64_t* full = reinterpret_cast<uint64_t*>(kv_s + kStages * 2 * kKeys * HS);  // per stage
  uint64_t* q_full = full + kStages;
  int* done_warps = reinterpret_cast<int*>(q_full + 1);  // per stage, over all its fills
  const CausalBlockWork work = causal_block_work(tail_heads);
  const int block_tile = gridDim.x - 1 - work.rank, bh = work.bh, b = bh / NH, h = bh % NH;
  const int group = warpgroup_index(), warp = warp_in_group(), lane = threadIdx.x % WARP_SIZE;
  const int g = lane / 4, C = NH * HS;
  const int block_q0 = block_tile * kBlockRows, q0 = block_q0 + group * kTileRows;
  // Key tile j holds keys j*kKeys ..; a warpgroup's last is the one with its last row's key
  // (rows past T have none of their own: they stop with the block's last valid row).
  const int last_key_tile = (min(T, block_q0 + kBlockRows) - 1) / kKeys;
  const int group_last_tile = min((min(T, q0 + kTileRows) - 1) / kKeys, last_key_tile);
  // Starts the copies of key and value tile j into stage j % kStages.
  auto load_kv_tile = [&](int j) {
    const int stage = j % kStages;
    floatX* k_tile = kv_s + stage * 2 * kKeys * HS;
    floatX* v_tile = k_tile + kKeys * HS;
    barrier_expect_bytes(&full[stage], 2 * kTileBytes);
#pragma unroll
    for (int c = 0; c < kChunks; c++) {
#pragma unroll
      for (int r = 0; r < kKeys; r += 64) {
        tma_load_box(k_tile + (c * kKeys + r) * 64, &qkv_map, C + h * HS + c * 64, j * kKeys + r, b, &full[stage]);
        tma_load_box(v_tile + (c * kKeys + r) * 64, &qkv_map, 2 * C + h * HS + c * 64, j * kKeys + r, b, &full[stage]);
      }
    }
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) done_warps[s] = 0;
    copy_barriers_init(full, kStages + 1);  // and q_full
    barrier_expect_bytes(q_full, kTmaForwardGroups * kTileRows * HS * sizeof(floatX));
#pragma unroll
    for (int gr = 0; gr < kTmaForwardGroups; gr++) {
#pragma unroll
      for (int c = 0; c < kChunks; c++) {
        tma_load_box(q_s + (gr * kChunks + c) * kTileRows * 64, &qkv_map, h * HS + c * 64, block_q0 + gr * kTileRows, b,
                     q_full);
      }
    }
    for (int j = 0; j < kStages && j <= last_key_tile; j++) load_kv_tile(j);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  float o[HS / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  // Descriptors (128-byte swizzle, 1024 bytes between 8-row groups), advanced by adding byte
  // offsets / 16 to their address field. Value tiles are MN-major, their 64-column chunks
  // kKeys * 128 bytes apart.
  const WgmmaDescriptor q_desc = wgmma_descriptor(q_s + group * kTileRows * HS, 16, 1024);
  const WgmmaDescriptor kv_desc = wgmma_descriptor(kv_s, 16, 1024);
  const WgmmaDescriptor v_desc0 = wgmma_descriptor(kv_s + kKeys * HS, kKeys * 128, 1024);
  // Both warpgroups run to the block's last key tile (it holds keys of rows of each, or for rows
  // past T, of the block's last row), so they take the same number of turns.
  const ProductTurns turns{group, group == 1};
  if (group == 1) turns.pass(false);  // warpgroup 0 goes first
  barrier_wait(q_full, 0);
  for (int j = 0; j <= group_last_tile; j++) {
    const int stage = j % kStages;
    barrier_wait(&full[stage], (j / kStages) & 1);
    const WgmmaDescriptor k_desc = kv_desc + stage * (2 * kTileBytes / 16);
    const WgmmaDescriptor v_desc = v_desc0 + stage * (2 * kTileBytes / 16);
    // Warpgroup 0's diagonal tile has keys for its rows in its first 64 rows only.
    if (j < group_last_tile) {
      forward_tile<HS, kKeys, kKeys, false>(o, row_max, row_sum, q_desc, k_desc, v_desc, j * kKeys, row, scale_log2,
                                            turns, false);
    } else if (min(T, q0 + kTileRows) - 1 - j * kKeys < 64) {
      forward_tile<HS, kKeys, 64, true>(o, row_max, row_sum, q_desc, k_desc, v_desc, j * kKeys, row, scale_log2,
                                        turns, true);
    } else {
      forward_tile<HS, kKeys, kKeys, true>(o, row_max, row_sum, q_desc, k_desc, v_desc, j * kKeys, row, scale_log2,
                                           turns, true);
    }
    // This warp is done with the stage; the last of its readers starts the tile kStages further.
    if (lane == 0 && j + kStages <= last_key_tile) {
      __threadfence_block();
      if (atomicAdd(&done_warps[stage], 1) + 1 == (j / kStages + 1) * kTmaForwardThreads / WARP_SIZE) {
        load_kv_tile(j + kStages);
      }
    }
  }
  store_forward_rows<HS>(out + (size_t)b * T * C + h * HS, lse + (size_t)bh * T, C, T, q0 + warp * 16, o, row_max,
                         row_sum);
#else
  __trap();  // launched only where hopper_support().usable
#endif
}

// ---- The windowed forward on Hopper ----
// attention_forward_window_kernel's work with the causal Hopper forward's products and turns, in
// work items: item (q_block, bh) is query block q_block (128 rows, 64 per warpgroup) of head bh
// against the key blocks of its run, from its own down (each row's own key comes first, so its
// maximum is finite from the first tile). A run is short (at most the window, often cut by a
// document), so a block per item spent a fifth of the pass starting and ending blocks: copies of
// Q and the first key block with nothing to overlap them, and the store of O. So the kernel is
// persistent and warp-specialised: a block per SM with two consumer warpgroups and a producer
// warpgroup whose one thread takes items from a counter in global memory and starts each item's
// copies ahead of the consumers: its query tiles into one of two query buffers, its key blocks
// (K, V and the keys' documents) into the ring of stages. Consumers release a stage (and a query
// buffer) through an mbarrier counting their warps. Which block takes an item changes only when
// it runs, never what it computes. Registers move from the producer (24) to the consumers (240).
constexpr int kWindowForwardThreads = kTmaForwardThreads + kThreads;
constexpr int kWindowForwardWarps = kTmaForwardThreads / WARP_SIZE;  // consumer warps

template <int HS>
constexpr size_t tma_window_forward_smem_bytes() {
  return 2 * kTmaForwardGroups * kTileRows * HS * sizeof(floatX) +
         kTmaForwardStages * (2 * tma_forward_tile_bytes<HS>() + kTmaForwardKeys * sizeof(int)) +
         2 * (kTmaForwardStages + 2) * sizeof(uint64_t) + 2 * sizeof(int4);
}

// An item as the producer hands it to the consumers: its index (-1: none left), its run's length
// in key blocks, and how many blocks after its own are full (no mask).
struct WindowForwardItem {
  int index, tiles, full, unused;
};

#if FLASH_WGMMA
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}

// A warp is done reading what bar guards: its lane 0 arrives once all lanes are.
__device__ __forceinline__ void warp_release(uint64_t* bar) {
  __syncwarp();
  if (threadIdx.x % WARP_SIZE == 0) barrier_arrive(bar);
}

// Initialises n mbarriers completed by `arrivals` plain arrivals each.
__device__ __forceinline__ void release_barriers_init(uint64_t* bars, int n, int arrivals) {
  for (int i = 0; i < n; i++) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(&bars[i])), "r"(arrivals));
  }
}

// The next item of this launch from *counter; the launch's last fetch (each block fetches until it
// gets an index past the items, once) sets the counter back to 0 for the next launch.
__device__ __forceinline__ int fetch_work_item(int* counter, int items) {
  const int index = atomicAdd(counter, 1);
  if (index == items + (int)gridDim.x - 1) *counter = 0;
  return index < items ? index : -1;
}
#endif

// Shared memory of the windowed forward: two query buffers (a 64-row tile per consumer warpgroup),
// the stages (a key tile, a value tile, the keys' documents), the barriers and the two items.
template <int HS>
struct WindowForwardSmem {
  floatX* q_s;                  // [2][kTmaForwardGroups * kTileRows * HS]
  floatX* kv_s;                 // stage s: key tile, value tile
  int* docs_s;                  // stage s: its keys' documents
  uint64_t *full, *empty;       // per stage: copies landed; consumer warps done
  uint64_t *q_full, *q_empty;   // per query buffer
  WindowForwardItem* items;     // per query buffer

  __device__ explicit WindowForwardSmem(unsigned char* smem) {
    constexpr int kStages = kTmaForwardStages, kKeys = kTmaForwardKeys;
    q_s = reinterpret_cast<floatX*>(smem);
    kv_s = q_s + 2 * kTmaForwardGroups * kTileRows * HS;
    docs_s = reinterpret_cast<int*>(kv_s + kStages * 2 * kKeys * HS);
    full = reinterpret_cast<uint64_t*>(docs_s + kStages * kKeys);
    empty = full + kStages;
    q_full = empty + kStages;
    q_empty = q_full + 2;
    items = reinterpret_cast<WindowForwardItem*>(q_empty + 2);
  }
};

// The producer: takes items until none is left and starts their copies, each into a query buffer
// and stages its consumers have released (item k into buffer k % 2, the n-th key block of all
// into stage n % kStages).
template <int HS, bool kPaired>
__device__ void window_forward_produce(const WindowForwardSmem<HS>& sm, const CUtensorMap* qkv_map, int T, int NH,
                                       int heads, const WindowPairs& pairs, int* work_counter) {
#if FLASH_WGMMA
  constexpr int kKeys = kTmaForwardKeys, kStages = kTmaForwardStages, kChunks = HS / 64;
  constexpr uint32_t kTileBytes = (uint32_t)tma_forward_tile_bytes<HS>();
  const int blocks = T / kKeys, items = blocks * heads, C = NH * HS;
  for (int k = 0, n = 0;; k++) {
    const int index = fetch_work_item(work_counter, items), buf = k % 2;
    barrier_wait(&sm.q_empty[buf], ((k / 2) & 1) ^ 1);
    if (index < 0) {
      sm.items[buf] = {-1, 0, 0, 0};
      barrier_arrive(&sm.q_full[buf]);
      return;
    }
    const int q_block = index % blocks, bh = index / blocks, b = bh / NH, h = bh % NH;
    const llmc::AttentionBlockSelection s = pairs.selection(b, q_block);
    sm.items[buf] = {index, s.full + s.partial, s.full, 0};
    floatX* q_s = sm.q_s + buf * kTmaForwardGroups * kTileRows * HS;
    barrier_expect_bytes(&sm.q_full[buf], kTmaForwardGroups * kTileRows * HS * sizeof(floatX));
#pragma unroll
    for (int gr = 0; gr < kTmaForwardGroups; gr++) {
#pragma unroll
      for (int c = 0; c < kChunks; c++) {
        tma_load_qkv<kPaired>(q_s + (gr * kChunks + c) * kTileRows * 64, qkv_map, C, 0, h * HS + c * 64,
                              q_block * kKeys + gr * kTileRows, b, &sm.q_full[buf]);
      }
    }
    const int* docs_g = pairs.dw.documents + (size_t)b * T;
    for (int i = 0; i < s.full + s.partial; i++, n++) {
      const int stage = n % kStages, key0 = (q_block - i) * kKeys;
      barrier_wait(&sm.empty[stage], ((n / kStages) & 1) ^ 1);
      floatX* k_tile = sm.kv_s + stage * 2 * kKeys * HS;
      floatX* v_tile = k_tile + kKeys * HS;
      barrier_expect_bytes(&sm.full[stage], 2 * kTileBytes + kKeys * sizeof(int));
#pragma unroll
      for (int c = 0; c < kChunks; c++) {
#pragma unroll
        for (int r = 0; r < kKeys; r += 64) {
          tma_load_qkv<kPaired>(k_tile + (c * kKeys + r) * 64, qkv_map, C, 1, h * HS + c * 64, key0 + r, b,
                                &sm.full[stage]);
          tma_load_qkv<kPaired>(v_tile + (c * kKeys + r) * 64, qkv_map, C, 2, h * HS + c * 64, key0 + r, b,
                                &sm.full[stage]);
        }
      }
      bulk_copy_to_shared(sm.docs_s + stage * kKeys, docs_g + key0, kKeys * sizeof(int), &sm.full[stage]);
    }
  }
#endif
}

// The consumers: each warpgroup takes its 64 rows of every item through the run's key blocks and
// stores them. The turns carry on from item to item; warpgroup 0 takes the last turn warpgroup 1
// passes, so that every barrier's arrivals match its waits.
template <int HS>
__device__ void window_forward_consume(const WindowForwardSmem<HS>& sm, floatX* out, float* lse, int T, int NH,
                                       float scale_log2, int reach) {
#if FLASH_WGMMA
  constexpr int kKeys = kTmaForwardKeys, kStages = kTmaForwardStages;
  constexpr uint32_t kTileBytes = (uint32_t)tma_forward_tile_bytes<HS>();
  const int group = warpgroup_index(), warp = warp_in_group(), lane = threadIdx.x % WARP_SIZE;
  const int blocks = T / kKeys, C = NH * HS;
  const ProductTurns turns{group, false};
  if (group == 1) turns.pass(false);  // warpgroup 0 goes first
  const WgmmaDescriptor kv_desc = wgmma_descriptor(sm.kv_s, 16, 1024);
  const WgmmaDescriptor v_desc0 = wgmma_descriptor(sm.kv_s + kKeys * HS, kKeys * 128, 1024);
  for (int k = 0, n = 0;; k++) {
    const int buf = k % 2;
    barrier_wait(&sm.q_full[buf], (k / 2) & 1);
    const WindowForwardItem item = sm.items[buf];
    if (item.index < 0) break;
    const int q_block = item.index % blocks, bh = item.index / blocks, b = bh / NH, h = bh % NH;
    const int q0 = q_block * kKeys + group * kTileRows;
    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    const WgmmaDescriptor q_desc =
        wgmma_descriptor(sm.q_s + (buf * kTmaForwardGroups + group) * kTileRows * HS, 16, 1024);
    float o[HS / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    int row_doc[2];
    for (int i = 0; i < item.tiles; i++, n++) {
      const int stage = n % kStages, key0 = (q_block - i) * kKeys;
      barrier_wait(&sm.full[stage], (n / kStages) & 1);
      const WgmmaDescriptor k_desc = kv_desc + stage * (2 * kTileBytes / 16);
      const WgmmaDescriptor v_desc = v_desc0 + stage * (2 * kTileBytes / 16);
      const int* key_docs = sm.docs_s + stage * kKeys;
      if (i == 0) {  // the query block's own keys: their documents are its rows'
        row_doc[0] = key_docs[row[0] - key0];
        row_doc[1] = key_docs[row[1] - key0];
      }
      const DocumentMask mask{key_docs, {row_doc[0], row_doc[1]}, reach};
      if (i == 0 && group == 0) {  // the diagonal: warpgroup 0's rows have their keys in its first 64 rows
        forward_tile<HS, kKeys, 64, true>(o, row_max, row_sum, q_desc, k_desc, v_desc, key0, row, scale_log2, turns,
                                          false, mask);
      } else if (i == 0 || i > item.full) {  // the partial blocks: position and document
        forward_tile<HS, kKeys, kKeys, true>(o, row_max, row_sum, q_desc, k_desc, v_desc, key0, row, scale_log2,
                                             turns, false, mask);
      } else {
        forward_tile<HS, kKeys, kKeys, false>(o, row_max, row_sum, q_desc, k_desc, v_desc, key0, row, scale_log2,
                                              turns, false);
      }
      warp_release(&sm.empty[stage]);
    }
    warp_release(&sm.q_empty[buf]);
    store_forward_rows<HS>(out + (size_t)b * T * C + h * HS, lse + (size_t)bh * T, C, T, q0 + warp * 16, o, row_max,
                           row_sum);
  }
  if (group == 0) turns.wait();
#endif
}

// kPaired: qkv is paired_qkv_tensor_map's view (PairedRows), the rest as without.
template <int HS, bool kPaired>
__global__ void __launch_bounds__(kWindowForwardThreads, 1) attention_forward_window_tma_kernel(
    const __grid_constant__ CUtensorMap qkv_map, floatX* out, float* lse, int T, int NH, int heads, float scale_log2,
    WindowPairs pairs, int* work_counter) {
#if FLASH_WGMMA
  static_assert(kTmaForwardKeys == llmc::kAttentionBlock, "a key tile is a key block");
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  const WindowForwardSmem<HS> sm(flash_smem);
  if (threadIdx.x == 0) {
    release_barriers_init(sm.empty, kTmaForwardStages, kWindowForwardWarps);
    release_barriers_init(sm.q_empty, 2, kWindowForwardWarps);
    copy_barriers_init(sm.q_full, 2);
    copy_barriers_init(sm.full, kTmaForwardStages);  // its fences cover all four
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  if (threadIdx.x >= kTmaForwardThreads) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x == kTmaForwardThreads) {
      window_forward_produce<HS, kPaired>(sm, &qkv_map, T, NH, heads, pairs, work_counter);
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    window_forward_consume<HS>(sm, out, lse, T, NH, scale_log2, pairs.reach);
  }
#else
  __trap();  // launched only where hopper_support().usable
#endif
}

// d[b, h, t] = sum over the head's channels of dout * out: the rowwise term of the softmax
// gradient, computed once for both backward kernels. HS/8 lanes per (b, t, h) row, each with one
// 16-byte piece of dout and of out, then a fixed shuffle tree over those lanes.
template <int HS>
__global__ void attention_backward_flash_dot_kernel(float* d, const floatX* dout, const floatX* out,
                                                    int B, int T, int NH) {
  constexpr int kLanes = HS / x128::size;
  const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t w = thread / kLanes, rows = (size_t)B * T * NH;
  const int piece = thread % kLanes;
  x128 x = {}, y = {};
  if (w < rows) {  // the lanes past the end still take part in the shuffles
    x = load128(dout + w * HS + piece * x128::size);
    y = load128(out + w * HS + piece * x128::size);
  }
  const float sum = attention_row_dot(x, y, kLanes);
  if (piece == 0 && w < rows) {
    const int h = w % NH;
    const size_t bt = w / NH;
    const int b = bt / T, t = bt % T;
    d[((size_t)b * NH + h) * T + t] = sum;
  }
}

// Query tile i of the dK/dV kernel: the q and dout rows (row strides 3C and C) and their lse
// and dot. Rows past T get lse = +inf, so their probabilities are exactly zero.
template <int HS>
__device__ __forceinline__ void load_query_tile(floatX* q_s, floatX* do_s, float* lse_s, float* dot_s,
                                                const floatX* q_g, const floatX* do_g, const float* lse_g,
                                                const float* dot_g, int C, int i, int T) {
  constexpr int kQRows = dkdv_query_rows<HS>();
  load_tile<HS, kQRows>(q_s, q_g, 3 * (size_t)C, i * kQRows, T);
  load_tile<HS, kQRows>(do_s, do_g, C, i * kQRows, T);
  for (int r = threadIdx.x; r < kQRows; r += kThreads) {
    const int q = i * kQRows + r;
    lse_s[r] = q < T ? lse_g[q] : INFINITY;
    dot_s[r] = q < T ? dot_g[q] : 0.0f;
  }
}

// The rest of a dK/dV step once S^T (p, masked) and dP^T (dp) of a query tile are formed: P and
// dS = P * (dP - dot) from the forward's lse, dS stored to its scratch tile (at query column q0 of
// ds_tile), then dV += P^T dO and dK += dS^T Q in one batch.
// P^T and dS^T in place of S^T (p, masked) and dP^T (dp) of a warp's 16 keys and kQRows queries:
// P from the forward's lse, dS = P * (dP - dot).
template <int kQRows>
__device__ __forceinline__ void softmax_gradient_scores(float p[kQRows / 8][4], float dp[kQRows / 8][4],
                                                        const float* lse_tile, const float* dot_tile, float scale_log2) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < kQRows / 8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int c = n * 8 + 2 * t + (e % 2);
      const float prob = exp2_ftz(fmaf(p[n][e], scale_log2, -lse_tile[c]));
      p[n][e] = prob;
      dp[n][e] = prob * (dp[n][e] - dot_tile[c]);
    }
  }
}

template <int HS, int kQRows>
__device__ __forceinline__ void dkdv_step(float dk[HS / 8][4], float dv[HS / 8][4], float p[kQRows / 8][4],
                                          float dp[kQRows / 8][4], const float* lse_tile, const float* dot_tile,
                                          float scale_log2, floatX* ds_tile, int q0, const floatX* q_tile,
                                          const floatX* do_tile) {
  softmax_gradient_scores<kQRows>(p, dp, lse_tile, dot_tile, scale_log2);
  store_ds_rows<kQRows>(ds_tile, q0, dp);
  uint32_t p_frag[kQRows / 16][4], ds_frag[kQRows / 16][4];
  scores_to_fragments<kQRows>(p_frag, p);
  scores_to_fragments<kQRows>(ds_frag, dp);
  mma_batch_begin();
  issue_accumulate<HS, kQRows>(dv, p_frag, do_tile);
  issue_accumulate<HS, kQRows>(dk, ds_frag, q_tile);
  mma_batch_end();
  mma_result<HS / 8>(dv);
  mma_result<HS / 8>(dk);
}

// A dK/dV block's end: its key tile's dK (times scale) and dV rows into dqkv, and their column
// sums into tile_sums (if given; tiles per sequence in a row of it) through the block's shared
// memory, which every warp must be done reading: the barrier waits for them.
template <int HS>
__device__ __forceinline__ void store_dkdv(floatX* dqkv, float* tile_sums, unsigned char* smem, const float dk[HS / 8][4],
                                           const float dv[HS / 8][4], int b, int h, int kv_tile, int tiles, int T,
                                           int NH, float scale) {
  const int C = NH * HS, r0 = kv_tile * kTileRows + threadIdx.x / WARP_SIZE * 16;
  const size_t ld = 3 * (size_t)C;
  floatX* dk_g = dqkv + (size_t)b * T * ld + C + h * HS;
  store_rows<HS>(dk_g, ld, r0, T, dk, scale, scale);
  store_rows<HS>(dk_g + C, ld, r0, T, dv, 1.0f, 1.0f);
  if (tile_sums) {
    __syncthreads();
    float* sums = tile_sums + ((size_t)b * tiles + kv_tile) * ld + C + h * HS;
    float* warp_sums = reinterpret_cast<float*>(smem);
    store_tile_column_sums<HS>(sums, warp_sums, r0, T, dk, scale);
    store_tile_column_sums<HS>(sums + C, warp_sums + 4 * HS, r0, T, dv, 1.0f);
  }
}

// dK and dV of one 64-row key tile over the query chunks that see it (Pairs: CausalPairs, or
// WindowPairs on every GPU; causal attention on Hopper at head size 64 launches
// attention_backward_flash_dkdv_tma_kernel below): the transposed scores S^T = K Q^T are formed
// directly, so the probabilities P^T are in the layout that multiplies dO (dV += P^T dO) and Q
// (dK += dS^T Q). tile_sums (optional, [B * gridDim.x][3C]): the column sums of the tile's dK and
// dV rows. At head size 64, 3 blocks per SM (168 registers): ptxas then spills a few bytes and
// serialises some wgmma, but the extra warps hide more latency (faster on the d12 shape).
template <int HS, class Pairs>
__global__ void __launch_bounds__(kThreads, HS == 64 ? 3 : 1) attention_backward_flash_dkdv_kernel(
    floatX* dqkv, float* tile_sums, floatX* ds, const floatX* qkv, const floatX* dout, const float* lse,
    const float* dot, int T, int NH, float scale_log2, float scale, Pairs pairs) {
  constexpr int kQRows = dkdv_query_rows<HS>();
  constexpr int kKTile = kTileRows * HS, kQTile = kQRows * HS;
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  floatX* k_s = reinterpret_cast<floatX*>(flash_smem);
  floatX* v_s = k_s + kKTile;
  floatX* q_s = v_s + kKTile;        // two buffers
  floatX* do_s = q_s + 2 * kQTile;   // two buffers
  float* lse_s = reinterpret_cast<float*>(do_s + 2 * kQTile);  // two buffers of kQRows
  float* dot_s = lse_s + 2 * kQRows;                           // two buffers of kQRows
  const int kv_tile = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int g = lane / 4, t = lane % 4, kv0 = kv_tile * kTileRows;
  const size_t ld = 3 * (size_t)C;
  const floatX* q_g = qkv + (size_t)b * T * ld + h * HS;
  const floatX* k_g = q_g + C;
  const floatX* v_g = q_g + 2 * C;
  const floatX* do_g = dout + (size_t)b * T * C + h * HS;
  const float* lse_g = lse + (size_t)bh * T;
  const float* dot_g = dot + (size_t)bh * T;
  // Chunk `first` holds the key tile's own rows, which every Pairs sees.
  const int first = kv0 / kQRows, end = ceil_div(pairs.query_end(kv_tile), kQRows);
  auto next_chunk = [&](int i) {
    do {
      i++;
    } while (i < end && !pairs.sees(b, i * kQRows, kv_tile));
    return i;
  };
  load_tile<HS, kTileRows>(k_s, k_g, ld, kv0, T);
  load_tile<HS, kTileRows>(v_s, v_g, ld, kv0, T);
  load_query_tile<HS>(q_s, do_s, lse_s, dot_s, q_g, do_g, lse_g, dot_g, C, first, T);
  copy_async_commit();
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  const int kv_row[2] = {kv0 + warp * 16 + g, kv0 + warp * 16 + g + 8};
  const int kv_doc[2] = {pairs.key_document(b, kv_row[0]), pairs.key_document(b, kv_row[1])};
  for (int i = first, buf = 0, next; i < end; i = next, buf ^= 1) {
    next = next_chunk(i);
    if (next < end) {
      load_query_tile<HS>(q_s + (1 - buf) * kQTile, do_s + (1 - buf) * kQTile, lse_s + (1 - buf) * kQRows,
                          dot_s + (1 - buf) * kQRows, q_g, do_g, lse_g, dot_g, C, next, T);
      copy_async_commit();
      wait_tile_copies<1>();
    } else {
      wait_tile_copies<0>();
    }
    __syncthreads();
    const floatX* q_tile = q_s + buf * kQTile;
    const floatX* do_tile = do_s + buf * kQTile;
    const float* lse_tile = lse_s + buf * kQRows;
    const float* dot_tile = dot_s + buf * kQRows;
    // S^T and dP^T, then dV and dK, are independent pairs: one batch each.
    float p[kQRows / 8][4], dp[kQRows / 8][4];
    uint32_t k_frag[HS / 16][4], v_frag[HS / 16][4];  // loaded where used, as in the forward kernel
    load_row_fragments<HS>(k_frag, k_s);
    load_row_fragments<HS>(v_frag, v_s);
    mma_batch_begin();
    issue_rows_product<HS, kQRows>(p, k_frag, q_tile);
    issue_rows_product<HS, kQRows>(dp, v_frag, do_tile);
    mma_batch_end();
    mma_result<kQRows / 8>(p);
    mma_result<kQRows / 8>(dp);
    if (pairs.masks(b, i * kQRows, kv_tile)) {  // a hidden key: score -inf, probability 0
#pragma unroll
      for (int n = 0; n < kQRows / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int q = i * kQRows + n * 8 + 2 * t + e % 2;
          if (pairs.hidden(b, q, kv_row[e / 2], kv_doc[e / 2])) p[n][e] = -INFINITY;
        }
      }
    }
    dkdv_step<HS, kQRows>(dk, dv, p, dp, lse_tile, dot_tile, scale_log2,
                          ds + pairs.ds_tile(bh, i * kQRows / kTileRows, kv_tile), i * kQRows % kTileRows, q_tile,
                          do_tile);
    __syncthreads();  // the next iteration's copies overwrite the other buffer
  }
  store_dkdv<HS>(dqkv, tile_sums, flash_smem, dk, dv, b, h, kv_tile, gridDim.x, T, NH, scale);
}

// ---- dK/dV on Hopper: the forward's bulk tensor copies and barriers in shared memory ----
// The same work as attention_backward_flash_dkdv_kernel at head size 64, with the forward's
// structure: one thread starts each query tile's copies (q, dout, lse and dot) through the TMA into
// a ring of stages, each with an mbarrier that completes when its bytes land, and S^T = K Q^T and
// dP^T = V dO^T read K and V from shared memory (no fragment registers). The block is one
// warpgroup, whose 4 warps meet at every product, so once thread 0's wait for a tile's last
// products returns, every warp is done with its stage and thread 0 refills it: no block barrier.
// lse and dot rows past T read zeros; those queries are masked instead.
constexpr int kTmaDkdvStages = 3;
constexpr int kTmaDkdvStageBytes = 17 * 1024;  // q and dout tiles (8 KiB each), lse, dot, padding

constexpr size_t tma_dkdv_smem_bytes() {
  return 2 * kTileRows * 64 * sizeof(floatX) + kTmaDkdvStages * kTmaDkdvStageBytes + (kTmaDkdvStages + 1) * sizeof(uint64_t);
}

#if FLASH_WGMMA
// A box of a 2D FP32 tensor map (inner coordinate first) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_box_2d(void* dst, const CUtensorMap* map, int inner, int outer,
                                                uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          shared_address(dst)),
      "l"((uint64_t)map), "r"(inner), "r"(outer), "r"(shared_address(bar))
      : "memory");
}
#endif

__global__ void __launch_bounds__(kThreads, 3) attention_backward_flash_dkdv_tma_kernel(
    const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
    const __grid_constant__ CUtensorMap lse_map, const __grid_constant__ CUtensorMap dot_map, floatX* dqkv,
    float* tile_sums, floatX* ds, int T, int NH, int tail_heads, float scale_log2, float scale) {
#if FLASH_WGMMA
  constexpr int HS = 64, kQRows = 64, kStages = kTmaDkdvStages, kTileBytes = kTileRows * HS * sizeof(floatX);
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  floatX* k_s = reinterpret_cast<floatX*>(flash_smem);
  floatX* v_s = k_s + kTileRows * HS;
  unsigned char* stages = flash_smem + 2 * kTileBytes;  // stage s: q, dout, lse, dot
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kTmaDkdvStageBytes);
  uint64_t* kv_full = full + kStages;
  const CausalBlockWork work = causal_block_work(tail_heads);
  const int kv_tile = work.rank, bh = work.bh, b = bh / NH, h = bh % NH;
  const int C = NH * HS, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int g = lane / 4, t = lane % 4, kv0 = kv_tile * kTileRows;
  const int first = kv0 / kQRows, last = ceil_div(T, kQRows) - 1;
  auto stage_q = [&](int i) { return reinterpret_cast<floatX*>(stages + (i - first) % kStages * kTmaDkdvStageBytes); };
  // Starts the copies of query tile i into its stage.
  auto load_query_tile = [&](int i) {
    const int stage = (i - first) % kStages;
    floatX* q_tile = stage_q(i);
    floatX* do_tile = q_tile + kQRows * HS;
    float* lse_tile = reinterpret_cast<float*>(do_tile + kQRows * HS);
    barrier_expect_bytes(&full[stage], 2 * kTileBytes + 2 * kQRows * sizeof(float));
    tma_load_box(q_tile, &qkv_map, h * HS, i * kQRows, b, &full[stage]);
    tma_load_box(do_tile, &dout_map, h * HS, i * kQRows, b, &full[stage]);
    tma_load_box_2d(lse_tile, &lse_map, i * kQRows, bh, &full[stage]);
    tma_load_box_2d(lse_tile + kQRows, &dot_map, i * kQRows, bh, &full[stage]);
  };
  if (threadIdx.x == 0) {
    copy_barriers_init(full, kStages + 1);  // and kv_full
    barrier_expect_bytes(kv_full, 2 * kTileBytes);
    tma_load_box(k_s, &qkv_map, C + h * HS, kv0, b, kv_full);
    tma_load_box(v_s, &qkv_map, 2 * C + h * HS, kv0, b, kv_full);
    for (int i = first; i < first + kStages && i <= last; i++) load_query_tile(i);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  const WgmmaDescriptor k_desc = wgmma_descriptor(k_s, 16, 1024), v_desc = wgmma_descriptor(v_s, 16, 1024);
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  const int kv_row[2] = {kv0 + warp * 16 + g, kv0 + warp * 16 + g + 8};
  barrier_wait(kv_full, 0);
  for (int i = first; i <= last; i++) {
    const int n_tile = i - first;
    barrier_wait(&full[n_tile % kStages], (n_tile / kStages) & 1);
    const floatX* q_tile = stage_q(i);
    const floatX* do_tile = q_tile + kQRows * HS;
    const float* lse_tile = reinterpret_cast<const float*>(do_tile + kQRows * HS);
    const float* dot_tile = lse_tile + kQRows;
    const WgmmaDescriptor q_desc = wgmma_descriptor(q_tile, 16, 1024), do_desc = wgmma_descriptor(do_tile, 16, 1024);
    // S^T and dP^T, then dV and dK, are independent pairs: one batch each.
    float p[kQRows / 8][4], dp[kQRows / 8][4];
    mma_batch_begin();
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
      if (kk == 0) {
        wgmma_shared_m64k16<kQRows, false>(p, k_desc, q_desc);
        wgmma_shared_m64k16<kQRows, false>(dp, v_desc, do_desc);
      } else {
        wgmma_shared_m64k16<kQRows, true>(p, k_desc + kk * 2, q_desc + kk * 2);
        wgmma_shared_m64k16<kQRows, true>(dp, v_desc + kk * 2, do_desc + kk * 2);
      }
    }
    mma_batch_end();
    mma_result<kQRows / 8>(p);
    mma_result<kQRows / 8>(dp);
    // A key is hidden from the queries before it (score -inf, probability 0); queries past T
    // (zeros from the copies) are dropped the same way.
    if (i * kQRows < kv0 + kTileRows || (i + 1) * kQRows > T) {
#pragma unroll
      for (int n = 0; n < kQRows / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int q = i * kQRows + n * 8 + 2 * t + e % 2;
          if (q < kv_row[e / 2] || q >= T) p[n][e] = -INFINITY;
        }
      }
    }
    dkdv_step<HS, kQRows>(dk, dv, p, dp, lse_tile, dot_tile, scale_log2,
                          ds + ds_tile_offset(bh, i, kv_tile, gridDim.x), 0, q_tile, do_tile);
    if (threadIdx.x == 0 && i + kStages <= last) load_query_tile(i + kStages);
  }
  store_dkdv<HS>(dqkv, tile_sums, flash_smem, dk, dv, b, h, kv_tile, gridDim.x, T, NH, scale);
#else
  __trap();  // launched only where hopper_support().usable
#endif
}

// ---- The windowed dK/dV on Hopper ----
// attention_backward_flash_dkdv_kernel's work for WindowPairs with the Hopper forward's structure:
// block (i, bh) takes key block i (128 keys) of head bh, each warpgroup 64 of them (its key tile),
// with the block's K and V in shared memory, and streams the query tiles of the query blocks that
// see it through a ring of TMA stages (q, dout, lse, dot), both operands of S^T = K Q^T and
// dP^T = V dO^T read from shared memory, P^T and dS^T as A fragments for dV += P^T dO and
// dK += dS^T Q. Both warpgroups read every stage (warpgroup 1 skips the products of the key
// block's first query tile, all of whose queries precede its keys), and the last warp done with
// a stage starts its refill, as in the forward. A tile's dV and dK products still run when the
// next tile's S^T and dP^T are issued. Tiles in the Hopper forward's layout: 64-column chunks of
// all the tile's rows, one after another. Nothing in the loop reads global memory:
// the query blocks that see the key block, and whether through the mask, are listed once at the
// start (a warp, a lane a query block), and each stage brings its queries' documents. The list
// gives each tile's successor at once: a search of the query blocks at every tile, by one lane
// with the warp waiting, was a fifth of the warps' time. Three stages: with the list a tile is
// short enough that two left the copies' latency showing.
constexpr int kTmaWindowDkdvStages = 3;

template <int HS>
constexpr size_t tma_window_dkdv_stage_bytes() {  // q and dout tiles, lse, dot and documents, to 1 KiB
  return (2 * kTileRows * HS * sizeof(floatX) + 2 * kTileRows * sizeof(float) + kTileRows * sizeof(int) + 1023) /
         1024 * 1024;
}
// The kernel's shared memory: K and V, the stages, their barriers and counts, and the list of the
// query blocks that see the key block (of the attention_window_run that may, at most T / 128),
// with its length.
template <int HS>
size_t tma_window_dkdv_smem_bytes(llmc::AttentionWindow window, int T) {
  const size_t blocks = std::min(llmc::attention_window_run(window), T / llmc::kAttentionBlock);
  return 2 * llmc::kAttentionBlock * HS * sizeof(floatX) + kTmaWindowDkdvStages * tma_window_dkdv_stage_bytes<HS>() +
         (kTmaWindowDkdvStages + 1) * sizeof(uint64_t) + (kTmaWindowDkdvStages + 1) * sizeof(int) +
         (blocks * sizeof(uint16_t) + 15) / 16 * 16;
}

// Element (r, col) of a 64-row part of a tile in shared memory held as 64-column chunks of
// chunk_rows rows of 128 bytes, the 16-byte units of row r in the order unit ^ (r % 8): a warp's
// fragments (8 rows, 4 lanes a row) and 8 lanes' units of a row each meet every bank once.
__device__ __forceinline__ int staged_offset(int r, int col, int chunk_rows) {
  return (col / 64) * chunk_rows * 64 + r * 64 + (((col % 64) / 8) ^ (r % 8)) * 8 + col % 8;
}

// A warpgroup's accumulators (64 rows of HS, C fragments), times scale and rounded, into its part
// of a tile in shared memory (staged_offset's layout).
template <int HS>
__device__ __forceinline__ void stage_rows(floatX* tile, int chunk_rows, const float acc[HS / 8][4], float scale) {
  const int lane = threadIdx.x % WARP_SIZE, r = warp_in_group() * 16 + lane / 4, t = lane % 4;
#pragma unroll
  for (int dn = 0; dn < HS / 8; dn++) {
    const int col = dn * 8 + 2 * t;
    *reinterpret_cast<uint32_t*>(tile + staged_offset(r, col, chunk_rows)) =
        pack_bf16x2(acc[dn][0] * scale, acc[dn][1] * scale);
    *reinterpret_cast<uint32_t*>(tile + staged_offset(r + 8, col, chunk_rows)) =
        pack_bf16x2(acc[dn][2] * scale, acc[dn][3] * scale);
  }
}

// The 64 rows that stage_rows wrote, from row0 of dst (leading dimension ld, or PairedRows) on, rows
// >= T left out: 16 bytes a lane, consecutive lanes along a row.
template <int HS, class Rows>
__device__ __forceinline__ void store_staged_rows(floatX* dst, Rows rows, int row0, int T, const floatX* tile,
                                                  int chunk_rows) {
  constexpr int kUnitsPerRow = HS / 8;
#pragma unroll
  for (int k = threadIdx.x % kThreads; k < kTileRows * kUnitsPerRow; k += kThreads) {
    const int r = k / kUnitsPerRow, col = k % kUnitsPerRow * 8;
    if (row0 + r < T) {
      *reinterpret_cast<int4*>(dst + row_offset(rows, row0 + r) + col) =
          *reinterpret_cast<const int4*>(tile + staged_offset(r, col, chunk_rows));
    }
  }
}

// kPaired: qkv is paired_qkv_tensor_map's view and dqkv's rows PairedRows; qk_rstd and the rotary's
// positions those of the tokens' heads (qk_norm_row).
template <int HS, bool kPaired>
__global__ void __launch_bounds__(2 * kThreads, 1) attention_backward_window_dkdv_tma_kernel(
    const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
    const __grid_constant__ CUtensorMap lse_map, const __grid_constant__ CUtensorMap dot_map, floatX* dqkv, floatX* ds,
    int T, int NH, float scale_log2, float scale, WindowPairs pairs, const float* qk_rstd,
    const __grid_constant__ RotaryFrequencies freq) {
#if FLASH_WGMMA
  constexpr int kKeys = llmc::kAttentionBlock, kStages = kTmaWindowDkdvStages, kChunks = HS / 64;
  constexpr uint32_t kQTileBytes = kTileRows * HS * sizeof(floatX), kStageBytes = tma_window_dkdv_stage_bytes<HS>();
  constexpr int kWarps = 2 * kThreads / WARP_SIZE;
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  floatX* k_s = reinterpret_cast<floatX*>(flash_smem);
  floatX* v_s = k_s + kKeys * HS;
  unsigned char* stages = reinterpret_cast<unsigned char*>(v_s + kKeys * HS);  // q, dout, lse, dot
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kStageBytes);
  uint64_t* kv_full = full + kStages;
  int* done_warps = reinterpret_cast<int*>(kv_full + 1);  // per stage, over all its fills
  int* seen_count = done_warps + kStages;
  // The query blocks that see the key block, in order: each one's distance from the key block,
  // kMasked added if it sees it through the mask.
  uint16_t* seen = reinterpret_cast<uint16_t*>(seen_count + 1);
  constexpr uint16_t kMasked = 0x8000;
  const int key_block = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int group = warpgroup_index(), warp = warp_in_group(), lane = threadIdx.x % WARP_SIZE;
  const int t = lane % 4, C = NH * HS, kv_tile = key_block * kTilesPerAttentionBlock + group;
  // The n-th query tile: both of each query block that sees the key block, in order.
  auto query_tile = [&](int n) {
    return (key_block + (seen[n / kTilesPerAttentionBlock] & ~kMasked)) * kTilesPerAttentionBlock +
           n % kTilesPerAttentionBlock;
  };
  auto load_query_tile = [&](int i, int n) {  // tile i as the n-th, into stage n % kStages
    const int stage = n % kStages;
    floatX* q_tile = reinterpret_cast<floatX*>(stages + stage * kStageBytes);
    floatX* do_tile = q_tile + kTileRows * HS;
    float* lse_tile = reinterpret_cast<float*>(do_tile + kTileRows * HS);
    int* docs_tile = reinterpret_cast<int*>(lse_tile + 2 * kTileRows);
    barrier_expect_bytes(&full[stage], 2 * kQTileBytes + 2 * kTileRows * sizeof(float) + kTileRows * sizeof(int));
#pragma unroll
    for (int c = 0; c < kChunks; c++) {
      tma_load_qkv<kPaired>(q_tile + c * kTileRows * 64, &qkv_map, C, 0, h * HS + c * 64, i * kTileRows, b,
                            &full[stage]);
      tma_load_box(do_tile + c * kTileRows * 64, &dout_map, h * HS + c * 64, i * kTileRows, b, &full[stage]);
    }
    tma_load_box_2d(lse_tile, &lse_map, i * kTileRows, bh, &full[stage]);
    tma_load_box_2d(lse_tile + kTileRows, &dot_map, i * kTileRows, bh, &full[stage]);
    bulk_copy_to_shared(docs_tile, pairs.dw.documents + (size_t)b * T + i * kTileRows, kTileRows * sizeof(int),
                        &full[stage]);
  };
  const int first = key_block * kTilesPerAttentionBlock;  // the key block's own query tiles see it
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) done_warps[s] = 0;
    copy_barriers_init(full, kStages + 1);  // and kv_full
    barrier_expect_bytes(kv_full, 2 * kKeys * HS * sizeof(floatX));
#pragma unroll
    for (int c = 0; c < kChunks; c++) {
#pragma unroll
      for (int r = 0; r < kKeys; r += 64) {
        tma_load_qkv<kPaired>(k_s + (c * kKeys + r) * 64, &qkv_map, C, 1, h * HS + c * 64, key_block * kKeys + r, b,
                              kv_full);
        tma_load_qkv<kPaired>(v_s + (c * kKeys + r) * 64, &qkv_map, C, 2, h * HS + c * 64, key_block * kKeys + r, b,
                              kv_full);
      }
    }
    for (int n = 0; n < kTilesPerAttentionBlock; n++) load_query_tile(first + n, n);
  }
  if (threadIdx.x / WARP_SIZE == 1) {  // the list, a lane a query block, while thread 0 starts copies
    const int blocks = pairs.query_end(kv_tile) / kKeys - key_block;
    int count = 0;
    for (int d0 = 0; d0 < blocks; d0 += WARP_SIZE) {
      const int d = d0 + lane, q0 = (key_block + d) * kKeys;
      const bool sees = d < blocks && pairs.sees(b, q0, kv_tile);
      const unsigned ballot = __ballot_sync(~0u, sees);
      if (sees) seen[count + __popc(ballot & ((1u << lane) - 1))] = d | (pairs.masks(b, q0, kv_tile) ? kMasked : 0);
      count += __popc(ballot);
    }
    if (lane == 0) *seen_count = count;
  }
  __syncthreads();  // the barriers and the list are ready before anyone uses them
  const int tiles = *seen_count * kTilesPerAttentionBlock;
  if (threadIdx.x == 0) {  // the stages past the key block's own query tiles, from the list
    for (int n = kTilesPerAttentionBlock; n < kStages && n < tiles; n++) load_query_tile(query_tile(n), n);
  }

  // This warpgroup's 64 keys: rows 64 * group of the K and V tiles (K-major A operands).
  const WgmmaDescriptor k_desc = wgmma_descriptor(k_s + group * kTileRows * 64, 16, 1024);
  const WgmmaDescriptor v_desc = wgmma_descriptor(v_s + group * kTileRows * 64, 16, 1024);
  // dK and dV start from their first tile's products, not from zeros: a zeroing before the loop
  // would make the compiler wait for each batch of products before the next (its products run
  // on across the loop's turns). Every warpgroup has a first tile: its key tile's own queries.
  float dk[HS / 8][4], dv[HS / 8][4];
  const int kv_row[2] = {kv_tile * kTileRows + warp * 16 + lane / 4, kv_tile * kTileRows + warp * 16 + lane / 4 + 8};
  const int kv_doc[2] = {pairs.key_document(b, kv_row[0]), pairs.key_document(b, kv_row[1])};
  // A warp done with the n-th tile counts itself out of its stage; the stage's last reader starts
  // the copies of the tile kStages further on.
  auto release_stage = [&](int n) {
    if (lane == 0 && n + kStages < tiles) {
      __threadfence_block();
      if (atomicAdd(&done_warps[n % kStages], 1) + 1 == (n / kStages + 1) * kWarps) {
        load_query_tile(query_tile(n + kStages), n + kStages);
      }
    }
  };
  // A tile's dV and dK products still run, reading its stage, when the next tile's S^T and dP^T are
  // issued, so the tensor cores go from one batch to the next with no wait between them.
  int running_n = -1;  // the tile whose dV and dK products are in flight, if any
  barrier_wait(kv_full, 0);
  for (int n = 0; n < tiles; n++) {
    const int i = query_tile(n), stage = n % kStages;
    barrier_wait(&full[stage], (n / kStages) & 1);
    const floatX* q_tile = reinterpret_cast<const floatX*>(stages + stage * kStageBytes);
    const floatX* do_tile = q_tile + kTileRows * HS;
    const float* lse_tile = reinterpret_cast<const float*>(do_tile + kTileRows * HS);
    const int* docs_tile = reinterpret_cast<const int*>(lse_tile + 2 * kTileRows);
    if (i >= kv_tile) {
      const WgmmaDescriptor q_desc = wgmma_descriptor(q_tile, 16, 1024), do_desc = wgmma_descriptor(do_tile, 16, 1024);
      float p[kTileRows / 8][4], dp[kTileRows / 8][4];
      mma_batch_begin();
#pragma unroll
      for (int kk = 0; kk < HS / 16; kk++) {
        // Columns 16kk.. : chunk kk / 4 (the key tiles' chunks 16 KiB apart, the query tiles' 8 KiB),
        // 32 bytes further into the rows per step within it.
        const uint32_t key_step = (kk / 4) * (kKeys * 128 / 16) + (kk % 4) * 2;
        const uint32_t query_step = (kk / 4) * (kTileRows * 128 / 16) + (kk % 4) * 2;
        if (kk == 0) {
          wgmma_shared_m64k16<kTileRows, false>(p, k_desc, q_desc);
          wgmma_shared_m64k16<kTileRows, false>(dp, v_desc, do_desc);
        } else {
          wgmma_shared_m64k16<kTileRows, true>(p, k_desc + key_step, q_desc + query_step);
          wgmma_shared_m64k16<kTileRows, true>(dp, v_desc + key_step, do_desc + query_step);
        }
      }
      wgmma_commit();
      if (running_n >= 0) {
        wgmma_wait<1>();
        mma_result<HS / 8>(dv);
        mma_result<HS / 8>(dk);
        release_stage(running_n);
      }
      wgmma_wait<0>();
      mma_result<kTileRows / 8>(p);
      mma_result<kTileRows / 8>(dp);
      if (seen[n / kTilesPerAttentionBlock] & kMasked) {  // a hidden key: score -inf, probability 0
#pragma unroll
        for (int nn = 0; nn < kTileRows / 8; nn++) {
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int c = nn * 8 + 2 * t + e % 2;
            if (pairs.hidden_from(i * kTileRows + c, docs_tile[c], kv_row[e / 2], kv_doc[e / 2])) p[nn][e] = -INFINITY;
          }
        }
      }
      softmax_gradient_scores<kTileRows>(p, dp, lse_tile, lse_tile + kTileRows, scale_log2);
      store_ds_rows<kTileRows>(ds + pairs.ds_tile(bh, i, kv_tile), 0, dp);
      uint32_t p_frag[kTileRows / 16][4], ds_frag[kTileRows / 16][4];
      scores_to_fragments<kTileRows>(p_frag, p);
      scores_to_fragments<kTileRows>(ds_frag, dp);
      mma_batch_begin();
      const bool accumulate = running_n >= 0;
      issue_accumulate_chunked<HS, kTileRows>(dv, p_frag, wgmma_descriptor(do_tile, kTileRows * 128, 1024), accumulate);
      issue_accumulate_chunked<HS, kTileRows>(dk, ds_frag, wgmma_descriptor(q_tile, kTileRows * 128, 1024), accumulate);
      wgmma_commit();
      running_n = n;
    } else {
      release_stage(n);
    }
  }
  wgmma_wait<0>();
  mma_result<HS / 8>(dv);
  mma_result<HS / 8>(dk);
  // dK and dV leave through this warpgroup's rows of the K and V tiles, which no product reads any
  // more: the fragments into them, then whole rows out in 16-byte stores (the fragments' own stores
  // would be 4 bytes each, 4 times as many, and the block's end waits for all of them).
  floatX* dk_s = k_s + group * kTileRows * 64;
  floatX* dv_s = v_s + group * kTileRows * 64;
  if (qk_rstd) {  // QK-norm's backward, y being the K tile's rows that dK is about to replace
    const QkNormRow key[2] = {qk_norm_row<kPaired>(freq, b, kv_row[0], T, h, NH),
                              qk_norm_row<kPaired>(freq, b, kv_row[1], T, h, NH)};
    const float rstd[2] = {qk_rstd[key[0].rstd_q + key[0].heads], qk_rstd[key[1].rstd_q + key[1].heads]};
    auto y = [&](int row, int dn) {
      const int offset = staged_offset(warp * 16 + lane / 4 + 8 * row, dn * 8 + 2 * t, kKeys);
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dk_s + offset));
    };
    const int position[2] = {key[0].position, key[1].position};
    qk_norm_rotary_backward_rows<HS>(dk, scale, y, rstd, position, freq);
    stage_rows<HS>(dk_s, kKeys, dk, 1.0f);
  } else {
    stage_rows<HS>(dk_s, kKeys, dk, scale);
  }
  stage_rows<HS>(dv_s, kKeys, dv, 1.0f);
  named_barrier_sync(1 + group, kThreads);  // this warpgroup's rows are in
  const size_t part = qkv_part<kPaired>(C);
  floatX* dk_g = dqkv + (size_t)b * T * 3 * C + part + h * HS;
  store_staged_rows<HS>(dk_g, qkv_rows<kPaired>(C), kv_tile * kTileRows, T, dk_s, kKeys);
  store_staged_rows<HS>(dk_g + part, qkv_rows<kPaired>(C), kv_tile * kTileRows, T, dv_s, kKeys);
#else
  __trap();  // launched only where hopper_support().usable
#endif
}

// A dS tile (8 KiB, contiguous) global -> shared.
__device__ __forceinline__ void load_ds_tile(floatX* dst, const floatX* src) {
#pragma unroll
  for (int k = 0; k < kDsTileElements / 8 / kThreads; k++) {
    const int i = threadIdx.x + k * kThreads;
    copy_async_16(dst + i * 8, src + i * 8, true);
  }
}

// dQ = dS K of one 64-row query tile, looping over the key tiles it sees (Pairs) with the dS
// tiles the dK/dV kernel wrote, each step's copies two steps ahead in a ring of three buffers.
// tile_sums as in the dK/dV kernel, for the dQ rows. Causal attention on Hopper at head size 64
// launches attention_backward_flash_dq_tma_kernel below. kPaired: qkv's and dqkv's rows are
// PairedRows (no tile_sums; qk_rstd as qk_norm_row finds it).
constexpr int kDqBuffers = 3;

template <int HS, class Pairs, bool kPaired = false>
__global__ void __launch_bounds__(kThreads) attention_backward_flash_dq_kernel(
    floatX* dqkv, float* tile_sums, const floatX* qkv, const floatX* ds, int T, int NH, float scale, Pairs pairs,
    const float* qk_rstd, const __grid_constant__ RotaryFrequencies freq) {
  constexpr int kTile = kTileRows * HS;
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  floatX* k_s = reinterpret_cast<floatX*>(flash_smem);  // kDqBuffers buffers
  floatX* ds_s = k_s + kDqBuffers * kTile;               // kDqBuffers buffers
  const int q_tile = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS, warp = threadIdx.x / WARP_SIZE, q0 = q_tile * kTileRows;
  const size_t ld = 3 * (size_t)C;
  const auto rows = qkv_rows<kPaired>(C);
  const floatX* k_g = qkv + (size_t)b * T * ld + qkv_part<kPaired>(C) + h * HS;
  const int first = pairs.first_key_tile(b, q_tile);
  // Step n's copies (key tile first + n and its dS tile) into buffer n % kDqBuffers, as one commit
  // group; a step past the last commits an empty one, so that step n's group is always the
  // (n + 1)-th.
  auto load_step = [&](int n) {
    const int j = first + n, buf = n % kDqBuffers;
    if (j <= q_tile) {
      load_tile<HS, kTileRows>(k_s + buf * kTile, k_g, rows, j * kTileRows, T);
      load_ds_tile(ds_s + buf * kDsTileElements, ds + pairs.ds_tile(bh, q_tile, j));
    }
    copy_async_commit();
  };
  for (int n = 0; n < kDqBuffers - 1; n++) load_step(n);
  float dq[HS / 8][4] = {};
  for (int j = first; j <= q_tile; j++) {
    const int n = j - first, buf = n % kDqBuffers;
    wait_tile_copies<kDqBuffers - 2>();
    // Step n's tiles are in for every thread, and every thread is done with step n - 1's product,
    // whose buffer the next copies take.
    __syncthreads();
    load_step(n + kDqBuffers - 1);
    const floatX* ds_tile = ds_s + buf * kDsTileElements;
    const floatX* k_tile = k_s + buf * kTile;
    uint32_t a[kTileRows / 16][4];
#pragma unroll
    for (int kk = 0; kk < kTileRows / 16; kk++) load_ds_a_fragment(a[kk], ds_tile, kk);
    accumulate_fragments<HS, kTileRows>(dq, a, k_tile);
  }
  if (qk_rstd) {  // QK-norm's backward, y read from the attention's q
    const int g = (threadIdx.x % WARP_SIZE) / 4, t = threadIdx.x % 4;
    const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    const floatX* q_g = qkv + (size_t)b * T * ld + h * HS;
    const QkNormRow query[2] = {qk_norm_row<kPaired>(freq, b, row[0], T, h, NH),
                                qk_norm_row<kPaired>(freq, b, row[1], T, h, NH)};
    float rstd[2];
#pragma unroll
    for (int i = 0; i < 2; i++) rstd[i] = row[i] < T ? qk_rstd[query[i].rstd_q] : 0.0f;
    auto y = [&](int i, int dn) {
      if (row[i] >= T) return make_float2(0.0f, 0.0f);
      const floatX* q = q_g + row_offset(rows, row[i]) + dn * 8 + 2 * t;
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(q));
    };
    const int position[2] = {query[0].position, query[1].position};
    qk_norm_rotary_backward_rows<HS>(dq, scale, y, rstd, position, freq);
    store_rows<HS>(dqkv + (size_t)b * T * ld + h * HS, rows, q0 + warp * 16, T, dq, 1.0f, 1.0f);
  } else {
    store_rows<HS>(dqkv + (size_t)b * T * ld + h * HS, rows, q0 + warp * 16, T, dq, scale, scale);
  }
  if (tile_sums) {
    __syncthreads();  // every warp is done with the buffers before their memory holds the sums
    store_tile_column_sums<HS>(tile_sums + ((size_t)b * gridDim.x + q_tile) * ld + h * HS,
                               reinterpret_cast<float*>(flash_smem), q0 + warp * 16, T, dq, scale);
  }
}

// dQ on Hopper (head size 64): attention_backward_flash_dq_kernel's work with the dK/dV kernel's
// structure. Thread 0 starts each step's copies (the key tile through the TMA, the dS tile, 8 KiB
// contiguous, as one bulk copy) into a ring of stages with an mbarrier each, and refills a stage
// once its own wait for the step's product returns (the warps meet at every product).
constexpr int kTmaDqStages = 3;
constexpr size_t tma_dq_smem_bytes() {
  return kTmaDqStages * (kTileRows * 64 + kDsTileElements) * sizeof(floatX) + kTmaDqStages * sizeof(uint64_t);
}

__global__ void __launch_bounds__(kThreads) attention_backward_flash_dq_tma_kernel(
    const __grid_constant__ CUtensorMap qkv_map, floatX* dqkv, float* tile_sums, const floatX* ds, int T, int NH,
    float scale) {
#if FLASH_WGMMA
  constexpr int HS = 64, kStages = kTmaDqStages, kTile = kTileRows * HS;
  constexpr uint32_t kStageBytes = (kTile + kDsTileElements) * sizeof(floatX);
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(flash_smem + kStages * kStageBytes);
  const int q_tile = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS, warp = threadIdx.x / WARP_SIZE, q0 = q_tile * kTileRows;
  const floatX* ds_g = ds + ds_tile_offset(bh, q_tile, 0, gridDim.x);  // tiles j = 0..q_tile follow
  auto stage_k = [&](int j) { return reinterpret_cast<floatX*>(flash_smem + j % kStages * kStageBytes); };
  auto load_step = [&](int j) {
    uint64_t* bar = &full[j % kStages];
    floatX* k_tile = stage_k(j);
    barrier_expect_bytes(bar, kStageBytes);
    tma_load_box(k_tile, &qkv_map, C + h * HS, j * kTileRows, b, bar);
    bulk_copy_to_shared(k_tile + kTile, ds_g + (size_t)j * kDsTileElements, kDsTileElements * sizeof(floatX), bar);
  };
  if (threadIdx.x == 0) {
    copy_barriers_init(full, kStages);
    for (int j = 0; j < kStages && j <= q_tile; j++) load_step(j);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  float dq[HS / 8][4] = {};
  for (int j = 0; j <= q_tile; j++) {
    barrier_wait(&full[j % kStages], (j / kStages) & 1);
    const floatX* k_tile = stage_k(j);
    uint32_t a[kTileRows / 16][4];
#pragma unroll
    for (int kk = 0; kk < kTileRows / 16; kk++) load_ds_a_fragment(a[kk], k_tile + kTile, kk);
    accumulate_fragments<HS, kTileRows>(dq, a, k_tile);
    if (threadIdx.x == 0 && j + kStages <= q_tile) load_step(j + kStages);
  }
  const size_t ld = 3 * (size_t)C;
  store_rows<HS>(dqkv + (size_t)b * T * ld + h * HS, ld, q0 + warp * 16, T, dq, scale, scale);
  if (tile_sums) {
    __syncthreads();  // every warp is done with the stages before their memory holds the sums
    store_tile_column_sums<HS>(tile_sums + ((size_t)b * gridDim.x + q_tile) * ld + h * HS,
                               reinterpret_cast<float*>(flash_smem), q0 + warp * 16, T, dq, scale);
  }
#else
  __trap();  // launched only where hopper_support().usable
#endif
}

template <int HS>
constexpr size_t forward_smem_bytes() {
  return (forward_groups<HS>() + 4) * kTileRows * HS * sizeof(floatX);
}
template <int HS>
constexpr size_t dkdv_smem_bytes() {
  return (2 * kTileRows + 4 * dkdv_query_rows<HS>()) * HS * sizeof(floatX) +
         4 * dkdv_query_rows<HS>() * sizeof(float);
}
template <int HS>
constexpr size_t dq_smem_bytes() {
  return kDqBuffers * (kTileRows * HS + kDsTileElements) * sizeof(floatX);
}

__global__ void hopper_build_probe_kernel(int* built) { *built = FLASH_WGMMA; }

// Whether this build's device code has the Hopper kernels (an sm_90a build), and the driver's
// tensor-map encoder, fetched through the runtime (no link against libcuda): found on first use.
// Without either, attention takes the kernels that copy with every thread.
struct HopperSupport {
  bool usable = false;
  PFN_cuTensorMapEncodeTiled_v12000 encode_tensor_map = nullptr;
};

const HopperSupport& hopper_support() {
  static const HopperSupport support = [] {
    HopperSupport s;
    int* flag = nullptr;
    int built = 0;
    cudaCheck(cudaMalloc(&flag, sizeof(int)));
    hopper_build_probe_kernel<<<1, 1>>>(flag);
    cudaCheckLaunch();
    cudaCheck(cudaMemcpy(&built, flag, sizeof(int), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(flag));
    if (!built) return s;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&s.encode_tensor_map, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return s;
    }
    s.usable = true;
    return s;
  }();
  return support;
}

// Raises each kernel's dynamic shared-memory limit once (above 48 KiB needs an opt-in).
template <int HS>
void set_smem_limits() {
  static bool done = false;
  if (done) return;
  cudaCheck(cudaFuncSetAttribute(attention_forward_flash_kernel<HS>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)forward_smem_bytes<HS>()));
  cudaCheck(cudaFuncSetAttribute(attention_forward_window_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)window_forward_smem_bytes<HS>()));
  cudaCheck(cudaFuncSetAttribute(attention_backward_flash_dkdv_kernel<HS, CausalPairs>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkdv_smem_bytes<HS>()));
  cudaCheck(cudaFuncSetAttribute(attention_backward_flash_dkdv_kernel<HS, WindowPairs>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkdv_smem_bytes<HS>()));
  cudaCheck(cudaFuncSetAttribute(attention_backward_flash_dq_kernel<HS, CausalPairs>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem_bytes<HS>()));
  cudaCheck(cudaFuncSetAttribute(attention_backward_flash_dq_kernel<HS, WindowPairs>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem_bytes<HS>()));
  cudaCheck(cudaFuncSetAttribute(attention_backward_flash_dq_kernel<HS, WindowPairs, true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem_bytes<HS>()));
  // The Hopper kernels' shared memory is more than some other GPUs allow a block.
  if (hopper_support().usable) {
    cudaCheck(cudaFuncSetAttribute(attention_forward_flash_tma_kernel<HS>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tma_forward_smem_bytes<HS>()));
    for (const void* kernel : {(const void*)attention_forward_window_tma_kernel<HS, false>,
                               (const void*)attention_forward_window_tma_kernel<HS, true>}) {
      cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)tma_window_forward_smem_bytes<HS>()));
    }
    for (const void* kernel : {(const void*)attention_backward_window_dkdv_tma_kernel<HS, false>,
                               (const void*)attention_backward_window_dkdv_tma_kernel<HS, true>}) {
      cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_memory_optin()));
    }
    cudaCheck(cudaFuncSetAttribute(attention_backward_flash_dkdv_tma_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tma_dkdv_smem_bytes()));
    cudaCheck(cudaFuncSetAttribute(attention_backward_flash_dq_tma_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tma_dq_smem_bytes()));
  }
  done = true;
}

// A BF16 tensor of `rank` dimensions (dims innermost first, strides in bytes of the outer ones) as
// a tensor map read in `box`es with the 128-byte swizzle; parts past the ends read zeros.
CUresult encode_swizzled_bf16_map(CUtensorMap* map, const floatX* x, int rank, const cuuint64_t* dims,
                                  const cuuint64_t* strides, const cuuint32_t* box) {
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  return hopper_support().encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<floatX*>(x), dims,
                                            strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// A [B, T, width] BF16 tensor (qkv, width 3C, or dout, width C) as a 3D tensor map (column, row,
// sequence) read in 64 x 64 boxes with the 128-byte swizzle; rows past T read zeros.
CUtensorMap sequence_tensor_map(const floatX* x, int B, int T, int width) {
  const cuuint64_t dims[3] = {(cuuint64_t)width, (cuuint64_t)T, (cuuint64_t)B};
  const cuuint64_t strides[2] = {(cuuint64_t)width * sizeof(floatX), (cuuint64_t)T * width * sizeof(floatX)};
  const cuuint32_t box[3] = {64, 64, 1};
  CUtensorMap map;
  const CUresult result = encode_swizzled_bf16_map(&map, x, 3, dims, strides, box);
  REQUIRE(result == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error %d) for a [%d, %d, %d] tensor", (int)result,
          B, T, width);
  return map;
}

// qkv [B, T/2, 6C] as paired heads' doubled sequence [B, T, 3C] (PairedRows; C a part's channels):
// a 5D tensor map (column of a half, the token's half j, the part, token, sequence) read in boxes
// of 64 columns, both halves and 32 tokens, positions 2t + j in order, into shared memory as
// sequence_tensor_map's 64 x 64 boxes of the regrouped rows would be (tma_load_qkv).
CUtensorMap paired_qkv_tensor_map(const floatX* qkv, int B, int T, int C) {
  REQUIRE(T % 2 == 0, "paired_qkv_tensor_map: the doubled sequence's T = %d must be even", T);
  const cuuint64_t half = (cuuint64_t)C * sizeof(floatX);
  const cuuint64_t dims[5] = {(cuuint64_t)C, 2, 3, (cuuint64_t)T / 2, (cuuint64_t)B};
  const cuuint64_t strides[4] = {half, 2 * half, 6 * half, (cuuint64_t)T / 2 * 6 * half};
  const cuuint32_t box[5] = {64, 2, 1, 32, 1};
  CUtensorMap map;
  const CUresult result = encode_swizzled_bf16_map(&map, qkv, 5, dims, strides, box);
  REQUIRE(result == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error %d) for paired heads' [%d, %d, 3 x %d] qkv",
          (int)result, B, T, C);
  return map;
}

// A [rows, T] FP32 tensor (lse or dot, rows B*NH) read in boxes of 64 of a row; entries past T
// read zeros. The row stride must be a multiple of 16 bytes: T % 4 == 0.
CUtensorMap row_tensor_map(const float* x, int rows, int T) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {(cuuint64_t)T, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)T * sizeof(float)};
  const cuuint32_t box[2] = {64, 1};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = hopper_support().encode_tensor_map(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(x), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  REQUIRE(result == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error %d) for a [%d, %d] tensor", (int)result,
          rows, T);
  return map;
}

// Blocks of a kernel that fit on the GPU at once.
int resident_blocks(const void* kernel, int threads, size_t smem_bytes) {
  int device = 0, sms = 0, per_sm = 0;
  cudaCheck(cudaGetDevice(&device));
  cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  return std::max(per_sm, 1) * sms;
}

// ---- Products of our own on Hopper: out[M, N] = a[M, K] op(b) with an epilogue ----
// cuBLASLt's epilogues take a bias and GELU, not ReLU^2, so the speedrun's MLP writes a product and
// reads it back for ReLU^2 (forward) or its derivative (backward): one [N, 4C] pass each way. Here
// a product's epilogue is a functor: GemmStore writes the product, GemmStoreRelu2 the product and
// ReLU^2 of it as stored, GemmStoreRelu2Grad the product times ReLU^2' of a stored
// pre-activation. a is K-major ([M, K]); b is a weight either way (GemmB). Accumulation is FP32.
// Tiles of out are 128 x 256, taken in order (columns fastest, so that the tiles of one row block
// share a's rows in L2) by a persistent grid, a block an SM. Its warpgroups:
// - the producer's first thread copies each 64-deep step of a (128 x 64) and b (256 x 64) through
//   the TMA into a ring of stages, running on into the next tile while the consumers finish the last;
// - two consumer warpgroups, 64 rows each, issue m64n256k16 products from shared memory (a consumer
//   warp releases a stage once the products that read it are done), then round the tile to BF16
//   into a staging buffer and go on to the next tile's products;
// - the producer's other three warps write the staged tile through the epilogue, 16 bytes a thread,
//   while the consumers compute the next: a tile's stores overlap its successor's products (at
//   K = 768 a tile's products take ~7 us, its 64 KB of stores from every SM at once ~2-4 us).
// Which block takes a tile never changes what it computes.
constexpr int kGemmRows = 128, kGemmCols = 256, kGemmDepth = 64, kGemmStages = 3;
constexpr int kGemmConsumerThreads = 2 * kThreads, kGemmThreads = kGemmConsumerThreads + kThreads;
// The staging buffer's rows are 16 bytes longer than a tile's: a warp's fragment writes (8 rows,
// 4 column pairs) fall on 32 different banks.
constexpr int kGemmStagedRow = kGemmCols + 8;
constexpr int kGemmEpilogueThreads = kThreads - WARP_SIZE;
// Named barriers between the consumers and the epilogue warps (0 is __syncthreads').
constexpr int kGemmStagedBarrier = 1, kGemmStagingFreeBarrier = 2;
constexpr uint32_t kGemmABytes = kGemmRows * kGemmDepth * sizeof(floatX);
constexpr uint32_t kGemmBBytes = kGemmCols * kGemmDepth * sizeof(floatX);
constexpr uint32_t kGemmStagingBytes = kGemmRows * kGemmStagedRow * sizeof(floatX);

// How b is stored: kNK, b[N, K] (a layer's weight in its forward product, out = a b^T); kKN,
// b[K, N] (the weight in the input-gradient product, dinp = dout b). A kKN stage holds b's step as
// 64-column chunks of its 64 rows (N-major, which wgmma reads transposed).
enum class GemmB { kNK, kKN };

constexpr size_t gemm_smem_bytes() {
  return kGemmStages * (size_t)(kGemmABytes + kGemmBBytes) + kGemmStagingBytes + 2 * kGemmStages * sizeof(uint64_t);
}

// An epilogue's staged tile is the product rounded to BF16, or with kReadsInput, stage() of the
// product and of a stored input's same element (input(), loaded into the staging buffer first);
// store() takes 8 columns of a row of it and their offset in out.
// Writes the product.
struct GemmStore {
  static constexpr bool kReadsInput = false;
  floatX* out;
  __device__ void store(size_t at, const x128& product) const { store128(out + at, product); }
};

// Writes the product to pre (unless pre is null: -mr 1 keeps no pre-activation) and ReLU^2 of it,
// as stored, to out: the bits of the product followed by relu2_forward.
struct GemmStoreRelu2 {
  static constexpr bool kReadsInput = false;
  floatX* pre;
  floatX* out;
  __device__ void store(size_t at, const x128& product) const {
    if (pre) store128(pre + at, product);
    x128 o;
    for (int k = 0; k < x128::size; k++) o[k] = (floatX)relu2((float)product[k]);
    store128(out + at, o);
  }
};

// Writes the product, as stored, times ReLU^2'(pre), or with from_output times 2 sqrt(y) of ReLU^2's
// stored output y (-mr 1): the bits of the product followed by relu2_backward_inplace, or
// relu2_backward_from_output_inplace.
struct GemmStoreRelu2Grad {
  static constexpr bool kReadsInput = true;
  const floatX* stored;  // pre, or with from_output ReLU^2's output
  floatX* out;
  bool from_output = false;
  __device__ const floatX* input() const { return stored; }
  __device__ float grad(float x) const { return from_output ? relu2_grad_from_output(x) : relu2_grad(x); }
  __device__ __nv_bfloat162 stage(float v0, float v1, __nv_bfloat162 x) const {
    const __nv_bfloat162 g = __floats2bfloat162_rn(v0, v1);
    return __floats2bfloat162_rn(__low2float(g) * grad(__low2float(x)), __high2float(g) * grad(__high2float(x)));
  }
  __device__ void store(size_t at, const x128& staged) const { store128(out + at, staged); }
};

#if FLASH_WGMMA
// d[64 x 256] (+)= a[64 x 16] b[16 x 256] over the warpgroup, from shared memory: a K-major, b
// K-major or (kTransposeB) N-major. accumulate false (known at run time) ignores d's old values.
template <int kTransposeB>
__device__ __forceinline__ void wgmma_m64n256k16(float d[32][4], WgmmaDescriptor a, WgmmaDescriptor b,
                                                 bool accumulate) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,"
        "%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,"
        "%120,%121,%122,%123,%124,%125,%126,%127"
      "}, %128, %129, accumulate, 1, 1, 0, %131;\n}\n"
      : FLASH_WGMMA_ACC4(d, 0), FLASH_WGMMA_ACC4(d, 4), FLASH_WGMMA_ACC4(d, 8), FLASH_WGMMA_ACC4(d, 12),
        FLASH_WGMMA_ACC4(d, 16), FLASH_WGMMA_ACC4(d, 20), FLASH_WGMMA_ACC4(d, 24), FLASH_WGMMA_ACC4(d, 28)
      : "l"(a.bits()), "l"(b.bits()), "r"((int)accumulate), "n"(kTransposeB));
}

// Step k (64-deep) of the tile at (m0, n0) into the ring's step `ring`.
template <GemmB kB>
__device__ __forceinline__ void gemm_produce_step(floatX* a_s, floatX* b_s, uint64_t* full, uint64_t* empty,
                                                  const CUtensorMap* a_map, const CUtensorMap* b_map, int m0, int n0,
                                                  int k, int ring) {
  const int stage = ring % kGemmStages;
  if (ring >= kGemmStages) barrier_wait(&empty[stage], (ring / kGemmStages - 1) & 1);
  barrier_expect_bytes(&full[stage], kGemmABytes + kGemmBBytes);
  tma_load_box_2d(a_s + stage * kGemmRows * kGemmDepth, a_map, k * kGemmDepth, m0, &full[stage]);
  floatX* b_stage = b_s + stage * kGemmCols * kGemmDepth;
  if constexpr (kB == GemmB::kNK) {
    tma_load_box_2d(b_stage, b_map, k * kGemmDepth, n0, &full[stage]);
  } else {
#pragma unroll
    for (int c = 0; c < kGemmCols / 64; c++) {
      tma_load_box_2d(b_stage + c * 64 * kGemmDepth, b_map, n0 + c * 64, k * kGemmDepth, &full[stage]);
    }
  }
}

// The block's tiles: this block's first, then every gridDim.x-th; tile t is row block t / n_tiles,
// column block t % n_tiles.
struct GemmTiles {
  int n_tiles, count;
};

// The producer's thread: each of the block's tiles' steps in turn, the ring's step `ring` into stage
// ring % kGemmStages once the consumers have released that stage's previous use. Parts past the
// matrices' ends arrive as zeros.
template <GemmB kB>
__device__ __forceinline__ void gemm_produce(floatX* a_s, floatX* b_s, uint64_t* full, uint64_t* empty,
                                             const CUtensorMap* a_map, const CUtensorMap* b_map, GemmTiles tiles,
                                             int steps) {
  int ring = 0;
  for (int tile = blockIdx.x; tile < tiles.count; tile += gridDim.x) {
    const int m0 = tile / tiles.n_tiles * kGemmRows, n0 = tile % tiles.n_tiles * kGemmCols;
    for (int k = 0; k < steps; k++, ring++) {
      gemm_produce_step<kB>(a_s, b_s, full, empty, a_map, b_map, m0, n0, k, ring);
    }
  }
}

// A consumer warp's rows of its tile into the staging buffer, as the epilogue stages them: rows
// row0 and row0 + 8 of the tile, each lane two adjacent columns of every 8.
template <class Epilogue>
__device__ __forceinline__ void gemm_stage_tile(const float acc[kGemmCols / 8][4], floatX* staging, int row0,
                                                const Epilogue& ep) {
  const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
  for (int j = 0; j < kGemmCols / 8; j++) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
      auto* at = reinterpret_cast<__nv_bfloat162*>(staging + (row0 + 8 * half) * kGemmStagedRow + j * 8 + 2 * (lane % 4));
      if constexpr (Epilogue::kReadsInput) *at = ep.stage(acc[j][2 * half], acc[j][2 * half + 1], *at);
      else *at = __floats2bfloat162_rn(acc[j][2 * half], acc[j][2 * half + 1]);
    }
  }
}

// The epilogue warps, for each of the block's tiles: the epilogue's input into the staging buffer
// (if it reads one) and the buffer handed to the consumers; then, once they have staged the tile,
// through ep, 8 columns a thread in turn along the rows (a warp's 32 threads one row's 512 bytes).
// A thread loads and stores the same chunks, so it overwrites only what it has itself read. Parts
// past out's ends are skipped (N % 8 == 0: 8 columns are whole).
template <class Epilogue>
__device__ __forceinline__ void gemm_write_tiles(floatX* staging, GemmTiles tiles, int M, int N, const Epilogue& ep) {
  constexpr int kChunks = kGemmCols / x128::size;
  const int thread = threadIdx.x - kGemmConsumerThreads - WARP_SIZE;
  for (int tile = blockIdx.x; tile < tiles.count; tile += gridDim.x) {
    const int m0 = tile / tiles.n_tiles * kGemmRows, n0 = tile % tiles.n_tiles * kGemmCols;
    if constexpr (Epilogue::kReadsInput) {
      for (int c = thread; c < kGemmRows * kChunks; c += kGemmEpilogueThreads) {
        const int row = m0 + c / kChunks, col = n0 + c % kChunks * x128::size;
        const bool inside = row < M && col < N;
        copy_async_16(staging + c / kChunks * kGemmStagedRow + col - n0,
                      ep.input() + (inside ? (size_t)row * N + col : 0), inside);
      }
      copy_async_commit();
      copy_async_wait<0>();
    }
    named_barrier_arrive(kGemmStagingFreeBarrier, kGemmConsumerThreads + kGemmEpilogueThreads);
    named_barrier_sync(kGemmStagedBarrier, kGemmConsumerThreads + kGemmEpilogueThreads);
    for (int c = thread; c < kGemmRows * kChunks; c += kGemmEpilogueThreads) {
      const int row = m0 + c / kChunks, col = n0 + c % kChunks * x128::size;
      if (row < M && col < N) {
        ep.store((size_t)row * N + col, load128(staging + c / kChunks * kGemmStagedRow + col - n0));
      }
    }
  }
}

// A consumer warpgroup: of each of the block's tiles, rows 64 * group .. over every step, then into
// the staging buffer once the epilogue warps hand it over (the tile before written, the epilogue's
// input loaded). Each stage is released once its products are done, the last of a tile's before
// staging, so that the producer fills the next tile's stages meanwhile.
template <GemmB kB, class Epilogue>
__device__ __forceinline__ void gemm_consume(const floatX* a_s, const floatX* b_s, uint64_t* full, uint64_t* empty,
                                             floatX* staging, GemmTiles tiles, int steps, const Epilogue& ep) {
  constexpr int kTransposeB = kB == GemmB::kKN;
  // 128-byte swizzle, 8-row groups 1024 bytes apart. A k16 slice of a K-major tile is 32 bytes
  // further along its rows; of an N-major one, 16 rows (2048 bytes) further, its 64-column chunks
  // 64 rows apart.
  constexpr uint32_t kBChunkBytes = 64 * kGemmDepth * sizeof(floatX), kBSlice = kTransposeB ? 2048 : 32;
  const int group = warpgroup_index(), warp = warp_in_group(), lane = threadIdx.x % WARP_SIZE;
  const WgmmaDescriptor a_desc = wgmma_descriptor(a_s + group * 64 * kGemmDepth, 16, 1024);
  const WgmmaDescriptor b_desc = wgmma_descriptor(b_s, kTransposeB ? kBChunkBytes : 16, 1024);
  float acc[kGemmCols / 8][4];
  int ring = 0;
  for (int tile = blockIdx.x; tile < tiles.count; tile += gridDim.x) {
    for (int k = 0; k < steps; k++, ring++) {
      const int stage = ring % kGemmStages;
      barrier_wait(&full[stage], (ring / kGemmStages) & 1);
      mma_batch_begin();
#pragma unroll
      for (int kk = 0; kk < kGemmDepth / 16; kk++) {
        wgmma_m64n256k16<kTransposeB>(acc, a_desc + (stage * kGemmABytes + kk * 32) / 16,
                                      b_desc + (stage * kGemmBBytes + kk * kBSlice) / 16, k > 0 || kk > 0);
      }
      wgmma_commit();
      wgmma_wait<1>();  // the step before's products are done: its stage is free
      if (k > 0) warp_release(&empty[(ring - 1) % kGemmStages]);
    }
    wgmma_wait<0>();
    mma_result<kGemmCols / 8>(acc);
    warp_release(&empty[(ring - 1) % kGemmStages]);
    named_barrier_sync(kGemmStagingFreeBarrier, kGemmConsumerThreads + kGemmEpilogueThreads);
    gemm_stage_tile(acc, staging, group * 64 + warp * 16 + lane / 4, ep);
    named_barrier_arrive(kGemmStagedBarrier, kGemmConsumerThreads + kGemmEpilogueThreads);
  }
}
#endif

template <GemmB kB, class Epilogue>
__global__ void __launch_bounds__(kGemmThreads, 1) gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                                                const __grid_constant__ CUtensorMap b_map, int M, int N,
                                                                int K, Epilogue ep) {
#if FLASH_WGMMA
  extern __shared__ __align__(1024) unsigned char flash_smem[];
  floatX* a_s = reinterpret_cast<floatX*>(flash_smem);
  floatX* b_s = a_s + kGemmStages * kGemmRows * kGemmDepth;
  floatX* staging = b_s + kGemmStages * kGemmCols * kGemmDepth;
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + kGemmRows * kGemmStagedRow);
  uint64_t* empty = full + kGemmStages;
  const GemmTiles tiles = {ceil_div(N, kGemmCols), ceil_div(M, kGemmRows) * ceil_div(N, kGemmCols)};
  const int steps = ceil_div(K, kGemmDepth);
  if (threadIdx.x == 0) {
    release_barriers_init(empty, kGemmStages, kGemmConsumerThreads / WARP_SIZE);
    copy_barriers_init(full, kGemmStages);  // its fences cover both
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  if (threadIdx.x >= kGemmConsumerThreads) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == kGemmConsumerThreads) gemm_produce<kB>(a_s, b_s, full, empty, &a_map, &b_map, tiles, steps);
    if (threadIdx.x >= kGemmConsumerThreads + WARP_SIZE) gemm_write_tiles(staging, tiles, M, N, ep);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    gemm_consume<kB>(a_s, b_s, full, empty, staging, tiles, steps, ep);
  }
#else
  __trap();  // launched only where hopper_support().usable
#endif
}

// A [rows, cols] BF16 matrix as a 2D tensor map read in boxes of 64 columns by box_rows rows with
// the 128-byte swizzle; rows and columns past the end read zeros.
CUtensorMap matrix_tensor_map(const floatX* x, int rows, int cols, int box_rows) {
  const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)cols * sizeof(floatX)};
  const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
  CUtensorMap map;
  const CUresult result = encode_swizzled_bf16_map(&map, x, 2, dims, strides, box);
  REQUIRE(result == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error %d) for a [%d, %d] matrix", (int)result, rows,
          cols);
  return map;
}

// out[M, N] = a[M, K] op(b) through `ep` (GemmStore, GemmStoreRelu2, GemmStoreRelu2Grad), op(b)
// b^T for b[N, K] (GemmB::kNK) or b for b[K, N] (kKN); on Hopper builds and GPUs only
// (hopper_support().usable). N and K multiples of 8.
template <GemmB kB, class Epilogue>
void gemm(const floatX* a, const floatX* b, int M, int N, int K, const Epilogue& ep, cudaStream_t stream) {
  REQUIRE(hopper_support().usable, "gemm needs an sm_90a build on a Hopper GPU");
  REQUIRE(M > 0 && N > 0 && K > 0 && N % 8 == 0 && K % 8 == 0, "gemm: M=%d, N=%d, K=%d (N and K multiples of 8)", M,
          N, K);
  static const int resident = [] {  // one per instance: its shared memory's opt-in, then its grid
    cudaCheck(cudaFuncSetAttribute(gemm_kernel<kB, Epilogue>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)gemm_smem_bytes()));
    return resident_blocks((const void*)gemm_kernel<kB, Epilogue>, kGemmThreads, gemm_smem_bytes());
  }();
  const CUtensorMap b_map =
      kB == GemmB::kNK ? matrix_tensor_map(b, N, K, kGemmCols) : matrix_tensor_map(b, K, N, kGemmDepth);
  const int tiles = ceil_div(M, kGemmRows) * ceil_div(N, kGemmCols);
  gemm_kernel<kB, Epilogue><<<std::min(tiles, resident), kGemmThreads, gemm_smem_bytes(), stream>>>(
      matrix_tensor_map(a, M, K, kGemmRows), b_map, M, N, K, ep);
  cudaCheckLaunch();
}

// The counter persistent kernels take their work items from, zero between launches (a launch's
// last fetch resets it): one per process, so kernels that use it run one at a time, on one stream.
int* work_item_counter() {
  static int* counter = [] {
    int* c = nullptr;
    cudaCheck(cudaMalloc(&c, sizeof(int)));
    cudaCheck(cudaMemset(c, 0, sizeof(int)));
    return c;
  }();
  return counter;
}

// The heads whose tiles go heaviest first at the end of a causal grid (causal_block_work):
// about three waves of blocks. By a count of greedy scheduling, from two waves on the d48 shape
// ends within 3% of its ideal time; measured there, tails of 33, 66 and 99 heads (this count)
// ran equally fast.
int tail_heads(int resident, int tiles) { return ceil_div(3 * resident, tiles); }

// The softmax scale in base-2 units, rounded once from double precision (at GPT-2's scale the
// same bits as M_LOG2E / sqrt(HS) rounded once, for head sizes 64 and 128).
inline float scale_in_log2_units(float scale) { return (float)(M_LOG2E * (double)scale); }

template <int HS>
void forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, float scale,
             cudaStream_t stream) {
  set_smem_limits<HS>();
  const float scale_log2 = scale_in_log2_units(scale);
  if (hopper_support().usable) {
    static const int resident = resident_blocks((const void*)attention_forward_flash_tma_kernel<HS>,
                                                kTmaForwardThreads, tma_forward_smem_bytes<HS>());
    const dim3 grid(ceil_div(T, kTmaForwardGroups * kTileRows), B * NH);
    attention_forward_flash_tma_kernel<HS><<<grid, kTmaForwardThreads, tma_forward_smem_bytes<HS>(), stream>>>(
        sequence_tensor_map(qkv, B, T, 3 * NH * HS), out, lse, T, NH, tail_heads(resident, grid.x), scale_log2);
    cudaCheckLaunch();
    return;
  }
  static const int resident = resident_blocks((const void*)attention_forward_flash_kernel<HS>, forward_threads<HS>(),
                                              forward_smem_bytes<HS>());
  const dim3 grid(ceil_div(T, forward_groups<HS>() * kTileRows), B * NH);
  attention_forward_flash_kernel<HS><<<grid, forward_threads<HS>(), forward_smem_bytes<HS>(), stream>>>(
      out, lse, qkv, T, NH, tail_heads(resident, grid.x), scale_log2);
  cudaCheckLaunch();
}

// scratch_dot [B, NH, T]: each row's dout . out, the softmax gradient's rowwise term.
template <int HS>
void backward_row_dots(float* scratch_dot, const floatX* dout, const floatX* out, int B, int T, int NH,
                       cudaStream_t stream) {
  const size_t dot_threads = (size_t)B * T * NH * (HS / x128::size);
  attention_backward_flash_dot_kernel<HS><<<ceil_div(dot_threads, 256), 256, 0, stream>>>(
      scratch_dot, dout, out, B, T, NH);
  cudaCheckLaunch();
}

template <int HS>
void backward(floatX* dqkv, float* tile_sums, float* scratch_dot, floatX* scratch_ds, const floatX* dout,
              const floatX* qkv, const floatX* out, const float* lse, int B, int T, int NH, float scale,
              bool row_dots_given, cudaStream_t stream) {
  set_smem_limits<HS>();
  if (!row_dots_given) backward_row_dots<HS>(scratch_dot, dout, out, B, T, NH, stream);
  const float scale_log2 = scale_in_log2_units(scale);
  const dim3 grid(ceil_div(T, kTileRows), B * NH);
  const CausalPairs pairs{T, (int)grid.x};
  const bool hopper = HS == 64 && hopper_support().usable;
  const CUtensorMap qkv_map = hopper ? sequence_tensor_map(qkv, B, T, 3 * NH * HS) : CUtensorMap{};
  if (hopper && T % 4 == 0) {
    static const int resident =
        resident_blocks((const void*)attention_backward_flash_dkdv_tma_kernel, kThreads, tma_dkdv_smem_bytes());
    attention_backward_flash_dkdv_tma_kernel<<<grid, kThreads, tma_dkdv_smem_bytes(), stream>>>(
        qkv_map, sequence_tensor_map(dout, B, T, NH * HS), row_tensor_map(lse, B * NH, T),
        row_tensor_map(scratch_dot, B * NH, T), dqkv, tile_sums, scratch_ds, T, NH, tail_heads(resident, grid.x),
        scale_log2, scale);
  } else {
    attention_backward_flash_dkdv_kernel<HS><<<grid, kThreads, dkdv_smem_bytes<HS>(), stream>>>(
        dqkv, tile_sums, scratch_ds, qkv, dout, lse, scratch_dot, T, NH, scale_log2, scale, pairs);
  }
  cudaCheckLaunch();
  if (hopper) {
    attention_backward_flash_dq_tma_kernel<<<grid, kThreads, tma_dq_smem_bytes(), stream>>>(
        qkv_map, dqkv, tile_sums, scratch_ds, T, NH, scale);
  } else {
    attention_backward_flash_dq_kernel<HS><<<grid, kThreads, dq_smem_bytes<HS>(), stream>>>(
        dqkv, tile_sums, qkv, scratch_ds, T, NH, scale, pairs, nullptr, RotaryFrequencies{});
  }
  cudaCheckLaunch();
}

WindowPairs window_pairs(const DocumentWindow& dw, int T) {
  const int tiles = T / kTileRows;
  return {dw, T, tiles, window_ds_slots(dw.window, tiles), llmc::attention_window_reach(dw.window)};
}

// paired: qkv holds PairedRows (Hopper only).
template <int HS>
void forward_window(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, float scale,
                    const DocumentWindow& dw, bool paired, cudaStream_t stream) {
  set_smem_limits<HS>();
  const float scale_log2 = scale_in_log2_units(scale);
  REQUIRE(!paired || hopper_support().usable, "attention_forward_window: paired rows in place are Hopper's");
  if (hopper_support().usable) {
    const auto kernel =
        paired ? attention_forward_window_tma_kernel<HS, true> : attention_forward_window_tma_kernel<HS, false>;
    static const int resident[2] = {  // per instance: the paired one may hold fewer blocks an SM
        resident_blocks((const void*)attention_forward_window_tma_kernel<HS, false>, kWindowForwardThreads,
                        tma_window_forward_smem_bytes<HS>()),
        resident_blocks((const void*)attention_forward_window_tma_kernel<HS, true>, kWindowForwardThreads,
                        tma_window_forward_smem_bytes<HS>())};
    const int grid = std::min(resident[paired], T / llmc::kAttentionBlock * B * NH);
    const CUtensorMap qkv_map =
        paired ? paired_qkv_tensor_map(qkv, B, T, NH * HS) : sequence_tensor_map(qkv, B, T, 3 * NH * HS);
    kernel<<<grid, kWindowForwardThreads, tma_window_forward_smem_bytes<HS>(), stream>>>(
        qkv_map, out, lse, T, NH, B * NH, scale_log2, window_pairs(dw, T), work_item_counter());
  } else {
    const dim3 grid(T / kTileRows, B * NH);
    attention_forward_window_kernel<HS><<<grid, kThreads, window_forward_smem_bytes<HS>(), stream>>>(
        out, lse, qkv, T, NH, scale_log2, window_pairs(dw, T));
  }
  cudaCheckLaunch();
}

// paired: qkv and dqkv hold PairedRows (Hopper, without tile_sums).
template <int HS>
void backward_window(floatX* dqkv, float* tile_sums, float* scratch_dot, floatX* scratch_ds, const floatX* dout,
                     const floatX* qkv, const floatX* out, const float* lse, int B, int T, int NH, float scale,
                     const DocumentWindow& dw, bool row_dots_given, const float* qk_rstd,
                     const RotaryFrequencies& freq, bool paired, cudaStream_t stream) {
  set_smem_limits<HS>();
  if (!row_dots_given) backward_row_dots<HS>(scratch_dot, dout, out, B, T, NH, stream);
  const WindowPairs pairs = window_pairs(dw, T);
  const float scale_log2 = scale_in_log2_units(scale);
  const dim3 grid(T / kTileRows, B * NH);
  // The Hopper kernel leaves the qkv bias's tile sums (GPT-2's) to the other, and takes QK-norm's
  // backward into its epilogue and the dQ kernel's; the other leaves it to a pass of its own.
  const bool hopper = hopper_support().usable && !tile_sums;
  const float* epilogue_rstd = hopper ? qk_rstd : nullptr;
  REQUIRE(!paired || hopper, "attention_backward_window: paired rows in place are Hopper's, without tile sums");
  if (hopper) {
    const dim3 block_grid(T / llmc::kAttentionBlock, B * NH);
    const size_t smem = tma_window_dkdv_smem_bytes<HS>(dw.window, T);
    REQUIRE(smem <= (size_t)shared_memory_optin(),
            "attention: a window of %d %s at T = %d needs %zu bytes of shared memory a block, more than the "
            "GPU's %d; use a shorter window or sequence", dw.window.size,
            dw.window.unit == llmc::WindowUnit::kTokens ? "tokens" : "blocks", T, smem, shared_memory_optin());
    const auto kernel = paired ? attention_backward_window_dkdv_tma_kernel<HS, true>
                               : attention_backward_window_dkdv_tma_kernel<HS, false>;
    const CUtensorMap qkv_map =
        paired ? paired_qkv_tensor_map(qkv, B, T, NH * HS) : sequence_tensor_map(qkv, B, T, 3 * NH * HS);
    kernel<<<block_grid, 2 * kThreads, smem, stream>>>(
        qkv_map, sequence_tensor_map(dout, B, T, NH * HS), row_tensor_map(lse, B * NH, T),
        row_tensor_map(scratch_dot, B * NH, T), dqkv, scratch_ds, T, NH, scale_log2, scale, pairs, epilogue_rstd, freq);
  } else {
    attention_backward_flash_dkdv_kernel<HS><<<grid, kThreads, dkdv_smem_bytes<HS>(), stream>>>(
        dqkv, tile_sums, scratch_ds, qkv, dout, lse, scratch_dot, T, NH, scale_log2, scale, pairs);
  }
  cudaCheckLaunch();
  const auto dq_kernel = paired ? attention_backward_flash_dq_kernel<HS, WindowPairs, true>
                                : attention_backward_flash_dq_kernel<HS, WindowPairs, false>;
  dq_kernel<<<grid, kThreads, dq_smem_bytes<HS>(), stream>>>(dqkv, tile_sums, qkv, scratch_ds, T, NH, scale, pairs,
                                                            epilogue_rstd, freq);
  cudaCheckLaunch();
  if (qk_rstd && !hopper) qk_norm_rotary_backward(dqkv, qkv, qk_rstd, B, T, NH, HS, freq, stream);
}
}  // namespace flash
#endif  // !ENABLE_FP32

// Whether attention runs through the flash kernels: BF16 builds at head size 64 or 128. Other
// head sizes, and FP32 builds (whose tests hold attention to FP32 accuracy), take the GEMM path.
inline bool attention_flash_supported(int head_size) {
#if defined(ENABLE_FP32)
  (void)head_size;
  return false;
#else
  return head_size == 64 || head_size == 128;
#endif
}

// out [B, T, C] and lse [B, NH, T] from qkv [B, T, 3C]; needs attention_flash_supported(C / NH).
void attention_forward_flash(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                             float scale, cudaStream_t stream) {
  const int HS = C / NH;
  REQUIRE(attention_flash_supported(HS), "flash attention needs a BF16 build and head size 64 or 128, not %d", HS);
#if !defined(ENABLE_FP32)
  if (HS == 64) flash::forward<64>(out, lse, qkv, B, T, NH, scale, stream);
  else flash::forward<128>(out, lse, qkv, B, T, NH, scale, stream);
#else
  (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)scale, (void)stream;
#endif
}

// Document-causal attention within dw's window (DocumentWindow): out and lse as
// attention_forward_flash gives them. T a multiple of 128. paired (attention_paired_in_place): qkv
// is paired heads' doubled sequence in place (PairedRows: B sequences of T positions over C
// channels, read from qkv's [B, T/2, 6C] token rows).
void attention_forward_window(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                              float scale, const DocumentWindow& dw, cudaStream_t stream, bool paired = false) {
  const int HS = C / NH;
  REQUIRE(attention_flash_supported(HS), "flash attention needs a BF16 build and head size 64 or 128, not %d", HS);
  REQUIRE(T % llmc::kAttentionBlock == 0, "windowed attention takes whole blocks of %d tokens, not T = %d",
          llmc::kAttentionBlock, T);
#if !defined(ENABLE_FP32)
  if (HS == 64) flash::forward_window<64>(out, lse, qkv, B, T, NH, scale, dw, paired, stream);
  else flash::forward_window<128>(out, lse, qkv, B, T, NH, scale, dw, paired, stream);
#else
  (void)out, (void)lse, (void)qkv, (void)B, (void)scale, (void)dw, (void)stream, (void)paired;
#endif
}

// Elements of attention_backward_window's dS scratch for windows of up to `widest` (of its unit).
size_t attention_window_ds_count(int B, int T, int NH, llmc::AttentionWindow widest) {
#if !defined(ENABLE_FP32)
  const int tiles = T / 64;
  return (size_t)B * NH * tiles * flash::window_ds_slots(widest, tiles) * 64 * 64;
#else
  (void)B, (void)T, (void)NH, (void)widest;
  return 0;
#endif
}

// Elements of the flash backward's dS scratch: the 64x64 tiles at or below the diagonal.
size_t attention_flash_ds_count(int B, int T, int NH) {
  const size_t tiles = ceil_div(T, 64);
  return (size_t)B * NH * (tiles * (tiles + 1) / 2) * 64 * 64;
}

// Rows of the flash backward's dqkv tile sums: one per 64-row tile of each sequence.
int attention_flash_tile_rows(int B, int T) { return B * ceil_div(T, 64); }

// dqkv [B, T, 3C] from dout [B, T, C], with the forward's qkv, out and lse; scratch_dot holds
// B*NH*T floats (row_dots_given: already the row dots, AttentionRowDots), scratch_ds
// attention_flash_ds_count(B, T, NH) elements. tile_sums (optional,
// attention_flash_tile_rows(B, T) x 3C floats): row b * ceil(T / 64) + i holds the column sums of
// dqkv's rows 64i.. of sequence b, the partials of the qkv bias gradient (column_sum_finalize).
void attention_backward_flash(floatX* dqkv, float* tile_sums, float* scratch_dot, floatX* scratch_ds,
                              const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                              int B, int T, int C, int NH, float scale, cudaStream_t stream,
                              bool row_dots_given = false) {
  const int HS = C / NH;
  REQUIRE(attention_flash_supported(HS), "flash attention needs a BF16 build and head size 64 or 128, not %d", HS);
#if !defined(ENABLE_FP32)
  if (HS == 64) {
    flash::backward<64>(dqkv, tile_sums, scratch_dot, scratch_ds, dout, qkv, out, lse, B, T, NH, scale, row_dots_given,
                        stream);
  } else {
    flash::backward<128>(dqkv, tile_sums, scratch_dot, scratch_ds, dout, qkv, out, lse, B, T, NH, scale,
                         row_dots_given, stream);
  }
#else
  (void)dqkv, (void)tile_sums, (void)scratch_dot, (void)scratch_ds, (void)dout, (void)qkv, (void)out, (void)lse,
      (void)B, (void)T, (void)scale, (void)stream, (void)row_dots_given;
#endif
}

// attention_backward_flash's dqkv (and tile_sums) for attention_forward_window's attention:
// scratch_ds holds attention_window_ds_count(B, T, NH, w) elements for some w of dw.window's unit
// at least as wide. With
// qk_rstd (qk_norm_rotary_forward's, of the q and k in qkv), q's and k's gradients go on through
// QK-norm's and the rotary's backward (qk_norm_rotary_backward's result; on Hopper, without
// tile_sums, in the kernels' epilogues from dQ and dK unrounded), rotated by freq (given with it).
// paired: qkv and dqkv are paired heads' doubled sequence in place, as attention_forward_window's (no
// tile_sums; qk_rstd [tokens, 2, 2 NH] and freq the tokens' with its paired heads' positions).
void attention_backward_window(floatX* dqkv, float* tile_sums, float* scratch_dot, floatX* scratch_ds,
                               const floatX* dout, const floatX* qkv, const floatX* out, const float* lse, int B,
                               int T, int C, int NH, float scale, const DocumentWindow& dw, cudaStream_t stream,
                               bool row_dots_given = false, const float* qk_rstd = nullptr,
                               const RotaryFrequencies* freq = nullptr, bool paired = false) {
  const int HS = C / NH;
  REQUIRE(attention_flash_supported(HS), "flash attention needs a BF16 build and head size 64 or 128, not %d", HS);
  REQUIRE(T % llmc::kAttentionBlock == 0, "windowed attention takes whole blocks of %d tokens, not T = %d",
          llmc::kAttentionBlock, T);
  REQUIRE(!tile_sums || !qk_rstd, "attention_backward_window: tile sums are of the attention's own gradient, "
          "which QK-norm's backward then changes: give tile_sums or qk_rstd, not both");
  REQUIRE(!qk_rstd || freq, "attention_backward_window: QK-norm's backward (qk_rstd) needs the rotary's frequencies");
#if !defined(ENABLE_FP32)
  const RotaryFrequencies rotary = freq ? *freq : RotaryFrequencies{};
  if (HS == 64) {
    flash::backward_window<64>(dqkv, tile_sums, scratch_dot, scratch_ds, dout, qkv, out, lse, B, T, NH, scale, dw,
                               row_dots_given, qk_rstd, rotary, paired, stream);
  } else {
    flash::backward_window<128>(dqkv, tile_sums, scratch_dot, scratch_ds, dout, qkv, out, lse, B, T, NH, scale, dw,
                                row_dots_given, qk_rstd, rotary, paired, stream);
  }
#else
  (void)dqkv, (void)tile_sums, (void)scratch_dot, (void)scratch_ds, (void)dout, (void)qkv, (void)out, (void)lse,
      (void)B, (void)scale, (void)dw, (void)stream, (void)row_dots_given, (void)qk_rstd, (void)freq, (void)paired;
#endif
}

// ---- Decoding: one query against a KV cache ----
// The attention of one token at position t (section 11): one block per head writes the new key
// and value into the cache, scores the positions first_key..t (0..t causally; within documents and
// a window, llmc::attention_first_key), softmaxes them with fixed-order block reductions
// (deterministic) and sums the values. Floor: reading those keys and values once.

constexpr int kDecodeThreads = 128;

// qkv: [3, NH, HS] of the new token at position t; out: [NH, HS]. k_cache, v_cache [NH, maxT, HS].
// Dynamic shared memory: t - first_key + 1 floats of scores.
__global__ void attention_decode_kernel(floatX* out, floatX* k_cache, floatX* v_cache,
                                        const floatX* qkv, int first_key, int t, int max_t, int NH, int HS,
                                        float scale) {
  extern __shared__ float scores[];
  __shared__ float reduce[WARP_SIZE];
  const int h = blockIdx.x, C = NH * HS;
  const floatX* q = qkv + h * HS;
  floatX* keys = k_cache + (size_t)h * max_t * HS;
  floatX* values = v_cache + (size_t)h * max_t * HS;
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    keys[(size_t)t * HS + d] = qkv[C + h * HS + d];
    values[(size_t)t * HS + d] = qkv[2 * C + h * HS + d];
  }
  __syncthreads();
  keys += (size_t)first_key * HS;
  values += (size_t)first_key * HS;
  const int n = t - first_key + 1;
  float local_max = -FLT_MAX;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float dot = 0.0f;
    for (int d = 0; d < HS; d++) dot += (float)q[d] * (float)keys[(size_t)j * HS + d];
    scores[j] = dot * scale;
    local_max = fmaxf(local_max, scores[j]);
  }
  local_max = warp_reduce_max(local_max);
  __syncthreads();
  if (threadIdx.x % WARP_SIZE == 0) reduce[threadIdx.x / WARP_SIZE] = local_max;
  __syncthreads();
  float max_score = -FLT_MAX;
  for (int w = 0; w < (int)blockDim.x / WARP_SIZE; w++) max_score = fmaxf(max_score, reduce[w]);
  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    scores[j] = expf(scores[j] - max_score);
    local_sum += scores[j];
  }
  const float inv_sum = 1.0f / block_reduce_sum(local_sum, reduce);
  __syncthreads();
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; j++) acc += scores[j] * (float)values[(size_t)j * HS + d];
    out[h * HS + d] = (floatX)(acc * inv_sum);
  }
}

// out [NH, HS] from the token's qkv [3, NH, HS], attending to positions first_key..t; its key and
// value go into k_cache and v_cache [NH, max_t, HS] at position t.
void attention_forward_decode(floatX* out, floatX* k_cache, floatX* v_cache, const floatX* qkv, int first_key, int t,
                              int max_t, int NH, int HS, float scale, cudaStream_t stream) {
  REQUIRE(t >= 0 && t < max_t, "attention_forward_decode: position %d outside the cache's %d", t, max_t);
  REQUIRE(first_key >= 0 && first_key <= t, "attention_forward_decode: first key %d outside 0..%d", first_key, t);
  attention_decode_kernel<<<NH, kDecodeThreads, (t - first_key + 1) * sizeof(float), stream>>>(
      out, k_cache, v_cache, qkv, first_key, t, max_t, NH, HS, scale);
  cudaCheckLaunch();
}

// ---- Record #89's composed attention on the tensor cores (BF16 builds) ----
#if !defined(ENABLE_FP32)
namespace flash {
// BF16 builds, head size 64 or 128: each kernel's block a tile of 64 positions of one row, one head at
// a time, the products on the tensor cores (FP32 sums), the probabilities and their mixes in FP32 as
// the plain kernels form them.
// - Forward, a tile of 64 queries (positions p0 .. p0 + 63) against the 192 key positions from p0 - 128
//   (a window of at most 128 keys reaches no further back): Q K^T in chunks of 64 keys, three times:
//   for each row's maximum, its sum, and P = exp(s - max) / sum; wn_h P is added into A (FP32 in
//   shared memory, each thread its own values, heads in order). Then, a head at a time, round(w_out_h
//   A) V_h is added to y. The tiles of a row start at its position 0 and decoding runs the same kernel
//   on the query's tile (its keys from the cache), so a key meets a query at the same column of a
//   product in both: the same bits.
// - dq, the same tiles: A = sum_h wn_h P_h (P from the forward's log-sum-exp) and dA = sum_h w_out_h
//   G_h (G_h = dout_h V_h^T) first, then a head at a time dw_out_h = sum A G_h, dwn_h = sum dA P_h, D_h
//   = wn_h dwn_h (kept for dk), dS_h = P_h (wn_h dA - D_h) and dq_h += scale dS_h K_h; dw_in through
//   the norm at the end.
// - dk and dv, a tile of 64 keys (positions j0 .. j0 + 63) against the 192 query positions from j0:
//   the transposed products (K Q^T, V dout^T) give A^T and dA^T the same way, then a head at a time
//   dk_h += scale dS_h^T Q_h and dv_h += round(w_out_h A)^T dout_h.
// Each output is written by one thread, each sum in a fixed order: deterministic.
constexpr int kComposedKeys = 192, kComposedReach = kComposedKeys - kTileRows;
constexpr int kComposedChunks = kComposedKeys / kTileRows;
static_assert(kComposedMaxWindow <= kComposedReach, "a tile's keys hold each of its queries' windows");

// A thread's values of a [64, 192] FP32 tile (A, dA or their transposes): the C fragments of its
// warp's 16 rows by the 192 columns, kept in shared memory value-major ([kComposedTileValues,
// kThreads]), each thread its own.
constexpr int kComposedTileValues = kComposedKeys / 8 * 4;

__device__ __forceinline__ int composed_value(int chunk, int n, int e) { return (chunk * kTileRows / 8 + n) * 4 + e; }

// The column of value (chunk, n, e) for this lane, and the row slot of e.
__device__ __forceinline__ int composed_column(int chunk, int n, int e) {
  return chunk * kTileRows + n * 8 + 2 * (threadIdx.x % 4) + e % 2;
}
__device__ __forceinline__ int composed_slot(int e) {
  return warp_in_group() * 16 + (threadIdx.x % WARP_SIZE) / 4 + (e / 2) * 8;
}

// f(n, e) for each of a thread's values of a 16 x 64 chunk's C fragments.
template <class F>
__device__ __forceinline__ void for_chunk_values(F f) {
#pragma unroll
  for (int n = 0; n < kTileRows / 8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) f(n, e);
  }
}

// The mixes over the heads (A, dA, their transposes): value (chunk, n, e) of a thread's own FP32 tile
// `mix` (value-major) set to weight(n, e) x at the first head, weight(n, e) x added at the others.
template <class Weight>
__device__ __forceinline__ void composed_mix(float* mix, const float x[kTileRows / 8][4], int chunk, bool first,
                                             Weight weight) {
  for_chunk_values([&](int n, int e) {
    float& m = mix[composed_value(chunk, n, e) * kThreads];
    const float term = weight(n, e) * x[n][e];
    m = first ? term : m + term;
  });
}

// A block's queries and keys. Training: row b = blockIdx.y, query slot s at position p0 + s (below
// T), flat row b T + p0 + s of qkv, y, out, lse and the gates, key position j at flat row b T + j.
// Decoding (decode_t >= 0): the one query at position decode_t, its rows the buffers' first, the
// keys the cache's positions first .. decode_t.
struct ComposedTile {
  ComposedOperands ops;
  const int* documents;  // training: each token's document, or null
  int T, window, decode_t, first;
  int p0, key_end;
  size_t row0;  // the flat row of position 0: b T in training, 0 in decoding
  __device__ ComposedTile(const ComposedOperands& o, const int* docs, int T_, int window_, int decode_t_, int first_)
      : ops(o), documents(docs), T(T_), window(window_), decode_t(decode_t_), first(first_) {
    const bool decoding = decode_t >= 0;
    p0 = decoding ? decode_t - decode_t % kTileRows : blockIdx.x * kTileRows;
    key_end = decoding ? decode_t + 1 : T;
    row0 = decoding ? 0 : (size_t)blockIdx.y * T;
  }
  // Query slot s's flat row, or -1 where the slot holds no query.
  __device__ int query_row(int s) const {
    const int p = p0 + s;
    if (decode_t >= 0) return p == decode_t ? 0 : -1;
    return p < T ? (int)(row0 + p) : -1;
  }
  __device__ int key_position(int c) const { return p0 - kComposedReach + c; }
  __device__ bool key_valid(int j) const { return j >= first && j < key_end; }
  __device__ const floatX* key(int j, int h) const { return ops.key((int)row0 + j, h); }
  __device__ const floatX* value(int j, int h) const { return ops.value((int)row0 + j, h); }
};

// A row's values in shared memory, 64 rows (a query tile's) or 192 (a key tile's queries): its normed
// w_in rounded (the forward's weights) at normed[r NH + h] and in FP32 at normed32 (the norm's
// backward), 1 / rms at inv[r], its w_out at gate_out, its document at doc[r]; and 64 or 192 other
// documents (the tile's keys', or a key tile's own) at other_doc.
struct ComposedRows {
  float *normed, *normed32, *gate_out, *inv;
  int *doc, *other_doc;
  static constexpr size_t bytes(int rows, int others) {
    return ((3 * llmc::kMuddGateHeads + 1) * rows + rows + others) * sizeof(float);
  }
  __device__ ComposedRows(unsigned char* at, int rows) {
    normed = reinterpret_cast<float*>(at);
    normed32 = normed + rows * llmc::kMuddGateHeads;
    gate_out = normed32 + rows * llmc::kMuddGateHeads;
    inv = gate_out + rows * llmc::kMuddGateHeads;
    doc = reinterpret_cast<int*>(inv + rows);
    other_doc = doc + rows;
  }
  // Row r's values from flat row `row` (zeros where it is -1).
  __device__ void load(int r, int row, GateRows w_in, GateRows w_out, const int* documents, int NH) const {
    if (row >= 0) inv[r] = composed_norm(normed + r * NH, normed32 + r * NH, w_in, row, NH);
    for (int h = 0; h < NH; h++) {
      if (row < 0) normed[r * NH + h] = normed32[r * NH + h] = 0.0f;
      gate_out[r * NH + h] = row >= 0 ? w_out.at(row, h) : 0.0f;
    }
    doc[r] = row >= 0 && documents ? documents[row] : 0;
  }
};

// Shared memory of the query tiles' kernels: `tiles` tiles of 64 rows and one of 192 (floatX, HS
// wide), `values` FP32 tiles of A's shape, and 64 rows' values.
template <int HS>
constexpr size_t composed_query_smem_bytes(int tiles, int values) {
  return (size_t)(tiles * kTileRows + kComposedKeys) * HS * sizeof(floatX) +
         (size_t)values * kComposedTileValues * kThreads * sizeof(float) +
         ComposedRows::bytes(kTileRows, kComposedKeys);
}

// ROWS rows of one head into a tile (load_tile's layout): row r from source(r), or zeros where it
// gives null (nothing read; `fallback`, any row of global memory, stands in for the address). Beside
// load_tile rather than under it: load_tile's flash kernels, timed as they are, compile otherwise
// through a row source (up to 9 more registers).
template <int HS, int ROWS, class Source>
__device__ __forceinline__ void load_rows(floatX* dst, Source source, const floatX* fallback) {
  constexpr int kChunks = HS / 8;
  static_assert(ROWS * kChunks % kThreads == 0 && kThreads % (8 * kChunks) == 0,
                "each thread copies the same columns of rows 8 apart");
  const int r = threadIdx.x / kChunks, c = threadIdx.x % kChunks * 8;
  const int offset = tile_offset<HS>(r, c);
#pragma unroll
  for (int k = 0; k < ROWS * kChunks / kThreads; k++) {
    const floatX* src = source(r + k * (kThreads / kChunks));
    copy_async_16(dst + offset + k * (kThreads / kChunks) * HS, (src ? src : fallback) + c, src != nullptr);
  }
}

// Waits for this thread's copies and publishes every thread's.
__device__ __forceinline__ void composed_copies_landed() {
  copy_async_commit();
  wait_tile_copies<0>();
  __syncthreads();
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// s = the warp's 16 rows of a_tile (as A fragments) times 64 rows of b_tile from row 64 chunk.
template <int HS>
__device__ __forceinline__ void composed_product(float s[kTileRows / 8][4], const floatX* a_tile,
                                                 const floatX* b_tile, int chunk) {
  uint32_t a[HS / 16][4];
  load_row_fragments<HS>(a, a_tile);
  multiply_by_rows<HS, kTileRows>(s, a, b_tile + chunk * kTileRows * HS);
}

// A query tile's setup: each row's values and the keys' documents into `rows`, then a barrier.
__device__ void composed_query_rows(const ComposedRows& rows, const ComposedTile& tile, GateRows w_in,
                                    GateRows w_out, int NH) {
  if (threadIdx.x < kTileRows) rows.load(threadIdx.x, tile.query_row(threadIdx.x), w_in, w_out, tile.documents, NH);
  for (int c = threadIdx.x; c < kComposedKeys; c += kThreads) {
    const int j = tile.key_position(c);
    rows.other_doc[c] = tile.key_valid(j) && tile.documents ? tile.documents[tile.row0 + j] : 0;
  }
  __syncthreads();
}

// Whether the query of slot `slot` (flat row `row`) sees key column c.
__device__ __forceinline__ bool composed_query_sees(const ComposedTile& tile, const ComposedRows& rows, int slot,
                                                    int row, int c) {
  const int t = tile.p0 + slot, j = tile.key_position(c);
  return row >= 0 && tile.key_valid(j) && j <= t && t - j < tile.window && rows.other_doc[c] == rows.doc[slot];
}

// One head's Q (the tile's queries) and K (its keys) into q_s and kv_s, or dout's rows and V.
template <int HS>
__device__ __forceinline__ void composed_load_queries(floatX* dst, const floatX* base, size_t row_stride,
                                                      const ComposedTile& tile, int h) {
  load_rows<HS, kTileRows>(dst, [&](int s) {
    const int r = tile.query_row(s);
    return r >= 0 ? base + (size_t)r * row_stride + h * HS : nullptr;
  }, base);
}
template <int HS>
__device__ __forceinline__ void composed_load_keys(floatX* dst, const ComposedTile& tile, int h, bool values) {
  load_rows<HS, kComposedKeys>(dst, [&](int c) {
    const int j = tile.key_position(c);
    return tile.key_valid(j) ? (values ? tile.value(j, h) : tile.key(j, h)) : nullptr;
  }, tile.ops.k);
}

template <int HS>
__global__ void __launch_bounds__(kThreads) composed_forward_tile_kernel(floatX* out, float* lse, const floatX* y,
                                                                         ComposedOperands ops, const int* documents,
                                                                         int T, int window, int decode_t, int first,
                                                                         GateRows w_in, GateRows w_out, float scale,
                                                                         int NH, int C) {
  extern __shared__ __align__(1024) unsigned char composed_smem[];
  floatX* q_s = reinterpret_cast<floatX*>(composed_smem);
  floatX* kv_s = q_s + kTileRows * HS;
  float* A = reinterpret_cast<float*>(kv_s + kComposedKeys * HS) + threadIdx.x;  // value i at A[i kThreads]
  const ComposedRows rows(reinterpret_cast<unsigned char*>(A - threadIdx.x + kComposedTileValues * kThreads),
                          kTileRows);
  const ComposedTile tile(ops, documents, T, window, decode_t, first);
  composed_query_rows(rows, tile, w_in, w_out, NH);
  const int t4 = threadIdx.x % 4, slot[2] = {composed_slot(0), composed_slot(2)};
  const int row[2] = {tile.query_row(slot[0]), tile.query_row(slot[1])};
  // The scores of key chunk `chunk` into s (scaled; -inf where unseen).
  auto scores = [&](float s[kTileRows / 8][4], int chunk) {
    composed_product<HS>(s, q_s, kv_s, chunk);
    for_chunk_values([&](int n, int e) {
      const bool seen = composed_query_sees(tile, rows, slot[e / 2], row[e / 2], composed_column(chunk, n, e));
      s[n][e] = seen ? scale * s[n][e] : -INFINITY;
    });
  };
  for (int h = 0; h < NH; h++) {
    composed_load_queries<HS>(q_s, ops.q, ops.q_row, tile, h);
    composed_load_keys<HS>(kv_s, tile, h, false);
    composed_copies_landed();
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float s[kTileRows / 8][4];
      scores(s, chunk);
      for_chunk_values([&](int n, int e) { row_max[e / 2] = fmaxf(row_max[e / 2], s[n][e]); });
    }
    for (int r = 0; r < 2; r++) row_max[r] = quad_max(row_max[r]);
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float s[kTileRows / 8][4];
      scores(s, chunk);
      for_chunk_values([&](int n, int e) {
        row_sum[e / 2] += s[n][e] == -INFINITY ? 0.0f : expf(s[n][e] - row_max[e / 2]);
      });
    }
    for (int r = 0; r < 2; r++) row_sum[r] = quad_sum(row_sum[r]);
    const float wn[2] = {rows.normed[slot[0] * NH + h], rows.normed[slot[1] * NH + h]};
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float s[kTileRows / 8][4];
      scores(s, chunk);
      for_chunk_values([&](int n, int e) {
        s[n][e] = s[n][e] == -INFINITY ? 0.0f : expf(s[n][e] - row_max[e / 2]) / row_sum[e / 2];
      });
      composed_mix(A, s, chunk, h == 0, [&](int, int e) { return wn[e / 2]; });
    }
    for (int r = 0; r < 2; r++) {
      if (t4 == 0 && row[r] >= 0) lse[(size_t)row[r] * NH + h] = row_max[r] + logf(row_sum[r]);
    }
    __syncthreads();  // the next head's copies overwrite the tiles
  }
  for (int h = 0; h < NH; h++) {
    composed_load_keys<HS>(kv_s, tile, h, true);
    composed_copies_landed();
    const float wo[2] = {rows.gate_out[slot[0] * NH + h], rows.gate_out[slot[1] * NH + h]};
    float o[HS / 8][4] = {};
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float weight[kTileRows / 8][4];
      for_chunk_values([&](int n, int e) { weight[n][e] = wo[e / 2] * A[composed_value(chunk, n, e) * kThreads]; });
      accumulate_product<HS, kTileRows>(o, weight, kv_s + chunk * kTileRows * HS);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      if (row[r] < 0) continue;
#pragma unroll
      for (int dn = 0; dn < HS / 8; dn++) {
        const size_t at = (size_t)row[r] * C + h * HS + dn * 8 + 2 * t4;
        const __nv_bfloat162 base = *reinterpret_cast<const __nv_bfloat162*>(y + at);
        *reinterpret_cast<__nv_bfloat162*>(out + at) = __floats2bfloat162_rn(
            __low2float(base) + o[dn][2 * r], __high2float(base) + o[dn][2 * r + 1]);
      }
    }
    __syncthreads();  // the next head's copies overwrite the tile
  }
}

// Adds scale acc (a warp's 16 rows of C fragments, HS columns) into rows[r] of x at column offset
// `column` (rows -1 left out), each pair of values rounded once.
template <int HS>
__device__ __forceinline__ void composed_add_rows(floatX* x, size_t row_stride, int column, const int row[2],
                                                  const float acc[HS / 8][4], float scale) {
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (row[r] < 0) continue;
#pragma unroll
    for (int dn = 0; dn < HS / 8; dn++) {
      auto* at = reinterpret_cast<__nv_bfloat162*>(x + (size_t)row[r] * row_stride + column + dn * 8 + 2 * t4);
      const __nv_bfloat162 old = *at;
      *at = __floats2bfloat162_rn(__low2float(old) + scale * acc[dn][2 * r],
                                  __high2float(old) + scale * acc[dn][2 * r + 1]);
    }
  }
}

template <int HS>
__global__ void __launch_bounds__(kThreads) composed_dq_tile_kernel(floatX* dqkv, float* D, GateGradient dw_in,
                                                                    GateGradient dw_out, const floatX* dout,
                                                                    const floatX* qkv, const float* lse,
                                                                    GateRows w_in, GateRows w_out,
                                                                    const int* documents, int T, int window,
                                                                    float scale, int NH, int C) {
  extern __shared__ __align__(1024) unsigned char composed_smem[];
  floatX* q_s = reinterpret_cast<floatX*>(composed_smem);
  floatX* do_s = q_s + kTileRows * HS;
  floatX* kv_s = do_s + kTileRows * HS;
  float* A = reinterpret_cast<float*>(kv_s + kComposedKeys * HS) + threadIdx.x;  // value i at A[i kThreads]
  float* dA = A + kComposedTileValues * kThreads;
  float* dwn = dA - threadIdx.x + kComposedTileValues * kThreads;  // [64, NH]
  const ComposedRows rows(reinterpret_cast<unsigned char*>(dwn + kTileRows * llmc::kMuddGateHeads), kTileRows);
  const ComposedOperands ops = composed_rows_of(qkv, C, HS);
  const ComposedTile tile(ops, documents, T, window, -1, 0);
  composed_query_rows(rows, tile, w_in, w_out, NH);
  const int t4 = threadIdx.x % 4, slot[2] = {composed_slot(0), composed_slot(2)};
  const int row[2] = {tile.query_row(slot[0]), tile.query_row(slot[1])};
  auto seen = [&](int chunk, int n, int e) {
    return composed_query_sees(tile, rows, slot[e / 2], row[e / 2], composed_column(chunk, n, e));
  };
  // P_h of key chunk `chunk` (from the forward's log-sum-exp l; 0 where unseen).
  auto probs = [&](float s[kTileRows / 8][4], int chunk, const float l[2]) {
    composed_product<HS>(s, q_s, kv_s, chunk);
    for_chunk_values([&](int n, int e) { s[n][e] = seen(chunk, n, e) ? expf(scale * s[n][e] - l[e / 2]) : 0.0f; });
  };
  // G_h = dout_h . v_h of key chunk `chunk` (0 where unseen).
  auto dots = [&](float s[kTileRows / 8][4], int chunk) {
    composed_product<HS>(s, do_s, kv_s, chunk);
    for_chunk_values([&](int n, int e) { s[n][e] = seen(chunk, n, e) ? s[n][e] : 0.0f; });
  };
  auto load = [&](int h, bool queries, bool gradients, bool keys, bool values) {
    if (queries) composed_load_queries<HS>(q_s, qkv, 3 * (size_t)C, tile, h);
    if (gradients) composed_load_queries<HS>(do_s, dout, C, tile, h);
    if (keys || values) composed_load_keys<HS>(kv_s, tile, h, values);
    composed_copies_landed();
  };
  // Head h's values of this thread's two rows: the log-sum-exp, normed w_in, w_out.
  auto row_values = [&](int h, float l[2], float wn[2], float wo[2]) {
    for (int r = 0; r < 2; r++) {
      l[r] = row[r] >= 0 ? lse[(size_t)row[r] * NH + h] : 0.0f;
      wn[r] = rows.normed[slot[r] * NH + h];
      wo[r] = rows.gate_out[slot[r] * NH + h];
    }
  };
  for (int h = 0; h < NH; h++) {  // A and dA over the heads, in order
    float l[2], wn[2], wo[2];
    row_values(h, l, wn, wo);
    load(h, true, false, true, false);
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float p[kTileRows / 8][4];
      probs(p, chunk, l);
      composed_mix(A, p, chunk, h == 0, [&](int, int e) { return wn[e / 2]; });
    }
    __syncthreads();
    load(h, false, true, false, true);
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float g[kTileRows / 8][4];
      dots(g, chunk);
      composed_mix(dA, g, chunk, h == 0, [&](int, int e) { return wo[e / 2]; });
    }
    __syncthreads();
  }
  for (int h = 0; h < NH; h++) {
    float l[2], wn[2], wo[2];
    row_values(h, l, wn, wo);
    load(h, false, true, false, true);
    float dwo[2] = {0.0f, 0.0f};
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float g[kTileRows / 8][4];
      dots(g, chunk);
      for_chunk_values([&](int n, int e) { dwo[e / 2] += A[composed_value(chunk, n, e) * kThreads] * g[n][e]; });
    }
    __syncthreads();
    load(h, true, false, true, false);
    float dw[2] = {0.0f, 0.0f};
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float p[kTileRows / 8][4];
      probs(p, chunk, l);
      for_chunk_values([&](int n, int e) { dw[e / 2] += dA[composed_value(chunk, n, e) * kThreads] * p[n][e]; });
    }
    float d_h[2];
    for (int r = 0; r < 2; r++) {
      dwo[r] = quad_sum(dwo[r]);
      dw[r] = quad_sum(dw[r]);
      d_h[r] = wn[r] * dw[r];
      if (t4 == 0 && row[r] >= 0) {
        dwn[slot[r] * NH + h] = dw[r];
        D[(size_t)row[r] * NH + h] = d_h[r];
        dw_out.values[(size_t)row[r] * dw_out.stride + h] = (floatX)dwo[r];
      }
    }
    float dq[HS / 8][4] = {};
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float ds[kTileRows / 8][4];
      probs(ds, chunk, l);
      for_chunk_values([&](int n, int e) {
        ds[n][e] *= wn[e / 2] * dA[composed_value(chunk, n, e) * kThreads] - d_h[e / 2];
      });
      accumulate_product<HS, kTileRows>(dq, ds, kv_s + chunk * kTileRows * HS);
    }
    composed_add_rows<HS>(dqkv, 3 * (size_t)C, h * HS, row, dq, scale);
    __syncthreads();
  }
  if (threadIdx.x < kTileRows) {  // through the norm: dw = (dwn - wn (mean of dwn wn)) / rms, wn in FP32
    const int s = threadIdx.x, r = tile.query_row(s);
    if (r >= 0) {
      const float* wn32 = rows.normed32 + s * NH;
      float mean = 0.0f;
      for (int g = 0; g < NH; g++) mean += dwn[s * NH + g] * wn32[g];
      mean /= (float)NH;
      for (int g = 0; g < NH; g++) {
        dw_in.values[(size_t)r * dw_in.stride + g] = (floatX)((dwn[s * NH + g] - wn32[g] * mean) * rows.inv[s]);
      }
    }
  }
}

// A key tile: row b = blockIdx.y, key slot s at position j0 + s, query column c at position j0 + c
// (both below T), flat rows b T + position.
struct ComposedKeyTile {
  const int* documents;
  int T, window, j0;
  size_t row0;
  __device__ ComposedKeyTile(const int* docs, int T_, int window_)
      : documents(docs), T(T_), window(window_), j0(blockIdx.x * kTileRows), row0((size_t)blockIdx.y * T_) {}
  __device__ int key_row(int s) const { return j0 + s < T ? (int)(row0 + j0 + s) : -1; }
  __device__ int query_row(int c) const { return j0 + c < T ? (int)(row0 + j0 + c) : -1; }
};

// Shared memory of the dk/dv kernel: K (then V) [64, HS], Q and dout [192, HS], A^T and dA^T (FP32,
// A's shape), the 192 queries' values (and the keys' documents), and each query's log-sum-exp and D
// of the head at hand.
template <int HS>
constexpr size_t composed_dkdv_smem_bytes() {
  return (size_t)(kTileRows + 2 * kComposedKeys) * HS * sizeof(floatX) +
         2 * (size_t)kComposedTileValues * kThreads * sizeof(float) + ComposedRows::bytes(kComposedKeys, kTileRows) +
         2 * kComposedKeys * sizeof(float);
}

template <int HS>
__global__ void __launch_bounds__(kThreads) composed_dkdv_tile_kernel(floatX* dqkv, const float* D,
                                                                      const floatX* dout, const floatX* qkv,
                                                                      const float* lse, GateRows w_in,
                                                                      GateRows w_out, const int* documents, int T,
                                                                      int window, float scale, int NH, int C) {
  extern __shared__ __align__(1024) unsigned char composed_smem[];
  floatX* kv_s = reinterpret_cast<floatX*>(composed_smem);
  floatX* q_s = kv_s + kTileRows * HS;
  floatX* do_s = q_s + kComposedKeys * HS;
  float* At = reinterpret_cast<float*>(do_s + kComposedKeys * HS) + threadIdx.x;  // value i at At[i kThreads]
  float* dAt = At + kComposedTileValues * kThreads;
  float* lse_h = dAt - threadIdx.x + kComposedTileValues * kThreads;  // [192]
  float* D_h = lse_h + kComposedKeys;                                 // [192]
  const ComposedRows queries(reinterpret_cast<unsigned char*>(D_h + kComposedKeys), kComposedKeys);
  const ComposedKeyTile tile(documents, T, window);
  for (int c = threadIdx.x; c < kComposedKeys; c += kThreads) {
    queries.load(c, tile.query_row(c), w_in, w_out, documents, NH);
  }
  if (threadIdx.x < kTileRows) {
    const int r = tile.key_row(threadIdx.x);
    queries.other_doc[threadIdx.x] = r >= 0 && documents ? documents[r] : 0;
  }
  const int slot[2] = {composed_slot(0), composed_slot(2)};
  const int key_row[2] = {tile.key_row(slot[0]), tile.key_row(slot[1])};
  // Whether query column c sees the key of slot `slot`.
  auto seen = [&](int chunk, int n, int e) {
    const int c = composed_column(chunk, n, e), s = slot[e / 2];
    return key_row[e / 2] >= 0 && tile.query_row(c) >= 0 && s <= c && c - s < tile.window &&
           queries.doc[c] == queries.other_doc[s];
  };
  auto load = [&](int h, bool keys, bool values, bool queries_too, bool gradients) {
    if (keys || values) {
      load_rows<HS, kTileRows>(kv_s, [&](int s) {
        const int r = tile.key_row(s);
        return r >= 0 ? qkv + (size_t)r * 3 * C + (values ? 2 : 1) * C + h * HS : nullptr;
      }, qkv);
    }
    if (queries_too) {
      load_rows<HS, kComposedKeys>(q_s, [&](int c) {
        const int r = tile.query_row(c);
        return r >= 0 ? qkv + (size_t)r * 3 * C + h * HS : nullptr;
      }, qkv);
    }
    if (gradients) {
      load_rows<HS, kComposedKeys>(do_s, [&](int c) {
        const int r = tile.query_row(c);
        return r >= 0 ? dout + (size_t)r * C + h * HS : nullptr;
      }, dout);
    }
    for (int c = threadIdx.x; c < kComposedKeys; c += kThreads) {
      const int r = tile.query_row(c);
      lse_h[c] = r >= 0 ? lse[(size_t)r * NH + h] : 0.0f;
      D_h[c] = r >= 0 ? D[(size_t)r * NH + h] : 0.0f;
    }
    composed_copies_landed();
  };
  // P_h^T of query chunk `chunk` (0 where unseen).
  auto probs = [&](float s[kTileRows / 8][4], int chunk) {
    composed_product<HS>(s, kv_s, q_s, chunk);
    for_chunk_values([&](int n, int e) {
      const int c = composed_column(chunk, n, e);
      s[n][e] = seen(chunk, n, e) ? expf(scale * s[n][e] - lse_h[c]) : 0.0f;
    });
  };
  for (int h = 0; h < NH; h++) {  // A^T and dA^T over the heads, in order
    load(h, true, false, true, false);
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float p[kTileRows / 8][4];
      probs(p, chunk);
      composed_mix(At, p, chunk, h == 0,
                   [&](int n, int e) { return queries.normed[composed_column(chunk, n, e) * NH + h]; });
    }
    __syncthreads();
    load(h, false, true, false, true);
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float g[kTileRows / 8][4];
      composed_product<HS>(g, kv_s, do_s, chunk);
      for_chunk_values([&](int n, int e) { g[n][e] = seen(chunk, n, e) ? g[n][e] : 0.0f; });
      composed_mix(dAt, g, chunk, h == 0,
                   [&](int n, int e) { return queries.gate_out[composed_column(chunk, n, e) * NH + h]; });
    }
    __syncthreads();
  }
  for (int h = 0; h < NH; h++) {
    load(h, true, false, true, true);
    float dk[HS / 8][4] = {};
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float ds[kTileRows / 8][4];
      probs(ds, chunk);
      for_chunk_values([&](int n, int e) {
        const int c = composed_column(chunk, n, e);
        ds[n][e] *= queries.normed[c * NH + h] * dAt[composed_value(chunk, n, e) * kThreads] - D_h[c];
      });
      accumulate_product<HS, kTileRows>(dk, ds, q_s + chunk * kTileRows * HS);
    }
    composed_add_rows<HS>(dqkv, 3 * (size_t)C, C + h * HS, key_row, dk, scale);
    float dv[HS / 8][4] = {};
#pragma unroll
    for (int chunk = 0; chunk < kComposedChunks; chunk++) {
      float weight[kTileRows / 8][4];
      for_chunk_values([&](int n, int e) {
        const float wo = queries.gate_out[composed_column(chunk, n, e) * NH + h];
        weight[n][e] = wo * At[composed_value(chunk, n, e) * kThreads];
      });
      accumulate_product<HS, kTileRows>(dv, weight, do_s + chunk * kTileRows * HS);
    }
    composed_add_rows<HS>(dqkv, 3 * (size_t)C, 2 * C + h * HS, key_row, dv, 1.0f);
    __syncthreads();
  }
}

// Raises a kernel's dynamic shared-memory limit once (above 48 KiB needs an opt-in).
template <class Kernel>
void composed_smem_limit(Kernel kernel, size_t bytes, bool* done) {
  if (*done) return;
  cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  *done = true;
}

// Launches the tile forward: training (decode_t -1) over `rows` rows of T, or decoding one query.
template <int HS>
void composed_forward_tiles(floatX* out, float* lse, const floatX* y, const ComposedOperands& ops,
                            const int* documents, int rows, int T, int window, int decode_t, int first, GateRows w_in,
                            GateRows w_out, float scale, int NH, int C, cudaStream_t stream) {
  static bool limit_set = false;
  const size_t smem = composed_query_smem_bytes<HS>(1, 1);
  composed_smem_limit(composed_forward_tile_kernel<HS>, smem, &limit_set);
  const dim3 grid = decode_t >= 0 ? dim3(1, 1) : dim3(ceil_div(T, kTileRows), rows);
  composed_forward_tile_kernel<HS><<<grid, kThreads, smem, stream>>>(out, lse, y, ops, documents, T, window,
                                                                     decode_t, first, w_in, w_out, scale, NH, C);
  cudaCheckLaunch();
}

// Launches the tile backward over `rows` rows of T: dq (and D, dw_in, dw_out), then dk and dv.
template <int HS>
void composed_backward_tiles(floatX* dqkv, GateGradient dw_in, GateGradient dw_out, float* D, const floatX* dout,
                             const floatX* qkv, const float* lse, GateRows w_in, GateRows w_out,
                             const int* documents, int rows, int T, int window, float scale, int NH, int C,
                             cudaStream_t stream) {
  static bool dq_limit = false, dkdv_limit = false;
  const size_t dq_smem = composed_query_smem_bytes<HS>(2, 2) + kTileRows * llmc::kMuddGateHeads * sizeof(float);
  composed_smem_limit(composed_dq_tile_kernel<HS>, dq_smem, &dq_limit);
  composed_smem_limit(composed_dkdv_tile_kernel<HS>, composed_dkdv_smem_bytes<HS>(), &dkdv_limit);
  const dim3 grid(ceil_div(T, kTileRows), rows);
  composed_dq_tile_kernel<HS><<<grid, kThreads, dq_smem, stream>>>(dqkv, D, dw_in, dw_out, dout, qkv, lse, w_in,
                                                                   w_out, documents, T, window, scale, NH, C);
  cudaCheckLaunch();
  composed_dkdv_tile_kernel<HS><<<grid, kThreads, composed_dkdv_smem_bytes<HS>(), stream>>>(
      dqkv, D, dout, qkv, lse, w_in, w_out, documents, T, window, scale, NH, C);
  cudaCheckLaunch();
}
}  // namespace flash
#endif  // !ENABLE_FP32

#if !defined(ENABLE_FP32)
void composed_head_size_check(int HS) {
  REQUIRE(HS == 64 || HS == 128, "composed attention: the BF16 build's kernels take heads of 64 or 128, not %d", HS);
}

// The tile forward at the head size C / NH (64 or 128).
void composed_forward_by_head_size(floatX* out, float* lse, const floatX* y, const ComposedOperands& ops,
                                   const int* documents, int rows, int T, int window, int decode_t, int first,
                                   GateRows w_in, GateRows w_out, float scale, int NH, int C, cudaStream_t stream) {
  composed_head_size_check(C / NH);
  auto launch = C / NH == 64 ? flash::composed_forward_tiles<64> : flash::composed_forward_tiles<128>;
  launch(out, lse, y, ops, documents, rows, T, window, decode_t, first, w_in, w_out, scale, NH, C, stream);
}

// The tile backward at the head size C / NH (64 or 128).
void composed_backward_by_head_size(floatX* dqkv, GateGradient dw_in, GateGradient dw_out, float* D,
                                    const floatX* dout, const floatX* qkv, const float* lse, GateRows w_in,
                                    GateRows w_out, const int* documents, int rows, int T, int window, float scale,
                                    int NH, int C, cudaStream_t stream) {
  composed_head_size_check(C / NH);
  auto launch = C / NH == 64 ? flash::composed_backward_tiles<64> : flash::composed_backward_tiles<128>;
  launch(dqkv, dw_in, dw_out, D, dout, qkv, lse, w_in, w_out, documents, rows, T, window, scale, NH, C, stream);
}
#endif

// ============================================================================
// 7. GELU and ReLU^2
// ============================================================================
// The MLP's activation, elementwise over n values (whole 16-byte pieces): GELU's tanh
// approximation (GPT-2; PyTorch's gelu(approximate="tanh")), used where cuBLASLt's GELU
// epilogues are unavailable and when recomputing activations, or ReLU^2 = relu(x)^2 (the modern
// architecture). The forward writes out; the backward overwrites the gradient d with d * act'(x).
// No reductions: deterministic. Floor: forward one read, one write; backward two reads, one write.

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__device__ __forceinline__ float gelu(float x) {
  const float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float cube = 0.044715f * x * x * x;
  const float t = tanhf(kGeluScale * (x + cube));
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

__device__ __forceinline__ float relu2(float x) {
  const float r = fmaxf(x, 0.0f);
  return r * r;
}

__device__ __forceinline__ float relu2_grad(float x) { return 2.0f * fmaxf(x, 0.0f); }

// ReLU^2's derivative from its output y = relu(x)^2: 2 sqrt(y), 2 relu(x) up to y's rounding. Record
// #89's MLP backward (-mr 1), which keeps no pre-activation, takes it so (its reference's). The square
// root is the one-instruction approximation (MUFU.SQRT, within an FP32 ulp or so of the rounded one)
// with subnormals flushed, as the reference's tl.sqrt compiles (sqrt.approx.ftz.f32, read from its
// PTX on an H200): sqrtf's IEEE rounding adds a slow-path call inside the product's epilogue, where
// the registers are spoken for.
__device__ __forceinline__ float relu2_grad_from_output(float y) {
  float root;
  asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(root) : "f"(y));
  return 2.0f * root;
}

// The exact GELU, x Phi(x) (PyTorch's gelu), and its derivative Phi(x) + x phi(x).
constexpr float kInvSqrt2 = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * kInvSqrt2)); }
__device__ __forceinline__ float gelu_erf_grad(float x) {
  return 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}

template <Activation A>
__device__ __forceinline__ float activation(float x) {
  return A == Activation::kGelu ? gelu(x) : A == Activation::kGeluErf ? gelu_erf(x) : relu2(x);
}

template <Activation A>
__device__ __forceinline__ float activation_grad(float x) {
  return A == Activation::kGelu ? gelu_grad(x) : A == Activation::kGeluErf ? gelu_erf_grad(x) : relu2_grad(x);
}

template <Activation A>
__global__ void activation_forward_kernel(floatX* out, const floatX* inp, size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= n) return;
  const x128 x = load128(inp + i);
  x128 o;
  for (int k = 0; k < x128::size; k++) o[k] = (floatX)activation<A>((float)x[k]);
  store128(out + i, o);
}

// d *= act'(x), x the activation's input; kFromOutput (ReLU^2 alone): inp is the output y and
// the derivative relu2_grad_from_output(y).
template <Activation A, bool kFromOutput = false>
__global__ void activation_backward_inplace_kernel(floatX* d, const floatX* inp, size_t n) {
  static_assert(!kFromOutput || A == Activation::kRelu2, "only ReLU^2's derivative is taken from its output");
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
  if (i >= n) return;
  const x128 x = load128(inp + i);
  x128 g = load128(d + i);
  for (int k = 0; k < x128::size; k++) {
    const float grad = kFromOutput ? relu2_grad_from_output((float)x[k]) : activation_grad<A>((float)x[k]);
    g[k] = (floatX)((float)g[k] * grad);
  }
  store128(d + i, g);
}

template <Activation A>
void activation_forward(const char* name, floatX* out, const floatX* inp, size_t n,
                        cudaStream_t stream) {
  REQUIRE(n % x128::size == 0, "%s: n=%zu must be a multiple of %d", name, n, x128::size);
  activation_forward_kernel<A><<<ceil_div(n / x128::size, 256), 256, 0, stream>>>(out, inp, n);
  cudaCheckLaunch();
}

template <Activation A, bool kFromOutput = false>
void activation_backward_inplace(const char* name, floatX* d, const floatX* inp, size_t n,
                                 cudaStream_t stream) {
  REQUIRE(n % x128::size == 0, "%s: n=%zu must be a multiple of %d", name, n, x128::size);
  activation_backward_inplace_kernel<A, kFromOutput><<<ceil_div(n / x128::size, 256), 256, 0, stream>>>(d, inp, n);
  cudaCheckLaunch();
}

void gelu_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
  activation_forward<Activation::kGelu>("gelu_forward", out, inp, n, stream);
}

void gelu_backward_inplace(floatX* d, const floatX* inp, size_t n, cudaStream_t stream) {
  activation_backward_inplace<Activation::kGelu>("gelu_backward", d, inp, n, stream);
}

// out = the exact GELU of x (record #89's MUDD gate generators' hidden layer, section 10).
void gelu_erf_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
  activation_forward<Activation::kGeluErf>("gelu_erf_forward", out, inp, n, stream);
}

// d *= the exact GELU's derivative at x.
void gelu_erf_backward_inplace(floatX* d, const floatX* inp, size_t n, cudaStream_t stream) {
  activation_backward_inplace<Activation::kGeluErf>("gelu_erf_backward", d, inp, n, stream);
}

// ---- Record #89's MUDD gate rows (section 10): the generator's product [N, stride] (W2's rows padded
// to stride with zeros) becomes pre = product + b2 and rows = pre scale over its first `columns`
// columns, each rounded to floatX as the reference's BF16 steps, its other columns zero; the scale a
// parameter (the gate generators'), or fixed (the dense connections' 0.1, a float as the reference's
// Python constant). Backward: dpre = drows scale rounded (zero past `columns`), db2[k] += the sum of
// dpre over the rows, and a parameter's dscale += the sum of pre . drows over the rows and columns, in
// section 2's two fixed-order stages: kRowBlocks row blocks, a thread a column and a row lane (its rows
// in order), the lanes added in order into the block's partial of each column and of the scale (the
// columns' in order), then column_sum_finalize. Floor: forward reads 2N stride values, writes 2N
// stride; backward reads 2N stride, writes N stride; memory-bound and tiny. (One block a column, the
// first version, read each row's 96 bytes column by column from 42 blocks: 1.35 ms a call at N 49,152,
// 5% of record #89's stage-3 step.)
constexpr int kGateRowsThreads = 256;
constexpr int kGateRowsMaxStride = 64;

__global__ void gate_rows_bias_scale_kernel(floatX* rows, floatX* pre, const floatX* product, const floatX* bias,
                                            const floatX* scale, float fixed_scale, int N, int columns, int stride) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * stride) return;
  const int k = (int)(i % stride);
  if (k >= columns) {
    pre[i] = rows[i] = (floatX)0.0f;
    return;
  }
  const floatX sum = (floatX)((float)product[i] + (float)bias[k]);
  pre[i] = sum;
  rows[i] = (floatX)((float)sum * (scale ? (float)scale[0] : fixed_scale));
}

// Block b: partials[b * (columns + 1) + k] = the sum of dpre's column k over the block's rows, and at
// k = columns the sum of pre . drows over them (with a parameter scale). Block (kGateRowsMaxStride,
// kColumnSumRowLanes): thread (k, y) column k of rows y, y + kColumnSumRowLanes, ... of the block.
__global__ void gate_rows_bias_scale_backward_kernel(floatX* dpre, float* partials, const floatX* drows,
                                                     const floatX* pre, const floatX* scale, float fixed_scale,
                                                     bool scale_gradient, int N, int columns, int stride) {
  __shared__ float bias_sums[kColumnSumRowLanes][kGateRowsMaxStride];
  __shared__ float scale_sums[kColumnSumRowLanes][kGateRowsMaxStride];
  const int k = threadIdx.x;
  const RowBlockRange rows = row_block_range(N, 1);
  const float s = scale ? (float)scale[0] : fixed_scale;
  float bias_sum = 0.0f, scale_sum = 0.0f;
  for (size_t n = rows.begin + threadIdx.y; k < stride && n < rows.end; n += kColumnSumRowLanes) {
    const size_t i = n * stride + k;
    if (k >= columns) {
      dpre[i] = (floatX)0.0f;
      continue;
    }
    const float g = (float)drows[i];
    const floatX d = (floatX)(g * s);
    dpre[i] = d;
    bias_sum += (float)d;
    if (scale_gradient) scale_sum += (float)pre[i] * g;
  }
  bias_sums[threadIdx.y][k] = bias_sum;
  scale_sums[threadIdx.y][k] = scale_sum;
  __syncthreads();
  float* block_partials = partials + (size_t)blockIdx.x * (columns + 1);
  if (threadIdx.y == 0 && k < columns) {
    float total = 0.0f, scale_total = 0.0f;
    for (int y = 0; y < kColumnSumRowLanes; y++) {
      total += bias_sums[y][k];
      scale_total += scale_sums[y][k];
    }
    block_partials[k] = total;
    scale_sums[0][k] = scale_total;
  }
  __syncthreads();
  if (!scale_gradient || threadIdx.y != 0 || k != 0) return;
  float scale_total = 0.0f;
  for (int c = 0; c < columns; c++) scale_total += scale_sums[0][c];
  block_partials[columns] = scale_total;
}

void gate_rows_check(const char* name, int N, int columns, int stride) {
  REQUIRE(N > 0 && columns > 0 && columns <= stride, "%s: N=%d must be positive and columns=%d within 1..%d",
          name, N, columns, stride);
}

// rows [N, stride] = (product + bias) scale over the first `columns` columns (zero after), pre [N,
// stride] the sum before the scale, which the backward reads; bias [columns], scale one value on the
// device, or null: fixed_scale.
void gate_rows_bias_scale(floatX* rows, floatX* pre, const floatX* product, const floatX* bias, const floatX* scale,
                          int N, int columns, int stride, cudaStream_t stream, float fixed_scale = 1.0f) {
  gate_rows_check("gate_rows_bias_scale", N, columns, stride);
  const size_t n = (size_t)N * stride;
  gate_rows_bias_scale_kernel<<<ceil_div(n, (size_t)kGateRowsThreads), kGateRowsThreads, 0, stream>>>(
      rows, pre, product, bias, scale, fixed_scale, N, columns, stride);
  cudaCheckLaunch();
}

// From drows [N, stride], dpre [N, stride] (written: drows scale, zero past `columns`), dbias [columns]
// += its column sums and, with a parameter scale, dscale += the sum of pre . drows, each rounded
// stochastically from seed (the scale's from seed + 1: a draw of its own); scale null: fixed_scale, and
// no dscale. partials: kRowBlocks (columns + 1) floats of scratch; stride at most kGateRowsMaxStride.
void gate_rows_bias_scale_backward(floatX* dpre, floatX* dbias, floatX* dscale, float* partials, const floatX* drows,
                                   const floatX* pre, const floatX* scale, int N, int columns, int stride,
                                   uint32_t seed, cudaStream_t stream, float fixed_scale = 1.0f) {
  const char* name = "gate_rows_bias_scale_backward";
  gate_rows_check(name, N, columns, stride);
  REQUIRE(stride <= kGateRowsMaxStride && partials, "%s: stride=%d must be at most %d, and partials given", name,
          stride, kGateRowsMaxStride);
  REQUIRE(dpre != drows, "%s: dpre must be apart from drows", name);
  REQUIRE((scale == nullptr) == (dscale == nullptr), "%s: a parameter scale and its gradient go together", name);
  gate_rows_bias_scale_backward_kernel<<<kRowBlocks, dim3(kGateRowsMaxStride, kColumnSumRowLanes), 0, stream>>>(
      dpre, partials, drows, pre, scale, fixed_scale, dscale != nullptr, N, columns, stride);
  cudaCheckLaunch();
  column_sum_finalize(dbias, partials, columns + 1, columns, kRowBlocks, seed, stream);
  if (dscale) column_sum_finalize(dscale, partials + columns, columns + 1, 1, kRowBlocks, seed + 1, stream);
}

// out = relu(x)^2.
void relu2_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
  activation_forward<Activation::kRelu2>("relu2_forward", out, inp, n, stream);
}

// d *= 2 * relu(x): the gradient of ReLU^2's output becomes that of its input x.
void relu2_backward_inplace(floatX* d, const floatX* inp, size_t n, cudaStream_t stream) {
  activation_backward_inplace<Activation::kRelu2>("relu2_backward", d, inp, n, stream);
}

// d *= 2 sqrt(y), y = relu(x)^2 as stored: the gradient of ReLU^2's output becomes that of its input
// without x (-mr 1).
void relu2_backward_from_output_inplace(floatX* d, const floatX* out, size_t n, cudaStream_t stream) {
  activation_backward_inplace<Activation::kRelu2, true>("relu2_backward_from_output", d, out, n, stream);
}

// d *= act'(x), act chosen at run time.
void activation_backward_inplace(Activation act, floatX* d, const floatX* inp, size_t n, cudaStream_t stream) {
  if (act == Activation::kGelu) gelu_backward_inplace(d, inp, n, stream);
  else relu2_backward_inplace(d, inp, n, stream);
}

// ============================================================================
// 8. Classifier
// ============================================================================
// One block per row of logits [N, Vp]: softmax over the first V columns (the padding is not part
// of the vocabulary), loss = logsumexp - logit[target] into losses[row], and, when dloss != 0,
// the logits are overwritten in place by dlogits = (softmax - onehot(target)) * dloss, zero in
// the padding. Only one logits-sized buffer ever exists. Floors: read and write N*Vp once.
// Capped logits (llmc::LogitCap, the kernels' CAP): the softmax, loss and gradient are those of
// y = cap(z) for each logit z, and the gradient written is that of z, dL/dy * dy/dz. The modern
// head's y = c * z / sqrt(z^2 + c^2), dy/dz = (c / sqrt(z^2 + c^2))^3, costs a reciprocal square
// root per logit; the speedrun's y = c * sigmoid((z + shift) / s), dy/dz = (c / s) * sigmoid * (1 - sigmoid),
// an exponential and a reciprocal (1 - sigmoid as e * sigmoid, exact where the sigmoid nears 1).
// These run on the SM's 16-lane special-function unit, one instruction in eight, and bound the
// capped classifier: an exponential and a reciprocal for the cap and one for the softmax are
// three a logit, and recomputing them for the gradient doubled that (a BF16 cast apiece would add
// a fourth: round_x128). So two kernels:
// - fused_classifier_kernel (GPT-2's uncapped logits; capped ones where the next does not fit):
//   the row copied into shared memory (cp.async: no registers held), two blocks per SM so that
//   one row is in flight while the other computes. Each thread takes its 16-byte pieces in turn:
//   the piece's max, the running sum rescaled when the max grows, the piece's exponentials; the
//   block then merges the threads' (max, sum) pairs in a fixed tree: deterministic. The
//   gradient's pass recomputes each exponential.
// - capped_classifier_kernel: a capped logit is at most the cap, so the softmax's exponentials
//   are taken against that bound, not the row's max, and each one is final when it is computed:
//   the kernel keeps exp(y - bound) * dy/dz of every column in shared memory (FP32: a row takes
//   four blocks, a cluster, each a quarter of it) and the gradient's pass is a multiply. The bound is
//   exact: the caps' exponentials stay above 2^-120 (kCappedShiftMaxLog2).
// With an FP8 head (the speedrun's, fixed scales) both write the gradient cast instead
// (ClassifierFp8Grad): e5m2(bf16(dlogits) * s) into a row of bytes, the bits the head's
// cast-transpose would make of the BF16 dlogits, and leave the logits as they were. That cast
// read the dlogits back (4.9 GB a 49,152-token micro step) after the classifier wrote them; the
// head's backward now only transposes the bytes (fp8_transpose). It records no amax: the loss's
// gradient is bounded (|dlogit| <= dloss * max dy/dz times the terms' weights, at most 4: 1 at the
// speedrun's cap, 1,792 after its scale, where E5M2 saturates at 57,344).
// The training loss may add terms (ClassifierTerms, record #89's): row r's cross-entropy against
// the targets of later rows of its sequence and against its target's prefix token, each weighted;
// with S the sum of a row's weights and W(c) that of the terms whose target is column c, the loss is
// the weighted sum of the terms' losses and dlogits = (S softmax - W) * dloss * dy/dz. One weight of
// 1 on the row's own target gives the plain loss's bits (S p - W = p - 1 exactly).
constexpr int kClassifierThreads = 512;

// Where the classifier writes the gradient of an FP8 head: rows [N, Vp] of E5M2 bytes under the
// fixed factor scale->scale (1/grad_s), or nothing (rows nullptr: BF16 dlogits over the logits).
struct ClassifierFp8Grad {
  uint8_t* rows = nullptr;
  const Fp8Scale* scale = nullptr;
};

// The loss's terms of each row (llmc::PredictionWeights, Recipe::prefix_weight): row r, at position
// t = r % row_length of its sequence, against targets[r + k] weighted weights[k] for k < predict and
// t + k < row_length, then against prefix[targets[r]] weighted prefix_weight where that is not -1
// (prefix: the token_prefix_table on the GPU, or none). The default: the row's target, weight 1.
constexpr int kClassifierMaxTerms = llmc::kMaxPredictedTokens + 1;
struct ClassifierTerms {
  int row_length = 1;
  int predict = 1;
  float weights[llmc::kMaxPredictedTokens] = {1.0f, 0.0f, 0.0f};
  const int* prefix = nullptr;
  float prefix_weight = 0.0f;
};

// A row's terms in order (the next tokens', then the prefix's): each one's column and weight, and
// for the first term of each column the weights of all its terms (0 for a repeat of a column);
// total: the sum of the weights, the softmax's factor in the gradient.
struct RowTerms {
  int count = 0;
  int column[kClassifierMaxTerms];
  float weight[kClassifierMaxTerms], column_weight[kClassifierMaxTerms];
  float total = 0.0f;
};

__device__ __forceinline__ RowTerms row_terms(const int* targets, size_t row, const ClassifierTerms& terms) {
  RowTerms r;
  const int position = (int)(row % terms.row_length);
  for (int k = 0; k < terms.predict && position + k < terms.row_length; k++) {
    r.column[r.count] = targets[row + k];
    r.weight[r.count++] = terms.weights[k];
  }
  const int prefix = terms.prefix ? terms.prefix[targets[row]] : -1;
  if (prefix >= 0) {
    r.column[r.count] = prefix;
    r.weight[r.count++] = terms.prefix_weight;
  }
#pragma unroll
  for (int j = 0; j < kClassifierMaxTerms; j++) {
    if (j >= r.count) break;
    r.total += r.weight[j];
    bool repeat = false;
    for (int i = 0; i < j; i++) repeat = repeat || r.column[i] == r.column[j];
    r.column_weight[j] = 0.0f;
    for (int i = j; i < r.count && !repeat; i++) r.column_weight[j] += r.column[i] == r.column[j] ? r.weight[i] : 0.0f;
  }
  return r;
}

// The row's loss from its log-sum-exp and its terms' capped logits y[j].
__device__ __forceinline__ float row_terms_loss(const RowTerms& r, float lse, const float* y) {
  float loss = 0.0f;
  for (int j = 0; j < r.count; j++) loss += r.weight[j] * (lse - y[j]);
  return loss;
}

// A piece of dlogits d (columns col...) stored over the logits x, or cast into row8 (the row's
// FP8 bytes) under the factor s8. d is finite or NaN (|dlogit| <= dloss * max dy/dz): the cast
// skips the Inf check.
__device__ __forceinline__ void store_dlogits(floatX* x, uint8_t* row8, float s8, int col, const x128& d) {
  if (row8) {
    *reinterpret_cast<Fp8Piece*>(row8 + col) = fp8_piece<Fp8Format::kE5M2, true>(d, s8);
  } else {
    store128(x + col, d);
  }
}
constexpr float kLog2e = 1.4426950408889634f;

// Merges running softmax statistics (max m, sum of exp(x - m)) across a warp in a fixed tree.
__device__ __forceinline__ void warp_reduce_max_sum(float& m, float& s) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float om = __shfl_xor_sync(0xffffffff, m, offset);
    const float os = __shfl_xor_sync(0xffffffff, s, offset);
    const float new_m = fmaxf(m, om);
    s = s * expf(m - new_m) + os * expf(om - new_m);
    m = new_m;
  }
}

// Folds the 8 (or 4) logits of one 16-byte piece into a thread's running (max m, sum s).
__device__ __forceinline__ void softmax_accumulate_piece(float& m, float& s, const float f[x128::size]) {
  float piece_max = f[0];
#pragma unroll
  for (int k = 1; k < x128::size; k++) piece_max = fmaxf(piece_max, f[k]);
  if (piece_max > m) {
    s *= exp2_ftz((m - piece_max) * kLog2e);
    m = piece_max;
  }
  const float m_log2 = m * kLog2e;
#pragma unroll
  for (int k = 0; k < x128::size; k++) s += exp2_ftz(fmaf(f[k], kLog2e, -m_log2));
}

// A cap's constants as the kernels read them (llmc::LogitCap's, inv_scale = 1 / scale).
struct ClassifierCap {
  float cap = 0.0f, inv_scale = 0.0f, shift = 0.0f;
  bool bf16_sigmoid = false;
};

// The capped logit y the softmax sees; *slope = dy/dz (capped kinds only).
constexpr float kSigmoidCapMaxExponentLog2 = 126.0f;  // 2^126 = 8.5e37 < FLT_MAX
constexpr float kRationalCapMaxLogit = 1e18f;    // (1e18)^2 < FLT_MAX
template <llmc::LogitCap::Kind CAP>
__device__ __forceinline__ float classifier_logit(float z, const ClassifierCap& c, float* slope = nullptr) {
  const float cap = c.cap;
  if (CAP == llmc::LogitCap::kRational) {
    // z clamped where z^2 would overflow (|z| > 1.8e19): y is cap there to FP32's precision.
    z = fminf(fmaxf(z, -kRationalCapMaxLogit), kRationalCapMaxLogit);
    const float cap_rsqrt = cap * rsqrtf(fmaf(z, z, cap * cap));
    if (slope) *slope = cap_rsqrt * cap_rsqrt * cap_rsqrt;
    return z * cap_rsqrt;
  }
  if (CAP == llmc::LogitCap::kSigmoid) {
    // e = exp(-(z + shift) / s), clamped where it would overflow (z + shift < -87 s): inf * 0
    // would make the slope NaN, where the sigmoid and its slope are below 1e-38 and round to the
    // same y. Both instructions are within 2 ulp: y within about 3e-6 of exact at the cap of 30.
    // A shift of 0 adds nothing: the bits of the unshifted cap.
    // The BF16 sigmoid (record #89's) rounds s, then takes 1 - s, exact for a BF16 s in [0, 1].
    const float e = exp2_ftz(fminf((z + c.shift) * (-c.inv_scale * kLog2e), kSigmoidCapMaxExponentLog2));
    const float s = rcp_ftz(1.0f + e);
    if (c.bf16_sigmoid) {
      const float r = __bfloat162float(__float2bfloat16_rn(s));
      if (slope) *slope = cap * c.inv_scale * r * (1.0f - r);
      return cap * r;
    }
    if (slope) *slope = cap * c.inv_scale * s * (e * s);
    return cap * s;
  }
  return z;
}

// Dynamic shared memory: one row, Vp elements.
template <llmc::LogitCap::Kind CAP>
__global__ void __launch_bounds__(kClassifierThreads, 2) fused_classifier_kernel(
    floatX* logits, float* losses, const int* targets, int V, int Vp, float dloss, ClassifierCap cap,
    ClassifierFp8Grad grad8, ClassifierTerms terms) {
  extern __shared__ __align__(16) unsigned char classifier_shared[];
  floatX* row_s = reinterpret_cast<floatX*>(classifier_shared);
  __shared__ float shared_max[WARP_SIZE], shared_sum[WARP_SIZE];
  const size_t row = blockIdx.x;
  floatX* x = logits + row * Vp;
  constexpr int kStep = kClassifierThreads * x128::size;
  for (int col = threadIdx.x * x128::size; col < Vp; col += kStep) copy_async_16(row_s + col, x + col, true);
  copy_async_commit();
  const RowTerms targets_of_row = row_terms(targets, row, terms);
  copy_async_wait<0>();
  __syncthreads();
  // Whole pieces below V first; then at most one piece straddles V and needs per-column checks.
  float m = -FLT_MAX, s = 0.0f;
  int col = threadIdx.x * x128::size;
  for (; col + x128::size <= V; col += kStep) {
    const x128 v = load128(row_s + col);
    float f[x128::size];
#pragma unroll
    for (int k = 0; k < x128::size; k++) f[k] = classifier_logit<CAP>((float)v[k], cap);
    softmax_accumulate_piece(m, s, f);
  }
  if (col < V) {
    const x128 v = load128(row_s + col);
    float f[x128::size];
    for (int k = 0; k < x128::size; k++) {
      f[k] = col + k < V ? classifier_logit<CAP>((float)v[k], cap) : -FLT_MAX;  // exp -> 0
    }
    softmax_accumulate_piece(m, s, f);
  }
  // Combine the per-thread (max, sum) pairs: a warp tree, then warp 0 over the warps.
  const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
  warp_reduce_max_sum(m, s);
  if (lane == 0) {
    shared_max[warp] = m;
    shared_sum[warp] = s;
  }
  __syncthreads();
  constexpr int kWarps = kClassifierThreads / WARP_SIZE;
  m = lane < kWarps ? shared_max[lane] : -FLT_MAX;
  s = lane < kWarps ? shared_sum[lane] : 0.0f;
  warp_reduce_max_sum(m, s);
  if (threadIdx.x == 0) {
    float y[kClassifierMaxTerms];
    for (int j = 0; j < targets_of_row.count; j++) y[j] = classifier_logit<CAP>((float)row_s[targets_of_row.column[j]], cap);
    losses[row] = row_terms_loss(targets_of_row, logf(s) + m, y);
  }
  if (dloss == 0.0f) return;
  // dlogits = S softmax * dloss, and (S softmax - W) * dloss in a target's column; times dy/dz when
  // capped.
  const float row_max_log2 = m * kLog2e, scale = dloss * targets_of_row.total / s;
  uint8_t* row8 = grad8.rows ? grad8.rows + row * Vp : nullptr;
  const float s8 = grad8.rows ? grad8.scale->scale : 0.0f;
  constexpr bool kCapped = CAP != llmc::LogitCap::kNone;
  auto dlogit_off_target = [&](float z) {
    float slope = 1.0f;
    const float y = classifier_logit<CAP>(z, cap, &slope);
    const float g = exp2_ftz(fmaf(y, kLog2e, -row_max_log2)) * scale;
    return kCapped ? g * slope : g;
  };
  for (col = threadIdx.x * x128::size; col < Vp; col += kStep) {
    const x128 v = load128(row_s + col);
    x128 d;
    if (col + x128::size <= V) {
#pragma unroll
      for (int k = 0; k < x128::size; k++) d[k] = (floatX)dlogit_off_target((float)v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < x128::size; k++) {
        d[k] = (floatX)(col + k < V ? dlogit_off_target((float)v[k]) : 0.0f);
      }
    }
    for (int j = 0; j < targets_of_row.count; j++) {
      const int target = targets_of_row.column[j];
      if (target < col || target >= col + x128::size || targets_of_row.column_weight[j] == 0.0f) continue;
      float slope = 1.0f;
      const float y = classifier_logit<CAP>((float)row_s[target], cap, &slope);
      const float p = exp2_ftz(fmaf(y, kLog2e, -row_max_log2)) / s;
      const float g = targets_of_row.total * p - targets_of_row.column_weight[j];
      d[target - col] = (floatX)(kCapped ? g * dloss * slope : g * dloss);
    }
    store_dlogits(x, row8, s8, col, d);
  }
}

// The capped logit's bound (y <= bound) and, in log2 units, the range of y - bound: the rational
// cap's y is in (-cap, cap), the sigmoid's in (0, cap).
constexpr float kCappedShiftMaxLog2 = 120.0f;  // exp(y - bound) >= 2^-120: no flush to zero
inline float capped_shift_range_log2(const llmc::LogitCap& cap) {
  return (cap.kind == llmc::LogitCap::kRational ? 2.0f : 1.0f) * cap.cap * kLog2e;
}

// The row's sum is defined by 2 x 512 threads: the row's pieces (x128) in two halves, thread t of a
// half summing its pieces t, t + 512, ... in order, the half's threads added in a fixed tree (a
// warp's, then over its 16 warps), then the halves. Four blocks of 256 threads, a cluster, take a
// row: block q the threads [256 (q % 2), 256 (q % 2) + 256) of half q / 2, whose pieces it keeps
// (kCappedClassifierBlocks: with 2B blocks, B to a half, each 512 / B threads of it).
constexpr int kCappedClassifierHalfThreads = 512, kCappedClassifierBlocks = 4;
constexpr int kCappedClassifierBlocksPerHalf = kCappedClassifierBlocks / 2;
constexpr int kCappedClassifierThreads = kCappedClassifierHalfThreads / kCappedClassifierBlocksPerHalf;
constexpr int kCappedClassifierPiecesInFlight = 4;

// The columns of a row's half: pieces [first, end) of the row's Vp / x128::size.
__device__ __forceinline__ void capped_classifier_half(int pieces, int half, int& first, int& end) {
  const int front = (pieces + 1) / 2;
  first = half == 0 ? 0 : front;
  end = half == 0 ? front : pieces;
}

// Pieces a block keeps at most: of a half's pieces, the first block of the half takes the first
// 256 of every 512 (and so at least as many as the second).
inline int capped_classifier_block_pieces(int Vp) {
  const int half = ceil_div(Vp / x128::size, 2);
  return half / kCappedClassifierHalfThreads * kCappedClassifierThreads +
         std::min(half % kCappedClassifierHalfThreads, kCappedClassifierThreads);
}

// One piece's terms: each logit's exp(y - bound) added to the thread's sum s, and exp(y - bound) *
// dy/dz into g. kWhole: every column of the piece is below V; otherwise the columns at or past V
// (the padding, NaN allowed there) add nothing and get 0.
template <llmc::LogitCap::Kind CAP, bool kWhole>
__device__ __forceinline__ void capped_piece_terms(const x128& v, int col, int V, const ClassifierCap& cap,
                                                   float bound_log2, float& s, float g[x128::size]) {
#pragma unroll
  for (int k = 0; k < x128::size; k++) {
    float slope;
    const float y = classifier_logit<CAP>((float)v[k], cap, &slope);
    const float p = exp2_ftz(fmaf(y, kLog2e, -bound_log2));
    const bool real = kWhole || col + k < V;
    s += real ? p : 0.0f;
    g[k] = real ? p * slope : 0.0f;
  }
}

// A cluster of four blocks per row (so four rows' blocks share an SM, in different phases: loads
// and exponentials, the cluster's sum, stores). Dynamic shared memory: exp(y - cap) * dy/dz of the
// block's pieces, FP32 (training only). Every block stores its warps' sums into every block's
// shared memory, and each warp adds the 32 of them in the same order. A block writes into another's
// shared memory only after the cluster barrier's first phase, which each thread arrives at on
// entry: the other block has started by then. Hopper (compute capability 9.0+).
template <llmc::LogitCap::Kind CAP>
__global__ void __launch_bounds__(kCappedClassifierThreads, kCappedClassifierBlocks) capped_classifier_kernel(
    floatX* logits, float* losses, const int* targets, int V, int Vp, float dloss, ClassifierCap cap,
    ClassifierFp8Grad grad8, ClassifierTerms terms) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char classifier_shared[];
  float* grad_s = reinterpret_cast<float*>(classifier_shared);
  constexpr int kHalfWarps = kCappedClassifierHalfThreads / WARP_SIZE;
  constexpr int kSize = x128::size, kHalf = kCappedClassifierHalfThreads;
  constexpr int kStride = kHalf * kCappedClassifierPiecesInFlight;
  __shared__ float warp_sums[2 * kHalfWarps], target_logit[kClassifierMaxTerms], target_slope[kClassifierMaxTerms];
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.barrier_arrive();
  const int rank = (int)cluster.block_rank(), half = rank / kCappedClassifierBlocksPerHalf;
  // The thread of the half it stands for.
  const int t = (rank % kCappedClassifierBlocksPerHalf) * kCappedClassifierThreads + threadIdx.x;
  const size_t row = blockIdx.x / kCappedClassifierBlocks;
  floatX* x = logits + row * Vp;
  const RowTerms targets_of_row = row_terms(targets, row, terms);
  const bool training = dloss != 0.0f;
  if (threadIdx.x < targets_of_row.count) {
    const int j = threadIdx.x;
    target_logit[j] = classifier_logit<CAP>((float)x[targets_of_row.column[j]], cap, &target_slope[j]);
  }
  const float bound_log2 = cap.cap * kLog2e;
  int first_piece, end_piece;
  capped_classifier_half(Vp / kSize, half, first_piece, end_piece);
  // The block's pieces first_piece + t + kHalf i are kept in slot threadIdx.x + kThreads i.
  float s = 0.0f;
  for (int first = first_piece + t, slot = threadIdx.x; first < end_piece;
       first += kStride, slot += kCappedClassifierThreads * kCappedClassifierPiecesInFlight) {
    x128 v[kCappedClassifierPiecesInFlight];
#pragma unroll
    for (int u = 0; u < kCappedClassifierPiecesInFlight; u++) {
      const int piece = first + u * kHalf;
      if (piece < end_piece) v[u] = load128cs(x + (size_t)piece * kSize);
    }
#pragma unroll
    for (int u = 0; u < kCappedClassifierPiecesInFlight; u++) {
      const int piece = first + u * kHalf, col = piece * kSize;
      if (piece >= end_piece) break;
      float g[kSize];
      if (col + kSize <= V) {
        capped_piece_terms<CAP, true>(v[u], col, V, cap, bound_log2, s, g);
      } else {
        capped_piece_terms<CAP, false>(v[u], col, V, cap, bound_log2, s, g);
      }
      if (training) {
        float* kept = grad_s + (size_t)(slot + u * kCappedClassifierThreads) * kSize;
#pragma unroll
        for (int k = 0; k < kSize; k += f128::size) {
          f128 out;
#pragma unroll
          for (int j = 0; j < f128::size; j++) out[j] = g[k + j];
          store128(kept + k, out);
        }
      }
    }
  }
  // The warps' sums into every block; each warp then adds each half's 16 in a fixed tree, and the
  // halves.
  const int lane = threadIdx.x % WARP_SIZE;
  s = warp_reduce_sum(s);
  cluster.barrier_wait();
  if (lane < kCappedClassifierBlocks) cluster.map_shared_rank(warp_sums, lane)[t / WARP_SIZE + half * kHalfWarps] = s;
  cluster.sync();
  const float half0 = warp_reduce_sum(lane < kHalfWarps ? warp_sums[lane] : 0.0f);
  const float half1 = warp_reduce_sum(lane < kHalfWarps ? warp_sums[kHalfWarps + lane] : 0.0f);
  const float row_sum = half0 + half1;
  if (rank == 0 && threadIdx.x == 0) losses[row] = row_terms_loss(targets_of_row, logf(row_sum) + cap.cap, target_logit);
  if (!training) return;
  // dlogits = g * S * dloss / sum; a target's column gets (S softmax - W) * dloss * dy/dz. Each
  // thread reads back the columns it wrote.
  const float scale = dloss * targets_of_row.total / row_sum;
  uint8_t* row8 = grad8.rows ? grad8.rows + row * Vp : nullptr;
  const float s8 = grad8.rows ? grad8.scale->scale : 0.0f;
  for (int piece = first_piece + t, slot = threadIdx.x; piece < end_piece;
       piece += kHalf, slot += kCappedClassifierThreads) {
    const int col = piece * kSize;
    float dz[kSize];
#pragma unroll
    for (int k = 0; k < kSize; k += f128::size) {
      const f128 g = load128(grad_s + (size_t)slot * kSize + k);
#pragma unroll
      for (int j = 0; j < f128::size; j++) dz[k + j] = g[j] * scale;
    }
    // A few pieces of the row hold targets: the test per column only there.
    for (int j = 0; j < targets_of_row.count; j++) {
      const int target = targets_of_row.column[j];
      if ((unsigned)(target - col) >= (unsigned)kSize || targets_of_row.column_weight[j] == 0.0f) continue;
#pragma unroll
      for (int k = 0; k < kSize; k++) {
        if (col + k == target) dz[k] = dz[k] - targets_of_row.column_weight[j] * dloss * target_slope[j];
      }
    }
    store_dlogits(x, row8, s8, col, round_x128(dz));
  }
#endif
}

// The GPU's limits the classifiers' launches read, queried once.
struct ClassifierLimits {
  int max_shared = 0;     // dynamic shared memory a block may opt into
  bool clusters = false;  // compute capability 9.0+
};
const ClassifierLimits& classifier_limits() {
  static const ClassifierLimits limits = [] {
    ClassifierLimits l;
    int device = 0, major = 0;
    cudaCheck(cudaGetDevice(&device));
    l.max_shared = shared_memory_optin();
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    l.clusters = major >= 9;
    return l;
  }();
  return limits;
}

// Launches capped_classifier_kernel where the GPU has clusters and shared memory for a quarter row;
// false where it does not.
bool capped_classifier_launch(floatX* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                              const llmc::LogitCap& cap, const ClassifierCap& constants,
                              const ClassifierFp8Grad& grad8, const ClassifierTerms& terms,
                              cudaStream_t stream) {
  const ClassifierLimits& limits = classifier_limits();
  if (!limits.clusters) return false;
  const auto kernel = cap.kind == llmc::LogitCap::kRational ? capped_classifier_kernel<llmc::LogitCap::kRational>
                                                            : capped_classifier_kernel<llmc::LogitCap::kSigmoid>;
  cudaFuncAttributes attributes;
  cudaCheck(cudaFuncGetAttributes(&attributes, kernel));
  const size_t shared = (size_t)capped_classifier_block_pieces(Vp) * x128::size * sizeof(float);
  if (shared + attributes.sharedSizeBytes > (size_t)limits.max_shared) return false;
  cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kCappedClassifierBlocks * N);
  config.blockDim = dim3(kCappedClassifierThreads);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCappedClassifierBlocks;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  cudaCheck(cudaLaunchKernelEx(&config, kernel, logits, losses, targets, V, Vp, dloss, constants, grad8,
                               terms));
  return true;
}

// dloss = 0 computes the losses only (validation) and leaves the logits intact, with the cap's
// evaluation() (the sigmoid in FP32 where training rounds it to BF16). The softmax takes
// the first V of the Vp columns (V = Vp: all of them, as the speedrun's loss does). Capped logits
// take capped_classifier_kernel on GPUs with clusters where a quarter of a row fits in a block's
// shared memory (Hopper's 227 KiB: Vp up to about 230,000), unless recompute is set (the tests run
// both kernels).
// grad8.rows given (training, BF16 builds): the dlogits are cast into them, not written over the
// logits. Returns the kernel it ran.
enum class ClassifierKernel { kRecomputing, kKeeping };
ClassifierKernel fused_classifier(floatX* logits, float* losses, const int* targets, int N, int V, int Vp,
                                  float dloss, cudaStream_t stream, const llmc::LogitCap& head_cap = {},
                                  bool recompute = false, const ClassifierFp8Grad& grad8 = {},
                                  const ClassifierTerms& terms = {}) {
  REQUIRE(Vp % x128::size == 0 && V <= Vp, "fused_classifier: Vp=%d must be a multiple of %d, and V=%d at most Vp",
          Vp, x128::size, V);
  REQUIRE(!grad8.rows || (dloss != 0.0f && grad8.scale && sizeof(floatX) == 2 && (uintptr_t)grad8.rows % 16 == 0),
          "fused_classifier: an FP8 gradient needs a training pass (dloss != 0), its scale, the BF16 build and "
          "16-byte aligned rows");
  const llmc::LogitCap cap = dloss != 0.0f ? head_cap : head_cap.evaluation();
  const bool capped = cap.kind != llmc::LogitCap::kNone;
  REQUIRE(!capped || (std::isfinite(cap.cap) && cap.cap > 0.0f && capped_shift_range_log2(cap) <= kCappedShiftMaxLog2),
          "fused_classifier: a cap of %g: it must be a positive number of at most %g (%s)", cap.cap,
          kCappedShiftMaxLog2 / kLog2e / (cap.kind == llmc::LogitCap::kRational ? 2.0f : 1.0f), cap.describe().c_str());
  REQUIRE(cap.kind != llmc::LogitCap::kSigmoid || (std::isfinite(cap.scale) && cap.scale > 0.0f && std::isfinite(cap.shift)),
          "fused_classifier: a sigmoid cap's scale of %g and shift of %g: the scale must be a positive finite number, "
          "the shift finite", cap.scale, cap.shift);
  REQUIRE(terms.row_length > 0 && N % terms.row_length == 0 && terms.predict >= 1 &&
              terms.predict <= llmc::kMaxPredictedTokens && (!terms.prefix || terms.prefix_weight > 0.0f),
          "fused_classifier: %d rows in sequences of %d, %d next-token weights (1 to %d), a prefix table with a "
          "weight of %g: the rows must be whole sequences, a prefix table needs a positive weight", N,
          terms.row_length, terms.predict, llmc::kMaxPredictedTokens, terms.prefix_weight);
  const int max_shared = classifier_limits().max_shared;
  const bool sigmoid = cap.kind == llmc::LogitCap::kSigmoid;
  const ClassifierCap constants = {cap.cap, sigmoid ? 1.0f / cap.scale : 0.0f, sigmoid ? cap.shift : 0.0f,
                                   sigmoid && cap.bf16_sigmoid};
  if (capped && !recompute &&
      capped_classifier_launch(logits, losses, targets, N, V, Vp, dloss, cap, constants, grad8, terms, stream)) {
    return ClassifierKernel::kKeeping;
  }
  const size_t shared = (size_t)Vp * sizeof(floatX);
  REQUIRE(shared <= (size_t)max_shared,
          "fused_classifier: a row of the padded vocabulary (%d) needs %zu bytes of shared memory, "
          "above this GPU's %d", Vp, shared, max_shared);
  const auto kernel = cap.kind == llmc::LogitCap::kRational  ? fused_classifier_kernel<llmc::LogitCap::kRational>
                      : cap.kind == llmc::LogitCap::kSigmoid ? fused_classifier_kernel<llmc::LogitCap::kSigmoid>
                                                             : fused_classifier_kernel<llmc::LogitCap::kNone>;
  cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  kernel<<<N, kClassifierThreads, shared, stream>>>(logits, losses, targets, V, Vp, dloss, constants, grad8,
                                                    terms);
  cudaCheckLaunch();
  return ClassifierKernel::kRecomputing;
}

// ============================================================================
// 9. Norms and optimizers
// ============================================================================
// The global gradient norm is a sum of squares over every gradient: a fixed grid of kNormBlocks
// blocks, each thread a fixed strided subset, fixed block trees, then one block adds the
// kNormBlocks partials in a fixed tree. AdamW updates every tensor in one launch with FP32 m, v
// and master weights and writes the storage-type parameters with stochastic rounding. Floors: norm reads
// every gradient once; AdamW reads g, m, v, master and writes m, v, master, p (28 bytes/param in
// BF16 with master weights).

constexpr int kNormBlocks = 1024;
constexpr int kNormThreads = 512;

// Each thread adds to sum the squares of 16-byte pieces of x (while x is aligned to them) at a
// stride of the grid, then of the elements of the tail: one element at a time, the loads kept too
// few bytes in flight.
__device__ void add_squares(float& sum, const floatX* x, size_t n) {
  const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  const size_t pieces = (uintptr_t)x % sizeof(x128) == 0 ? n / x128::size : 0;
  for (size_t i = thread; i < pieces; i += stride) {
    const x128 v = load128cs(x + i * x128::size);
    for (int k = 0; k < x128::size; k++) sum += (float)v[k] * (float)v[k];
  }
  for (size_t i = pieces * x128::size + thread; i < n; i += stride) {
    const float v = (float)x[i];
    sum += v * v;
  }
}

__global__ void norm_squared_partials_kernel(float* partials, const floatX* x, size_t n) {
  __shared__ float shared[WARP_SIZE];
  float sum = 0.0f;
  add_squares(sum, x, n);
  sum = block_reduce_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// The same over the runs of x given as (begin, count) pairs, in their order.
__global__ void norm_squared_runs_partials_kernel(float* partials, const floatX* x, const size_t* runs, int count) {
  __shared__ float shared[WARP_SIZE];
  float sum = 0.0f;
  for (int r = 0; r < count; r++) add_squares(sum, x + runs[2 * r], runs[2 * r + 1]);
  sum = block_reduce_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void norm_squared_finalize_kernel(float* out, const float* partials, int n) {
  __shared__ float shared[WARP_SIZE];
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += partials[i];
  sum = block_reduce_sum(sum, shared);
  if (threadIdx.x == 0) *out = sum;
}

// out (device, one float) = sum of squares of x. partials: kNormBlocks floats.
void global_norm_squared(float* out, float* partials, const floatX* x, size_t n,
                         cudaStream_t stream) {
  norm_squared_partials_kernel<<<kNormBlocks, kNormThreads, 0, stream>>>(partials, x, n);
  cudaCheckLaunch();
  norm_squared_finalize_kernel<<<1, kNormBlocks, 0, stream>>>(out, partials, kNormBlocks);
  cudaCheckLaunch();
}

// out (device, one float) = sum of squares of the `count` runs of x (runs: device (begin, count)
// pairs). partials: kNormBlocks floats.
void runs_norm_squared(float* out, float* partials, const floatX* x, const size_t* runs, int count,
                       cudaStream_t stream) {
  norm_squared_runs_partials_kernel<<<kNormBlocks, kNormThreads, 0, stream>>>(partials, x, runs, count);
  cudaCheckLaunch();
  norm_squared_finalize_kernel<<<1, kNormBlocks, 0, stream>>>(out, partials, kNormBlocks);
  cudaCheckLaunch();
}

// One slice's AdamW hyperparameters: its tensor's row of llmc::OptimizerTable at the step.
struct AdamWRates {
  float lr, beta1, beta2, eps, weight_decay;
  llmc::WeightDecayKind decay = llmc::WeightDecayKind::kDecoupled;
};

// What every slice of one update shares.
struct AdamWParams {
  float grad_scale;  // clipping factor applied to every gradient
  int step;          // 1-based, for bias correction
};

// The optimizer state of a process's shard [shard_offset, shard_offset + shard_size) of the
// parameter buffer (the whole buffer without ZeRO), by owner: AdamW's two moments cover the tensors
// AdamW updates and Muon's momentum the matrices Muon updates, each one compact array of the
// tensors' parts in the shard, in tensor order; the FP32 master weights are one flat array over
// the shard. A part starts in its owner's array at the residue modulo kStateAlign that it has in
// the shard, so that every 16-byte access of the kernels is aligned where it was when the moments
// were flat arrays over the shard, and takes the same path: the same bits.
constexpr size_t kStateAlign = 16;
enum class StateOwner : uint8_t { kNone, kAdamW, kMuon };  // kNone: no element in the shard

struct StateLayout {
  size_t shard_offset = 0, shard_size = 0;
  StateOwner owner[llmc::kNumParamTensors] = {};
  size_t begin[llmc::kNumParamTensors] = {};  // the part's first element in the parameter buffer
  size_t size[llmc::kNumParamTensors] = {};   // its elements
  size_t state[llmc::kNumParamTensors] = {};  // its first element's position in its owner's array
  size_t adamw_size = 0, muon_size = 0;       // the owners' array lengths
  // NorMuon's second moments (-mn 1): muon_size, laid out as Muon's momentum, a matrix's n values
  // where its first n elements' momentum lies; 0 without.
  size_t second_moment_size = 0;
  int count = 0;  // tensors
};

// Tensor i holds sizes[i] elements from offsets[i] of the parameter buffer; muon[i]: Muon updates it.
StateLayout state_layout(int count, const size_t* offsets, const size_t* sizes, const bool* muon,
                         size_t shard_offset, size_t shard_size) {
  REQUIRE(count <= llmc::kNumParamTensors, "state_layout: %d tensors, at most %d", count,
          llmc::kNumParamTensors);
  StateLayout l;
  l.shard_offset = shard_offset;
  l.shard_size = shard_size;
  l.count = count;
  for (int i = 0; i < count; i++) {
    const size_t begin = std::max(offsets[i], shard_offset);
    const size_t end = std::min(offsets[i] + sizes[i], shard_offset + shard_size);
    if (begin >= end) continue;
    l.owner[i] = muon[i] ? StateOwner::kMuon : StateOwner::kAdamW;
    size_t& length = muon[i] ? l.muon_size : l.adamw_size;
    l.begin[i] = begin;
    l.size[i] = end - begin;
    l.state[i] = llmc::round_up(length, kStateAlign) + (begin - shard_offset) % kStateAlign;
    length = l.state[i] + l.size[i];
  }
  return l;
}

// One set of the optimizer state's arrays (StateLayout). A checkpoint's snapshot keeps a second
// set (section 12).
struct OptimizerArrays {
  float* adam_m = nullptr;    // AdamW's first moments, adamw_size
  float* adam_v = nullptr;    // AdamW's second moments, adamw_size
  float* momentum = nullptr;  // Muon's, muon_size
  float* master = nullptr;    // FP32 master weights, shard_size; null without
  float* second_moments = nullptr;  // NorMuon's, second_moment_size; null without
};

size_t optimizer_arrays_bytes(const StateLayout& l, bool master) {
  return (2 * l.adamw_size + l.muon_size + l.second_moment_size + (master ? l.shard_size : 0)) * sizeof(float);
}

// A zeroed set of arrays; with `spare`, none (false) where the GPU has not their bytes and
// `spare` beyond free, else out of memory is an error.
bool optimizer_arrays_alloc(OptimizerArrays* a, const StateLayout& l, bool master, const size_t* spare = nullptr) {
  *a = OptimizerArrays();
  const std::pair<float**, size_t> arrays[] = {{&a->adam_m, l.adamw_size},
                                               {&a->adam_v, l.adamw_size},
                                               {&a->momentum, l.muon_size},
                                               {&a->master, master ? l.shard_size : 0},
                                               {&a->second_moments, l.second_moment_size}};
  const char* names[] = {"AdamW's first moments", "AdamW's second moments", "Muon's momentum",
                         "the FP32 master weights", "NorMuon's second moments"};
  for (int i = 0; i < 5; i++) {
    float*& p = *arrays[i].first;
    const size_t bytes = arrays[i].second * sizeof(float);
    if (bytes == 0) continue;
    p = spare ? (float*)device_try_alloc(bytes, *spare) : device_alloc<float>(arrays[i].second, names[i]);
    if (!p) {
      for (float* q : {a->adam_m, a->adam_v, a->momentum, a->master, a->second_moments}) device_free(q);
      *a = OptimizerArrays();
      return false;
    }
    cudaCheck(cudaMemset(p, 0, bytes));
  }
  return true;
}

inline bool has_arrays(const OptimizerArrays& a) {
  return a.adam_m || a.adam_v || a.momentum || a.master || a.second_moments;
}
inline bool same_arrays(const OptimizerArrays& a, const OptimizerArrays& b) {
  return a.adam_m == b.adam_m && a.adam_v == b.adam_v && a.momentum == b.momentum && a.master == b.master &&
         a.second_moments == b.second_moments;
}

void optimizer_arrays_free(OptimizerArrays& a) {
  for (float* p : {a.adam_m, a.adam_v, a.momentum, a.master, a.second_moments}) device_free(p);
  a = OptimizerArrays();
}

// The tensors (or, with ZeRO, the parts of them in this rank's shard) that one AdamW launch
// updates. Each slice has its own rates (learning rate, betas, eps, weight decay; adamw_update
// adds their bias corrections) and rounding seed; index_offset is
// the position of the slice's first element in its tensor, so that the rounding bits do not
// depend on where the shards are cut; state is the position of that element in the moments'
// arrays (StateLayout). The launch gives each slice whole blocks, first_block[i] onwards.
constexpr int kMaxAdamWSlices = llmc::kNumParamTensors;
constexpr int kAdamWThreads = 256;
constexpr int kAdamWBlockElements = kAdamWThreads * x128::size;

struct AdamWSlices {
  int count = 0;
  int first_block[kMaxAdamWSlices + 1] = {};
  size_t begin[kMaxAdamWSlices] = {};  // first element, in params and grads
  size_t size[kMaxAdamWSlices] = {};
  size_t index_offset[kMaxAdamWSlices] = {};
  size_t state[kMaxAdamWSlices] = {};
  AdamWRates rates[kMaxAdamWSlices] = {};
  float beta1_correction[kMaxAdamWSlices] = {};  // 1 - beta1^step, set by adamw_update
  float beta2_correction[kMaxAdamWSlices] = {};
  float cautious_rate[kMaxAdamWSlices] = {};  // lr^2 wd, the cautious decay's, set by adamw_update
  uint32_t seed[kMaxAdamWSlices] = {};
  llmc::AdamBf16 bf16[kMaxAdamWSlices] = {};  // what of the step is rounded to nearest BF16 (BF16 builds)
  // The FP8 head's weight: its copy by fp8_head_weight_copy with this factor (0: another tensor).
  float fp8_head_to_fp8[kMaxAdamWSlices] = {};

  void add(size_t slice_begin, size_t slice_size, size_t slice_index_offset, size_t slice_state,
           const AdamWRates& slice_rates, uint32_t slice_seed, llmc::AdamBf16 slice_bf16 = llmc::AdamBf16::kNone,
           float slice_fp8_head_to_fp8 = 0.0f) {
    REQUIRE(count < kMaxAdamWSlices, "AdamW: more than %d tensors in one update", kMaxAdamWSlices);
    begin[count] = slice_begin;
    size[count] = slice_size;
    index_offset[count] = slice_index_offset;
    state[count] = slice_state;
    rates[count] = slice_rates;
    seed[count] = slice_seed;
    bf16[count] = slice_bf16;
    fp8_head_to_fp8[count] = slice_fp8_head_to_fp8;
    first_block[count + 1] = first_block[count] + (int)ceil_div(slice_size, (size_t)kAdamWBlockElements);
    count++;
  }
};

__device__ __forceinline__ float bf16_nearest(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// AdamW's cautious decay (llmc::WeightDecayKind): old - (u + rate old [u old > 0]), rate = lr^2 wd,
// in the order of record #89's reference (update.addcmul_(p, mask, value=rate); p - update), each
// operation rounded on its own as its eager steps are (no fused multiply-add), and the product
// u old, not the signs, deciding, as there.
__device__ __forceinline__ float adamw_cautious_decay(float old, float u, float rate) {
  const float mask = __fmul_rn(u, old) > 0.0f ? 1.0f : 0.0f;
  return __fsub_rn(old, __fadd_rn(u, __fmul_rn(__fmul_rn(rate, old), mask)));
}

// The decay decoupled, old - lr (direction + wd old), or cautious with u = lr direction
// (adamw_cautious_decay). bf16: the update from the new moments in FP32, then the weight (kWeight) or
// the moments and the weight (kAll) rounded to nearest BF16, as the speedrun's references compute
// their BF16 tensors' steps (in FP32 from the loads, each BF16 result stored once).
__device__ __forceinline__ float adamw_element(float g, float& m, float& v, float old, const AdamWRates& r,
                                               float beta1_correction, float beta2_correction, float cautious_rate,
                                               llmc::AdamBf16 bf16) {
  m = r.beta1 * m + (1.0f - r.beta1) * g;
  v = r.beta2 * v + (1.0f - r.beta2) * g * g;
  const float mhat = m / beta1_correction, vhat = v / beta2_correction;
  float updated;
  if (r.decay == llmc::WeightDecayKind::kCautious) {
    updated = adamw_cautious_decay(old, r.lr * (mhat / (sqrtf(vhat) + r.eps)), cautious_rate);
  } else {
    updated = old - r.lr * (mhat / (sqrtf(vhat) + r.eps) + r.weight_decay * old);
  }
  if (bf16 == llmc::AdamBf16::kNone) return updated;
  if (bf16 == llmc::AdamBf16::kAll) {
    m = bf16_nearest(m);
    v = bf16_nearest(v);
  }
  return bf16_nearest(updated);
}

// Thread t of a slice's block b updates its x128::size elements at (b * kAdamWThreads + t) *
// x128::size: 16-byte loads and stores where the slice's alignment allows, one element at a time
// otherwise. The moments m and v are indexed from the slice's state position, the master weights
// from state_offset, the shard's first element. master may be null (FP32 builds, or BF16 without
// master weights: the parameter is the master). Every load is issued before any store, and the
// arrays are declared not to overlap: otherwise each 16-byte piece's loads wait for the previous
// piece's stores, and the kernel ran at less than half the bandwidth.
// kMoved: the new state goes to to_m, to_v, to_master, other arrays than the old state's (the
// step after a checkpoint, section 12); otherwise they are not touched and the update is in place.
template <bool kMoved>
__global__ void __launch_bounds__(kAdamWThreads) adamw_kernel(
    floatX* __restrict__ params, float* __restrict__ master, const floatX* __restrict__ grads,
    float* __restrict__ m, float* __restrict__ v, float* __restrict__ to_master,
    float* __restrict__ to_m, float* __restrict__ to_v, size_t state_offset, AdamWSlices slices,
    float grad_scale) {
  float* const out_m = kMoved ? to_m : m;
  float* const out_v = kMoved ? to_v : v;
  float* const out_master = kMoved ? to_master : master;
  int s = 0;
  while (s + 1 < slices.count && slices.first_block[s + 1] <= (int)blockIdx.x) s++;
  const size_t local = ((size_t)(blockIdx.x - slices.first_block[s]) * kAdamWThreads + threadIdx.x) * x128::size;
  if (local >= slices.size[s]) return;
  const size_t p = slices.begin[s] + local, st = p - state_offset, sm = slices.state[s] + local;
  const AdamWRates rates = slices.rates[s];
  const float beta1_correction = slices.beta1_correction[s], beta2_correction = slices.beta2_correction[s];
  const float cautious_rate = slices.cautious_rate[s];
  const uint32_t seed = slices.seed[s];
  const llmc::AdamBf16 bf16 = slices.bf16[s];
  const float fp8_head_to_fp8 = slices.fp8_head_to_fp8[s];
  const size_t index = slices.index_offset[s] + local;
  const bool vector = local + x128::size <= slices.size[s] && p % x128::size == 0 && st % f128::size == 0 &&
                      sm % f128::size == 0;
  if (!vector) {
    for (size_t i = 0; i < x128::size && local + i < slices.size[s]; i++) {
      float mi = m[sm + i], vi = v[sm + i];
      const float old = master ? master[st + i] : (float)params[p + i];
      const float updated = adamw_element((float)grads[p + i] * grad_scale, mi, vi, old, rates, beta1_correction,
                                          beta2_correction, cautious_rate, bf16);
      out_m[sm + i] = mi;
      out_v[sm + i] = vi;
      if (master) out_master[st + i] = updated;
      const floatX rounded = round_stochastic(updated, seed, index + i);
      params[p + i] = fp8_head_to_fp8 != 0.0f ? fp8_head_weight_copy(rounded, updated, fp8_head_to_fp8) : rounded;
    }
    return;
  }
  constexpr int kPieces = x128::size / f128::size;
  const x128 g = load128cs(grads + p);
  x128 stored;
  if (!master) stored = load128(params + p);
  f128 mi[kPieces], vi[kPieces], old[kPieces];
#pragma unroll
  for (int piece = 0; piece < kPieces; piece++) {
    const size_t q = st + piece * f128::size, qm = sm + piece * f128::size;
    mi[piece] = load128cs(m + qm);
    vi[piece] = load128cs(v + qm);
    if (master) old[piece] = load128cs(master + q);
  }
  x128 out;
#pragma unroll
  for (int piece = 0; piece < kPieces; piece++) {
#pragma unroll
    for (int k = 0; k < f128::size; k++) {
      const int e = piece * f128::size + k;
      const float previous = master ? old[piece][k] : (float)stored[e];
      old[piece][k] = adamw_element((float)g[e] * grad_scale, mi[piece][k], vi[piece][k], previous, rates,
                                    beta1_correction, beta2_correction, cautious_rate, bf16);
      out[e] = round_stochastic(old[piece][k], seed, index + e);
      if (fp8_head_to_fp8 != 0.0f) out[e] = fp8_head_weight_copy(out[e], old[piece][k], fp8_head_to_fp8);
    }
  }
#pragma unroll
  for (int piece = 0; piece < kPieces; piece++) {
    const size_t q = st + piece * f128::size, qm = sm + piece * f128::size;
    store128(out_m + qm, mi[piece]);
    store128(out_v + qm, vi[piece]);
    if (master) store128(out_master + q, old[piece]);
  }
  store128(params + p, out);
}

// One launch for every slice, from the moments and master weights of `from` (its master null:
// none; the moments' positions are the slices', the master weights' start at element
// state_offset). With `to` (its adam_m set): the new state goes there, the old stays as it was.
void adamw_update(floatX* params, const floatX* grads, const OptimizerArrays& from, size_t state_offset,
                  const AdamWSlices& slices, const AdamWParams& hp, cudaStream_t stream,
                  const OptimizerArrays& to = OptimizerArrays()) {
  if (slices.count == 0) return;
  REQUIRE(!to.adam_m || (to.adam_v && !from.master == !to.master), "adamw_update: the new state needs m, v%s",
          from.master ? " and master" : "");
  AdamWSlices launch = slices;
  for (int s = 0; s < launch.count; s++) {
    launch.beta1_correction[s] = 1.0f - powf(launch.rates[s].beta1, (float)hp.step);
    launch.beta2_correction[s] = 1.0f - powf(launch.rates[s].beta2, (float)hp.step);
    const AdamWRates& r = launch.rates[s];
    launch.cautious_rate[s] = (float)((double)r.lr * r.lr * r.weight_decay);
  }
  const int blocks = slices.first_block[slices.count];
  if (to.adam_m) {
    adamw_kernel<true><<<blocks, kAdamWThreads, 0, stream>>>(params, from.master, grads, from.adam_m, from.adam_v,
                                                             to.master, to.adam_m, to.adam_v, state_offset,
                                                             launch, hp.grad_scale);
  } else {
    adamw_kernel<false><<<blocks, kAdamWThreads, 0, stream>>>(params, from.master, grads, from.adam_m,
                                                              from.adam_v, nullptr, nullptr, nullptr,
                                                              state_offset, launch, hp.grad_scale);
  }
  cudaCheckLaunch();
}

// Muon for the blocks' matrices: Nesterov momentum, then the update orthogonalised by the
// recipe's Newton-Schulz iterations in BF16 (in every build, as the reference does; the
// baseline's 12 of (a, b, c) = (2, -1.5, 0.5), the speedrun's 5 of (3.4445, -4.775, 2.0315), Polar
// Express's 5 of a polynomial each: llmc::kNewtonSchulzMethods), with -mn 1 normalised by
// NorMuon's second moment (muon_second_moment), then the weight decay and the step.
// Matrices of one shape form a group, orthogonalised in their wide orientation, X [m, n] with
// m = min(rows, cols) (a tall parameter transposed), every matrix of a call in one batched
// cuBLASLt product each: A = X X^T [m, m]; B = c A A + b A; X = B X + a X, BF16 in and out with
// FP32 accumulation. Each product runs cuBLASLt's first heuristic for its shape
// and the whole group (no atomics), and the Frobenius norms add per-tile block trees, then a fixed
// tree per matrix, so the results are deterministic and do not depend on which matrices a call
// covers. FLOPs per matrix and iteration 2m^2n + 2m^3 + 2m^2n: at d12 (48 of 768x768, 24 of
// 768x3072) 3.9 TFLOP a step with 12 iterations, 6.5 ms at 600 TFLOP/s. The elementwise kernels
// move 12 bytes an element in (g, m, X), 4 to normalise, 14 out (X, master, p): 2.5 GB at d12.

// One step's hyperparameters (muon_step).
struct MuonParams {
  float lr, weight_decay, momentum;
  float grad_scale = 1.0f;  // the gradient's clipping factor, as AdamW's
  llmc::NewtonSchulz newton_schulz = llmc::kNewtonSchulzBaseline;
  bool scale_tall = true;  // a tall matrix's update times sqrt(n / m) (llmc::Recipe::muon_scale_tall)
  llmc::WeightDecayKind decay = llmc::WeightDecayKind::kDecoupled;
  bool normuon = false;         // NorMuon's second moment (llmc::Recipe::normuon; muon_second_moment)
  float normuon_weight = 0.0f;  // the new mean's weight in its running mean, 1 - beta2 rounded to FP32
  bool high_bits = false;       // BF16 weights the master's high 16 bits (llmc::Recipe::muon_high_bits)
};

// One group: `count` matrices of the wide shape [m, n], m <= n, each stored row-major (PyTorch's
// [out, in]) as [m, n] or, where tall[i] is set, as [n, m] (fc and fcproj are one group),
// scattered in the parameter buffer and named by device arrays of pointers. master is null
// without master weights (then the parameter is the master), tall null where none is tall; the
// momentum is FP32 of the parameter's shape. The sharded step (muon_prepare_shard) overwrites the
// gradients with the Nesterov inputs. second_moments: NorMuon's state, n FP32 values a matrix
// (muon_second_moment; null without it). lr_scale: each matrix's rate multiplier (null: 1).
struct MuonGroup {
  int m = 0, n = 0, count = 0;
  floatX** params = nullptr;
  float** master = nullptr;
  floatX** grads = nullptr;
  float** momentum = nullptr;
  const uint8_t* tall = nullptr;
  float** second_moments = nullptr;
  const float* lr_scale = nullptr;
};

constexpr int kMuonPointerSets = 5;  // MuonGroup's arrays of pointers: params to second_moments
constexpr int kMuonTile = 32;      // the elementwise kernels' tiles, and the norm's partial sums
constexpr int kMuonThreads = 256;  // a tile's block: each thread kMuonTile^2 / kMuonThreads elements

inline int muon_tiles(const MuonGroup& g) { return ceil_div(g.m, kMuonTile) * ceil_div(g.n, kMuonTile); }

// A batched column-major product D[r, c] = op(A)[r, k] B[k, c] (+ beta C, C of D's layout), made
// once for its shapes and batch and kept: the heuristic costs more than a small product takes.
struct MuonProduct {
  int r, c, k, batch, group_count;
  bool trans_a;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
};

// The scratch of muon_update, for `capacity` matrices of its groups at a time: the iterates X
// (ping-pong), A and B in BF16, the norms' tile sums and denominators, and NorMuon's means of X^2
// along the longer side and its factors of the norm.
struct MuonWorkspace {
  int capacity = 0;
  size_t x_elements = 0, square_elements = 0, partial_count = 0;  // per matrix, the groups' largest
  size_t side_elements = 0;                                       // n, the groups' largest
  __nv_bfloat16* x[2] = {nullptr, nullptr};
  __nv_bfloat16* a = nullptr;
  __nv_bfloat16* b = nullptr;
  float* partials = nullptr;
  float* denominators = nullptr;
  float* second_means = nullptr;
  float* second_factors = nullptr;
  std::vector<MuonProduct> products;
};

// Bytes for the groups, capacity matrices at a time (a larger group is processed in pieces).
size_t muon_workspace_size(const std::vector<MuonGroup>& groups, int capacity,
                           MuonWorkspace* sizes = nullptr) {
  MuonWorkspace ws;
  for (const MuonGroup& g : groups) {
    REQUIRE(g.m <= g.n && g.count > 0, "Muon: a group of %d matrices of %dx%d; the wide shape m <= n",
            g.count, g.m, g.n);
    ws.x_elements = std::max(ws.x_elements, (size_t)g.m * g.n);
    ws.square_elements = std::max(ws.square_elements, (size_t)g.m * g.m);
    ws.partial_count = std::max(ws.partial_count, (size_t)muon_tiles(g));
    ws.side_elements = std::max(ws.side_elements, (size_t)g.n);
  }
  if (sizes) *sizes = ws;
  return (size_t)capacity * (2 * sizeof(__nv_bfloat16) * (ws.x_elements + ws.square_elements) +
                             sizeof(float) * (ws.partial_count + ws.side_elements + 2));
}

void muon_workspace_alloc(MuonWorkspace& ws, const std::vector<MuonGroup>& groups, int capacity) {
  REQUIRE(capacity > 0, "Muon: a workspace for %d matrices at a time", capacity);
  muon_workspace_size(groups, capacity, &ws);
  ws.capacity = capacity;
  const size_t n = (size_t)capacity;
  for (__nv_bfloat16*& x : ws.x) x = device_alloc<__nv_bfloat16>(n * ws.x_elements, "Muon's iterates");
  ws.a = device_alloc<__nv_bfloat16>(n * ws.square_elements, "Muon's X X^T");
  ws.b = device_alloc<__nv_bfloat16>(n * ws.square_elements, "Muon's polynomial in X X^T");
  ws.partials = device_alloc<float>(n * ws.partial_count, "Muon's norm partial sums");
  ws.denominators = device_alloc<float>(n, "Muon's norms");
  ws.second_means = device_alloc<float>(n * ws.side_elements, "NorMuon's means of X^2");
  ws.second_factors = device_alloc<float>(n, "NorMuon's norm factors");
}

void muon_workspace_free(MuonWorkspace& ws) {
  for (MuonProduct& p : ws.products) {
    cublasCheck(cublasLtMatrixLayoutDestroy(p.a));
    cublasCheck(cublasLtMatrixLayoutDestroy(p.b));
    cublasCheck(cublasLtMatrixLayoutDestroy(p.d));
    cublasCheck(cublasLtMatmulDescDestroy(p.desc));
  }
  for (__nv_bfloat16* x : ws.x) device_free(x);
  device_free(ws.a);
  device_free(ws.b);
  device_free(ws.partials);
  device_free(ws.denominators);
  device_free(ws.second_means);
  device_free(ws.second_factors);
  ws = MuonWorkspace();
}

cublasLtMatrixLayout_t muon_layout(int rows, int cols, int batch) {
  cublasLtMatrixLayout_t layout;
  cublasCheck(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, rows, cols, rows));
  const int64_t stride = (int64_t)rows * cols;
  cublasCheck(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                               sizeof(batch)));
  cublasCheck(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                               sizeof(stride)));
  return layout;
}

// The layouts of op(A), B and D for a batch.
std::array<cublasLtMatrixLayout_t, 3> muon_layouts(int r, int c, int k, bool trans_a, int batch) {
  return {trans_a ? muon_layout(k, r, batch) : muon_layout(r, k, batch), muon_layout(k, c, batch),
          muon_layout(r, c, batch)};
}

// The alignment in bytes (a power of two, at most 256) that every slot of a product's matrices
// keeps: slot i of a batch of [r, k] x [k, c] products starts i r k, i k c and i r c elements in.
// The gates' 6 x 12 matrices leave 8 bytes, so the share a process orthogonalises from a slot past
// the first needs an algorithm chosen for that, and so does the whole group's, for the same bits.
uint32_t muon_slot_alignment(int r, int c, int k) {
  uint32_t alignment = 256;
  for (size_t elements : {(size_t)r * k, (size_t)k * c, (size_t)r * c}) {
    while ((elements * sizeof(__nv_bfloat16)) % alignment != 0) alignment /= 2;
  }
  return alignment;
}

bool muon_heuristic(cublasLtMatmulAlgo_t* algo, cublasLtMatmulDesc_t desc,
                    const std::array<cublasLtMatrixLayout_t, 3>& l, uint32_t alignment) {
  cublasLtMatmulPreference_t pref;
  cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &kCublasWorkspaceBytes, sizeof(kCublasWorkspaceBytes)));
  for (cublasLtMatmulPreferenceAttributes_t attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &alignment, sizeof(alignment)));
  }
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, l[0], l[1], l[2], l[2],
                                                                pref, 1, &heuristic, &found);
  cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
  if (status == CUBLAS_STATUS_SUCCESS && found > 0) *algo = heuristic.algo;
  return status == CUBLAS_STATUS_SUCCESS && found > 0;
}

void muon_layouts_destroy(const std::array<cublasLtMatrixLayout_t, 3>& l) {
  for (cublasLtMatrixLayout_t layout : l) cublasCheck(cublasLtMatrixLayoutDestroy(layout));
}

// The algorithm is the heuristic's for the whole group (group_count matrices), where cuBLASLt
// accepts it for the batch: an algorithm computes each matrix of a batch alike, so a matrix gets
// the same bits whichever share of the group a call covers.
const MuonProduct& muon_product(MuonWorkspace& ws, int r, int c, int k, bool trans_a, int batch,
                               int group_count) {
  for (const MuonProduct& p : ws.products) {
    if (p.r == r && p.c == c && p.k == k && p.trans_a == trans_a && p.batch == batch &&
        p.group_count == group_count) {
      return p;
    }
  }
  MuonProduct p = {r, c, k, batch, group_count, trans_a, nullptr, nullptr, nullptr, nullptr, {}};
  cublasCheck(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const std::array<cublasLtMatrixLayout_t, 3> l = muon_layouts(r, c, k, trans_a, batch);
  p.a = l[0];
  p.b = l[1];
  p.d = l[2];
  const std::array<cublasLtMatrixLayout_t, 3> group = muon_layouts(r, c, k, trans_a, group_count);
  const uint32_t alignment = muon_slot_alignment(r, c, k);
  bool found = muon_heuristic(&p.algo, p.desc, group, alignment);
  muon_layouts_destroy(group);
  cublasLtMatmulHeuristicResult_t checked;
  if (found && batch != group_count) {
    found = cublasLtMatmulAlgoCheck(cublaslt_handle, p.desc, p.a, p.b, p.d, p.d, &p.algo, &checked) ==
                CUBLAS_STATUS_SUCCESS &&
            checked.workspaceSize <= kCublasWorkspaceBytes;
  }
  if (!found) found = muon_heuristic(&p.algo, p.desc, l, alignment);
  REQUIRE(found, "Muon: cuBLASLt found no algorithm for %d batched %dx%dx%d BF16 products", batch, r, c, k);
  ws.products.push_back(p);
  return ws.products.back();
}

// d = alpha op(a) b + beta c over the batch (c may be d's own input, as cuBLASLt allows).
void muon_multiply(MuonWorkspace& ws, __nv_bfloat16* d, const __nv_bfloat16* a, const __nv_bfloat16* b,
                   const __nv_bfloat16* c, int r, int cols, int k, bool trans_a, int batch, int group_count,
                   float alpha, float beta, cudaStream_t stream) {
  const MuonProduct& p = muon_product(ws, r, cols, k, trans_a, batch, group_count);
  cublasCheck(cublasLtMatmul(cublaslt_handle, p.desc, &alpha, a, p.a, b, p.b, &beta, c ? c : d, p.d, d, p.d,
                             &p.algo, cublaslt_workspace, kCublasWorkspaceBytes, stream));
}

// The normalised X of slots [slot, slot + batch) lies in ws.x[muon_start_buffer(ns)]: the
// iterations alternate between the two buffers, and so end in ws.x[0] for any count.
inline int muon_start_buffer(const llmc::NewtonSchulz& ns) { return ns.steps % 2; }

// ns.steps iterations on slots [slot, slot + batch) of X ([batch, m, n] row-major, m <= n), from
// ws.x[muon_start_buffer(ns)]; the result ends in ws.x[0]. A row-major X is the column-major X^T
// [n, m]: A = X X^T is (X^T)^T X^T; A and B are symmetric, so either reading of their buffers is the
// same matrix up to the products' rounding, and B X is, in column-major terms, X^T B^T with B^T read
// from B's buffer. cuBLASLt's alpha scales the FP32 product by c and its beta adds b A (and a X)
// before the one rounding of each sum, as record #28's fused products do; the baseline's (and
// train_gpt2.py's) B = b A + (c A) A and X = a X + B X round each scaled term and product to BF16
// before its sum. Step i takes ns.polynomial[i].
void muon_newton_schulz(MuonWorkspace& ws, const llmc::NewtonSchulz& ns, int m, int n, int slot, int batch,
                        int group_count, cudaStream_t stream) {
  __nv_bfloat16* x[2] = {ws.x[0] + (size_t)slot * m * n, ws.x[1] + (size_t)slot * m * n};
  __nv_bfloat16* a = ws.a + (size_t)slot * m * m;
  __nv_bfloat16* b = ws.b + (size_t)slot * m * m;
  const int start = muon_start_buffer(ns);
  for (int i = 0; i < ns.steps; i++) {
    const llmc::NewtonSchulzStep& p = ns.polynomial[i];
    __nv_bfloat16* from = x[(start + i) % 2];
    __nv_bfloat16* to = x[(start + i + 1) % 2];
    muon_multiply(ws, a, from, from, nullptr, m, m, n, true, batch, group_count, 1.0f, 0.0f, stream);
    muon_multiply(ws, b, a, a, a, m, m, m, false, batch, group_count, p.c, p.b, stream);
    muon_multiply(ws, to, from, b, from, n, m, m, false, batch, group_count, 1.0f, p.a, stream);
  }
}

// torch.lerp's two formulas, as the reference's momentum.lerp_(g, 1 - mu) and g.lerp_(momentum, mu)
// evaluate them.
__device__ __forceinline__ float muon_lerp(float from, float to, float weight) {
  return weight < 0.5f ? from + weight * (to - from) : to - (to - from) * (1.0f - weight);
}

// Element `at` of a matrix's momentum stepped, mom = lerp(mom, g, 1 - mu), and its Nesterov input
// u = bf16(lerp(g, mom, mu)). The whole and the sharded steps share it, so they agree bit for bit.
__device__ __forceinline__ __nv_bfloat16 muon_nesterov(const floatX* g, float* mom, size_t at, float mu,
                                                       float grad_scale) {
  const float gi = (float)g[at] * grad_scale, mi = muon_lerp(mom[at], gi, 1.0f - mu);
  mom[at] = mi;
  return __float2bfloat16_rn(muon_lerp(gi, mi, mu));
}

// One 32x32 tile of X [m, n] of each matrix of the batch: X = bf16(u) with u = input(at)
// (at: the element's index in the parameter's own layout, after input.bind(matrix)), and the
// tile's sum of X^2 as partials[matrix * tiles + tile]. A tall parameter [n, m] is read along its
// rows and its tile transposed through shared memory, so both sides stay coalesced.
template <typename Input>
__device__ __forceinline__ void muon_prepare_tile(__nv_bfloat16* x, float* partials, const uint8_t* tall,
                                                  int m, int n, Input input) {
  __shared__ float tile[kMuonTile][kMuonTile + 1];
  __shared__ float shared[WARP_SIZE];
  constexpr int kStep = kMuonThreads / kMuonTile;
  const int z = blockIdx.z, tx = threadIdx.x % kMuonTile, ty = threadIdx.x / kMuonTile;
  const bool transpose = tall && tall[z];
  input.bind(z);
  __nv_bfloat16* out = x + (size_t)z * m * n;
  // The tile's rows and columns in the parameter's own orientation.
  const int row0 = (transpose ? blockIdx.x : blockIdx.y) * kMuonTile;
  const int col0 = (transpose ? blockIdx.y : blockIdx.x) * kMuonTile;
  const int rows = transpose ? n : m, cols = transpose ? m : n;
  float squares = 0.0f;
  for (int i = ty; i < kMuonTile; i += kStep) {
    const int r = row0 + i, c = col0 + tx;
    if (r >= rows || c >= cols) continue;
    const size_t at = (size_t)r * cols + c;
    const __nv_bfloat16 u = input(at);
    squares += (float)u * (float)u;
    if (transpose) {
      tile[i][tx] = (float)u;
    } else {
      out[at] = u;
    }
  }
  if (transpose) {
    __syncthreads();
    for (int i = ty; i < kMuonTile; i += kStep) {
      const int r = col0 + i, c = row0 + tx;  // in X
      if (r < m && c < n) out[(size_t)r * n + c] = __float2bfloat16_rn(tile[tx][i]);
    }
  }
  squares = block_reduce_sum(squares, shared);
  const size_t tile_index = (size_t)z * gridDim.x * gridDim.y + blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) partials[tile_index] = squares;
}

// The tiles of X from the gradients, the momentum stepped (muon_nesterov); bind reads a matrix's
// pointers once a block.
struct MuonMomentumInput {
  const floatX* const* grads;
  float* const* momentum;
  float mu, grad_scale;
  const floatX* g = nullptr;
  float* mom = nullptr;
  __device__ void bind(int z) {
    g = grads[z];
    mom = momentum[z];
  }
  __device__ __nv_bfloat16 operator()(size_t at) { return muon_nesterov(g, mom, at, mu, grad_scale); }
};

__global__ void __launch_bounds__(kMuonThreads) muon_prepare_kernel(
    __nv_bfloat16* x, float* partials, const floatX* const* grads, float* const* momentum,
    const uint8_t* tall, int m, int n, float mu, float grad_scale) {
  muon_prepare_tile(x, partials, tall, m, n, MuonMomentumInput{grads, momentum, mu, grad_scale});
}

// The tiles of X from Nesterov inputs that muon_prepare_shard left (exact in floatX) and the
// processes gathered.
struct MuonGatheredInput {
  const floatX* const* inputs;
  const floatX* u = nullptr;
  __device__ void bind(int z) { u = inputs[z]; }
  __device__ __nv_bfloat16 operator()(size_t at) const { return __float2bfloat16_rn((float)u[at]); }
};

__global__ void __launch_bounds__(kMuonThreads) muon_prepare_gathered_kernel(
    __nv_bfloat16* x, float* partials, const floatX* const* inputs, const uint8_t* tall, int m, int n) {
  muon_prepare_tile(x, partials, tall, m, n, MuonGatheredInput{inputs});
}

// The momentum step of each element of matrix blockIdx.y inside this process's ZeRO-1 shard
// [shard_begin, shard_end) of the gradient buffer, its Nesterov input written over its gradient
// (in floatX, which holds a BF16 value exactly) for the processes to gather.
__global__ void muon_prepare_shard_kernel(floatX* const* grads, float* const* momentum, size_t elements,
                                          const floatX* shard_begin, const floatX* shard_end, float mu,
                                          float grad_scale) {
  const size_t at = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  floatX* g = grads[blockIdx.y];
  if (at >= elements || g + at < shard_begin || g + at >= shard_end) return;
  g[at] = (floatX)__bfloat162float(muon_nesterov(g, momentum[blockIdx.y], at, mu, grad_scale));
}

// One block per matrix: its tiles' sums in a fixed tree, then the reference's BF16 arithmetic
// (the norm of a BF16 tensor is a BF16 number, and so are norm * scale and that + eps; at scale 1
// the product is the norm itself).
__global__ void muon_norm_kernel(float* denominators, const float* partials, int tiles, float scale, float eps) {
  __shared__ float shared[WARP_SIZE];
  float sum = 0.0f;
  for (int i = threadIdx.x; i < tiles; i += blockDim.x) sum += partials[(size_t)blockIdx.x * tiles + i];
  sum = block_reduce_sum(sum, shared);
  if (threadIdx.x > 0) return;
  const float norm = __bfloat162float(__float2bfloat16_rn(sqrtf(sum)));
  const float scaled = __bfloat162float(__float2bfloat16_rn(norm * scale));
  denominators[blockIdx.x] = __bfloat162float(__float2bfloat16_rn(scaled + eps));
}

// out = bf16(x / denominator) (out may be x), 8 elements a thread; a matrix holds a multiple of 8
// elements.
__global__ void muon_normalize_kernel(__nv_bfloat16* out, const __nv_bfloat16* x, const float* denominators,
                                      size_t matrix_elements, size_t n) {
  typedef Packed128<__nv_bfloat16> bf16x8;
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * bf16x8::size;
  if (i >= n) return;
  const float d = denominators[i / matrix_elements];
  bf16x8 v = load128(x + i);
  for (int k = 0; k < bf16x8::size; k++) v[k] = __float2bfloat16_rn(__bfloat162float(v[k]) / d);
  store128(out + i, v);
}

// The same, one element a thread, for matrices of a size no multiple of 8 (the speedrun's gates,
// [NH, C/64]).
__global__ void muon_normalize_scalar_kernel(__nv_bfloat16* out, const __nv_bfloat16* x, const float* denominators,
                                             size_t matrix_elements, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = __float2bfloat16_rn(__bfloat162float(x[i]) / denominators[i / matrix_elements]);
}

// NorMuon's second moment (record #89's), on the orthogonalised X [m, n] (wide, m <= n) of each
// matrix of a batch, with its state s of n values: for each entry k of the matrix's longer side,
// mean_k the mean of X^2 over the other side; s_k <- lerp(s_k, mean_k, 1 - beta2); X_k <- X_k /
// sqrt(max(s_k, 1e-10)); then X scaled back to its norm before. The reference takes the rows of
// a tall matrix as it stores it, the columns of a wide one and the rows of a square one: in the
// wide orientation X's columns, or its rows where m = n (no square matrix is stored transposed),
// the same entries of the same matrix wherever our storage is the reference's transposed (the
// MLP's down projection). In its order and types: the means, s and the factors FP32, each mean
// the sum of the m squares times 1/m, the norm before sqrt(m sum_k mean_k), the one after
// sqrt(sum_k (m mean_k) step_k^2), an entry's scale step_k (norm / max(after, 1e-10)) rounded to
// BF16 and its product with X too; every operation rounded on its own. Deterministic: each mean
// adds its squares in order, the norms in block_reduce_sum's tree of one block per matrix. X's
// bytes read twice and written once: 6 an element.

// 1 / sqrt(max(s, 1e-10)), each operation rounded as the CPU rounds it.
__device__ __forceinline__ float muon_second_moment_step(float s) {
  return __fdiv_rn(1.0f, __fsqrt_rn(fmaxf(s, 1e-10f)));
}

// Entry k = blockIdx.x * blockDim.x + threadIdx.x of matrix blockIdx.y: its mean, kept for
// muon_second_moment_norm_kernel, and its running mean, torch.lerp's s + w (mean - s) (w < 0.5)
// as its CUDA kernel evaluates it, one fused multiply-add.
__global__ void muon_second_moment_kernel(float* means, float* const* second_moments, const __nv_bfloat16* x,
                                          int m, int n, float weight) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x, z = blockIdx.y;
  if (k >= n) return;
  const __nv_bfloat16* in = x + (size_t)z * m * n;
  const bool rows = m == n;
  float sum = 0.0f;
  for (int i = 0; i < m; i++) {
    const float v = __bfloat162float(rows ? in[(size_t)k * n + i] : in[(size_t)i * n + k]);
    sum = __fadd_rn(sum, __fmul_rn(v, v));
  }
  const float mean = __fmul_rn(sum, __frcp_rn((float)m));
  float* s = second_moments[z];
  means[(size_t)z * n + k] = mean;
  s[k] = __fmaf_rn(weight, __fsub_rn(mean, s[k]), s[k]);
}

// Matrix blockIdx.x's factor norm / max(after, 1e-10), from its means and updated state.
__global__ void muon_second_moment_norm_kernel(float* factors, const float* means, float* const* second_moments,
                                               int m, int n) {
  __shared__ float shared[WARP_SIZE];
  const int z = blockIdx.x;
  const float* mean = means + (size_t)z * n;
  const float* s = second_moments[z];
  const float side = (float)m;
  float before = 0.0f, after = 0.0f;
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    const float step = muon_second_moment_step(s[k]);
    before = __fadd_rn(before, mean[k]);
    after = __fadd_rn(after, __fmul_rn(__fmul_rn(mean[k], side), __fmul_rn(step, step)));
  }
  before = block_reduce_sum(before, shared);
  after = block_reduce_sum(after, shared);
  if (threadIdx.x > 0) return;
  factors[z] = __fdiv_rn(__fsqrt_rn(__fmul_rn(before, side)), fmaxf(__fsqrt_rn(after), 1e-10f));
}

// X = bf16(X bf16(step_k factor)), one element a thread.
__global__ void muon_second_moment_scale_kernel(__nv_bfloat16* x, const float* factors,
                                                float* const* second_moments, int m, int n, size_t elements) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= elements) return;
  const size_t matrix = (size_t)m * n, z = i / matrix, at = i % matrix;
  const size_t k = m == n ? at / n : at % n;
  const float step = muon_second_moment_step(second_moments[z][k]);
  const float scale = __bfloat162float(__float2bfloat16_rn(__fmul_rn(step, factors[z])));
  x[i] = __float2bfloat16_rn(__fmul_rn(__bfloat162float(x[i]), scale));
}

// One 32x32 tile of X [m, n] of each matrix of the batch: u = X (transposed back through shared
// memory for a tall parameter, then scaled by tall_scale, sqrt(n / m) or 1, in BF16 as the
// reference scales its BF16 update); p = p (1 - lr wd) - lr u, or with the cautious decay
// (llmc::WeightDecayKind, muon_cautious_decay) p - (wd lr) lr_eff p [u p >= 0] - lr u, lr_eff the
// matrix's rate lr tall_scale, in which record #89's reference puts the shape; lr and lr_eff
// times the matrix's multiplier (MuonGroup::lr_scale), the decoupled decay's lr wd not; in FP32
// from the master weights (or the parameter), stored with stochastic rounding at the element's
// index in the whole group, so that the bits do not depend on which matrices a call covers, or
// with high_bits and master weights as the master's high 16 bits (round_toward_zero).
struct MuonApply {
  float lr, decay, tall_scale;
  bool cautious;
  bool high_bits;
  float wd_lr, tall_lr;  // the cautious decay's wd lr, and a tall matrix's lr_eff (lr sqrt(n / m) or lr)
  uint32_t seed;
  int first;                        // the batch's first matrix in its group
  const float* lr_scale = nullptr;  // the batch's matrices' multipliers (null: 1)
};

// Muon's cautious step: old - (wd lr) lr_eff old [u old >= 0] - lr u, in the order of record #89's
// reference (p - p mask wd lr_eff - grad lr_eff), each operation rounded on its own as its eager
// steps are (no fused multiply-add), and the product u old, not the signs, deciding, as there.
__device__ __forceinline__ float muon_cautious_decay(float old, float u, float lr, float wd_lr, float lr_eff) {
  const float mask = __fmul_rn(u, old) >= 0.0f ? 1.0f : 0.0f;
  const float decay = __fmul_rn(__fmul_rn(__fmul_rn(old, mask), wd_lr), lr_eff);
  return __fsub_rn(__fsub_rn(old, decay), __fmul_rn(lr, u));
}

// The tile's elements inside [shard_begin, shard_end) of the parameter buffer (all where null).
__device__ __forceinline__ void muon_apply_tile(floatX* const* params, float* const* master,
                                                const __nv_bfloat16* x, const uint8_t* tall, int m, int n,
                                                const MuonApply& a, const floatX* shard_begin,
                                                const floatX* shard_end) {
  __shared__ float tile[kMuonTile][kMuonTile + 1];
  constexpr int kStep = kMuonThreads / kMuonTile;
  const int z = blockIdx.z, tx = threadIdx.x % kMuonTile, ty = threadIdx.x / kMuonTile;
  const bool transpose = tall && tall[z];
  const __nv_bfloat16* in = x + (size_t)z * m * n;
  const int row0 = (transpose ? blockIdx.x : blockIdx.y) * kMuonTile;
  const int col0 = (transpose ? blockIdx.y : blockIdx.x) * kMuonTile;
  const int rows = transpose ? n : m, cols = transpose ? m : n;
  if (transpose) {
    for (int i = ty; i < kMuonTile; i += kStep) {
      const int r = col0 + i, c = row0 + tx;  // in X
      if (r < m && c < n) tile[tx][i] = __bfloat162float(in[(size_t)r * n + c]);
    }
    __syncthreads();
  }
  floatX* p = params[z];
  float* pm = master ? master[z] : nullptr;
  const float rate = a.lr_scale ? a.lr_scale[z] : 1.0f;
  for (int i = ty; i < kMuonTile; i += kStep) {
    const int r = row0 + i, c = col0 + tx;
    if (r >= rows || c >= cols) continue;
    const size_t at = (size_t)r * cols + c;
    if (shard_begin && (p + at < shard_begin || p + at >= shard_end)) continue;
    const float u = transpose ? __bfloat162float(__float2bfloat16_rn(tile[i][tx] * a.tall_scale))
                              : __bfloat162float(in[at]);
    const float old = pm ? pm[at] : (float)p[at];
    const float lr = __fmul_rn(a.lr, rate), lr_eff = __fmul_rn(transpose ? a.tall_lr : a.lr, rate);
    const float updated = a.cautious ? muon_cautious_decay(old, u, lr, a.wd_lr, lr_eff) : old * a.decay - lr * u;
    if (pm) pm[at] = updated;
    p[at] = pm && a.high_bits ? round_toward_zero(updated)
                              : round_stochastic(updated, a.seed, (size_t)(a.first + z) * m * n + at);
  }
}

__global__ void __launch_bounds__(kMuonThreads) muon_apply_kernel(
    floatX* const* params, float* const* master, const __nv_bfloat16* x, const uint8_t* tall, int m, int n,
    MuonApply a) {
  muon_apply_tile(params, master, x, tall, m, n, a, nullptr, nullptr);
}

__global__ void __launch_bounds__(kMuonThreads) muon_apply_shard_kernel(
    floatX* const* params, float* const* master, const __nv_bfloat16* x, const uint8_t* tall, int m, int n,
    MuonApply a, const floatX* shard_begin, const floatX* shard_end) {
  muon_apply_tile(params, master, x, tall, m, n, a, shard_begin, shard_end);
}

// Slots [slot, slot + batch) of the workspace hold a batch's matrices (slot i is matrix i of the
// batch at slot 0). cuBLASLt's algorithms are chosen for the alignment every slot keeps
// (muon_slot_alignment).
void muon_require_fits(const MuonGroup& g, int slot, int batch, const MuonWorkspace& ws) {
  const int m = g.m, n = g.n;
  REQUIRE(batch > 0 && slot >= 0 && slot + batch <= ws.capacity && (size_t)m * n <= ws.x_elements &&
              (size_t)m * m <= ws.square_elements && (size_t)muon_tiles(g) <= ws.partial_count &&
              (size_t)n <= ws.side_elements,
          "Muon: %d matrices of %dx%d from slot %d do not fit a workspace for %d of %zu elements", batch, m,
          n, slot, ws.capacity, ws.x_elements);
}

// Matrices [first, first + batch) of the group into slots [slot, slot + batch): the momentum
// updated, X = bf16(u) [batch, m, n] in the wide orientation, and the tile sums of X^2.
void muon_prepare(const MuonGroup& g, int first, int batch, const MuonParams& hp, MuonWorkspace& ws, int slot,
                  cudaStream_t stream) {
  muon_require_fits(g, slot, batch, ws);
  const int m = g.m, n = g.n;
  const dim3 grid(ceil_div(n, kMuonTile), ceil_div(m, kMuonTile), batch);
  muon_prepare_kernel<<<grid, kMuonThreads, 0, stream>>>(
      ws.x[0] + (size_t)slot * m * n, ws.partials + (size_t)slot * muon_tiles(g), g.grads + first,
      g.momentum + first, g.tall ? g.tall + first : nullptr, m, n, hp.momentum, hp.grad_scale);
  cudaCheckLaunch();
}

// Slots [slot, slot + batch) of X, as muon_prepare left them in ws.x[0], normalised by ns's
// norm_scale and norm_eps and orthogonalised by its iterations, ending in ws.x[0] again.
void muon_orthogonalize(const MuonGroup& g, const llmc::NewtonSchulz& ns, int slot, int batch, MuonWorkspace& ws,
                        cudaStream_t stream) {
  muon_require_fits(g, slot, batch, ws);
  const int m = g.m, n = g.n, tiles = muon_tiles(g);
  float* denominators = ws.denominators + slot;
  const float* partials = ws.partials + (size_t)slot * tiles;
  muon_norm_kernel<<<batch, kMuonThreads, 0, stream>>>(denominators, partials, tiles, ns.norm_scale, ns.norm_eps);
  cudaCheckLaunch();
  const size_t elements = (size_t)batch * m * n, first = (size_t)slot * m * n;
  __nv_bfloat16* normalized = ws.x[muon_start_buffer(ns)] + first;
  if ((size_t)m * n % 8 == 0) {
    muon_normalize_kernel<<<ceil_div(elements / 8, kMuonThreads), kMuonThreads, 0, stream>>>(
        normalized, ws.x[0] + first, denominators, (size_t)m * n, elements);
  } else {
    muon_normalize_scalar_kernel<<<ceil_div(elements, kMuonThreads), kMuonThreads, 0, stream>>>(
        normalized, ws.x[0] + first, denominators, (size_t)m * n, elements);
  }
  cudaCheckLaunch();
  muon_newton_schulz(ws, ns, m, n, slot, batch, g.count, stream);
}

// NorMuon's step (muon_second_moment_kernel) on slots [slot, slot + batch) of X, as
// muon_orthogonalize left them in ws.x[0], matrices [first, first + batch) of the group.
void muon_second_moment(const MuonGroup& g, int first, int batch, const MuonParams& hp, MuonWorkspace& ws,
                        int slot, cudaStream_t stream) {
  muon_require_fits(g, slot, batch, ws);
  REQUIRE(g.second_moments, "Muon: NorMuon's step on a group of %dx%d matrices without its second moments", g.m,
          g.n);
  const int m = g.m, n = g.n;
  __nv_bfloat16* x = ws.x[0] + (size_t)slot * m * n;
  float* means = ws.second_means + (size_t)slot * n;
  float* factors = ws.second_factors + slot;
  float* const* second_moments = g.second_moments + first;
  muon_second_moment_kernel<<<dim3(ceil_div(n, kMuonThreads), batch), kMuonThreads, 0, stream>>>(
      means, second_moments, x, m, n, hp.normuon_weight);
  cudaCheckLaunch();
  muon_second_moment_norm_kernel<<<batch, kMuonThreads, 0, stream>>>(factors, means, second_moments, m, n);
  cudaCheckLaunch();
  const size_t elements = (size_t)batch * m * n;
  muon_second_moment_scale_kernel<<<ceil_div((long)elements, kMuonThreads), kMuonThreads, 0, stream>>>(
      x, factors, second_moments, m, n, elements);
  cudaCheckLaunch();
}

MuonApply muon_apply_constants(const MuonGroup& g, const MuonParams& hp, uint32_t seed, int first) {
  MuonApply a;
  a.lr = hp.lr;
  a.decay = (float)(1.0 - (double)hp.lr * hp.weight_decay);
  a.tall_scale = hp.scale_tall ? (float)std::sqrt((double)g.n / g.m) : 1.0f;
  a.cautious = hp.decay == llmc::WeightDecayKind::kCautious;
  a.high_bits = hp.high_bits;
  a.wd_lr = (float)((double)hp.weight_decay * hp.lr);
  a.tall_lr = (float)(hp.lr * (hp.scale_tall ? std::sqrt((double)g.n / g.m) : 1.0));
  a.seed = seed;
  a.first = first;
  a.lr_scale = g.lr_scale ? g.lr_scale + first : nullptr;
  return a;
}

// The parameters of matrices [first, first + batch) from the updates in slots [slot, slot + batch).
void muon_apply(const MuonGroup& g, int first, int batch, const MuonParams& hp, uint32_t seed,
                const MuonWorkspace& ws, int slot, cudaStream_t stream) {
  muon_require_fits(g, slot, batch, ws);
  const MuonApply a = muon_apply_constants(g, hp, seed, first);
  const dim3 grid(ceil_div(g.n, kMuonTile), ceil_div(g.m, kMuonTile), batch);
  floatX* const* params = g.params + first;
  float* const* master = g.master ? g.master + first : nullptr;
  const uint8_t* tall = g.tall ? g.tall + first : nullptr;
  const __nv_bfloat16* updates = ws.x[0] + (size_t)slot * g.m * g.n;
  muon_apply_kernel<<<grid, kMuonThreads, 0, stream>>>(params, master, updates, tall, g.m, g.n, a);
  cudaCheckLaunch();
}

// One Muon step for matrices [begin, end) of a group, ws.capacity matrices at a time.
// cuBLASLt's workspace is the trainer's one: keep other products off the stream's way while this
// runs on another stream.
void muon_update(const MuonGroup& g, int begin, int end, const MuonParams& hp, uint32_t seed,
                 MuonWorkspace& ws, cudaStream_t stream) {
  REQUIRE(0 <= begin && begin <= end && end <= g.count, "Muon: matrices [%d, %d) of a group of %d", begin,
          end, g.count);
  for (int first = begin; first < end; first += ws.capacity) {
    const int batch = std::min(ws.capacity, end - first);
    muon_prepare(g, first, batch, hp, ws, 0, stream);
    muon_orthogonalize(g, hp.newton_schulz, 0, batch, ws, stream);
    if (hp.normuon) muon_second_moment(g, first, batch, hp, ws, 0, stream);
    muon_apply(g, first, batch, hp, seed, ws, 0, stream);
  }
}

// Process `rank` of `world` orthogonalises matrices [begin, end) of a group of `count`: contiguous
// shares whose sizes differ by at most one, fixed by the process count alone.
struct MuonShare {
  int begin, end;
};

inline MuonShare muon_share(int count, int rank, int world) {
  return {(int)((int64_t)count * rank / world), (int)((int64_t)count * (rank + 1) / world)};
}

// A contiguous run of elements [begin, begin + count) of an array that process `owner` updates
// and the others take from it.
struct OwnedRun {
  size_t begin, count;
  int owner;
};

// The optimizers' work spread over the `world` processes of a data-parallel run (this one is
// `rank`). Muon's orthogonalisation always: gather(x, matrix_elements, count, stream) fills the
// slots [0, count) of updates x that the other processes orthogonalised (their muon_share) with
// their bits, in place. With ZeRO-1, gather_shards(buffer, shard_size, stream) fills each of the
// `world` shards of buffer [world * shard_size] with its process's, in place.
// divided (-od 1, without ZeRO): each process steps its share of every Muon group and its slice of
// every large AdamW tensor alone (adamw_owned_part), and share_params(params, runs, stream, beside)
// then gives every process each run of the parameters from its owner: with beside, on another
// stream, after `stream`'s work so far and beside its next; without, on `stream`, after the last
// one beside. The state of a run (moments, momentum, master weights) is current on its owner alone
// (multi_gpu_share_state).
struct OptimizerSpread {
  int rank = 0, world = 1;
  std::function<void(__nv_bfloat16* x, size_t matrix_elements, int count, cudaStream_t stream)> gather;
  std::function<void(floatX* buffer, size_t shard_size, cudaStream_t stream)> gather_shards;
  bool divided = false;
  std::function<void(floatX* params, const std::vector<OwnedRun>& runs, cudaStream_t stream, bool beside)>
      share_params;
  // -oc 2, in place of share_params for Muon's runs: the runs of each part (param_runs_by_layer) copied
  // behind stream, which goes on at once; returns the events after each part's copies.
  std::function<const std::vector<cudaEvent_t>*(floatX* params, const std::vector<std::vector<OwnedRun>>& parts,
                                                cudaStream_t stream)>
      share_behind;
};

// -od 1: the part [begin, end) of an AdamW tensor of `size` elements that process `rank` of
// `world` steps: contiguous parts in order, cut at multiples of 64 elements (the kernel's 16-byte
// pieces stay aligned). A tensor under kAdamWDividedMin elements a process is stepped whole by
// every process: its update costs less than a collective.
constexpr size_t kAdamWDividedMin = 1 << 16;
constexpr size_t kAdamWPartAlign = 64;

struct OwnedPart {
  size_t begin, end;
};

inline OwnedPart adamw_owned_part(size_t size, int rank, int world) {
  if (size < kAdamWDividedMin * world) return {0, size};
  auto cut = [&](int r) { return r == world ? size : size * r / world / kAdamWPartAlign * kAdamWPartAlign; };
  return {cut(rank), cut(rank + 1)};
}

// One Muon step for a whole group, its orthogonalisation spread (matrix i in slot i, so the
// workspace holds the group). Every process updates the momentum of every matrix (elementwise
// and cheap; the averaged gradient is the same on every process, so the state stays replicated),
// orthogonalises its share, gathers the others', and applies the whole group's update with the
// same seeds (NorMuon's step, where it runs, on every matrix, its state replicated as the
// momentum), so that every process keeps the same parameters and master weights. The bits do not
// depend on which process orthogonalised a matrix where cuBLASLt runs the group's algorithm for a
// share (muon_product); one process runs muon_update's kernels.
// spread.divided: the process runs every stage on its share alone, from the momentum to the new
// parameters, and the caller shares the parameters (OptimizerSpread::share_params).
void muon_update_spread(const MuonGroup& g, const MuonParams& hp, uint32_t seed, MuonWorkspace& ws,
                        const OptimizerSpread& spread, cudaStream_t stream) {
  const MuonShare share = muon_share(g.count, spread.rank, spread.world);
  if (spread.divided) {
    const int first = share.begin, batch = share.end - share.begin;
    if (batch == 0) return;
    muon_prepare(g, first, batch, hp, ws, first, stream);
    muon_orthogonalize(g, hp.newton_schulz, first, batch, ws, stream);
    if (hp.normuon) muon_second_moment(g, first, batch, hp, ws, first, stream);
    muon_apply(g, first, batch, hp, seed, ws, first, stream);
    return;
  }
  muon_prepare(g, 0, g.count, hp, ws, 0, stream);
  if (share.end > share.begin) {
    muon_orthogonalize(g, hp.newton_schulz, share.begin, share.end - share.begin, ws, stream);
  }
  if (spread.world > 1) spread.gather(ws.x[0], (size_t)g.m * g.n, g.count, stream);
  if (hp.normuon) muon_second_moment(g, 0, g.count, hp, ws, 0, stream);
  muon_apply(g, 0, g.count, hp, seed, ws, 0, stream);
}

// With ZeRO-1 (-zs 1) a process holds the averaged gradient, the momentum and the master weights
// of its shard of the parameter buffer alone: [begin, end) of the gradients and of the parameters
// (one layout). A matrix may be cut anywhere by a shard's ends.
struct MuonShard {
  const floatX* grads_begin;
  const floatX* grads_end;
  const floatX* params_begin;
  const floatX* params_end;
};

// The sharded step's first half, for every matrix of the group: the momentum of the shard's
// elements stepped and their Nesterov inputs written over their gradients, which the processes
// then gather whole (OptimizerSpread::gather_shards).
void muon_prepare_shard(const MuonGroup& g, const MuonParams& hp, const MuonShard& shard,
                        cudaStream_t stream) {
  const size_t elements = (size_t)g.m * g.n;
  const dim3 grid(ceil_div((long)elements, kMuonThreads), g.count);
  muon_prepare_shard_kernel<<<grid, kMuonThreads, 0, stream>>>(
      g.grads, g.momentum, elements, shard.grads_begin, shard.grads_end, hp.momentum, hp.grad_scale);
  cudaCheckLaunch();
}

// The sharded step's second half, once the gradients hold every process's Nesterov inputs: as
// muon_update_spread, this process orthogonalises its share of the group (from the gathered
// inputs, with the norms' tile sums of muon_prepare) and gathers the others', then applies the
// update to its shard's elements alone, with the seeds of the whole step, so that each element
// gets the bits muon_update_spread gives it.
void muon_update_sharded(const MuonGroup& g, const MuonParams& hp, uint32_t seed, MuonWorkspace& ws,
                         const OptimizerSpread& spread, const MuonShard& shard, cudaStream_t stream) {
  REQUIRE(!hp.normuon, "Muon with ZeRO-1: NorMuon's second moments are kept whole on every process, not "
          "sharded (-mn 1 runs with -zs 0)");
  const MuonShare share = muon_share(g.count, spread.rank, spread.world);
  const int m = g.m, n = g.n, batch = share.end - share.begin;
  if (batch > 0) {
    muon_require_fits(g, share.begin, batch, ws);
    const dim3 grid(ceil_div(n, kMuonTile), ceil_div(m, kMuonTile), batch);
    muon_prepare_gathered_kernel<<<grid, kMuonThreads, 0, stream>>>(
        ws.x[0] + (size_t)share.begin * m * n, ws.partials + (size_t)share.begin * muon_tiles(g),
        g.grads + share.begin, g.tall ? g.tall + share.begin : nullptr, m, n);
    cudaCheckLaunch();
    muon_orthogonalize(g, hp.newton_schulz, share.begin, batch, ws, stream);
  }
  if (spread.world > 1) spread.gather(ws.x[0], (size_t)m * n, g.count, stream);
  muon_require_fits(g, 0, g.count, ws);
  const MuonApply a = muon_apply_constants(g, hp, seed, 0);
  const dim3 grid(ceil_div(n, kMuonTile), ceil_div(m, kMuonTile), g.count);
  muon_apply_shard_kernel<<<grid, kMuonThreads, 0, stream>>>(g.params, g.master, ws.x[0], g.tall, m, n, a,
                                                             shard.params_begin, shard.params_end);
  cudaCheckLaunch();
}

// ============================================================================
// 10. Model
// ============================================================================
// Parameters follow llmc/gpt2.h's table (one flat buffer; the checkpoint layout). Activations
// are described by the table below, from which sizes and offsets are derived. Gradients of the
// parameters live in a second flat buffer with the same offsets and accumulate over micro steps.
// With ZeRO stage 1 the flat buffer is cut into equal shards, one per rank: a rank keeps AdamW's
// moments and the master weights of its shard only and updates only that part of the parameters.

enum ActIndex {
  kEmbedded, kEmbRstd, kEncoded, kLn1, kLn1Mean, kLn1Rstd, kQkvNormed, kQkRstd, kQkvr, kAtt, kAtty,
  kResidual2, kLn2, kLn2Mean, kLn2Rstd, kFch, kFchAct, kResidual3, kLnf, kLnfMean, kLnfRstd,
  kLosses, kOutput, kMixed, kVPre, kGates, kGated, kTokenEmbedded, kSmearGates, kBigramEmbedded,
  kStreamStart, kAttentionOut, kMlpOut, kXsaOut, kMuddHiddenPre, kMuddHidden, kMuddPreScale, kMuddGates,
  kMuddWeights, kMuddSkipScale, kComposedOut, kComposedLse, kComposedRowDots, kMuddStream, kMuddValueTerms,
  kMuddFinalMix, kMuddVe0, kNumActTensors
};

struct ActSpec {
  const char* name;
  size_t count;   // elements of one buffer
  size_t layers;  // buffers: L, one a layer, or 1 (a tensor outside the layers, or one layer's reused)
  bool fp32;      // float, else floatX
  size_t bytes() const { return count * layers * (fp32 ? 4 : sizeof(floatX)); }
};

// What a block feature's activation rows are sized by: L layers, C channels, NH heads, BT tokens;
// act_per_layer: whether the activations the backward can recompute are kept (activation_table).
struct ActDims {
  size_t L, C, NH, BT;
  bool act_per_layer;
};

// Each block feature's group (section 10, "Block features") defines these; the activation table,
// the scratch and the attention's backward, earlier in this section, read them.
struct GPT2;
void residual_mix_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void residual_mix_allocate_scratch(GPT2& m, size_t N);
void value_mix_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void attention_gate_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void smear_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void bigram_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void bigram_allocate_scratch(GPT2& m, size_t N);
void sublayer_lambdas_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void sublayer_lambdas_allocate_scratch(GPT2& m, size_t N);
void xsa_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void composed_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void mudd_gates_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void mudd_gates_allocate_scratch(GPT2& m, size_t N);
void mudd_connections_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]);
void mudd_connections_allocate_scratch(GPT2& m, size_t N);
struct Activations;
void bigram_allocate_rows(Activations& a, const llmc::ArchSpec& arch, size_t N);
size_t attention_gate_partials(const GPT2& m, size_t N);
size_t value_mix_partials(const GPT2& m);
size_t xsa_partials(const GPT2& m);
bool gates_take_row_dots(const GPT2& m, int l);
// The smear's rows: the embedding before it and each row's gate; context: rows before the first
// that the smear reads (decoding: the token before's; training: none).
struct SmearRows {
  floatX* token_embedded = nullptr;
  float* gates = nullptr;
  int context = 0;
};
const floatX* smear_embedding(GPT2& m, floatX* embedded, const int* tokens, int N, const SmearRows& s);
const floatX* smear_embedding_backward(GPT2& m, const floatX* dembedded, int N, uint32_t seed);

// The attention's pairs of positions of B rows of T tokens (the GEMM path's T x T scores a head): with
// record #89's paired heads, its paired layers' half the heads over twice the positions take twice.
size_t attention_score_count(const llmc::GPT2Config& c, size_t B, size_t T) {
  return B * c.num_heads * T * T * (c.paired_heads ? 2 : 1);
}

// act_per_layer false: one layer's worth of the MLP activation's outputs (GELU's or ReLU^2's) is
// kept, since the backward pass does not read them: it recomputes them (-r 1), or reads the FP8
// layers' transposed casts instead.
// ln_per_layer false (FP8): likewise the norms' outputs ln1 and ln2, which only the FP8 casts read
// (the norms' backward reads the layer's input and statistics).
// With flash attention, qkvr keeps qkv as the matmul wrote it and att holds only the FP32
// logsumexp of each row; otherwise qkvr is q, k, v permuted and att the T x T probabilities.
// A tensor the architecture's switches leave out has count 0: the embedding before its norm and
// that norm's rstd (embedding_norm), the norms' means (LayerNorm's, not RMSNorm's), the QK-norm's
// rstd of each head's q and k, and without flash attention the normalised and rotated qkv, which
// the permuted copy in qkvr cannot give back (qk_norm_rotary); and the rows of the block features
// the architecture has not (each group's *_activation_rows sizes its own).
void activation_table(const llmc::GPT2Config& c, int B, int T, bool act_per_layer, bool ln_per_layer,
                      ActSpec t[kNumActTensors]) {
  const size_t L = c.num_layers, C = c.channels, NH = c.num_heads, BT = (size_t)B * T;
  const ActDims dims = {L, C, NH, BT, act_per_layer};
  const bool flash = attention_flash_supported(c.channels / c.num_heads);
  const llmc::ArchSpec arch = llmc::arch_spec(c);
  const size_t embedding_norm = arch.embedding_norm ? 1 : 0, means = arch.rms_norm ? 0 : 1;
  const size_t qk = arch.qk_norm_rotary ? 1 : 0;
  const ActSpec table[kNumActTensors] = {
      {"embedded", embedding_norm * BT * C, 1, false},
      {"emb_rstd", embedding_norm * BT, 1, true},
      {"encoded", BT * C, 1, false},
      {"ln1", BT * C, ln_per_layer ? L : 1, false},
      {"ln1_mean", means * BT, L, true},
      {"ln1_rstd", BT, L, true},
      {"qkv_normed", (flash ? 0 : qk) * 3 * BT * C, L, false},
      {"qk_rstd", qk * 2 * NH * BT, L, true},
      {"qkvr", 3 * BT * C, L, false},
      {flash ? "att_lse" : "att", flash ? B * NH * T : attention_score_count(c, B, T), L, flash},
      {"atty", BT * C, L, false},
      {"residual2", BT * C, L, false},
      {"ln2", BT * C, ln_per_layer ? L : 1, false},
      {"ln2_mean", means * BT, L, true},
      {"ln2_rstd", BT, L, true},
      {"fch", BT * 4 * C, L, false},
      {"fch_act", BT * 4 * C, act_per_layer ? L : 1, false},
      {"residual3", BT * C, L, false},
      {"lnf", BT * C, 1, false},
      {"lnf_mean", means * BT, 1, true},
      {"lnf_rstd", BT, 1, true},
      {"losses", BT, 1, true},
      {"output", BT * c.padded_vocab_size, 1, false},
      // The block features' rows, which their groups size (section 10, "Block features").
      {"mixed", 0, L, false},
      {"v_pre", 0, L, false},
      {"gates", 0, L, true},
      {"gated", 0, L, false},
      {"token_embedded", 0, 1, false},
      {"smear_gates", 0, 1, true},
      {"bigram_embedded", 0, 1, false},
      {"stream_start", 0, 1, false},
      {"attention_out", 0, L, false},
      {"mlp_out", 0, L, false},
      {"xsa_out", 0, 1, false},
      {"mudd_hidden_pre", 0, 1, false},
      {"mudd_hidden", 0, 1, false},
      {"mudd_pre_scale", 0, 1, false},
      {"mudd_gates", 0, 1, false},
      {"mudd_weights", 0, 1, false},
      {"mudd_skip_scale", 0, 1, false},
      {"composed_out", 0, 1, false},
      {"composed_lse", 0, 1, true},
      {"composed_row_dots", 0, 1, true},
      {"mudd_stream", 0, 1, false},
      {"mudd_value_terms", 0, 1, false},
      {"mudd_final_mix", 0, 1, false},
      {"mudd_ve0", 0, 1, false},
  };
  for (int i = 0; i < kNumActTensors; i++) t[i] = table[i];
  residual_mix_activation_rows(arch, dims, t);
  value_mix_activation_rows(arch, dims, t);
  attention_gate_activation_rows(arch, dims, t);
  smear_activation_rows(arch, dims, t);
  bigram_activation_rows(arch, dims, t);
  sublayer_lambdas_activation_rows(arch, dims, t);
  xsa_activation_rows(arch, dims, t);
  mudd_gates_activation_rows(arch, dims, t);
  mudd_connections_activation_rows(arch, dims, t);
  composed_activation_rows(arch, dims, t);
}

// The four linear layers of a block: weight and bias tensors, input and output widths in units of C.
enum BlockLinear { kLinearQkv, kLinearAttproj, kLinearFc, kLinearFcproj, kNumBlockLinears };
struct LinearSpec {
  int weight, bias, in, out;
};
constexpr LinearSpec kBlockLinears[kNumBlockLinears] = {
    {llmc::kQkvw, llmc::kQkvb, 1, 3},
    {llmc::kAttprojw, llmc::kAttprojb, 1, 1},
    {llmc::kFcw, llmc::kFcb, 1, 4},
    {llmc::kFcprojw, llmc::kFcprojb, 4, 1},
};
constexpr int kBlockInputWidths = 7;  // the four layers' input widths in units of C: 1 + 1 + 1 + 4

// The model's state in four owners, each allocated by its own function: the parameters (and their
// gradients), the optimizer's state, the passes' activations and scratch, and the FP8 layers'
// state. GPT2 is the four together; a function that needs one owner alone takes that one.

// The parameters and their gradients: gpt2_allocate_params.
struct ModelParams {
  llmc::GPT2Config config;
  llmc::ArchSpec arch() const { return llmc::arch_spec(config); }
  llmc::LogitCap logit_cap;  // the head's: the architecture's, or -lc's (llmc::logit_cap_of)
  llmc::LayerPlan plan;  // what each layer does (llmc::layer_plan)
  // The attention's rotary frequencies and layout (rotary_frequencies) and softmax scale: model
  // state, which YaRN changes at the stage plan's window changes from the base scale (the
  // architecture's, or -asc's: gpt2_set_attention_scale).
  RotaryFrequencies rotary = {};
  float softmax_scale = 0.0f;
  double base_softmax_scale = 0.0;
  llmc::ParamSpec param_specs[llmc::kNumParamTensors];
  size_t param_offsets[llmc::kNumParamTensors];
  size_t num_params = 0;
  floatX* params = nullptr;
  floatX* grads = nullptr;
  // The encoder's part of wte's gradient accumulates here over the micro steps and is added to
  // grads once, on the last one: with a tied head (GPT-2) wte's gradient has a second
  // contribution, the head's, each micro step, and so k micro steps of a batch sum in the same
  // order as one step of k times the batch.
  floatX* wte_grad_encoder = nullptr;
  // The bigram embedding's fixed sign table [llmc::kBigramSignRows, C] (ArchSpec::bigram; not a
  // parameter: llmc::bigram_sign_table).
  floatX* bigram_signs = nullptr;
  // Record #89's gated skip's scale sigmoid(skip_lambda) g, one value, as the forward computes it for
  // the backward (gated_skip_norm); where the plan has the skip.
  floatX* skip_scale = nullptr;
  // Record #89's attention lambdas (ArchSpec::attn_lambdas): each attention layer's qkvw and attprojw
  // scaled by its lambdas, [attention layers][4C x C] (attention_lambdas_forward), the weights its
  // products read (linear_weight).
  floatX* scaled_attention_weights = nullptr;
  // The optimizer's shard [shard_offset, shard_offset + shard_size): everything without ZeRO.
  // params and grads hold num_params_padded = shard_size * shard_count elements (zeros past
  // num_params), so that every shard has the same length for NCCL's reduce-scatter / all-gather.
  int shard_count = 1;
  size_t shard_offset = 0, shard_size = 0, num_params_padded = 0;
  llmc::Rng rng{0};  // seeds for stochastic rounding
  size_t param_bytes = 0;  // on the GPU

  // Tensor i's slab of `layer` (llmc::param_slab; the tensor itself where it is not per layer).
  floatX* param(int i, int layer = 0) {
    const llmc::ParamSpec& s = param_specs[i];
    const int slab = llmc::param_slab(plan, s, layer);
    REQUIRE(slab >= 0, "param: layer %d has no %s (a layer without attention)", layer, s.name);
    return params + param_offsets[i] + slab * llmc::param_slab_size(plan, s);
  }
  floatX* grad(int i, int layer = 0) { return grads + (param(i, layer) - params); }
  // Tensor i of layer l, or nullptr where the architecture leaves it out (a bias, a gain).
  floatX* param_or_null(int i, int layer = 0) { return param_specs[i].size ? param(i, layer) : nullptr; }
  floatX* grad_or_null(int i, int layer = 0) { return param_specs[i].size ? grad(i, layer) : nullptr; }
};

// The optimizer's state of this process's shard (StateLayout): gpt2_allocate_optimizer_state.
struct OptimizerState {
  bool muon = false;  // Muon updates the blocks' matrices (muon_updates)
  StateLayout state_layout;
  OptimizerArrays state;
  // Where the next update puts the state instead of in place (set by a checkpoint that keeps the
  // current arrays for its writer, section 12); the model then goes on with those arrays.
  OptimizerArrays state_next;
  bool use_master_weights = true;
  int optimizer_steps = 0;
  // AdamW's updates so far, the step of its bias correction (optimizer_steps unless -ao K > 1), and
  // whether its tensors' gradients are kept for its next update (-ao: gpt2_zero_grad leaves them).
  int adamw_updates = 0;
  bool adamw_grads_kept = false;
  int adamw_every = 1;  // -ao, the run's: gpt2_update's table must agree; in the state files
  // The embedding tied to the head through this step's update (-ut; -1: never): gpt2_update.
  long untie_step = -1;
  int muon_qk_heads = 0;  // -mq: Muon's Q and K in blocks of this many heads (muon_matrix_rows; 0: whole)
  // Muon (-opt muon; gpt2_muon_groups): the blocks' matrices in groups of one wide shape, their
  // pointers made for the state arrays muon_state_for (the arrays move after a checkpoint), and
  // the scratch of the orthogonalisation.
  std::vector<MuonGroup> muon_groups;
  std::vector<size_t> muon_offsets;  // each group's matrices' first elements, group after group
  // -oc 2: the events after which the other processes' new Muon matrices have landed in params ([0]
  // those of no layer, [1 + l] layer l's; OptimizerSpread::share_behind), which the next forward waits
  // for as it reaches each part (gpt2_await_params) and any other reader of the parameters for all at
  // once (gpt2_settle_params); null when no copy is pending.
  const std::vector<cudaEvent_t>* params_arriving = nullptr;
  void* muon_pointers = nullptr;     // the groups' device arrays of pointers, multipliers and tall flags
  OptimizerArrays muon_state_for;
  MuonWorkspace muon_workspace;
  size_t state_bytes = 0;  // on the GPU, the workspace left out
};

// The activations and the passes' scratch, sized for B x T tokens: gpt2_allocate_activations and
// gpt2_allocate_scratch.
struct Activations {
  int B = 0, T = 0, recompute = 0;
  ActSpec act_specs[kNumActTensors];
  char* act_memory = nullptr;
  void* acts[kNumActTensors];
  size_t act_layer_stride[kNumActTensors];  // elements between layers; 0 for single tensors

  floatX* scratch_btc = nullptr;     // B*T*C: attention y, projection outputs, dln, datty
  floatX* scratch_bt4c = nullptr;    // B*T*4C: qkv in the forward pass, dfch / dqkv backward
  floatX* dresidual = nullptr;       // B*T*C residual-stream gradient
  bool flash_attention = false;      // attention_flash_supported(head size)
  bool evaluation_only = false;      // a forward pass's own (validation at -vt): BF16 products with -fp8
  floatX* scratch_att = nullptr;     // B*NH*T*T: preatt forward, datt backward (GEMM attention)
  floatX* scratch_dqkvr = nullptr;   // 4*B*T*C: dq, dk, dv, dy (GEMM attention)
  float* attention_dot = nullptr;    // B*NH*T: rowwise dout.out (flash attention)
  floatX* attention_ds = nullptr;    // the flash backward's dS tiles (the windowed one's with -pd 1)
  // Where the plan has key offsets (-ko 1): the shift's scratch [B*T, C] and each layer's last key's
  // stationary dims [L, C/2] (key_offset_forward's tail).
  floatX* key_offset_scratch = nullptr;
  floatX* key_offset_tails = nullptr;
  // The speedrun's backward (x0_lambdas, the plan's skips): the gradient of x0 the blocks' mixes add
  // up, and of each of the U-net's kept outputs (LayerPlan::kept_outputs of them, [B*T*C] each).
  floatX* dx0 = nullptr;
  floatX* dkept = nullptr;
  float* partials = nullptr;         // column-reduction partials (gpt2_allocate)
  float* norm_partials = nullptr;    // kNormBlocks + 1 (the last is the result)
  int* inputs = nullptr;
  int* targets = nullptr;
  float* losses_host = nullptr;      // pinned, B*T: gpt2_classifier's
  // The host halves of the uploads (section 1): the last forward's inputs (the backward's encoder
  // plan is made of them), the targets, and the plan's buckets and positions.
  UploadStaging inputs_staging, targets_staging, plan_buckets_staging, plan_positions_staging;
  EncoderBackwardPlan encoder_plan;  // the last backward's, on the GPU
  // The bigram embedding (ArchSpec::bigram): each token's table row, then its sign row, [2 B*T] on
  // the GPU and pinned on the host (the last forward's: the backward's plan of the table is made of
  // them); that plan and its uploads; the gradient of the embedding that the layers' gates add up.
  int* bigram_rows = nullptr;
  UploadStaging bigram_rows_staging, bigram_plan_buckets_staging, bigram_plan_positions_staging;
  EncoderBackwardPlan bigram_plan;
  floatX* dbigram = nullptr;
  // Record #89's residual lambdas (ArchSpec::resid_lambdas): the gradient of the sublayer's output
  // p dy, which its product's backward reads [B*T*C].
  floatX* dsublayer = nullptr;
  // Record #89's MUDD gate generators (ArchSpec::mudd_gates): the gradient of their rows [2][B*T,
  // llmc::kMuddGateStride], which the gates' backward writes (the pre generator's first), and the
  // backward's scratch: the rows' gradient before the scale [B*T, stride], the hidden layer's [B*T, 64],
  // and a weight's gradient, 16-byte aligned for the products [64, C].
  floatX* dmudd_gates = nullptr;
  floatX* mudd_dpre = nullptr;
  floatX* mudd_dhidden = nullptr;
  floatX* mudd_dweight = nullptr;
  // Record #89's MUDD dense connections (ArchSpec::mudd_connections): the gradients [B*T, C] of the rows
  // they mix that no block's gradient holds when they join (in0's, out9's), and of the value embedding
  // ve0's rows; and the value terms' gradient (its scratch).
  floatX* dmudd_in0 = nullptr;
  floatX* dmudd_out9 = nullptr;
  floatX* dmudd_ve0 = nullptr;
  floatX* dmudd_value_terms = nullptr;
  size_t act_bytes = 0;  // on the GPU, activations and scratch

  floatX* act(int i, int layer = 0) { return (floatX*)acts[i] + layer * act_layer_stride[i]; }
  float* act_f(int i, int layer = 0) { return (float*)acts[i] + layer * act_layer_stride[i]; }
};

// -fp8 1 or 2 (gpt2_allocate_fp8): the blocks' linear layers run FP8 products (section 5). The
// weights are cast by the first forward pass after the parameters change (gpt2_init, gpt2_update;
// with ZeRO that is after the all-gather that follows the update), with current scaling. The
// inputs and output gradients: current scaling with -fp8 1; delayed with -fp8 2, once the history
// holds a step (gpt2_fp8_end_step), current before. Decoding (section 11) and a forward pass in
// activations of its own (validation at -vt) stay BF16, as the FP8 head's evaluation does.
struct Fp8State {
  bool fp8 = false;
  bool fp8_delayed = false;
  Fp8Format fp8_grad_format = Fp8Format::kE5M2;  // the output gradients' (-fp8g)
  bool fp8_weights_stale = true;
  int fp8_recorded_steps = 0;        // delayed scaling: steps whose amaxes the history holds
  int fp8_layers = 0;                // the model's layers
  int fp8_channels = 0;              // the model's channels
  uint8_t* fp8_weights = nullptr;    // per layer, per linear: w8 [OC, C], then w8t [C, OC]
  Fp8Scale* fp8_scales = nullptr;    // per layer, per linear: the weight's
  Fp8Scale* fp8_act_scales = nullptr;  // per layer, per linear: the input's, the output gradient's
  uint32_t* fp8_history = nullptr;     // delayed scaling: kFp8History x fp8_act_scale_count()
  uint8_t* fp8_inputs_t = nullptr;  // per layer, per linear: the forward's input cast, transposed
  size_t fp8_tokens_t = 0;          // the transposes' row length: fp8_padded(B * T)
  Fp8Buffers fp8_buffers;
  // -fh 1 (gpt2_allocate_fp8_head): the head's FP8 layer with fixed scales (section 5) in the
  // training passes (ForwardPass::kTraining); evaluation and decoding take its BF16 product. Its
  // weight is cast with the blocks' (fp8_weights_stale).
  bool fp8_head = false;
  llmc::Fp8HeadScales fp8_head_setting;   // -fhs (StateSpec::fp8_head), also without -fh 1
  Fp8Weight fp8_head_weight = {};         // w8 [Vp, C], w8t [C, Vp]; its scale fp8_head_scales + 1
  Fp8Scale* fp8_head_scales = nullptr;    // fixed: x_s, w_s, grad_s
  uint8_t* fp8_head_input_t = nullptr;    // [C, fp8_padded(B * T)]: the forward's cast, transposed
  Fp8Buffers fp8_head_buffers;            // rows [B * T, Vp] (the forward's input cast [B * T, C]
                                          // too), dout_t [Vp, fp8_padded(B * T)]
  float* fp8_head_dweight = nullptr;      // [Vp, C]: the weight gradient's FP32 product
  int fp8_head_tokens = 0;                // the last forward's rows if it cast the head's input
  // -fm 1 (gpt2_allocate_fp8_mlp): record #89's FP8 MLP in the training passes (section 5); its
  // weights are cast with the blocks' (fp8_weights_stale), W2 under its own scale while
  // fp8_mlp_bootstrap (the updates of steps 0..15, and before the first).
  bool fp8_mlp = false;
  bool fp8_mlp_bootstrap = true;
  bool fp8_mlp_pass = false;              // the forward running is a training pass (gpt2_forward)
  Fp8Mlp fp8_mlp_state;
  size_t fp8_bytes = 0;  // on the GPU

  Fp8Weight fp8_weight(int linear, int layer) {
    const size_t C2 = (size_t)fp8_channels * fp8_channels;
    size_t offset = (size_t)layer * 2 * 12 * C2;  // the four weights hold 12 C^2 values
    for (int i = 0; i < linear; i++) offset += 2 * kBlockLinears[i].in * kBlockLinears[i].out * C2;
    const size_t size = kBlockLinears[linear].in * kBlockLinears[linear].out * C2;
    Fp8Scale* scale = fp8_scales + (size_t)layer * kNumBlockLinears + linear;
    return {fp8_weights + offset, fp8_weights + offset + size, scale};
  }
  // [C_in, fp8_tokens_t]: written by the linear layer's forward, read by its backward.
  uint8_t* fp8_input_t(int linear, int layer) {
    size_t rows = (size_t)layer * kBlockInputWidths;  // in units of C
    for (int i = 0; i < linear; i++) rows += kBlockLinears[i].in;
    return fp8_inputs_t + rows * fp8_channels * fp8_tokens_t;
  }
  int fp8_act_scale_count() const { return fp8_layers * kNumBlockLinears * 2; }
  Fp8Scale* fp8_input_scale(int linear, int layer) {
    return fp8_act_scales + ((size_t)layer * kNumBlockLinears + linear) * 2;
  }
  Fp8Scale* fp8_dout_scale(int linear, int layer) { return fp8_input_scale(linear, layer) + 1; }
  Fp8Scaling fp8_scaling() const {
    if (!fp8_delayed) return Fp8Scaling::kCurrent;
    return fp8_recorded_steps > 0 ? Fp8Scaling::kDelayed : Fp8Scaling::kCurrentStepMax;
  }
};

// -pd 1 (gpt2_allocate_documents): attention within each row's documents (token 50256 opens each)
// and each layer's window of 128-token blocks (layer_window). Each forward makes the mask's
// metadata of its rows from their tokens on the host, in pinned buffers, and copies it to the GPU
// on the model's stream; the backward reads the same.
struct DocumentAttention {
  bool documents = false;
  llmc::StepWindows windows;  // of the passes to come (gpt2_set_window; long 0: none)
  int max_window_blocks = 0;  // the largest the scratch was sized for (0: none)
  llmc::WindowUnit window_unit = llmc::WindowUnit::kBlocks;  // -awt: whole blocks, or blocks x 128 tokens
  llmc::AttentionBlockSpan* spans = nullptr;       // [B, T / 128]: each query block's
  int* document_ids = nullptr;                     // [B, T]: each token's (llmc::document_ids)
  // With record #89's paired heads the same of the rows doubled, [B, 2T / 128] and [B, 2T], after
  // them in the same buffers (documents_upload; 3 B T tokens' room: document_tokens).
  llmc::AttentionBlockSpan* paired_spans = nullptr;
  int* paired_document_ids = nullptr;
  UploadStaging spans_staging, document_ids_staging;  // their host halves (section 1)
  size_t capacity = 0;                                // the tokens the buffers hold
};

// The tokens the mask's metadata of B x T = BT tokens takes: with paired heads also their rows doubled.
size_t document_tokens(const llmc::GPT2Config& c, size_t BT) { return c.paired_heads ? 3 * BT : BT; }

void document_buffers_free(DocumentAttention& d) {
  device_free(d.spans);
  device_free(d.document_ids);
  upload_staging_free(d.spans_staging);
  upload_staging_free(d.document_ids_staging);
  d.spans = nullptr;
  d.document_ids = nullptr;
  d.paired_spans = nullptr;
  d.paired_document_ids = nullptr;
  d.capacity = 0;
}

struct GPT2 : ModelParams, OptimizerState, Activations, Fp8State, DocumentAttention {
  cudaStream_t stream = 0;  // every pass's and the update's
  // The training loss's terms (gpt2_set_loss_weights; each call's rows give the sequence length) and
  // their prefix table on the GPU (gpt2_set_prefix_table; none without a prefix term).
  ClassifierTerms loss_terms;
  int* prefix_table = nullptr;
  // Validation's forward pass at another B x T than the training passes' (gpt2_allocate_validation);
  // else empty.
  Activations forward_only;
  // -mr 1 (record #89's MLP backward): ReLU^2's derivative from its kept output, so the fc product
  // (the pre-activation) is not kept (kFch one layer's scratch, gpt2_allocate_activations).
  bool mlp_from_output = false;
};

// Which tensors Muon updates with -opt muon: the blocks' matrices. AdamW updates the rest.
inline bool muon_updates(const llmc::ParamSpec& spec) { return spec.role == llmc::ParamRole::kMatrix; }

// The optimizer state of this process's shard of p's parameters, zeroed (StateLayout): AdamW's
// moments, Muon's momentum where muon, NorMuon's second moments where normuon, and the FP32
// master weights where the parameters are stored in BF16 and master_weights asks for them.
void gpt2_allocate_optimizer_state(OptimizerState& o, const ModelParams& p, bool master_weights, bool muon,
                                   bool normuon) {
  size_t sizes[llmc::kNumParamTensors];
  bool by_muon[llmc::kNumParamTensors];
  for (int i = 0; i < llmc::kNumParamTensors; i++) {
    sizes[i] = p.param_specs[i].size;
    by_muon[i] = muon && muon_updates(p.param_specs[i]);
  }
  o.state_layout = state_layout(llmc::kNumParamTensors, p.param_offsets, sizes, by_muon, p.shard_offset,
                                p.shard_size);
  if (normuon) o.state_layout.second_moment_size = o.state_layout.muon_size;
  o.muon = muon;
  o.use_master_weights = master_weights && sizeof(floatX) < sizeof(float);
  optimizer_arrays_alloc(&o.state, o.state_layout, o.use_master_weights);
}

// Fails for a model (from `where`) with a feature of its file's layout that this trainer does not run:
// record #89's MUDD dense connections without its gate generators (this trainer runs them on their rows).
void require_runnable_features(const llmc::GPT2Config& config, const std::string& where) {
  REQUIRE(!config.mudd_connections || config.mudd_gates, "%s holds a model with record #89's MUDD dense connections "
          "(header slot %d's bit %d) but not its MUDD gate generators, which this trainer runs them with: "
          "train_gpt2.py --mudd_connections 1 runs it", where.c_str(), llmc::kFeaturesSlot,
          llmc::kFeatureMuddConnections);
}

// The parameters and gradients of config, zeroed. shard_count > 1: ZeRO stage 1, this process
// keeps the optimizer state of shard shard_rank only.
void gpt2_allocate_params(ModelParams& m, const llmc::GPT2Config& config, uint64_t seed, int shard_rank,
                          int shard_count) {
  require_runnable_features(config, "the model");
  m.config = config;
  m.plan = llmc::layer_plan(config);
  m.logit_cap = llmc::arch_spec(config.arch).logit_cap;
  const llmc::ArchSpec arch = llmc::arch_spec(config);
  const int HS = config.head_size();
  if (arch.qk_norm_rotary && HS <= kQkNormMaxHeadSize) m.rotary = rotary_frequencies(HS, arch.rotary_pairs);
  m.base_softmax_scale = arch.attention_scale > 0.0f ? arch.attention_scale : attention_default_scale(HS);
  m.softmax_scale = (float)m.base_softmax_scale;
  llmc::param_table(config, m.param_specs);
  llmc::param_offsets(config, m.param_offsets);
  m.num_params = llmc::num_parameters(config);
  REQUIRE(config.channels % 64 == 0 || config.channels % 8 == 0,
          "model channels %d must be a multiple of 8", config.channels);
  // bigram_forward's gather and the encoder's backward into its gradient move 16-byte pieces of rows.
  REQUIRE(m.param_offsets[llmc::kBigram] % 16 == 0,
          "the bigram table's offset %zu in the parameters is not a multiple of 16 elements: its rows' "
          "16-byte loads would be misaligned (llmc::param_table's order places it)",
          m.param_offsets[llmc::kBigram]);
  m.shard_count = shard_count;
  const llmc::ZeroShard shard = llmc::zero_shard(m.num_params, shard_count, shard_rank);
  m.shard_size = shard.size;
  m.shard_offset = shard.offset;
  m.num_params_padded = m.shard_size * shard_count;
  m.params = device_alloc<floatX>(m.num_params_padded, "the parameters");
  m.grads = device_alloc<floatX>(m.num_params_padded, "the gradients");
  m.wte_grad_encoder = device_alloc<floatX>(m.param_specs[llmc::kWte].size, "the encoder's wte gradient");
  cudaCheck(cudaMemset(m.params, 0, m.num_params_padded * sizeof(floatX)));
  cudaCheck(cudaMemset(m.grads, 0, m.num_params_padded * sizeof(floatX)));
  cudaCheck(cudaMemset(m.wte_grad_encoder, 0, m.param_specs[llmc::kWte].size * sizeof(floatX)));
  if (m.arch().bigram) {
    const std::vector<float> signs = llmc::bigram_sign_table(config.channels);
    const std::vector<floatX> stored(signs.begin(), signs.end());
    m.bigram_signs = device_alloc<floatX>(stored.size(), "the bigram embedding's sign table");
    cudaCheck(cudaMemcpy(m.bigram_signs, stored.data(), stored.size() * sizeof(floatX), cudaMemcpyHostToDevice));
  }
  if (m.param_specs[llmc::kSkipGate].size > 0) m.skip_scale = device_alloc<floatX>(1, "the gated skip's scale");
  if (m.arch().attn_lambdas) {
    const size_t C = config.channels;
    m.scaled_attention_weights = device_alloc<floatX>(m.plan.attention_layers * 4 * C * C,
                                                      "the attention's weights scaled by its lambdas");
  }
  m.rng.seed(seed);
}

// What the optimizer state holds: the FP32 master weights (BF16 builds), and Muon's momentum for
// the matrices Muon updates (-opt muon; gpt2_update then needs an llmc::OptimizerTable with Muon's row).
struct StateSpec {
  bool master_weights = true;
  bool muon = false;
  bool normuon = false;  // NorMuon's second moments (-mn 1)
  // The FP8 head's scales (-fhs), whose w_s the head's BF16 copies keep (fp8_head_weight_copy)
  // wherever the architecture could take the FP8 head.
  llmc::Fp8HeadScales fp8_head;
};

// The parameters, zeroed, and the optimizer state of spec.
void gpt2_allocate_model(GPT2& m, const llmc::GPT2Config& config, StateSpec spec, uint64_t seed,
                         int shard_rank, int shard_count) {
  m.fp8_head_setting = spec.fp8_head;
  m.param_bytes = device_bytes_of([&] { gpt2_allocate_params(m, config, seed, shard_rank, shard_count); });
  m.state_bytes = device_bytes_of(
      [&] { gpt2_allocate_optimizer_state(m, m, spec.master_weights, spec.muon, spec.normuon); });
}

// Parameters from FP32 values (a checkpoint or a seeded initialisation): rounded to the storage
// type, and this shard's master weights the values themselves.
void gpt2_init(GPT2& m, const llmc::GPT2Config& config, const std::vector<float>& values, StateSpec spec,
               uint64_t seed, int shard_rank = 0, int shard_count = 1) {
  REQUIRE(values.size() == llmc::num_parameters(config), "gpt2_init: %zu values for %zu parameters",
          values.size(), llmc::num_parameters(config));
  gpt2_allocate_model(m, config, spec, seed, shard_rank, shard_count);
  std::unique_ptr<floatX[]> converted(new floatX[m.num_params]);  // not zero-filled first
  float_to_floatX(converted.get(), values.data(), m.num_params);
  if (fp8_head_support(m.arch())) {
    const size_t head = m.param_offsets[llmc::kHeadw], n = m.param_specs[llmc::kHeadw].size;
    const float to_fp8 = fp8_head_weight_factor(m.fp8_head_setting);
    for (size_t i = head; i < head + n; i++) converted[i] = fp8_head_weight_copy(converted[i], values[i], to_fp8);
  }
  copy_pageable(m.params, converted.get(), m.num_params * sizeof(floatX), cudaMemcpyHostToDevice, m.stream);
  if (m.state.master) {
    const llmc::ZeroShard shard = llmc::zero_shard(m.num_params, shard_count, shard_rank);
    copy_pageable(m.state.master, values.data() + shard.offset, shard.real * sizeof(float),
                  cudaMemcpyHostToDevice, m.stream);
  }
}

// Parameters as a checkpoint of this build stores them (a BF16 build's bits, an FP32 build's
// values), uploaded as they are: -y 1, whose state file holds the master weights (load_state),
// so none are uploaded here only to be overwritten (at d48, 6.2 GB), and the parameters take no
// round trip through FP32 values.
void gpt2_init_stored(GPT2& m, const llmc::GPT2Config& config, const floatX* stored, StateSpec spec,
                      uint64_t seed, int shard_rank, int shard_count) {
  gpt2_allocate_model(m, config, spec, seed, shard_rank, shard_count);
  copy_pageable(m.params, stored, m.num_params * sizeof(floatX), cudaMemcpyHostToDevice, m.stream);
}

// The tensors of a.act_specs in one block of memory.
void activations_layout(Activations& a) {
  size_t bytes = 0;
  for (int i = 0; i < kNumActTensors; i++) {
    bytes += llmc::round_up(a.act_specs[i].bytes(), 256);
  }
  a.act_memory = device_alloc<char>(bytes, "the activations");
  size_t offset = 0;
  for (int i = 0; i < kNumActTensors; i++) {
    a.acts[i] = a.act_memory + offset;
    a.act_layer_stride[i] = a.act_specs[i].layers > 1 ? a.act_specs[i].count : 0;
    offset += llmc::round_up(a.act_specs[i].bytes(), 256);
  }
}

// The activations of B x T tokens, laid out by activation_table.
void gpt2_allocate_activations(GPT2& m, int B, int T, int recompute, int fp8) {
  const bool act_per_layer = recompute == 0 && fp8 == 0, ln_per_layer = fp8 == 0;
  activation_table(m.config, B, T, act_per_layer, ln_per_layer, m.act_specs);
  if (m.mlp_from_output) m.act_specs[kFch].layers = 1;  // the fc product where a pass reads it back
  activations_layout(m);
}

// The attention of a run: causal, or within documents (-pd 1) and a window whose largest long
// window over the run (llmc::StagePlan::max_window; 0: none), which no short one is wider than,
// sizes the windowed backward's scratch; its blocks masked whole or counted in tokens (-awt 1).
struct AttentionSpec {
  bool documents = false;
  int max_window_blocks = 0;
  llmc::WindowUnit window_unit = llmc::WindowUnit::kBlocks;
};

// The blocks of the widest window any layer takes with `spec` at sequence length T: no window is
// every block, and a window of more blocks than T holds selects what one of T's blocks does.
int attention_widest_window(const AttentionSpec& spec, int T) {
  const int blocks = T / llmc::kAttentionBlock;
  return spec.max_window_blocks == 0 ? blocks : std::min(spec.max_window_blocks, blocks);
}

// The flash backward's dS scratch for sequences of T positions of NH heads (its widest window of T's).
size_t attention_ds_count(int B, int T, int NH, const AttentionSpec& attention) {
  if (!attention.documents) return attention_flash_ds_count(B, T, NH);
  const llmc::AttentionWindow widest =
      llmc::AttentionWindow::of_blocks(attention_widest_window(attention, T), attention.window_unit);
  return attention_window_ds_count(B, T, NH, widest);
}

// The passes' scratch of B x T tokens: the buffers the layers reuse, the attention's, the
// column-reduction partials, the inputs and targets and the encoder backward's plan.
void gpt2_allocate_scratch(GPT2& m, int B, int T, int fp8, const AttentionSpec& attention) {
  const llmc::GPT2Config& c = m.config;
  const size_t BT = (size_t)B * T, C = c.channels;
  m.scratch_btc = device_alloc<floatX>(BT * C, "a B*T*C scratch buffer");
  m.scratch_bt4c = device_alloc<floatX>(BT * 4 * C, "a B*T*4C scratch buffer");
  m.dresidual = device_alloc<floatX>(BT * C, "the residual gradient");
  m.flash_attention = attention_flash_supported(C / c.num_heads);
  if (m.flash_attention) {
    m.attention_dot = device_alloc<float>((size_t)B * c.num_heads * T, "the attention gradient scratch");
    size_t ds_count = attention_ds_count(B, T, c.num_heads, attention);
    if (c.paired_heads) ds_count = std::max(ds_count, attention_ds_count(B, 2 * T, c.num_heads / 2, attention));
    m.attention_ds = device_alloc<floatX>(ds_count, "the attention score-gradient scratch");
  } else {
    m.scratch_att = device_alloc<floatX>(attention_score_count(c, B, T), "the attention scratch");
    m.scratch_dqkvr = device_alloc<floatX>(4 * BT * C, "the attention gradient scratch");
  }
  // Column sums of up to 4C columns in kRowBlocks blocks, or in the FP8 casts' tiles of 128 rows
  // (the fc bias gradient with GELU' in the cast), or the flash backward's dqkv tile sums.
  // An untied head's bias gradient sums Vp columns.
  const size_t widest = m.arch().tied_head ? 4 * C : std::max(4 * C, (size_t)c.padded_vocab_size);
  const size_t partials = std::max((size_t)std::max(kRowBlocks, fp8 ? fp8_tile_rows((int)BT) : 0) * widest,
                                   m.flash_attention ? (size_t)attention_flash_tile_rows(B, T) * 3 * C : 0);
  const size_t features = std::max({attention_gate_partials(m, BT), value_mix_partials(m), xsa_partials(m)});
  m.partials = device_alloc<float>(std::max(partials, features), "the column-reduction partials");
  residual_mix_allocate_scratch(m, BT);
  bigram_allocate_scratch(m, BT);
  sublayer_lambdas_allocate_scratch(m, BT);
  mudd_gates_allocate_scratch(m, BT);
  mudd_connections_allocate_scratch(m, BT);
  m.norm_partials = device_alloc<float>(kNormBlocks + 1, "the norm partials");
  m.inputs = device_alloc<int>(BT, "the inputs");
  m.targets = device_alloc<int>(BT, "the targets");
  const size_t buckets = BT * encoder_plan_groups((int)C);
  m.encoder_plan.buckets = device_alloc<int4>(buckets, "the encoder backward plan");
  m.encoder_plan.positions = device_alloc<int>(BT, "the encoder backward plan");
  m.encoder_plan.slice_sums = device_alloc<float>(encoder_plan_max_slices((int)BT, (int)C) * kEncoderGroupWidth,
                                                  "the encoder backward's slice sums");
  cudaCheck(cudaMallocHost(&m.losses_host, BT * sizeof(float)));
  upload_staging_allocate(m.inputs_staging, BT * sizeof(int));
  upload_staging_allocate(m.targets_staging, BT * sizeof(int));
  upload_staging_allocate(m.plan_buckets_staging, buckets * sizeof(int4));
  upload_staging_allocate(m.plan_positions_staging, BT * sizeof(int));
}

// The mask's metadata of `tokens` tokens, on the GPU and pinned on the host, in place of any
// smaller buffers (whose last copies are waited for).
void document_buffers_allocate(DocumentAttention& d, size_t tokens) {
  if (tokens <= d.capacity) return;
  document_buffers_free(d);
  const size_t spans = tokens / llmc::kAttentionBlock;
  d.spans = device_alloc<llmc::AttentionBlockSpan>(spans, "the document spans");
  d.document_ids = device_alloc<int>(tokens, "the document ids");
  upload_staging_allocate(d.spans_staging, spans * sizeof(llmc::AttentionBlockSpan));
  upload_staging_allocate(d.document_ids_staging, tokens * sizeof(int));
  d.capacity = tokens;
}

// Attention within documents (spec.documents): the mask's metadata of B x T tokens, on the GPU
// and pinned on the host. T must be a multiple of the 128-token blocks the kernels take.
void gpt2_allocate_documents(GPT2& m, int B, int T, const AttentionSpec& spec) {
  m.documents = spec.documents;
  m.max_window_blocks = spec.max_window_blocks;
  m.window_unit = spec.window_unit;
  m.windows = {};
  if (!spec.documents) return;
  REQUIRE(T % llmc::kAttentionBlock == 0, "attention within documents takes whole blocks of %d tokens: -t %d "
          "is not a multiple of %d", llmc::kAttentionBlock, T, llmc::kAttentionBlock);
  document_buffers_allocate(m, document_tokens(m.config, (size_t)B * T));
}

// Whether any layer of the plan shifts its keys (LayerSpec::key_offset).
bool plan_has_key_offset(const llmc::LayerPlan& plan) {
  for (const llmc::LayerSpec& l : plan.layers) {
    if (l.key_offset) return true;
  }
  return false;
}

// The key offset's scratch of B x T tokens in a: the shift's [B*T, C] and each layer's tail.
void key_offset_allocate(Activations& a, const llmc::GPT2Config& c, int B, int T) {
  a.key_offset_scratch = device_alloc<floatX>((size_t)B * T * c.channels, "the key offset's scratch");
  a.key_offset_tails = device_alloc<floatX>((size_t)c.num_layers * c.channels / 2, "the key offset's last keys");
}

// -ko 1: record #89's key offset on the plan's long-window layers (llmc::plan_key_offsets), after
// the rotary, which only the modern architectures have; before gpt2_allocate, which sizes its scratch.
void gpt2_set_key_offset(GPT2& m) {
  REQUIRE(m.arch().qk_norm_rotary, "the key offset shifts the keys' stationary rotary dims: the %s architecture has "
          "no rotary", m.arch().name);
  llmc::plan_key_offsets(m.plan);
}

// The current GPU; cuBLASLt runs FP8 products on those of compute capability 8.9 or newer (Ada,
// Hopper).
cudaDeviceProp current_gpu() {
  int device = 0;
  cudaCheck(cudaGetDevice(&device));
  cudaDeviceProp prop;
  cudaCheck(cudaGetDeviceProperties(&prop, device));
  return prop;
}
bool fp8_gpu(const cudaDeviceProp& prop) { return prop.major * 10 + prop.minor >= 89; }

// The recipe's head (-fh's default): FP8 where the recipe has it, in BF16 builds (the FP32 build,
// the tight reference, has no FP8 products: its head stays FP32).
bool recipe_fp8_head(const llmc::Recipe& recipe) { return recipe.fp8_head && sizeof(floatX) == 2; }
bool recipe_fp8_mlp(const llmc::Recipe& recipe) { return recipe.fp8_mlp && sizeof(floatX) == 2; }

// Whether the head (-fh) or the MLP (-fm) trains in FP8 (train_gpt2cu and profile_gpt2cu): `on` as
// the flag gave it (given), or the recipe's, which a GPU without FP8 products turns off (the flag
// given there fails in the allocation).
bool fp8_resolved(bool on, bool given) { return on && (given || fp8_gpu(current_gpu())); }

// What an FP8 setting (`setting`, e.g. "-fp8 1") needs: the BF16 build (the products' outputs are
// BF16) and a GPU with FP8 products; `off` is the setting without FP8.
void fp8_require_build_and_gpu(const std::string& setting, const char* off) {
  REQUIRE(sizeof(floatX) == 2, "%s needs the BF16 build (make train_gpt2cu); this is the %s build: use %s",
          setting.c_str(), PRECISION_NAME, off);
  const cudaDeviceProp prop = current_gpu();
  REQUIRE(fp8_gpu(prop),
          "%s needs a GPU of compute capability 8.9 or newer (Ada, Hopper); %s is %d.%d: use %s",
          setting.c_str(), prop.name, prop.major, prop.minor, off);
}

// The FP8 layers' state (-fp8 1 or 2): the weights' casts and scales, the activations' and
// gradients' scales and amax history, the transposed casts the backward reads.
void gpt2_allocate_fp8(GPT2& m, int B, int T, int fp8, Fp8Format grad_format) {
  const llmc::GPT2Config& c = m.config;
  const size_t BT = (size_t)B * T, C = c.channels;
  m.fp8 = fp8 != 0;
  m.fp8_delayed = fp8 == 2;
  m.fp8_grad_format = grad_format;
  if (fp8) {
    fp8_require_build_and_gpu(llmc::strformat("-fp8 %d", fp8), "-fp8 0");
    fp8_require_layer((int)C, (int)C);
    const size_t L = c.num_layers, Np = fp8_padded(B * T);
    m.fp8_layers = c.num_layers;
    m.fp8_channels = c.channels;
    m.fp8_weights = device_alloc<uint8_t>(L * 2 * 12 * C * C, "the FP8 weights");
    m.fp8_scales = device_alloc<Fp8Scale>(L * kNumBlockLinears, "the FP8 weight scales");
    cudaCheck(cudaMemset(m.fp8_scales, 0, L * kNumBlockLinears * sizeof(Fp8Scale)));
    const int count = m.fp8_act_scale_count();
    std::vector<Fp8Scale> act_scales(count);
    for (int i = 0; i < count; i++) {
      act_scales[i] = {1.0f, 0u, 1.0f, fp8_emax(i % 2 == 0 ? Fp8Format::kE4M3 : grad_format)};
    }
    m.fp8_act_scales = device_alloc<Fp8Scale>(count, "the FP8 activation scales");
    cudaCheck(cudaMemcpy(m.fp8_act_scales, act_scales.data(), count * sizeof(Fp8Scale),
                         cudaMemcpyHostToDevice));
    m.fp8_history = device_alloc<uint32_t>((size_t)kFp8History * count, "the FP8 amax history");
    cudaCheck(cudaMemset(m.fp8_history, 0, (size_t)kFp8History * count * sizeof(uint32_t)));
    m.fp8_recorded_steps = 0;
    m.fp8_buffers.rows = device_alloc<uint8_t>(BT * 4 * C, "the FP8 activations");
    m.fp8_buffers.dout_t = device_alloc<uint8_t>(Np * 4 * C, "the FP8 transposed gradients");
    m.fp8_tokens_t = Np;
    m.fp8_inputs_t = device_alloc<uint8_t>(L * kBlockInputWidths * C * Np, "the FP8 transposed activations");
    m.fp8_weights_stale = true;
  }
}

// The head's FP8 layer (-fh 1) for B x T tokens: its weight's casts and fixed scales, the input's
// transposed cast, the output gradient's casts and the weight gradient's FP32 product. The
// forward's input cast [N, C] goes into the gradient's rows [N, Vp], which the backward's cast
// overwrites only after the forward's product has read it. The large buffers are rows and
// dout_t, N * Vp bytes each (at N = 49,152: 2.5 GB each); nothing else of that size is free while
// the head's backward runs (the BF16 dlogits it casts are N * Vp * 2 bytes).
void gpt2_allocate_fp8_head(GPT2& m, int B, int T, bool fp8_head) {
  m.fp8_head = fp8_head;
  if (!fp8_head) return;
  REQUIRE(fp8_head_support(m.arch()), "-fh 1: the FP8 head's fixed scales are the speedrun's (an untied head "
          "without bias after a weightless RMS norm); the %s architecture's head runs in BF16: use -fh 0",
          m.arch().name);
  fp8_require_build_and_gpu("-fh 1", "-fh 0");
  const int C = m.config.channels, Vp = m.config.padded_vocab_size;
  fp8_require_layer(C, Vp);
  const size_t N = (size_t)B * T, Np = fp8_padded(B * T), VpC = (size_t)Vp * C;
  const Fp8HeadScaleValues values = fp8_head_scale_values(m.fp8_head_setting, C);
  const Fp8Scale scales[3] = {fp8_fixed_scale(values.input), fp8_fixed_scale(values.weight),
                              fp8_fixed_scale(values.grad)};
  m.fp8_head_scales = device_alloc<Fp8Scale>(3, "the FP8 head's scales");
  cudaCheck(cudaMemcpy(m.fp8_head_scales, scales, sizeof(scales), cudaMemcpyHostToDevice));
  uint8_t* w8 = device_alloc<uint8_t>(2 * VpC, "the FP8 head's weight");
  m.fp8_head_weight = {w8, w8 + VpC, m.fp8_head_scales + 1};
  m.fp8_head_input_t = device_alloc<uint8_t>(C * Np, "the FP8 head's transposed input");
  m.fp8_head_buffers.rows = device_alloc<uint8_t>(N * Vp, "the FP8 head's output gradient");
  m.fp8_head_buffers.dout_t = device_alloc<uint8_t>(Vp * Np, "the FP8 head's transposed output gradient");
  m.fp8_head_dweight = device_alloc<float>(VpC, "the FP8 head's weight gradient");
  m.fp8_head_tokens = 0;
  m.fp8_weights_stale = true;
}

// Whether an architecture's MLP has record #89's FP8 form: ReLU^2 and no biases.
bool fp8_mlp_support(const llmc::ArchSpec& a) { return a.relu2 && !a.biases; }

// The activation scales a new run starts from (1, the reference's) and W2's delayed scale (set by the
// first cast, a bootstrap).
void fp8_mlp_reset_scales(GPT2& m) {
  const int L = m.config.num_layers;
  std::vector<Fp8MlpScales> scales(L);
  for (Fp8MlpScales& s : scales) s.act.inv_scale = s.w2.scale = 1.0f;
  cudaCheck(cudaMemcpy(m.fp8_mlp_state.scales, scales.data(), L * sizeof(Fp8MlpScales), cudaMemcpyHostToDevice));
  m.fp8_mlp_bootstrap = true;
  m.fp8_weights_stale = true;
}

// Record #89's FP8 MLP (-fm 1) for B x T tokens: the weights' casts, the scales, and the forward's
// scratch (pre [B*T, 4C] in BF16, the casts of x and post).
void fp8_mlp_allocate(GPT2& m, int B, int T) {
  REQUIRE(fp8_mlp_support(m.arch()), "-fm 1: record #89's FP8 MLP is a ReLU^2 MLP without biases; the %s "
          "architecture's is not: use -fm 0", m.arch().name);
  REQUIRE(m.mlp_from_output && m.recompute == 0, "-fm 1: the FP8 forward keeps ReLU^2's output alone, which the "
          "backward reads: give -mr 1 and -r 0 with it");
  fp8_require_build_and_gpu("-fm 1", "-fm 0");
  const int C = m.config.channels, L = m.config.num_layers;
  fp8_require_layer(C, 4 * C);
  const size_t N = (size_t)B * T, weights = (size_t)4 * C * C * L;
  Fp8Mlp& f = m.fp8_mlp_state;
  f.w1 = device_alloc<uint8_t>(weights, "the FP8 MLP's up weights");
  f.w2 = device_alloc<uint8_t>(weights, "the FP8 MLP's down weights");
  f.scales = device_alloc<Fp8MlpScales>(L, "the FP8 MLP's scales");
  f.unit = device_alloc<Fp8Scale>(1, "the FP8 MLP's unit scale");
  const Fp8Scale unit = {1.0f, 0u, 1.0f, 0};
  cudaCheck(cudaMemcpy(f.unit, &unit, sizeof(unit), cudaMemcpyHostToDevice));
  f.pre = device_alloc<floatX>(N * 4 * C, "the FP8 MLP's pre-activation");
  f.x8 = device_alloc<uint8_t>(N * C, "the FP8 MLP's input cast");
  f.post8 = device_alloc<uint8_t>(N * 4 * C, "the FP8 MLP's activation cast");
  fp8_mlp_reset_scales(m);
}

void gpt2_allocate_fp8_mlp(GPT2& m, int B, int T, bool fp8_mlp) {
  m.fp8_mlp = fp8_mlp;
  if (fp8_mlp) m.fp8_bytes += device_bytes_of([&] { fp8_mlp_allocate(m, B, T); });
}

// Everything a training pass of B x T tokens needs beyond the parameters and the optimizer
// state. fp8: -fp8 (0 none, 1 current scaling, 2 delayed: the blocks' linear layers in FP8, which
// needs the BF16 build and a GPU of compute capability 8.9 or newer); grad_format: the output
// gradients' format; attention: causal, or within documents (-pd 1, -aw); fp8_head: -fh 1, the
// head's training products in FP8 (the speedrun's; the BF16 build, compute capability 8.9+).
void gpt2_allocate(GPT2& m, int B, int T, int recompute, int fp8 = 0,
                   Fp8Format grad_format = Fp8Format::kE5M2, const AttentionSpec& attention = AttentionSpec(),
                   bool fp8_head = false) {
  const llmc::GPT2Config& c = m.config;
  REQUIRE(T <= c.max_seq_len, "sequence length -t %d is above the model's maximum %d: use -t %d or less",
          T, c.max_seq_len, c.max_seq_len);
  REQUIRE(recompute == 0 || recompute == 1, "-r %d: the recompute level must be 0 or 1", recompute);
  REQUIRE(fp8 == 0 || !m.arch().attn_lambdas, "-fp8 %d casts the attention's weights unscaled, and the model has "
          "record #89's attention lambdas, which scale them: give -fp8 0", fp8);
  REQUIRE(!m.mlp_from_output || (m.arch().relu2 && recompute == 0 && fp8 == 0), "-mr 1 takes ReLU^2's derivative "
          "from its kept output: a ReLU^2 MLP (modern or speedrun), with -r 0 and -fp8 0");
  m.B = B;
  m.T = T;
  m.recompute = recompute;
  m.act_bytes = device_bytes_of([&] {
    gpt2_allocate_activations(m, B, T, recompute, fp8);
    gpt2_allocate_scratch(m, B, T, fp8, attention);
    gpt2_allocate_documents(m, B, T, attention);
    if (plan_has_key_offset(m.plan)) key_offset_allocate(m, c, B, T);
  });
  m.fp8_bytes = device_bytes_of([&] {
    gpt2_allocate_fp8(m, B, T, fp8, grad_format);
    gpt2_allocate_fp8_head(m, B, T, fp8_head);
  });
}

// An Activations' buffers (nullptr where it has none).
void activations_free(Activations& a) {
  for (void* p : {(void*)a.act_memory, (void*)a.scratch_btc, (void*)a.scratch_bt4c, (void*)a.dresidual,
                  (void*)a.scratch_att, (void*)a.scratch_dqkvr, (void*)a.attention_dot, (void*)a.attention_ds,
                  (void*)a.partials, (void*)a.norm_partials, (void*)a.dx0, (void*)a.dkept, (void*)a.inputs,
                  (void*)a.targets, (void*)a.encoder_plan.buckets, (void*)a.encoder_plan.positions,
                  (void*)a.encoder_plan.slice_sums, (void*)a.key_offset_scratch, (void*)a.key_offset_tails,
                  (void*)a.bigram_rows, (void*)a.bigram_plan.buckets, (void*)a.bigram_plan.positions,
                  (void*)a.bigram_plan.slice_sums, (void*)a.dbigram, (void*)a.dsublayer,
                  (void*)a.dmudd_gates, (void*)a.mudd_dpre, (void*)a.mudd_dhidden, (void*)a.mudd_dweight}) {
    device_free(p);
  }
  if (a.losses_host) cudaCheck(cudaFreeHost(a.losses_host));
  for (UploadStaging* s : {&a.inputs_staging, &a.targets_staging, &a.plan_buckets_staging, &a.plan_positions_staging,
                           &a.bigram_rows_staging, &a.bigram_plan_buckets_staging, &a.bigram_plan_positions_staging}) {
    upload_staging_free(*s);
  }
}

// Validation over B x T tokens. At the training passes' B x T it runs in their activations; else in
// a forward pass's own (forward_only), which keeps one layer's buffers of each tensor but the
// blocks' outputs (each block reads its predecessor's, and the U-net earlier ones') and logits of
// at most the training passes' B x T rows at a time (gpt2_forward_loss takes the head in chunks):
// at d12's 262,144 tokens 12 GB, where a whole pass's logits alone would take 26 GB.
void gpt2_allocate_validation(GPT2& m, int B, int T) {
  if (B == m.B && T == m.T) return;
  const llmc::GPT2Config& c = m.config;
  const size_t BT = (size_t)B * T, C = c.channels;
  Activations& a = m.forward_only;
  a.B = B;
  a.T = T;
  a.evaluation_only = true;
  m.act_bytes += device_bytes_of([&] {
    activation_table(c, B, T, false, false, a.act_specs);
    for (int i = 0; i < kNumActTensors; i++) {
      if (i != kResidual3) a.act_specs[i].layers = 1;
    }
    a.act_specs[kOutput].count = std::min(BT, (size_t)m.B * m.T) * c.padded_vocab_size;
    activations_layout(a);
    a.scratch_btc = device_alloc<floatX>(BT * C, "validation's B*T*C scratch buffer");
    a.scratch_bt4c = device_alloc<floatX>(BT * 4 * C, "validation's B*T*4C scratch buffer");
    a.flash_attention = attention_flash_supported(C / c.num_heads);
    if (!a.flash_attention) {
      a.scratch_att = device_alloc<floatX>(attention_score_count(c, B, T), "validation's attention scratch");
    }
    a.inputs = device_alloc<int>(BT, "validation's inputs");
    a.targets = device_alloc<int>(BT, "validation's targets");
    cudaCheck(cudaMallocHost(&a.losses_host, BT * sizeof(float)));
    upload_staging_allocate(a.inputs_staging, BT * sizeof(int));
    upload_staging_allocate(a.targets_staging, BT * sizeof(int));
    if (m.documents) document_buffers_allocate(m, document_tokens(c, BT));
    if (plan_has_key_offset(m.plan)) key_offset_allocate(a, c, B, T);
    bigram_allocate_rows(a, m.arch(), BT);
  });
}

// Runs pass with the forward-only activations standing in for the training passes'.
template <typename Pass>
void with_forward_only(GPT2& m, const Pass& pass) {
  Activations& training = m;
  std::swap(training, m.forward_only);
  pass();
  std::swap(training, m.forward_only);
}

void gpt2_free(GPT2& m) {
  optimizer_arrays_free(m.state);
  for (void* p : {(void*)m.params, (void*)m.grads, (void*)m.wte_grad_encoder, (void*)m.bigram_signs,
                  (void*)m.skip_scale, (void*)m.scaled_attention_weights,
                  (void*)m.fp8_weights, (void*)m.fp8_scales, (void*)m.fp8_act_scales, (void*)m.fp8_history,
                  (void*)m.fp8_inputs_t, (void*)m.fp8_buffers.rows, (void*)m.fp8_buffers.dout_t,
                  (void*)m.fp8_head_weight.w8, (void*)m.fp8_head_scales, (void*)m.fp8_head_input_t,
                  (void*)m.fp8_head_buffers.rows, (void*)m.fp8_head_buffers.dout_t, (void*)m.fp8_head_dweight,
                  (void*)m.fp8_mlp_state.w1, (void*)m.fp8_mlp_state.w2, (void*)m.fp8_mlp_state.scales,
                  (void*)m.fp8_mlp_state.unit, (void*)m.fp8_mlp_state.pre, (void*)m.fp8_mlp_state.x8,
                  (void*)m.fp8_mlp_state.post8, (void*)m.prefix_table}) {
    device_free(p);
  }
  activations_free(m);
  activations_free(m.forward_only);
  document_buffers_free(m);
  device_free(m.muon_pointers);
  if (m.muon_workspace.capacity > 0) muon_workspace_free(m.muon_workspace);
  m = GPT2();
}

// The FP8 copies of every block weight (-fp8) and of the head's (-fh 1), from the current parameters.
void gpt2_fp8_cast_weights(GPT2& m) {
  const int C = m.config.channels;
  if (m.fp8) {
    for (int l = 0; l < m.config.num_layers; l++) {
      for (int i = 0; i < kNumBlockLinears; i++) {
        const bool attention = i == kLinearQkv || i == kLinearAttproj;
        if (attention && !m.plan[l].attention) continue;
        const LinearSpec& spec = kBlockLinears[i];
        fp8_weight_cast(m.fp8_weight(i, l), m.param(spec.weight, l), spec.out * C, spec.in * C, m.stream);
      }
    }
  }
  if (m.fp8_head) {
    fp8_fixed_weight_cast(m.fp8_head_weight, m.param(llmc::kHeadw), m.config.padded_vocab_size, C, m.stream);
  }
  if (m.fp8_mlp) {
    std::vector<const floatX*> w1, w2;
    for (int l = 0; l < m.config.num_layers; l++) {
      w1.push_back(m.param(llmc::kFcw, l));
      w2.push_back(m.param(llmc::kFcprojw, l));
    }
    fp8_mlp_cast_weights(m.fp8_mlp_state, w1, w2, C, m.fp8_mlp_bootstrap, m.stream);
  }
  m.fp8_weights_stale = false;
}

// Delayed scaling, after each step's update (or its skip, applied false): the step's amaxes go
// into the history when the update was applied, and the next step's scales come from it
// (fp8_update_scales). Several processes first take each amax's maximum over the ranks
// (multi_gpu_fp8_end_step), so every rank casts with the same scales.
void gpt2_fp8_end_step(GPT2& m, bool applied) {
  if (!m.fp8_delayed) return;
  fp8_update_scales(m.fp8_act_scales, m.fp8_history, m.fp8_act_scale_count(),
                    m.fp8_recorded_steps % kFp8History, applied, m.stream);
  if (applied) m.fp8_recorded_steps++;
}

// The FP8 MLP's delayed scales for a state file (-fm 1, which excludes -fp8): each layer's
// activation scale, then the scale of its down weight's cast of the current weights (the cast a
// validation at the checkpoint's step has made, else the one the next forward makes), as FP32 bits.
llmc::Fp8History gpt2_fp8_mlp_scales(const GPT2& m) {
  const int L = m.config.num_layers;
  std::vector<Fp8MlpScales> scales(L);
  cudaCheck(cudaMemcpy(scales.data(), m.fp8_mlp_state.scales, L * sizeof(Fp8MlpScales), cudaMemcpyDeviceToHost));
  std::vector<float> values;
  for (const Fp8MlpScales& s : scales) values.push_back(s.act.inv_scale);
  for (const Fp8MlpScales& s : scales) values.push_back(m.fp8_weights_stale ? s.w2.scale : s.w2.inv_scale);
  llmc::Fp8History h;
  h.amax.resize(values.size());
  memcpy(h.amax.data(), values.data(), values.size() * sizeof(float));
  return h;
}

// Restores them (path: the state file) for a run resuming after `step` steps: the weights are cast
// again before the next forward, W2 under the scale saved (or, within the bootstrap's steps, its own:
// the same). A state without them (written with -fm 0) starts the scales as a new run's.
void gpt2_fp8_mlp_restore_scales(GPT2& m, const llmc::Fp8History& h, int step, const std::string& path) {
  if (!m.fp8_mlp) return;
  fp8_mlp_reset_scales(m);
  m.fp8_mlp_bootstrap = step - 1 < kFp8MlpBootstrapSteps;
  if (h.amax.empty()) return;
  const int L = m.config.num_layers;
  if (h.amax.size() != 2 * (size_t)L) {
    LLMC_FAIL("%s: %zu FP8 scales, but -fm 1's MLP of %d layers keeps %d: resume with the model and -fm of the "
              "checkpoint", path.c_str(), h.amax.size(), L, 2 * L);
  }
  std::vector<float> values(h.amax.size());
  memcpy(values.data(), h.amax.data(), values.size() * sizeof(float));
  std::vector<Fp8MlpScales> scales(L);
  for (int l = 0; l < L; l++) {
    scales[l].act.inv_scale = values[l];
    scales[l].w2.scale = values[L + l];
  }
  cudaCheck(cudaMemcpy(m.fp8_mlp_state.scales, scales.data(), L * sizeof(Fp8MlpScales), cudaMemcpyHostToDevice));
}

// Delayed scaling's state for a state file: the history and the steps it recorded (none without
// -fp8 2), or the FP8 MLP's scales (-fm 1).
llmc::Fp8History gpt2_fp8_history(const GPT2& m) {
  if (m.fp8_mlp) return gpt2_fp8_mlp_scales(m);
  llmc::Fp8History h;
  if (!m.fp8_delayed) return h;
  h.recorded_steps = m.fp8_recorded_steps;
  h.amax.resize((size_t)kFp8History * m.fp8_act_scale_count());
  cudaCheck(cudaMemcpy(h.amax.data(), m.fp8_history, h.amax.size() * sizeof(uint32_t),
                       cudaMemcpyDeviceToHost));
  return h;
}

// Restores the history of a state file (path), and the scales of the next step from it, as the
// run that wrote it had them. A state without one (-fp8 0 or 1, or a version 3 file) leaves the
// history empty: the first step casts with current scaling, as a new run's.
void gpt2_fp8_restore_history(GPT2& m, const llmc::Fp8History& h, const std::string& path) {
  if (!m.fp8_delayed || h.amax.empty()) return;
  const int count = m.fp8_act_scale_count();
  if (h.amax.size() != (size_t)kFp8History * count) {
    LLMC_FAIL("%s: an FP8 amax history of %zu entries, but this model keeps %zu: resume with the "
              "model of the checkpoint", path.c_str(), h.amax.size(), (size_t)kFp8History * count);
  }
  cudaCheck(cudaMemcpy(m.fp8_history, h.amax.data(), h.amax.size() * sizeof(uint32_t),
                       cudaMemcpyHostToDevice));
  m.fp8_recorded_steps = h.recorded_steps;
  fp8_update_scales(m.fp8_act_scales, m.fp8_history, count, 0, false, m.stream);
}

// Forward passes that are not training steps (validation, HellaSwag) leave the amaxes as they
// found them (zero: each step ends with fp8_update_scales), so only training steps feed the history.
void gpt2_fp8_forget_eval_amax(GPT2& m) {
  if (!m.fp8_delayed) return;
  fp8_clear_amax(m.fp8_act_scales, m.fp8_act_scale_count(), m.stream);
}

// ---- The architecture's steps: each helper runs GPT-2's kernels or the modern ones, as
// llmc::ArchSpec says, and BF16 or FP8 products, so that a block reads as its plain sequence of
// steps ----

// A norm's activations and parameters: LayerNorm keeps mean and rstd and has a bias; RMSNorm keeps
// rstd alone (its mean and bias tensors are empty).
struct NormSpec {
  int out, mean, rstd, weight, bias;
};
constexpr NormSpec kNorm1 = {kLn1, kLn1Mean, kLn1Rstd, llmc::kLn1w, llmc::kLn1b};
constexpr NormSpec kNorm2 = {kLn2, kLn2Mean, kLn2Rstd, llmc::kLn2w, llmc::kLn2b};
constexpr NormSpec kNormF = {kLnf, kLnfMean, kLnfRstd, llmc::kLnfw, llmc::kLnfb};

// The backward's seeds: one a micro step from m.rng, and from it each kernel's in the order the
// kernels are enqueued, so that a configuration draws the same seeds on every run.
struct KernelSeeds {
  uint32_t seed;
  uint32_t index = 0;
  uint32_t next() { return seed + 0x9e3779b9u * ++index; }
};

// Where a norm writes: its output (null: the statistics alone, for FP8 casts that compute the
// output themselves) and its row statistics (the mean: LayerNorm's only).
struct NormRows {
  floatX* out;
  float* mean;
  float* rstd;
};

// The rows one block's forward reads and writes: layer l's training activations of B x T tokens
// (block_rows), or the decoder's buffers of its one token, whose attention reads and extends the
// layer's KV cache (section 11).
struct BlockRows {
  int B = 0, T = 0;
  int first_position = 0;          // the rows' first position, for the rotary
  bool fp8 = false;                // the linear layers' products in FP8 (decoding runs BF16)
  bool fp8_sources = false;        // FP8 casts compute the norms' and activation's outputs (block_rows)
  const floatX* input = nullptr;   // the residual stream into the block (block_input)
  NormRows ln1 = {}, ln2 = {};
  NormRows next = {};              // the next block's first norm, or the final norm (norm_after_block)
  floatX* qkv = nullptr;           // the qkv product: the attention's input (attention_qkv)
  float* qk_rstd = nullptr;
  floatX* atty = nullptr;
  floatX* proj = nullptr;          // attproj's, then fcproj's output
  // Where attproj and fcproj write: proj, or with the residual lambdas each layer's kept outputs,
  // which their backward reads (sublayer_lambdas_point_rows).
  floatX* attention_out = nullptr;
  floatX* mlp_out = nullptr;
  floatX* residual2 = nullptr;     // input + attproj
  floatX* fch = nullptr;           // fc's output: the activation's input
  floatX* fch_act = nullptr;       // the activation's output: fcproj's input
  floatX* residual3 = nullptr;     // residual2 + fcproj: the block's output
  floatX* k_cache = nullptr;       // decoding: the layer's keys and values [NH, maxT, HS]; else null
  floatX* v_cache = nullptr;
  int document_start = 0;          // decoding within documents: where the token's document starts
  const floatX* x0 = nullptr;      // the normed embedding, which the residual mix adds
  const int* tokens = nullptr;     // the rows' tokens, on the device (the value embeddings')
  // The block features' rows (section 10, "Block features": each group's *_point_rows sets its
  // own; null without the feature). The residual mix:
  const floatX* kept = nullptr;    // the kept output this block adds (skip_source, record #89's
                                   // gated_skip_source), or null
  floatX* kept_rows = nullptr;     // decoding: the kept outputs' rows (LayerSpec::kept's)
  floatX* mixed = nullptr;         // the block's input after its mix, what attention and MLP add to
  // Record #89's plan: the kept output its attention reads (attention_source), or null: its input.
  const floatX* attention_source = nullptr;
  // The training and evaluation passes: the block before leaves its last residual add, residual2 +
  // fcproj's output into its residual3 (this block's input), to this block's mix, which reads them
  // (residual_mix_norm): input_before_add is that residual2, input_add the fcproj output and input;
  // output_in_next_mix says the same of this block's own output. The decoder's blocks write their
  // outputs themselves.
  const floatX* input_before_add = nullptr;
  ResidualAddFirst input_add = {};
  bool output_in_next_mix = false;
  floatX* v_pre = nullptr;         // the value mix: v before it
  float* gates = nullptr;          // the attention gate: each head's gate [rows, NH]
  floatX* gated = nullptr;         // the gated attention output: attproj's input
  floatX* xsa_out = nullptr;       // XSA's output, the gate's input in XSA layers
  floatX* composed = nullptr;      // the composed attention's output (its layer's), XSA's input there
  float* composed_lse = nullptr;   // and each head's log-sum-exp [N, NH], for its backward
  // Record #89's MUDD gate generators' rows (pre, post; llmc::kMuddGateStride apart), or null.
  const floatX* mudd_rows[4] = {nullptr, nullptr, nullptr, nullptr};
  // Record #89's MUDD dense connections' rows the last block reads: in0 and its value's terms, or null.
  const floatX* mudd_in0 = nullptr;
  const floatX* mudd_value_terms = nullptr;
  floatX* skip_scale = nullptr;     // the gated skip's scale a row, with MUDD's g a row
  floatX* bigram = nullptr;        // the bigram embedding, which layers after the first add gated
  int rows() const { return B * T; }
};

// ---- The attention lambdas (ArchSpec::attn_lambdas, record #89's): each attention layer's qkv and
// output projections read W' = s W, s the layer's lambda of that projection (attn_lambdas [L, 2]),
// from scaled_attention_weights (section 5's kernels). ----

// Layer l's scaled copy of its qkv (kLinearQkv) or output projection's (kLinearAttproj) weight.
floatX* scaled_attention_weight(GPT2& m, int linear, int l) {
  REQUIRE(m.plan[l].attention, "scaled_attention_weight: layer %d has no attention", l);
  const size_t C2 = (size_t)m.config.channels * m.config.channels;
  return m.scaled_attention_weights + m.plan[l].attention_slab * 4 * C2 + (linear == kLinearAttproj ? 3 * C2 : 0);
}

// The weight a block's linear layer of layer l reads: its parameter, or the attention's scaled copy.
const floatX* linear_weight(GPT2& m, int linear, int l) {
  const bool attention = linear == kLinearQkv || linear == kLinearAttproj;
  if (attention && m.arch().attn_lambdas) return scaled_attention_weight(m, linear, l);
  return m.param(kBlockLinears[linear].weight, l);
}

// Every attention layer's W' = s W, before the blocks of a forward pass or of decoding.
void attention_lambdas_forward(GPT2& m) {
  if (!m.arch().attn_lambdas) return;
  const size_t C2 = (size_t)m.config.channels * m.config.channels;
  for (int l = 0; l < m.config.num_layers; l++) {
    if (!m.plan[l].attention) continue;
    const floatX* lambdas = m.param(llmc::kAttnLambdas, l);
    attention_lambda_scale(scaled_attention_weight(m, kLinearQkv, l), m.param(llmc::kQkvw, l), lambdas, 3 * C2,
                           m.stream);
    attention_lambda_scale(scaled_attention_weight(m, kLinearAttproj, l), m.param(llmc::kAttprojw, l),
                           lambdas + 1, C2, m.stream);
  }
}

// Layer l's attention weights' gradients, dW' summed over the step's micro steps, into those of W
// (s dW') and of its lambdas (sum dW' W): on the last micro step, once the layer's backward is done
// and before anything reads its gradients (gpt2_backward's grads_final, the norm, the update).
void attention_lambdas_backward(GPT2& m, int l, KernelSeeds& seeds) {
  if (!m.arch().attn_lambdas || !m.plan[l].attention) return;
  const int C = m.config.channels;
  const floatX* lambdas = m.param(llmc::kAttnLambdas, l);
  floatX* dlambdas = m.grad(llmc::kAttnLambdas, l);
  const int weights[2] = {llmc::kQkvw, llmc::kAttprojw}, rows[2] = {3 * C, C};
  for (int k = 0; k < 2; k++) {
    const uint32_t seed = seeds.next(), seed_lambda = seeds.next();
    attention_lambda_backward(m.grad(weights[k], l), dlambdas + k, m.partials, m.param(weights[k], l), lambdas + k,
                              rows[k], C, seed, seed_lambda, m.stream);
  }
}

// out = inp @ weight^T + bias of a block's linear layer over r's rows (GELU of it into out with
// pre_gelu kept, for the fc layer), in BF16 or FP8 (r.fp8). source (FP8 with delayed scaling):
// the layer's input is GELU(inp) or LayerNorm(inp), computed in its FP8 cast (matmul_forward_fp8).
void gpt2_linear_forward(GPT2& m, const BlockRows& r, int linear, int l, floatX* out, const floatX* inp,
                         floatX* pre_gelu, const Fp8CastSource& source = Fp8CastSource()) {
  const LinearSpec& spec = kBlockLinears[linear];
  const int C = m.config.channels * spec.in, OC = m.config.channels * spec.out, N = r.rows();
  const floatX* bias = m.param_or_null(spec.bias, l);
  if (r.fp8) {
    matmul_forward_fp8(out, inp, m.fp8_weight(linear, l), bias, N, C, OC, pre_gelu,
                       m.fp8_input_scale(linear, l), m.fp8_buffers.rows, m.fp8_input_t(linear, l),
                       m.fp8_scaling(), m.stream, source);
  } else {
    matmul_forward(out, inp, linear_weight(m, linear, l), bias, N, C, OC, pre_gelu, m.stream);
  }
}

// A block's linear layer whose input is the output `normed` of layer l's norm n of rows inp: the
// product reads it where it was written, else (r.fp8_sources) the layer's cast computes that norm
// from its statistics.
void gpt2_linear_forward_normed(GPT2& m, const BlockRows& r, int linear, int l, floatX* out, const NormSpec& n,
                                const NormRows& normed, const floatX* inp) {
  if (normed.out) {
    gpt2_linear_forward(m, r, linear, l, out, normed.out, nullptr);
    return;
  }
  const bool rms = m.arch().rms_norm;
  gpt2_linear_forward(m, r, linear, l, out, inp, nullptr,
                      fp8_norm_source(rms ? nullptr : normed.mean, normed.rstd, m.param_or_null(n.weight, l),
                                      rms ? nullptr : m.param(n.bias, l)));
}

// The MLP's activation of the architecture.
Activation mlp_activation(const GPT2& m) { return m.arch().relu2 ? Activation::kRelu2 : Activation::kGelu; }

// The gradients of a block's linear layer (see matmul_backward), in BF16 or FP8. dbias_sum: add
// the column sums of dout into the bias gradient (not where another kernel has, sections 4, 6).
// mlp_pre_act, for the MLP's two layers: the activation's input between them (act kFch), whose
// derivative FP8 applies to fc's output gradient, in its cast with delayed scaling, else in place
// in dout (see matmul_backward_fp8); BF16 applies GELU' to fcproj's input gradient (ReLU^2' is
// mlp_backward's own pass).
void gpt2_linear_backward(GPT2& m, int linear, int l, floatX* dinp, bool dbias_sum, floatX* dout,
                          const floatX* inp, const floatX* mlp_pre_act, int N, uint32_t seed) {
  const LinearSpec& spec = kBlockLinears[linear];
  const int C = m.config.channels * spec.in, OC = m.config.channels * spec.out;
  floatX* dweight = m.grad(spec.weight, l);
  floatX* dbias = dbias_sum ? m.grad_or_null(spec.bias, l) : nullptr;
  const Activation act = mlp_activation(m);
  if (m.fp8) {
    matmul_backward_fp8(dinp, dweight, dbias, m.partials, dout, m.fp8_input_t(linear, l), m.fp8_weight(linear, l),
                        linear == kLinearFc ? mlp_pre_act : nullptr, act, m.fp8_input_scale(linear, l),
                        m.fp8_dout_scale(linear, l), m.fp8_buffers, N, C, OC, seed, m.fp8_grad_format,
                        m.fp8_scaling(), m.stream);
  } else {
    const bool dgelu = linear == kLinearFcproj && act == Activation::kGelu;
    matmul_backward(dinp, dweight, dbias, m.partials, dout, inp, linear_weight(m, linear, l),
                    dgelu ? mlp_pre_act : nullptr, N, C, OC, seed, m.stream);
  }
}

// out = norm(inp) of layer l's norm n, its statistics into out's mean (LayerNorm) and rstd.
void norm_rows(GPT2& m, const NormSpec& n, int l, const NormRows& out, const floatX* inp, int N) {
  const int C = m.config.channels;
  if (m.arch().rms_norm) {
    rmsnorm_forward(out.out, out.rstd, inp, m.param_or_null(n.weight, l), N, C, m.stream);
  } else {
    layernorm_forward(out.out, out.mean, out.rstd, inp, m.param(n.weight, l), m.param(n.bias, l), N, C,
                      m.stream);
  }
}

// residual = a + b, then out = norm(residual), as norm_rows.
void norm_residual_rows(GPT2& m, const NormSpec& n, int l, floatX* residual, const NormRows& out,
                        const floatX* a, const floatX* b, int N, const SublayerScales& scales = {}) {
  const int C = m.config.channels;
  if (m.arch().rms_norm) {
    fused_residual_rmsnorm_forward(residual, out.out, out.rstd, a, b, m.param_or_null(n.weight, l), N, C,
                                   m.stream, scales);
  } else {
    REQUIRE(!scales.any(), "the residual lambdas (resid_lambdas) scale the adds of RMSNorm models alone");
    fused_residual_layernorm_forward(residual, out.out, out.mean, out.rstd, a, b, m.param(n.weight, l),
                                     m.param(n.bias, l), N, C, m.stream);
  }
}

// dresidual += the gradient of the norm's input inp, from dout (see layernorm_backward).
void norm_backward(GPT2& m, const NormSpec& n, int l, floatX* dresidual, floatX* dresidual_dbias,
                   const floatX* dout, const floatX* inp, int N, uint32_t seed) {
  const int C = m.config.channels;
  if (m.arch().rms_norm) {
    rmsnorm_backward(dresidual, m.grad_or_null(n.weight, l), dresidual_dbias, m.partials, dout, inp,
                     m.param_or_null(n.weight, l), m.act_f(n.rstd, l), N, C, seed, m.stream);
  } else {
    layernorm_backward(dresidual, m.grad(n.weight, l), m.grad(n.bias, l), dresidual_dbias, m.partials,
                       dout, inp, m.param(n.weight, l), m.act_f(n.mean, l), m.act_f(n.rstd, l), N, C,
                       seed, m.stream);
  }
}

float attention_scale(const GPT2& m) { return m.softmax_scale; }

// -asc: the attention's softmax scale instead of the architecture's (record #89's 0.1), before YaRN's
// changes; a double, as train_gpt2.py's, rounded to float where the kernels take it.
void gpt2_set_attention_scale(GPT2& m, double scale) {
  REQUIRE(scale > 0.0 && std::isfinite(scale), "the attention's softmax scale %g must be positive", scale);
  m.base_softmax_scale = scale;
  m.softmax_scale = (float)scale;
}

// YaRN's start (llmc/yarn.h): the base rotary frequencies of the model's layout and its base scale.
llmc::YarnState gpt2_yarn_base(const GPT2& m) {
  const int pairs = m.config.head_size() / 2;
  const RotaryFrequencies base = rotary_frequencies(m.config.head_size(), m.rotary.adjacent_pairs);
  return {std::vector<float>(base.freq, base.freq + pairs), m.base_softmax_scale};
}

// -yn 1: YaRN's frequencies and scale for the passes to come (llmc::yarn_at's of the step).
void gpt2_set_yarn(GPT2& m, const llmc::YarnState& y) {
  REQUIRE(m.arch().qk_norm_rotary && y.freq.size() == (size_t)m.config.head_size() / 2,
          "YaRN's %zu frequencies do not fit the model's rotary (head size %d)", y.freq.size(),
          m.config.head_size());
  std::copy(y.freq.begin(), y.freq.end(), m.rotary.freq);
  m.softmax_scale = (float)y.scale;
}

// The residual stream's start out [B*T, C] for tokens at positions first_position.. : wte + wpe,
// or the RMS-normalised embedding (embedded: the embedding before its norm, smeared where the
// architecture smears: smear_embedding, whose rows smear gives; rstd the norm's statistics).
void embedding_rows(GPT2& m, floatX* out, floatX* embedded, float* rstd, const int* tokens, int B, int T,
                    int first_position, const SmearRows& smear = {}) {
  const int C = m.config.channels;
  if (!m.arch().embedding_norm) {
    // wpe shifted to the first position, so the encoder's position 0 is first_position.
    encoder_forward(out, tokens, m.param(llmc::kWte), m.param(llmc::kWpe) + (size_t)first_position * C, B, T,
                    C, m.stream);
    return;
  }
  const floatX* norm_input = embedded;
  if (m.arch().smear) {
    norm_input = smear_embedding(m, embedded, tokens, B * T, smear);
  } else {
    encoder_forward(embedded, tokens, m.param(llmc::kWte), nullptr, B, T, C, m.stream);
  }
  rmsnorm_forward(out, rstd, norm_input, m.param_or_null(llmc::kLnew), B * T, C, m.stream);
}

void embedding_forward(GPT2& m, int B, int T) {
  const SmearRows smear = {m.act(kTokenEmbedded), m.act_f(kSmearGates), 0};
  embedding_rows(m, m.act(kEncoded), m.act(kEmbedded), m.act_f(kEmbRstd), m.inputs, B, T, 0, smear);
}

// From dresidual, the gradient of kEncoded: the embedding's (and wpe's) gradients, through the
// encoder plan gpt2_backward made of the inputs. The encoder's wte part accumulates in
// wte_grad_encoder (see GPT2). Overwrites scratch_btc (and with the smear dresidual).
void embedding_backward(GPT2& m, int B, int T, uint32_t seed_norm, uint32_t seed_smear, uint32_t seed_encoder) {
  const int C = m.config.channels, N = B * T;
  const floatX* dembedded = m.dresidual;
  if (m.arch().embedding_norm) {
    cudaCheck(cudaMemsetAsync(m.scratch_btc, 0, (size_t)N * C * sizeof(floatX), m.stream));
    rmsnorm_backward(m.scratch_btc, m.grad_or_null(llmc::kLnew), nullptr, m.partials, m.dresidual,
                     m.act(kEmbedded), m.param_or_null(llmc::kLnew), m.act_f(kEmbRstd), N, C, seed_norm, m.stream);
    dembedded = smear_embedding_backward(m, m.scratch_btc, N, seed_smear);
  }
  encoder_backward(m.wte_grad_encoder, m.arch().learned_positions ? m.grad(llmc::kWpe) : nullptr,
                   m.encoder_plan, dembedded, B, T, C, seed_encoder, m.stream);
}

// Where a layer's qkv product goes: the attention's input (flash: kept as it is; otherwise
// permuted into kQkvr by the attention), after QK-norm and rotary where the architecture has them.
floatX* attention_qkv(GPT2& m, int l) {
  if (m.flash_attention) return m.act(kQkvr, l);
  return m.arch().qk_norm_rotary ? m.act(kQkvNormed, l) : m.scratch_bt4c;
}

// Layer l's rotary: the model's, with its paired heads' positions where the plan pairs them.
RotaryFrequencies layer_rotary(const GPT2& m, int l) {
  RotaryFrequencies f = m.rotary;
  f.paired_heads = m.plan[l].paired;
  return f;
}

// QK-norm and rotary positions of q and k in r's qkv, in place (nothing for GPT-2), then layer l's
// key offset where the plan has one: over the rows as one sequence, or against the decoder's cache.
void qk_prepare(GPT2& m, int l, const BlockRows& r) {
  if (!m.arch().qk_norm_rotary) return;
  const int C = m.config.channels, HS = m.config.head_size();
  qk_norm_rotary_forward(r.qkv, r.qk_rstd, r.B, r.T, m.config.num_heads, HS, layer_rotary(m, l), m.stream,
                         r.first_position);
  if (!m.plan[l].key_offset) return;
  const bool pairs = m.rotary.adjacent_pairs;
  if (r.k_cache) {
    key_offset_decode(r.qkv, r.k_cache, r.first_position, m.config.max_seq_len, C, HS, pairs, m.stream);
  } else {
    key_offset_forward(r.qkv, m.key_offset_scratch, m.key_offset_tails + (size_t)l * C / 2, r.rows(), C, HS, pairs,
                       m.stream);
  }
}

// Whether paired heads' attention reads qkv's rows, and writes their gradient, in place (PairedRows):
// the Hopper windowed kernels, which record #89's plan runs. Elsewhere the rows are regrouped
// around it (paired_heads_regroup), which takes 30 passes over [N, C] a layer and micro step.
bool attention_paired_in_place(const GPT2& m) {
#if defined(ENABLE_FP32)
  (void)m;
  return false;
#else
  return m.flash_attention && m.documents && flash::hopper_support().usable;
#endif
}

// The flash backward within documents takes QK-norm's backward as well (attention_backward_window's
// qk_rstd): on Hopper in its kernels' epilogues, saving a pass over q and k; not in a layer with a
// key offset, whose backward comes between the two, nor with paired heads regrouped, whose
// regrouping does (in place, the epilogues find each row's token and head: qk_norm_row).
bool composed_layer(const GPT2& m, int l);
bool qk_norm_in_attention_backward(const GPT2& m, int l) {
  return m.flash_attention && m.documents && m.arch().qk_norm_rotary && !m.plan[l].key_offset &&
         (!m.plan[l].paired || attention_paired_in_place(m)) && !composed_layer(m, l);
}

// dqkv: from the gradient of the attention's q and k to that of the qkv product's, in place
// (where the attention's backward has not done it); the key offset's first, which also puts layer
// l's keys back as the rotary wrote them for QK-norm's backward.
void qk_prepare_backward(GPT2& m, floatX* dqkv, int l, int B, int T) {
  if (!m.arch().qk_norm_rotary || qk_norm_in_attention_backward(m, l)) return;
  const int C = m.config.channels, HS = m.config.head_size();
  if (m.plan[l].key_offset) {
    key_offset_backward(dqkv, attention_qkv(m, l), m.key_offset_scratch, m.key_offset_tails + (size_t)l * C / 2,
                        B * T, C, HS, m.rotary.adjacent_pairs, m.stream);
  }
  qk_norm_rotary_backward(dqkv, attention_qkv(m, l), m.act_f(kQkRstd, l), B, T, m.config.num_heads, HS,
                          layer_rotary(m, l), m.stream);
}

// Layer l's window in blocks at sequence length T: the step's long or short one (LayerSpec::window),
// as train_gpt2.py's layer_window; without a window every block (every earlier key of the document).
// A window wider than T selects what one of T's blocks does, so none is passed wider than the
// scratch.
int layer_window(const GPT2& m, int l, int T) {
  const int blocks = T / llmc::kAttentionBlock;
  if (m.windows.long_blocks == 0) return blocks;
  return std::min(blocks, m.plan[l].window_blocks(m.windows.long_blocks, m.windows.short_blocks));
}

// Layer l's window at sequence length T in the run's unit (layer_window's blocks, or as tokens).
llmc::AttentionWindow layer_attention_window(const GPT2& m, int l, int T) {
  return llmc::AttentionWindow::of_blocks(layer_window(m, l, T), m.window_unit);
}

// The first position layer l's decoding query at position t attends to: 0, or within documents the
// first of its document (which starts at document_start) and window (llmc::attention_window_first_key;
// the layer's window at a length that covers the query's block, so that no window is every block up
// to it).
int decode_first_key_at(const GPT2& m, int l, int t, int document_start) {
  if (!m.documents) return 0;
  const int covered = (t / llmc::kAttentionBlock + 1) * llmc::kAttentionBlock;
  return llmc::attention_window_first_key(t, document_start, layer_attention_window(m, l, covered));
}
int decode_first_key(const GPT2& m, int l, const BlockRows& r) {
  return decode_first_key_at(m, l, r.first_position, r.document_start);
}

// Layer l's mask over the last forward's rows of T tokens (documents_upload); with paired heads over
// their rows of 2T positions, the window in positions.
DocumentWindow layer_document_window(const GPT2& m, int l, int T) {
  if (m.plan[l].paired) return {m.paired_spans, m.paired_document_ids, layer_attention_window(m, l, 2 * T)};
  return {m.spans, m.document_ids, layer_attention_window(m, l, T)};
}

// r.atty from r.qkv: the decoder's one query against the layer's KV cache, which it extends; or
// attention over B sequences of T positions of NH heads (C = NH HS), causal or within their documents
// (m.documents; layer_document_window of the layer's rows of T tokens), keeping what layer l's
// backward reads.
void attention_rows_of(GPT2& m, int l, const BlockRows& r, int B, int T, int C, int NH) {
  const llmc::GPT2Config& c = m.config;
  if (r.k_cache) {
    attention_forward_decode(r.atty, r.k_cache, r.v_cache, r.qkv, decode_first_key(m, l, r), r.first_position,
                             c.max_seq_len, NH, c.head_size(), attention_scale(m), m.stream);
  } else if (m.flash_attention && m.documents) {
    attention_forward_window(r.atty, m.act_f(kAtt, l), r.qkv, B, T, C, NH, attention_scale(m),
                             layer_document_window(m, l, r.T), m.stream);
  } else if (m.flash_attention) {
    attention_forward_flash(r.atty, m.act_f(kAtt, l), r.qkv, B, T, C, NH, attention_scale(m), m.stream);
  } else {
    const DocumentWindow dw = layer_document_window(m, l, r.T);
    attention_forward(r.atty, m.act(kQkvr, l), m.act(kAtt, l), m.scratch_att, m.scratch_btc, r.qkv, B, T, C, NH,
                      attention_scale(m), m.stream, m.documents ? &dw : nullptr);
  }
}

// Record #89's paired heads in training (LayerSpec::paired): the attention over sequences of 2T
// positions of NH/2 heads (r.atty [2N, C/2] is then [N, C]), r.qkv's rows read in place, or
// regrouped and put back for what comes after (and, flash, the backward's stored qkv).
void paired_attention_rows(GPT2& m, int l, const BlockRows& r) {
  const llmc::GPT2Config& c = m.config;
  if (attention_paired_in_place(m)) {
    attention_forward_window(r.atty, m.act_f(kAtt, l), r.qkv, r.B, 2 * r.T, c.channels / 2, c.num_heads / 2,
                             attention_scale(m), layer_document_window(m, l, r.T), m.stream, /*paired=*/true);
    return;
  }
  paired_heads_regroup(r.qkv, r.rows(), c.channels, PairedDirection::kForward, m.stream);
  attention_rows_of(m, l, r, r.B, 2 * r.T, c.channels / 2, c.num_heads / 2);
  paired_heads_regroup(r.qkv, r.rows(), c.channels, PairedDirection::kInverse, m.stream);
}

// Decoding with paired heads: the token at position p is positions 2p and 2p + 1 of the layer's cache
// [NH/2, 2 maxT, HS] (the document start doubled), one query each in turn, the second seeing the
// first's key; its regrouped row's halves give each its q, k and v, and its output's halves.
void paired_attention_decode(GPT2& m, int l, const BlockRows& r) {
  const llmc::GPT2Config& c = m.config;
  const int C = c.channels, half = C / 2;
  paired_heads_regroup(r.qkv, 1, C, PairedDirection::kForward, m.stream);
  for (int j = 0; j < 2; j++) {
    const int t = 2 * r.first_position + j;
    attention_forward_decode(r.atty + (size_t)j * half, r.k_cache, r.v_cache, r.qkv + (size_t)j * 3 * half,
                             decode_first_key_at(m, l, t, 2 * r.document_start), t, 2 * c.max_seq_len,
                             c.num_heads / 2, c.head_size(), attention_scale(m), m.stream);
  }
  paired_heads_regroup(r.qkv, 1, C, PairedDirection::kInverse, m.stream);
}

void attention_rows(GPT2& m, int l, const BlockRows& r) {
  const llmc::GPT2Config& c = m.config;
  if (m.plan[l].paired) {
    r.k_cache ? paired_attention_decode(m, l, r) : paired_attention_rows(m, l, r);
    return;
  }
  attention_rows_of(m, l, r, r.B, r.T, c.channels, c.num_heads);
}

// The flash kernels sum dqkv's columns per tile as they store it: the qkv bias gradient is then a
// small reduction instead of another read of dqkv; not where QK-norm's backward changes q's and
// k's gradients after them.
bool attention_sums_qkv_bias(const GPT2& m) { return m.flash_attention && !m.arch().qk_norm_rotary; }

// The gradient of layer l's attention input (the qkv after QK-norm; before it where
// qk_norm_in_attention_backward) into scratch_bt4c, from that of its output in scratch_btc, over B
// sequences of T positions of NH heads (C = NH HS; the layer's rows of `tokens` tokens a sequence). The
// flash path draws the qkv bias reduction's seed (also where it does not run, so that the seeds
// after it stay put). The GEMM path needs nothing of the mask: its att holds zeros at the keys the
// mask hid.
void attention_backward_of(GPT2& m, int l, int B, int T, int C, int NH, int tokens, KernelSeeds& seeds,
                           bool paired = false) {
  if (m.flash_attention) {
    const bool sums = attention_sums_qkv_bias(m), dots = gates_take_row_dots(m, l);
    if (m.documents) {
      const float* qk_rstd = qk_norm_in_attention_backward(m, l) ? m.act_f(kQkRstd, l) : nullptr;
      const RotaryFrequencies rotary = layer_rotary(m, l);
      attention_backward_window(m.scratch_bt4c, sums ? m.partials : nullptr, m.attention_dot, m.attention_ds,
                                m.scratch_btc, m.act(kQkvr, l), m.act(kAtty, l), m.act_f(kAtt, l), B, T, C, NH,
                                attention_scale(m), layer_document_window(m, l, tokens), m.stream, dots, qk_rstd,
                                &rotary, paired);
    } else {
      attention_backward_flash(m.scratch_bt4c, sums ? m.partials : nullptr, m.attention_dot, m.attention_ds,
                               m.scratch_btc, m.act(kQkvr, l), m.act(kAtty, l), m.act_f(kAtt, l), B, T, C, NH,
                               attention_scale(m), m.stream, dots);
    }
    const uint32_t seed_qkvb = seeds.next();
    if (sums) {
      column_sum_finalize(m.grad(llmc::kQkvb, l), m.partials, 3 * C, 3 * C, attention_flash_tile_rows(B, T),
                          seed_qkvb, m.stream);
    }
  } else {
    attention_backward(m.scratch_bt4c, m.scratch_dqkvr, m.scratch_att, m.scratch_btc, m.act(kQkvr, l),
                       m.act(kAtt, l), B, T, C, NH, attention_scale(m), m.stream);
  }
}

// With paired heads (paired_attention_rows) the flash backward reads the stored qkv as its forward
// did: in place (attention_paired_in_place), dqkv written so too; or regrouped, dqkv coming out
// regrouped, both put back. (The GEMM path keeps q, k and v permuted from the regrouped rows in
// qkvr: only dqkv.) No qkv bias: the speedrun has none.
void attention_backward_rows(GPT2& m, int l, int B, int T, KernelSeeds& seeds) {
  const int C = m.config.channels, NH = m.config.num_heads, N = B * T;
  if (!m.plan[l].paired) {
    attention_backward_of(m, l, B, T, C, NH, T, seeds);
    return;
  }
  if (attention_paired_in_place(m)) {
    attention_backward_of(m, l, B, 2 * T, C / 2, NH / 2, T, seeds, /*paired=*/true);
    return;
  }
  if (m.flash_attention) paired_heads_regroup(m.act(kQkvr, l), N, C, PairedDirection::kForward, m.stream);
  attention_backward_of(m, l, B, 2 * T, C / 2, NH / 2, T, seeds);
  paired_heads_regroup(m.scratch_bt4c, N, C, PairedDirection::kInverse, m.stream);
  if (m.flash_attention) paired_heads_regroup(m.act(kQkvr, l), N, C, PairedDirection::kInverse, m.stream);
}

// Whether the MLP's ReLU^2 and its derivative run in the epilogues of products of our own
// (flash::gemm) instead of in passes of their own: BF16 builds on Hopper, BF16 blocks, no MLP
// biases. At the speedrun's shapes the products' bits are cuBLASLt's (test_gemm), so the choice
// changes no result; it saves a [N, 4C] pass each way (dev/notes/speedrun-speed.md: "The MLP's
// ReLU^2 in our own products").
bool mlp_relu2_in_epilogues(const GPT2& m) {
#if defined(ENABLE_FP32)
  return false;
#else
  return !m.fp8 && m.arch().relu2 && flash::hopper_support().usable && m.param_specs[llmc::kFcb].size == 0 &&
         m.param_specs[llmc::kFcprojb].size == 0;
#endif
}

// fc of layer l and ReLU^2 of it: the product into r.fch (with -mr 1 only where a pass of its own
// reads it back), the activation into r.fch_act.
void fc_relu2_forward(GPT2& m, const BlockRows& r, int l, size_t n) {
#if !defined(ENABLE_FP32)
  if (mlp_relu2_in_epilogues(m)) {
    const int C = m.config.channels;
    floatX* pre = m.mlp_from_output ? nullptr : r.fch;
    flash::gemm<flash::GemmB::kNK>(r.ln2.out, m.param(llmc::kFcw, l), r.rows(), 4 * C, C,
                                   flash::GemmStoreRelu2{pre, r.fch_act}, m.stream);
    return;
  }
#endif
  gpt2_linear_forward(m, r, kLinearFc, l, r.fch, r.ln2.out, nullptr);
  relu2_forward(r.fch_act, r.fch, n, m.stream);
}

// fcproj's gradients of layer l from dout and ReLU^2' of its input gradient: dweight as
// gpt2_linear_backward (no bias), the input gradient times ReLU^2' into dinp, in one product's
// epilogue, from the stored pre-activation or (-mr 1) ReLU^2's output. BF16 builds only: FP32 ones
// never take this path (mlp_relu2_in_epilogues).
void fcproj_relu2_backward(GPT2& m, int l, floatX* dinp, const floatX* dout, const floatX* stored, int N) {
#if !defined(ENABLE_FP32)
  const int C = m.config.channels;
  matmul_dweight(m.grad(llmc::kFcprojw, l), dout, m.act(kFchAct, l), N, 4 * C, C, m.stream);
  flash::gemm<flash::GemmB::kKN>(dout, m.param(llmc::kFcprojw, l), N, 4 * C, C,
                                 flash::GemmStoreRelu2Grad{stored, dinp, m.mlp_from_output}, m.stream);
#endif
}

// The MLP of layer l over r's rows, from its norm's output r.ln2 (or, with r.fp8_sources, the
// norm's input residual2) into r.mlp_out: fc, the activation (GELU in fc's epilogue, or ReLU^2; with
// r.fp8_sources in fcproj's cast), fcproj; in a training pass with -fm 1, record #89's FP8 MLP.
void mlp_forward(GPT2& m, int l, const BlockRows& r) {
  const size_t n = (size_t)r.rows() * 4 * m.config.channels;
  if (m.fp8_mlp_pass) {
    fp8_mlp_forward(m.fp8_mlp_state, r.mlp_out, r.fch_act, r.ln2.out, l, r.rows(), m.config.channels, m.stream);
  } else if (r.fp8_sources) {
    gpt2_linear_forward_normed(m, r, kLinearFc, l, r.fch, kNorm2, r.ln2, r.residual2);
    gpt2_linear_forward(m, r, kLinearFcproj, l, r.mlp_out, r.fch, nullptr, fp8_activation_source(mlp_activation(m)));
  } else if (m.arch().relu2) {
    fc_relu2_forward(m, r, l, n);
    gpt2_linear_forward(m, r, kLinearFcproj, l, r.mlp_out, r.fch_act, nullptr);
  } else if (r.fp8 && m.fp8_delayed) {
    // Delayed scaling's first step, before any amax is recorded: the fc product the later steps
    // run (GELU's input alone), so that it is tuned in this step and not in a timed one, and
    // GELU in a pass of its own, with the bits the later steps' casts compute.
    gpt2_linear_forward(m, r, kLinearFc, l, r.fch, r.ln2.out, nullptr);
    gelu_forward(r.fch_act, r.fch, n, m.stream);
    gpt2_linear_forward(m, r, kLinearFcproj, l, r.mlp_out, r.fch_act, nullptr);
  } else {
    gpt2_linear_forward(m, r, kLinearFc, l, r.fch_act, r.ln2.out, r.fch);
    gpt2_linear_forward(m, r, kLinearFcproj, l, r.mlp_out, r.fch_act, nullptr);
  }
}

// The MLP's gradients from dout, the gradient of its output (dresidual, that of residual3[l], whose
// column sums the norm backward that wrote it has added into fcproj's bias gradient; with the
// residual lambdas p times it, sublayer_lambdas_backward_rows) into scratch_btc, the gradient of
// the MLP's input. Between the two layers scratch_bt4c holds the gradient of the activation's
// input (BF16) or output (FP8, which applies GELU' in fc's backward).
void mlp_backward(GPT2& m, int l, int N, floatX* dout, uint32_t seed_fcproj, uint32_t seed_fc) {
  const size_t n = (size_t)N * 4 * m.config.channels;
  const bool relu2 = m.arch().relu2;
  // FP8's fcproj backward reads the transposed cast its forward kept, not the activation's output.
  if (m.recompute >= 1 && !m.fp8) {
    if (relu2) relu2_forward(m.act(kFchAct, l), m.act(kFch, l), n, m.stream);
    else gelu_forward(m.act(kFchAct, l), m.act(kFch, l), n, m.stream);
  }
  // -mr 1 keeps no pre-activation: ReLU^2's derivative from its output (which -r 1 and FP8 refuse).
  const floatX* pre_act = m.mlp_from_output ? nullptr : m.act(kFch, l);
  const floatX* relu2_stored = m.mlp_from_output ? m.act(kFchAct, l) : pre_act;
  if (mlp_relu2_in_epilogues(m)) {
    fcproj_relu2_backward(m, l, m.scratch_bt4c, dout, relu2_stored, N);
  } else {
    gpt2_linear_backward(m, kLinearFcproj, l, m.scratch_bt4c, false, dout, m.act(kFchAct, l), pre_act, N,
                         seed_fcproj);
    if (relu2 && !m.fp8) {
      if (m.mlp_from_output) relu2_backward_from_output_inplace(m.scratch_bt4c, relu2_stored, n, m.stream);
      else relu2_backward_inplace(m.scratch_bt4c, pre_act, n, m.stream);
    }
  }
  gpt2_linear_backward(m, kLinearFc, l, m.scratch_btc, true, m.scratch_bt4c, m.act(kLn2, l), pre_act, N,
                       seed_fc);
}

// Logits [N, Vp] from the final norm's output: the tied wte, or the head with its bias; with fp8
// (a training pass with -fh 1) the head's FP8 layer, whose input cast head_backward reads.
void head_rows(GPT2& m, floatX* logits, const floatX* inp, int N, bool fp8 = false) {
  const llmc::GPT2Config& c = m.config;
  if (fp8) {
    matmul_forward_fp8_fixed(logits, inp, m.fp8_head_weight, N, c.channels, c.padded_vocab_size, m.fp8_head_scales,
                             m.fp8_head_buffers.rows, m.fp8_head_input_t, m.stream);
    return;
  }
  const bool tied = m.arch().tied_head;
  matmul_forward(logits, inp, m.param(tied ? llmc::kWte : llmc::kHeadw),
                 tied ? nullptr : m.param_or_null(llmc::kHeadb), N, c.channels, c.padded_vocab_size, nullptr,
                 m.stream);
}

// From the dlogits in kOutput (with -fh 1: their FP8 cast, which the classifier wrote into
// fp8_head_buffers.rows): the head's gradients, and that of the final norm's output into
// scratch_btc.
void head_backward(GPT2& m, int N, uint32_t seed) {
  const llmc::GPT2Config& c = m.config;
  if (m.fp8_head) {
    REQUIRE(m.fp8_head_tokens == N, "the FP8 head's backward of %d rows follows a training forward of them "
            "(gpt2_forward with ForwardPass::kTraining)", N);
    matmul_backward_fp8_fixed(m.scratch_btc, m.grad(llmc::kHeadw), m.fp8_head_dweight, m.fp8_head_input_t,
                              m.fp8_head_weight, m.fp8_head_scales, m.fp8_head_scales + 2, m.fp8_head_buffers, N,
                              c.channels, c.padded_vocab_size, seed, m.stream);
    return;
  }
  const bool tied = m.arch().tied_head;
  const int weight = tied ? llmc::kWte : llmc::kHeadw;
  matmul_backward(m.scratch_btc, m.grad(weight), tied ? nullptr : m.grad_or_null(llmc::kHeadb), m.partials,
                  m.act(kOutput), m.act(kLnf), m.param(weight), nullptr, N, c.channels, c.padded_vocab_size,
                  seed, m.stream);
}

// ---- Block features: what a recipe adds to the block, one group each ----
// Each group opens with its switch (llmc::ArchSpec) and names its parameter rows (llmc/gpt2.h's
// table, which checkpoints and the CPU tools read too) and its kernels (in their sections by family);
// then come the activation rows it adds (its *_activation_rows, which activation_table calls), its
// scratch, the one function that points a block's rows (BlockRows) at its tensors for a training
// pass or for the decoder (*_point_rows), and its forward and backward steps, which block_forward and
// block_backward call in their order. Which layers take part, and how, is the layer plan's
// (llmc::LayerSpec). The wiring every group reads comes first.

// The residual stream into block l: the embedding's, or block l-1's output; l = L: the final
// norm's input.
// With the bigram embedding the stream starts at the embedding plus its gated bigram embedding. With
// record #89's MUDD dense connections the last block's input is their stream and the final norm's
// their final mix.
floatX* block_input(GPT2& m, int l) {
  const int L = m.config.num_layers;
  if (m.arch().mudd_connections && l >= L - 1) return m.act(l == L ? kMuddFinalMix : kMuddStream);
  if (l > 0) return m.act(kResidual3, l - 1);
  return m.arch().bigram ? m.act(kStreamStart) : m.act(kEncoded);
}

// Whether block l's first norm is of its input as the block before leaves it: not where record #89's
// plan has its attention read an earlier layer's output, nor where its gated skip comes before the norm.
bool block_norms_own_input(const GPT2& m, int l) {
  const llmc::LayerSpec& s = m.plan[l];
  return s.attention_source < 0 && s.gated_skip_source < 0;
}

// The norm after block l, fused with its second residual add: the next block's first, or after
// the last block the final norm; none (present false) where the next block mixes its input first
// (x0_lambdas), so that its norm follows the mix, or normalises another input (block_norms_own_input),
// nor after the last block with the MUDD dense connections (their final mix comes first).
struct NormAt {
  NormSpec spec;
  int layer;
  bool present;
};
NormAt norm_after_block(const GPT2& m, int l) {
  if (l == m.config.num_layers - 1) return {kNormF, 0, !m.arch().mudd_connections};
  return {kNorm1, l + 1, !m.arch().x0_lambdas && block_norms_own_input(m, l + 1)};
}

// The gradient of layer `layer`'s kept output (LayerSpec::kept) for N rows, which the later layers
// that read it add into (the residual mix's, record #89's plan's).
floatX* kept_gradient(GPT2& m, int layer, int N) {
  return m.dkept + (size_t)m.plan[layer].kept * N * m.config.channels;
}

// Decoding block l: the kept outputs it reads (a skip's, an attention source's: before the block), and
// its output kept where a later layer reads it (after the block). The stream is updated in place, so a
// kept output is a copy.
void decode_kept_inputs(const GPT2& m, int l, BlockRows& r) {
  if (!r.kept_rows) return;
  const llmc::LayerSpec& s = m.plan[l];
  auto row = [&](int source) {
    return source >= 0 ? r.kept_rows + (size_t)m.plan[source].kept * m.config.channels : nullptr;
  };
  r.kept = row(s.skip_source >= 0 ? s.skip_source : s.gated_skip_source);
  r.attention_source = row(s.attention_source);
}
void decode_keep_output(GPT2& m, int l, const BlockRows& r) {
  const int kept = m.plan[l].kept;
  if (!r.kept_rows || kept < 0) return;
  const size_t C = m.config.channels;
  cudaCheck(cudaMemcpyAsync(r.kept_rows + kept * C, r.residual3, C * sizeof(floatX), cudaMemcpyDeviceToDevice,
                            m.stream));
}

// The decoder's rows of one token, carved in turn from one allocation (decoder_init): a first pass
// without memory (base null) counts the bytes, a second with the allocation hands them out.
struct RowArena {
  char* base = nullptr;
  size_t used = 0;
  template <typename T>
  T* take(size_t count) {
    T* p = base ? (T*)(base + used) : nullptr;
    used += llmc::round_up(count * sizeof(T), 256);
    return p;
  }
};

// ---- The gates' part of ln1's gradient: the attention gate reads ln1's first C / 64 columns, the
// value-embedding gates its first 6; their gradients go into one [N, gate_norm_columns] block, added
// to ln1's gradient from qkv's backward once.

int gate_norm_columns(const GPT2& m) {
  const int attention = m.arch().attention_gate ? m.config.channels / kAttentionGateDivisor : 0;
  return std::max(attention, m.arch().ve_gates ? kVeGateInputs : 0);
}

// The gates' part of ln1's gradient for N rows, after the first 3 N*C elements of scratch_bt4c
// (which the attention's dqkv fills), zeroed; null without gates.
floatX* gate_norm_gradient_rows(GPT2& m, int N) {
  const int columns = gate_norm_columns(m);
  if (columns == 0) return nullptr;
  floatX* dln1_gates = m.scratch_bt4c + (size_t)3 * N * m.config.channels;
  cudaCheck(cudaMemsetAsync(dln1_gates, 0, (size_t)N * columns * sizeof(floatX), m.stream));
  return dln1_gates;
}

// dln1 (scratch_btc, from qkv's backward) += the gates' part dln1_gates (gate_norm_gradient_rows).
void gate_norm_gradient(GPT2& m, const floatX* dln1_gates, int N, KernelSeeds& seeds) {
  if (!dln1_gates) return;
  const int columns = gate_norm_columns(m);
  add_columns_inplace(m.scratch_btc, m.config.channels, dln1_gates, columns, N, columns, seeds.next(), m.stream);
}

// ---- The value mix (ArchSpec::value_mix): v = a v + b ve[k] in each attention layer, v = a v where
// the plan gives the layer no value embedding k (LayerSpec::value_embedding); in record #89's plan
// (llmc::value_mix_learns_a false) v + b ve[k], v untouched elsewhere. Parameters: ve (the value
// embeddings) and value_scales (a, b), or (b); with record #89's gates (ArchSpec::ve_gates) vegate [NH,
// 12] a layer with a value embedding, each head's gate taking b's place (b then unused). Kernels:
// section 6, "The speedrun's value mix"; ve's gradient goes through the encoder backward's bucketed
// plan (section 3), the gates' part of ln1's gradient through the gates' columns (gate_norm_columns).

// v before the mix, which the backward reads for a's gradient; the gates read each layer's ln1.
void value_mix_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (llmc::value_mix_learns_a(arch)) t[kVPre].count = d.BT * d.C;
  if (arch.ve_gates) t[kLn1].layers = d.L;
}

// The column-reduction partials the value mix's backward takes (gpt2_allocate_scratch).
size_t value_mix_partials(const GPT2& m) {
  return m.arch().value_mix ? value_mix_backward_partials(m.config.num_heads) : 0;
}

void value_mix_point_rows(GPT2& m, int l, BlockRows& r, RowArena* decoder) {
  if (!llmc::value_mix_learns_a(m.arch())) return;
  r.v_pre = decoder ? decoder->take<floatX>(m.config.channels) : m.act(kVPre, l);
}

// Layer l's value embedding in ve (the table's parameters or their gradients), or null where it has none.
floatX* layer_value_embedding(const GPT2& m, floatX* ve, int l) {
  const int k = m.plan[l].value_embedding;
  return k >= 0 ? ve + (size_t)k * m.config.padded_vocab_size * m.config.channels : nullptr;
}

// Layer l's value-embedding gates over hn, its attention's normed input (none without them or
// without a value embedding); for the backward with their gradients, dhn the gates' columns
// (gate_norm_gradient_rows).
ValueMixGates value_mix_gates(GPT2& m, int l, const floatX* hn, floatX* dhn = nullptr) {
  if (!m.arch().ve_gates || m.plan[l].value_embedding < 0) return {};
  const bool backward = dhn != nullptr;
  return {m.param(llmc::kVegate, l), hn, m.config.num_heads, backward ? m.grad(llmc::kVegate, l) : nullptr, dhn,
          gate_norm_columns(m)};
}

bool mudd_layer(const GPT2& m, int l);
ValueRowGates mudd_value_gates(const floatX* layer, int NH);
bool mudd_value_backward(GPT2& m, int l, int N, KernelSeeds& seeds);

// Layer l's mix of v in r.qkv; on the MUDD dense connections' layer theirs (its value terms computed
// before the block).
void value_mix(GPT2& m, int l, const BlockRows& r) {
  if (!m.arch().value_mix) return;
  const floatX* ve = layer_value_embedding(m, m.param(llmc::kVe), l);
  if (mudd_layer(m, l)) {
    value_mix_rows_forward(r.qkv, ve, r.tokens, mudd_value_gates(r.mudd_rows[2], m.config.num_heads),
                           r.mudd_value_terms, r.rows(), m.config.channels, m.stream);
    return;
  }
  value_mix_forward(r.qkv, r.v_pre, ve, r.tokens, m.param(llmc::kValueScales, l), r.rows(), m.config.channels,
                    m.stream, value_mix_gates(m, l, r.ln1.out), llmc::value_mix_learns_a(m.arch()));
}

// From the attention's dqkv in scratch_bt4c: v's gradient before the mix (in place), the scales' and
// the value embedding's (scratch_btc its scratch); with gates theirs, and their part of ln1's
// gradient into dln1_gates (gate_norm_gradient_rows).
void value_mix_backward_rows(GPT2& m, int l, int N, floatX* dln1_gates, KernelSeeds& seeds) {
  if (!m.arch().value_mix || mudd_value_backward(m, l, N, seeds)) return;
  floatX* dve = layer_value_embedding(m, m.grad(llmc::kVe), l);
  const floatX* ve = layer_value_embedding(m, m.param(llmc::kVe), l);
  const bool learned_a = llmc::value_mix_learns_a(m.arch());
  value_mix_backward(m.scratch_bt4c, m.grad(llmc::kValueScales, l), dve, m.scratch_btc, m.partials,
                     learned_a ? m.act(kVPre, l) : nullptr, ve, m.inputs, m.param(llmc::kValueScales, l),
                     &m.encoder_plan, N, m.config.channels, seeds.next(), m.stream,
                     value_mix_gates(m, l, m.act(kLn1, l), dln1_gates), learned_a);
}

// ---- Record #89's MUDD gate generators (ArchSpec::mudd_gates, in its plan): two small MLPs whose
// rows give some of the plan's gates a token each (llmc::mudd_gate_column): the pre generator (0)
// reads x0 before the stream start's bigram add, the post one (1) block 4's input, each row
// (gelu(x W1^T) W2[:n]^T + b2[:n]) scale, n its columns (llmc::kMuddGateColumns), every step rounded
// to floatX as the reference's BF16 tensors. The products are section 1's, of copies of W1 and W2
// (act(kMuddWeights): the parameters' offsets are not 16-byte aligned; W2's rows padded with zero
// rows to llmc::kMuddGateStride), their gradients accumulated in an aligned copy likewise; the exact
// GELU is section 7's, the bias and scale section 7's gate rows. The rows, kept for the backward:
// act(kMuddGates) [2][N, stride], the pre generator's first. The gates' backward writes their
// columns of dmudd_gates (zeroed before each backward pass); each generator's backward then adds its
// input's gradient: the pre's into x0's (dresidual once block 0's backward is done), the post's
// into block 4's input's (dresidual after block 4's backward). Parameters: mudd_gate_w1 [2, 64, C],
// mudd_gate_w2 [2, 41, 64], mudd_gate_b2 [2, 41], mudd_gate_scale [1]. With the dense connections (next
// group) their two generators are generators 2 and 3 of the same rows and steps, their scale fixed.

// The generators a model runs: the gate generators' two, and with the dense connections theirs.
constexpr int kMuddLayerGenerator = 2, kMuddFinalGenerator = 3;
int mudd_generators(const llmc::ArchSpec& arch) {
  return arch.mudd_gates ? (arch.mudd_connections ? 4 : 2) : 0;
}
static_assert(llmc::kMuddConnectionHidden == llmc::kMuddGateHidden &&
                  llmc::kMuddLayerCoefficients <= llmc::kMuddGateStride,
              "the dense connections' generators take the gate generators' rows and steps");

// Generator g's parameters: tensors (W1, W2, b2), its index in them, W2's rows a generator in the
// tensor (width), the columns it gives, and its scale (a parameter, or fixed: null).
struct MuddGenerator {
  llmc::ParamIndex w1, w2, b2;
  int index, width, columns;
  bool learned_scale;
};
MuddGenerator mudd_generator(int g) {
  if (g < kMuddLayerGenerator) {
    return {llmc::kMuddGateW1, llmc::kMuddGateW2, llmc::kMuddGateB2, g, llmc::kMuddGateWidth,
            llmc::kMuddGateColumns[g], true};
  }
  return {llmc::kMuddW1, llmc::kMuddW2, llmc::kMuddB2, g - kMuddLayerGenerator, llmc::kMuddLayerCoefficients,
          g == kMuddLayerGenerator ? llmc::kMuddLayerCoefficients : llmc::kMuddFinalCoefficients, false};
}

void mudd_gates_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (!arch.mudd_gates) return;
  const size_t hidden = llmc::kMuddGateHidden, stride = llmc::kMuddGateStride, G = mudd_generators(arch);
  t[kMuddHiddenPre].count = G * d.BT * hidden;
  t[kMuddHidden].count = G * d.BT * hidden;
  t[kMuddPreScale].count = G * d.BT * stride;
  t[kMuddGates].count = G * d.BT * stride;
  t[kMuddWeights].count = G * (hidden * d.C + stride * hidden);
  t[kMuddSkipScale].count = d.BT;
}

void mudd_gates_allocate_scratch(GPT2& m, size_t N) {
  if (!m.arch().mudd_gates) return;
  const size_t hidden = llmc::kMuddGateHidden, stride = llmc::kMuddGateStride;
  m.dmudd_gates = device_alloc<floatX>(mudd_generators(m.arch()) * N * stride, "the MUDD gate rows' gradient");
  m.mudd_dpre = device_alloc<floatX>(N * stride, "the MUDD gate rows' gradient before the scale");
  m.mudd_dhidden = device_alloc<floatX>(N * hidden, "the MUDD gate generators' hidden gradient");
  m.mudd_dweight = device_alloc<floatX>(hidden * m.config.channels, "the MUDD gate generators' weight gradient");
}

// Generator g's rows of a pass of N rows, and their gradient.
floatX* mudd_rows(GPT2& m, int g, int N) { return m.act(kMuddGates) + (size_t)g * N * llmc::kMuddGateStride; }
floatX* mudd_rows_gradient(GPT2& m, int g, int N) {
  return m.dmudd_gates + (size_t)g * N * llmc::kMuddGateStride;
}

// Where a generator gives layer l's gate of `kind`: the dense connections' layer generator its x0 and
// bigram gates on their layer, else the gate generators' columns (llmc::mudd_gate_column) where the
// model has them; generator -1: none, the gate is its scalar parameter.
llmc::MuddGateColumn mudd_gate_at(const GPT2& m, llmc::MuddGate kind, int l) {
  if (m.arch().mudd_connections && l == m.config.num_layers - 1) {
    if (kind == llmc::kMuddX0) return {kMuddLayerGenerator, llmc::kMuddAttentionX0};
    if (kind == llmc::kMuddBigram) return {kMuddLayerGenerator, llmc::kMuddAttentionBigram};
  }
  return m.arch().mudd_gates ? llmc::mudd_gate_column(kind, l) : llmc::MuddGateColumn{-1, -1};
}

// Layer l's gate of `kind` as the kernels read it: its columns of a generator's rows (r.mudd_rows),
// where the model has the generators and they give it, else `scalar`, the parameter every row shares.
GateRows gate_rows(const GPT2& m, const BlockRows& r, llmc::MuddGate kind, int l, const floatX* scalar) {
  const llmc::MuddGateColumn at = mudd_gate_at(m, kind, l);
  if (at.generator < 0) return {scalar, 0};
  return {r.mudd_rows[at.generator] + at.column, llmc::kMuddGateStride};
}

// The same in a training pass of N rows (the backward's), and the gradient the gate's backward writes:
// its columns of dmudd_gates, or dscalar's (accumulated).
GateRows kept_gate_rows(GPT2& m, llmc::MuddGate kind, int l, int N, const floatX* scalar) {
  const llmc::MuddGateColumn at = mudd_gate_at(m, kind, l);
  if (at.generator < 0) return {scalar, 0};
  return {mudd_rows(m, at.generator, N) + at.column, llmc::kMuddGateStride};
}
GateGradient gate_gradient(GPT2& m, llmc::MuddGate kind, int l, int N, floatX* dscalar) {
  const llmc::MuddGateColumn at = mudd_gate_at(m, kind, l);
  if (at.generator < 0) return {dscalar, 0};
  return {mudd_rows_gradient(m, at.generator, N) + at.column, llmc::kMuddGateStride};
}

// A training or evaluation pass's rows of N tokens in block l's BlockRows (block_rows).
void mudd_gates_point_rows(GPT2& m, BlockRows& r, int N) {
  if (!m.arch().mudd_gates) return;
  for (int g = 0; g < mudd_generators(m.arch()); g++) r.mudd_rows[g] = mudd_rows(m, g, N);
  r.mudd_in0 = m.arch().mudd_connections ? block_input(m, 0) : nullptr;
  r.mudd_value_terms = m.arch().mudd_connections ? m.act(kMuddValueTerms) : nullptr;
  r.skip_scale = m.act(kMuddSkipScale);
}

// Where a generator's forward writes besides its rows: its copies of W1 [64, C] and of W2 padded [stride,
// 64], which the products read, its hidden layer's input and output [N, 64] and its rows before the
// scale [N, stride].
struct MuddGeneratorRows {
  floatX* w1 = nullptr;
  floatX* w2 = nullptr;
  floatX* hidden_pre = nullptr;
  floatX* hidden = nullptr;
  floatX* pre = nullptr;
};

// A pass's, of N rows, for generator g (the backward reads them).
MuddGeneratorRows mudd_pass_rows(GPT2& m, int g, int N) {
  const size_t H = llmc::kMuddGateHidden, S = llmc::kMuddGateStride, C = m.config.channels;
  floatX* w1 = m.act(kMuddWeights) + g * H * (C + S);
  return {w1, w1 + H * C, m.act(kMuddHiddenPre) + g * N * H, m.act(kMuddHidden) + g * N * H,
          m.act(kMuddPreScale) + g * N * S};
}

// The decoder's, one row, from the arena (both generators share it; each writes its own rows).
MuddGeneratorRows mudd_decoder_rows(GPT2& m, RowArena& a) {
  const size_t H = llmc::kMuddGateHidden, S = llmc::kMuddGateStride, C = m.config.channels;
  return {a.take<floatX>(H * C), a.take<floatX>(S * H), a.take<floatX>(H), a.take<floatX>(H), a.take<floatX>(S)};
}

// grad [rows, cols] (at any offset) += dout[N, rows]^T @ inp[N, cols], accumulated in the aligned
// copy mudd_dweight (ld_out: dout's row length, at least rows).
void mudd_weight_gradient(floatX* grad, const floatX* dout, const floatX* inp, int N, int cols, int rows, int ld_out,
                          cudaStream_t stream, floatX* scratch) {
  const size_t n = (size_t)rows * cols;
  cudaCheck(cudaMemsetAsync(scratch, 0, (size_t)ld_out * cols * sizeof(floatX), stream));
  cudaCheck(cudaMemcpyAsync(scratch, grad, n * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
  matmul_dweight(scratch, dout, inp, N, cols, ld_out, stream);
  cudaCheck(cudaMemcpyAsync(grad, scratch, n * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
}

// Generator g's rows of x [N, C] into rows [N, stride], the steps between into w's.
void mudd_generator_forward(GPT2& m, int g, const floatX* x, floatX* rows, const MuddGeneratorRows& w, int N) {
  const int C = m.config.channels, H = llmc::kMuddGateHidden, S = llmc::kMuddGateStride;
  const MuddGenerator gen = mudd_generator(g);
  floatX *w1 = w.w1, *w2 = w.w2, *hidden_pre = w.hidden_pre, *hidden = w.hidden, *pre = w.pre;
  cudaCheck(cudaMemcpyAsync(w1, m.param(gen.w1) + (size_t)gen.index * H * C, (size_t)H * C * sizeof(floatX),
                            cudaMemcpyDeviceToDevice, m.stream));
  cudaCheck(cudaMemsetAsync(w2, 0, (size_t)S * H * sizeof(floatX), m.stream));
  cudaCheck(cudaMemcpyAsync(w2, m.param(gen.w2) + (size_t)gen.index * gen.width * H,
                            (size_t)gen.columns * H * sizeof(floatX), cudaMemcpyDeviceToDevice, m.stream));
  matmul_forward(hidden_pre, x, w1, nullptr, N, C, H, nullptr, m.stream);
  gelu_erf_forward(hidden, hidden_pre, (size_t)N * H, m.stream);
  matmul_forward(pre, hidden, w2, nullptr, N, H, S, nullptr, m.stream);
  gate_rows_bias_scale(rows, pre, pre, m.param(gen.b2) + (size_t)gen.index * gen.width,
                       gen.learned_scale ? m.param(llmc::kMuddGateScale) : nullptr, N, gen.columns, S, m.stream,
                       (float)llmc::kMuddConnectionScale);
}

// A pass's generator g of x [N, C] (x0 for the pre, block 4's input for the post; the dense connections'
// the last layer's input and output) into its kept rows.
void mudd_gates_forward(GPT2& m, int g, const floatX* x, int N) {
  if (!m.arch().mudd_gates) return;
  mudd_generator_forward(m, g, x, mudd_rows(m, g, N), mudd_pass_rows(m, g, N), N);
}

// Zeroes dmudd_gates before a backward pass of N rows: columns no gate reads keep a zero gradient.
void mudd_gates_zero_gradients(GPT2& m, int N) {
  if (!m.arch().mudd_gates) return;
  cudaCheck(cudaMemsetAsync(m.dmudd_gates, 0,
                            mudd_generators(m.arch()) * (size_t)N * llmc::kMuddGateStride * sizeof(floatX), m.stream));
}

// From generator g's rows' gradient (complete once the gates it gives have their backward), its
// parameters' gradients and its input x's: dx [N, C] += it (scratch_btc its scratch).
void mudd_gates_backward(GPT2& m, int g, const floatX* x, floatX* dx, int N, KernelSeeds& seeds) {
  if (!m.arch().mudd_gates) return;
  const int C = m.config.channels, H = llmc::kMuddGateHidden, S = llmc::kMuddGateStride;
  const MuddGenerator gen = mudd_generator(g);
  const size_t w2_offset = (size_t)gen.index * gen.width * H;
  const MuddGeneratorRows w = mudd_pass_rows(m, g, N);
  gate_rows_bias_scale_backward(m.mudd_dpre, m.grad(gen.b2) + gen.index * gen.width,
                                gen.learned_scale ? m.grad(llmc::kMuddGateScale) : nullptr, m.partials,
                                mudd_rows_gradient(m, g, N), w.pre,
                                gen.learned_scale ? m.param(llmc::kMuddGateScale) : nullptr, N, gen.columns, S,
                                seeds.next(), m.stream, (float)llmc::kMuddConnectionScale);
  mudd_weight_gradient(m.grad(gen.w2) + w2_offset, m.mudd_dpre, w.hidden, N, H, gen.columns, S, m.stream,
                       m.mudd_dweight);
  matmul_dinp_product(m.mudd_dhidden, w.w2, false, m.mudd_dpre, nullptr, N, H, S, MatmulOperands(), m.stream);
  gelu_erf_backward_inplace(m.mudd_dhidden, w.hidden_pre, (size_t)N * H, m.stream);
  mudd_weight_gradient(m.grad(gen.w1) + (size_t)gen.index * H * C, m.mudd_dhidden, x, N, C, H, H, m.stream,
                       m.mudd_dweight);
  matmul_dinp_product(m.scratch_btc, w.w1, false, m.mudd_dhidden, nullptr, N, C, H, MatmulOperands(), m.stream);
  add_inplace(dx, m.scratch_btc, (size_t)N * C, seeds.next(), m.stream);
}

// ---- Record #89's MUDD dense connections (ArchSpec::mudd_connections, in its plan, with the gate
// generators): the plan's last layer and the stream after it mix earlier rows with coefficients a token
// from two generators of the gate generators' form (generators 2 and 3 above, scale fixed), SPEC
// "Record #89's MUDD dense connections". in0 is the stream entering layer 0 (block_input(0)), outK layer
// K's output (out3 and out7 kept, out9 the last layer's input), ve0 layer 1's value-embedding lookup.
// Forward: generator 2 of out9 gives the last layer's coefficients m; its input becomes the stream
// (1 + m5) out9 + m3 in0 + m4 out7 (act(kMuddStream), block_input(L - 1)), its value v + (g e + (m0 in0
// + m1 out7 + m2 out9)) with each half of the heads' gate m6, m7 (the value terms in act(kMuddValueTerms)),
// its attention's add m8 x + (m9 attn + m10 in0 + m11 b) and its MLP's m12 x + m13 mlp (the residual
// lambdas' adds with scales a row, the x0 and bigram gates the rows'). After it generator 3 of its output
// out10 gives the final mix out10 + m0 in0 + m1 out7 + m2 out9 + m3 ve0 + m4 out3 (act(kMuddFinalMix),
// block_input(L)), then the final norm. Backward: each term's gradient goes where its row's joins: in0's
// into dmudd_in0 (joined into the stream start's after block 0), out9's into dmudd_out9 (the last
// layer's input gradient once its block and the stream are done), out3's and out7's into their kept
// gradients, ve0's through the encoder backward into its table; each generator's input gradient after
// its coefficients' (section 3's gated terms and row gates; section 6's value rows; section 4's
// lambdas a row). Parameters: mudd_w1 [2, 64, C], mudd_w2 [2, 14, 64], mudd_b2 [2, 14].

bool mudd_layer(const GPT2& m, int l) { return m.arch().mudd_connections && l == m.config.num_layers - 1; }

void mudd_connections_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (!arch.mudd_connections) return;
  for (int i : {kMuddStream, kMuddValueTerms, kMuddFinalMix, kMuddVe0}) t[i].count = d.BT * d.C;
}

void mudd_connections_allocate_scratch(GPT2& m, size_t N) {
  if (!m.arch().mudd_connections) return;
  const size_t n = N * m.config.channels;
  m.dmudd_in0 = device_alloc<floatX>(n, "the MUDD connections' in0 gradient");
  m.dmudd_out9 = device_alloc<floatX>(n, "the MUDD connections' out9 gradient");
  m.dmudd_ve0 = device_alloc<floatX>(n, "the MUDD connections' ve0 gradient");
  m.dmudd_value_terms = device_alloc<floatX>(n, "the MUDD connections' value terms' gradient");
}

// Where the connections find their rows: a pass's (mudd_pass_connection_rows) or the decoder's one
// token's (decoder_rows): the rows they mix, those they write, and the two generators' rows.
struct MuddConnectionRows {
  const floatX* in0 = nullptr;
  const floatX* out3 = nullptr;
  const floatX* out7 = nullptr;
  const floatX* out9 = nullptr;
  floatX* ve0 = nullptr;          // layer 1's value-embedding lookup
  floatX* stream = nullptr;       // the last layer's input
  floatX* value_terms = nullptr;  // its value's terms m0 in0 + m1 out7 + m2 out9
  floatX* final_mix = nullptr;    // the final norm's input
  const floatX* layer = nullptr;  // generator 2's rows
  const floatX* final = nullptr;  // generator 3's rows
};

MuddConnectionRows mudd_pass_connection_rows(GPT2& m, int N) {
  const int L = m.config.num_layers;
  MuddConnectionRows c;
  c.in0 = block_input(m, 0);
  c.out3 = m.act(kResidual3, llmc::kMuddOut3);
  c.out7 = m.act(kResidual3, llmc::kMuddOut7);
  c.out9 = m.act(kResidual3, L - 2);
  c.ve0 = m.act(kMuddVe0);
  c.stream = m.act(kMuddStream);
  c.value_terms = m.act(kMuddValueTerms);
  c.final_mix = m.act(kMuddFinalMix);
  c.layer = mudd_rows(m, kMuddLayerGenerator, N);
  c.final = mudd_rows(m, kMuddFinalGenerator, N);
  return c;
}

// The decoder's, for its one token: in0 and out9 copies of the stream (updated in place), out3 and out7
// its kept rows, ve0 and the value terms rows of their own, the stream and the final mix the stream
// itself, the generators' rows r.mudd_rows'.
MuddConnectionRows mudd_decoder_connection_rows(const GPT2& m, BlockRows& r, RowArena& a) {
  const size_t C = m.config.channels;
  MuddConnectionRows c;
  c.in0 = a.take<floatX>(C);
  c.out9 = a.take<floatX>(C);
  c.out3 = r.kept_rows + (size_t)m.plan[llmc::kMuddOut3].kept * C;
  c.out7 = r.kept_rows + (size_t)m.plan[llmc::kMuddOut7].kept * C;
  c.ve0 = a.take<floatX>(C);
  c.value_terms = a.take<floatX>(C);
  c.stream = c.final_mix = r.residual3;
  c.layer = r.mudd_rows[kMuddLayerGenerator];
  c.final = r.mudd_rows[kMuddFinalGenerator];
  r.mudd_in0 = c.in0;
  r.mudd_value_terms = c.value_terms;
  return c;
}

// Coefficient k of a generator's rows, its gradient (a pass's of N tokens), and the terms they weigh.
GateRows mudd_coefficient(const floatX* rows, int k, float offset = 0.0f) {
  return {rows + k, llmc::kMuddGateStride, offset};
}
GateGradient mudd_coefficient_gradient(GPT2& m, int g, int k, int N) {
  return {mudd_rows_gradient(m, g, N) + k, llmc::kMuddGateStride};
}

// Terms of rows weighed by a generator's coefficients from column `first` on: the last layer's value
// terms (m0-m2), its stream's (m3, m4; its scale of out9, 1 + m5, apart), the final mix's five.
GatedTerms mudd_terms(const floatX* coefficients, int first, std::initializer_list<const floatX*> rows) {
  GatedTerms terms;
  for (const floatX* row : rows) {
    terms.terms[terms.count] = {row, mudd_coefficient(coefficients, first + terms.count)};
    terms.count++;
  }
  return terms;
}
GatedTerms mudd_value_terms(const MuddConnectionRows& c) {
  return mudd_terms(c.layer, llmc::kMuddValueIn0, {c.in0, c.out7, c.out9});
}
GatedTerms mudd_stream_terms(const MuddConnectionRows& c) {
  return mudd_terms(c.layer, llmc::kMuddStreamIn0, {c.in0, c.out7});
}
GatedTerms mudd_final_terms(const MuddConnectionRows& c) {
  return mudd_terms(c.final, 0, {c.in0, c.out7, c.out9, c.ve0, c.out3});
}
GateRows mudd_stream_scale(const floatX* layer) { return mudd_coefficient(layer, llmc::kMuddStreamX, 1.0f); }
ValueRowGates mudd_value_gates(const floatX* layer, int NH) {
  return {mudd_coefficient(layer, llmc::kMuddVeGateFirst), mudd_coefficient(layer, llmc::kMuddVeGateSecond), NH};
}

// A pass's terms' gradients, in mudd_terms' order.
std::vector<floatX*> mudd_value_term_gradients(GPT2& m, int N) {
  return {m.dmudd_in0, kept_gradient(m, llmc::kMuddOut7, N), m.dmudd_out9};
}
std::vector<floatX*> mudd_final_term_gradients(GPT2& m, int N) {
  return {m.dmudd_in0, kept_gradient(m, llmc::kMuddOut7, N), m.dmudd_out9, m.dmudd_ve0,
          kept_gradient(m, llmc::kMuddOut3, N)};
}

// Before the last block (its coefficients from out9 in c.layer): its input stream and its value terms.
void mudd_layer_rows(GPT2& m, const MuddConnectionRows& c, int N) {
  const int C = m.config.channels;
  gated_sum_forward(c.stream, c.out9, mudd_stream_scale(c.layer), mudd_stream_terms(c), N, C, m.stream);
  gated_sum_forward(c.value_terms, nullptr, {}, mudd_value_terms(c), N, C, m.stream);
}

// After the last block (its output out10, generator 3's coefficients of it in c.final): ve0 of the
// tokens, the final mix, and the final norm into out.
void mudd_final_rows(GPT2& m, const MuddConnectionRows& c, const floatX* out10, const int* tokens,
                     const NormRows& out, int N) {
  const int C = m.config.channels;
  encoder_forward(c.ve0, tokens, layer_value_embedding(m, m.param(llmc::kVe), llmc::kMuddVe0Layer), nullptr, 1, N,
                  C, m.stream);
  gated_sum_forward(c.final_mix, out10, {}, mudd_final_terms(c), N, C, m.stream);
  norm_rows(m, kNormF, 0, out, c.final_mix, N);
}

// A pass's: before the last block, and after it.
void mudd_layer_forward(GPT2& m, int N) {
  if (!m.arch().mudd_connections) return;
  const MuddConnectionRows c = mudd_pass_connection_rows(m, N);
  mudd_gates_forward(m, kMuddLayerGenerator, c.out9, N);
  mudd_layer_rows(m, c, N);
}
void mudd_final_forward(GPT2& m, int N) {
  if (!m.arch().mudd_connections) return;
  const MuddConnectionRows c = mudd_pass_connection_rows(m, N);
  const floatX* out10 = m.act(kResidual3, m.config.num_layers - 1);
  mudd_gates_forward(m, kMuddFinalGenerator, out10, N);
  mudd_final_rows(m, c, out10, m.inputs, {m.act(kLnf), m.act_f(kLnfMean), m.act_f(kLnfRstd)}, N);
}

// The backward of terms (gated_sum_forward's) from dout: each term's gradient += g dout, each
// coefficient's row gradient dout . term.
void mudd_terms_backward(GPT2& m, const GatedTerms& terms, const std::vector<floatX*>& dterms, int g, int first,
                         const floatX* dout, int N) {
  for (int t = 0; t < terms.count; t++) {
    gated_term_rows_backward(dterms[t], mudd_coefficient_gradient(m, g, first + t, N), nullptr, dout,
                             terms.terms[t].values, terms.terms[t].gate, N, m.config.channels, m.stream);
  }
}

// The gradients the backward adds into, zeroed before it.
void mudd_connections_zero_gradients(GPT2& m, int N) {
  if (!m.arch().mudd_connections) return;
  const size_t bytes = (size_t)N * m.config.channels * sizeof(floatX);
  for (floatX* d : {m.dmudd_in0, m.dmudd_out9, m.dmudd_ve0}) cudaCheck(cudaMemsetAsync(d, 0, bytes, m.stream));
}

// From dresidual, the gradient of the final mix (after the final norm's backward): the terms' and
// coefficients' gradients, ve0's into its table, then generator 3's; dresidual is then out10's.
void mudd_final_backward(GPT2& m, int N, KernelSeeds& seeds) {
  if (!m.arch().mudd_connections) return;
  const int C = m.config.channels;
  const MuddConnectionRows c = mudd_pass_connection_rows(m, N);
  mudd_terms_backward(m, mudd_final_terms(c), mudd_final_term_gradients(m, N), kMuddFinalGenerator, 0, m.dresidual,
                      N);
  encoder_backward(layer_value_embedding(m, m.grad(llmc::kVe), llmc::kMuddVe0Layer), nullptr, m.encoder_plan,
                   m.dmudd_ve0, 1, N, C, seeds.next(), m.stream);
  mudd_gates_backward(m, kMuddFinalGenerator, m.act(kResidual3, m.config.num_layers - 1), m.dresidual, N, seeds);
}

// The last layer's value from dqkv's dv (scratch_bt4c): the head gates' and ve's gradients, then the value
// terms'. True where the layer's value is the connections'.
bool mudd_value_backward(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!mudd_layer(m, l)) return false;
  const int C = m.config.channels;
  const MuddConnectionRows c = mudd_pass_connection_rows(m, N);
  value_mix_rows_backward(m.dmudd_value_terms, layer_value_embedding(m, m.grad(llmc::kVe), l),
                          mudd_coefficient_gradient(m, kMuddLayerGenerator, llmc::kMuddVeGateFirst, N),
                          mudd_coefficient_gradient(m, kMuddLayerGenerator, llmc::kMuddVeGateSecond, N),
                          m.scratch_btc, m.scratch_bt4c, layer_value_embedding(m, m.param(llmc::kVe), l), m.inputs,
                          mudd_value_gates(c.layer, m.config.num_heads), m.encoder_plan, N, C, seeds.next(),
                          m.stream);
  mudd_terms_backward(m, mudd_value_terms(c), mudd_value_term_gradients(m, N), kMuddLayerGenerator,
                      llmc::kMuddValueIn0, m.dmudd_value_terms, N);
  return true;
}

// After the last block's backward, from dresidual, the gradient of its input stream: out9's part (1 + m5)
// dresidual and the stream terms', then generator 2's; dresidual is then out9's whole gradient.
void mudd_layer_backward(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!mudd_layer(m, l)) return;
  const int C = m.config.channels;
  const MuddConnectionRows c = mudd_pass_connection_rows(m, N);
  gated_term_rows_backward(m.dmudd_out9, mudd_coefficient_gradient(m, kMuddLayerGenerator, llmc::kMuddStreamX, N),
                           nullptr, m.dresidual, c.out9, mudd_stream_scale(c.layer), N, C, m.stream);
  const std::vector<floatX*> value_terms = mudd_value_term_gradients(m, N);
  mudd_terms_backward(m, mudd_stream_terms(c), {value_terms[0], value_terms[1]}, kMuddLayerGenerator,
                      llmc::kMuddStreamIn0, m.dresidual, N);
  cudaCheck(cudaMemcpyAsync(m.dresidual, m.dmudd_out9, (size_t)N * C * sizeof(floatX), cudaMemcpyDeviceToDevice,
                            m.stream));
  mudd_gates_backward(m, kMuddLayerGenerator, c.out9, m.dresidual, N, seeds);
}

// After block 0's backward, dresidual (the gradient of the stream start in0) takes the connections' part.
void mudd_in0_join(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!m.arch().mudd_connections || l != 0) return;
  add_inplace(m.dresidual, m.dmudd_in0, (size_t)N * m.config.channels, seeds.next(), m.stream);
}

// ---- Record #89's composed attention (ArchSpec::composed_attention, on layer llmc::kComposedLayer): the
// heads' outputs gain w_out_h (A v_h) after the flash attention and before XSA and the head gates, which
// read its output (composed_out, one layer's rows; atty stays the flash output, which the flash backward
// reads). Its weights are the post MUDD gate generator's columns. Kernels: section 6, "Record #89's
// composed attention". The gradient of its output is the flash output's too, so the flash backward
// reads it as it is; then the composition's backward adds its q, k and v gradients into dqkv (the layer
// keeps QK-norm's backward out of the flash backward: qk_norm_in_attention_backward) and writes its
// weights' into the generator rows' gradient. Decoding composes the token's output over the layer's KV
// cache (composed_attention_decode), the document's start its first key.
bool composed_layer(const GPT2& m, int l) { return m.arch().composed_attention && l == llmc::kComposedLayer; }

// Its output, each head's log-sum-exp and the backward's per-query sums: one layer's rows.
void composed_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (!arch.composed_attention) return;
  t[kComposedOut].count = d.BT * d.C;
  t[kComposedLse].count = d.BT * d.NH;
  t[kComposedRowDots].count = d.BT * d.NH;
}

void composed_point_rows(GPT2& m, BlockRows& r, RowArena* decoder) {
  if (!m.arch().composed_attention) return;
  r.composed = decoder ? decoder->take<floatX>(m.config.channels) : m.act(kComposedOut);
  r.composed_lse = decoder ? decoder->take<float>(m.config.num_heads) : m.act_f(kComposedLse);
}

// The attention's output before XSA: the composed one on its layer, else the flash output.
const floatX* attention_core(const GPT2& m, int l, const BlockRows& r) {
  return composed_layer(m, l) ? r.composed : r.atty;
}
const floatX* attention_core_kept(GPT2& m, int l) {
  return composed_layer(m, l) ? m.act(kComposedOut) : m.act(kAtty, l);
}

// Each token's document within the forward's rows, or null (one a row).
const int* composed_documents(const GPT2& m) { return m.documents ? m.document_ids : nullptr; }

void composed_rows(GPT2& m, int l, const BlockRows& r) {
  if (!composed_layer(m, l)) return;
  const llmc::GPT2Config& c = m.config;
  if (r.k_cache) {
    composed_attention_decode(r.composed, r.composed_lse, r.atty, r.qkv, r.k_cache, r.v_cache,
                              gate_rows(m, r, llmc::kMuddComposedIn, l, nullptr),
                              gate_rows(m, r, llmc::kMuddComposedOut, l, nullptr), r.document_start,
                              r.first_position, c.max_seq_len, llmc::kComposedWindow, attention_scale(m),
                              c.num_heads, c.channels, m.stream);
    return;
  }
  composed_attention_forward(r.composed, r.composed_lse, r.atty, r.qkv,
                             gate_rows(m, r, llmc::kMuddComposedIn, l, nullptr),
                             gate_rows(m, r, llmc::kMuddComposedOut, l, nullptr), composed_documents(m), r.T,
                             llmc::kComposedWindow, attention_scale(m), r.rows(), c.num_heads, c.channels, m.stream);
}

// After the flash backward wrote dqkv (scratch_bt4c) from the gradient of the output (scratch_btc).
void composed_backward_rows(GPT2& m, int l, int B, int T) {
  if (!composed_layer(m, l)) return;
  const llmc::GPT2Config& c = m.config;
  const int N = B * T;
  composed_attention_backward(m.scratch_bt4c, gate_gradient(m, llmc::kMuddComposedIn, l, N, nullptr),
                              gate_gradient(m, llmc::kMuddComposedOut, l, N, nullptr), m.act_f(kComposedRowDots),
                              m.scratch_btc, attention_qkv(m, l), m.act_f(kComposedLse),
                              kept_gate_rows(m, llmc::kMuddComposedIn, l, N, nullptr),
                              kept_gate_rows(m, llmc::kMuddComposedOut, l, N, nullptr), composed_documents(m), T,
                              llmc::kComposedWindow, attention_scale(m), N, c.num_heads, c.channels, m.stream);
}

// ---- Record #89's XSA (ArchSpec::xsa, in the plan's XSA layers: LayerSpec::xsa): each head's
// attention output loses tanh(alpha_h) times its part along the value it read (v after the value
// mix), before the attention gate. Parameters: xsa_alpha [NH] a layer with XSA. Kernels: section 6,
// "Record #89's exclusive self-attention". The gate and attproj read XSA's output (xsa_out, kept a
// layer), the attention's backward its own output (atty), whose gradient XSA's backward gives: so
// on XSA layers the gate's backward leaves the flash backward's row dots to it (gates_take_row_dots).
// XSA's backward writes v's gradient over the layer's xsa_out, which nothing reads after the gate's
// backward, and adds it to the attention's dv once the attention's backward has written dqkv.

bool xsa_layer(const GPT2& m, int l) { return m.arch().xsa && m.plan[l].xsa; }

// XSA's output, what the gate reads: every layer's rows (only the XSA layers' written).
void xsa_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (!arch.xsa) return;
  t[kXsaOut].count = d.BT * d.C;
  t[kXsaOut].layers = d.L;
}

// The column-reduction partials XSA's backward takes (gpt2_allocate_scratch).
size_t xsa_partials(const GPT2& m) { return m.arch().xsa ? xsa_backward_partials(m.config.num_heads) : 0; }

void xsa_point_rows(GPT2& m, int l, BlockRows& r, RowArena* decoder) {
  if (!m.arch().xsa) return;
  r.xsa_out = decoder ? decoder->take<floatX>(m.config.channels) : m.act(kXsaOut, l);
}

// Layer l's attention output as the gate (or attproj) reads it: XSA's where the layer has it.
const floatX* attention_output(const GPT2& m, int l, const BlockRows& r) {
  return xsa_layer(m, l) ? r.xsa_out : attention_core(m, l, r);
}

// The same, as the forward kept it, for the backward.
const floatX* attention_output_kept(GPT2& m, int l) {
  return xsa_layer(m, l) ? m.act(kXsaOut, l) : attention_core_kept(m, l);
}

// Layer l's XSA of r.atty into r.xsa_out, with the values in r.qkv (the decoder's token's too).
void xsa_rows(GPT2& m, int l, const BlockRows& r) {
  if (!xsa_layer(m, l)) return;
  const int C = m.config.channels;
  xsa_forward(r.xsa_out, attention_core(m, l, r), r.qkv + 2 * C, 3 * C,
              gate_rows(m, r, llmc::kMuddXsa, l, m.param(llmc::kXsaAlpha, l)), r.rows(), m.config.num_heads, C,
              m.stream);
}

// From scratch_btc, the gradient of XSA's output: that of the attention's output (in place), the
// strengths', and v's into the layer's xsa_out (xsa_values_gradient adds it to dqkv).
void xsa_backward_rows(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!xsa_layer(m, l)) return;
  const int C = m.config.channels;
  xsa_backward(m.scratch_btc, m.act(kXsaOut, l), gate_gradient(m, llmc::kMuddXsa, l, N, m.grad(llmc::kXsaAlpha, l)),
               m.partials, m.scratch_btc, attention_core_kept(m, l), attention_qkv(m, l) + 2 * C, 3 * C,
               kept_gate_rows(m, llmc::kMuddXsa, l, N, m.param(llmc::kXsaAlpha, l)), N,
               m.config.num_heads, C, seeds.next(), m.stream);
}

// dqkv's v part (scratch_bt4c, from the attention's backward) += XSA's part of v's gradient.
void xsa_values_gradient(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!xsa_layer(m, l)) return;
  const int C = m.config.channels;
  add_columns_inplace(m.scratch_bt4c + 2 * C, 3 * C, m.act(kXsaOut, l), C, N, C, seeds.next(), m.stream);
}

// ---- Record #89's head gates (its plan's LayerSpec::head_gate): each head's attention output (XSA's
// on its layers) times its gate before the output projection; record #28's attention gate is not in
// that plan. The reference's gates come from its MUDD gate generators, which this model has not: each
// is a learned scalar a layer and head. Parameters: head_gates [NH] a head-gate layer. Kernels:
// section 6, "Record #89's head gates". The gated output goes to scratch (attproj's backward has it
// recomputed: head_gated_kept); the flash backward takes its row dots from the attention's own
// output and the gradient the gates' backward gives it, as without gates.
bool head_gate_layer(const GPT2& m, int l) { return m.plan[l].head_gate; }

// The gated output's rows: scratch_bt4c in a training pass (free between the attention and attproj),
// the decoder's own row.
void head_gate_point_rows(GPT2& m, BlockRows& r, RowArena* decoder) {
  if (m.plan.head_gate_layers == 0) return;
  r.gated = decoder ? decoder->take<floatX>(m.config.channels) : m.scratch_bt4c;
}

// Layer l's attention output with its heads gated, into r.gated.
const floatX* head_gated(GPT2& m, int l, const BlockRows& r) {
  head_gate_forward(r.gated, attention_output(m, l, r),
                    gate_rows(m, r, llmc::kMuddHeadGate, l, m.param(llmc::kHeadGates, l)), r.rows(),
                    m.config.num_heads, m.config.channels, m.stream);
  return r.gated;
}

// The same for the backward, recomputed from the kept attention output into scratch_bt4c.
const floatX* head_gated_kept(GPT2& m, int l, int N) {
  head_gate_forward(m.scratch_bt4c, attention_output_kept(m, l),
                    kept_gate_rows(m, llmc::kMuddHeadGate, l, N, m.param(llmc::kHeadGates, l)), N,
                    m.config.num_heads, m.config.channels, m.stream);
  return m.scratch_bt4c;
}

// From scratch_btc, the gradient of the gated output: that of the attention's output (in place) and
// the gates'.
void head_gate_backward_rows(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!head_gate_layer(m, l)) return;
  head_gate_backward(m.scratch_btc, gate_gradient(m, llmc::kMuddHeadGate, l, N, m.grad(llmc::kHeadGates, l)),
                     m.partials, m.scratch_btc, attention_output_kept(m, l),
                     kept_gate_rows(m, llmc::kMuddHeadGate, l, N, m.param(llmc::kHeadGates, l)), N,
                     m.config.num_heads, m.config.channels, seeds.next(), m.stream);
}

// ---- The attention gate (ArchSpec::attention_gate): each head's output times sigmoid(gate . h[:G]),
// h the block's normed input (ln1), G = C / 64. Parameters: attngate [NH, G] per attention layer.
// Kernels: section 6, "The speedrun's attention gate"; with the flash backward the gate's backward
// also computes the attention's row dots (AttentionRowDots), which the flash backward then skips.

// The gates, each layer's ln1 (the gates read it, even where FP8 casts compute the norm: block_rows),
// and the gated output unless -r 1 or FP8 (attproj_input recomputes it; FP8's attproj backward reads
// its transposed cast): else it goes to scratch.
void attention_gate_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (!arch.attention_gate) return;
  t[kLn1].layers = d.L;
  t[kGates].count = d.BT * d.NH;
  if (d.act_per_layer) t[kGated].count = d.BT * d.C;
}

// The column-reduction partials the gate's backward takes for N rows (gpt2_allocate_scratch).
size_t attention_gate_partials(const GPT2& m, size_t N) {
  const llmc::GPT2Config& c = m.config;
  return m.arch().attention_gate ? attention_gate_backward_partials((int)N, c.num_heads, c.channels) : 0;
}

void attention_gate_point_rows(GPT2& m, int l, BlockRows& r, RowArena* decoder) {
  if (!m.arch().attention_gate) return;
  if (decoder) {
    r.gates = decoder->take<float>(m.config.num_heads);
    r.gated = decoder->take<floatX>(m.config.channels);
    return;
  }
  r.gates = m.act_f(kGates, l);
  r.gated = m.act_specs[kGated].count > 0 ? m.act(kGated, l) : m.scratch_bt4c;
}

// attproj's input: the attention's output (XSA's on its layers), or its heads gated into r.gated
// (record #89's head gates where the plan has them: head_gated).
const floatX* attention_gated(GPT2& m, int l, const BlockRows& r) {
  if (head_gate_layer(m, l)) return head_gated(m, l, r);
  if (!m.arch().attention_gate) return attention_output(m, l, r);
  attention_gate_forward(r.gated, r.gates, attention_output(m, l, r), r.ln1.out, m.param(llmc::kAttngate, l), r.rows(),
                         m.config.num_heads, m.config.channels, m.stream);
  return r.gated;
}

// The gates' backward reads the attention's output and writes its gradient, so it takes the flash
// backward's row dots as well (attention_gate_backward's row_dots), where its warps can; not in an
// XSA layer, where it reads XSA's output and writes that one's gradient.
bool gates_take_row_dots(const GPT2& m, int l) {
  return m.flash_attention && m.arch().attention_gate && !xsa_layer(m, l) &&
         attention_gate_row_dots_supported(m.config.num_heads, m.config.channels);
}

// attproj's input as the forward kept it, or recomputed from the attention's output (XSA's on its
// layers) and the gates into scratch_bt4c (-r 1); without gates the attention's output.
const floatX* attproj_input(GPT2& m, int l, int N) {
  if (head_gate_layer(m, l)) return head_gated_kept(m, l, N);
  if (!m.arch().attention_gate) return attention_output_kept(m, l);
  if (m.act_specs[kGated].count > 0) return m.act(kGated, l);
  attention_gate_apply(m.scratch_bt4c, attention_output_kept(m, l), m.act_f(kGates, l), N, m.config.num_heads,
                       m.config.channels, m.stream);
  return m.scratch_bt4c;
}

// From scratch_btc, the gradient of the gated output: that of the attention's output (in place)
// and the gate's; the gate's part of ln1's gradient into dln1_gates (gate_norm_gradient_rows). With
// the flash backward (gates_take_row_dots) the gates' kernel also writes the flash backward's row
// dots into attention_dot.
void attention_gate_backward_rows(GPT2& m, int l, int B, int T, floatX* dln1_gates, KernelSeeds& seeds) {
  if (!m.arch().attention_gate) return;
  const int N = B * T;
  const AttentionRowDots dots =
      gates_take_row_dots(m, l) ? AttentionRowDots{m.attention_dot, T} : AttentionRowDots{};
  attention_gate_backward(m.scratch_btc, dln1_gates, gate_norm_columns(m), m.grad(llmc::kAttngate, l), m.partials,
                          m.scratch_btc, attention_output_kept(m, l), m.act_f(kGates, l), m.act(kLn1, l),
                          m.param(llmc::kAttngate, l), N, m.config.num_heads, m.config.channels, seeds.next(),
                          m.stream, dots);
}

// ---- The residual lambdas (ArchSpec::resid_lambdas, record #89's): each sublayer's residual add
// x + out becomes r x + p out, (r, p) its layer's and sublayer's (Sublayer: the attention's column,
// the MLP's; a layer without attention has its MLP's alone), the gated bigram term beside p out
// (attention_terms). Parameters: resid_lambdas and post_lambdas [L, 2]. Kernels: section 4's residual
// adds take the scales (SublayerScales) and "Record #89's residual lambdas' backward". The backward
// reads each sublayer's output, so attproj and fcproj write theirs into rows of their own, kept for
// every layer (the decoder's: proj); the gradient p dy that the product's backward takes goes to
// dsublayer.

enum Sublayer { kAttentionSublayer = 0, kMlpSublayer = 1 };

// Whether layer l's sublayer adds are scaled: everywhere with the lambdas, and on the MUDD dense connections'
// layer (its coefficients r and p a token, with or without the lambdas).
bool sublayer_scaled(const GPT2& m, int l) { return m.arch().resid_lambdas || mudd_layer(m, l); }
bool any_sublayer_scaled(const llmc::ArchSpec& arch) { return arch.resid_lambdas || arch.mudd_connections; }

void sublayer_lambdas_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (!any_sublayer_scaled(arch)) return;
  t[kAttentionOut].count = d.BT * d.C;
  t[kMlpOut].count = d.BT * d.C;
}

void sublayer_lambdas_allocate_scratch(GPT2& m, size_t N) {
  if (!any_sublayer_scaled(m.arch())) return;
  m.dsublayer = device_alloc<floatX>(N * m.config.channels, "the sublayers' output gradient");
}

// Layer l's scales of a sublayer's add, none without the lambdas; on the MUDD dense connections' layer the
// columns of the layer generator's rows (r.mudd_rows[2]: its r and p a token; the lambdas unread).
SublayerScales sublayer_scales(GPT2& m, int l, Sublayer s, const floatX* mudd_layer_rows) {
  if (!sublayer_scaled(m, l)) return {};
  if (mudd_layer(m, l)) {
    const floatX* rows = mudd_layer_rows;
    const int stride = llmc::kMuddGateStride;
    if (s == kAttentionSublayer) return {rows + llmc::kMuddAttentionR, rows + llmc::kMuddAttentionP, stride, stride};
    return {rows + llmc::kMuddMlpR, rows + llmc::kMuddMlpP, stride, stride};
  }
  return {m.param(llmc::kResidLambdas, l) + s, m.param(llmc::kPostLambdas, l) + s};
}

// Where layer l's fcproj writes in a training pass: its kept output, or scratch_btc (proj).
floatX* mlp_output_rows(GPT2& m, int l) { return sublayer_scaled(m, l) ? m.act(kMlpOut, l) : m.scratch_btc; }

// The sublayers' outputs: kept rows in a training pass with the lambdas, else r.proj (set before).
void sublayer_lambdas_point_rows(GPT2& m, int l, BlockRows& r, RowArena* decoder) {
  const bool kept = sublayer_scaled(m, l) && !decoder;
  r.attention_out = kept ? m.act(kAttentionOut, l) : r.proj;
  r.mlp_out = kept ? m.act(kMlpOut, l) : r.proj;
}

// From dresidual, the gradient of layer l's sublayer add r x + p out (x the add's other input): r's
// and p's gradients, dresidual r times it (x's part, to which the sublayer's input gradient is added
// next), and the gradient of out, p times it, into dsublayer, which is returned for the product's
// backward; without the lambdas dresidual itself.
floatX* sublayer_lambdas_backward_rows(GPT2& m, int l, Sublayer s, const floatX* x, int N, KernelSeeds& seeds) {
  if (!sublayer_scaled(m, l)) return m.dresidual;
  const floatX* out = m.act(s == kAttentionSublayer ? kAttentionOut : kMlpOut, l);
  const SublayerScales scales = sublayer_scales(m, l, s, mudd_rows(m, kMuddLayerGenerator, N));
  if (scales.r_stride > 0) {  // the MUDD dense connections' r and p a token
    const int r = s == kAttentionSublayer ? llmc::kMuddAttentionR : llmc::kMuddMlpR;
    sublayer_row_lambdas_backward(m.dsublayer, m.dresidual, mudd_coefficient_gradient(m, kMuddLayerGenerator, r, N),
                                  mudd_coefficient_gradient(m, kMuddLayerGenerator, r + 1, N), x, out, scales, N, m.config.channels,
                                  m.stream);
    return m.dsublayer;
  }
  sublayer_lambdas_backward(m.dsublayer, m.dresidual, m.grad(llmc::kResidLambdas, l) + s,
                            m.grad(llmc::kPostLambdas, l) + s, m.partials, x, out, scales, N, m.config.channels,
                            seeds.next(), m.stream);
  return m.dsublayer;
}

// ---- The residual mix (ArchSpec::x0_lambdas, with the plan's U-net skips): block l's input is
// lambdas[0] (x + w kept) + lambdas[1] x0, x0 the normed embedding, kept an earlier block's output
// (LayerSpec::skip_source, w its skip_weight). Parameters: lambdas (two a layer), skipw. Kernels:
// section 4, "The speedrun's residual mix before each block" (the mix and the norm after it in one
// pass, the mix's backward and the gradient joining after the block in another).

// The block's input after its mix, what its attention and MLP add to.
void residual_mix_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (arch.x0_lambdas) t[kMixed].count = d.BT * d.C;
}

// The gradients of x0, which the blocks' mixes (or record #89's x0 terms) add up, and of each kept
// output (LayerPlan's kept_outputs of them), for N rows.
void residual_mix_allocate_scratch(GPT2& m, size_t N) {
  if (!m.arch().x0_lambdas && !m.arch().x0_gates) return;
  const size_t C = m.config.channels;
  m.dx0 = device_alloc<floatX>(N * C, "the gradient of x0");
  m.dkept = device_alloc<floatX>(m.plan.kept_outputs * N * C, "the gradients of the U-net's kept outputs");
}

// What block l's first norm and residual adds read: its input, or that input's mix, which the layer
// without attention writes straight into its residual2.
floatX* block_mixed(GPT2& m, int l) {
  if (!m.arch().x0_lambdas) return block_input(m, l);
  return m.plan[l].attention ? m.act(kMixed, l) : m.act(kResidual2, l);
}

// The weight with which block l adds the U-net's kept output (LayerSpec::skip_weight), or null.
const floatX* unet_weight(GPT2& m, int l) {
  const int j = m.plan[l].skip_weight;
  return j >= 0 ? m.param(llmc::kSkipw) + j : nullptr;
}

// Training: the kept output block l adds, its mix's output, and its input's last add, which the
// block before leaves to this mix (BlockRows::input_before_add). Decoding: rows for the kept
// outputs (decode_kept_inputs), the mix in place.
void residual_mix_point_rows(GPT2& m, int l, BlockRows& r, RowArena* decoder) {
  if (!m.arch().x0_lambdas) return;
  if (decoder) {
    r.kept_rows = decoder->take<floatX>((size_t)m.plan.kept_outputs * m.config.channels);
    r.mixed = r.residual3;
    return;
  }
  const int source = m.plan[l].skip_source;
  r.kept = source >= 0 ? m.act(kResidual3, source) : nullptr;
  r.mixed = block_mixed(m, l);
  // Block l - 1's fcproj output stays in its rows (mlp_output_rows) until this block's mix.
  r.output_in_next_mix = !norm_after_block(m, l).present;
  if (l > 0) {
    r.input_before_add = m.act(kResidual2, l - 1);
    r.input_add = {mlp_output_rows(m, l - 1), block_input(m, l), sublayer_scales(m, l - 1, kMlpSublayer, r.mudd_rows[2])};
  }
}

// Block l's mix into r.mixed, normalised in the same pass into out (an RMSNorm: spec kNorm1, or
// kNorm2 in a layer without attention).
const floatX* residual_mix_norm(GPT2& m, int l, const BlockRows& r, const NormSpec& spec, const NormRows& out) {
  REQUIRE(m.arch().rms_norm, "the residual mix (x0_lambdas) is fused with an RMSNorm: the architecture needs rms_norm");
  const bool skip = m.plan[l].skip_source >= 0;
  residual_mix_norm_forward(r.mixed, out.out, out.rstd, r.input_add.x_add ? r.input_before_add : r.input, r.x0,
                            skip ? r.kept : nullptr, m.param(llmc::kLambdas, l), unet_weight(m, l),
                            m.param_or_null(spec.weight, l), r.rows(), m.config.channels, m.stream, r.input_add);
  return r.mixed;
}

// The gradients the blocks' mixes (or record #89's plan's x0 terms and kept outputs) add into, zeroed
// before a backward pass of N rows.
void residual_mix_zero_gradients(GPT2& m, int N) {
  if (!m.arch().x0_lambdas && !m.arch().x0_gates) return;
  const size_t NC = (size_t)N * m.config.channels;
  cudaCheck(cudaMemsetAsync(m.dx0, 0, NC * sizeof(floatX), m.stream));
  cudaCheck(cudaMemsetAsync(m.dkept, 0, m.plan.kept_outputs * NC * sizeof(floatX), m.stream));
}

// The gradient that joins dresidual once block l's backward is done, or nullptr: that of block
// l - 1's output kept for the U-net (LayerSpec::kept; complete by then), or after the first block
// x0's. Block l's mix backward adds it (residual_mix_backward_rows). The top block's output is never
// kept (only a later layer's skip reads a kept output).
const floatX* gradient_joining_after_block(GPT2& m, int l, int N) {
  if (l == 0) return m.arch().bigram ? nullptr : m.dx0;  // bigram_stream_start_backward's, after its gate
  return m.plan[l - 1].kept >= 0 ? kept_gradient(m, l - 1, N) : nullptr;
}

// From dresidual, the gradient of block l's mixed input, to that of its input, in place, and then
// the gradient joining it after the block (gradient_joining_after_block); x0's into dx0, the kept
// output's into its dkept, and the lambdas' and skip weight's. The join's seed is drawn after the
// mix's, as its own add's was.
void residual_mix_backward_rows(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!m.arch().x0_lambdas) return;
  const llmc::LayerSpec& layer = m.plan[l];
  const int source = layer.skip_source, C = m.config.channels;
  const bool skip = source >= 0;
  const uint32_t seed = seeds.next();
  GradientJoin join;
  join.add = gradient_joining_after_block(m, l, N);
  if (join.add) join.seed = seeds.next();
  residual_mix_backward(m.dresidual, m.dx0, skip ? kept_gradient(m, source, N) : nullptr,
                        m.grad(llmc::kLambdas, l), skip ? m.grad(llmc::kSkipw) + layer.skip_weight : nullptr,
                        m.partials, m.dresidual, block_input(m, l), m.act(kEncoded),
                        skip ? m.act(kResidual3, source) : nullptr, m.param(llmc::kLambdas, l), unet_weight(m, l), N,
                        C, seed, m.stream, join);
}

// ---- The smear (ArchSpec::smear, record #89's): before the embedding's norm, each token of a
// forward's flat sequence takes a gated share of the embedding of the token before (SPEC "Record
// #89's embedding"). Parameters: smearw [12] and smear_lambda. Kernels: section 3, "Record #89's
// smear". The decoder embeds the token before its token as well (SmearRows::context).

// The embedding before the smear and each row's gate, which the backward reads.
void smear_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (!arch.smear) return;
  t[kTokenEmbedded].count = d.BT * d.C;
  t[kSmearGates].count = d.BT;
}

// wte's rows of tokens[-context, N) into s.token_embedded, smeared into embedded; returns the smeared
// rows of tokens[0, N), which the embedding's norm reads.
const floatX* smear_embedding(GPT2& m, floatX* embedded, const int* tokens, int N, const SmearRows& s) {
  const int C = m.config.channels, rows = N + s.context;
  encoder_forward(s.token_embedded, tokens - s.context, m.param(llmc::kWte), nullptr, 1, rows, C, m.stream);
  smear_forward(embedded, s.gates, s.token_embedded, m.param(llmc::kSmearw), m.param(llmc::kSmearLambda), rows, C,
                m.stream);
  return embedded + (size_t)s.context * C;
}

// From dembedded, the gradient of the smeared embedding (not in dresidual): that of wte's rows, into
// dresidual, which it returns, and smearw's and smear_lambda's; without the smear dembedded itself.
const floatX* smear_embedding_backward(GPT2& m, const floatX* dembedded, int N, uint32_t seed) {
  if (!m.arch().smear) return dembedded;
  smear_backward(m.dresidual, m.grad(llmc::kSmearw), m.grad(llmc::kSmearLambda), m.partials, dembedded,
                 m.act(kTokenEmbedded), m.act_f(kSmearGates), m.param(llmc::kSmearw), m.param(llmc::kSmearLambda), N,
                 m.config.channels, seed, m.stream);
  return m.dresidual;
}

// ---- The bigram embedding (ArchSpec::bigram, record #89's): each token's row of a table hashed
// from (previous token, token) times a fixed sign row (SPEC "Record #89's embedding"), added to the
// residual stream with a gate: before layer 0, and after the attention of every later layer with
// attention, as the reference's listed layers. The reference's gates come from its MUDD gate
// generators, which this model has not: each gate here is a learned scalar. Parameters: bigram
// [R, C] and bigram_gates, one an attention layer (layer 0's the one before it). Kernels: section
// 3, "Record #89's bigram hash embedding" and "The bigram embedding's gated adds"; the table's
// gradient goes through the encoder backward's bucketed plan of the ids (section 3).

// The embedding, which the gates' backward reads, and the stream's start x0 + g_0 b (block_input).
void bigram_activation_rows(const llmc::ArchSpec& arch, const ActDims& d, ActSpec t[kNumActTensors]) {
  if (!arch.bigram) return;
  t[kBigramEmbedded].count = d.BT * d.C;
  t[kStreamStart].count = d.BT * d.C;
}

// The rows of N tokens, for every pass (training or evaluation).
void bigram_allocate_rows(Activations& a, const llmc::ArchSpec& arch, size_t N) {
  if (!arch.bigram) return;
  a.bigram_rows = device_alloc<int>(2 * N, "the bigram embedding's rows");
  upload_staging_allocate(a.bigram_rows_staging, 2 * N * sizeof(int));
}

// The training passes': the rows, the backward's plan of the table and the embedding's gradient.
void bigram_allocate_scratch(GPT2& m, size_t N) {
  if (!m.arch().bigram) return;
  const size_t C = m.config.channels, buckets = N * encoder_plan_groups((int)C);
  bigram_allocate_rows(m, m.arch(), N);
  m.bigram_plan.buckets = device_alloc<int4>(buckets, "the bigram table's backward plan");
  m.bigram_plan.positions = device_alloc<int>(N, "the bigram table's backward plan");
  m.bigram_plan.slice_sums = device_alloc<float>(encoder_plan_max_slices((int)N, (int)C) * kEncoderGroupWidth,
                                                 "the bigram table backward's slice sums");
  upload_staging_allocate(m.bigram_plan_buckets_staging, buckets * sizeof(int4));
  upload_staging_allocate(m.bigram_plan_positions_staging, N * sizeof(int));
  m.dbigram = device_alloc<floatX>(N * C, "the bigram embedding's gradient");
}

int bigram_table_rows(const GPT2& m) { return llmc::bigram_table_rows(m.config.padded_vocab_size); }

// The table's rows and the sign rows of a forward's N inputs, [ids, sign rows], made on the host and
// queued for upload.
void bigram_rows_upload(GPT2& m, const int* inputs, int N) {
  if (!m.arch().bigram) return;
  int* rows = upload_staging_host<int>(m.bigram_rows_staging);
  llmc::bigram_rows(rows, rows + N, inputs, N, bigram_table_rows(m));
  upload_staging_copy(m.bigram_rows_staging, m.bigram_rows, 2 * N * sizeof(int), m.stream);
}

// The embedding of the forward's N tokens, and the stream's start x0 + g_0 b.
void bigram_embedding_forward(GPT2& m, int N) {
  if (!m.arch().bigram) return;
  const int C = m.config.channels;
  bigram_forward(m.act(kBigramEmbedded), m.param(llmc::kBigram), m.bigram_rows, m.bigram_signs, m.bigram_rows + N, N,
                 C, m.stream);
  bigram_gate_forward(m.act(kStreamStart), m.act(kEncoded), m.act(kBigramEmbedded),
                      kept_gate_rows(m, llmc::kMuddBigram, 0, N, m.param(llmc::kBigramGates, 0)), N, C, m.stream);
}

void bigram_point_rows(GPT2& m, BlockRows& r, RowArena* decoder) {
  if (!m.arch().bigram) return;
  r.bigram = decoder ? decoder->take<floatX>(m.config.channels) : m.act(kBigramEmbedded);
}

// From dresidual, the gradient of block l's residual2 (its input + (the attention's output + g_l b)):
// g_l's, and b's part into dbigram.
void bigram_inject_backward(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!m.arch().bigram || l == 0) return;
  bigram_gate_backward(m.dbigram, gate_gradient(m, llmc::kMuddBigram, l, N, m.grad(llmc::kBigramGates, l)),
                       m.partials, m.dresidual, m.act(kBigramEmbedded),
                       kept_gate_rows(m, llmc::kMuddBigram, l, N, m.param(llmc::kBigramGates, l)), N,
                       m.config.channels, seeds.next(), m.stream);
}

// After block 0's backward, from dresidual, the gradient of the stream's start x0 + g_0 b: g_0's and
// b's parts, then x0's, which the blocks' mixes added up in dx0 (joined here, not after block 0:
// gradient_joining_after_block), added: dresidual is then x0's gradient.
void bigram_stream_start_backward(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!m.arch().bigram || l != 0) return;
  const int C = m.config.channels;
  bigram_gate_backward(m.dbigram, gate_gradient(m, llmc::kMuddBigram, 0, N, m.grad(llmc::kBigramGates, 0)),
                       m.partials, m.dresidual, m.act(kBigramEmbedded),
                       kept_gate_rows(m, llmc::kMuddBigram, 0, N, m.param(llmc::kBigramGates, 0)), N, C, seeds.next(),
                       m.stream);
  add_inplace(m.dresidual, m.dx0, (size_t)N * C, seeds.next(), m.stream);
}

// An encoder backward plan of N ids (in host memory) made on the host into the staging buffers
// and queued for upload into `plan` on the stream: the inputs' plan and the bigram table's.
void encoder_plan_make_upload(EncoderBackwardPlan& plan, UploadStaging& buckets_staging,
                              UploadStaging& positions_staging, const int* ids, int N, int C, cudaStream_t stream) {
  int4* buckets = upload_staging_host<int4>(buckets_staging);
  int* positions = upload_staging_host<int>(positions_staging);
  encoder_backward_plan(&plan, buckets, positions, ids, N, C);
  upload_staging_copy(buckets_staging, plan.buckets, encoder_plan_upload_count(plan) * sizeof(int4), stream);
  upload_staging_copy(positions_staging, plan.positions, N * sizeof(int), stream);
}

// The backward's plan of the table, made on the host of the last forward's ids while the GPU runs,
// and queued for upload; the embedding's gradient zeroed for the layers to add into.
void bigram_backward_prepare(GPT2& m, int N) {
  if (!m.arch().bigram) return;
  const int* ids = (const int*)m.bigram_rows_staging.host;  // the last forward's (bigram_rows_upload)
  encoder_plan_make_upload(m.bigram_plan, m.bigram_plan_buckets_staging, m.bigram_plan_positions_staging, ids, N,
                           m.config.channels, m.stream);
  cudaCheck(cudaMemsetAsync(m.dbigram, 0, (size_t)N * m.config.channels * sizeof(floatX), m.stream));
}

// The table's gradient from dbigram, through the plan of the forward's ids (scratch_btc its scratch).
void bigram_table_backward(GPT2& m, int N, uint32_t seed) {
  if (!m.arch().bigram) return;
  bigram_backward(m.grad(llmc::kBigram), m.scratch_btc, m.dbigram, m.bigram_signs, m.bigram_rows + N, m.bigram_plan,
                  N, m.config.channels, seed, m.stream);
}

// ---- Record #89's plan (ArchSpec::x0_gates, with the plan's gated skip and attention sources:
// LayerSpec): x0, the normed embedding, added after each attention with a gate (one more term of the
// attention's add, before the bigram embedding's: attention_terms); its layer without attention adding
// an earlier layer's output times sigmoid(skip_lambda) g before its MLP's norm; layers whose attention
// reads an earlier layer's output (normed) instead of their input. The reference's gates come from its
// MUDD gate generators, which this model has not: each is a learned scalar. Parameters: x0_gates (one
// an attention layer), skip_gate (skip_lambda, g). Kernels: section 3's gated adds and gated skip,
// section 4's residual add with scales (p the skip's scale). The blocks add x0's gradient into dx0
// and the kept outputs' into dkept (the residual mix's scratch), each joined once the block whose input
// it is has its gradient (record89_plan_join).

// Training: the kept outputs block l reads (its gated skip's, its attention's source). Decoding: rows
// for the kept outputs (decode_kept_inputs).
void record89_plan_point_rows(GPT2& m, int l, BlockRows& r, RowArena* decoder) {
  if (!m.arch().x0_gates) return;
  if (decoder) {
    r.kept_rows = decoder->take<floatX>((size_t)m.plan.kept_outputs * m.config.channels);
    return;
  }
  const llmc::LayerSpec& s = m.plan[l];
  r.kept = s.gated_skip_source >= 0 ? m.act(kResidual3, s.gated_skip_source) : nullptr;
  r.attention_source = s.attention_source >= 0 ? m.act(kResidual3, s.attention_source) : nullptr;
}

// The rows layer l's x0 term weighs: x0 (the normed embedding), or on the dense connections' layer in0
// (the stream entering layer 0).
const floatX* x0_term_rows(GPT2& m, int l, const floatX* x0, const floatX* in0) { return mudd_layer(m, l) ? in0 : x0; }

// What block l's residual add takes of its attention output r.attention_out (with scales): that
// output, or where the layer adds gated terms (x0 with record #89's plan, the bigram embedding after
// the first layer) their sum in r.proj, out + g x0 + g' b; with the residual lambdas p out + ..., and
// the add's p then 1 (scales.p cleared).
const floatX* attention_terms(GPT2& m, int l, const BlockRows& r, SublayerScales& scales) {
  GatedTerms terms;
  terms.count = 2;
  GatedTerm &x0 = terms.terms[0], &bigram = terms.terms[1];
  if (m.arch().x0_gates) {
    x0 = {x0_term_rows(m, l, r.x0, r.mudd_in0), gate_rows(m, r, llmc::kMuddX0, l, m.param(llmc::kX0Gates, l))};
  }
  if (r.bigram && l > 0) bigram = {r.bigram, gate_rows(m, r, llmc::kMuddBigram, l, m.param(llmc::kBigramGates, l))};
  if (!x0.values && !bigram.values) return r.attention_out;
  gated_sum_forward(r.proj, r.attention_out, {scales.p, scales.p_stride}, terms, r.rows(), m.config.channels,
                    m.stream);
  scales.p = nullptr;
  scales.p_stride = 0;
  return r.proj;
}

// Layer l's gated skip, r.residual2 = r.input + s r.kept, normalised into ln2 in the same pass.
void gated_skip_norm(GPT2& m, int l, const BlockRows& r) {
  const floatX* skip_gate = m.param(llmc::kSkipGate);
  const GateRows g = gate_rows(m, r, llmc::kMuddSkip, l, skip_gate + 1);
  floatX* scale = g.stride > 0 ? r.skip_scale : m.skip_scale;
  gated_skip_scale(scale, skip_gate, g, r.rows(), m.stream);
  const SublayerScales scales = {nullptr, scale, g.stride > 0 ? 1 : 0};
  norm_residual_rows(m, kNorm2, l, r.residual2, r.ln2, r.input, r.kept, r.rows(), scales);
}

// What layer l's first norm reads: an earlier layer's output (LayerSpec::attention_source), or the
// block's input (block_mixed); and the gradient its backward adds into.
const floatX* attention_input(GPT2& m, int l) {
  const int source = m.plan[l].attention_source;
  return source >= 0 ? m.act(kResidual3, source) : block_mixed(m, l);
}
floatX* attention_input_gradient(GPT2& m, int l, int N) {
  const int source = m.plan[l].attention_source;
  return source >= 0 ? kept_gradient(m, source, N) : m.dresidual;
}

// From dresidual, the gradient of block l's residual2: x0's term's (its gate's; x0's part into dx0).
void x0_gate_backward(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!m.arch().x0_gates) return;
  const floatX* x0 = x0_term_rows(m, l, m.act(kEncoded), block_input(m, 0));
  bigram_gate_backward(x0 == m.act(kEncoded) ? m.dx0 : m.dmudd_in0,
                       gate_gradient(m, llmc::kMuddX0, l, N, m.grad(llmc::kX0Gates, l)), m.partials, m.dresidual, x0,
                       kept_gate_rows(m, llmc::kMuddX0, l, N, m.param(llmc::kX0Gates, l)), N, m.config.channels,
                       seeds.next(), m.stream);
}

// From dresidual, the gradient of layer l's residual2 = input + s kept: the skip gate's, and the kept
// output's part into its dkept; dresidual is then the input's.
void gated_skip_backward_rows(GPT2& m, int l, int N, KernelSeeds& seeds) {
  const int source = m.plan[l].gated_skip_source;
  if (source < 0) return;
  const floatX* skip_gate = m.param(llmc::kSkipGate);
  floatX* dskip_gate = m.grad(llmc::kSkipGate);
  const GateRows g = kept_gate_rows(m, llmc::kMuddSkip, l, N, skip_gate + 1);
  const floatX* scale = g.stride > 0 ? m.act(kMuddSkipScale) : m.skip_scale;
  gated_skip_backward(kept_gradient(m, source, N), dskip_gate, gate_gradient(m, llmc::kMuddSkip, l, N, dskip_gate + 1),
                      m.partials, m.dresidual, m.act(kResidual3, source), scale, skip_gate, g, N, m.config.channels,
                      seeds.next(), m.stream);
}

// After block l's backward, dresidual (the gradient of its input) takes what joins it: that of block
// l - 1's output kept for later layers (complete by then), or after the first block x0's (but with the
// bigram embedding, whose stream start joins it: bigram_stream_start_backward).
void record89_plan_join(GPT2& m, int l, int N, KernelSeeds& seeds) {
  if (!m.arch().x0_gates) return;
  const floatX* join = l > 0 ? (m.plan[l - 1].kept >= 0 ? kept_gradient(m, l - 1, N) : nullptr)
                             : (m.arch().bigram ? nullptr : m.dx0);
  if (join) add_inplace(m.dresidual, join, (size_t)N * m.config.channels, seeds.next(), m.stream);
}

// ---- The block: one layer's steps and the wiring between layers, forward and backward, for the
// training passes and the decoder ----

// The bias gradient into which a norm backward of block_input(m, l) adds the column sums of its
// input's gradient: that of the stream's last add, block l-1's fcproj (none for the embedding, nor
// without biases).
floatX* block_input_dbias(GPT2& m, int l) { return l == 0 ? nullptr : m.grad_or_null(llmc::kFcprojb, l - 1); }

// residual = a + b (with scales r a + p b) alone, where no norm follows it (norm_after_block): the
// fused kernel's add, its row statistics into stats (scratch).
void residual_rows(GPT2& m, floatX* residual, const floatX* a, const floatX* b, float* stats, int N,
                   const SublayerScales& scales) {
  fused_residual_rmsnorm_forward(residual, nullptr, stats, a, b, nullptr, N, m.config.channels, m.stream, scales);
}

// Block l's input as its steps read it, and its first norm (spec: kNorm1, or kNorm2 in a layer
// without attention) into out where the block takes it: r.input, normalised in the first block and
// in a layer without attention (the norm after the previous block took it otherwise:
// norm_after_block), or its attention's source normalised; with x0_lambdas its mix
// (residual_mix_norm); with record #89's gated skip its residual2 (gated_skip_norm).
const floatX* block_mix_norm(GPT2& m, int l, const BlockRows& r, const NormSpec& spec, const NormRows& out) {
  if (m.arch().x0_lambdas) return residual_mix_norm(m, l, r, spec, out);
  if (r.kept) {
    gated_skip_norm(m, l, r);
    return r.residual2;
  }
  if (r.attention_source) {
    norm_rows(m, spec, l, out, r.attention_source, r.rows());
  } else if (l == 0 || spec.out == kLn2) {
    norm_rows(m, spec, l, out, r.input, r.rows());
  }
  return r.input;
}

// Block l over r's rows. The first block normalises its input, and with x0_lambdas every block its
// mix; every block's last step normalises its output for the norm after it, where there is one
// (norm_after_block), or leaves its last add to the next block's mix (r.output_in_next_mix). A
// layer without attention is its mix and its MLP.
void block_forward(GPT2& m, int l, const BlockRows& r) {
  const int N = r.rows();
  const bool attention = m.plan[l].attention;
  const floatX* x = block_mix_norm(m, l, r, attention ? kNorm1 : kNorm2, attention ? r.ln1 : r.ln2);
  if (attention) {
    const floatX* normed_input = r.attention_source ? r.attention_source : x;
    gpt2_linear_forward_normed(m, r, kLinearQkv, l, r.qkv, kNorm1, r.ln1, normed_input);
    qk_prepare(m, l, r);
    value_mix(m, l, r);
    attention_rows(m, l, r);
    composed_rows(m, l, r);
    xsa_rows(m, l, r);
    gpt2_linear_forward(m, r, kLinearAttproj, l, r.attention_out, attention_gated(m, l, r), nullptr);
    SublayerScales scales = sublayer_scales(m, l, kAttentionSublayer, r.mudd_rows[2]);
    const floatX* attention_add = attention_terms(m, l, r, scales);
    norm_residual_rows(m, kNorm2, l, r.residual2, r.ln2, x, attention_add, N, scales);
  }
  mlp_forward(m, l, r);
  const NormAt next = norm_after_block(m, l);
  const SublayerScales scales = sublayer_scales(m, l, kMlpSublayer, r.mudd_rows[2]);
  if (next.present) {
    norm_residual_rows(m, next.spec, next.layer, r.residual3, r.next, r.residual2, r.mlp_out, N, scales);
  } else if (!r.output_in_next_mix) {
    residual_rows(m, r.residual3, r.residual2, r.mlp_out, r.next.rstd, N, scales);
  }
}

// Block l's gradients, its forward's steps in reverse, from dresidual, the gradient of its output
// (whose column sums the norm backward that wrote it has added into fcproj's bias gradient), to
// dresidual, that of its input. Each kernel's seed is drawn from seeds in the order they run.
void block_backward(GPT2& m, int l, int B, int T, KernelSeeds& seeds) {
  const int N = B * T;
  const uint32_t seed_fcproj = seeds.next(), seed_fc = seeds.next();
  floatX* dmlp = sublayer_lambdas_backward_rows(m, l, kMlpSublayer, m.act(kResidual2, l), N, seeds);
  mlp_backward(m, l, N, dmlp, seed_fcproj, seed_fc);
  norm_backward(m, kNorm2, l, m.dresidual, m.grad_or_null(llmc::kAttprojb, l), m.scratch_btc, m.act(kResidual2, l),
                N, seeds.next());
  // dresidual is now the gradient of residual2[l] = input + attproj(...), its column sums
  // already in attproj's bias gradient.
  if (m.plan[l].attention) {
    bigram_inject_backward(m, l, N, seeds);
    x0_gate_backward(m, l, N, seeds);
    floatX* dattention = sublayer_lambdas_backward_rows(m, l, kAttentionSublayer, block_mixed(m, l), N, seeds);
    // FP8's product reads the transposed cast its forward kept, not the gated output.
    const floatX* gated = m.fp8 ? nullptr : attproj_input(m, l, N);
    gpt2_linear_backward(m, kLinearAttproj, l, m.scratch_btc, false, dattention, gated, nullptr, N, seeds.next());
    floatX* dln1_gates = gate_norm_gradient_rows(m, N);
    attention_gate_backward_rows(m, l, B, T, dln1_gates, seeds);
    head_gate_backward_rows(m, l, N, seeds);
    xsa_backward_rows(m, l, N, seeds);
    attention_backward_rows(m, l, B, T, seeds);
    composed_backward_rows(m, l, B, T);
    xsa_values_gradient(m, l, N, seeds);
    value_mix_backward_rows(m, l, N, dln1_gates, seeds);
    qk_prepare_backward(m, m.scratch_bt4c, l, B, T);
    gpt2_linear_backward(m, kLinearQkv, l, m.scratch_btc, !attention_sums_qkv_bias(m), m.scratch_bt4c,
                         m.act(kLn1, l), nullptr, N, seeds.next());
    gate_norm_gradient(m, dln1_gates, N, seeds);
    norm_backward(m, kNorm1, l, attention_input_gradient(m, l, N), block_input_dbias(m, l), m.scratch_btc,
                  attention_input(m, l), N, seeds.next());
  }
  gated_skip_backward_rows(m, l, N, seeds);
  residual_mix_backward_rows(m, l, N, seeds);
  mudd_in0_join(m, l, N, seeds);
  bigram_stream_start_backward(m, l, N, seeds);
  record89_plan_join(m, l, N, seeds);
}

// ---- The training passes ----

// Layer l's training activations for B x T tokens. With delayed FP8 scaling (fp8_sources) the
// casts of the qkv, fc and fcproj layers' inputs compute them from what comes before
// (Fp8CastSource), since their scales are known before the values exist: the norms ln1 and ln2
// write their row statistics alone, the fc product the activation's input alone, and kLn1, kLn2
// and kFchAct are not written (2 bytes a value of 2 [N, C] and one [N, 4C] fewer), but for ln1
// where the heads' gates read it. FP8's backward reads the casts' transposed copies instead, so
// with FP8 these three are one layer's buffers (gpt2_allocate; ln1 every layer's with gates), for
// the other scalings' casts.
BlockRows block_rows(GPT2& m, int l, int B, int T) {
  BlockRows r;
  r.B = B;
  r.T = T;
  r.fp8 = m.fp8 && !m.evaluation_only;
  r.fp8_sources = r.fp8 && m.fp8_scaling() == Fp8Scaling::kDelayed;
  const NormAt next = norm_after_block(m, l);
  // The norms' outputs where the products read them, and the final norm's, which the head reads.
  auto norm = [&](const NormSpec& n, int layer) {
    const bool gates_read = n.out == kLn1 && (m.arch().attention_gate || m.arch().ve_gates);
    const bool written = !r.fp8_sources || n.out == kLnf || gates_read;
    return NormRows{written ? m.act(n.out, layer) : nullptr, m.act_f(n.mean, layer), m.act_f(n.rstd, layer)};
  };
  r.input = block_input(m, l);
  r.ln1 = norm(kNorm1, l);
  r.ln2 = norm(kNorm2, l);
  // Without a norm after the block, its add's statistics go to the final norm's rstd, which the last
  // block writes again.
  r.next = next.present ? norm(next.spec, next.layer) : NormRows{nullptr, nullptr, m.act_f(kLnfRstd)};
  r.qkv = attention_qkv(m, l);
  r.qk_rstd = m.act_f(kQkRstd, l);
  r.atty = m.act(kAtty, l);
  r.proj = m.scratch_btc;
  r.residual2 = m.act(kResidual2, l);
  r.fch = m.act(kFch, l);
  r.fch_act = m.act(kFchAct, l);
  r.residual3 = m.act(kResidual3, l);
  r.x0 = m.act(kEncoded);
  r.tokens = m.inputs;
  mudd_gates_point_rows(m, r, B * T);
  value_mix_point_rows(m, l, r, nullptr);
  attention_gate_point_rows(m, l, r, nullptr);
  head_gate_point_rows(m, r, nullptr);
  xsa_point_rows(m, l, r, nullptr);
  composed_point_rows(m, r, nullptr);
  residual_mix_point_rows(m, l, r, nullptr);
  record89_plan_point_rows(m, l, r, nullptr);
  bigram_point_rows(m, r, nullptr);
  sublayer_lambdas_point_rows(m, l, r, nullptr);
  return r;
}

// The windows of the passes to come with documents (gpt2_allocate's AttentionSpec), in blocks; long
// 0: none. A stage plan sets each step's (llmc::StagePlan::windows_at).
void gpt2_set_window(GPT2& m, llmc::StepWindows windows) {
  REQUIRE(windows.long_blocks == 0 || m.documents, "a window of %d blocks needs attention within documents",
          windows.long_blocks);
  REQUIRE(windows.long_blocks >= 0 && windows.long_blocks <= m.max_window_blocks,
          "a window of %d blocks, but the attention was allocated for windows of up to %d (0: none)",
          windows.long_blocks, m.max_window_blocks);
  REQUIRE(windows.short_blocks >= 0 && windows.short_blocks <= windows.long_blocks,
          "a short window of %d blocks beside a long one of %d: the short one is no wider", windows.short_blocks,
          windows.long_blocks);
  m.windows = windows;
}

// With documents, the mask's metadata of the B x T inputs: each row's block spans and tokens'
// documents, made on the host in the pinned buffers (once their last copies are done) and copied
// to the GPU.
// With record #89's paired heads also those of the rows doubled (each token followed by a placeholder
// that opens no document: a document of tokens [s, e) is positions [2s, 2e)), after them.
void documents_upload(GPT2& m, const int* inputs, int B, int T) {
  REQUIRE(T % llmc::kAttentionBlock == 0, "attention within documents takes whole blocks of %d tokens: a "
          "forward of T = %d", llmc::kAttentionBlock, T);
  const int blocks = T / llmc::kAttentionBlock;
  const size_t BT = (size_t)B * T, B_blocks = (size_t)B * blocks;
  llmc::AttentionBlockSpan* spans = upload_staging_host<llmc::AttentionBlockSpan>(m.spans_staging);
  int* document_ids = upload_staging_host<int>(m.document_ids_staging);
  for (int b = 0; b < B; b++) {
    const int* row = inputs + (size_t)b * T;
    llmc::attention_block_spans(row, T, llmc::kDocumentStartToken, spans + (size_t)b * blocks);
    llmc::document_ids(row, T, llmc::kDocumentStartToken, document_ids + (size_t)b * T);
  }
  const bool paired = m.config.paired_heads;
  if (paired) {
    std::vector<int> doubled(2 * (size_t)T);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        doubled[2 * t] = inputs[(size_t)b * T + t];
        doubled[2 * t + 1] = llmc::kDocumentStartToken + 1;  // any token but a document's start
      }
      llmc::attention_block_spans(doubled.data(), 2 * T, llmc::kDocumentStartToken,
                                  spans + B_blocks + (size_t)b * 2 * blocks);
      llmc::document_ids(doubled.data(), 2 * T, llmc::kDocumentStartToken, document_ids + BT + (size_t)b * 2 * T);
    }
  }
  const size_t copies = paired ? 3 : 1;
  upload_staging_copy(m.spans_staging, m.spans, copies * B_blocks * sizeof(llmc::AttentionBlockSpan), m.stream);
  upload_staging_copy(m.document_ids_staging, m.document_ids, copies * BT * sizeof(int), m.stream);
  m.paired_spans = paired ? m.spans + B_blocks : nullptr;
  m.paired_document_ids = paired ? m.document_ids + BT : nullptr;
}

// What a forward pass is for: training, a backward pass follows (-fh 1: the head's products in
// FP8, as the reference's training steps), or evaluation (validation, HellaSwag, the tests'
// logits: the head's BF16 product, as the reference evaluates).
enum class ForwardPass { kEvaluation, kTraining };

// -oc 2: the model's stream waits for the copies of part `part` of the parameters (0: those of no
// layer; 1 + l: layer l's) where some are pending; gpt2_settle_params for all of them.
void gpt2_await_params(GPT2& m, int part) {
  if (m.params_arriving) cudaCheck(cudaStreamWaitEvent(m.stream, (*m.params_arriving)[part], 0));
}
void gpt2_settle_params(GPT2& m) {
  if (!m.params_arriving) return;
  for (cudaEvent_t copied : *m.params_arriving) cudaCheck(cudaStreamWaitEvent(m.stream, copied, 0));
  m.params_arriving = nullptr;
}

// The B x T inputs through the blocks, to the final norm's output in act(kLnf). Each layer's
// parameters are waited for as the layer is reached (gpt2_await_params), the rest before the blocks.
void gpt2_forward_blocks(GPT2& m, const int* inputs, int B, int T) {
  REQUIRE(B <= m.B && T <= m.T, "forward with B=%d T=%d, but activations were sized for B=%d T=%d",
          B, T, m.B, m.T);
  const int N = B * T;
  std::copy(inputs, inputs + N, upload_staging_host<int>(m.inputs_staging));
  upload_staging_copy(m.inputs_staging, m.inputs, N * sizeof(int), m.stream);
  if (m.documents) documents_upload(m, inputs, B, T);
  bigram_rows_upload(m, inputs, N);
  if ((m.fp8 || m.fp8_head || m.fp8_mlp) && m.fp8_weights_stale) {
    gpt2_settle_params(m);
    gpt2_fp8_cast_weights(m);
  }
  gpt2_await_params(m, 0);
  embedding_forward(m, B, T);
  mudd_gates_forward(m, 0, m.act(kEncoded), N);
  bigram_embedding_forward(m, N);
  attention_lambdas_forward(m);
  for (int l = 0; l < m.config.num_layers; l++) {
    gpt2_await_params(m, 1 + l);
    if (l == llmc::kMuddPostLayer) mudd_gates_forward(m, 1, block_input(m, l), N);
    if (l == m.config.num_layers - 1) mudd_layer_forward(m, N);
    block_forward(m, l, block_rows(m, l, B, T));
  }
  gpt2_settle_params(m);
  mudd_final_forward(m, N);
}

// Logits of the B x T inputs into act(kOutput) [B, T, Vp] (before the modern soft cap, which the
// classifier applies).
void gpt2_forward(GPT2& m, const int* inputs, int B, int T, ForwardPass pass = ForwardPass::kEvaluation) {
  nvtxRangePush("forward");
  m.fp8_mlp_pass = m.fp8_mlp && pass == ForwardPass::kTraining;
  gpt2_forward_blocks(m, inputs, B, T);
  if (m.fp8_mlp_pass) fp8_mlp_end_forward(m.fp8_mlp_state, m.config.num_layers, m.stream);
  m.fp8_mlp_pass = false;
  const bool fp8_head = m.fp8_head && pass == ForwardPass::kTraining;
  head_rows(m, m.act(kOutput), m.act(kLnf), B * T, fp8_head);
  m.fp8_head_tokens = fp8_head ? B * T : 0;
  nvtxRangePop();
}

// The losses of rows [first, first + n) of the last forward, whose logits act(kOutput) holds from
// its first row on, against the targets uploaded (targets_upload), with the terms given (the next
// token's alone by default). With dloss != 0 the logits are replaced by dlogits scaled by dloss
// (1 / (B*T*micro steps) for training), or after a training forward with the FP8 head, cast for its
// backward into fp8_head_buffers.rows.
void classifier_rows(GPT2& m, int first, int n, float dloss, const ClassifierTerms& terms = {}) {
  const int Vp = m.config.padded_vocab_size, V = m.arch().loss_over_padded_vocab ? Vp : m.config.vocab_size;
  ClassifierFp8Grad grad8;
  if (dloss != 0.0f && m.fp8_head_tokens > 0) {
    REQUIRE(first == 0 && n == m.fp8_head_tokens, "classifier_rows: the FP8 head's gradient takes the training "
            "forward's %d rows at once, not rows [%d, %d)", m.fp8_head_tokens, first, first + n);
    grad8 = {m.fp8_head_buffers.rows, m.fp8_head_scales + 2};
  }
  fused_classifier(m.act(kOutput), m.act_f(kLosses) + first, m.targets + first, n, V, Vp, dloss, m.stream,
                   m.logit_cap, false, grad8, terms);
}

// The prefix table of llmc::token_prefix_table (padded_vocab_size rows) for the loss's prefix term,
// uploaded once where some step weights it; empty: none.
void gpt2_set_prefix_table(GPT2& m, const std::vector<int>& prefix_table) {
  if (prefix_table.empty()) return;
  const size_t rows = m.config.padded_vocab_size;
  REQUIRE(prefix_table.size() == rows, "gpt2_set_prefix_table: a prefix table of %zu rows for %zu tokens",
          prefix_table.size(), rows);
  device_free(m.prefix_table);
  m.prefix_table = device_alloc<int>(rows, "the prefix table");
  cudaCheck(cudaMemcpy(m.prefix_table, prefix_table.data(), rows * sizeof(int), cudaMemcpyHostToDevice));
}

// The training loss's weights from the next training pass on: a step's of the stage plan
// (llmc::StepPlan::loss; -mtp's and -pw's without one). A prefix weight takes the prefix table.
void gpt2_set_loss_weights(GPT2& m, const llmc::LossWeights& w) {
  REQUIRE(w.prefix == 0.0f || m.prefix_table, "gpt2_set_loss_weights: a prefix weight of %g and no prefix table "
          "(gpt2_set_prefix_table)", w.prefix);
  m.loss_terms.predict = w.next_tokens.count;
  std::copy(w.next_tokens.weight, w.next_tokens.weight + llmc::kMaxPredictedTokens, m.loss_terms.weights);
  m.loss_terms.prefix_weight = w.prefix;
  m.loss_terms.prefix = w.prefix > 0.0f ? m.prefix_table : nullptr;
}

void targets_upload(GPT2& m, const int* targets, int N) {
  std::copy(targets, targets + N, upload_staging_host<int>(m.targets_staging));
  upload_staging_copy(m.targets_staging, m.targets, N * sizeof(int), m.stream);
}

// Queues the copy of the N losses classifier_rows wrote into host (pinned: the copy waits for
// nothing).
void losses_download(GPT2& m, float* host, int N) {
  cudaCheck(cudaMemcpyAsync(host, m.act_f(kLosses), N * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
}

// The mean of N losses on the host, summed in a fixed order.
float losses_host_mean(const float* losses, int N) {
  double sum = 0.0;
  for (int i = 0; i < N; i++) sum += losses[i];
  return (float)(sum / N);
}

// The mean of the N losses classifier_rows wrote.
float losses_mean(GPT2& m, int N) {
  losses_download(m, m.losses_host, N);
  cudaCheck(cudaStreamSynchronize(m.stream));
  return losses_host_mean(m.losses_host, N);
}

// Queues the losses of the last forward against `targets` and their copy into losses_host
// (pinned, B*T floats), waiting for nothing. With dloss != 0 (training) the loss has the terms of
// gpt2_set_loss_weights over sequences of T, and the logits are replaced by dlogits (classifier_rows).
void gpt2_classifier_enqueue(GPT2& m, const int* targets, int B, int T, float dloss, float* losses_host) {
  targets_upload(m, targets, B * T);
  ClassifierTerms terms;
  if (dloss != 0.0f) {
    terms = m.loss_terms;
    terms.row_length = T;
  }
  classifier_rows(m, 0, B * T, dloss, terms);
  losses_download(m, losses_host, B * T);
}

// The same, and returns the losses' mean.
float gpt2_classifier(GPT2& m, const int* targets, int B, int T, float dloss) {
  gpt2_classifier_enqueue(m, targets, B, T, dloss, m.losses_host);
  cudaCheck(cudaStreamSynchronize(m.stream));
  return losses_host_mean(m.losses_host, B * T);
}

// The mean loss of the B x T inputs against targets, without gradients: the blocks, then the head
// and the classifier over as many rows at a time as act(kOutput) holds (all of them in the
// training passes' activations: gpt2_forward and gpt2_classifier's kernels).
float gpt2_forward_loss(GPT2& m, const int* inputs, const int* targets, int B, int T) {
  nvtxRangePush("forward");
  gpt2_forward_blocks(m, inputs, B, T);
  const int N = B * T, C = m.config.channels;
  const int rows = (int)(m.act_specs[kOutput].count / m.config.padded_vocab_size);
  targets_upload(m, targets, N);
  for (int first = 0; first < N; first += rows) {
    const int n = std::min(rows, N - first);
    head_rows(m, m.act(kOutput), m.act(kLnf) + (size_t)first * C, n, false);
    classifier_rows(m, first, n, 0.0f);
  }
  m.fp8_head_tokens = 0;
  nvtxRangePop();
  return losses_mean(m, N);
}

// The encoder backward's plan of the last forward's N inputs, made on the host while the GPU runs
// that forward, and queued for upload.
void encoder_plan_upload(GPT2& m, int N) {
  const int* inputs = (const int*)m.inputs_staging.host;  // the last forward's (gpt2_forward_blocks)
  encoder_plan_make_upload(m.encoder_plan, m.plan_buckets_staging, m.plan_positions_staging, inputs, N,
                           m.config.channels, m.stream);
}

// Zeroes the gradients for the next step's micro steps to add into; where AdamW keeps its tensors'
// gradients for its next update (-ao), the other tensors' alone.
void gpt2_zero_grad(GPT2& m) {
  if (m.adamw_grads_kept) {
    for (int i = 0; i < llmc::kNumParamTensors; i++) {
      if (m.state_layout.owner[i] == StateOwner::kAdamW) continue;
      cudaCheck(cudaMemsetAsync(m.grads + m.param_offsets[i], 0, m.param_specs[i].size * sizeof(floatX), m.stream));
    }
  } else {
    cudaCheck(cudaMemsetAsync(m.grads, 0, m.num_params_padded * sizeof(floatX), m.stream));
  }
  cudaCheck(cudaMemsetAsync(m.wte_grad_encoder, 0, m.param_specs[llmc::kWte].size * sizeof(floatX),
                            m.stream));
}

// Adds this micro step's gradients (from the dlogits left by gpt2_classifier) into m.grads.
// m.grads is complete after the call with last_micro_step set. On that call, grads_final (when
// given) is called with each layer as soon as that layer's gradients are enqueued for the last
// time, and with -1 at the end for the tensors outside the layers (wte, wpe, lnf, the head): the
// multi-GPU reduction starts there while the backward pass continues.
void gpt2_backward(GPT2& m, int B, int T, bool last_micro_step,
                   const std::function<void(int layer)>& grads_final = nullptr) {
  nvtxRangePush("backward");
  const int L = m.config.num_layers, N = B * T, C = m.config.channels;
  const size_t NC = (size_t)N * C;
  KernelSeeds seeds = {m.rng.u32()};
  encoder_plan_upload(m, N);
  bigram_backward_prepare(m, N);
  cudaCheck(cudaMemsetAsync(m.dresidual, 0, NC * sizeof(floatX), m.stream));
  residual_mix_zero_gradients(m, N);
  mudd_gates_zero_gradients(m, N);
  mudd_connections_zero_gradients(m, N);
  head_backward(m, N, seeds.next());
  norm_backward(m, kNormF, 0, m.dresidual, block_input_dbias(m, L), m.scratch_btc, block_input(m, L), N,
                seeds.next());
  mudd_final_backward(m, N, seeds);
  // dresidual is the gradient of the top layer's output; each block's mix backward adds the part
  // joining the stream after it (gradient_joining_after_block).
  for (int l = L - 1; l >= 0; l--) {
    block_backward(m, l, B, T, seeds);
    mudd_layer_backward(m, l, N, seeds);
    if (l == llmc::kMuddPostLayer) mudd_gates_backward(m, 1, block_input(m, l), m.dresidual, N, seeds);
    if (last_micro_step) attention_lambdas_backward(m, l, seeds);
    if (last_micro_step && grads_final) grads_final(l);
  }
  mudd_gates_backward(m, 0, m.act(kEncoded), m.dresidual, N, seeds);
  const uint32_t seed_encoder = seeds.next();
  const uint32_t seed_norm = m.arch().embedding_norm ? seeds.next() : 0;
  const uint32_t seed_smear = m.arch().smear ? seeds.next() : 0;
  bigram_table_backward(m, N, m.arch().bigram ? seeds.next() : 0);
  embedding_backward(m, B, T, seed_norm, seed_smear, seed_encoder);
  if (last_micro_step) {
    add_inplace(m.grad(llmc::kWte), m.wte_grad_encoder, m.param_specs[llmc::kWte].size, seeds.next(),
                m.stream);
    if (grads_final) grads_final(-1);
  }
  nvtxRangePop();
}

// The root of the sum of squares a norm kernel left in m.norm_partials[kNormBlocks], added over
// the ranks first by sum_over_ranks where given.
float grad_norm_from_squares(GPT2& m, const std::function<void(float* sum)>& sum_over_ranks) {
  if (sum_over_ranks) sum_over_ranks(m.norm_partials + kNormBlocks);
  float norm_squared = 0.0f;
  cudaCheck(cudaMemcpyAsync(&norm_squared, m.norm_partials + kNormBlocks, sizeof(float),
                            cudaMemcpyDeviceToHost, m.stream));
  cudaCheck(cudaStreamSynchronize(m.stream));
  return sqrtf(norm_squared);
}

// Global L2 norm of the gradients (deterministic; see section 9). With ZeRO a rank holds the
// reduced gradient of its shard only; sum_over_ranks adds the shards' sums of squares (a device
// float) over the ranks.
float gpt2_grad_norm(GPT2& m, const std::function<void(float* sum)>& sum_over_ranks = nullptr) {
  global_norm_squared(m.norm_partials + kNormBlocks, m.norm_partials, m.grads + m.shard_offset,
                      m.shard_size, m.stream);
  return grad_norm_from_squares(m, sum_over_ranks);
}

// The same from the squares of `count` runs of the gradients (device (begin, count) pairs), which
// sum_over_ranks adds over the ranks.
float gpt2_runs_grad_norm(GPT2& m, const size_t* runs, int count, const std::function<void(float* sum)>& sum_over_ranks) {
  runs_norm_squared(m.norm_partials + kNormBlocks, m.norm_partials, m.grads, runs, count, m.stream);
  return grad_norm_from_squares(m, sum_over_ranks);
}

// Muon's hyperparameters at `step` (0-based; its momentum's schedule), at the schedule's peak.
MuonParams muon_step(const llmc::OptimizerTable& opt, long step, float grad_scale) {
  const llmc::RoleOptimizer& row = opt.of(llmc::ParamRole::kMatrix);
  return {row.lr,
          row.weight_decay,
          (float)opt.muon_momentum.at(step),
          grad_scale,
          opt.muon_newton_schulz,
          opt.muon_scale_tall,
          row.decay,
          opt.normuon,
          (float)(1.0 - llmc::kNorMuonBeta2),
          opt.muon_high_bits};
}

// The row counts of Muon's matrices in one layer's slab of tensor i, top to bottom: its `split`
// matrices of spec.rows rows; with qk_heads > 0 qkvw's Q and K each in blocks of qk_heads heads
// (record #89's qk_bank: Q's head pairs, then K's), V whole. Each is orthogonalised on its own.
std::vector<int> muon_matrix_rows(int i, const llmc::ParamSpec& spec, int qk_heads, const llmc::GPT2Config& c) {
  REQUIRE(qk_heads >= 0 && (qk_heads == 0 || c.num_heads % qk_heads == 0),
          "Muon: Q and K in blocks of %d heads, of %d heads", qk_heads, c.num_heads);
  std::vector<int> rows;
  for (int k = 0; k < spec.split; k++) {
    const bool blocked = i == llmc::kQkvw && qk_heads > 0 && k < 2;
    const int block = blocked ? qk_heads * (c.channels / c.num_heads) : spec.rows;
    for (int r = 0; r < spec.rows; r += block) rows.push_back(block);
  }
  return rows;
}

// The blocks' matrices (role kMatrix; q, k and v of qkvw one by one, or muon_matrix_rows' blocks
// of m.muon_qk_heads) grouped by their shape in the wide orientation, tensor by tensor and layer
// by layer within a group: each group is orthogonalised in one batched call. Each matrix's rate
// multiplier is its tensor's of tensor_lr. Fills m.muon_offsets; the groups' pointers are made by
// gpt2_muon_pointers.
void gpt2_muon_groups(GPT2& m, const llmc::TensorMultipliers& tensor_lr) {
  struct Matrix { size_t offset; bool tall; float lr_scale; };
  std::vector<std::pair<std::pair<int, int>, std::vector<Matrix>>> groups;
  for (int i = 0; i < llmc::kNumParamTensors; i++) {
    const llmc::ParamSpec& spec = m.param_specs[i];
    if (!muon_updates(spec) || spec.size == 0) continue;
    const std::vector<int> rows = muon_matrix_rows(i, spec, m.muon_qk_heads, m.config);
    for (int l = 0; l < m.config.num_layers; l++) {
      if (llmc::param_slab(m.plan, spec, l) < 0) continue;
      size_t offset = m.param(i, l) - m.params;
      for (int r : rows) {
        const std::pair<int, int> wide = {std::min(r, spec.cols), std::max(r, spec.cols)};
        auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == wide; });
        if (group == groups.end()) group = groups.insert(groups.end(), {wide, {}});
        group->second.push_back({offset, r > spec.cols, tensor_lr[i]});
        offset += (size_t)r * spec.cols;
      }
    }
  }
  m.muon_groups.clear();
  m.muon_offsets.clear();
  std::vector<uint8_t> tall;
  std::vector<float> lr_scale;
  for (const auto& g : groups) {
    MuonGroup group;
    group.m = g.first.first;
    group.n = g.first.second;
    group.count = (int)g.second.size();
    m.muon_groups.push_back(group);
    for (const Matrix& matrix : g.second) {
      m.muon_offsets.push_back(matrix.offset);
      tall.push_back(matrix.tall);
      lr_scale.push_back(matrix.lr_scale);
    }
  }
  // kMuonPointerSets arrays of pointers, the multipliers, the tall flags.
  const size_t count = m.muon_offsets.size(), pointers = count * kMuonPointerSets * sizeof(void*);
  m.muon_pointers = device_alloc<char>(pointers + count * (sizeof(float) + 1), "Muon's matrix pointers");
  char* device = (char*)m.muon_pointers;
  cudaCheck(cudaMemcpy(device + pointers, lr_scale.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  cudaCheck(cudaMemcpy(device + pointers + count * sizeof(float), tall.data(), count, cudaMemcpyHostToDevice));
  int largest = 0;
  for (const MuonGroup& g : m.muon_groups) largest = std::max(largest, g.count);
  muon_workspace_alloc(m.muon_workspace, m.muon_groups, largest);
}

// Points the groups at the parameters, gradients and the state arrays of `arrays` (Muon's momentum,
// NorMuon's second moments and the master weights; StateLayout). A matrix's state pointer is where
// its first element's state would be: with ZeRO-1 a matrix may start before the shard or lie past
// it, and then the pointer lies outside the arrays, but the sharded kernels touch only the shard's
// elements.
void gpt2_muon_pointers(GPT2& m, const OptimizerArrays& arrays) {
  const StateLayout& layout = m.state_layout;
  const size_t count = m.muon_offsets.size();
  std::vector<void*> host(kMuonPointerSets * count);
  auto at = [](float* array, ptrdiff_t element) { return (void*)((uintptr_t)array + element * sizeof(float)); };
  for (size_t i = 0; i < count; i++) {
    const size_t offset = m.muon_offsets[i];
    int tensor = 0;  // the tensor holding the matrix
    while (tensor + 1 < llmc::kNumParamTensors && m.param_offsets[tensor + 1] <= offset) tensor++;
    const ptrdiff_t in_part = (ptrdiff_t)offset - (ptrdiff_t)layout.begin[tensor];
    host[i] = m.params + offset;
    host[count + i] = arrays.master ? at(arrays.master, (ptrdiff_t)offset - (ptrdiff_t)m.shard_offset) : nullptr;
    host[2 * count + i] = m.grads + offset;
    host[3 * count + i] = at(arrays.momentum, (ptrdiff_t)layout.state[tensor] + in_part);
    host[4 * count + i] =
        arrays.second_moments ? at(arrays.second_moments, (ptrdiff_t)layout.state[tensor] + in_part) : nullptr;
  }
  void** device = (void**)m.muon_pointers;
  cudaCheck(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice, m.stream));
  cudaCheck(cudaStreamSynchronize(m.stream));  // host is a local
  const float* lr_scale = (const float*)(device + kMuonPointerSets * count);
  const uint8_t* tall = (const uint8_t*)(lr_scale + count);
  size_t first = 0;
  for (MuonGroup& g : m.muon_groups) {
    g.params = (floatX**)device + first;
    g.master = arrays.master ? (float**)device + count + first : nullptr;
    g.grads = (floatX**)device + 2 * count + first;
    g.momentum = (float**)device + 3 * count + first;
    g.second_moments = arrays.second_moments ? (float**)device + 4 * count + first : nullptr;
    g.tall = tall + first;
    g.lr_scale = lr_scale + first;
    first += g.count;
  }
  m.muon_state_for = arrays;
}

// The FP32 master weights of `owner`'s tensors in this rank's shard, from the model's arrays to
// state_next (where there are master weights).
void copy_masters_to_next(GPT2& m, StateOwner owner) {
  const StateLayout& layout = m.state_layout;
  const OptimizerArrays &from = m.state, &to = m.state_next;
  if (!from.master) return;
  for (int i = 0; i < layout.count; i++) {
    if (layout.owner[i] != owner) continue;
    const size_t o = layout.begin[i] - layout.shard_offset;
    cudaCheck(cudaMemcpyAsync(to.master + o, from.master + o, layout.size[i] * sizeof(float),
                              cudaMemcpyDeviceToDevice, m.stream));
  }
}

// After a checkpoint the optimizer state moves to other arrays (OptimizerState::state_next):
// Muon's momentum, NorMuon's second moments and its matrices' master weights in this rank's shard
// are copied there, to be updated in place (AdamW writes its tensors' new state there itself).
void gpt2_muon_copy_state(GPT2& m) {
  const StateLayout& layout = m.state_layout;
  const OptimizerArrays &from = m.state, &to = m.state_next;
  cudaCheck(cudaMemcpyAsync(to.momentum, from.momentum, layout.muon_size * sizeof(float),
                            cudaMemcpyDeviceToDevice, m.stream));
  if (layout.second_moment_size > 0) {
    cudaCheck(cudaMemcpyAsync(to.second_moments, from.second_moments, layout.second_moment_size * sizeof(float),
                              cudaMemcpyDeviceToDevice, m.stream));
  }
  copy_masters_to_next(m, StateOwner::kMuon);
}

// A step without AdamW's update (-ao) after a checkpoint: its moments and its tensors' master
// weights are copied to the arrays the model goes on with, as its update would have written them.
void gpt2_adamw_copy_state(GPT2& m) {
  const StateLayout& layout = m.state_layout;
  const OptimizerArrays &from = m.state, &to = m.state_next;
  for (const auto& [source, target] : {std::pair{from.adam_m, to.adam_m}, std::pair{from.adam_v, to.adam_v}}) {
    cudaCheck(cudaMemcpyAsync(target, source, layout.adamw_size * sizeof(float), cudaMemcpyDeviceToDevice, m.stream));
  }
  copy_masters_to_next(m, StateOwner::kAdamW);
}

// Muon's step on the blocks' matrices, its rate times lr_fraction. Each process orthogonalises
// its share of every group and takes the others' from spread. With -zs 0 every process holds the
// whole averaged gradient and momentum and updates them all (muon_update_spread); with ZeRO-1 it
// steps its shard's momentum, the processes gather the Nesterov inputs, and each applies the
// update to its shard (muon_update_sharded), whose parameters multi_gpu_gather_params then
// gathers. Both give every element the same bits for a process count, and a group's matrices
// the same bits on any process count where cuBLASLt runs the group's algorithm for a share.
void gpt2_muon_update(GPT2& m, const MuonParams& params, const llmc::TensorMultipliers& tensor_lr,
                      float lr_fraction, uint32_t seed, const OptimizerSpread& spread) {
  if (m.muon_groups.empty()) gpt2_muon_groups(m, tensor_lr);
  const bool moved = has_arrays(m.state_next);
  const OptimizerArrays& arrays = moved ? m.state_next : m.state;
  if (moved) gpt2_muon_copy_state(m);
  if (!same_arrays(m.muon_state_for, arrays)) gpt2_muon_pointers(m, arrays);
  MuonParams step = params;
  step.lr = params.lr * lr_fraction;
  auto group_seed = [seed](size_t g) {
    return seed + 0x9e3779b9u * (uint32_t)(llmc::muon_group_seed_index(g) + 1);
  };
  if (m.shard_count == 1) {
    for (size_t g = 0; g < m.muon_groups.size(); g++) {
      muon_update_spread(m.muon_groups[g], step, group_seed(g), m.muon_workspace, spread, m.stream);
    }
    return;
  }
  REQUIRE(spread.world == m.shard_count && spread.gather_shards,
          "Muon with ZeRO-1: %d shards, but the orthogonalisation is spread over %d processes", m.shard_count,
          spread.world);
  const MuonShard shard = {m.grads + m.shard_offset, m.grads + m.shard_offset + m.shard_size,
                           m.params + m.shard_offset, m.params + m.shard_offset + m.shard_size};
  for (const MuonGroup& g : m.muon_groups) muon_prepare_shard(g, step, shard, m.stream);
  spread.gather_shards(m.grads, m.shard_size, m.stream);
  for (size_t g = 0; g < m.muon_groups.size(); g++) {
    muon_update_sharded(m.muon_groups[g], step, group_seed(g), m.muon_workspace, spread, shard, m.stream);
  }
}

// The embedding tied to the head (-ut, modded-nanogpt record #89's tied phase), on one optimizer
// shard: the embedding's weights (and their FP32 masters) the head's, which are the same shape
// [Vp, C]. The tied update steps the head with the sum of both gradients and not the embedding
// (gpt2_update), whose AdamW state stays as it was until the untie step copies the head's over it.
void gpt2_tie_embedding(GPT2& m) {
  const size_t wte = m.param_offsets[llmc::kWte], head = m.param_offsets[llmc::kHeadw];
  const size_t n = m.param_specs[llmc::kHeadw].size;
  REQUIRE(m.shard_count == 1 && n == m.param_specs[llmc::kWte].size,
          "gpt2_tie_embedding: a head of %zu elements, an embedding of %zu, %d optimizer shards (one only)", n,
          (size_t)m.param_specs[llmc::kWte].size, m.shard_count);
  cudaCheck(cudaMemcpyAsync(m.params + wte, m.params + head, n * sizeof(floatX), cudaMemcpyDeviceToDevice, m.stream));
  if (m.state.master) {
    cudaCheck(cudaMemcpyAsync(m.state.master + wte, m.state.master + head, n * sizeof(float),
                              cudaMemcpyDeviceToDevice, m.stream));
  }
}

// At the untie step, after its tied update: the head's AdamW moments become the embedding's (the
// step count, which bias-corrects them, is the run's for every tensor), which from the next step
// is updated on its own.
void gpt2_untie_embedding_state(GPT2& m) {
  const StateLayout& l = m.state_layout;
  const size_t n = l.size[llmc::kHeadw];
  const bool adamw = l.owner[llmc::kWte] == StateOwner::kAdamW && l.owner[llmc::kHeadw] == StateOwner::kAdamW;
  REQUIRE(adamw && n == l.size[llmc::kWte], "gpt2_untie_embedding_state: the embedding and the head must be AdamW's "
          "whole tensors of one size");
  for (float* moments : {m.state.adam_m, m.state.adam_v}) {
    cudaCheck(cudaMemcpyAsync(moments + l.state[llmc::kWte], moments + l.state[llmc::kHeadw], n * sizeof(float),
                              cudaMemcpyDeviceToDevice, m.stream));
  }
}

// Appends [begin, begin + count) of `owner` to runs, joined to the last run where it continues it.
void append_run(std::vector<OwnedRun>* runs, size_t begin, size_t count, int owner) {
  if (!runs->empty() && runs->back().owner == owner && runs->back().begin + runs->back().count == begin) {
    runs->back().count += count;
    return;
  }
  runs->push_back({begin, count, owner});
}

// -od 1: the runs of the parameter buffer that Muon's matrices fill, each of the process whose
// share of its group holds it (muon_share). With `state` the runs of the momentum instead (NorMuon's
// second moments are laid out alike), which the tensors' alignment (StateLayout) separates.
void append_muon_runs(const GPT2& m, int world, std::vector<OwnedRun>* runs, bool state = false) {
  const StateLayout& layout = m.state_layout;
  size_t first = 0;
  for (const MuonGroup& g : m.muon_groups) {
    const size_t elements = (size_t)g.m * g.n;
    for (int r = 0; r < world; r++) {
      const MuonShare share = muon_share(g.count, r, world);
      for (int j = share.begin; j < share.end; j++) {
        const size_t offset = m.muon_offsets[first + j];
        int tensor = 0;  // the tensor holding the matrix
        while (tensor + 1 < llmc::kNumParamTensors && m.param_offsets[tensor + 1] <= offset) tensor++;
        append_run(runs, state ? layout.state[tensor] + (offset - layout.begin[tensor]) : offset, elements, r);
      }
    }
    first += g.count;
  }
}

// -oc 2: runs of the parameter buffer cut where a layer's slab of a tensor begins or ends, each piece
// in its layer's part (1 + l; 0 for a tensor of no layer), in order.
std::vector<std::vector<OwnedRun>> param_runs_by_layer(const GPT2& m, const std::vector<OwnedRun>& runs) {
  const int L = m.config.num_layers;
  std::vector<std::vector<OwnedRun>> parts(L + 1);
  for (const OwnedRun& run : runs) {
    for (size_t at = run.begin, end = run.begin + run.count; at < end;) {
      int tensor = 0;  // the tensor holding `at`
      while (tensor + 1 < llmc::kNumParamTensors && m.param_offsets[tensor + 1] <= at) tensor++;
      const llmc::ParamSpec& spec = m.param_specs[tensor];
      const size_t begin = m.param_offsets[tensor];
      size_t piece_end = std::min(end, begin + spec.size);
      int part = 0;
      if (spec.per_layer()) {
        const size_t slab_size = llmc::param_slab_size(m.plan, spec);
        const int slab = (int)((at - begin) / slab_size);
        piece_end = std::min(end, begin + (slab + 1) * slab_size);
        int layer = 0;
        while (layer < L && llmc::param_slab(m.plan, spec, layer) != slab) layer++;
        REQUIRE(layer < L, "param_runs_by_layer: no layer reads slab %d of %s", slab, spec.name);
        part = 1 + layer;
      }
      parts[part].push_back({at, piece_end - at, run.owner});
      at = piece_end;
    }
  }
  return parts;
}

// -od 1: the runs of a divided AdamW tensor (adamw_owned_part), in the parameter buffer or (state)
// in AdamW's moments; none for a tensor every process steps whole.
void append_adamw_runs(const StateLayout& layout, int tensor, int world, std::vector<OwnedRun>* runs,
                       bool state = false) {
  const size_t size = layout.size[tensor];
  if (world == 1 || adamw_owned_part(size, 0, world).end == size) return;
  for (int r = 0; r < world; r++) {
    const OwnedPart part = adamw_owned_part(size, r, world);
    append_run(runs, (state ? layout.state[tensor] : layout.begin[tensor]) + part.begin, part.end - part.begin, r);
  }
}

// AdamW's slices of a step at rate lr (the schedule's) and bias-correction step `adamw_step`:
// every AdamW tensor of the shard but the embedding while it is tied (the head's copy after the
// update, gpt2_tie_embedding); none where AdamW does not step. With spread.divided this process's
// part of each (adamw_owned_part), every part's run added to shared_runs.
AdamWSlices adamw_step_slices(const GPT2& m, const llmc::OptimizerTable& opt, float lr, int adamw_step,
                              uint32_t seed, bool adamw_steps, bool tied, const OptimizerSpread& spread,
                              std::vector<OwnedRun>* shared_runs) {
  AdamWSlices slices;
  const StateLayout& layout = m.state_layout;
  for (int i = 0; i < llmc::kNumParamTensors && adamw_steps; i++) {
    if (layout.owner[i] != StateOwner::kAdamW) continue;
    if (tied && i == llmc::kWte) continue;
    const llmc::RoleOptimizer& row = opt.of_tensor(i);
    const AdamWRates rates = {lr * row.lr, row.beta1, row.beta2, opt.adamw_eps(row, adamw_step), row.weight_decay,
                              row.decay};
    const OwnedPart part = spread.divided ? adamw_owned_part(layout.size[i], spread.rank, spread.world)
                                          : OwnedPart{0, layout.size[i]};
    if (spread.divided) append_adamw_runs(layout, i, spread.world, shared_runs);
    slices.add(layout.begin[i] + part.begin, part.end - part.begin, layout.begin[i] - m.param_offsets[i] + part.begin,
               layout.state[i] + part.begin, rates, seed + 0x9e3779b9u * (llmc::param_seed_index(i) + 1),
               row.bf16,
               i == llmc::kHeadw && fp8_head_support(m.arch()) ? fp8_head_weight_factor(m.fp8_head_setting) : 0.0f);
  }
  return slices;
}

// The first steps of a process, whose products are tuned: the first; where the init zeroes the
// output projections and the head, also the two after it (gpt2_update). Timings leave them out.
inline int tuning_steps(const GPT2& m) { return m.arch().zero_init_outputs ? 3 : 1; }

// The stochastic rounding seed index of the tied head's added gradient: the table's count of 24
// tensors plus one when it was chosen, fixed so that tied runs keep their bits as the table grows.
constexpr uint32_t kTiedHeadSeedIndex = 25;

// Optimizer step `step` (0-based, the one whose rates lr and lr_fraction are) on this rank's shard
// (each tensor's part inside it), given the gradient norm, each tensor by its row of opt (its
// role's; an AdamW tensor's with its own rate, betas and decay): AdamW with clipping at
// opt.grad_clip and the schedule's lr times the row's; Muon with its rate times lr_fraction, the
// schedule's lr over its peak, and the step's momentum, its orthogonalisation spread over the
// processes by optimizer_spread. Through the untie step the head takes the embedding's gradient too,
// and the embedding the head's new weights (gpt2_tie_embedding).
// With -ao K AdamW steps at every K-th step only (opt.adamw_steps_at), with the gradients the
// steps since its last update added up (gpt2_zero_grad keeps them), its bias correction's t its
// own count of updates; the head takes the embedding's gradient then too, as record #89's.
// AdamW runs first: with -od 1 its new parameters go to the other processes while this one runs
// Muon, whose parameters follow. adamw_done, where given, is recorded on the model's stream once
// AdamW's work is enqueued (-pt).
void gpt2_update(GPT2& m, const llmc::OptimizerTable& opt, long step, float lr, float lr_fraction, float grad_norm,
                 const OptimizerSpread& optimizer_spread = OptimizerSpread(), cudaEvent_t adamw_done = nullptr) {
  REQUIRE(opt.muon() == m.muon, "gpt2_update: the optimizer state was allocated %s Muon's momentum, and the "
          "update is %s Muon's", m.muon ? "with" : "without", opt.muon() ? "with" : "without");
  const bool second_moments = m.state_layout.second_moment_size > 0;
  REQUIRE(opt.normuon == second_moments, "gpt2_update: the optimizer state was allocated %s NorMuon's second "
          "moments, and the update is %s NorMuon's", second_moments ? "with" : "without",
          opt.normuon ? "with" : "without");
  REQUIRE(opt.adam_every == m.adamw_every, "gpt2_update: AdamW every %d steps, and the model was set up for every %d",
          opt.adam_every, m.adamw_every);
  nvtxRangePush("update");
  m.optimizer_steps++;
  const bool adamw_steps = opt.adamw_steps_at(step);
  if (adamw_steps) m.adamw_updates++;
  AdamWParams hp = {};
  const float clip = opt.grad_clip;
  hp.grad_scale = (clip > 0.0f && grad_norm > clip) ? clip / (grad_norm + 1e-6f) : 1.0f;
  hp.step = m.adamw_updates;
  const uint32_t seed = m.rng.u32();
  const bool tied = step <= m.untie_step && adamw_steps;
  if (tied) {
    add_inplace(m.grad(llmc::kHeadw), m.grad(llmc::kWte), m.param_specs[llmc::kHeadw].size,
                seed + 0x9e3779b9u * kTiedHeadSeedIndex, m.stream);
  }
  // -od 1: the parameters each process stepped for the others
  std::vector<OwnedRun> adamw_runs, muon_runs;
  const AdamWSlices slices = adamw_step_slices(m, opt, lr, hp.step, seed, adamw_steps, tied, optimizer_spread,
                                               &adamw_runs);
  if (!adamw_steps && has_arrays(m.state_next)) gpt2_adamw_copy_state(m);
  adamw_update(m.params, m.grads, m.state, m.shard_offset, slices, hp, m.stream, m.state_next);
  if (adamw_done) cudaCheck(cudaEventRecord(adamw_done, m.stream));
  if (optimizer_spread.divided) optimizer_spread.share_params(m.params, adamw_runs, m.stream, true);
  if (opt.muon()) {
    gpt2_muon_update(m, muon_step(opt, step, hp.grad_scale), opt.muon_tensor_lr, lr_fraction, seed, optimizer_spread);
    if (optimizer_spread.divided) append_muon_runs(m, optimizer_spread.world, &muon_runs);
  }
  if (optimizer_spread.share_behind) {
    m.params_arriving = optimizer_spread.share_behind(m.params, param_runs_by_layer(m, muon_runs), m.stream);
  } else if (optimizer_spread.divided) {
    optimizer_spread.share_params(m.params, muon_runs, m.stream, false);
  }
  m.adamw_grads_kept = !adamw_steps;
  if (has_arrays(m.state_next)) {
    m.state = m.state_next;
    m.state_next = OptimizerArrays();
  }
  if (tied) gpt2_tie_embedding(m);
  if (step == m.untie_step) gpt2_untie_embedding_state(m);
  m.fp8_weights_stale = true;
  m.fp8_mlp_bootstrap = step < kFp8MlpBootstrapSteps;
  // An init that zeroes the output projections and the head (ArchSpec::zero_init_outputs) makes
  // the first steps' products see zeros, on which algorithms of different summation orders give
  // the same bits: the choices tuned there (fastest_matching_algo) could differ from those of a
  // resumed process, tuned on trained weights. The head moves at the first update; the
  // projections, whose gradients flow through it, at the second: the choices are made again after
  // each (tuning_steps); with -ao, until AdamW's updates are as many.
  if (m.optimizer_steps < tuning_steps(m) || m.adamw_updates < tuning_steps(m)) matmul_forget_choices();
  nvtxRangePop();
}

// The CRC-32 of the parameter bits, for determinism checks.
uint32_t gpt2_params_checksum(GPT2& m) {
  gpt2_settle_params(m);
  std::vector<floatX> bits(m.num_params);
  copy_pageable(bits.data(), m.params, m.num_params * sizeof(floatX), cudaMemcpyDeviceToHost, m.stream);
  return llmc::crc32_update(0, bits.data(), m.num_params * sizeof(floatX));
}

// ============================================================================
// 11. Generation with a KV cache
// ============================================================================
// Autoregressive decoding one token at a time: each layer keeps the keys and values of the
// positions seen so far ([NH, maxT, HS] each), so a new token costs one row through every matmul
// and one query against the cache (attention_forward_decode, section 6), instead of a forward pass
// over the whole sequence. Each layer is the training passes' block_forward on one row, its
// products in BF16 also in an FP8 model. Floor per token: reading the weights once.

struct GPT2Decoder {
  floatX* k_cache = nullptr;  // [L, NH, maxT, HS]
  floatX* v_cache = nullptr;
  char* rows_memory = nullptr;  // one row each of the activations below (decoder_rows)
  int* token = nullptr;
  // Every layer's rows, the residual stream updated in place and every norm written to one row
  // (block_forward with the cache pointers of the layer); the norms' statistics are not needed
  // afterwards.
  BlockRows rows;
  floatX* embedded = nullptr;  // the embedding before its norm (with the smear: the token before's, then its)
  floatX* x0 = nullptr;        // the embedding's output
  SmearRows smear;             // the smear's rows of the token before and the token
  int previous_token = 0;      // the token fed before (the smear's and the bigram embedding's)
  int* bigram_rows = nullptr;  // the token's bigram table row and sign row
  MuddGeneratorRows mudd;      // record #89's MUDD gate generators' steps (rows.mudd_rows their rows)
  MuddConnectionRows mudd_connections;  // and its MUDD dense connections' rows of the token
  floatX* logits = nullptr;    // [Vp]
  int position = 0;            // tokens in the cache
  int document_start = 0;      // the position of the last document start fed (0 before any)
};

// The decoder's rows from the arena a: the block's, the embedding's and the logits', then each
// block feature's (its *_point_rows).
void decoder_rows(GPT2Decoder& d, GPT2& m, RowArena& a) {
  const llmc::GPT2Config& c = m.config;
  const size_t C = c.channels;
  BlockRows& r = d.rows;
  r.B = r.T = 1;
  floatX* residual = a.take<floatX>(C);
  r.input = r.residual2 = r.residual3 = residual;
  float* stats = a.take<float>(2);  // a norm's mean and rstd
  r.ln1 = r.ln2 = r.next = {a.take<floatX>(C), stats, stats + 1};
  r.qkv = a.take<floatX>(3 * C);
  r.qk_rstd = a.take<float>(2 * c.num_heads);  // QK-norm's rstd of each head's q and k
  r.atty = a.take<floatX>(C);
  r.proj = a.take<floatX>(C);
  r.fch = a.take<floatX>(4 * C);
  r.fch_act = a.take<floatX>(4 * C);
  d.logits = a.take<floatX>(c.padded_vocab_size);
  const int smear_rows = m.arch().smear ? 2 : 1;  // the token before's and the token's
  d.embedded = a.take<floatX>(smear_rows * C);
  d.x0 = a.take<floatX>(C);
  d.token = a.take<int>(smear_rows);
  if (m.arch().smear) d.smear = {a.take<floatX>(smear_rows * C), a.take<float>(smear_rows), 0};
  if (m.arch().bigram) d.bigram_rows = a.take<int>(2);
  r.x0 = d.x0;
  r.tokens = d.token + smear_rows - 1;  // the token's own (the value embeddings' rows), after the one before
  value_mix_point_rows(m, 0, r, &a);
  attention_gate_point_rows(m, 0, r, &a);
  head_gate_point_rows(m, r, &a);
  xsa_point_rows(m, 0, r, &a);
  composed_point_rows(m, r, &a);
  residual_mix_point_rows(m, 0, r, &a);
  record89_plan_point_rows(m, 0, r, &a);
  bigram_point_rows(m, r, &a);
  sublayer_lambdas_point_rows(m, 0, r, &a);
  if (m.arch().mudd_gates) {
    floatX* rows = a.take<floatX>(mudd_generators(m.arch()) * llmc::kMuddGateStride);
    for (int g = 0; g < mudd_generators(m.arch()); g++) r.mudd_rows[g] = rows + g * llmc::kMuddGateStride;
    r.skip_scale = a.take<floatX>(1);
    d.mudd = mudd_decoder_rows(m, a);
  }
  if (m.arch().mudd_connections) d.mudd_connections = mudd_decoder_connection_rows(m, r, a);
}

void decoder_init(GPT2Decoder& d, GPT2& m) {
  const llmc::GPT2Config& c = m.config;
  const size_t cache = (size_t)c.num_layers * c.max_seq_len * c.channels;
  d.k_cache = device_alloc<floatX>(cache, "the key cache");
  d.v_cache = device_alloc<floatX>(cache, "the value cache");
  RowArena sizes;
  decoder_rows(d, m, sizes);
  d.rows_memory = device_alloc<char>(sizes.used, "the decoder rows");
  RowArena rows{d.rows_memory};
  decoder_rows(d, m, rows);
  d.position = 0;
  d.document_start = 0;
  attention_lambdas_forward(m);  // the parameters stay as they are while it decodes
}

void decoder_free(GPT2Decoder& d) {
  device_free(d.k_cache);
  device_free(d.v_cache);
  device_free(d.rows_memory);
  d = GPT2Decoder();
}

// Feeds one token at the next position; returns the device row of its logits [Vp] (before the
// modern soft cap: sampling applies it).
const floatX* decoder_step(GPT2Decoder& d, GPT2& m, int token) {
  const llmc::GPT2Config& c = m.config;
  REQUIRE(d.position < c.max_seq_len, "generation reached the model's maximum sequence length %d",
          c.max_seq_len);
  BlockRows r = d.rows;
  r.first_position = d.position;
  if (token == llmc::kDocumentStartToken) d.document_start = d.position;
  r.document_start = d.document_start;
  const size_t C = c.channels, row_bytes = C * sizeof(floatX);
  if (m.arch().smear) {
    // The token before it, which the smear reads, from the second position on.
    const int pair[2] = {d.previous_token, token};
    cudaCheck(cudaMemcpyAsync(d.token, pair, sizeof(pair), cudaMemcpyHostToDevice, m.stream));
    SmearRows smear = d.smear;
    smear.context = d.position > 0 ? 1 : 0;
    embedding_rows(m, d.x0, d.embedded, r.ln1.rstd, d.token + 1, 1, 1, d.position, smear);
  } else {
    cudaCheck(cudaMemcpyAsync(d.token, &token, sizeof(int), cudaMemcpyHostToDevice, m.stream));
    embedding_rows(m, d.x0, d.embedded, r.ln1.rstd, d.token, 1, 1, d.position);
  }
  if (m.arch().mudd_gates) {
    mudd_generator_forward(m, 0, d.x0, (floatX*)r.mudd_rows[0], d.mudd, 1);
  }
  if (m.arch().bigram) {
    // The token's rows at its position of the sequence, the stream's start x0 + g_0 b.
    int rows[2];
    llmc::bigram_row_at(d.position, token, d.previous_token, bigram_table_rows(m), rows, rows + 1);
    cudaCheck(cudaMemcpyAsync(d.bigram_rows, rows, sizeof(rows), cudaMemcpyHostToDevice, m.stream));
    bigram_forward(r.bigram, m.param(llmc::kBigram), d.bigram_rows, m.bigram_signs, d.bigram_rows + 1, 1,
                   (int)C, m.stream);
    const GateRows g = gate_rows(m, r, llmc::kMuddBigram, 0, m.param(llmc::kBigramGates, 0));
    bigram_gate_forward(r.residual3, d.x0, r.bigram, g, 1, (int)C, m.stream);
  } else {
    cudaCheck(cudaMemcpyAsync(r.residual3, d.x0, row_bytes, cudaMemcpyDeviceToDevice, m.stream));
  }
  d.previous_token = token;
  const MuddConnectionRows& connections = d.mudd_connections;
  if (m.arch().mudd_connections) {
    cudaCheck(cudaMemcpyAsync((floatX*)connections.in0, r.residual3, row_bytes, cudaMemcpyDeviceToDevice, m.stream));
  }
  const size_t layer_cache = (size_t)c.max_seq_len * C;
  for (int l = 0; l < c.num_layers; l++) {
    r.k_cache = d.k_cache + l * layer_cache;
    r.v_cache = d.v_cache + l * layer_cache;
    decode_kept_inputs(m, l, r);
    if (m.arch().mudd_gates && l == llmc::kMuddPostLayer) {
      mudd_generator_forward(m, 1, r.residual3, (floatX*)r.mudd_rows[1], d.mudd, 1);
    }
    if (mudd_layer(m, l)) {
      cudaCheck(cudaMemcpyAsync((floatX*)connections.out9, r.residual3, row_bytes, cudaMemcpyDeviceToDevice,
                                m.stream));
      mudd_generator_forward(m, kMuddLayerGenerator, connections.out9, (floatX*)connections.layer, d.mudd, 1);
      mudd_layer_rows(m, connections, 1);
    }
    block_forward(m, l, r);
    decode_keep_output(m, l, r);
  }
  if (m.arch().mudd_connections) {
    mudd_generator_forward(m, kMuddFinalGenerator, r.residual3, (floatX*)connections.final, d.mudd, 1);
    mudd_final_rows(m, connections, r.residual3, r.tokens, r.next, 1);
  }
  head_rows(m, d.logits, r.next.out, 1);
  d.position++;
  return d.logits;
}

// Samples from logits [V] with a temperature (0: greedy) and top-k (0: all tokens).
int sample_token(const std::vector<float>& logits, float temperature, int top_k, llmc::Rng& rng) {
  const int V = (int)logits.size();
  std::vector<int> order(V);
  for (int i = 0; i < V; i++) order[i] = i;
  const int k = top_k > 0 && top_k < V ? top_k : V;
  // Ties broken by the lower id, so the choice does not depend on the sort's implementation.
  const auto by_logit = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (temperature <= 0.0f) return *std::min_element(order.begin(), order.end(), by_logit);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
  std::vector<double> probs(k);
  double sum = 0.0;
  for (int i = 0; i < k; i++) sum += (probs[i] = exp((logits[order[i]] - logits[order[0]]) / temperature));
  const double u = rng.uniform_double() * sum;
  double cdf = 0.0;
  for (int i = 0; i < k; i++) {
    cdf += probs[i];
    if (u < cdf) return order[i];
  }
  return order[k - 1];
}

// Feeds `prompt` and generates `length` tokens, calling on_token(id) for each new one as soon as
// it is sampled. Returns the generated ids.
template <class OnToken>
std::vector<int> generate(GPT2& m, const std::vector<int>& prompt, int length, float temperature,
                          int top_k, llmc::Rng& rng, OnToken on_token) {
  REQUIRE(!prompt.empty(), "generation needs at least one prompt token");
  REQUIRE((int)prompt.size() + length <= m.config.max_seq_len,
          "prompt (%zu tokens) plus %d generated tokens exceed the model's maximum sequence "
          "length %d: shorten the prompt or -g", prompt.size(), length, m.config.max_seq_len);
  GPT2Decoder d;
  decoder_init(d, m);
  std::vector<floatX> row(m.config.vocab_size);
  std::vector<float> logits(m.config.vocab_size);
  const llmc::LogitCap cap = m.logit_cap.evaluation();  // the distribution is the capped logits' softmax
  std::vector<int> out;
  const floatX* device_logits = nullptr;
  for (int token : prompt) device_logits = decoder_step(d, m, token);
  for (int i = 0; i < length; i++) {
    cudaCheck(cudaMemcpyAsync(row.data(), device_logits, row.size() * sizeof(floatX),
                              cudaMemcpyDeviceToHost, m.stream));
    cudaCheck(cudaStreamSynchronize(m.stream));
    floatX_to_float(logits.data(), row.data(), row.size());
    if (cap.kind != llmc::LogitCap::kNone) {
      for (float& z : logits) z = cap.apply(z);
    }
    const int next = sample_token(logits, temperature, top_k, rng);
    out.push_back(next);
    on_token(next);
    if (i + 1 < length) device_logits = decoder_step(d, m, next);
  }
  decoder_free(d);
  return out;
}

// ============================================================================
// 12. Checkpoints
// ============================================================================
// A checkpoint at step s in the output directory is: model_<s>.bin (llm.c format, written by
// rank 0), state_<s>_<rank>.bin per rank (optimizer moments, FP32 master weights, the step, every
// RNG and the data loader's position), and DONE_<s>, written last, once every file is complete.
// Each file is written under a temporary name, flushed to disk and renamed; each header holds a
// CRC-32 of its file, verified on load (llmc/file_header.h, llmc/train_state.h). Resuming from
// one gives exactly the bits the uninterrupted run would have had. With ZeRO a state file holds
// the rank's shard of the optimizer state only; a resume with another process count or -zs
// reshards the state as it loads (llmc/reshard.h), and continues the run as that layout would
// have, within the rounding of summing the gradient in another order. File names, DONE markers
// and pruning: llmc/checkpoint_files.h.
//
// Writes happen on a background thread (llmc::CheckpointWriter), one checkpoint at a time:
//  - The step that checkpoints enqueues copies of what it saves (rank 0: the parameters as
//    stored; every rank: its optimizer state) into host buffers, on a stream of
//    their own after the step's update, and hands the writer a job; training goes on. The copies
//    run beside the next step's forward and backward passes, and that step's update, which
//    overwrites what they read, waits for them (checkpoint_before_update). The writer waits for
//    the copies, then writes, syncs and renames each file.
//  - Over PCIe the copies take longer than a step of the large models (d48: 22 GB), so where the
//    GPU has the memory to spare a snapshot stays on the GPU: the parameters are copied there in
//    stream order (3.1 GB at d48, a small part of a step), and the optimizer's state is not
//    copied at all: the next update writes its new state into a second set of arrays and the
//    model goes on with those (OptimizerState::state_next), leaving the checkpoint's. The
//    writer's thread takes both to the host a piece at a time during the steps that follow
//    (checkpoint_snapshot_to_host), which wait for none of it.
//  - DONE_<s> comes after every file of every rank: with one process the job writes it (and
//    prunes) after its files. With several, each rank's job writes its files only; each step's
//    reduction of the stop requests also sums the ranks' writers that are not done, and once
//    that sum is 0 rank 0's writer writes the marker and prunes (checkpoint_advance).
//  - A failed write (the first failure, naming the file and the reason) is in the same
//    reduction: every rank stops with status 1, the step gets no marker and no older checkpoint
//    is pruned.
//  - The next checkpoint (which reuses the buffers), the end of the run, -halt and a stop signal
//    first wait for every write in flight and its marker (checkpoint_settle, section 14).
// With -ac 1 (and -n N, so the run goes on after a checkpoint) the buffers are pinned once for
// the run, so the copies overlap computing; -ac 0, or host memory that cannot be pinned, copies
// into pageable buffers for each checkpoint (through pinned pieces, copy_pageable) and settles at
// once, which is the synchronous write of the same bytes. The model file of a BF16 build holds
// the parameters' BF16 bits as stored, the bytes of rounding their FP32 values to nearest even
// (exact for every value but NaN).
//
// A state file keeps the optimizer state as three flat arrays over the shard, m, v and master
// (llmc/train_state.h), whichever optimizer owns a tensor: Muon's momentum in m's place, and in v's
// NorMuon's second moments as the GPU lays them out (a matrix's n values where its first n
// elements lie, zeros after), or without them zero, as in the files of the versions that kept
// those arrays on the GPU.
// The copies between the GPU's compact arrays (StateLayout) and that layout are
// state_file_copies'; the host buffers hold zeros wherever no copy writes (state_file_gaps).

// One copy between a set of the optimizer's arrays and the file's layout: `count` floats at
// `device`, and at position `at` of the file's array `array` (0 m, 1 v, 2 master).
struct StateCopy {
  float* device;
  int array;
  size_t at, count;
};

std::vector<StateCopy> state_file_copies(const StateLayout& l, const OptimizerArrays& a) {
  std::vector<StateCopy> copies;
  for (int i = 0; i < l.count; i++) {
    const size_t at = l.begin[i] - l.shard_offset;
    if (l.owner[i] == StateOwner::kAdamW) {
      copies.push_back({a.adam_m + l.state[i], 0, at, l.size[i]});
      copies.push_back({a.adam_v + l.state[i], 1, at, l.size[i]});
    } else if (l.owner[i] == StateOwner::kMuon) {
      copies.push_back({a.momentum + l.state[i], 0, at, l.size[i]});
      if (a.second_moments) copies.push_back({a.second_moments + l.state[i], 1, at, l.size[i]});
    }
  }
  if (a.master) copies.push_back({a.master, 2, 0, l.shard_size});
  return copies;
}

// Zeroes what no copy writes of the file's m and v in the host buffer `optimizer` (m, then v, each
// shard_size): v of Muon's matrices without NorMuon, and a last ZeRO shard's elements past the
// parameters.
void state_file_zero_gaps(const StateLayout& l, float* optimizer) {
  for (int array = 0; array < 2; array++) {
    float* base = optimizer + array * l.shard_size;
    size_t covered = 0;  // the tensors' parts lie in the shard in order
    for (int i = 0; i <= l.count; i++) {
      const bool end = i == l.count;
      const bool v_of_muon = !end && array == 1 && l.owner[i] == StateOwner::kMuon && l.second_moment_size == 0;
      if (!end && (l.owner[i] == StateOwner::kNone || v_of_muon)) continue;
      const size_t at = end ? l.shard_size : l.begin[i] - l.shard_offset;
      if (at > covered) host_zero_parallel(base + covered, (at - covered) * sizeof(float));
      if (!end) covered = at + l.size[i];
    }
  }
}

llmc::TrainStateId train_state_id(const GPT2& m, int step, int rank, int world, int64_t data_tokens) {
  llmc::TrainStateId id;
  id.step = step;
  id.rank = rank;
  id.world = world;
  id.num_params = m.shard_size;
  id.master_weights = m.state.master != nullptr;
  id.zero_stage = m.shard_count > 1 ? 1 : 0;
  // The run's optimizer, not this rank's slice: with ZeRO-1 a slice may hold no Muon matrix.
  id.matrix_optimizer = !m.muon                               ? llmc::kMatrixOptimizerAdamw
                        : m.state_layout.second_moment_size > 0 ? llmc::kMatrixOptimizerNorMuon
                                                                : llmc::kMatrixOptimizerMuon;
  id.data_tokens = data_tokens;
  id.untie_step = (int)m.untie_step;
  id.adam_every = m.adamw_every;
  id.muon_qk_heads = m.muon_qk_heads;
  return id;
}

// AdamW's state besides its moments (-ao; llmc::AdamKept): its updates so far, and this rank's
// gradients where it keeps its tensors' for its next update (the next step's backward adds to them).
llmc::AdamKept gpt2_adamw_kept(const GPT2& m) {
  llmc::AdamKept kept;
  kept.updates = m.adamw_updates;
  if (!m.adamw_grads_kept) return kept;
  std::vector<floatX> bits(m.shard_size);
  copy_pageable(bits.data(), m.grads + m.shard_offset, m.shard_size * sizeof(floatX), cudaMemcpyDeviceToHost,
                m.stream);
  kept.grads.resize(m.shard_size);
  floatX_to_float(kept.grads.data(), bits.data(), m.shard_size);
  return kept;
}

void gpt2_adamw_restore(GPT2& m, const llmc::AdamKept& kept) {
  m.adamw_updates = kept.updates;
  m.adamw_grads_kept = !kept.grads.empty();
  if (!m.adamw_grads_kept) return;
  REQUIRE(kept.grads.size() == m.shard_size, "gpt2_adamw_restore: %zu kept gradients for a shard of %zu",
          kept.grads.size(), m.shard_size);
  std::vector<floatX> bits(m.shard_size);
  float_to_floatX(bits.data(), kept.grads.data(), m.shard_size);
  cudaCheck(cudaMemsetAsync(m.grads, 0, m.num_params_padded * sizeof(floatX), m.stream));
  copy_pageable(m.grads + m.shard_offset, bits.data(), m.shard_size * sizeof(floatX), cudaMemcpyHostToDevice,
                m.stream);
}

// Loads the checkpoint's training state into the model (which holds its parameters already),
// resharded when the checkpoint was written by another process count or ZeRO stage. `pinned`
// (optional): the checkpoints' pinned host buffers, room for the state's arrays; a rank's own
// file is read straight into them and uploaded from there, rather than into pageable vectors
// whose every page is first zeroed and then copied through pinned pieces (at d48, 18.7 GB).
llmc::HostTrainState load_state(GPT2& m, const std::string& dir, int step, int rank, int world,
                                int64_t data_tokens, float* pinned) {
  const std::string remedy = llmc::strformat(
      "delete %s/DONE_%08d to resume from the checkpoint before it", dir.c_str(), step);
  const llmc::TrainStateId id = train_state_id(m, step, rank, world, data_tokens);
  llmc::TrainStateId written;
  llmc::TrainState s = llmc::checkpoint_train_state(dir, id, m.num_params, remedy.c_str(), &written,
                                                    pinned);
  if (rank == 0 && (written.world != world || written.zero_stage != id.zero_stage)) {
    printf("resharded: the checkpoint of %d process%s with ZeRO stage %d resumes on %d with stage "
           "%d\n", written.world, written.world == 1 ? "" : "es", written.zero_stage, world,
           id.zero_stage);
  }
  const size_t n = m.shard_size;
  const bool read_pinned = s.adam_m.empty();
  const float* files[3] = {pinned, pinned + n, pinned + 2 * n};
  if (!read_pinned) files[0] = s.adam_m.data(), files[1] = s.adam_v.data(), files[2] = s.master.data();
  for (const StateCopy& c : state_file_copies(m.state_layout, m.state)) {
    const float* host = files[c.array] + c.at;
    if (read_pinned) {
      cudaCheck(cudaMemcpyAsync(c.device, host, c.count * sizeof(float), cudaMemcpyHostToDevice, m.stream));
    } else {
      copy_pageable(c.device, host, c.count * sizeof(float), cudaMemcpyHostToDevice, m.stream);
    }
  }
  if (read_pinned) {
    cudaCheck(cudaStreamSynchronize(m.stream));  // the checkpoints reuse the buffers, gaps zero
    state_file_zero_gaps(m.state_layout, pinned);
  }
  m.optimizer_steps = s.optimizer_steps;
  gpt2_adamw_restore(m, s.adam);
  m.rng.restore(s.host.model_rng);
  gpt2_fp8_restore_history(m, s.fp8, llmc::checkpoint_path(dir, "state", step, 0));
  gpt2_fp8_mlp_restore_scales(m, s.fp8, step, llmc::checkpoint_path(dir, "state", step, rank));
  return s.host;
}

struct Checkpointer {
  std::string dir;  // -o; empty: no checkpoints
  int keep_last = 0, keep_every = 0;
  bool async = false;  // pinned buffers, settled at the next checkpoint
  int device = 0;
  int rank = 0;
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t state_ready = nullptr;  // on the model's stream, after the checkpoint step's update
  cudaEvent_t copied = nullptr;       // on copy_stream, after the copies
  floatX* params_host = nullptr;      // rank 0: the parameters as stored
  float* optimizer_host = nullptr;    // AdamW's first moments, second moments, master weights
  size_t pinned_bytes = 0;            // of the two above, pinned at setup in pin_seconds
  double pin_seconds = 0.0;
  // The snapshot on the GPU (none where memory is short): a copy of the parameters (rank 0), and
  // the optimizer's state as two sets of arrays, the model's own and a second one allocated here.
  // A checkpoint keeps the model's current set for its writer, and the next update writes the
  // other (OptimizerState::state_next): no copy of the optimizer state.
  floatX* params_snapshot = nullptr;
  OptimizerArrays state_sets[2];
  OptimizerArrays saved;  // the set the checkpoint in flight saves
  int unmarked_step = -1;  // several ranks: a checkpoint whose marker is not asked for yet
  int marking_step = -1;   // rank 0: the checkpoint whose marker its writer writes
  int64_t data_tokens = 0;  // the training data's, recorded in each state file
  llmc::CheckpointWriter writer;  // last: destroyed first, so a job in flight ends before the rest
};

size_t checkpoint_param_bytes(const GPT2& m, int rank) { return rank == 0 ? m.num_params * sizeof(floatX) : 0; }
size_t checkpoint_optimizer_bytes(const GPT2& m) { return (m.state.master ? 3 : 2) * m.shard_size * sizeof(float); }

// The GPU memory left free beside a snapshot: the decoder's cache of a sample, the libraries'
// allocations after setup, and headroom.
size_t checkpoint_snapshot_spare() {
  size_t free_bytes = 0, total_bytes = 0;
  cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
  return (1ul << 30) + total_bytes / 20;
}

bool checkpoint_has_snapshot(const Checkpointer& ck) { return has_arrays(ck.state_sets[1]); }

// The second set of the optimizer's arrays and (rank 0) the parameters' copy, where the GPU has
// their bytes and checkpoint_snapshot_spare() beyond; otherwise none.
void checkpoint_take_snapshot_memory(Checkpointer& ck, const GPT2& m, int rank) {
  const size_t params = checkpoint_param_bytes(m, rank);
  const bool master = m.state.master != nullptr;
  size_t free_bytes = 0, total_bytes = 0;
  cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t state = optimizer_arrays_bytes(m.state_layout, master);
  if (free_bytes < params + state + checkpoint_snapshot_spare()) return;
  const size_t no_spare = 0;
  // Zeroed, as the model's own: the elements of a last ZeRO shard past the parameters are never
  // updated, and the state files hold them (llmc/train_state.h).
  if (!optimizer_arrays_alloc(&ck.state_sets[1], m.state_layout, master, &no_spare)) return;
  if (params > 0) ck.params_snapshot = (floatX*)device_try_alloc(params, 0);
  if (params > 0 && !ck.params_snapshot) {
    optimizer_arrays_free(ck.state_sets[1]);
    return;
  }
  ck.state_sets[0] = m.state;
}

// Pins the host buffers for the run; on failure nothing stays allocated.
cudaError_t checkpoint_pin_buffers(Checkpointer& ck, const GPT2& m, int rank) {
  void* params = nullptr;
  void* optimizer = nullptr;
  cudaError_t error = cudaSuccess;
  if (checkpoint_param_bytes(m, rank) > 0) error = pinned_host_alloc(&params, checkpoint_param_bytes(m, rank));
  if (error == cudaSuccess) error = pinned_host_alloc(&optimizer, checkpoint_optimizer_bytes(m));  // zeroed
  if (error != cudaSuccess) {
    pinned_host_free(params, checkpoint_param_bytes(m, rank));
    return error;
  }
  ck.params_host = (floatX*)params;
  ck.optimizer_host = (float*)optimizer;
  return cudaSuccess;
}

// Frees the set of AdamW's state the model is not using (a move still to come is called off).
void checkpoint_free_buffers(Checkpointer& ck, GPT2& m) {
  if (checkpoint_has_snapshot(ck)) {
    m.state_next = OptimizerArrays();
    OptimizerArrays unused = same_arrays(ck.state_sets[0], m.state) ? ck.state_sets[1] : ck.state_sets[0];
    optimizer_arrays_free(unused);
    device_free(ck.params_snapshot);
    ck.state_sets[0] = ck.state_sets[1] = ck.saved = OptimizerArrays();
    ck.params_snapshot = nullptr;
  }
  if (ck.async) {
    pinned_host_free(ck.params_host, checkpoint_param_bytes(m, ck.rank));
    pinned_host_free(ck.optimizer_host, checkpoint_optimizer_bytes(m));
  } else {
    free(ck.params_host);
    free(ck.optimizer_host);
  }
  ck.params_host = nullptr;
  ck.optimizer_host = nullptr;
}

// With pin, the buffers are pinned for the run and checkpoints written in the background, unless
// host memory cannot be pinned (a note says so, and they are written synchronously); with
// snapshot too, through a snapshot on the GPU where its memory allows.
void checkpoint_setup(Checkpointer& ck, const std::string& dir, int keep_last, int keep_every,
                      bool pin, bool snapshot, const GPT2& m, int rank) {
  ck.dir = dir;
  ck.rank = rank;
  ck.keep_last = keep_last;
  ck.keep_every = keep_every;
  cudaCheck(cudaGetDevice(&ck.device));
  cudaCheck(cudaStreamCreateWithFlags(&ck.copy_stream, cudaStreamNonBlocking));
  cudaCheck(cudaEventCreateWithFlags(&ck.state_ready, cudaEventDisableTiming | cudaEventBlockingSync));
  cudaCheck(cudaEventCreateWithFlags(&ck.copied, cudaEventDisableTiming | cudaEventBlockingSync));
  if (!pin) return;
  // Pinning touches and locks every page (about 1 s for d48's 21.8 GB), before the first step.
  const double pin_start = llmc::wall_seconds();
  const cudaError_t pinned = checkpoint_pin_buffers(ck, m, rank);
  ck.pin_seconds = llmc::wall_seconds() - pin_start;
  ck.async = pinned == cudaSuccess;
  if (ck.async) ck.pinned_bytes = checkpoint_param_bytes(m, rank) + checkpoint_optimizer_bytes(m);
  if (ck.async && snapshot) checkpoint_take_snapshot_memory(ck, m, rank);
  if (!ck.async) {
    printf("rank %d: cannot pin %zu MiB of host memory for checkpoints (%s): they are written "
           "synchronously, as with -ac 0\n", rank,
           (checkpoint_param_bytes(m, rank) + checkpoint_optimizer_bytes(m)) >> 20,
           cudaGetErrorString(pinned));
  }
}

void checkpoint_teardown(Checkpointer& ck, GPT2& m) {
  checkpoint_free_buffers(ck, m);
  cudaCheck(cudaStreamDestroy(ck.copy_stream));
  cudaCheck(cudaEventDestroy(ck.state_ready));
  cudaCheck(cudaEventDestroy(ck.copied));
}

// Copies on `stream` the model's parameters (rank 0) and optimizer state into params and
// optimizer, laid out as the files hold them: enqueued when they are pinned, else done at once.
void checkpoint_copy_state(const GPT2& m, int rank, floatX* params, float* optimizer, bool pinned,
                           cudaStream_t stream) {
  auto copy = [&](void* host, const void* device, size_t bytes) {
    if (pinned) {
      cudaCheck(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
    } else {
      copy_pageable(host, device, bytes, cudaMemcpyDeviceToHost, stream);
    }
  };
  if (rank == 0) copy(params, m.params, checkpoint_param_bytes(m, rank));
  for (const StateCopy& c : state_file_copies(m.state_layout, m.state)) {
    copy(optimizer + c.array * m.shard_size + c.at, c.device, c.count * sizeof(float));
  }
}

// Enqueues the copies of what the checkpoint saves, after everything queued so far on the model's
// stream. With the snapshot: the parameters into their copy on the GPU (rank 0), and AdamW's
// current state stays where it is for the writer while the next update writes the other set (the
// writer takes both to the host, checkpoint_snapshot_to_host). Otherwise: everything into the host
// buffers (allocated here without -ac).
void checkpoint_copy_to_host(Checkpointer& ck, GPT2& m, int rank) {
  if (checkpoint_has_snapshot(ck)) {
    // In stream order: a device copy, a small part of a step (3.1 GB at d48).
    if (rank == 0) {
      cudaCheck(cudaMemcpyAsync(ck.params_snapshot, m.params, checkpoint_param_bytes(m, rank),
                                cudaMemcpyDeviceToDevice, m.stream));
    }
    cudaCheck(cudaEventRecord(ck.state_ready, m.stream));
    ck.saved = m.state;
    m.state_next = same_arrays(ck.state_sets[0], m.state) ? ck.state_sets[1] : ck.state_sets[0];
    return;
  }
  if (!ck.async) {
    ck.params_host = (floatX*)llmc::malloc_checked(checkpoint_param_bytes(m, rank), "a checkpoint's parameters");
    ck.optimizer_host = (float*)llmc::calloc_checked(checkpoint_optimizer_bytes(m), "a checkpoint's optimizer state");
  }
  cudaCheck(cudaEventRecord(ck.state_ready, m.stream));
  cudaCheck(cudaStreamWaitEvent(ck.copy_stream, ck.state_ready, 0));
  checkpoint_copy_state(m, rank, ck.params_host, ck.optimizer_host, ck.async, ck.copy_stream);
  cudaCheck(cudaEventRecord(ck.copied, ck.copy_stream));
}

// On the writer's thread: the snapshot into the host buffers, a piece at a time. The GPU's copy
// engine runs copies to the host in the order they were queued, whatever their stream (on an
// H100 a small read on another stream waited for everything queued before it, in one copy or in
// pieces). With the whole snapshot queued at once, each loss and norm the next steps read waited
// for all of it to cross PCIe. One piece in flight at a time, such a read waits for a piece at
// most (64 MiB).
constexpr size_t kSnapshotPieceBytes = 64ul << 20;

// `copies`: state_file_copies of the saved set.
void checkpoint_snapshot_to_host(const Checkpointer& ck, size_t param_bytes, const std::vector<StateCopy>& copies,
                                 size_t state_count) {
  cudaCheck(cudaEventSynchronize(ck.state_ready));
  auto copy = [&](void* host, const void* snapshot, size_t bytes) {
    for (size_t at = 0; at < bytes; at += kSnapshotPieceBytes) {
      cudaCheck(cudaMemcpyAsync((char*)host + at, (const char*)snapshot + at,
                                std::min(kSnapshotPieceBytes, bytes - at), cudaMemcpyDeviceToHost,
                                ck.copy_stream));
      cudaCheck(cudaStreamSynchronize(ck.copy_stream));
    }
  };
  copy(ck.params_host, ck.params_snapshot, param_bytes);
  for (const StateCopy& c : copies) {
    copy(ck.optimizer_host + c.array * state_count + c.at, c.device, c.count * sizeof(float));
  }
}

// The next update overwrites what the copies to the host read, unless they read the snapshot.
void checkpoint_before_update(Checkpointer& ck, GPT2& m) {
  if (!checkpoint_has_snapshot(ck)) cudaCheck(cudaStreamWaitEvent(m.stream, ck.copied, 0));
}

llmc::CheckpointJob checkpoint_job(const Checkpointer& ck, int step) {
  llmc::CheckpointJob job;
  job.dir = ck.dir;
  job.step = step;
  job.keep_last = ck.keep_last;
  job.keep_every = ck.keep_every;
  job.remedy = llmc::strformat("the earlier checkpoints in %s are intact: fix the cause (free space "
                               "there, or its permissions; or give another -o) and resume with -y 1",
                               ck.dir.c_str());
  return job;
}

// Hands the writer the files of the checkpoint of `step` (host: this rank's host-side state),
// once checkpoint_copy_to_host has enqueued their copies.
void checkpoint_submit(Checkpointer& ck, const GPT2& m, int rank, int world, int step,
                       const llmc::HostTrainState& host) {
  llmc::CheckpointJob job = checkpoint_job(ck, step);
  // ck outlives the job (its writer is destroyed first), and its buffers stay while a job is in flight.
  job.wait_for_data = [&ck, param_bytes = checkpoint_param_bytes(m, rank), state_count = m.shard_size,
                       copies = checkpoint_has_snapshot(ck) ? state_file_copies(m.state_layout, ck.saved)
                                                            : std::vector<StateCopy>()] {
    cudaCheck(cudaSetDevice(ck.device));  // this thread's CUDA calls go to the run's GPU
    if (checkpoint_has_snapshot(ck)) {
      checkpoint_snapshot_to_host(ck, param_bytes, copies, state_count);
    } else {
      cudaCheck(cudaEventSynchronize(ck.copied));
    }
  };
  if (rank == 0) {
    job.write_files.push_back([path = llmc::checkpoint_path(ck.dir, "model", step),
                               config = m.config, params = ck.params_host] {
      llmc::checkpoint_save_payload(path, config, kCheckpointVersionFloatX, params);
    });
  }
  const size_t n = m.shard_size;
  const float* moments = ck.optimizer_host;
  job.write_files.push_back([path = llmc::checkpoint_path(ck.dir, "state", step, rank),
                             id = train_state_id(m, step, rank, world, ck.data_tokens),
                             optimizer_steps = m.optimizer_steps, host, moments, n,
                             master = m.state.master ? moments + 2 * n : nullptr,
                             fp8 = gpt2_fp8_history(m), adam = gpt2_adamw_kept(m)] {
    llmc::train_state_save(path, id, optimizer_steps, host, moments, moments + n, master, fp8, adam);
  });
  job.mark_done = world == 1;
  ck.writer.submit(std::move(job));
  if (world == 1) {
    ck.marking_step = step;
  } else {
    ck.unmarked_step = step;
  }
}

// The writer's state for checkpoint_advance: {not done (busy, or failed), failed}.
std::array<double, 2> checkpoint_writer_state(const Checkpointer& ck) {
  return {ck.writer.done() ? 0.0 : 1.0, ck.writer.failed() ? 1.0 : 0.0};
}

// Given checkpoint_writer_state summed over the ranks: a failure stops every rank; rank 0 reports
// the checkpoint its writer has marked complete, and once every writer is done, has the
// checkpoint all ranks have written marked.
void checkpoint_advance(Checkpointer& ck, int rank, double not_done, double failed,
                        llmc::RunSummary& summary) {
  if (failed > 0) {
    ck.writer.check();  // this rank's failure, naming its file
    LLMC_FAIL("checkpoint write failed on another rank (its error names the file and the reason); "
              "the earlier checkpoints in %s are intact: resume with -y 1 once it is fixed",
              ck.dir.c_str());
  }
  if (ck.marking_step >= 0 && ck.writer.done()) {
    const std::string path = llmc::checkpoint_path(ck.dir, "model", ck.marking_step);
    printf("checkpoint: %s (written in %.1f s)\n", path.c_str(), ck.writer.last_write_seconds());
    summary.checkpoint(path);
    ck.marking_step = -1;
  }
  if (not_done == 0 && ck.unmarked_step >= 0) {
    if (rank == 0) {
      llmc::CheckpointJob marker = checkpoint_job(ck, ck.unmarked_step);
      marker.mark_done = true;
      ck.writer.submit(std::move(marker));
      ck.marking_step = ck.unmarked_step;
    }
    ck.unmarked_step = -1;
  }
}

// SIGTERM and SIGINT (preemption): the first asks the training loop to finish its step, write a
// checkpoint and exit with kExitInterrupted; a second exits at once with 128 + the signal. Files
// only ever appear under their final names complete (written to .tmp, then renamed), so leaving
// at any moment loses at most the checkpoint in progress.
constexpr int kExitInterrupted = 3;
volatile sig_atomic_t stop_requests = 0;

void on_stop_signal(int signum) {
  if (stop_requests > 0) _exit(128 + signum);
  stop_requests = 1;
}

void install_stop_handlers() {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

// ============================================================================
// 13. Multi-GPU
// ============================================================================
// Data parallel, one process per GPU. Under mpirun (OpenMPI, compiled in when mpi.h is found)
// rank 0 makes the NCCL id and MPI broadcasts it; without MPI (Slurm's srun, or by hand with
// -pr/-pn) it goes through the rendezvous of -rv (llmc/rendezvous.h).
//
// Gradients are averaged over the ranks. On the last micro step each layer's 12 gradient slices
// are reduced on a second stream as soon as the backward pass has written them (-ov 1), so the
// communication overlaps the layers below; an element's average does not depend on how the
// buffer is cut into messages, so this equals one reduction after the backward pass (bitwise
// with 2 ranks, where each element is one addition; with more, NCCL may order the additions
// differently for differently sized messages). With ZeRO stage 1 (-zs 1) each piece goes to the
// rank owning it (a reduce-scatter when not overlapped), the rank runs AdamW on its shard, and
// an all-gather on the same stream, after the optimizer kernels, gives every rank the new
// parameters. Muon orthogonalises each rank's share of the matrices and broadcasts the updates
// (multi_gpu_optimizer_spread); with ZeRO-1 the ranks gather the inputs of the orthogonalisation
// first. With -od 1 (without ZeRO) each rank steps its share of Muon's matrices and its part of
// each large AdamW tensor alone: their gradients are reduced to it (multi_gpu_divided_setup), its
// new parameters broadcast from it (OptimizerSpread::share_params), and their state shared before
// a checkpoint (multi_gpu_share_state). With -os 1 the tables that token lookups alone fill go to
// their owners as the rows each process's tokens read (llmc/sparse_rows.h, sparse_rows_exchange).
// The loss and the gradient norm are reduced over the ranks.
//
// Faults: a watchdog (llmc/watchdog.h) ends a rank that makes no progress for -ct seconds (a
// peer died or hangs, so a collective never completes): one line naming the rank and -ct, the
// communicator aborted, exit status kExitPeerLost; every rank is gone within 1.1 x -ct + 10 s.

#include <nccl.h>
#ifdef USE_MPI
#include <mpi.h>
#endif

inline void nccl_check(ncclResult_t r, const char* file, int line) {
  if (r != ncclSuccess) {
    LLMC_FAIL("NCCL error at %s:%d: %s (when another process failed first, its output says why)",
              file, line, ncclGetErrorString(r));
  }
}
#define ncclCheck(call) nccl_check((call), __FILE__, __LINE__)

constexpr int kMultiGpuScratch = 8;
constexpr int kExitPeerLost = 4;
// Seconds the watchdog gives ncclCommAbort before exiting without it (a wedged GPU can block it).
constexpr int kAbortGraceSeconds = 10;

// Command-line settings of the multi-GPU run.
struct MultiGpuOptions {
  llmc::LaunchFlags launch;
  int timeout_s = 300;  // -ct
  // The defaults ran fastest on two GPUs (dev/notes/multi-gpu-scaling.md): ZeRO-1
  // (llmc::Recipe::zero_stage, -zs) with one reduce-scatter after the backward pass, ahead of an
  // all-reduce after it and of a per-layer reduction during it (whose NCCL kernels take SMs from
  // the backward pass, and the power-capped clock drops further while both run).
  int overlap = 0;      // -ov
  int copy_engines = 0;  // -oc
  int sparse_rows = 0;   // -os
};

// -os 1 (llmc/sparse_rows.h): the embedding tables whose gradients go to their parts' owners as the
// rows each process's tokens read. `own` marks this step's rows (pinned); `all`, every process's
// after their all-gather; the step's pieces are uploaded into `pieces` (those sent, those received,
// the marked ones of this process's runs) and packed into `send`, received into `recv`.
struct SparseRows {
  bool asked = false;
  std::vector<llmc::SparseTable> tables;  // in buffer order
  std::vector<llmc::OwnerRun> runs;       // the owners' runs, cut to the tables
  llmc::RowBitmapLayout layout;
  uint32_t* own = nullptr;
  uint32_t* all = nullptr;
  uint32_t* gathered = nullptr;  // on the device, [world x words]
  cudaEvent_t all_copied = nullptr;
  std::vector<int> bigram_ids, sign_rows;
  llmc::SparsePlan plan;  // the step's, its vectors' room kept
  floatX* send = nullptr;
  floatX* recv = nullptr;
  llmc::RowPiece* pieces = nullptr;
  size_t piece_capacity = 0;
  UploadStaging pieces_staging;
};

void sparse_rows_free(SparseRows& sp) {
  if (!sp.own) return;
  cudaCheck(cudaEventSynchronize(sp.all_copied));
  cudaCheck(cudaEventDestroy(sp.all_copied));
  cudaCheck(cudaFreeHost(sp.own));
  cudaCheck(cudaFreeHost(sp.all));
  upload_staging_free(sp.pieces_staging);
  for (void* p : {(void*)sp.gathered, (void*)sp.send, (void*)sp.recv, (void*)sp.pieces}) device_free(p);
  sp = SparseRows();
}

// One block a piece of a row (at most a row's width): packed[at, at + count) = grads[begin, ...).
__global__ void pack_row_pieces_kernel(floatX* packed, const floatX* grads, const llmc::RowPiece* pieces) {
  const llmc::RowPiece p = pieces[blockIdx.x];
  for (uint32_t i = threadIdx.x; i < p.count; i += blockDim.x) packed[p.at + i] = grads[p.begin + i];
}

// grads[begin, begin + count) += packed[at, ...), each sum rounded once: on two processes NCCL's sum.
__global__ void add_row_pieces_kernel(floatX* grads, const floatX* packed, const llmc::RowPiece* pieces) {
  const llmc::RowPiece p = pieces[blockIdx.x];
  for (uint32_t i = threadIdx.x; i < p.count; i += blockDim.x) {
    grads[p.begin + i] = (floatX)((float)grads[p.begin + i] + (float)packed[p.at + i]);
  }
}

// Each piece's elements times scale, after adding 0 so that a -0 becomes the +0 of NCCL's sum.
__global__ void scale_row_pieces_kernel(floatX* grads, const llmc::RowPiece* pieces, float scale) {
  const llmc::RowPiece p = pieces[blockIdx.x];
  for (uint32_t i = threadIdx.x; i < p.count; i += blockDim.x) {
    grads[p.begin + i] = (floatX)(((float)grads[p.begin + i] + 0.0f) * scale);
  }
}

constexpr int kRowPieceThreads = 128;

void pack_row_pieces(floatX* packed, const floatX* grads, const llmc::RowPiece* pieces, int count,
                     cudaStream_t stream) {
  if (count == 0) return;
  pack_row_pieces_kernel<<<count, kRowPieceThreads, 0, stream>>>(packed, grads, pieces);
  cudaCheck(cudaGetLastError());
}

void add_row_pieces(floatX* grads, const floatX* packed, const llmc::RowPiece* pieces, int count,
                    cudaStream_t stream) {
  if (count == 0) return;
  add_row_pieces_kernel<<<count, kRowPieceThreads, 0, stream>>>(grads, packed, pieces);
  cudaCheck(cudaGetLastError());
}

void scale_row_pieces(floatX* grads, const llmc::RowPiece* pieces, int count, float scale, cudaStream_t stream) {
  if (count == 0) return;
  scale_row_pieces_kernel<<<count, kRowPieceThreads, 0, stream>>>(grads, pieces, scale);
  cudaCheck(cudaGetLastError());
}

struct MultiGpu {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int zero_stage = 0;
  bool overlap = false;
  bool divided = false;  // -od 1 (OptimizerSpread::divided)
  // -od 1: the runs of the gradient buffer each reduced to its owner alone, in buffer order (the
  // rest is all-reduced), and on the device the (begin, count) pairs of the runs this process counts
  // in the gradient norm (multi_gpu_divided_setup).
  std::vector<OwnedRun> grad_owners;
  size_t* norm_runs = nullptr;
  int norm_run_count = 0;
  // -od 1: the parameters' broadcast beside Muon starts after params_stepped and ends at params_shared.
  cudaEvent_t params_stepped = nullptr, params_shared = nullptr;
  // -od 1 with -oc 1 or 2: each process's parameter buffer mapped into this one (CUDA IPC; this process's
  // own entry null), from which the runs it stepped are copied (multi_gpu_map_peer_params).
  int copy_engines = 0;
  std::vector<floatX*> peer_params;
  float* copy_barrier = nullptr;  // the one value of copies_barrier's all-reduce
  // -oc 2: Muon's runs copied on copy_stream from copies_start (on the model's stream) on, copied[p]
  // recorded after part p's (param_runs_by_layer), which the next forward waits for as it reaches them.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t copies_start = nullptr;
  std::vector<cudaEvent_t> copied;
  SparseRows sparse;  // -os 1
  bool by_mpi = false;
  std::string launched_by = "single process";
  ncclComm_t comm = nullptr;
  double* scratch = nullptr;  // kMultiGpuScratch doubles on the device for reducing scalars
  cudaStream_t reduce_stream = nullptr;  // the overlapped gradient reduction
  cudaEvent_t grads_ready = nullptr;     // recorded on the model's stream before each layer's reduction
  cudaEvent_t reduce_done = nullptr;
  std::unique_ptr<llmc::Watchdog> watchdog;
};

int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v ? atoi(v) : fallback;
}

// The communicator the watchdog aborts (null while there is none).
std::atomic<ncclComm_t> watched_comm{nullptr};

[[noreturn]] void exit_for_lost_peer(int rank, int timeout_s) {
  fflush(stdout);
  fprintf(stderr, "error: rank %d made no progress for %d s: another process died or hangs, so a "
                  "collective cannot complete; exiting (raise -ct if a step or checkpoint "
                  "legitimately takes longer)\n", rank, timeout_s);
  fflush(stderr);
  const ncclComm_t comm = watched_comm.exchange(nullptr);
  if (comm) {
    static std::atomic<bool> aborted{false};
    std::thread([comm] {
      ncclCommAbort(comm);
      aborted = true;
    }).detach();
    for (int i = 0; i < kAbortGraceSeconds * 10 && !aborted; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  _exit(kExitPeerLost);
}

MultiGpu multi_gpu_init(int* argc, char*** argv, const MultiGpuOptions& options, int zero_stage, bool divided) {
  MultiGpu mg;
  const bool by_mpi = env_int("OMPI_COMM_WORLD_SIZE", 1) > 1;
  llmc::Launch launch;
  llmc::RendezvousSpec rendezvous;
  if (by_mpi) {
#ifdef USE_MPI
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mg.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mg.world);
    mg.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    mg.by_mpi = true;
    mg.launched_by = "mpirun";
#else
    (void)argc;
    (void)argv;
    LLMC_FAIL("launched by mpirun with %d processes, but this build has no MPI: install "
              "libopenmpi-dev and rebuild (make USE_MPI=1), or launch with -pr/-pn and -rv",
              env_int("OMPI_COMM_WORLD_SIZE", 1));
#endif
  } else {
    launch = llmc::resolve_launch(options.launch, [](const char* name) -> const char* { return getenv(name); });
    rendezvous = llmc::parse_rendezvous(options.launch.rendezvous);
    llmc::require_rendezvous(rendezvous, launch);
    mg.rank = launch.rank;
    mg.world = launch.world;
    mg.local_rank = launch.local_rank;
    mg.launched_by = launch.source;
  }
  if (mg.world == 1) return mg;
  mg.zero_stage = zero_stage;
  mg.overlap = options.overlap != 0;
  mg.divided = divided;
  mg.copy_engines = divided ? options.copy_engines : 0;
  mg.sparse.asked = divided && options.sparse_rows;
  int devices = 0;
  cudaCheck(cudaGetDeviceCount(&devices));
  REQUIRE(mg.local_rank < devices, "rank %d has local rank %d, but only %d GPUs are visible: give "
          "each process of a node its own GPU (-pl, SLURM_LOCALID or CUDA_VISIBLE_DEVICES)",
          mg.rank, mg.local_rank, devices);
  cudaCheck(cudaSetDevice(mg.local_rank));
  const int rank = mg.rank, timeout_s = options.timeout_s;
  mg.watchdog.reset(new llmc::Watchdog(timeout_s, [rank, timeout_s] { exit_for_lost_peer(rank, timeout_s); }));
  ncclUniqueId id;
  static_assert(sizeof(id) == llmc::kRendezvousIdBytes, "the rendezvous moves NCCL's unique id");
  if (mg.rank == 0) ncclCheck(ncclGetUniqueId(&id));
  if (by_mpi) {
#ifdef USE_MPI
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
  } else {
    llmc::rendezvous_exchange(rendezvous, launch, &id, timeout_s);
  }
  ncclCheck(ncclCommInitRank(&mg.comm, mg.world, id, mg.rank));
  // Every rank has joined, so none still needs the id file.
  if (mg.rank == 0 && rendezvous.kind == llmc::RendezvousSpec::kFs) {
    llmc::rendezvous_fs_remove(rendezvous.dir, launch);
  }
  watched_comm = mg.comm;
  mg.scratch = device_alloc<double>(kMultiGpuScratch, "the multi-GPU scratch");
  cudaCheck(cudaStreamCreate(&mg.reduce_stream));
  cudaCheck(cudaEventCreateWithFlags(&mg.grads_ready, cudaEventDisableTiming));
  cudaCheck(cudaEventCreateWithFlags(&mg.reduce_done, cudaEventDisableTiming));
  cudaCheck(cudaEventCreateWithFlags(&mg.params_stepped, cudaEventDisableTiming));
  cudaCheck(cudaEventCreateWithFlags(&mg.params_shared, cudaEventDisableTiming));
  mg.watchdog->pause();  // loading the model and the data is local work of any length
  return mg;
}

// The run moves: restarts the watchdog's clock (and arms it after a pause).
void multi_gpu_progress(MultiGpu& mg) {
  if (mg.watchdog) mg.watchdog->progress();
}

// Local work of unbounded length follows (writing a checkpoint).
void multi_gpu_pause(MultiGpu& mg) {
  if (mg.watchdog) mg.watchdog->pause();
}

void multi_gpu_finish(MultiGpu& mg) {
  if (mg.world == 1) return;
  multi_gpu_progress(mg);  // destroying the communicator may wait for the peers
  watched_comm = nullptr;
  ncclCheck(ncclCommDestroy(mg.comm));
  device_free(mg.scratch);
  cudaCheck(cudaStreamDestroy(mg.reduce_stream));
  cudaCheck(cudaEventDestroy(mg.grads_ready));
  cudaCheck(cudaEventDestroy(mg.reduce_done));
  cudaCheck(cudaEventDestroy(mg.params_stepped));
  cudaCheck(cudaEventDestroy(mg.params_shared));
  if (mg.copy_stream) {
    cudaCheck(cudaStreamSynchronize(mg.copy_stream));
    cudaCheck(cudaStreamDestroy(mg.copy_stream));
    cudaCheck(cudaEventDestroy(mg.copies_start));
    for (cudaEvent_t e : mg.copied) cudaCheck(cudaEventDestroy(e));
  }
  for (floatX* peer : mg.peer_params) {
    if (peer) cudaCheck(cudaIpcCloseMemHandle(peer));
  }
  device_free(mg.copy_barrier);
  device_free(mg.norm_runs);
  sparse_rows_free(mg.sparse);
  mg.watchdog.reset();
#ifdef USE_MPI
  if (mg.by_mpi) MPI_Finalize();
#endif
}

constexpr ncclDataType_t kNcclFloatX = sizeof(floatX) == 4 ? ncclFloat32 : ncclBfloat16;

// -os 1: the tables of rows that token lookups alone fill, each slab its own (the untied embedding,
// each value embedding, the bigram table), in buffer order.
std::vector<llmc::SparseTable> sparse_tables(const GPT2& m) {
  const int C = m.config.channels, Vp = m.config.padded_vocab_size;
  std::vector<llmc::SparseTable> tables;
  auto add = [&](int tensor, int rows, int family) {
    const size_t size = m.param_specs[tensor].size, table = (size_t)rows * C;
    REQUIRE(size % table == 0, "-os 1: %s's %zu elements are not tables of %d rows of %d", m.param_specs[tensor].name,
            size, rows, C);
    for (size_t at = 0; at < size; at += table) tables.push_back({m.param_offsets[tensor] + at, rows, C, family});
  };
  if (!m.arch().tied_head) add(llmc::kWte, Vp, llmc::kTokenRows);
  add(llmc::kVe, Vp, llmc::kTokenRows);
  if (m.arch().bigram) add(llmc::kBigram, bigram_table_rows(m), llmc::kBigramRows);
  std::sort(tables.begin(), tables.end(),
            [](const llmc::SparseTable& a, const llmc::SparseTable& b) { return a.begin < b.begin; });
  return tables;
}

// -os 1: the buffers for the most a step can send and receive, for sp.tables, sp.runs and sp.layout
// (of `world` processes, this one `rank`, rows of C elements).
void sparse_rows_allocate(SparseRows& sp, int rank, int world, int C, cudaStream_t stream) {
  size_t elements = 0, rows = 0, own = 0;
  for (const llmc::SparseTable& t : sp.tables) {
    elements += (size_t)t.rows * t.width;
    rows += t.rows;
  }
  for (const llmc::OwnerRun& run : sp.runs) own += run.owner == rank ? run.count : 0;
  const size_t words = sp.layout.words();
  cudaCheck(cudaMallocHost(&sp.own, words * sizeof(uint32_t)));
  cudaCheck(cudaMallocHost(&sp.all, world * words * sizeof(uint32_t)));
  sp.gathered = device_alloc<uint32_t>(world * words, "-os 1's marked rows");
  cudaCheck(cudaEventCreateWithFlags(&sp.all_copied, cudaEventDisableTiming));
  cudaCheck(cudaEventRecord(sp.all_copied, stream));
  // A row is cut into a piece for each run it meets: at most one more piece a run than rows.
  sp.send = device_alloc<floatX>(elements, "-os 1's rows sent");
  sp.recv = device_alloc<floatX>(std::max<size_t>((world - 1) * own, 1), "-os 1's rows received");
  sp.piece_capacity = rows + sp.runs.size() + world * (own / C + 2 * sp.runs.size());
  sp.pieces = device_alloc<llmc::RowPiece>(sp.piece_capacity, "-os 1's pieces of rows");
  upload_staging_allocate(sp.pieces_staging, sp.piece_capacity * sizeof(llmc::RowPiece));
}

// -os 1, after multi_gpu_divided_setup: the tables whose every element has an owner (a tensor too
// small to divide is all-reduced whole, with the rest) and the owners' runs cut to them.
void multi_gpu_sparse_setup(MultiGpu& mg, GPT2& m) {
  SparseRows& sp = mg.sparse;
  if (!sp.asked || sp.own) return;
  for (const llmc::SparseTable& t : sparse_tables(m)) {
    const size_t end = t.begin + (size_t)t.rows * t.width;
    std::vector<llmc::OwnerRun> cut;
    size_t covered = 0;
    for (const OwnedRun& run : mg.grad_owners) {
      const size_t from = std::max(run.begin, t.begin), to = std::min(run.begin + run.count, end);
      if (from >= to) continue;
      cut.push_back({from, to - from, run.owner});
      covered += to - from;
    }
    if (covered != end - t.begin) continue;
    sp.tables.push_back(t);
    sp.runs.insert(sp.runs.end(), cut.begin(), cut.end());
  }
  if (sp.tables.empty()) return;
  sp.layout.rows[llmc::kTokenRows] = m.config.padded_vocab_size;
  sp.layout.rows[llmc::kBigramRows] = m.arch().bigram ? bigram_table_rows(m) : 0;
  sparse_rows_allocate(sp, mg.rank, mg.world, m.config.channels, m.stream);
}

// -os 1, at each micro step of a training step (first and last of them): the rows of its tokens
// (and of their bigram ids) marked; at the last, the marks all-gathered on the reduction stream
// while the micro step runs, for sparse_rows_exchange after it.
void multi_gpu_mark_rows(MultiGpu& mg, const int* inputs, int N, bool first, bool last) {
  SparseRows& sp = mg.sparse;
  if (!sp.own) return;
  const size_t words = sp.layout.words();
  if (first) memset(sp.own, 0, words * sizeof(uint32_t));  // the last step's copies ended in its exchange
  llmc::mark_rows(sp.own + sp.layout.first_word(llmc::kTokenRows), inputs, N);
  if (sp.layout.rows[llmc::kBigramRows]) {
    sp.bigram_ids.resize(N);
    sp.sign_rows.resize(N);
    llmc::bigram_rows(sp.bigram_ids.data(), sp.sign_rows.data(), inputs, N, sp.layout.rows[llmc::kBigramRows]);
    llmc::mark_rows(sp.own + sp.layout.first_word(llmc::kBigramRows), sp.bigram_ids.data(), N);
  }
  if (!last) return;
  uint32_t* mine = sp.gathered + mg.rank * words;
  cudaCheck(cudaMemcpyAsync(mine, sp.own, words * sizeof(uint32_t), cudaMemcpyHostToDevice, mg.reduce_stream));
  ncclCheck(ncclAllGather(mine, sp.gathered, words, ncclUint32, mg.comm, mg.reduce_stream));
  cudaCheck(cudaMemcpyAsync(sp.all, sp.gathered, mg.world * words * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                            mg.reduce_stream));
  cudaCheck(cudaEventRecord(sp.all_copied, mg.reduce_stream));
}

// -os 1: the plan's pieces uploaded, and those this process sends packed from grads.
void sparse_rows_pack(SparseRows& sp, const llmc::SparsePlan& plan, const floatX* grads, cudaStream_t stream) {
  const size_t sent = plan.send.size(), pieces = sent + plan.recv.size() + plan.marked.size();
  REQUIRE(pieces <= sp.piece_capacity, "-os 1: %zu pieces of rows for room of %zu", pieces, sp.piece_capacity);
  llmc::RowPiece* host = upload_staging_host<llmc::RowPiece>(sp.pieces_staging);
  std::copy(plan.send.begin(), plan.send.end(), host);
  std::copy(plan.recv.begin(), plan.recv.end(), host + sent);
  std::copy(plan.marked.begin(), plan.marked.end(), host + sent + plan.recv.size());
  upload_staging_copy(sp.pieces_staging, sp.pieces, pieces * sizeof(llmc::RowPiece), stream);
  pack_row_pieces(sp.send, grads, sp.pieces, (int)sent, stream);
}

// -os 1, once the pieces have arrived in sp.recv: each peer's added into grads in rank order, then
// the rows of this process's runs that any process marked divided by the process count (NCCL's
// average on two processes, bit for bit; the others are zeros on every process).
void sparse_rows_merge(SparseRows& sp, const llmc::SparsePlan& plan, floatX* grads, int world, cudaStream_t stream) {
  const llmc::RowPiece* received = sp.pieces + plan.send.size();
  for (int p = 0; p < world; p++) {
    const size_t first = plan.recv_first_piece[p], count = plan.recv_first_piece[p + 1] - first;
    add_row_pieces(grads, sp.recv, received + first, (int)count, stream);
  }
  scale_row_pieces(grads, received + plan.recv.size(), (int)plan.marked.size(), 1.0f / world, stream);
}

// -os 1, after the backward pass on `stream`: from every process's marks, each process sends the
// pieces of its marked rows in another's runs to that one, and merges those it receives.
void sparse_rows_exchange(MultiGpu& mg, GPT2& m, cudaStream_t stream) {
  SparseRows& sp = mg.sparse;
  cudaCheck(cudaEventSynchronize(sp.all_copied));
  llmc::SparsePlan& plan = sp.plan;
  llmc::plan_sparse_rows(sp.tables, sp.layout, sp.all, sp.runs, mg.rank, mg.world, &plan);
  sparse_rows_pack(sp, plan, m.grads, stream);
  ncclCheck(ncclGroupStart());
  for (int p = 0; p < mg.world; p++) {
    if (plan.send_count[p]) {
      ncclCheck(ncclSend(sp.send + plan.send_at[p], plan.send_count[p], kNcclFloatX, p, mg.comm, stream));
    }
    if (plan.recv_count[p]) {
      ncclCheck(ncclRecv(sp.recv + plan.recv_at[p], plan.recv_count[p], kNcclFloatX, p, mg.comm, stream));
    }
  }
  ncclCheck(ncclGroupEnd());
  sparse_rows_merge(sp, plan, m.grads, mg.world, stream);
}

// Averages grads[begin, end) over the ranks on `stream` (inside an NCCL group). Only the owner of
// an element needs its average where one process steps it: with ZeRO the rank whose shard holds
// it, with -od 1 the owner of its run in mg.grad_owners; the range is cut at the owners' ends and
// each piece reduced to its owner, the rest all-reduced.
void reduce_grad_range(MultiGpu& mg, GPT2& m, size_t begin, size_t end, cudaStream_t stream) {
  auto all_reduce = [&](size_t from, size_t to) {
    ncclCheck(ncclAllReduce(m.grads + from, m.grads + from, to - from, kNcclFloatX, ncclAvg, mg.comm, stream));
  };
  auto reduce = [&](size_t from, size_t to, int owner) {
    ncclCheck(ncclReduce(m.grads + from, m.grads + from, to - from, kNcclFloatX, ncclAvg, owner, mg.comm, stream));
  };
  if (mg.zero_stage == 1) {
    while (begin < end) {
      const int owner = (int)(begin / m.shard_size);
      const size_t piece_end = std::min(end, (owner + 1) * m.shard_size);
      reduce(begin, piece_end, owner);
      begin = piece_end;
    }
    return;
  }
  const std::vector<OwnedRun>& runs = mg.grad_owners;
  auto run = std::upper_bound(runs.begin(), runs.end(), begin,
                              [](size_t at, const OwnedRun& r) { return at < r.begin + r.count; });
  for (; begin < end && run != runs.end() && run->begin < end; ++run) {
    if (run->begin > begin) all_reduce(begin, run->begin);
    begin = std::max(begin, run->begin);
    const size_t piece_end = std::min(end, run->begin + run->count);
    reduce(begin, piece_end, run->owner);
    begin = piece_end;
  }
  if (begin < end) all_reduce(begin, end);
}

// reduce_grad_range but for the tables that -os 1 reduces by rows (sparse_rows_exchange).
void reduce_grad_range_but_tables(MultiGpu& mg, GPT2& m, size_t begin, size_t end, cudaStream_t stream) {
  for (const llmc::SparseTable& t : mg.sparse.tables) {
    if (t.begin > begin) reduce_grad_range(mg, m, begin, std::min(end, t.begin), stream);
    begin = std::max(begin, t.begin + (size_t)t.rows * t.width);
  }
  if (begin < end) reduce_grad_range(mg, m, begin, end, stream);
}

// gpt2_backward's grads_final for the last micro step (null when there is nothing to overlap):
// enqueues the reduction of a layer's gradient slices (layer -1: wte, wpe, lnf) on the
// reduction stream once the model's stream has written them.
std::function<void(int)> multi_gpu_overlapped_reduction(MultiGpu& mg, GPT2& m) {
  if (mg.world == 1 || !mg.overlap) return nullptr;
  return [&mg, &m](int layer) {
    cudaCheck(cudaEventRecord(mg.grads_ready, m.stream));
    cudaCheck(cudaStreamWaitEvent(mg.reduce_stream, mg.grads_ready, 0));
    ncclCheck(ncclGroupStart());
    for (int i = 0; i < llmc::kNumParamTensors; i++) {
      const llmc::ParamSpec& spec = m.param_specs[i];
      if (spec.per_layer() != (layer >= 0) || llmc::param_slab(m.plan, spec, std::max(layer, 0)) < 0) continue;
      const size_t begin = m.grad(i, std::max(layer, 0)) - m.grads;
      const size_t count = llmc::param_slab_size(m.plan, spec);
      reduce_grad_range(mg, m, begin, begin + count, mg.reduce_stream);
    }
    ncclCheck(ncclGroupEnd());
  };
}

// After the backward pass: the gradients the optimizer reads (the shard with ZeRO) are the
// averages over the ranks, ordered before anything later on the model's stream.
void multi_gpu_reduce_grads(MultiGpu& mg, GPT2& m) {
  if (mg.world == 1) return;
  if (mg.overlap) {
    cudaCheck(cudaEventRecord(mg.reduce_done, mg.reduce_stream));
    cudaCheck(cudaStreamWaitEvent(m.stream, mg.reduce_done, 0));
  } else if (mg.zero_stage == 1) {
    ncclCheck(ncclReduceScatter(m.grads, m.grads + m.shard_offset, m.shard_size, kNcclFloatX,
                                ncclAvg, mg.comm, m.stream));
  } else if (!mg.grad_owners.empty()) {
    ncclCheck(ncclGroupStart());
    reduce_grad_range_but_tables(mg, m, 0, m.num_params, m.stream);
    ncclCheck(ncclGroupEnd());
    if (!mg.sparse.tables.empty()) sparse_rows_exchange(mg, m, m.stream);
  } else {
    ncclCheck(ncclAllReduce(m.grads, m.grads, m.num_params, kNcclFloatX, ncclAvg, mg.comm, m.stream));
  }
}

// The norm of the whole averaged gradient: with ZeRO the shards' sums of squares are added; with
// -od 1 those of the runs each process counts (multi_gpu_divided_setup).
float multi_gpu_grad_norm(MultiGpu& mg, GPT2& m) {
  auto sum_over_ranks = [&](float* sum) {
    ncclCheck(ncclAllReduce(sum, sum, 1, ncclFloat32, ncclSum, mg.comm, m.stream));
  };
  if (mg.norm_runs) return gpt2_runs_grad_norm(m, mg.norm_runs, mg.norm_run_count, sum_over_ranks);
  if (mg.world == 1 || mg.zero_stage == 0) return gpt2_grad_norm(m);
  return gpt2_grad_norm(m, sum_over_ranks);
}

// -od 1: the gradient's runs that one process steps (Muon's matrices of each process's shares;
// its part of each divided AdamW tensor where AdamW steps at every step, since kept gradients (-ao)
// are added to after their average) are reduced to their owner alone, after the backward pass or
// (-ov 1) during it. The norm adds, over the processes, the squares of each one's runs, and rank
// 0's of the rest, which every process holds averaged.
void multi_gpu_divided_setup(MultiGpu& mg, GPT2& m, const llmc::OptimizerTable& opt) {
  if (!mg.divided) return;
  std::vector<OwnedRun> runs;
  if (opt.muon()) {
    if (m.muon_groups.empty()) gpt2_muon_groups(m, opt.muon_tensor_lr);
    append_muon_runs(m, mg.world, &runs);
  }
  for (int i = 0; i < llmc::kNumParamTensors && opt.adam_every == 1; i++) {
    if (m.state_layout.owner[i] == StateOwner::kAdamW) append_adamw_runs(m.state_layout, i, mg.world, &runs);
  }
  std::sort(runs.begin(), runs.end(), [](const OwnedRun& a, const OwnedRun& b) { return a.begin < b.begin; });
  mg.grad_owners.clear();
  for (const OwnedRun& run : runs) append_run(&mg.grad_owners, run.begin, run.count, run.owner);
  std::vector<size_t> counted;
  size_t at = 0;
  for (const OwnedRun& run : mg.grad_owners) {
    if (mg.rank == 0 && run.begin > at) counted.insert(counted.end(), {at, run.begin - at});
    if (run.owner == mg.rank) counted.insert(counted.end(), {run.begin, run.count});
    at = run.begin + run.count;
  }
  if (mg.rank == 0 && at < m.num_params) counted.insert(counted.end(), {at, m.num_params - at});
  mg.norm_run_count = (int)counted.size() / 2;
  device_free(mg.norm_runs);
  mg.norm_runs = device_alloc<size_t>(std::max<size_t>(counted.size(), 2), "the gradient norm's runs");
  cudaCheck(cudaMemcpy(mg.norm_runs, counted.data(), counted.size() * sizeof(size_t), cudaMemcpyHostToDevice));
}

// ZeRO: every rank takes the shards the others just updated. On the model's stream, so it runs
// after this rank's optimizer kernels and before the next forward pass.
void multi_gpu_gather_params(MultiGpu& mg, GPT2& m) {
  if (mg.world == 1 || mg.zero_stage == 0) return;
  ncclCheck(ncclAllGather(m.params + m.shard_offset, m.params, m.shard_size, kNcclFloatX, mg.comm,
                          m.stream));
}

// -od 1 with -oc 1: every process's parameter buffer (its own allocation, m.params) mapped into the
// others through CUDA IPC, the handles all-gathered. Processes of one node only: a GPU of another
// cannot be mapped, and that process stops with one line naming -oc.
void multi_gpu_map_peer_params(MultiGpu& mg, GPT2& m) {
  if (!mg.copy_engines || !mg.peer_params.empty()) return;
  cudaIpcMemHandle_t own;
  cudaCheck(cudaIpcGetMemHandle(&own, m.params));
  const size_t bytes = sizeof(own);
  char* handles = device_alloc<char>(bytes * mg.world, "the parameters' IPC handles");
  cudaCheck(cudaMemcpy(handles + bytes * mg.rank, &own, bytes, cudaMemcpyHostToDevice));
  ncclCheck(ncclAllGather(handles + bytes * mg.rank, handles, bytes, ncclChar, mg.comm, m.stream));
  std::vector<cudaIpcMemHandle_t> all(mg.world);
  cudaCheck(cudaMemcpyAsync(all.data(), handles, bytes * mg.world, cudaMemcpyDeviceToHost, m.stream));
  cudaCheck(cudaStreamSynchronize(m.stream));
  device_free(handles);
  mg.copy_barrier = device_alloc<float>(1, "the copies' barrier");
  cudaCheck(cudaMemset(mg.copy_barrier, 0, sizeof(float)));
  mg.peer_params.assign(mg.world, nullptr);
  for (int r = 0; r < mg.world; r++) {
    if (r == mg.rank) continue;
    void* peer = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&peer, all[r], cudaIpcMemLazyEnablePeerAccess);
    REQUIRE(err == cudaSuccess, "-oc 1: rank %d cannot map rank %d's parameters (%s): the copy engines copy "
            "between the GPUs of one node; give -oc 0", mg.rank, r, cudaGetErrorString(err));
    mg.peer_params[r] = (floatX*)peer;
  }
  if (mg.copy_engines != 2) return;
  cudaCheck(cudaStreamCreateWithFlags(&mg.copy_stream, cudaStreamNonBlocking));
  cudaCheck(cudaEventCreateWithFlags(&mg.copies_start, cudaEventDisableTiming));
  mg.copied.resize(m.config.num_layers + 1);
  for (cudaEvent_t& e : mg.copied) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

// -od 1 with -oc 1 or 2: a one-value all-reduce on stream, which no process leaves before every one has
// reached it there, after its own runs' update: from then on the others' runs may be read.
void copies_barrier(MultiGpu& mg, cudaStream_t stream) {
  ncclCheck(ncclAllReduce(mg.copy_barrier, mg.copy_barrier, 1, ncclFloat32, ncclSum, mg.comm, stream));
}

// Each run of the parameters that another process stepped copied from its buffer (cudaMemcpyAsync
// between the GPUs: the copy engines, no SM taken) into this one's, the same bits a broadcast gives.
void copy_runs_from_owners(MultiGpu& mg, floatX* params, const std::vector<OwnedRun>& runs, cudaStream_t stream) {
  for (const OwnedRun& run : runs) {
    if (run.owner == mg.rank) continue;
    cudaCheck(cudaMemcpyAsync(params + run.begin, mg.peer_params[run.owner] + run.begin, run.count * sizeof(floatX),
                              cudaMemcpyDeviceToDevice, stream));
  }
}

// -od 1: each run of `array` (elements of element_bytes) broadcast from its owner, in place.
void broadcast_runs(MultiGpu& mg, void* array, ncclDataType_t type, size_t element_bytes,
                    const std::vector<OwnedRun>& runs, cudaStream_t stream) {
  ncclCheck(ncclGroupStart());
  for (const OwnedRun& run : runs) {
    void* first = (char*)array + run.begin * element_bytes;
    ncclCheck(ncclBroadcast(first, first, run.count, type, run.owner, mg.comm, stream));
  }
  ncclCheck(ncclGroupEnd());
}

// Muon (gpt2_muon_update): each rank broadcasts the updates it orthogonalised, its share of a
// group's slots, in place. Broadcasts copy, so every rank gets the owner's bits. With ZeRO-1 the
// ranks first gather the Nesterov inputs of their shards, in the gradient buffer, as the
// parameters are gathered.
OptimizerSpread multi_gpu_optimizer_spread(MultiGpu& mg) {
  OptimizerSpread spread;
  spread.rank = mg.rank;
  spread.world = mg.world;
  spread.gather = [&mg](__nv_bfloat16* x, size_t matrix_elements, int count, cudaStream_t stream) {
    ncclCheck(ncclGroupStart());
    for (int owner = 0; owner < mg.world; owner++) {
      const MuonShare share = muon_share(count, owner, mg.world);
      if (share.end == share.begin) continue;
      __nv_bfloat16* first = x + (size_t)share.begin * matrix_elements;
      ncclCheck(ncclBroadcast(first, first, (size_t)(share.end - share.begin) * matrix_elements, ncclBfloat16,
                              owner, mg.comm, stream));
    }
    ncclCheck(ncclGroupEnd());
  };
  if (mg.zero_stage == 1) {
    spread.gather_shards = [&mg](floatX* buffer, size_t shard_size, cudaStream_t stream) {
      ncclCheck(ncclAllGather(buffer + mg.rank * shard_size, buffer, shard_size, kNcclFloatX, mg.comm,
                              stream));
    };
  }
  spread.divided = mg.divided;
  // params is the model's buffer, m.params, as a peer's mapping is (multi_gpu_map_peer_params).
  spread.share_params = [&mg](floatX* params, const std::vector<OwnedRun>& runs, cudaStream_t stream, bool beside) {
    auto share = [&](cudaStream_t on) {
      if (mg.copy_engines) {
        copies_barrier(mg, on);
        copy_runs_from_owners(mg, params, runs, on);
      } else {
        broadcast_runs(mg, params, kNcclFloatX, sizeof(floatX), runs, on);
      }
    };
    if (beside) {
      cudaCheck(cudaEventRecord(mg.params_stepped, stream));
      cudaCheck(cudaStreamWaitEvent(mg.reduce_stream, mg.params_stepped, 0));
      share(mg.reduce_stream);
      cudaCheck(cudaEventRecord(mg.params_shared, mg.reduce_stream));
      return;
    }
    cudaCheck(cudaStreamWaitEvent(stream, mg.params_shared, 0));
    share(stream);
  };
  if (mg.copy_engines == 2) {
    spread.share_behind = [&mg](floatX* params, const std::vector<std::vector<OwnedRun>>& parts,
                                cudaStream_t stream) {
      cudaCheck(cudaStreamWaitEvent(stream, mg.params_shared, 0));
      copies_barrier(mg, stream);
      cudaCheck(cudaEventRecord(mg.copies_start, stream));
      cudaCheck(cudaStreamWaitEvent(mg.copy_stream, mg.copies_start, 0));
      REQUIRE(parts.size() == mg.copied.size(), "-oc 2: %zu parts of runs for %zu events", parts.size(),
              mg.copied.size());
      for (size_t p = 0; p < parts.size(); p++) {
        copy_runs_from_owners(mg, params, parts[p], mg.copy_stream);
        cudaCheck(cudaEventRecord(mg.copied[p], mg.copy_stream));
      }
      return &mg.copied;
    };
  }
  return spread;
}

// -od 1, before a checkpoint copies the optimizer state: every process takes from each run's owner
// its AdamW moments, Muon momentum, NorMuon's second moments and master weights, so that every
// state file holds the whole run's state, as without -od.
void multi_gpu_share_state(MultiGpu& mg, GPT2& m) {
  if (!mg.divided) return;
  const StateLayout& layout = m.state_layout;
  const OptimizerArrays& a = m.state;
  std::vector<OwnedRun> params, adamw, muon;
  for (int i = 0; i < layout.count; i++) {
    if (layout.owner[i] != StateOwner::kAdamW) continue;
    append_adamw_runs(layout, i, mg.world, &params);
    append_adamw_runs(layout, i, mg.world, &adamw, true);
  }
  if (m.muon) {
    append_muon_runs(m, mg.world, &params);
    append_muon_runs(m, mg.world, &muon, true);
  }
  for (OwnedRun& run : params) run.begin -= m.shard_offset;  // the master weights' positions
  for (float* array : {a.adam_m, a.adam_v}) broadcast_runs(mg, array, ncclFloat32, sizeof(float), adamw, m.stream);
  for (float* array : {a.momentum, a.second_moments}) {
    if (array) broadcast_runs(mg, array, ncclFloat32, sizeof(float), muon, m.stream);
  }
  if (a.master) broadcast_runs(mg, a.master, ncclFloat32, sizeof(float), params, m.stream);
}

// Delayed FP8 scaling at the end of a step (gpt2_fp8_end_step), with each amax the maximum over
// the ranks. The scales are reduced whole as unsigned words (a few KB): the amax bits of
// non-negative floats order as the floats do, emax is the same on every rank, and s and 1/s,
// which can differ after the first step's current scaling, are set anew from the history by
// gpt2_fp8_end_step right after.
void multi_gpu_fp8_end_step(MultiGpu& mg, GPT2& m, bool applied) {
  if (!m.fp8_delayed) return;
  if (mg.world > 1) {
    const size_t words = (size_t)m.fp8_act_scale_count() * sizeof(Fp8Scale) / sizeof(uint32_t);
    ncclCheck(ncclAllReduce(m.fp8_act_scales, m.fp8_act_scales, words, ncclUint32, ncclMax, mg.comm,
                            m.stream));
  }
  gpt2_fp8_end_step(m, applied);
}

// Sums n doubles over the ranks, in place (n <= kMultiGpuScratch).
void multi_gpu_sum(MultiGpu& mg, double* values, int n, cudaStream_t stream) {
  if (mg.world == 1) return;
  REQUIRE(n <= kMultiGpuScratch, "multi_gpu_sum: %d values, at most %d", n, kMultiGpuScratch);
  cudaCheck(cudaMemcpyAsync(mg.scratch, values, n * sizeof(double), cudaMemcpyHostToDevice, stream));
  ncclCheck(ncclAllReduce(mg.scratch, mg.scratch, n, ncclFloat64, ncclSum, mg.comm, stream));
  cudaCheck(cudaMemcpyAsync(values, mg.scratch, n * sizeof(double), cudaMemcpyDeviceToHost, stream));
  cudaCheck(cudaStreamSynchronize(stream));
}

float multi_gpu_average(MultiGpu& mg, float value, cudaStream_t stream) {
  double sum = value;
  multi_gpu_sum(mg, &sum, 1, stream);
  return (float)(sum / mg.world);
}

// ============================================================================
// 14. Command line and main
// ============================================================================

// Dense BF16 peak of an H100/H200 SXM, the denominator of MFU (SPEC.md).
constexpr double kPeakFlops = 989e12;

// The keys a query of a T-token sequence attends to on average under layer l's mask, where one
// document spans the sequence (more documents hide more): T/2 causal; with documents, query block i
// sees min(i + 1, N) blocks of layer l's window of N (every block without one), the last half. A
// window of 0 (the short layers' half of 1) still sees the query's own block. A window in tokens
// (-awt 1) of w: query t sees min(t + 1, w + 1) keys.
double attention_mean_keys(const GPT2& m, int l, int T) {
  if (!m.documents) return T / 2.0;
  if (m.window_unit == llmc::WindowUnit::kTokens && m.windows.long_blocks != 0) {
    // The sum over t of min(t + 1, R), R = min(T, w + 1), in integers (train_gpt2.py's bits).
    const long reach = std::min<long>(T, (long)layer_window(m, l, T) * llmc::kAttentionBlock + 1);
    return (double)(reach * (reach + 1) / 2 + (T - reach) * reach) / T;
  }
  const int blocks = T / llmc::kAttentionBlock, window = std::max(1, layer_window(m, l, T));
  double sum = 0.0;
  for (int i = 0; i < blocks; i++) sum += (std::min(i + 1, window) - 0.5) * llmc::kAttentionBlock;
  return sum / blocks;
}

// 6 FLOPs a token for each parameter of a product (an embedding not tied to the head, and the
// speedrun's value embeddings and bigram table, are lookups), and 12 C for each key a query attends
// to in each layer with attention (causal: llm.c's 6 L C T); with a window, those of the current
// step's. A layer with paired heads: those of its 2T positions, each of C/2 (two a token).
double flops_per_token(const GPT2& m, int T) {
  const llmc::GPT2Config& c = m.config;
  double lookups = (double)m.param_specs[llmc::kVe].size + (double)m.param_specs[llmc::kBigram].size;
  if (!m.arch().tied_head) lookups += (double)m.param_specs[llmc::kWte].size;
  double keys = 0.0;
  for (int l = 0; l < c.num_layers; l++) {
    if (m.plan[l].attention) keys += attention_mean_keys(m, l, m.plan[l].paired ? 2 * T : T);
  }
  return 6.0 * ((double)m.num_params - lookups) + 12.0 * c.channels * keys;
}

#ifndef TESTING

// The flags both trainers share (llmc/flags.h), and this trainer's own.
struct TrainArgs : llmc::TrainFlags {
  std::string prompt;
  std::string encoder_dir = "dev/data/gpt2";
  std::string hellaswag_path = "dev/data/hellaswag/hellaswag_val.bin";
  float temperature = 1.0f;
  int top_k = 0;
  int tf32 = 1, master_weights = 1, recompute = 0;
  int checkpoint_every = 0, keep_last = 0, keep_every = 0, resume = 0, halt_after = -1;
  int async_checkpoints = 1;
  int step_phases = 0;  // -pt: where a step's time goes (StepPhases), on one process or several
  int profiled_step = -1;  // -pk: the step inside the NVTX range "step" (a profiler's), -1 none
  int hellaswag = 0, fp8 = 0, fp8_grad_e4m3 = 0;
  float loss_z = 0.0f, norm_z = 0.0f;
  MultiGpuOptions multi_gpu;
  // -recipe fills the run's record (llmc::Recipe, this struct's base; apply_recipe): the defaults of
  // the flags its help lists (llmc::recipe_flags) and the settings that have no flag.
  const llmc::Recipe* recipe = &llmc::recipe_gpt2();
  std::vector<std::string> given;  // the flags on the command line
  llmc::OptimizerTable update;     // resolved from the record (resolve_args)
};

// The recipe's FP8 head and MLP stand only in BF16 builds (recipe_fp8_head, recipe_fp8_mlp).
void apply_recipe(TrainArgs& a, const llmc::Recipe& r) {
  a.recipe = &r;
  static_cast<llmc::Recipe&>(a) = r;
  a.fp8_head = recipe_fp8_head(r);
  a.fp8_mlp = recipe_fp8_mlp(r);
}

// -recipe's help, naming the flags a recipe sets (llmc::recipe_flags).
std::string recipe_help(const std::vector<const llmc::Flag*>& recipe_set) {
  std::string text = "gpt2 (llm.c's GPT-2), modern (modded-nanogpt's optimization-track baseline: RMSNorm, "
                     "QK-norm and rotary, ReLU^2, a soft-capped head, Muon), speedrun (its record #28: value "
                     "embeddings, U-net skips, gated heads, packed documents in a growing window) or record89 (its "
                     "record #89: record #28's with every switch of record #89 and its "
                     "AdamW rows by tensor); its values of";
  for (const llmc::Flag* flag : recipe_set) text += " " + std::string(flag->name);
  return text + " stand where the command line gives none";
}

// -recipe and -opt parse their names into what they name; train_flags gives -recipe its help.
llmc::Flag recipe_flag(TrainArgs& a) {
  return {"-recipe", "recipe", "",
          [&a](const char* text) { a.recipe = &llmc::recipe_by_name(text, "-recipe"); },
          [&a] { return std::string(a.recipe->name); }};
}

constexpr const char* kQuickStart =
    "./train_gpt2cu -e d12 -b 16 -t 256 -x 300 -v 50 -s 100 -l 6e-4 -u 20 -o log_d12   (on tiny "
    "shakespeare: bash dev/data/tinyshakespeare.sh)";

std::vector<llmc::Flag> train_flags(TrainArgs& a) {
  using llmc::float_flag;
  using llmc::int_flag;
  using llmc::text_flag;
  constexpr long kIntMax = INT32_MAX;
  llmc::LaunchFlags& launch = a.multi_gpu.launch;
  std::vector<llmc::Flag> own = {
      float_flag("-sl", "skip: loss z-score", "skip the update when the loss's rolling z-score exceeds this (0: never)", &a.loss_z, 0.0f, FLT_MAX),
      float_flag("-sg", "skip: norm z-score", "skip the update when the grad norm's rolling z-score exceeds this (0: never)", &a.norm_z, 0.0f, FLT_MAX),
      float_flag("-temp", "temperature", "sampling temperature (0: greedy)", &a.temperature, 0.0f, FLT_MAX),
      int_flag("-topk", "top-k", "sample among the k most likely tokens (0: all)", &a.top_k, 0, kIntMax),
      text_flag("-p", "prompt", "generate from this prompt text with -e's model and exit (no training)", &a.prompt),
      text_flag("-bpe", "BPE files", "directory of encoder.json and vocab.bpe, for -p", &a.encoder_dir),
      int_flag("-f", "TF32 matmuls", "1: TF32 matmuls in FP32 builds", &a.tf32, 0, 1),
      int_flag("-w", "master weights", "1: keep FP32 master weights (BF16 builds)", &a.master_weights, 0, 1),
      int_flag("-r", "recompute", "recompute level: 0 none, 1 GELU", &a.recompute, 0, 1),
      int_flag("-fp8", "FP8 linear layers", "FP8 products in the blocks' linear layers (BF16 builds, compute capability 8.9+): 1 current scaling, 2 delayed (amax history)", &a.fp8, 0, 2),
      int_flag("-fp8g", "FP8 gradient format", "with -fp8: the output gradients in 0 E5M2 (range), 1 E4M3 (precision)", &a.fp8_grad_e4m3, 0, 1),
      int_flag("-n", "checkpoint every", "checkpoint every N steps (0: only at the end, with -o)", &a.checkpoint_every, 0, kIntMax),
      int_flag("-nk", "keep checkpoints", "keep only the newest K checkpoints (0: keep all)", &a.keep_last, 0, kIntMax),
      int_flag("-nm", "also keep every", "with -nk, also keep every checkpoint whose step is a multiple of M", &a.keep_every, 0, kIntMax),
      int_flag("-ac", "async checkpoints", "write checkpoints in the background while training goes on: 1 through a snapshot on the GPU where its memory allows, 2 from pinned host memory only (0: wait)", &a.async_checkpoints, 0, 2),
      int_flag("-y", "resume", "1: resume from the newest complete checkpoint in -o", &a.resume, 0, 1),
      int_flag("-halt", "halt after step", "stop after this step's checkpoint, resumable (-1: never)", &a.halt_after, -1, kIntMax),
      int_flag("-h", "HellaSwag", "1: HellaSwag accuracy at every validation (-x 0: evaluate only)", &a.hellaswag, 0, 1),
      text_flag("-hs", "HellaSwag file", "HellaSwag eval file (made by build/hellaswag)", &a.hellaswag_path),
      int_flag("-pr", "rank (by hand)", "this process's rank, when launched by hand without mpirun or srun", &launch.rank, 0, kIntMax),
      int_flag("-pn", "processes (by hand)", "process count, when launched by hand (with -pr, -rv and -rt)", &launch.world, 1, kIntMax),
      int_flag("-pl", "GPU on node (by hand)", "GPU of this process on its node, by hand (-1: the rank)", &launch.local_rank, 0, kIntMax),
      text_flag("-rv", "rendezvous", "rendezvous without mpirun: fs:DIR (shared directory) or tcp:HOST:PORT (rank 0's)", &launch.rendezvous),
      text_flag("-rt", "run token", "run token, the same for all processes and new for every launch (Slurm: job.step.restarts)", &launch.token),
      int_flag("-ct", "no-progress timeout (s)", "seconds without progress (a peer died or hangs) before a process exits", &a.multi_gpu.timeout_s, 1, kIntMax),
      int_flag("-ov", "overlapped reduction", "1: reduce each layer's gradients while the backward pass continues", &a.multi_gpu.overlap, 0, 1),
      int_flag("-oc", "copy-engine sharing", "1: with -od 1, each process copies the parameters the others stepped "
               "from their GPUs by the copy engines (CUDA IPC, processes of one node), not by NCCL's broadcast; 2: "
               "as 1, Muon's matrices copied behind the next forward pass, each layer's before its block",
               &a.multi_gpu.copy_engines, 0, 2),
      int_flag("-os", "sparse embedding rows", "1: with -od 1, each process sends the owners of the embedding tables' "
               "parts (an untied embedding, the value embeddings, the bigram table) only the rows its step's tokens "
               "read, not whole parts", &a.multi_gpu.sparse_rows, 0, 1),
      int_flag("-pt", "step phases", "1: print at the end where a step's time went, phase by phase (micro steps, "
               "gradient reduction, loss and norm, AdamW, Muon, parameter gather, the rest; means over the timed "
               "steps, a line for each rank) and the host's time between steps", &a.step_phases, 0, 1),
      int_flag("-pk", "profiled step", "step N (from 0) inside an NVTX range 'step', which ncu --nvtx --nvtx-include "
               "\"step/\" profiles alone (scripts/profile_kernels.sh --step N); -1: none", &a.profiled_step, -1,
               kIntMax),
      recipe_flag(a),
  };
  const std::vector<llmc::Flag> record = llmc::record_flags(a);  // those -recipe sets, after it
  own.insert(own.end(), record.begin(), record.end());
  std::vector<llmc::Flag> flags = llmc::train_flags(a, own);
  // What -l scales is the recipe's: one rate, or the roles' rates. The flags a recipe sets are the
  // same for every TrainArgs.
  static const std::string recipe_set_help = recipe_help(llmc::recipe_flags(a, flags));
  for (llmc::Flag& f : flags) {
    if (std::string(f.name) == "-l") f.help = a.recipe->lr_help;
    if (std::string(f.name) == "-recipe") f.help = recipe_set_help.c_str();
  }
  return flags;
}

// -os 1 reduces each step's rows of the tables that token lookups alone fill, with -od 1's owners.
void check_sparse_rows(const TrainArgs& a) {
  if (!a.multi_gpu.sparse_rows) return;
  REQUIRE(a.divided_optimizers, "-os 1 sends the embedding tables' rows to the processes that step them (-od 1): "
          "give -od 1 with it (and -zs 0), or -os 0");
  REQUIRE(!a.multi_gpu.overlap, "-os 1 sends the embedding tables' rows after the backward pass, and -ov 1 reduces "
          "during it: give -ov 0 with -os 1");
  REQUIRE(a.adam_every == 1, "-os 1 reduces each step's rows, and -ao %d keeps AdamW's gradients between its updates: "
          "give -os 0", a.adam_every);
  const llmc::ArchSpec arch = llmc::arch_spec(a.recipe->arch);
  REQUIRE(!arch.tied_head || arch.value_mix || arch.bigram, "-os 1: -recipe %s's embedding is the head too, whose "
          "gradient fills every row, and it has no other table: give -os 0", a.recipe->name);
}

// The checks that involve several flags, or a flag and this build; each flag's own range is
// checked as it is parsed. A flag that would do nothing without another fails rather than being
// ignored.
void validate_args(const TrainArgs& a) {
  REQUIRE(a.resume == 0 || !a.output_dir.empty(), "-y 1 needs -o DIR, the directory of the checkpoints");
  REQUIRE(a.halt_after < 0 || !a.output_dir.empty(), "-halt needs -o DIR to write the checkpoint to");
  REQUIRE(a.halt_after != 0,
          "-halt 0: step 0 writes no checkpoint to continue from; give -halt 1 or later (-1: never)");
  REQUIRE(a.checkpoint_every == 0 || !a.output_dir.empty(), "-n needs -o DIR to write the checkpoints to");
  REQUIRE(a.keep_last == 0 || !a.output_dir.empty(), "-nk needs -o DIR, the directory of the checkpoints");
  REQUIRE(a.keep_every == 0 || !a.output_dir.empty(), "-nm needs -o DIR, the directory of the checkpoints");
  REQUIRE(a.keep_every == 0 || a.keep_last > 0,
          "-nm %d keeps checkpoints that -nk would delete: give -nk with it (without -nk all are kept)",
          a.keep_every);
  REQUIRE(!a.fp8 || sizeof(floatX) == 2,
          "-fp8 %d needs the BF16 build (make train_gpt2cu); this is the %s build: use -fp8 0", a.fp8,
          PRECISION_NAME);
  REQUIRE(!a.fp8_grad_e4m3 || a.fp8, "-fp8g 1 sets the FP8 gradients' format: give -fp8 1 or 2 with it");
  REQUIRE(!a.divided_optimizers || a.zero_stage == 0, "-od 1 divides the optimizers' work of a run without ZeRO, "
          "and -zs 1 shards it already: give -zs 0 with -od 1, or -od 0");
  REQUIRE(!a.multi_gpu.copy_engines || a.divided_optimizers, "-oc %d copies the parameters that -od 1's processes "
          "step: give -od 1 with it (and -zs 0), or -oc 0", a.multi_gpu.copy_engines);
  check_sparse_rows(a);
  REQUIRE(!a.fp8_head || sizeof(floatX) == 2,
          "-fh 1 needs the BF16 build (make train_gpt2cu); this is the %s build: use -fh 0", PRECISION_NAME);
  REQUIRE(!a.fp8_mlp || sizeof(floatX) == 2,
          "-fm 1 needs the BF16 build (make train_gpt2cu); this is the %s build: use -fm 0", PRECISION_NAME);
  REQUIRE(!a.fp8_mlp || fp8_mlp_support(llmc::arch_spec(a.recipe->arch)),
          "-fm 1: record #89's FP8 MLP is a ReLU^2 MLP without biases, and -recipe %s's is not: use -fm 0",
          a.recipe->name);
  const bool fm_given = std::count(a.given.begin(), a.given.end(), "-fm") > 0;
  REQUIRE(!fm_given || !a.fp8_mlp || a.mlp_from_output, "-fm 1: the FP8 forward keeps ReLU^2's output alone, which the "
          "backward reads: give -mr 1 with it, or -fm 0");
  REQUIRE(!a.fp8_head || fp8_head_support(llmc::arch_spec(a.recipe->arch)),
          "-fh 1: the FP8 head's fixed scales are the speedrun's (an untied head without bias after a weightless "
          "RMS norm); -recipe %s's head runs in BF16: use -fh 0 or -recipe speedrun", a.recipe->name);
  const bool fhs_given = std::count(a.given.begin(), a.given.end(), "-fhs") > 0;
  REQUIRE(!fhs_given || fp8_head_support(llmc::arch_spec(a.recipe->arch)),
          "-fhs sets the FP8 head's scales, and -recipe %s's head has no FP8 form: drop -fhs or use -recipe speedrun",
          a.recipe->name);
  const bool ns_given = std::count(a.given.begin(), a.given.end(), "-ns") > 0;
  REQUIRE(!ns_given || a.optimizer == llmc::OptimizerKind::kMuon,
          "-ns %s sets Muon's orthogonalisation, which -opt %s does not use: add -opt muon or drop -ns",
          a.muon_newton_schulz.name, llmc::optimizer_name(a.optimizer));
  const bool muon = a.optimizer == llmc::OptimizerKind::kMuon;
  REQUIRE(!a.cautious_decay || a.weight_decay > 0.0f || (muon && a.muon_weight_decay > 0.0f),
          "-cd 1 makes the weight decay cautious, and this run decays nothing (-c 0%s): give -c%s a decay, or drop -cd",
          muon ? ", -mw 0" : "", muon ? " or -mw" : "");
  REQUIRE(!a.normuon || muon, "-mn 1 normalises Muon's update, and -opt %s has no Muon: give -opt muon with it, or "
          "drop -mn", llmc::optimizer_name(a.optimizer));
  REQUIRE(!a.muon_high_bits || muon, "-mk 1 sets how Muon stores its BF16 weights, and -opt %s has no Muon: give "
          "-opt muon with it, or -mk 0", llmc::optimizer_name(a.optimizer));
  REQUIRE(!a.muon_high_bits || a.master_weights || sizeof(floatX) == sizeof(float), "-mk 1 keeps Muon's BF16 weights "
          "as the high 16 bits of their FP32 master weights, and -w 0 keeps none: give -w 1 with it, or -mk 0");
  REQUIRE(a.adam_every == 1 || a.grad_clip <= 0.0f, "-ao %d sums %d steps' gradients for AdamW, and -gc %g would "
          "clip each step's apart: give -gc 0 with it (record #89 clips nothing)", a.adam_every, a.adam_every,
          a.grad_clip);
  REQUIRE(a.untie_step < 0 || (a.untie_step + 1) % a.adam_every == 0, "-ut %d unties at a step without AdamW's "
          "update under -ao %d: give an untie step U with (U + 1) %% %d == 0 (record #89's is odd)", a.untie_step,
          a.adam_every, a.adam_every);
  REQUIRE(!a.smear || a.recipe->arch == llmc::Arch::kSpeedrun, "-sm 1 smears the speedrun's embedding, and "
          "-recipe %s is not the speedrun: give -recipe speedrun with it, or drop -sm", a.recipe->name);
  REQUIRE(!a.bigram || a.recipe->arch == llmc::Arch::kSpeedrun, "-bg 1 gives the speedrun a bigram embedding, and "
          "-recipe %s is not the speedrun: give -recipe speedrun with it, or drop -bg", a.recipe->name);
  REQUIRE(!a.rotary_pairs || llmc::arch_spec(a.recipe->arch).qk_norm_rotary, "-rp 1 lays out the rotary's pairs, "
          "and -recipe %s has no rotary: give -recipe modern or speedrun with it, or drop -rp", a.recipe->name);
  REQUIRE(a.record_init == llmc::SpeedrunInit::kRecord28 || a.recipe->arch == llmc::Arch::kSpeedrun, "-ri %d is "
          "the speedrun's init, and -recipe %s is not the speedrun: give -recipe speedrun with it, or drop -ri",
          (int)a.record_init, a.recipe->name);
  // A recipe's init (-recipe record89's) stands for the models it makes from a preset alone.
  const bool ri_given = std::count(a.given.begin(), a.given.end(), "-ri") > 0;
  llmc::GPT2Config preset;
  REQUIRE(!ri_given || a.record_init == llmc::SpeedrunInit::kRecord28 ||
              llmc::config_from_preset(a.model, &preset, a.recipe->arch),
          "-ri %d initialises a preset's model from the seed, and -e %s is a model file, which holds the parameters: "
          "drop -ri", (int)a.record_init, a.model.c_str());
  REQUIRE(!a.ve_gates || a.recipe->arch == llmc::Arch::kSpeedrun, "-vg 1 gates the speedrun's value embeddings, "
          "and -recipe %s is not the speedrun: give -recipe speedrun with it, or drop -vg", a.recipe->name);
  REQUIRE(!a.resid_lambdas || a.recipe->arch == llmc::Arch::kSpeedrun, "-rl 1 scales the speedrun's residual adds, "
          "and -recipe %s is not the speedrun: give -recipe speedrun with it, or drop -rl", a.recipe->name);
  REQUIRE(!a.xsa || a.recipe->arch == llmc::Arch::kSpeedrun, "-xs 1 gives the speedrun's attention XSA, and "
          "-recipe %s is not the speedrun: give -recipe speedrun with it, or drop -xs", a.recipe->name);
  REQUIRE(!a.record89_plan || a.recipe->arch == llmc::Arch::kSpeedrun, "-lp 1 lays out the speedrun's layers as "
          "record #89's, and -recipe %s is not the speedrun: give -recipe speedrun with it, or drop -lp",
          a.recipe->name);
  REQUIRE(!a.attn_lambdas || a.recipe->arch == llmc::Arch::kSpeedrun, "-al 1 scales the speedrun's attention "
          "weights, and -recipe %s is not the speedrun: give -recipe speedrun with it, or drop -al", a.recipe->name);
  REQUIRE(!a.attn_lambdas || a.fp8 == 0, "-al 1 scales the attention's weights, which -fp8 %d casts to FP8 unscaled "
          "(record #89's FP8 is the MLP's alone): give -fp8 0 with it, or drop -al", a.fp8);
  REQUIRE(!a.attn_lambdas || a.adam_every == 1 || muon, "-al 1 turns the attention weights' gradients into the "
          "lambdas' at each step's end, and -ao %d with -opt %s keeps those gradients over steps: give -opt muon "
          "with it, or drop -al", a.adam_every, llmc::optimizer_name(a.optimizer));
  REQUIRE(!a.paired_heads || (a.record89_plan && a.rotary_pairs), "-ph 1 pairs the heads of record #89's plan's "
          "layers, rotated in its rotary pairs: give -lp 1 and -rp 1 with it (and -recipe speedrun), or drop -ph");
  REQUIRE(!a.mudd_gates || a.record89_plan, "-mg 1 generates the gates of record #89's plan: give -lp 1 with it "
          "(and -recipe speedrun), or drop -mg");
  REQUIRE(!a.composed_attention || a.mudd_gates, "-ca 1 reads its weights from the MUDD gate generators: give -mg 1 "
          "with it (and -lp 1, -recipe speedrun), or drop -ca");
  REQUIRE(!a.mudd_connections || a.mudd_gates, "-md 1 runs on the MUDD gate generators' rows here: give -mg 1 with "
          "it (and -lp 1, -recipe speedrun), or drop -md");

  REQUIRE(!a.muon_qk_heads || muon, "-mq %d splits Muon's Q and K matrices, and -opt %s has no Muon: give -opt muon "
          "with it, or drop -mq", a.muon_qk_heads, llmc::optimizer_name(a.optimizer));
  llmc::adam_rows_check(a, "-ar");
  const bool kd_given = std::count(a.given.begin(), a.given.end(), "-kd") > 0;
  REQUIRE(!kd_given || a.decay_fraction == 0.0f || a.schedule == "wsd",
          "-kd %g is the decay of -k wsd: give -k wsd with it", a.decay_fraction);
  const bool kc_given = std::count(a.given.begin(), a.given.end(), "-kc") > 0;
  REQUIRE(!kc_given || a.cooldown_fraction == 0.0 || a.schedule == "cooldown",
          "-kc %g is the cooldown of -k cooldown: give -k cooldown with it", a.cooldown_fraction);
  const long cooldown = a.muon_momentum.cooldown_steps;
  REQUIRE(cooldown == 0 || a.optimizer == llmc::OptimizerKind::kMuon,
          "-mc %ld cools Muon's momentum, and -opt %s has no Muon: give -opt muon with it, or leave -mc out", cooldown,
          llmc::optimizer_name(a.optimizer));
  REQUIRE(cooldown == 0 || a.max_steps >= 0, "-mc %ld counts back from the run's last step: give -x", cooldown);
  const llmc::PredictionWeights& w = a.next_token_weights;
  REQUIRE(a.prefix_weight > 0.0f || std::any_of(w.weight, w.weight + w.count, [](float x) { return x > 0.0f; }),
          "-mtp %s and -pw 0: every term of the training loss has weight 0; give the next token a weight (-mtp 1)",
          llmc::prediction_weights_text(w).c_str());
}

// The process count of this launch as multi_gpu_init finds it (mpirun's, or -pr/-pn's and
// Slurm's through llmc/rendezvous.h), before any GPU is touched; launch flags that do not fit
// together fail here.
int launch_world(const MultiGpuOptions& options) {
  const int mpi_world = env_int("OMPI_COMM_WORLD_SIZE", 1);
  if (mpi_world > 1) return mpi_world;
  const llmc::Launch launch =
      llmc::resolve_launch(options.launch, [](const char* name) -> const char* { return getenv(name); });
  llmc::require_rendezvous(llmc::parse_rendezvous(options.launch.rendezvous), launch);
  return launch.world;
}

// Generates `length` tokens after `prompt` and prints them as they come; token_text gives the
// bytes of a token (held back by the joiner until they form whole UTF-8 characters).
void print_generation(GPT2& m, const std::vector<int>& prompt, int length, float temperature,
                      int top_k, llmc::Rng& rng, const std::function<std::string(int)>& token_text) {
  llmc::Utf8Joiner joiner;
  generate(m, prompt, length, temperature, top_k, rng, [&](int id) {
    printf("%s", joiner.push(token_text(id)).c_str());
    fflush(stdout);
  });
  printf("%s\n", joiner.finish().c_str());
}

float evaluate_validation(GPT2& m, MultiGpu& mg, llmc::DataLoader& loader, int batches, int B,
                          int T) {
  loader.reset();
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double sum = 0.0;
  const auto batches_loss = [&] {
    for (int i = 0; i < batches; i++) {
      multi_gpu_progress(mg);
      loader.next_batch(inputs.data(), targets.data());
      sum += gpt2_forward_loss(m, inputs.data(), targets.data(), B, T);
    }
  };
  if (m.forward_only.act_memory) {
    with_forward_only(m, batches_loss);
  } else {
    batches_loss();
  }
  gpt2_fp8_forget_eval_amax(m);
  return multi_gpu_average(mg, (float)(sum / batches), m.stream);
}

// HellaSwag accuracy (acc_norm) over this rank's share of the examples, summed over the ranks.
// Each example is one forward pass of its 4 rows (context + ending, padded to T).
// The set fits -b and -t (read_hellaswag).
llmc::HellaSwagCounts evaluate_hellaswag(GPT2& m, MultiGpu& mg, const llmc::HellaSwagSet& set, int T) {
  llmc::HellaSwagCounts counts;
  for (int i : llmc::hellaswag_rank_examples((int)set.examples.size(), mg.rank, mg.world)) {
    multi_gpu_progress(mg);
    const llmc::HellaSwagRows rows = llmc::hellaswag_rows(set.examples[i], T);
    gpt2_forward(m, rows.inputs.data(), llmc::kHellaSwagEndings, T);
    gpt2_classifier(m, rows.targets.data(), llmc::kHellaSwagEndings, T, 0.0f);
    counts.add(llmc::hellaswag_score(rows, m.losses_host));
  }
  gpt2_fp8_forget_eval_amax(m);
  double totals[3] = {(double)counts.examples, (double)counts.correct, (double)counts.correct_norm};
  multi_gpu_sum(mg, totals, 3, m.stream);
  counts.examples = (long long)totals[0];
  counts.correct = (long long)totals[1];
  counts.correct_norm = (long long)totals[2];
  return counts;
}

// Every flag, then what follows from them, the GPU and the launch; checkpoints: how they are
// written (checkpoint_mode).
std::string architecture_description(const llmc::ArchSpec& s, float attention_scale) {
  if (!s.rms_norm) return "GPT-2: LayerNorm, learned positions, GELU, head tied to the embedding";
  const char* rotary = s.rotary_pairs ? "record #89's rotary pairs (adjacent dims, positions over each forward's "
                                        "rows as one sequence)"
                                      : "half-truncated rotary positions";
  if (!s.x0_lambdas) {
    return llmc::strformat("%s: RMSNorm (also after the embedding), QK-norm and %s, attention scale %g, ReLU^2, a "
                           "head of its own with bias, logits %s", s.name, rotary, attention_scale,
                           s.logit_cap.describe().c_str());
  }
  return llmc::strformat("%s: RMSNorm without gains (also after the embedding), no biases, QK-norm and %s, "
                         "attention scale %g, ReLU^2, value embeddings, x0 lambdas, U-net skips and gated heads as "
                         "its layers say, a head of its own, logits %s over the padded vocabulary", s.name, rotary,
                         attention_scale, s.logit_cap.describe().c_str());
}

// -pd, -aw, -awt and -awf: the training sequences and what a token attends to.
std::string attention_description(const TrainArgs& a, const llmc::LayerPlan& plan, const llmc::StagePlan& stages) {
  if (!a.documents) return "causal, over contiguous training sequences";
  const char* documents = "within each document (token 50256 opens each) of document-aligned training "
                          "sequences, validation's contiguous";
  if (stages.max_window() == 0) return llmc::strformat("%s; every earlier token of it", documents);
  const bool one_stage = stages.stages().size() == 1;
  const llmc::WindowSetting& w = stages.stages()[0].window;
  std::string layers = " in every layer";
  bool shorts_given = false;
  for (const llmc::Stage& s : stages.stages()) shorts_given = shorts_given || s.window.short_given();
  if (plan.has_short_windows()) {
    const std::string shorts = !shorts_given ? std::string("N/2")
                               : one_stage   ? llmc::strformat("S = %d", w.short_blocks)
                                             : std::string("each stage's short window");
    layers = ", " + shorts + " in the short layers (" + plan.windows() + ")";
  }
  const bool fixed = one_stage && w.long_blocks != llmc::kWindowSchedule;
  const std::string n = fixed ? llmc::strformat("N = %d", w.long_blocks) : std::string("N");
  const std::string which = !one_stage ? ", N each stage's (the stages row)"
                            : fixed    ? ""
                                       : llmc::strformat(", N growing from 1 to %d over the steps",
                                                         llmc::run_window_blocks_max(w.long_blocks));
  const std::string final = stages.final_window() > 0
      ? llmc::strformat("; N = %d at the validation after the last step (-awf)", stages.final_window())
      : std::string();
  const char* unit = a.window_tokens ? " counted in tokens from each query (-awt 1)" : "";
  return llmc::strformat("%s; within a window of %s blocks of %d tokens%s%s%s%s", documents, n.c_str(),
                         llmc::kAttentionBlock, unit, layers.c_str(), which.c_str(), final.c_str());
}

// -fh given on the command line, not set by -recipe.
bool fp8_head_given(const TrainArgs& a) { return std::count(a.given.begin(), a.given.end(), "-fh") > 0; }

// The head's products: FP8 in the training passes (-fh 1), else the build's.
std::string head_description(const TrainArgs& a, const GPT2& m) {
  if (m.fp8_head) {
    return llmc::strformat("FP8 in training (E4M3 x and w, E5M2 gradient; fixed scales x_s = sqrt(%d)/448, "
                           "w_s = 2^-9, grad_s = 1/448), %s at evaluation", m.config.channels, PRECISION_NAME);
  }
  const bool gpu_refused = recipe_fp8_head(*a.recipe) && !fp8_head_given(a);
  return gpu_refused ? "BF16 (the recipe's FP8 head needs compute capability 8.9 or newer)" : PRECISION_NAME;
}

// The MLP's training forward where it could be FP8: -fm 1's, or the recipe's with -fm 0 or on a GPU
// without FP8 products.
std::string mlp_description(const TrainArgs& a, const GPT2& m) {
  if (m.fp8_mlp) {
    return "FP8 forward in training (E4M3; the weights' scales after each update, the input's own, ReLU^2's "
           "output's delayed: record #89's), BF16 backward and evaluation";
  }
  if (std::count(a.given.begin(), a.given.end(), "-fm") > 0) return "BF16 (-fm 0)";
  return a.mlp_from_output ? "BF16 (the recipe's FP8 MLP needs compute capability 8.9 or newer)"
                           : "BF16 (the recipe's FP8 MLP needs -mr 1)";
}

// -recipe's FP8 head (-fh not given) on a GPU without FP8 products: the head trains in BF16, and
// head_description says why.
void resolve_fp8_head(TrainArgs& a) { a.fp8_head = fp8_resolved(a.fp8_head, fp8_head_given(a)); }

// The same of -recipe record89's FP8 MLP (-fm not given), which stands with its MLP backward from
// ReLU^2's output alone (-mr 1).
void resolve_fp8_mlp(TrainArgs& a) {
  const bool given = std::count(a.given.begin(), a.given.end(), "-fm") > 0;
  a.fp8_mlp = fp8_resolved(a.fp8_mlp && (given || a.mlp_from_output), given);
}

void print_config_table(const TrainArgs& a, const GPT2& m, const MultiGpu& mg,
                        const llmc::StagePlan& stages, int train_steps, size_t train_tokens,
                        const std::string& checkpoints) {
  const cudaDeviceProp prop = current_gpu();  // multi_gpu_init set the rank's GPU
  llmc::StartupTable table;
  TrainArgs shown = a;  // the flags' table points at the settings it shows
  table.flag_rows(train_flags(shown));
  table.rule();
  table.row("device", prop.name);
  table.row("precision", PRECISION_NAME);
  table.row("processes", llmc::strformat("%d (%s)", mg.world, mg.launched_by.c_str()));
  if (mg.world > 1) {
    table.row("ZeRO stage / overlap / divided",
              llmc::strformat("%d / %d / %d", mg.zero_stage, (int)mg.overlap, (int)mg.divided));
  }
  table.row("model", m.config.describe());
  table.row("architecture", architecture_description(m.arch(), attention_scale(m)));
  table.row("layers", m.plan.describe(a.documents && stages.max_window() != 0));
  table.row("optimizers", llmc::optimizer_description(a, sizeof(floatX) == 2));
  table.row("loss", a.recipe->loss_sum ? "the sum of the token losses (its gradient)" : "the mean token loss");
  table.row("attention", attention_description(a, m.plan, stages));
  if (a.yarn) {
    table.row("YaRN", "the rotary's frequencies and the attention's scale rescaled at each change of the stage "
                      "plan's long window (record #89's)");
  }
  table.row("parameters", std::to_string(m.num_params));
  table.row("master weights", m.use_master_weights ? "FP32" : "none");
  table.row("head", head_description(a, m));
  if (m.fp8_mlp || recipe_fp8_mlp(*a.recipe)) table.row("MLP", mlp_description(a, m));
  std::string memory = llmc::strformat("%zu MiB parameters and gradients, %zu MiB optimizer state, %zu MiB "
                                       "activations and scratch", m.param_bytes >> 20, m.state_bytes >> 20,
                                       m.act_bytes >> 20);
  if (m.fp8 || m.fp8_head || m.fp8_mlp) memory += llmc::strformat(", %zu MiB FP8 state", m.fp8_bytes >> 20);
  table.row("GPU memory", memory);
  if (m.fp8) {
    table.row("FP8 formats", llmc::strformat("%s weights and activations, %s gradients",
                                             fp8_format_name(Fp8Format::kE4M3), fp8_format_name(m.fp8_grad_format)));
    table.row("FP8 scaling", m.fp8_delayed
                                 ? llmc::strformat("delayed: activations and gradients from the amaxes of the last %d steps", kFp8History)
                                 : std::string("current: each tensor's own amax"));
  }
  table.row("train tokens", std::to_string(train_tokens));
  if (stages.stages().size() == 1) {
    const llmc::StepPlan batch = stages.at(0, a.B, mg.world);
    table.row("total batch", llmc::strformat("%ld tokens = %d micro step(s) of %d x %d x %d processes",
                                             batch.tokens, batch.micro_steps, a.B, batch.T, mg.world));
  } else {
    table.row("stages", stages.describe(a.B, mg.world));
  }
  table.row("steps", std::to_string(train_steps));
  if (!a.output_dir.empty()) table.row("checkpoints", checkpoints);
  table.print();
}

// The parameters a run starts from: FP32 values of -e's checkpoint file, -e's preset initialised
// from the seed (only once a GPU is found: at d48 that takes half a minute), or -y 1's model file
// as stored (whose model must be -e's when -e names a preset).
struct StartParams {
  llmc::GPT2Config config;
  bool from_seed = false;         // -e's preset, whose values gpt2_init_start makes
  llmc::SpeedrunInit init = llmc::SpeedrunInit::kRecord28;  // -ri: which, for the speedrun
  std::vector<float> values;      // empty where stored holds them, or from the seed
  llmc::CheckpointParams stored;  // -y 1's model file
  double load_seconds = 0.0;
};

// The parameters of a checkpoint in this build's storage type, as stored; nullptr in the other.
const floatX* stored_params(const llmc::CheckpointParams& p) {
  if (sizeof(floatX) == sizeof(float)) {
    return p.version == llmc::kCheckpointVersionFP32 ? reinterpret_cast<const floatX*>(p.fp32.data()) : nullptr;
  }
  return p.version == llmc::kCheckpointVersionBF16 ? reinterpret_cast<const floatX*>(p.bf16.get()) : nullptr;
}

// A model file's header says whether it has record #89's smear, bigram embedding, rotary pairs,
// value-embedding gates, residual lambdas, XSA, plan, paired heads, attention lambdas, MUDD gates and
// composed attention; -sm, -bg, -rp, -vg, -rl, -xs, -lp, -ph, -al, -mg and -ca, where given, must agree.
void check_features_given(const TrainArgs& a, const llmc::GPT2Config& config, const std::string& path) {
  auto check = [&](const char* flag, int given, bool has, const char* what) {
    if (!std::count(a.given.begin(), a.given.end(), flag) || given == (int)has) return;
    LLMC_FAIL("%s %d, but %s holds a model %s %s: its header says so; drop %s", flag, given, path.c_str(),
              has ? "with" : "without", what, flag);
  };
  check("-sm", a.smear, config.smear, "the smear");
  check("-bg", a.bigram, config.bigram, "the bigram embedding");
  check("-rp", a.rotary_pairs, config.rotary_pairs, "record #89's rotary pairs");
  check("-vg", a.ve_gates, config.ve_gates, "the value-embedding gates");
  check("-rl", a.resid_lambdas, config.resid_lambdas, "the residual lambdas");
  check("-xs", a.xsa, config.xsa, "XSA");
  check("-lp", a.record89_plan, config.record89_plan, "record #89's plan");
  check("-ph", a.paired_heads, config.paired_heads, "record #89's paired heads");
  check("-al", a.attn_lambdas, config.attn_lambdas, "record #89's attention lambdas");
  check("-mg", a.mudd_gates, config.mudd_gates, "record #89's MUDD gate generators");
  check("-ca", a.composed_attention, config.composed_attention, "record #89's composed attention");
  check("-md", a.mudd_connections, config.mudd_connections, "record #89's MUDD dense connections");
  require_runnable_features(config, path);
}

StartParams load_start_params(const TrainArgs& a, int resume_step) {
  const double start = llmc::wall_seconds();
  StartParams p;
  if (resume_step < 0) {
    p.from_seed = llmc::config_from_preset(a.model, &p.config, a.recipe->arch);
    p.config.smear = a.smear != 0;
    p.config.bigram = a.bigram != 0;
    p.config.rotary_pairs = a.rotary_pairs != 0;
    p.init = a.record_init;
    p.config.ve_gates = a.ve_gates != 0;
    p.config.resid_lambdas = a.resid_lambdas != 0;
    p.config.xsa = a.xsa != 0;
    llmc::set_record89_plan(p.config, a.record89_plan != 0);
    p.config.paired_heads = a.paired_heads != 0;
    p.config.attn_lambdas = a.attn_lambdas != 0;
    p.config.mudd_gates = a.mudd_gates != 0;
    p.config.composed_attention = a.composed_attention != 0;
    p.config.mudd_connections = a.mudd_connections != 0;
    if (!p.from_seed) {
      llmc::require_model_file(a.model, "-y 1");
      p.config = llmc::checkpoint_load(a.model, &p.values);
      check_features_given(a, p.config, a.model);
    }
  } else {
    const std::string path = llmc::checkpoint_path(a.output_dir, "model", resume_step);
    p.stored = llmc::checkpoint_read(path);
    p.config = p.stored.config;
    llmc::GPT2Config requested;
    check_features_given(a, p.config, path);
    const bool preset = llmc::config_from_preset(a.model, &requested, a.recipe->arch);
    requested.smear = p.config.smear;  // the header's, which -sm, ..., -lp and -ph, where given, match
    requested.bigram = p.config.bigram;
    requested.rotary_pairs = p.config.rotary_pairs;
    requested.ve_gates = p.config.ve_gates;
    requested.resid_lambdas = p.config.resid_lambdas;
    requested.xsa = p.config.xsa;
    llmc::set_record89_plan(requested, p.config.record89_plan);
    requested.paired_heads = p.config.paired_heads;
    requested.attn_lambdas = p.config.attn_lambdas;
    requested.mudd_gates = p.config.mudd_gates;
    requested.composed_attention = p.config.composed_attention;
    requested.mudd_connections = p.config.mudd_connections;
    if (preset && requested != p.config) {
      LLMC_FAIL("-y 1: %s holds a model %s, but -e %s is %s: resume with the -e of that run",
                path.c_str(), p.config.describe().c_str(), a.model.c_str(), requested.describe().c_str());
    }
    // A model file of the other precision than this build writes loads as -e's file would.
    if (!stored_params(p.stored)) p.values = llmc::checkpoint_values(std::move(p.stored));
  }
  p.load_seconds = llmc::wall_seconds() - start;
  return p;
}

// gpt2_init or gpt2_init_stored from the start's parameters, which are freed on return (at d48 a
// resume's 3.1 GB, a fresh start's 6.2 GB); returns the seconds since their load began.
double gpt2_init_start(GPT2& m, StartParams start, StateSpec spec, uint64_t seed, int shard_rank,
                       int shard_count) {
  const double init_start = llmc::wall_seconds();
  if (start.from_seed) start.values = llmc::init_params_from_seed(start.config, seed, start.init);
  if (const floatX* stored = stored_params(start.stored)) {
    gpt2_init_stored(m, start.config, stored, spec, seed, shard_rank, shard_count);
  } else {
    gpt2_init(m, start.config, start.values, spec, seed, shard_rank, shard_count);
  }
  return start.load_seconds + llmc::wall_seconds() - init_start;
}

// -h 1's examples, which must fit one forward pass of -b rows of -t tokens. A missing -hs file is
// named with the script that makes the default one.
// T: the rows' length, the longest of the stage plan's (-t without one).
llmc::HellaSwagSet read_hellaswag(const TrainArgs& a, int vocab_size, int T) {
  REQUIRE(a.B >= llmc::kHellaSwagEndings, "HellaSwag evaluates %d rows at once: use -b %d or more",
          llmc::kHellaSwagEndings, llmc::kHellaSwagEndings);
  const char* path = a.hellaswag_path.c_str();
  const char* fix = "-h 1 evaluates it: bash dev/data/hellaswag.sh makes dev/data/hellaswag/hellaswag_val.bin "
                    "(-hs's default), or leave -h 1 out";
  switch (llmc::path_kind(a.hellaswag_path)) {
    case llmc::PathKind::kMissing: LLMC_FAIL("-hs %s: no such HellaSwag eval file; %s", path, fix);
    case llmc::PathKind::kDirectory: LLMC_FAIL("-hs %s is a folder, not a HellaSwag eval file; %s", path, fix);
    case llmc::PathKind::kOther: LLMC_FAIL("-hs %s is not a regular file; %s", path, fix);
    case llmc::PathKind::kFile: break;
  }
  llmc::HellaSwagSet set = llmc::hellaswag_read(a.hellaswag_path, vocab_size);
  REQUIRE(set.longest_row <= T, "HellaSwag examples take up to %d tokens: use -t %d or more%s", set.longest_row,
          set.longest_row, a.stages.empty() ? "" : " (with -sp: a stage's t of that or more)");
  return set;
}

// -i's and -j's shards as the data loaders will check them (their headers, sizes and one batch
// each, or with -pd 1 -i's one step of grad_accum micro batches of documents), and no file in both.
void check_data(const TrainArgs& a, int world, const llmc::StagePlan& stages) {
  for (const llmc::Stage& s : stages.stages()) {
    const int micro_steps = llmc::micro_steps_of(s.tokens, a.B, s.T, world, "-z");
    if (a.documents) {
      llmc::read_document_shard_headers(a.train_pattern, "-i", a.B, s.T, micro_steps, world);
    } else {
      llmc::read_shard_headers(a.train_pattern, "-i", a.B, s.T, world);
    }
  }
  if (a.val_every > 0 && a.val_batches > 0) {
    try {
      llmc::read_shard_headers(a.val_pattern, "-j", a.B, a.val_T, world);
    } catch (const llmc::Error& e) {
      if (a.val_T == a.T) throw;
      throw llmc::Error(llmc::strformat("%s (validation batches of -b %d sequences of -vt %d tokens)", e.what(),
                                        a.B, a.val_T));
    }
    llmc::require_disjoint_shards(a.train_pattern, a.val_pattern);
  }
}

// -vt 0 becomes -t. A longer validation length must fit the model, and with -pd 1 the mask's
// blocks; -fp8's buffers hold -t tokens a row, so it validates at -t.
void resolve_validation_length(TrainArgs& a, int max_seq_len) {
  if (a.val_T == 0) a.val_T = a.T;
  REQUIRE(a.val_T <= max_seq_len, "-vt %d is above the model's maximum sequence length %d: use -vt %d or less",
          a.val_T, max_seq_len, max_seq_len);
  REQUIRE(!a.documents || a.val_T % llmc::kAttentionBlock == 0, "-vt %d: attention within documents (-pd 1) "
          "takes whole blocks of %d tokens: use a multiple of %d", a.val_T, llmc::kAttentionBlock,
          llmc::kAttentionBlock);
}

// Runs a check of one stage's values, its message led by the stage (where -sp has several).
void check_stage(const llmc::StagePlan& plan, size_t i, const std::function<void()>& check) {
  try {
    check();
  } catch (const llmc::Error& e) {
    if (plan.stages().size() == 1) throw;
    const llmc::Stage& s = plan.stages()[i];
    throw llmc::Error(llmc::strformat("-sp stage %zu (t=%d z=%ld aw=%s): %s", i + 1, s.T, s.tokens,
                                      s.window.text().c_str(), e.what()));
  }
}

// -awf: the long window of the evaluations after the last step, checked as -aw is against the
// sequences it attends over (-vt's, or without validation the longest stage's t).
void resolve_final_window(llmc::StagePlan& plan, const TrainArgs& a, bool validating) {
  if (a.final_window_blocks == 0) return;
  plan.set_final_window(a.final_window_blocks, "-awf");
  const int length = validating ? a.val_T : plan.max_T(), blocks = length / llmc::kAttentionBlock;
  REQUIRE(a.final_window_blocks <= blocks, "-awf %d counts blocks of %d tokens, and %s %d is %d block%s: -awf %d "
          "already attends to all of it; use -awf %d or less", a.final_window_blocks, llmc::kAttentionBlock,
          validating ? "-vt" : "t", length, blocks, blocks == 1 ? "" : "s", blocks, blocks);
}

// -sp's stages over the resolved flags, each checked as the flags are: against the model, -pd and
// the step's batch. A length or a document cap that changes between stages needs -pd 1, whose
// loader changes its shape at a boundary without losing its place.
llmc::StagePlan resolve_stage_plan(const TrainArgs& a, const llmc::GPT2Config& config, int world) {
  llmc::StagePlan plan(a.stages, "-sp", a.T, a.total_batch, llmc::window_setting(a),
                       {a.next_token_weights, a.prefix_weight});
  const size_t count = plan.stages().size();
  REQUIRE(count == 1 || a.max_steps >= 0, "-sp shares out -x's steps among its %zu stages: give -x", count);
  REQUIRE(!plan.has_loss_ramp() || a.max_steps >= 0, "-sp: mtp=A>B and pw=A>B change the loss's weights over a "
          "stage's steps, which -x gives: give -x");
  if (a.max_steps >= 0) plan.resolve(a.max_steps);
  REQUIRE(a.profiled_step < 0 || a.max_steps >= 0, "-pk %d names a step of the run, whose steps -x gives: give -x",
          a.profiled_step);
  REQUIRE(a.profiled_step < 0 || a.profiled_step < plan.total_steps(), "-pk %d: the run trains steps 0 to %ld: "
          "give one of them", a.profiled_step, plan.total_steps() - 1);
  const llmc::LayerPlan layers = llmc::layer_plan(config);
  const bool validating = a.val_every > 0 && a.val_batches > 0;
  for (size_t i = 0; i < count; i++) {
    const llmc::Stage& s = plan.stages()[i];
    check_stage(plan, i, [&] {
      REQUIRE(s.T <= config.max_seq_len, "t=%d is above the model's maximum sequence length %d: use t=%d or less",
              s.T, config.max_seq_len, config.max_seq_len);
      llmc::micro_steps_of(s.tokens, a.B, s.T, world, plan.tokens_name());
      if (count == 1) return;  // the flags' own, checked as such
      llmc::check_document_flags(a.documents, s.window.long_blocks, s.T, a.max_steps);
      if (a.documents) llmc::check_window_length(s.window, "t", std::max(s.T, validating ? a.val_T : 0), layers);
    });
  }
  const int change = plan.first_length_change();
  REQUIRE(a.documents || change == 0, "-sp: stage %d sets t=%d (the first stage's is %d): a sequence length that "
          "changes between stages needs document-aligned sequences (-pd 1)", change + 1, plan.stages()[change].T,
          plan.stages()[0].T);
  REQUIRE(a.documents || !plan.has_cap(), "-sp: a document cap (cap=N) cuts document-aligned sequences: add -pd 1");
  REQUIRE(!a.overfit || change == 0, "-a 1 trains on its first batch, of the first stage's t=%d, and -sp stage %d sets "
          "t=%d: keep t the same in every stage, or leave -a 1 out", plan.stages()[0].T, change + 1,
          plan.stages()[change].T);
  resolve_final_window(plan, a, validating);
  REQUIRE(!a.window_tokens || (a.documents && plan.max_window() != 0), "-awt 1 counts the attention windows in "
          "tokens, and this run has none: give -pd 1 with a window (-aw, or -sp's aw=), or leave -awt out");
  return plan;
}

// -ut: the embedding tied to a head of its own, whose weights and AdamW state it takes whole
// (gpt2_tie_embedding), so on one optimizer shard.
void check_untie_step(const TrainArgs& a, const llmc::GPT2Config& config, int world) {
  if (a.untie_step < 0) return;
  const llmc::ArchSpec& arch = llmc::arch_spec(config.arch);
  REQUIRE(!arch.tied_head, "-ut %d ties the embedding to the head through step %d, and the %s architecture's head "
          "is the embedding throughout: leave -ut out", a.untie_step, a.untie_step, arch.name);
  REQUIRE(llmc::zero_shard_count(world, a.zero_stage) == 1, "-ut %d copies the head's weights and AdamW state to "
          "the embedding's, which -zs 1 shards apart over the %d processes: give -zs 0", a.untie_step, world);
}

// What a run reads and checks before any GPU is touched, so that a bad flag or file fails with
// its own message on any machine, before GPU memory is set up.
struct RunInputs {
  int resume_step = -1;  // the checkpoint's step with -y 1
  StartParams start;
  llmc::StagePlan stages;  // -sp's, its steps shared out where -x gives them
  llmc::HellaSwagSet hellaswag;  // with -h 1
  std::vector<int> prefix_table;  // where -pw or a stage's pw= is above 0 (prefix_table_of)
};

// The prefix term's table, each token's prefix token (llmc::token_prefix_table), read from -tk's
// vocabulary file, in the padded vocabulary's rows.
std::vector<int> prefix_table_of(const TrainArgs& a, const llmc::GPT2Config& config) {
  const std::string asked = a.prefix_weight > 0.0f ? llmc::strformat("-pw %g", a.prefix_weight) : "-sp's pw=";
  if (a.tokenizer.empty()) {
    LLMC_FAIL("%s: the prefix term reads each token's bytes from the vocabulary file, and there is none: give "
              "-tk FILE (gpt2_tokenizer.bin, which dev/data/tinyshakespeare.sh makes), or %s", asked.c_str(),
              a.prefix_weight > 0.0f ? "-pw 0" : "pw=0");
  }
  const llmc::Tokenizer tokenizer(a.tokenizer);
  if (tokenizer.vocab_size() > config.vocab_size) {
    LLMC_FAIL("%s: -tk %s holds %d tokens, more than the model's %d: give the model's vocabulary file",
              asked.c_str(), a.tokenizer.c_str(), tokenizer.vocab_size(), config.vocab_size);
  }
  return llmc::token_prefix_table(tokenizer.token_bytes(), tokenizer.eot_token(), config.padded_vocab_size);
}

// -e's or -y 1's parameters, then the flags against the model, the data, HellaSwag's set and
// -o's state; -o comes last, so that a directory of an earlier run names no other mistake.
// world: the launch's process count (launch_world). A prompt's run (-p) trains nothing.
RunInputs prepare_run(TrainArgs& a, int world) {
  RunInputs in;
  if (a.resume) llmc::require_directory(a.output_dir, "-y 1: -o");
  in.resume_step = a.resume ? llmc::latest_checkpoint_step(a.output_dir) : -1;
  if (a.resume && in.resume_step < 0) {
    const std::string log = a.output_dir + "/main.log";
    if (llmc::file_exists(log) && llmc::File(log, "rb").size() > 0) {
      LLMC_FAIL("-y 1: %s holds a run log, but %s has no complete checkpoint (a DONE_<step> marker) to resume "
                "from: give -o another directory for a new run, or delete the log and run without -y",
                log.c_str(), a.output_dir.c_str());
    }
    LLMC_FAIL("-y 1: no complete checkpoint (a DONE_<step> marker) in %s; run without -y to start "
              "a new run", a.output_dir.c_str());
  }
  // A marker whose files were removed since: the model file, and for training rank 0's state file,
  // which every layout reads (another rank's is named where it is read), once the model fits.
  auto require_marked = [&](const std::string& path) {
    if (a.resume && !llmc::file_exists(path)) {
      LLMC_FAIL("-y 1: %s marks a complete checkpoint, but %s is missing: delete the marker to resume from "
                "the checkpoint before it", llmc::done_marker_path(a.output_dir, in.resume_step).c_str(),
                path.c_str());
    }
  };
  require_marked(llmc::checkpoint_path(a.output_dir, "model", in.resume_step));
  in.start = load_start_params(a, in.resume_step);
  const llmc::GPT2Config& config = in.start.config;
  llmc::resolve_sample_length(a, config.max_seq_len);
  if (!a.prompt.empty()) return in;
  require_marked(llmc::checkpoint_path(a.output_dir, "state", in.resume_step, 0));
  const llmc::Recipe& recipe = *a.recipe;
  if (config.arch != recipe.arch) {
    LLMC_FAIL("-e %s holds the %s architecture, but -recipe %s trains the %s one: give -recipe %s (-p "
              "generates with any)", a.model.c_str(), llmc::arch_spec(config.arch).name, recipe.name,
              llmc::arch_spec(recipe.arch).name, llmc::arch_spec(config.arch).name);
  }
  llmc::resolve_sequence_length(a, config.max_seq_len);
  llmc::check_document_flags(a.documents, a.window_blocks, a.T, a.max_steps);
  resolve_validation_length(a, config.max_seq_len);
  if (!std::count(a.given.begin(), a.given.end(), "-m") && a.val_every > 0) {
    a.val_batches = llmc::recipe_val_batches(recipe, world);
  }
  if (a.documents) {
    const bool longer_validation = a.val_every > 0 && a.val_batches > 0 && a.val_T > a.T;
    llmc::check_window_length(llmc::window_setting(a), longer_validation ? "-vt" : "-t", longer_validation ? a.val_T : a.T,
                              llmc::layer_plan(config));
  }
  // Every process keeps AdamW's gradients whole, averaged over the processes at each step (the kept
  // sum the same on all of them, the step's added to it and averaged: the sum of the steps'
  // averages); ZeRO-1's reduce-scatter would leave each process's kept gradients averaged in its
  // shard alone.
  if (a.adam_every > 1 && llmc::zero_shard_count(world, a.zero_stage) > 1) {
    LLMC_FAIL("-ao %d keeps AdamW's gradients between its updates whole on every process, and -zs 1 shards them "
              "over the %d processes: give -zs 0", a.adam_every, world);
  }
  if (a.muon_qk_heads && config.num_heads % a.muon_qk_heads) {
    LLMC_FAIL("-mq %d: the model's %d heads do not split into blocks of %d: give a divisor of %d (record #89's 2), or "
              "-mq 0 for Q and K whole", a.muon_qk_heads, config.num_heads, a.muon_qk_heads, config.num_heads);
  }
  // A recipe's rows of tensors the model lacks (-recipe record89 -md 0: the dense connections') stand
  // for nothing; rows given on the command line must name the model's tensors.
  llmc::ParamSpec specs[llmc::kNumParamTensors];
  llmc::param_table(config, specs);
  const bool rows_given = std::count(a.given.begin(), a.given.end(), "-ar") > 0;
  for (int i = 0; i < llmc::kNumParamTensors; i++) {
    if (rows_given && a.adam_rows[i] != llmc::AdamTensorRow() && specs[i].size == 0) {
      LLMC_FAIL("-ar %s: the %s model has no %s: drop its row", llmc::adam_rows_text(a.adam_rows).c_str(),
                llmc::arch_spec(config.arch).name, specs[i].name);
    }
  }
  if (a.normuon && world > 1 && a.zero_stage == 1) {
    LLMC_FAIL("-mn 1 keeps NorMuon's second moments whole on every process, and -zs 1 shards Muon's state over "
              "the %d processes: give -zs 0", world);
  }
  in.stages = resolve_stage_plan(a, config, world);
  check_untie_step(a, config, world);
  REQUIRE(!config.paired_heads || !a.documents || in.stages.max_window() == 0 || a.window_tokens, "the model's "
          "paired heads (-ph 1) attend over each sequence doubled, whose windows record #89 counts in positions: "
          "give -awt 1 (a window of N blocks is then N x 128 positions back from each query)");
  REQUIRE(!a.key_offset || llmc::arch_spec(config.arch).qk_norm_rotary, "-ko 1 shifts the keys' stationary rotary "
          "dims, and the %s architecture has no rotary: give -recipe modern or speedrun, or leave -ko out",
          llmc::arch_spec(config.arch).name);
  REQUIRE(!a.yarn || llmc::arch_spec(config.arch).qk_norm_rotary, "-yn 1 rescales the rotary's frequencies, and "
          "the %s architecture has no rotary: give -recipe modern or speedrun, or leave -yn out",
          llmc::arch_spec(config.arch).name);
  if (a.yarn) llmc::yarn_check(in.stages, "-yn");
  REQUIRE(!a.mlp_from_output || (llmc::arch_spec(config.arch).relu2 && a.recompute == 0 && a.fp8 == 0),
          "-mr 1 takes ReLU^2's derivative from its kept output: give a ReLU^2 MLP (-recipe modern or speedrun) "
          "with -r 0 and -fp8 0, or -mr 0");
  if (a.max_steps >= 0) {
    const long extension = in.stages.total_steps() - in.stages.scheduled_steps();
    a.update.muon_momentum.resolve(in.stages.total_steps(), "-mc",
                                   llmc::strformat("-x %d", a.max_steps) +
                                       (extension ? llmc::strformat(" and -sp's %ld extension steps", extension) : ""));
  }
  llmc::resolve_tokenizer(a);
  if (a.prefix_weight > 0.0f || in.stages.has_prefix_term()) in.prefix_table = prefix_table_of(a, config);
  llmc::logit_cap_of(llmc::arch_spec(config.arch).logit_cap, a.logit_cap, llmc::arch_spec(config.arch).name);
  if (a.fp8) fp8_require_layer(config.channels, config.channels);
  check_data(a, world, in.stages);
  if (a.hellaswag) in.hellaswag = read_hellaswag(a, config.vocab_size, in.stages.max_T());
  if (!a.output_dir.empty()) {
    // A log with no complete checkpoint beside it is of a run that -y 1 cannot resume.
    const char* resume_with = llmc::latest_checkpoint_step(a.output_dir) >= 0 ? "-y 1" : nullptr;
    llmc::check_log_dir(a.output_dir, "-o", resume_with, a.resume ? llmc::LogMode::kResume : llmc::LogMode::kNew);
  }
  return in;
}

// -p: prints the prompt and -e's continuation of it.
void generate_from_prompt(const TrainArgs& a, GPT2& m) {
  llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(a.encoder_dir);
  const std::vector<int> prompt = encoder.encode(a.prompt);
  llmc::Rng rng(a.seed);
  printf("%s", a.prompt.c_str());
  print_generation(m, prompt, a.gen_len, a.temperature, a.top_k, rng,
                   [&](int id) { return encoder.decode({id}); });
}

// The training data: contiguous batches (llmc::DataLoader), or with -pd 1 document-aligned
// sequences (llmc::DocumentLoader), whose steps take a stage's micro batches of its T and cap.
class TrainLoader {
 public:
  void open(const TrainArgs& a, const llmc::StepPlan& p, int rank, int world, int vocab_size) {
    if (a.documents) {
      documents_.reset(new llmc::DocumentLoader(a.train_pattern, "-i", a.B, p.T, p.micro_steps, rank, world,
                                                a.shuffle != 0, a.seed, vocab_size, p.cap));
    } else {
      batches_.reset(new llmc::DataLoader(a.train_pattern, "-i", a.B, p.T, rank, world, a.shuffle != 0, a.seed,
                                          vocab_size));
    }
  }
  // A stage's shape at the step about to begin; contiguous batches keep their T (resolve_stage_plan),
  // so only their micro steps change, which they do not hold.
  void reshape(const llmc::StepPlan& p) {
    if (documents_) documents_->reshape(p.T, p.micro_steps, p.cap);
  }
  void next_batch(int* inputs, int* targets) {
    if (documents_) documents_->next_batch(inputs, targets);
    else batches_->next_batch(inputs, targets);
  }
  llmc::DataLoaderState state() const { return documents_ ? documents_->state() : batches_->state(); }
  void restore(const llmc::DataLoaderState& s) {
    if (documents_) documents_->restore(s);
    else batches_->restore(s);
  }
  long total_tokens() const { return documents_ ? documents_->total_tokens() : batches_->total_tokens(); }
  // One epoch of contiguous batches; documents have none (-pd 1 needs -x).
  long batches_per_epoch() const {
    REQUIRE(batches_, "document-aligned sequences have no epoch to count the steps by: give -x");
    return batches_->batches_per_epoch();
  }

 private:
  std::unique_ptr<llmc::DataLoader> batches_;
  std::unique_ptr<llmc::DocumentLoader> documents_;
};

// -pt 1: where a step's time goes. An event on the model's stream at the end of each phase (the
// step's start event opens the first) marks when the stream reached it, so a wait for the host or
// for a peer counts in the phase that waited. Summed over the timed steps, with the host's time
// from one step's end to the next one's start.
enum StepPhase {
  kPhaseMicroSteps, kPhaseReduction, kPhaseLossNorm, kPhaseAdamW, kPhaseMuon, kPhaseGather, kPhaseRest,
  kStepPhases
};
constexpr const char* kStepPhaseNames[kStepPhases] = {"micro steps", "gradient reduction", "loss and norm", "AdamW",
                                                      "Muon", "parameter gather", "rest"};

struct StepPhases {
  bool on = false;
  cudaEvent_t ends[kStepPhases] = {};  // the last is the step's end event
  double ms[kStepPhases] = {};
  double host_between_ms = 0.0;
  double last_step_end = -1.0;  // wall seconds when the last step's end was reached; -1: none yet
  int host_gaps = 0;
};

void step_phases_setup(StepPhases& p, bool on, cudaEvent_t step_end) {
  p.on = on;
  if (!on) return;
  for (int i = 0; i + 1 < kStepPhases; i++) cudaCheck(cudaEventCreate(&p.ends[i]));
  p.ends[kPhaseRest] = step_end;
}

void step_phases_free(StepPhases& p) {
  if (!p.on) return;
  for (int i = 0; i + 1 < kStepPhases; i++) cudaCheck(cudaEventDestroy(p.ends[i]));
}

// The end of `phase` on `stream` (nothing without -pt).
void step_phase_end(StepPhases& p, StepPhase phase, cudaStream_t stream) {
  if (p.on) cudaCheck(cudaEventRecord(p.ends[phase], stream));
}

// Once the step's end event is reached: its phases added, if it is timed.
void step_phases_add(StepPhases& p, cudaEvent_t step_start, bool timed) {
  if (!p.on) return;
  const double now = llmc::wall_seconds();
  if (timed) {
    cudaEvent_t from = step_start;
    for (int i = 0; i < kStepPhases; i++) {
      float ms = 0.0f;
      cudaCheck(cudaEventElapsedTime(&ms, from, p.ends[i]));
      p.ms[i] += ms;
      from = p.ends[i];
    }
  }
  p.last_step_end = now;
}

// At a step's start: the host's time since the last step's end, if this step is timed.
void step_phases_start(StepPhases& p, bool timed) {
  if (!p.on || p.last_step_end < 0.0 || !timed) return;
  p.host_between_ms += (llmc::wall_seconds() - p.last_step_end) * 1e3;
  p.host_gaps++;
}

// Every rank prints its own line: a rank that waits in the reduction for a slower one shows it.
void print_step_phases(const StepPhases& p, int timed_steps, int rank, int world) {
  if (!p.on || timed_steps == 0) return;
  printf("step phases (rank %d of %d, ms, mean of %d timed steps):", rank, world, timed_steps);
  for (int i = 0; i < kStepPhases; i++) {
    printf("%s %s %.3f", i == 0 ? "" : " |", kStepPhaseNames[i], p.ms[i] / timed_steps);
  }
  if (p.host_gaps > 0) printf(" | host between steps %.3f", p.host_between_ms / p.host_gaps);
  printf("\n");
  fflush(stdout);
}

// What the training loop carries from step to step (train_setup fills it in).
struct TrainRun {
  TrainRun(const TrainArgs& args, MultiGpu& multi_gpu, GPT2& model) : a(args), mg(multi_gpu), m(model) {}
  const TrainArgs& a;
  MultiGpu& mg;
  GPT2& m;
  int resume_step = -1;  // the step of the checkpoint resumed from; -1 for a new run
  llmc::StagePlan stages;
  llmc::StepPlan step;   // what holds at the step the loop is at (stages.at)
  int train_steps = 0;   // the scheduled steps and the extension's
  TrainLoader train_loader;
  std::unique_ptr<llmc::DataLoader> val_loader;  // none without validation
  llmc::LrSchedule schedule;
  llmc::HellaSwagSet hellaswag;
  std::unique_ptr<llmc::Tokenizer> tokenizer;  // none: samples are printed as token ids
  std::unique_ptr<llmc::Logger> logger;        // rank 0, with -o
  std::unique_ptr<llmc::RunSummary> summary;
  llmc::Rng sample_rng{0};
  llmc::OutlierDetector loss_outliers, norm_outliers;
  std::vector<int> inputs, targets;
  // Each micro step's B*T losses, pinned ([micro step][B*T]); read once the step's last copy
  // (losses_copied) is done, so the host waits for the GPU once a step, not each micro step.
  float* micro_losses = nullptr;
  cudaEvent_t losses_copied = nullptr;
  std::function<void(int)> grads_final;
  OptimizerSpread optimizer_spread;
  Checkpointer checkpoints;
  cudaEvent_t start = nullptr, end = nullptr;  // around each step
  StepPhases phases;                           // -pt 1
  double total_ms = 0.0;
  long timed_tokens = 0;
  int timed_steps = 0, skipped_updates = 0;
  std::unique_ptr<llmc::EtaEstimator> eta;
  llmc::YarnState yarn;  // -yn 1: YaRN's state at the step the loop is at
};

// Only the checkpoint at the end (or at a halt) gains nothing from buffers pinned for the run.
bool checkpoint_pin_asked(const TrainArgs& a, int train_steps) {
  return !a.output_dir.empty() && a.async_checkpoints && a.checkpoint_every > 0 &&
         a.checkpoint_every < train_steps;
}

// How this rank writes checkpoints, for the startup table.
std::string checkpoint_mode(const Checkpointer& ck, bool pin_asked) {
  const std::string pinned = llmc::strformat("; %.1f GB pinned in %.1f s", ck.pinned_bytes / 1e9, ck.pin_seconds);
  if (ck.async && checkpoint_has_snapshot(ck)) {
    return "written in the background (a snapshot on the GPU, then pinned host memory)" + pinned;
  }
  if (ck.async) return "written in the background (pinned host memory)" + pinned;
  return pin_asked ? "written before training goes on (host memory not pinned)" : "written before training goes on";
}

// -o's checkpoints are written in the background with -ac 1 and -n N (so that the run goes on
// after them) when every rank can pin its host buffers: the ranks settle their writes together.
void train_checkpoint_setup(TrainRun& r) {
  const TrainArgs& a = r.a;
  Checkpointer& ck = r.checkpoints;
  const bool pin = checkpoint_pin_asked(a, r.train_steps);
  checkpoint_setup(ck, a.output_dir, a.keep_last, a.keep_every, pin, a.async_checkpoints == 1, r.m,
                   r.mg.rank);
  ck.data_tokens = r.train_loader.total_tokens();
  double unpinned = pin && !ck.async ? 1.0 : 0.0;
  // A rank that failed in its setup never comes to this sum: the watchdog ends the others.
  multi_gpu_progress(r.mg);
  multi_gpu_sum(r.mg, &unpinned, 1, r.m.stream);
  multi_gpu_pause(r.mg);
  if (unpinned > 0 && ck.async) {
    checkpoint_free_buffers(ck, r.m);
    ck.async = false;
  }
}

// The data, schedule, evaluation sets and log of a run; with -y 1 the rest of the checkpoint's
// state (the parameters are in the model already).
// model_seconds: the parameters' load and upload (gpt2_init_start), for a resume's line.
void train_setup(TrainRun& r, RunInputs& in, double run_start, double model_seconds) {
  const TrainArgs& a = r.a;
  const int vocab_size = r.m.config.vocab_size;
  const int resume_step = in.resume_step;
  r.resume_step = resume_step;
  r.stages = in.stages;
  r.step = r.stages.at(std::max(0, resume_step), a.B, r.mg.world);
  r.train_loader.open(a, r.step, r.mg.rank, r.mg.world, vocab_size);
  if (a.val_every > 0 && a.val_batches > 0) {
    r.val_loader.reset(new llmc::DataLoader(a.val_pattern, "-j", a.B, a.val_T, r.mg.rank, r.mg.world,
                                            false, a.seed, vocab_size));
  }
  // Without -x, one epoch of contiguous batches (a plan of one stage: resolve_stage_plan).
  if (a.max_steps < 0) r.stages.resolve(std::max<long>(1, r.train_loader.batches_per_epoch() / r.step.micro_steps));
  r.train_steps = (int)r.stages.total_steps();
  if (resume_step > r.train_steps) {
    const std::string last = a.max_steps >= 0 ? llmc::strformat("-x %d", a.max_steps) : "one epoch, without -x";
    LLMC_FAIL("-y 1: the checkpoint in %s is of step %d, past this run's last step %d (%s): give -x %d or more "
              "to go on from it", a.output_dir.c_str(), resume_step, r.train_steps, last.c_str(), resume_step + 1);
  }
  r.schedule = llmc::make_lr_schedule(a.schedule, "-k", a.lr, a.warmup, std::max(1L, r.stages.scheduled_steps()),
                                      a.final_lr_frac);
  r.schedule.decay_fraction = a.decay_fraction;
  r.schedule.cooldown_fraction = a.cooldown_fraction;
  r.hellaswag = std::move(in.hellaswag);
  if (a.sample_every > 0 && !a.tokenizer.empty()) r.tokenizer.reset(new llmc::Tokenizer(a.tokenizer));
  // The checkpoints' pinned buffers come first, so that a resume reads its state into them. The
  // state is read before the run log is touched, so a damaged state file leaves -o as it was.
  train_checkpoint_setup(r);
  llmc::HostTrainState resumed_host;
  double state_seconds = 0.0;
  if (resume_step >= 0) {
    const double state_start = llmc::wall_seconds();
    resumed_host = load_state(r.m, a.output_dir, resume_step, r.mg.rank, r.mg.world,
                              r.train_loader.total_tokens(),
                              r.checkpoints.async ? r.checkpoints.optimizer_host : nullptr);
    state_seconds = llmc::wall_seconds() - state_start;
  }
  r.sample_rng = llmc::Rng(a.seed + 1);
  r.inputs.resize((size_t)a.B * r.stages.max_T());
  r.targets.resize((size_t)a.B * r.stages.max_T());
  if (a.overfit) r.train_loader.next_batch(r.inputs.data(), r.targets.data());
  // Spikes are reported above a z-score of 5 unless -sl / -sg set the threshold that skips updates.
  r.loss_outliers = llmc::OutlierDetector(llmc::kOutlierDefaultWindow, llmc::kOutlierDefaultMinCount,
                                          a.loss_z > 0 ? a.loss_z : llmc::kOutlierDefaultThreshold);
  r.norm_outliers = llmc::OutlierDetector(llmc::kOutlierDefaultWindow, llmc::kOutlierDefaultMinCount,
                                          a.norm_z > 0 ? a.norm_z : llmc::kOutlierDefaultThreshold);
  // Restored before the run log is touched too: a loader state that does not fit this run's data
  // or batch fails here, with the log's lines after the checkpoint still there.
  if (resume_step >= 0) {
    r.sample_rng.restore(resumed_host.sample_rng);
    r.train_loader.restore(resumed_host.train_loader);
    r.loss_outliers.restore(resumed_host.loss_window);
    r.norm_outliers.restore(resumed_host.norm_window);
  }
  // Tied at its first step, a run starts from the head's weights in the embedding too (a resumed
  // one has them already).
  if (std::max(0, resume_step) <= r.m.untie_step) gpt2_tie_embedding(r.m);
  if (!a.output_dir.empty() && r.mg.rank == 0) {
    llmc::make_dirs(a.output_dir);
    // A resumed log keeps every line up to the checkpoint's step, which the run does not repeat.
    r.logger.reset(resume_step >= 0
        ? new llmc::Logger(a.output_dir, "-o", "-y 1", llmc::LogMode::kResume, resume_step + 1)
        : new llmc::Logger(a.output_dir, "-o", "-y 1", llmc::LogMode::kNew));
  }
  if (r.mg.rank == 0) print_config_table(a, r.m, r.mg, r.stages, r.train_steps, r.train_loader.total_tokens(),
                                         checkpoint_mode(r.checkpoints, checkpoint_pin_asked(a, r.train_steps)));
  const llmc::StagePlan& stages = r.stages;
  const int B = a.B, world = r.mg.world;
  if (stages.stages().size() == 1) {
    r.summary.reset(new llmc::RunSummary(run_start, r.step.tokens));
  } else {
    r.summary.reset(new llmc::RunSummary(run_start, [&stages, B, world](long steps) {
      return stages.tokens_through(steps, B, world);
    }));
  }
  if (r.logger && resume_step >= 0) r.summary->add_logged(llmc::read_run_log(r.logger->path()));
  // Where a resume's time goes: the model file's part (read and uploaded), the state's, and all of
  // it up to here (those, the GPU's setup, the checkpoints' pinned buffers).
  if (resume_step >= 0 && r.mg.rank == 0) {
    printf("resumed from the checkpoint of step %d in %s (the model loaded in %.1f s, the state "
           "in %.1f s, %.1f s since the start)\n", resume_step, a.output_dir.c_str(), model_seconds,
           state_seconds, llmc::wall_seconds() - run_start);
  }
  cudaCheck(cudaEventCreate(&r.start));
  cudaCheck(cudaEventCreate(&r.end));
  step_phases_setup(r.phases, a.step_phases != 0, r.end);
  cudaCheck(cudaEventCreateWithFlags(&r.losses_copied, cudaEventDisableTiming));
  cudaCheck(cudaMallocHost(&r.micro_losses, (size_t)r.stages.max_step_tokens_per_process(a.B, r.mg.world) *
                                                sizeof(float)));
  r.grads_final = multi_gpu_overlapped_reduction(r.mg, r.m);
  r.optimizer_spread = multi_gpu_optimizer_spread(r.mg);
  multi_gpu_divided_setup(r.mg, r.m, a.update);
  multi_gpu_sparse_setup(r.mg, r.m);
  multi_gpu_map_peer_params(r.mg, r.m);
  install_stop_handlers();
  r.eta.reset(new llmc::EtaEstimator(llmc::kEtaWindow));
}

// The validation loss, HellaSwag and a sample, each at its interval and at the last step. The
// checkpoint a run resumes from was written after them, so they are not repeated at its step.
void evaluate_at_step(TrainRun& r, int step) {
  const TrainArgs& a = r.a;
  const bool last = step == r.train_steps;
  if (step == r.resume_step) return;
  if (r.val_loader && (step % a.val_every == 0 || last)) {
    gpt2_settle_params(r.m);
    const float val_loss = evaluate_validation(r.m, r.mg, *r.val_loader, a.val_batches, a.B, a.val_T);
    if (r.mg.rank == 0) {
      printf("step %4d/%d | val loss %.6f\n", step, r.train_steps, val_loss);
      if (r.logger) r.logger->val(step, val_loss);
      r.summary->val_loss(step, val_loss);
    }
  }
  if (a.hellaswag && ((a.val_every > 0 && step % a.val_every == 0) || last)) {
    gpt2_settle_params(r.m);
    const llmc::HellaSwagCounts counts = evaluate_hellaswag(r.m, r.mg, r.hellaswag, r.stages.max_T());
    if (r.mg.rank == 0) {
      printf("step %4d/%d | hellaswag acc_norm %.4f (%lld/%lld), acc %.4f\n", step, r.train_steps,
             counts.acc_norm(), counts.correct_norm, counts.examples, counts.acc());
      if (r.logger) r.logger->eval(step, "hellaswag", counts.acc_norm());
    }
  }
  if (r.mg.rank == 0 && a.sample_every > 0 && step > 0 && (step % a.sample_every == 0 || last)) {
    const int vocab_size = r.m.config.vocab_size;
    gpt2_settle_params(r.m);
    printf("sample: ");
    print_generation(r.m, {vocab_size - 1}, a.gen_len, a.temperature, a.top_k, r.sample_rng,
                     [&](int id) {
                       return r.tokenizer ? r.tokenizer->decode(id) : llmc::strformat("%d ", id);
                     });
  }
}

// Waits for every rank's checkpoint writes and the marker of the checkpoint they wrote: in two
// rounds when rank 0 has that marker still to write (the same on every rank).
void checkpoint_settle(TrainRun& r) {
  Checkpointer& ck = r.checkpoints;
  if (ck.dir.empty()) return;
  const int rounds = ck.unmarked_step >= 0 ? 2 : 1;
  for (int round = 0; round < rounds; round++) {
    multi_gpu_pause(r.mg);  // a write takes as long as it takes
    ck.writer.drain();
    multi_gpu_progress(r.mg);
    std::array<double, 2> state = checkpoint_writer_state(ck);
    multi_gpu_sum(r.mg, state.data(), 2, r.m.stream);
    if (state[1] > 0) multi_gpu_pause(r.mg);  // leaving finishes this rank's write in flight
    checkpoint_advance(ck, r.mg.rank, state[0], state[1], *r.summary);
  }
}

// The checkpoint of `step` in -o: once the writes of the one before are settled (their buffers
// are reused), its copies are enqueued and its files handed to the writer; without -ac 1 they
// are settled at once.
void checkpoint_at_step(TrainRun& r, int step) {
  Checkpointer& ck = r.checkpoints;
  gpt2_settle_params(r.m);
  multi_gpu_pause(r.mg);  // copies from the GPU into pageable memory hold this thread
  if (ck.async) checkpoint_settle(r);
  multi_gpu_share_state(r.mg, r.m);
  checkpoint_copy_to_host(ck, r.m, r.mg.rank);
  llmc::HostTrainState host;
  host.model_rng = r.m.rng.state();
  host.sample_rng = r.sample_rng.state();
  host.train_loader = r.train_loader.state();
  host.loss_window = r.loss_outliers.state();
  host.norm_window = r.norm_outliers.state();
  checkpoint_submit(ck, r.m, r.mg.rank, r.mg.world, step, host);
  if (ck.async) return;
  checkpoint_settle(r);
  checkpoint_free_buffers(ck, r.m);
}

// What one training step measured, for its line of output.
struct StepResult {
  float loss = 0.0f, norm = 0.0f, lr = 0.0f, ms = 0.0f;
  double loss_score = 0.0, norm_score = 0.0;  // z-scores against the recent steps
  bool finite = true, spike = false;          // the update is skipped unless finite and no spike
};

// Rank 0's line for a step, in the run log too, and a note when its update was skipped or spiked.
void print_step(TrainRun& r, int step, const StepResult& s) {
  const double tokens_per_s = r.step.tokens / (s.ms / 1e3);  // of all processes: the step's tokens
  const double mfu = tokens_per_s * flops_per_token(r.m, r.step.T) / (kPeakFlops * r.mg.world) * 100.0;
  r.eta->step_finished(llmc::wall_seconds());
  if (r.mg.rank != 0) return;
  printf("step %4d/%d | loss %.6f | norm %.4f | lr %.3e | %.2f ms | MFU %.1f%% | %.0f tok/s | ETA %s\n",
         step + 1, r.train_steps, s.loss, s.norm, s.lr, s.ms, mfu, tokens_per_s,
         r.eta->time_left(step + 1, r.train_steps - step - 1).c_str());
  fflush(stdout);
  if (r.logger) r.logger->train(step + 1, s.loss, s.norm, s.lr, s.ms, tokens_per_s);
  if (!s.finite) printf("step %d: loss or gradient norm is not finite: update skipped (%d so far)\n",
                        step + 1, r.skipped_updates);
  if (s.finite && (r.loss_outliers.is_spike(s.loss_score) || r.norm_outliers.is_spike(s.norm_score))) {
    printf("step %d: spike, loss z-score %.1f, grad norm z-score %.1f%s\n", step + 1, s.loss_score,
           s.norm_score, s.spike ? llmc::strformat(": update skipped (%d so far)", r.skipped_updates).c_str() : "");
  }
}

// The gradient each logit's loss gets: of the mean over the step's tokens, or (the modern recipe)
// of their sum, which the ranks' average of their gradients divides by the process count.
float train_dloss(const TrainRun& r) {
  if (r.a.recipe->loss_sum) return (float)r.mg.world;
  return 1.0f / ((float)r.a.B * r.step.T * r.step.micro_steps);
}

// One optimizer step from `step` to step + 1: the micro steps' forward and backward passes, the
// reduction over the ranks and the update. Returns whether any rank was asked to stop (a signal).
bool train_step(TrainRun& r, int step) {
  const TrainArgs& a = r.a;
  GPT2& m = r.m;
  const bool timed = step >= tuning_steps(m);  // the first steps include setup and tuning
  step_phases_start(r.phases, timed);
  cudaCheck(cudaEventRecord(r.start, m.stream));
  gpt2_zero_grad(m);
  const int T = r.step.T, micro_steps = r.step.micro_steps, N = a.B * T;
  for (int micro = 0; micro < micro_steps; micro++) {
    multi_gpu_progress(r.mg);
    if (!a.overfit) r.train_loader.next_batch(r.inputs.data(), r.targets.data());
    multi_gpu_mark_rows(r.mg, r.inputs.data(), N, micro == 0, micro == micro_steps - 1);
    gpt2_forward(m, r.inputs.data(), a.B, T, ForwardPass::kTraining);
    gpt2_classifier_enqueue(m, r.targets.data(), a.B, T, train_dloss(r), r.micro_losses + (size_t)micro * N);
    cudaCheck(cudaEventRecord(r.losses_copied, m.stream));
    gpt2_backward(m, a.B, T, micro == micro_steps - 1, r.grads_final);
  }
  step_phase_end(r.phases, kPhaseMicroSteps, m.stream);
  multi_gpu_reduce_grads(r.mg, m);
  step_phase_end(r.phases, kPhaseReduction, m.stream);
  cudaCheck(cudaEventSynchronize(r.losses_copied));  // the GPU is still in the last backward
  double loss_sum = 0.0;  // each micro step's mean, as gpt2_classifier returns it
  for (int micro = 0; micro < micro_steps; micro++) {
    loss_sum += losses_host_mean(r.micro_losses + (size_t)micro * N, N);
  }
  StepResult s;
  s.loss = multi_gpu_average(r.mg, (float)(loss_sum / micro_steps), m.stream);
  s.norm = multi_gpu_grad_norm(r.mg, m);
  const double lr = r.schedule.at(step, r.step.lr_multiplier);
  s.lr = (float)lr;
  // A NaN or Inf anywhere in the gradients shows in the norm: such an update is never applied.
  s.finite = std::isfinite(s.loss) && std::isfinite(s.norm);
  s.loss_score = r.loss_outliers.update_and_score(s.loss);
  s.norm_score = r.norm_outliers.update_and_score(s.norm);
  s.spike = s.finite && ((a.loss_z > 0 && r.loss_outliers.is_spike(s.loss_score)) ||
                         (a.norm_z > 0 && r.norm_outliers.is_spike(s.norm_score)));
  step_phase_end(r.phases, kPhaseLossNorm, m.stream);
  if (s.finite && !s.spike) {
    checkpoint_before_update(r.checkpoints, m);
    const float lr_fraction = a.lr > 0.0f ? (float)(lr / a.lr) : 0.0f;
    gpt2_update(m, a.update, step, s.lr, lr_fraction, s.norm, r.optimizer_spread, r.phases.ends[kPhaseAdamW]);
    step_phase_end(r.phases, kPhaseMuon, m.stream);
    multi_gpu_gather_params(r.mg, m);
  } else {
    step_phase_end(r.phases, kPhaseAdamW, m.stream);
    step_phase_end(r.phases, kPhaseMuon, m.stream);
    r.skipped_updates++;
    m.adamw_grads_kept = false;  // the gradients of a skipped update are dropped, kept ones too
    if (step == m.untie_step) gpt2_untie_embedding_state(m);  // the untie does not wait for an update
  }
  step_phase_end(r.phases, kPhaseGather, m.stream);
  multi_gpu_fp8_end_step(r.mg, m, s.finite && !s.spike);
  cudaCheck(cudaEventRecord(r.end, m.stream));
  cudaCheck(cudaEventSynchronize(r.end));
  cudaCheck(cudaEventElapsedTime(&s.ms, r.start, r.end));
  step_phases_add(r.phases, r.start, timed);
  if (timed) {
    r.total_ms += s.ms;
    r.timed_tokens += r.step.tokens;
    r.timed_steps++;
  }
  print_step(r, step, s);
  // Every rank stops after the same step: the request is summed over the ranks, and with it the
  // state of their checkpoint writers, so that every rank sees a failed write at the same step.
  const std::array<double, 2> writer = checkpoint_writer_state(r.checkpoints);
  double shared[3] = {(double)stop_requests, writer[0], writer[1]};
  multi_gpu_sum(r.mg, shared, 3, m.stream);
  if (shared[2] > 0) multi_gpu_pause(r.mg);  // leaving finishes this rank's write in flight
  checkpoint_advance(r.checkpoints, r.mg.rank, shared[1], shared[2], *r.summary);
  return shared[0] > 0;
}

// -yn 1: YaRN's state at `step`, derived from the plan at the loop's first step (a resume's too, so
// that it continues bitwise), then advanced a step at a time.
void yarn_to_step(TrainRun& r, int step, bool first) {
  if (first) {
    r.yarn = llmc::yarn_at(r.stages, step, gpt2_yarn_base(r.m));
  } else {
    llmc::yarn_advance(r.yarn, r.stages, step);
  }
  gpt2_set_yarn(r.m, r.yarn);
}

// The steps from the first (0, or the resumed checkpoint's) to the last: at each its evaluations,
// its checkpoint when one is due, then the step to the next. Returns the exit status;
// *final_step is the last step reached.
int train_loop(TrainRun& r, int* final_step) {
  const TrainArgs& a = r.a;
  int halt_for_signal = -1;
  const int first_step = std::max(0, r.resume_step);
  *final_step = first_step;
  for (int step = first_step; step <= r.train_steps; step++) {
    *final_step = step;
    multi_gpu_progress(r.mg);
    r.step = r.stages.at(step, a.B, r.mg.world);
    r.train_loader.reshape(r.step);
    if (a.documents) gpt2_set_window(r.m, r.step.windows);
    if (a.yarn) yarn_to_step(r, step, step == first_step);
    gpt2_set_loss_weights(r.m, r.step.loss);
    evaluate_at_step(r, step);
    const bool last = step == r.train_steps;
    const bool halt = step == a.halt_after || step == halt_for_signal;
    if (!a.output_dir.empty() && step != r.resume_step && step > 0 &&
        (last || halt || (a.checkpoint_every > 0 && step % a.checkpoint_every == 0))) {
      checkpoint_at_step(r, step);
    }
    if (step == halt_for_signal && !last) {
      if (r.mg.rank == 0) {
        printf("stopped by a signal after step %d%s\n", step,
               a.output_dir.empty() ? " (no -o: nothing saved)" : "; continue with -y 1");
      }
      return kExitInterrupted;
    }
    if (halt && !last) {
      if (r.mg.rank == 0) printf("halted after step %d: continue with -y 1\n", step);
      return 0;
    }
    if (last) return 0;
    if (step == a.profiled_step) nvtxRangePush("step");
    const bool stop = train_step(r, step);
    if (step == a.profiled_step) nvtxRangePop();
    if (stop && halt_for_signal < 0) halt_for_signal = step + 1;
  }
  return 0;
}

// Rank 0's report of the run. Every process holds all the parameters (ZeRO shards the optimizer
// state only), so on several their checksums are compared with rank 0's (the one printed): a
// process whose parameters drifted would otherwise show only as a loss averaged with the others'.
// Returns whether they agree (on every rank).
bool print_run_end(TrainRun& r, int final_step) {
  const uint32_t checksum = gpt2_params_checksum(r.m);
  double first = r.mg.rank == 0 ? (double)checksum : 0.0;  // exact: a double holds any uint32
  multi_gpu_sum(r.mg, &first, 1, r.m.stream);
  double differing = (uint32_t)first == checksum ? 0.0 : 1.0;
  multi_gpu_sum(r.mg, &differing, 1, r.m.stream);
  print_step_phases(r.phases, r.timed_steps, r.mg.rank, r.mg.world);
  if (r.mg.rank != 0) return differing == 0.0;
  if (r.timed_steps > 0) {
    printf("average %.2f ms per step, %.0f tok/s\n", r.total_ms / r.timed_steps,
           r.timed_tokens / (r.total_ms / 1e3));
  }
  printf("peak memory: %zu MiB\n", g_device_memory.peak >> 20);
  if (r.skipped_updates > 0) {
    printf("%d updates skipped (non-finite or spiking loss or norm)\n", r.skipped_updates);
  }
  printf("parameter checksum %08x\n", checksum);
  if (r.mg.world > 1 && differing == 0.0) printf("parameters identical on %d processes\n", r.mg.world);
  if (differing > 0.0) {
    printf("error: the parameters of %.0f of %d processes differ from rank 0's\n", differing, r.mg.world);
  }
  r.summary->print(llmc::wall_seconds(), final_step);
  return differing == 0.0;
}

// The flags of a parsed command line (the words at even places), then the checks between flags
// and the settings they resolve to.
void resolve_args(TrainArgs& a, const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); i += 2) a.given.push_back(args[i]);
  // A recipe's -od 1 yields to -zs 1 on the command line: ZeRO-1 divides the optimizers its own way.
  if (a.zero_stage == 1 && !std::count(a.given.begin(), a.given.end(), "-od")) a.divided_optimizers = 0;
  validate_args(a);
  a.update = llmc::optimizer_table(a, sizeof(floatX) == 2);
}

// "; -t 1024 comes from -recipe modern: give -t to override it" for each flag the message names
// whose value the recipe set, not the command line.
std::string recipe_default_note(TrainArgs& a, const std::string& message) {
  std::string note;
  const std::vector<llmc::Flag> flags = train_flags(a);
  const std::vector<const llmc::Flag*> recipe_set = llmc::recipe_flags(a, flags);
  for (const llmc::Flag& f : flags) {
    const std::string name = f.name;
    const bool from_recipe = std::count(recipe_set.begin(), recipe_set.end(), &f) &&
                             !std::count(a.given.begin(), a.given.end(), name);
    const size_t at = (" " + message + " ").find(" " + name + " ");
    if (!from_recipe || at == std::string::npos) continue;
    note += llmc::strformat("; %s %s comes from -recipe %s: give %s to override it", f.name, f.show().c_str(),
                            a.recipe->name, f.name);
  }
  return note;
}

// What runs without a GPU: the CPU trainer, where it takes this run (GPT-2, and only the flags
// both trainers share; -recipe and -opt are this trainer's).
std::string without_gpu(const TrainArgs& a, const llmc::GPT2Config& config) {
  llmc::TrainFlags shared;
  std::vector<std::string> cpu_flags;
  for (const llmc::Flag& f : llmc::train_flags(shared)) cpu_flags.push_back(f.name);
  bool cpu_takes = config.arch == llmc::Arch::kGpt2;
  for (const std::string& flag : a.given) cpu_takes = cpu_takes && std::count(cpu_flags.begin(), cpu_flags.end(), flag);
  return cpu_takes ? "; the CPU trainer ./train_gpt2 runs this without one" : "";
}

int train_main(int argc, char** argv) {
  const double run_start = llmc::wall_seconds();
  TrainArgs a;
  const std::vector<std::string> args(argv + 1, argv + argc);
  apply_recipe(a, llmc::recipe_of_args(args));
  if (!llmc::parse_flags(args, train_flags(a), "./train_gpt2cu")) {
    llmc::print_usage(argv[0], "GPT-2 training on the GPU, precision " PRECISION_NAME,
                      kQuickStart, train_flags(a));
    return 0;
  }
  RunInputs in;
  try {
    resolve_args(a, args);
    in = prepare_run(a, launch_world(a.multi_gpu));
  } catch (const llmc::Error& e) {
    throw llmc::Error(e.what() + recipe_default_note(a, e.what()));
  }
  require_gpu(without_gpu(a, in.start.config));
  MultiGpu mg = multi_gpu_init(&argc, &argv, a.multi_gpu, a.zero_stage, a.divided_optimizers != 0);
  matmul_setup(a.tf32 != 0);
  GPT2 m;
  cudaCheck(cudaStreamCreate(&m.stream));
  const int shard_count = llmc::zero_shard_count(mg.world, mg.zero_stage);
  const StateSpec state = {a.master_weights != 0, a.update.muon(), a.update.normuon, a.fp8_head_scales};
  const double model_seconds = gpt2_init_start(m, std::move(in.start), state, a.seed,
                                               shard_count == 1 ? 0 : mg.rank, shard_count);
  m.logit_cap = llmc::logit_cap_of(m.arch().logit_cap, a.logit_cap, m.arch().name);
  m.untie_step = a.untie_step;
  m.adamw_every = a.update.adam_every;
  m.muon_qk_heads = a.muon_qk_heads;
  if (a.key_offset) gpt2_set_key_offset(m);
  m.mlp_from_output = a.mlp_from_output != 0;
  if (a.attention_scale > 0.0) gpt2_set_attention_scale(m, a.attention_scale);
  int exit_status = 0;
  if (!a.prompt.empty()) {
    generate_from_prompt(a, m);
  } else {
    resolve_fp8_head(a);
    resolve_fp8_mlp(a);
    gpt2_allocate(m, a.B, in.stages.max_T(), a.recompute, a.fp8, a.fp8_grad_e4m3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2,
                  {a.documents != 0, in.stages.max_window(), llmc::window_unit(a)}, a.fp8_head != 0);
    gpt2_allocate_fp8_mlp(m, a.B, in.stages.max_T(), a.fp8_mlp != 0);
    if (a.val_every > 0 && a.val_batches > 0) gpt2_allocate_validation(m, a.B, a.val_T);
    gpt2_set_prefix_table(m, in.prefix_table);
    TrainRun r(a, mg, m);
    train_setup(r, in, run_start, model_seconds);
    int final_step;
    exit_status = train_loop(r, &final_step);
    checkpoint_settle(r);
    if (!print_run_end(r, final_step) && exit_status == 0) exit_status = 1;
    checkpoint_teardown(r.checkpoints, r.m);
    cudaCheck(cudaEventDestroy(r.start));
    cudaCheck(cudaEventDestroy(r.end));
    step_phases_free(r.phases);
    cudaCheck(cudaEventDestroy(r.losses_copied));
    cudaCheck(cudaFreeHost(r.micro_losses));
  }
  gpt2_free(m);
  matmul_teardown();
  multi_gpu_finish(mg);
  return exit_status;
}

int main(int argc, char** argv) { return llmc::run_main(train_main, argc, argv); }
#endif  // TESTING
