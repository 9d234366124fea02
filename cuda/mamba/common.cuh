// Shared by the Mamba kernel files (.cu only): document starts as a bitmask over the packed
// tokens (built from cu_seqlens once per op call), the launchers' dtype check of column blocks,
// and the device math the conv and the scan share.
#pragma once
#include <cstdint>

#include "core/buffer.h"
#include "cuda/common/fast_math.cuh"
#include "cuda/common/launch.cuh"
#include "ops/mamba.h"

namespace engine::cuda::mamba {

// Bit t of words[t / 32] is set when token t starts a document (token 0 always does).
static __global__ void doc_start_bits_kernel(const int32_t* __restrict__ cu, int64_t segments,
                                             int64_t tokens, uint32_t* __restrict__ words) {
  const int64_t s = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (s > segments) return;
  const int64_t t = s == segments ? 0 : cu[s];  // the extra thread marks token 0
  if (t >= 0 && t < tokens) atomicOr(&words[t >> 5], 1u << (t & 31));
}

// The bitmask of cu_seqlens (S + 1) i32 for `tokens` tokens, in a scratch buffer of
// start_words(tokens) words.
inline int64_t start_words(int64_t tokens) { return (tokens + 31) / 32; }
static inline Owned doc_start_bits(const Tensor& cu_seqlens, int64_t tokens) {
  const int64_t words = (tokens + 31) / 32;
  Owned bits = empty({std::max<int64_t>(words, 1)}, DType::I32, Device::CUDA);
  CUDA_CHECK(cudaMemsetAsync(bits.t.data, 0, bits.t.nbytes(), stream()));
  const int64_t segments = cu_seqlens.numel() - 1;
  const int threads = 256;
  doc_start_bits_kernel<<<static_cast<unsigned>(ceil_div(segments + 1, threads)), threads, 0,
                          stream()>>>(static_cast<const int32_t*>(cu_seqlens.data), segments,
                                      tokens, static_cast<uint32_t*>(bits.t.data));
  check_launch("doc_start_bits_kernel");
  return bits;
}

__device__ __forceinline__ bool is_start(const uint32_t* __restrict__ words, int64_t t) {
  return (__ldg(&words[t >> 5]) >> (t & 31)) & 1u;
}

// Start bits of tokens [t, t + 64) (bit i: token t + i) from a bitmask of `count` words: kernels
// test them in registers instead of loading a word per token.
__device__ __forceinline__ uint64_t start_bits64(const uint32_t* __restrict__ words, int64_t count,
                                                 int64_t t) {
  const int64_t q = t >> 5;
  const int s = static_cast<int>(t & 31);
  const uint64_t w0 = q < count ? __ldg(&words[q]) : 0u, w1 = q + 1 < count ? __ldg(&words[q + 1]) : 0u,
                 w2 = q + 2 < count ? __ldg(&words[q + 2]) : 0u;
  const uint64_t lo = w0 | (w1 << 32);
  return s == 0 ? lo : (lo >> s) | (w2 << (64 - s));
}

// Start bits of the up to 128 tokens of a chunk beginning at token t0.
struct ChunkStarts {
  uint64_t lo, hi;
  __device__ __forceinline__ bool operator()(int i) const { return ((i < 64 ? lo : hi) >> (i & 63)) & 1u; }
};
__device__ __forceinline__ ChunkStarts chunk_starts(const uint32_t* __restrict__ words, int64_t count,
                                                    int64_t t0) {
  return {start_bits64(words, count, t0), start_bits64(words, count, t0 + 64)};
}

// A tensor (or a column block's) in bf16, the kernels' activations and weights; its shape and
// place were checked before (ops/mamba.cpp).
inline void expect_bf16(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::BF16, op, ": ", name, " is ", dtype_name(t.dtype), ", expected bf16");
}

template <typename T> T* block_ptr(const ops::ColumnBlock& b) {
  return static_cast<T*>(b.base.data) + b.col;
}

__device__ __forceinline__ float bf(const bf16_t v) { return __bfloat162float(v); }

// The gates of the Mamba-2 and Gated DeltaNet kernels, in f32 (softplus as torch's, threshold 20).
__device__ __forceinline__ float softplus_f(float v) { return v > 20.f ? v : log1pf(__expf(v)); }
__device__ __forceinline__ float sigmoid_f(float v) { return 1.f / (1.f + __expf(-v)); }
__device__ __forceinline__ float silu_f(float v) { return v / (1.f + __expf(-v)); }

// d silu(v) / dv from s = sigmoid(v).
__device__ __forceinline__ float dsilu(float v, float s) { return s * (1.f + v * (1.f - s)); }

}  // namespace engine::cuda::mamba
