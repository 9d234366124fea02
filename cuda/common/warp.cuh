// Full-warp butterfly reductions of one float: after the call every lane holds the sum (max) of
// the 32 lanes' values, combined in the same order on every lane. Device code (nvcc, or the host
// emulator of tests/kernels/attention/flash_emu.h); nvcc unrolls the five steps.
#pragma once

namespace engine::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace engine::cuda
