// Device helpers shared by the cross-entropy kernels (cross_entropy.cu: fused;
// cross_entropy_vocab_parallel.cu: vocabulary-parallel steps). Included by .cu files only.
//   rows as 16-byte vectors (8 bf16 or 4 f32) from the first 16-byte-aligned element, with up to
//   2 x 7 scalars before and after them (RowLayout); unpack / pack between vectors and floats;
//   the (max, sum of exp) statistic Stat with an online accumulate, a bitwise-symmetric merge
//   and warp / block reductions in a fixed order; a block-wide float sum in a fixed order; exp
//   through ex2.approx of (x - m) * log2(e); one vector's (or scalar's) gradient
//   a p - b - (c if label), which covers the plain, z-loss and label-smoothed cross-entropy.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/fast_math.cuh"
#include "cuda/common/launch.cuh"

namespace engine::cuda::ce {

template <typename T>
constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte vector

// ---------------------------------------------------------------------------------------------
// Device helpers: conversions, the (max, sum) statistic, one vector's gradient.

__device__ __forceinline__ void unpack(const uint4& u, float (&x)[8], bf16_t) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[2 * k] = __uint_as_float(w[k] << 16);  // the lower half is the earlier element
    x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack(const uint4& u, float (&x)[4], float) {
  x[0] = __uint_as_float(u.x);
  x[1] = __uint_as_float(u.y);
  x[2] = __uint_as_float(u.z);
  x[3] = __uint_as_float(u.w);
}

__device__ __forceinline__ uint32_t pack2_bf16(float lo, float hi) {
  uint32_t w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
}
__device__ __forceinline__ uint4 pack(const float (&g)[8], bf16_t) {
  return make_uint4(pack2_bf16(g[0], g[1]), pack2_bf16(g[2], g[3]), pack2_bf16(g[4], g[5]),
                    pack2_bf16(g[6], g[7]));
}
__device__ __forceinline__ uint4 pack(const float (&g)[4], float) {
  return make_uint4(__float_as_uint(g[0]), __float_as_uint(g[1]), __float_as_uint(g[2]),
                    __float_as_uint(g[3]));
}

// A vector of -inf: padding that changes neither the max nor the sum.
template <typename T>
__device__ __forceinline__ uint4 neg_inf_vec() {
  constexpr uint32_t w = sizeof(T) == 2 ? 0xff80ff80u : 0xff800000u;
  return make_uint4(w, w, w, w);
}

struct Stat {
  float m;  // running max
  float s;  // sum of exp(x - m)
};

// Bitwise symmetric in its arguments (explicit roundings, no FMA contraction), so a butterfly
// leaves the same value in every lane and every block of a cluster merges to the same result.
__device__ __forceinline__ Stat merge(Stat a, Stat b) {
  const float m = fmaxf(a.m, b.m);
  const float fa = a.m == m ? 1.f : ex2(__fmul_rn(a.m - m, kLog2e));
  const float fb = b.m == m ? 1.f : ex2(__fmul_rn(b.m - m, kLog2e));
  return {m, __fadd_rn(__fmul_rn(a.s, fa), __fmul_rn(b.s, fb))};
}

__device__ __forceinline__ Stat warp_reduce(Stat st) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    st = merge(st, {__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o)});
  return st;
}

// Block-wide (m, s), the same in every thread: warp butterflies, then every thread merges the
// warps' results in warp order. red: kThreads / 32 entries of shared memory.
template <int kThreads>
__device__ __forceinline__ Stat block_reduce(Stat st, Stat* red) {
  st = warp_reduce(st);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = st;
  __syncthreads();
  Stat r = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) r = merge(r, red[w]);
  return r;
}

// Folds a batch of values into the running statistic: one rescale at most per batch.
template <int N>
__device__ __forceinline__ void accumulate(Stat& st, const float (&x)[N]) {
  float bm = x[0];
#pragma unroll
  for (int j = 1; j < N; ++j) bm = fmaxf(bm, x[j]);
  if (bm == -INFINITY) return;  // only -inf (or padding): adds nothing, and keeps m = -inf legal
  if (bm > st.m) {
    st.s *= ex2((st.m - bm) * kLog2e);  // 0 while m is still -inf
    st.m = bm;
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // independent partial sums for ILP
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j % 4] += ex2((x[j] - st.m) * kLog2e);
  st.s += (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// kU 16-byte vectors as one flat batch of values.
template <typename T, int kU>
__device__ __forceinline__ void unpack_batch(const uint4 (&u)[kU], float (&x)[kU * kVec<T>]) {
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    float v[kVec<T>];
    unpack(u[k], v, T{});
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) x[k * kVec<T> + j] = v[j];
  }
}

// The gradient of one row is grad_scale * ((1 + 2 z lse) p_v - (1 - eps) [v == label] - eps / V)
// = a p_v - b - (label ? c : 0): GradCoef holds a, b and b + c (the label's subtrahend). With
// z = eps = 0: a = grad_scale, b = 0, b + c = grad_scale, so p a - b rounds as p * grad_scale.
struct GradCoef {
  float a;   // grad_scale (1 + 2 z lse)
  float b;   // grad_scale eps / V
  float bc;  // grad_scale (eps / V + 1 - eps)
};
// lse is read only when z_loss != 0.
__device__ __forceinline__ GradCoef grad_coef(float scale, float z_loss, float lse, float eps,
                                              float inv_vocab) {
  const float a = z_loss != 0.f ? scale * fmaf(2.f * z_loss, lse, 1.f) : scale;
  if (eps == 0.f) return {a, 0.f, scale};
  const float b = eps * inv_vocab;
  return {a, scale * b, scale * (b + (1.f - eps))};
}

