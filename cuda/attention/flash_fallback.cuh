// Simple attention kernels for the head dims without an mma.sync kernel (any D up to 256; the
// tiny test models use D = 4 .. 32): correct rather than fast, all math in f32 (expf, logf).
// A warp owns one row: lane d-slots hold dims d = lane + 32 c (c < 8) of the row's output or
// gradient; keys (queries) are taken 32 at a time, one per lane, and each lane's score (full
// dot product over D) is shared with shuffles.
//   forward (warp per query i, head h): online softmax over the chunks of visible keys,
//     m' = max(m, max_chunk s), l' = l e^(m - m') + sum_chunk e^(s - m'), o likewise; then
//     out = o / l, lse = m + ln l.
//   backward dq (warp per query i, head h): p = e^(s - lse_i), dS = p (dout_i . v_j - dsum_i),
//     dq = scale sum_j dS_ij k_j.
//   backward dk, dv (warp per key j, kv head g): over the q heads of the group and the queries
//     that see j: dv = sum p_ij dout_i, dk = scale sum dS_ij q_i. Deterministic (no atomics).
// dsum_i = dout_i . out_i comes from the preprocessing kernel in flash.cu. With separate keys
// (Lk >= Lq) query i sits at key position i + Lk - Lq; keys no query sees get dk = dv = 0.
#pragma once
#include "cuda/attention/flash_common.cuh"
#include "cuda/common/warp.cuh"

namespace engine::cuda::flash::fallback {

constexpr int kWarps = 4;                         // rows per block
constexpr int kSlots = kFallbackMaxHeadDim / 32;  // dims per lane

// x (shared, f32) . y (global, bf16) over D.
static __device__ __forceinline__ float dot(const float* x, const bf16* y, int D) {
  float s = 0.f;
  for (int d = 0; d < D; ++d) s = fmaf(x[d], __bfloat162float(y[d]), s);
  return s;
}

// Copies a bf16 row of D into shared f32 (whole warp).
static __device__ __forceinline__ void row_to_shared(float* dst, const bf16* src, int D, int lane) {
  for (int d = lane; d < D; d += 32) dst[d] = __bfloat162float(src[d]);
}

// acc[c] += w * row[lane + 32 c]
static __device__ __forceinline__ void axpy_slots(float (&acc)[kSlots], float w, const bf16* row,
                                                  int D,
                                           int lane) {
  FLASH_UNROLL
  for (int c = 0; c < kSlots; ++c)
    if (lane + 32 * c < D) acc[c] = fmaf(w, __bfloat162float(row[lane + 32 * c]), acc[c]);
}

static __global__ void __launch_bounds__(kWarps * 32) fallback_fwd_kernel(const Params p) {
  __shared__ float sq[kWarps][kFallbackMaxHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seq = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kWarps + warp;
  const int b = p.cu_seqlens_q[seq], L = p.cu_seqlens_q[seq + 1] - b;
  if (i >= L) return;  // whole warp; nothing below synchronises the block
  const int bk = p.cu_seqlens_k[seq], Lk = p.cu_seqlens_k[seq + 1] - bk;
  const int pos = i + Lk - L;  // key position of query i
  const int D = p.head_dim, H = p.num_heads, g = h / (H / p.num_kv_heads);
  const int64_t row = p.kv_row;  // of the keys
  const bf16* k0 = p.k + int64_t{bk} * row + g * D;
  const bf16* v0 = k0 + p.num_kv_heads * D;
  row_to_shared(sq[warp], p.q + (int64_t{b} + i) * p.q_row + h * D, D, lane);
  __syncwarp();

  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int hi = p.causal ? pos : Lk - 1;
  float m = -INFINITY, l = 0.f, o[kSlots] = {};
  for (int j0 = lo; j0 <= hi; j0 += 32) {
    const int j = j0 + lane;
    const float s = j <= hi ? p.scale * dot(sq[warp], k0 + j * row, D) : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));  // finite: lane 0's key is visible
    const float alpha = expf(m - m_new);
    const float pj = j <= hi ? expf(s - m_new) : 0.f;
    l = l * alpha + warp_sum(pj);
    FLASH_UNROLL
    for (int c = 0; c < kSlots; ++c) o[c] *= alpha;
    const int n = min(32, hi - j0 + 1);
    for (int jj = 0; jj < n; ++jj)
      axpy_slots(o, __shfl_sync(0xffffffffu, pj, jj), v0 + (j0 + jj) * row, D, lane);
    m = m_new;
  }
  const int64_t t = int64_t{b} + i;
  bf16* out = p.out + (t * H + h) * D;
  FLASH_UNROLL
  for (int c = 0; c < kSlots; ++c)
    if (lane + 32 * c < D) out[lane + 32 * c] = __float2bfloat16(o[c] / l);
  if (lane == 0) p.lse[t * H + h] = m + logf(l);
}

