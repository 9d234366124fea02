// Helpers for kernel files (.cu only): the compute stream as a cudaStream_t, a post-launch
// check, bf16 conversions and ceil-division. Every launcher runs on stream() and calls
// check_launch("name") after its launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "cuda/common/device.cuh"

namespace engine::cuda {

inline cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

inline void check_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) RAISE(kernel, ": launch failed: ", cudaGetErrorString(err));
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

}  // namespace engine::cuda
