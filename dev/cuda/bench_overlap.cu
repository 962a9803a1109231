// What moving a step's parameters and gradients between two GPUs costs the work beside it. One
// process drives GPUs 0 and 1. The work is a kernel of one wave: a block on every SM, each running
// FMAs for about the same time, as our products and attention launch (a wave sized to the GPU's
// SMs); a block that cannot be resident waits for a whole second wave. The transfers, of BYTES of
// BF16 values:
//   - the parameters' all-gather (each GPU holds half and receives the other half), by NCCL
//     (ncclAllGather; its communicator's CTAs as NCCL chooses them, then capped: maxCTAs) and by the
//     copy engines (cudaMemcpyPeerAsync, each GPU's half to the other), which take no SM;
//   - the gradients' reduction to their owners (each GPU keeps the sum of both GPUs' values of its
//     half), by NCCL (ncclReduceScatter) and by the copy engines and an add (each GPU pulls the other's
//     values of its half into a staging buffer, then add_inplace adds them into its own: the trainer's
//     -oc 3 scheme, for its rate without the trainer around it).
// For each: the transfer alone, then as many waves as fill its time alone and beside it (the
// transfer's time beside them, and how much longer the waves took).
//   build/bench_kernels overlap [MB] [WAVE_MS]    (default: 551 MB, the speedrun's gradients; 0.25 ms)
// Needs two GPUs with peer access (NVLink); NCCL_NVLS_ENABLE=0 where the machine asks for it.
#include "dev/cuda/kernel_test.h"

namespace overlap_bench {

constexpr int kGpus = 2;
constexpr int kWaveThreads = 256;

// A block's FMAs for about `iterations` rounds; out keeps the compiler from dropping them.
__global__ void wave_kernel(float* out, int iterations) {
  float a = threadIdx.x * 1e-3f, b = 1.0f + blockIdx.x * 1e-6f;
  for (int i = 0; i < iterations; i++) {
#pragma unroll
    for (int k = 0; k < 16; k++) a = fmaf(a, b, 1e-7f);
  }
  if (a == -1.0f) out[blockIdx.x] = a;
}

struct Gpu {
  int sms = 0;
  cudaStream_t work = nullptr, copy = nullptr;
  cudaEvent_t work_start = nullptr, work_end = nullptr, copy_start = nullptr, copy_end = nullptr;
  __nv_bfloat16* params = nullptr;   // BYTES: half its own, half the other GPU's
  __nv_bfloat16* staging = nullptr;  // BYTES / 2: the other GPU's values of this one's half
  float* sink = nullptr;
};

void gpu_setup(Gpu& g, int device, size_t bytes) {
  cudaCheck(cudaSetDevice(device));
  cudaCheck(cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, device));
  for (cudaStream_t* s : {&g.work, &g.copy}) cudaCheck(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&g.work_start, &g.work_end, &g.copy_start, &g.copy_end}) cudaCheck(cudaEventCreate(e));
  cudaCheck(cudaMalloc(&g.params, bytes));
  cudaCheck(cudaMemset(g.params, device + 1, bytes));
  cudaCheck(cudaMalloc(&g.staging, bytes / kGpus));
  cudaCheck(cudaMalloc(&g.sink, g.sms * sizeof(float)));
  const int peer = 1 - device;
  int can = 0;
  cudaCheck(cudaDeviceCanAccessPeer(&can, device, peer));
  REQUIRE(can, "GPU %d cannot reach GPU %d's memory: the copy engines' transfer needs peer access", device, peer);
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(peer, 0);
  REQUIRE(enabled == cudaSuccess || enabled == cudaErrorPeerAccessAlreadyEnabled, "peer access: %s",
          cudaGetErrorString(enabled));
  cudaGetLastError();  // an already enabled peer is no error here
}

void gpu_free(Gpu& g, int device) {
  cudaCheck(cudaSetDevice(device));
  for (cudaStream_t s : {g.work, g.copy}) cudaCheck(cudaStreamDestroy(s));
  for (cudaEvent_t e : {g.work_start, g.work_end, g.copy_start, g.copy_end}) cudaCheck(cudaEventDestroy(e));
  cudaCheck(cudaFree(g.params));
  cudaCheck(cudaFree(g.staging));
  cudaCheck(cudaFree(g.sink));
}

