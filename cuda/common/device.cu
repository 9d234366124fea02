#include "cuda/common/device.cuh"

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"

namespace engine::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string device_description(int device) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return str_cat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                 prop.totalGlobalMem / (1024 * 1024 * 1024), " GiB)");
}

void set_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    RAISE("cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(err));
  }
  return p;
}

void device_free(void* p) { CUDA_CHECK(cudaFree(p)); }

void copy_bytes(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes) {
  cudaMemcpyKind kind = dst_on_device ? (src_on_device ? cudaMemcpyDeviceToDevice
                                                       : cudaMemcpyHostToDevice)
                                      : (src_on_device ? cudaMemcpyDeviceToHost
                                                       : cudaMemcpyHostToHost);
  // Ordered with the kernels on the compute stream; a copy that touches host memory returns
  // only when the bytes have arrived.
  cudaStream_t s = static_cast<cudaStream_t>(compute_stream());
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  if (!dst_on_device || !src_on_device) CUDA_CHECK(cudaStreamSynchronize(s));
}

void zero_bytes(void* dst, size_t bytes) {
  CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(compute_stream())));
}

}  // namespace engine::cuda

namespace engine::cuda {

namespace {
cudaStream_t g_stream = nullptr;  // created on first use
}

StreamHandle compute_stream() {
  if (!g_stream) CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  return g_stream;
}

}  // namespace engine::cuda
