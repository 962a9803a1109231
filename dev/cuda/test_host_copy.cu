// Tests copy_pageable, the copies between the GPU and pageable host memory of checkpoints and
// resumes (through two pinned pieces of kPinnedPieceBytes, a memcpy on several threads at the
// host's end): random bytes to the GPU and back, against cudaMemcpy's, for sizes below one piece
// (the direct path), of exactly one and two pieces, one byte past a piece, and several pieces and
// a part; from and to host addresses 1, 3 and 7 bytes off alignment; on a non-blocking stream
// ordered after work on another (as a checkpoint's copy waits for the step's update); and that
// every copy larger than a piece did go through the pinned pieces. Also pinned_host_alloc, the
// checkpoints' pinned buffers: page-locked (the driver says so), their bytes to the GPU and back,
// and a request beyond the host's available memory refused before any page is touched.
#include "dev/cuda/kernel_test.h"

namespace host_copy_tests {

std::vector<unsigned char> random_bytes(llmc::Rng& rng, size_t n) {
  std::vector<unsigned char> out(n);
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t word = rng.u32();
    memcpy(&out[i], &word, std::min<size_t>(4, n - i));
  }
  return out;
}

void test_host_copy(size_t bytes, size_t host_offset, cudaStream_t other, cudaStream_t stream,
                    llmc::Rng& rng) {
  printf("\ncopy_pageable %zu bytes, host offset %zu\n", bytes, host_offset);
  const bool staged = bytes > kPinnedPieceBytes;
  const std::vector<unsigned char> data = random_bytes(rng, bytes);
  std::vector<unsigned char> source(host_offset + bytes), back(host_offset + bytes, 0xAB);
  memcpy(source.data() + host_offset, data.data(), bytes);
  DeviceArray<unsigned char> device(bytes);
  device.poison();
  const bool up = copy_pageable(device, source.data() + host_offset, bytes, cudaMemcpyHostToDevice, stream);
  std::vector<unsigned char> direct(bytes);
  cudaCheck(cudaMemcpy(direct.data(), device, bytes, cudaMemcpyDeviceToHost));
  testing::check(memcmp(direct.data(), data.data(), bytes) == 0, "to the GPU: the bytes given");
  testing::check(up == staged, staged ? "to the GPU: through the pinned pieces" : "to the GPU: directly");

  // The bytes to read are written on another stream first; the copy is ordered after them by an
  // event only.
  DeviceArray<unsigned char> later(bytes);
  cudaEvent_t written;
  cudaCheck(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
  cudaCheck(cudaMemsetAsync(later, 0xff, bytes, other));
  cudaCheck(cudaMemcpyAsync(later, device, bytes, cudaMemcpyDeviceToDevice, other));
  cudaCheck(cudaEventRecord(written, other));
  cudaCheck(cudaStreamWaitEvent(stream, written, 0));
  const bool down = copy_pageable(back.data() + host_offset, later, bytes, cudaMemcpyDeviceToHost, stream);
  cudaCheck(cudaEventDestroy(written));
  testing::check(memcmp(back.data() + host_offset, data.data(), bytes) == 0,
                 "to the host: the bytes written on the other stream");
  testing::check(down == staged, staged ? "to the host: through the pinned pieces" : "to the host: directly");
  bool untouched = true;
  for (size_t i = 0; i < host_offset; i++) untouched = untouched && back[i] == 0xAB;
  testing::check(untouched, "to the host: nothing written before the destination");

  std::vector<unsigned char> again(bytes, 0);
  copy_pageable(again.data(), device, bytes, cudaMemcpyDeviceToHost, stream);
  testing::check(memcmp(again.data(), data.data(), bytes) == 0, "to the host twice: the same bytes");
}

void test_pinned_host_alloc(size_t bytes, llmc::Rng& rng) {
  printf("\npinned_host_alloc %zu bytes\n", bytes);
  void* p = nullptr;
  testing::check(pinned_host_alloc(&p, bytes) == cudaSuccess && p != nullptr, "allocated");
  if (!p) return;
  cudaPointerAttributes attributes;
  cudaCheck(cudaPointerGetAttributes(&attributes, p));
  testing::check(attributes.type == cudaMemoryTypeHost, "page-locked: the driver knows it as host memory");
  const std::vector<unsigned char> data = random_bytes(rng, bytes);
  memcpy(p, data.data(), bytes);
  DeviceArray<unsigned char> device(bytes);
  cudaCheck(cudaMemcpy(device, p, bytes, cudaMemcpyHostToDevice));
  memset(p, 0, bytes);
  cudaCheck(cudaMemcpy(p, device, bytes, cudaMemcpyDeviceToHost));
  testing::check(memcmp(p, data.data(), bytes) == 0, "to the GPU and back: the same bytes");
  pinned_host_free(p, bytes);
  const size_t available = host_available_bytes();
  testing::check(available != SIZE_MAX && available > bytes, "the host's available memory is known");
  void* too_large = nullptr;
  testing::check(pinned_host_alloc(&too_large, available + (1ul << 30)) == cudaErrorMemoryAllocation &&
                     !too_large,
                 "more than the host has available: refused");
}

void run() {
  llmc::Rng rng(5);
  cudaStream_t other, stream;
  cudaCheck(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  test_host_copy(1000, 3, other, stream, rng);                           // small: the direct path
  test_host_copy(kPinnedPieceBytes, 0, other, stream, rng);              // one piece: still direct
  test_host_copy(kPinnedPieceBytes + 1, 1, other, stream, rng);          // a piece and one byte
  test_host_copy(2 * kPinnedPieceBytes, 0, other, stream, rng);          // both pieces once
  test_host_copy(3 * kPinnedPieceBytes + 12345, 7, other, stream, rng);  // each piece reused, a part
  test_pinned_host_alloc(5 * (2ul << 20) + 4096 + 100, rng);  // huge pages and a partial page
  cudaCheck(cudaStreamDestroy(other));
  cudaCheck(cudaStreamDestroy(stream));
}

}  // namespace host_copy_tests