// softmax(x) = exp2((x - m) * log2e - log2 s); `col` is the row index of the vector's first
// element; the label's element gets p a - (b + c), one rounding (fma), exact in p - 1 for p near
// 1 when a = c.
template <typename T>
__device__ __forceinline__ uint4 grad_vec(const uint4& u, int col, int label, float m, float l2s,
                                          const GradCoef& k) {
  float x[kVec<T>], p[kVec<T>], g[kVec<T>];
  unpack(u, x, T{});
#pragma unroll
  for (int j = 0; j < kVec<T>; ++j) {
    p[j] = ex2(fmaf(x[j] - m, kLog2e, -l2s));
    g[j] = fmaf(p[j], k.a, -k.b);
  }
  if (static_cast<unsigned>(label - col) < static_cast<unsigned>(kVec<T>)) {
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j)
      if (col + j == label) g[j] = fmaf(p[j], k.a, -k.bc);
  }
  return pack(g, T{});
}

__device__ __forceinline__ float grad_scalar(float x, bool is_label, float m, float l2s,
                                             const GradCoef& k) {
  const float p = ex2(fmaf(x - m, kLog2e, -l2s));
  return fmaf(p, k.a, is_label ? -k.bc : -k.b);
}

// Block-wide sum, the same in every thread: warp butterflies, then the warps' sums in warp
// order. red: kThreads / 32 floats of shared memory, not shared with another reduction in
// flight.
template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) r += red[w];
  return r;
}

// Adds x - x0 of every valid value of a batch of kU vectors (vector k valid when bit k of
// `valid` is set): the sum of a row's logits relative to a reference x0 (label smoothing's
// mean), exact to f32 rounding whatever the logits' magnitude.
template <typename T, int kU>
__device__ __forceinline__ void add_relative(float& acc, const float (&x)[kU * kVec<T>],
                                             unsigned valid, float x0) {
#pragma unroll
  for (int k = 0; k < kU; ++k)
    if (valid >> k & 1u) {
#pragma unroll
      for (int j = 0; j < kVec<T>; ++j) acc += x[k * kVec<T> + j] - x0;
    }
}

// The (max, sum of exp) of a row streamed by a group of kGroup threads (a warp, or the whole
// block of kThreads), kU 16-byte vectors in flight per thread: the body's nvec vectors from
// `lane` on, and the thread's extra element xe (-inf: none). with_sum also adds x - x0 over the
// body's values into xsum (the caller seeds it with the extra element's). Both come back reduced
// over the group, the same in each of its threads.
template <typename T, int kGroup, int kThreads, int kU>
__device__ __forceinline__ Stat stream_row_stats(const uint4* body, int nvec, int lane, float xe,
                                                 bool with_sum, float x0, float& xsum) {
  static_assert(kGroup == 32 || kGroup == kThreads);
  Stat st{-INFINITY, 0.f};
  for (int i = lane; i < nvec; i += kGroup * kU) {
    uint4 u[kU];
    unsigned valid = 0;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int j = i + k * kGroup;
      u[k] = j < nvec ? body[j] : neg_inf_vec<T>();
      valid |= static_cast<unsigned>(j < nvec) << k;
    }
    float v[kU * kVec<T>];
    unpack_batch<T>(u, v);
    accumulate(st, v);
    if (with_sum) add_relative<T, kU>(xsum, v, valid, x0);
  }
  {
    const float e[1] = {xe};
    accumulate(st, e);
  }
  if constexpr (kGroup == 32) {
    st = warp_reduce(st);
    if (with_sum)
      for (int o = 16; o > 0; o >>= 1) xsum += __shfl_xor_sync(0xffffffffu, xsum, o);
  } else {
    __shared__ Stat red[kThreads / 32];
    __shared__ float red_sum[kThreads / 32];
    st = block_reduce<kThreads>(st, red);
    if (with_sum) xsum = block_sum<kThreads>(xsum, red_sum);
  }
  return st;
}

// The row's label, or -1 when it is out of range (flagged once per row by `reporter`: the
// smallest (row << 32 | label) over bad rows goes to p.bad_label). P: a loss kernel's parameters
// (labels, vocab, bad_label).
template <typename P>
__device__ __forceinline__ int checked_label(const P& p, int64_t row, bool reporter) {
  const int label = p.labels[row];
  if (static_cast<unsigned>(label) < static_cast<unsigned>(p.vocab)) return label;
  if (reporter)
    atomicMin(p.bad_label,
              (static_cast<unsigned long long>(row) << 32) | static_cast<uint32_t>(label));
  return -1;
}

// A row as [head scalars][nvec 16-byte vectors][tail scalars].
struct RowLayout {
  int head, nvec, tail;
};
template <typename T>
__device__ __forceinline__ RowLayout row_layout(const T* row, int vocab) {
  const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(row) & 15) / sizeof(T));
  const int head = min(mis ? kVec<T> - mis : 0, vocab);
  const int nvec = (vocab - head) / kVec<T>;
  return {head, nvec, vocab - head - nvec * kVec<T>};
}
// Column of scalar e in [0, head + tail).
template <typename T>
__device__ __forceinline__ int extra_col(int e, const RowLayout& l) {
  return e < l.head ? e : l.head + l.nvec * kVec<T> + (e - l.head);
}

}  // namespace engine::cuda::ce
