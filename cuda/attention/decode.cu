// One query against the cached keys and values (ops/decode.h attention_decode): the new token's
// q heads attend to every cached position within the sliding window, grouped-query.
//   out[h] = sum_j softmax_j(scale q_h . k_j) v_j,   j in [first, L), first = max(0, L - window)
// One block per q head, kWarps warps splitting the keys (warp w takes j = first + w, + kWarps,
// ...); each lane holds dims lane, lane + 32, ... (up to kMaxPerLane of them, D <= 256) of the
// query, of its running output and of each key and value it reads, so a key's dot product is a
// warp sum. Each warp keeps an online softmax (running max m, sum l, output acc, rescaled when m
// grows); the warps' (m, l, acc) are then merged through shared memory. Everything in f32.
// A decode step is a handful of these (one per layer) at one token: latency, not bandwidth,
// bounds it, so one block per head and no split of the keys over blocks.
// Memory: qkv (1, H + 2 Hkv, D), cache (L, 2 Hkv, D), out (1, H, D), all bf16 or all f32.
// The shared checks ran (ops/decode.cpp); here: the dtype, D within the lanes' registers, sizes
// within 32-bit indices.
#include "ops/decode.h"

#include <cmath>

#include "cuda/common/launch.cuh"
#include "cuda/common/warp.cuh"

namespace engine::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxPerLane = 8;  // D <= 256

template <typename T>
struct DecodeArgs {
  const T* qkv;    // (1, H + 2 Hkv, D)
  const T* cache;  // (L, 2 Hkv, D)
  T* out;          // (1, H, D)
  int heads, kv_heads, head_dim, first, len;
  float scale;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) attention_decode_kernel(const DecodeArgs<T> a) {
  __shared__ float m_s[kWarps], l_s[kWarps];
  __shared__ float acc_s[kWarps][kMaxPerLane * 32];
  const int h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = h / (a.heads / a.kv_heads), D = a.head_dim;
  const int64_t row = int64_t{2} * a.kv_heads * D;  // a cache row: k heads, then v heads
  float q[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < D ? to_float(a.qkv[int64_t{h} * D + d]) * a.scale : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = a.first + warp; j < a.len; j += kWarps) {
    const T* k = a.cache + j * row + int64_t{g} * D;
    const T* v = a.cache + j * row + int64_t{a.kv_heads + g} * D;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) dot = fmaf(q[i], to_float(k[d]), dot);
    }
    const float s = warp_sum(dot);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);  // corr = 0 for the first key (m = -inf)
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < D ? p * to_float(v[d]) : 0.f);
    }
    m = m_new;
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc_s[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  // Merge the warps: a warp that saw no key has m = -inf and weight 0.
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w]);
  float wsum[kWarps], total = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    wsum[w] = m_s[w] == -INFINITY ? 0.f : expf(m_s[w] - mx);
    total += wsum[w] * l_s[w];
  }
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += wsum[w] * acc_s[w][d];
    a.out[int64_t{h} * D + d] = from_float<T>(o / total);
  }
}

}  // namespace

void attention_decode(const ops::DecodeAttentionParams& p) {
  const char* op = "attention_decode";
  expect_cuda_float(p.qkv, op, "qkv");
  expect_cuda(p.cache, op, "cache");
  expect_cuda(p.out, op, "out");
  ENSURE(p.head_dim <= kMaxPerLane * 32, op, ": head_dim ", p.head_dim, " is larger than the kernel takes (",
         kMaxPerLane * 32, ")");
  const int64_t L = p.cache.size(0);
  ENSURE(L * p.cache.size(1) * p.head_dim < (int64_t{1} << 31), op, ": cache ", p.cache.shape.str(),
         " is too large for 32-bit positions");
  const int first = p.window > 0 && L > p.window ? static_cast<int>(L - p.window) : 0;
  float_switch(p.qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    DecodeArgs<T> a{static_cast<const T*>(p.qkv.data), static_cast<const T*>(p.cache.data), static_cast<T*>(p.out.data),
                    p.num_heads, p.num_kv_heads, p.head_dim, first, static_cast<int>(L), p.softmax_scale};
    attention_decode_kernel<T><<<static_cast<unsigned>(p.num_heads), kThreads, 0, stream()>>>(a);
  });
  check_launch(op);
}

}  // namespace engine::cuda
