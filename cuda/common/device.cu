#include "cuda/common/device.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda/common/check.cuh"

// core/device.h on the CUDA runtime.
namespace engine::device {

bool in_build() { return true; }

int count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string description(int device) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return str_cat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                 prop.totalGlobalMem / (1024 * 1024 * 1024), " GiB)");
}

void select(int device) { CUDA_CHECK(cudaSetDevice(device)); }

MemoryInfo memory_info() {
  MemoryInfo m;
  CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
  return m;
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    RAISE("cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(err));
  }
  return p;
}

void release(void* p) { CUDA_CHECK(cudaFree(p)); }

void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes) {
  cudaMemcpyKind kind = dst_on_device ? (src_on_device ? cudaMemcpyDeviceToDevice
                                                       : cudaMemcpyHostToDevice)
                                      : (src_on_device ? cudaMemcpyDeviceToHost
                                                       : cudaMemcpyHostToHost);
  // Ordered with the kernels on the compute stream; a copy that touches host memory returns
  // only when the bytes have arrived.
  cudaStream_t s = static_cast<cudaStream_t>(cuda::compute_stream());
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  if (!dst_on_device || !src_on_device) CUDA_CHECK(cudaStreamSynchronize(s));
}

namespace {
// Pinned staging blocks for upload(): each is reused only once the copy out of it has
// completed (its event); a block still in flight is skipped, and a new one is made when every
// block is busy or too small, so the host never waits for the GPU here.
struct Staging {
  void* host = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;
};
std::mutex g_staging_mutex;
std::vector<Staging> g_staging;
size_t g_staging_next = 0;
}  // namespace

void upload(void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_staging_mutex);
  Staging* slot = nullptr;
  for (size_t i = 0; i < g_staging.size() && !slot; ++i) {
    Staging& s = g_staging[(g_staging_next + i) % g_staging.size()];
    if (s.capacity < bytes) continue;
    const cudaError_t q = cudaEventQuery(s.done);
    if (q == cudaSuccess) {
      slot = &s;
      g_staging_next = (g_staging_next + i + 1) % g_staging.size();
    } else if (q != cudaErrorNotReady) {
      CUDA_CHECK(q);
    }
  }
  if (!slot) {
    Staging s;
    s.capacity = std::max<size_t>(bytes, size_t{1} << 16);
    CUDA_CHECK(cudaHostAlloc(&s.host, s.capacity, cudaHostAllocDefault));
    CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    g_staging.push_back(s);
    slot = &g_staging.back();
  }
  std::memcpy(slot->host, src, bytes);
  cudaStream_t st = static_cast<cudaStream_t>(cuda::compute_stream());
  CUDA_CHECK(cudaMemcpyAsync(dst, slot->host, bytes, cudaMemcpyHostToDevice, st));
  CUDA_CHECK(cudaEventRecord(slot->done, st));
}

void zero(void* dst, size_t bytes) {
  CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(cuda::compute_stream())));
}

}  // namespace engine::device

namespace engine::cuda {

namespace {
cudaStream_t g_stream = nullptr;  // created on first use
}

StreamHandle compute_stream() {
  if (!g_stream) CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  return g_stream;
}

}  // namespace engine::cuda