static __global__ void __launch_bounds__(kWarps * 32) fallback_bwd_dq_kernel(const Params p) {
  __shared__ float sq[kWarps][kFallbackMaxHeadDim], sdo[kWarps][kFallbackMaxHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seq = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kWarps + warp;
  const int b = p.cu_seqlens_q[seq], L = p.cu_seqlens_q[seq + 1] - b;
  if (i >= L) return;
  const int bk = p.cu_seqlens_k[seq], Lk = p.cu_seqlens_k[seq + 1] - bk;
  const int pos = i + Lk - L;  // key position of query i
  const int D = p.head_dim, H = p.num_heads, g = h / (H / p.num_kv_heads);
  const int64_t row = p.kv_row, t = int64_t{b} + i;
  const bf16* k0 = p.k + int64_t{bk} * row + g * D;
  const bf16* v0 = k0 + p.num_kv_heads * D;
  row_to_shared(sq[warp], p.q + t * p.q_row + h * D, D, lane);
  row_to_shared(sdo[warp], p.dout + (t * H + h) * D, D, lane);
  __syncwarp();
  const float lse = p.lse[t * H + h], dsum = p.dsum[t * H + h];

  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int hi = p.causal ? pos : Lk - 1;
  float dq[kSlots] = {};
  for (int j0 = lo; j0 <= hi; j0 += 32) {
    const int j = j0 + lane;
    float ds = 0.f;
    if (j <= hi) {
      const float pj = expf(p.scale * dot(sq[warp], k0 + j * row, D) - lse);
      ds = pj * (dot(sdo[warp], v0 + j * row, D) - dsum);
    }
    const int n = min(32, hi - j0 + 1);
    for (int jj = 0; jj < n; ++jj)
      axpy_slots(dq, __shfl_sync(0xffffffffu, ds, jj), k0 + (j0 + jj) * row, D, lane);
  }
  bf16* dst = p.dq + t * p.q_row + h * D;
  FLASH_UNROLL
  for (int c = 0; c < kSlots; ++c)
    if (lane + 32 * c < D) dst[lane + 32 * c] = __float2bfloat16(p.scale * dq[c]);
}

static __global__ void __launch_bounds__(kWarps * 32) fallback_bwd_dkv_kernel(const Params p) {
  __shared__ float sk[kWarps][kFallbackMaxHeadDim], sv[kWarps][kFallbackMaxHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seq = blockIdx.z, g = blockIdx.y, j = blockIdx.x * kWarps + warp;
  const int bk = p.cu_seqlens_k[seq], Lk = p.cu_seqlens_k[seq + 1] - bk;
  if (j >= Lk) return;
  const int b = p.cu_seqlens_q[seq], L = p.cu_seqlens_q[seq + 1] - b;
  const int off = Lk - L;  // key position of query 0
  const int D = p.head_dim, H = p.num_heads, Hkv = p.num_kv_heads, G = H / Hkv;
  const int64_t row = p.q_row, tj = int64_t{bk} + j;
  row_to_shared(sk[warp], p.k + tj * p.kv_row + g * D, D, lane);
  row_to_shared(sv[warp], p.k + tj * p.kv_row + (Hkv + g) * D, D, lane);
  __syncwarp();

  // Queries that see key j: [lo, hi] (empty when the key is older than every query's window,
  // or the sequence has no queries: dk = dv = 0).
  const int lo = max(0, (p.causal ? j : 0) - off);
  const int hi = p.window > 0 ? min(L - 1, j + p.window - 1 - off) : L - 1;
  float dk[kSlots] = {}, dv[kSlots] = {};
  for (int h = g * G; h < (g + 1) * G; ++h) {
    const bf16* q0 = p.q + int64_t{b} * row + h * D;
    const bf16* do0 = p.dout + (int64_t{b} * H + h) * D;
    const int64_t do_row = int64_t{H} * D;
    for (int i0 = lo; i0 <= hi; i0 += 32) {
      const int i = i0 + lane;
      float pi = 0.f, ds = 0.f;
      if (i <= hi) {
        const int64_t ti = int64_t{b} + i;
        float s = 0.f, dp = 0.f;
        for (int d = 0; d < D; ++d) {
          s = fmaf(__bfloat162float(q0[i * row + d]), sk[warp][d], s);
          dp = fmaf(__bfloat162float(do0[i * do_row + d]), sv[warp][d], dp);
        }
        pi = expf(p.scale * s - p.lse[ti * H + h]);
        ds = pi * (dp - p.dsum[ti * H + h]);
      }
      const int n = min(32, hi - i0 + 1);
      for (int ii = 0; ii < n; ++ii) {
        axpy_slots(dv, __shfl_sync(0xffffffffu, pi, ii), do0 + (i0 + ii) * do_row, D, lane);
        axpy_slots(dk, __shfl_sync(0xffffffffu, ds, ii), q0 + (i0 + ii) * row, D, lane);
      }
    }
  }
  bf16* dk_dst = p.dk + tj * p.kv_row + g * D;
  bf16* dv_dst = dk_dst + Hkv * D;
  FLASH_UNROLL
  for (int c = 0; c < kSlots; ++c)
    if (lane + 32 * c < D) {
      dk_dst[lane + 32 * c] = __float2bfloat16(p.scale * dk[c]);
      dv_dst[lane + 32 * c] = __float2bfloat16(dv[c]);
    }
}

}  // namespace engine::cuda::flash::fallback