// A transfer enqueued on each GPU's copy stream (the method under test).
using Transfer = std::function<void(Gpu* gpus, size_t bytes)>;

// Milliseconds of (`waves` waves, the transfer) on GPU 0, each from its own events; either may be
// left out (0 waves, no transfer).
std::pair<float, float> measure(Gpu* gpus, size_t bytes, int iterations, int waves, const Transfer& transfer) {
  for (int d = 0; d < kGpus; d++) {
    cudaCheck(cudaSetDevice(d));
    cudaCheck(cudaDeviceSynchronize());
  }
  for (int d = 0; d < kGpus && transfer; d++) {
    cudaCheck(cudaSetDevice(d));
    cudaCheck(cudaEventRecord(gpus[d].copy_start, gpus[d].copy));
  }
  if (transfer) transfer(gpus, bytes);
  for (int d = 0; d < kGpus; d++) {
    Gpu& g = gpus[d];
    cudaCheck(cudaSetDevice(d));
    if (transfer) cudaCheck(cudaEventRecord(g.copy_end, g.copy));
    if (!waves) continue;
    cudaCheck(cudaEventRecord(g.work_start, g.work));
    for (int w = 0; w < waves; w++) wave_kernel<<<g.sms, kWaveThreads, 0, g.work>>>(g.sink, iterations);
    cudaCheckLaunch();
    cudaCheck(cudaEventRecord(g.work_end, g.work));
  }
  float work_ms = 0.0f, copy_ms = 0.0f;
  cudaCheck(cudaSetDevice(0));
  if (waves) {
    cudaCheck(cudaEventSynchronize(gpus[0].work_end));
    cudaCheck(cudaEventElapsedTime(&work_ms, gpus[0].work_start, gpus[0].work_end));
  }
  if (transfer) {
    cudaCheck(cudaEventSynchronize(gpus[0].copy_end));
    cudaCheck(cudaEventElapsedTime(&copy_ms, gpus[0].copy_start, gpus[0].copy_end));
  }
  for (int d = 0; d < kGpus; d++) {
    cudaCheck(cudaSetDevice(d));
    cudaCheck(cudaDeviceSynchronize());
  }
  return {work_ms, copy_ms};
}

// The rounds of wave_kernel that take about wave_ms on GPU 0.
int calibrate(Gpu* gpus, float wave_ms) {
  constexpr int kWaves = 20;
  int iterations = 1024;
  for (int attempt = 0; attempt < 4; attempt++) {
    const float ms = measure(gpus, 0, iterations, kWaves, nullptr).first / kWaves;
    iterations = std::max(1, (int)(iterations * wave_ms / std::max(ms, 1e-3f)));
  }
  return iterations;
}

Transfer nccl_all_gather(ncclComm_t* comms) {
  return [comms](Gpu* gpus, size_t bytes) {
    const size_t half = bytes / sizeof(__nv_bfloat16) / kGpus;
    ncclCheck(ncclGroupStart());
    for (int d = 0; d < kGpus; d++) {
      ncclCheck(ncclAllGather(gpus[d].params + d * half, gpus[d].params, half, ncclBfloat16, comms[d], gpus[d].copy));
    }
    ncclCheck(ncclGroupEnd());
  };
}

Transfer copy_engines() {
  return [](Gpu* gpus, size_t bytes) {
    const size_t half = bytes / kGpus;
    for (int d = 0; d < kGpus; d++) {
      cudaCheck(cudaSetDevice(d));
      const size_t at = d * half;  // GPU d's own half, into the other GPU's buffer
      cudaCheck(cudaMemcpyPeerAsync((char*)gpus[1 - d].params + at, 1 - d, (char*)gpus[d].params + at, d, half,
                                    gpus[d].copy));
    }
  };
}

// GPU d's half of params ends as the average of both GPUs' (in place, at d's half, ncclAvg).
Transfer nccl_reduce_scatter(ncclComm_t* comms) {
  return [comms](Gpu* gpus, size_t bytes) {
    const size_t half = bytes / sizeof(__nv_bfloat16) / kGpus;
    ncclCheck(ncclGroupStart());
    for (int d = 0; d < kGpus; d++) {
      ncclCheck(ncclReduceScatter(gpus[d].params, gpus[d].params + d * half, half, ncclBfloat16, ncclAvg, comms[d],
                                  gpus[d].copy));
    }
    ncclCheck(ncclGroupEnd());
  };
}

