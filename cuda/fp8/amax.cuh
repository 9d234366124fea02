// The FP8 amax (ops/fp8.h) of what a kernel writes, for kernels that produce an FP8 product's
// operand and hand its amax over with it (the norms' outputs, the SwiGLU's output and input
// gradient): magnitudes
// compared as unsigned f32 bit patterns (NaN above infinity, so a NaN makes the amax NaN), the
// result independent of the order of the maxima. Each thread keeps a running maximum of the
// values as stored (rounded to the output's dtype), and each warp adds its maximum with one
// atomicMax into the output, zeroed before the launch (zero_amax).
#pragma once
#include "cuda/common/launch.cuh"

namespace engine::cuda {

__device__ __forceinline__ unsigned magnitude_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// The magnitude of v as a T stores it.
template <typename T>
__device__ __forceinline__ unsigned stored_magnitude(float v) {
  return magnitude_bits(to_float(from_float<T>(v)));
}

__device__ __forceinline__ unsigned warp_max_bits(unsigned v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every lane of the warp calls it; out may be null (no amax wanted).
__device__ __forceinline__ void commit_amax(unsigned m, float* out) {
  if (!out) return;
  m = warp_max_bits(m);
  if (threadIdx.x % 32 == 0 && m) atomicMax(reinterpret_cast<unsigned*>(out), m);
}

// Zeroes the amax (one f32) before the kernel that commits into it; nothing for an undefined one.
inline float* zero_amax(const Tensor& amax) {
  if (!amax.data) return nullptr;
  CUDA_CHECK(cudaMemsetAsync(amax.data, 0, sizeof(float), stream()));
  return static_cast<float*>(amax.data);
}

}  // namespace engine::cuda
