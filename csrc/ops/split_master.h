// The f32 master weights of a bf16 model held in the bf16 weights themselves plus 16 more bits
// (the "split" master, AdamW's form when the compute weights stay resident): an f32 value with
// bits m is stored as
//   hi = (m + 0x7fff) >> 16        the bf16 compute weight: m rounded to the nearest bf16,
//                                  a tie (low half exactly 0x8000) toward the smaller magnitude
//   lo = m - (hi << 16)            in [-0x7fff, 0x8000], kept as its low 16 bits
// and joined back exactly: m = (hi << 16) + lo, reading lo's bits 0x8000 as +0x8000 (-0x8000
// never occurs, which is why ties round down rather than to even: with ties to even both
// +0x8000 and -0x8000 occur and 16 bits cannot tell them apart). Integer arithmetic on the
// bit pattern rounds the magnitude, so negative values work alike; infinities and every finite
// value round-trip (the largest finite ones have hi = bf16 infinity, as with round to nearest).
// One definition for the CPU reference (csrc/ref/adamw.cpp), the CUDA kernel
// (cuda/optim/adamw.cu) and the optimizer's host-side conversions (csrc/optim/adamw.cpp).
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define ENGINE_SPLIT_HD __host__ __device__ inline
#else
#define ENGINE_SPLIT_HD inline
#endif

namespace engine {

ENGINE_SPLIT_HD uint16_t split_master_hi(uint32_t m) { return static_cast<uint16_t>((m + 0x7fffu) >> 16); }

ENGINE_SPLIT_HD uint16_t split_master_lo(uint32_t m, uint16_t hi) {
  return static_cast<uint16_t>(m - (static_cast<uint32_t>(hi) << 16));
}

ENGINE_SPLIT_HD uint32_t split_master_join(uint16_t hi, uint16_t lo) {
  const int32_t s = lo == 0x8000u ? 0x8000 : static_cast<int32_t>(static_cast<int16_t>(lo));
  return (static_cast<uint32_t>(hi) << 16) + static_cast<uint32_t>(s);
}

}  // namespace engine