// GPU d pulls the other GPU's values of its half into its staging buffer, then adds them to its own.
Transfer copy_engines_reduce() {
  return [](Gpu* gpus, size_t bytes) {
    const size_t half = bytes / sizeof(__nv_bfloat16) / kGpus;
    for (int d = 0; d < kGpus; d++) {
      cudaCheck(cudaSetDevice(d));
      cudaCheck(cudaMemcpyPeerAsync(gpus[d].staging, d, gpus[1 - d].params + d * half, 1 - d,
                                    half * sizeof(__nv_bfloat16), gpus[d].copy));
      add_inplace(gpus[d].params + d * half, gpus[d].staging, half, 0, gpus[d].copy);
    }
  };
}

// Two communicators over GPUs 0 and 1, with at most max_ctas CTAs each (0: NCCL's choice).
void make_comms(ncclComm_t* comms, int max_ctas) {
  ncclUniqueId id;
  ncclCheck(ncclGetUniqueId(&id));
  ncclCheck(ncclGroupStart());
  for (int d = 0; d < kGpus; d++) {
    cudaCheck(cudaSetDevice(d));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (max_ctas > 0) config.maxCTAs = max_ctas;
    ncclCheck(ncclCommInitRankConfig(&comms[d], kGpus, id, d, &config));
  }
  ncclCheck(ncclGroupEnd());
}

void report(const char* method, Gpu* gpus, size_t bytes, int iterations, float wave_ms, const Transfer& t) {
  measure(gpus, bytes, iterations, 0, t);  // warm-up: NCCL's first call sets up its channels
  const float alone = measure(gpus, bytes, iterations, 0, t).second;
  const int waves = std::max(4, (int)std::ceil(alone / wave_ms));
  const float waves_alone = measure(gpus, bytes, iterations, waves, nullptr).first;
  const std::pair<float, float> both = measure(gpus, bytes, iterations, waves, t);
  printf("%-36s alone %7.3f ms (%4.0f GB/s each way) | beside %3d waves %7.3f ms; the waves %7.3f ms "
         "against %7.3f alone (%+6.2f%%)\n", method, alone, bytes / 2 / (alone * 1e6), waves, both.second,
         both.first, waves_alone, 100.0 * (both.first / waves_alone - 1.0));
}

int run(int argc, char** argv) {
  const double mb = argc > 1 ? atof(argv[1]) : 551.0;
  const float wave_ms = argc > 2 ? (float)atof(argv[2]) : 0.25f;
  REQUIRE(mb > 0.0 && wave_ms > 0.0f, "overlap [MB] [WAVE_MS]: both above 0");
  int devices = 0;
  cudaCheck(cudaGetDeviceCount(&devices));
  REQUIRE(devices >= kGpus, "overlap needs %d GPUs, %d visible", kGpus, devices);
  const size_t bytes = (size_t)(mb * 1e6) / 1024 * 1024;
  Gpu gpus[kGpus];
  for (int d = 0; d < kGpus; d++) gpu_setup(gpus[d], d, bytes);
  const int iterations = calibrate(gpus, wave_ms);
  printf("%.0f MB between GPUs 0 and 1 beside waves of %d blocks (one an SM) of about %.2f ms\n", bytes / 1e6,
         gpus[0].sms, wave_ms);
  report("all-gather, copy engines", gpus, bytes, iterations, wave_ms, copy_engines());
  report("reduction, copy engines", gpus, bytes, iterations, wave_ms, copy_engines_reduce());
  for (int max_ctas : {0, 8, 2}) {
    ncclComm_t comms[kGpus];
    make_comms(comms, max_ctas);
    const std::string name = max_ctas ? llmc::strformat(", at most %d CTAs", max_ctas) : "";
    report(("all-gather, NCCL" + name).c_str(), gpus, bytes, iterations, wave_ms, nccl_all_gather(comms));
    report(("reduction, NCCL" + name).c_str(), gpus, bytes, iterations, wave_ms, nccl_reduce_scatter(comms));
    for (int d = 0; d < kGpus; d++) ncclCheck(ncclCommDestroy(comms[d]));
  }
  for (int d = 0; d < kGpus; d++) gpu_free(gpus[d], d);
  return 0;
}

}  // namespace overlap_bench
