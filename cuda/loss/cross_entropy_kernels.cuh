// Device side of the fused cross-entropy: the kernels' parameters, their constants, the device
// helpers and the WarpRows / BlockRows and Cluster kernels. The design (paths, exchange,
// limits) is described at the top of cross_entropy.cu, which holds the host side (plans and
// launches) and is the only file that includes this one (its definitions are file-local).
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/arch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/loss/bulk_copy.cuh"
#include "cuda/loss/ce_device.cuh"

namespace cg = cooperative_groups;

namespace engine::cuda {
namespace {

using namespace ce;  // the shared device helpers (ce_device.cuh, bulk_copy.cuh)

constexpr int kUnroll = 4;                   // streaming paths: 16-byte loads in flight per thread
constexpr int kWarpRowsThreads = 256;        // WarpRows: 8 rows of one warp each per block
constexpr int kBlockRowsThreads = 512;       // BlockRows: one row per block
constexpr int kClusterThreads = 256;         // Cluster: one slice per block
constexpr int kChunkVecs = 1024;             // Cluster: 16 KB per bulk copy and mbarrier
constexpr int kMaxChunks = 16;               // 16 x 16 KB > 227 KB, the largest slice
constexpr int64_t kWarpRowsMaxBytes = 4096;  // Auto: rows up to this take WarpRows
constexpr int64_t kAutoSliceBytes = 72 * 1024;  // Auto: preferred Cluster slice (3 per SM)
constexpr int64_t kAutoSoloBytes = 110 * 1024;  // Auto: rows taken by one block (2 per SM)
static_assert(kChunkVecs % kClusterThreads == 0);

// Everything a kernel needs (one struct for every kernel).
struct CeParams {
  void* logits;                   // (T, V) bf16 or f32; gradient written in place
  const int32_t* labels;          // (T)
  const uint8_t* mask;            // (T)
  float* losses;                  // (T)
  unsigned long long* bad_label;  // (1) min over bad rows of (row << 32 | label), else ~0
  int64_t rows;                   // T
  int64_t ld;                     // row stride in elements (>= V: padded rows)
  int32_t vocab;                  // V
  int32_t cluster;                // Cluster: blocks per row (C), else 1
  int32_t slice_vecs;             // Cluster: 16-byte vectors per block, >= ceil(nvec / C)
  float grad_scale;
  float z_loss;     // z: + z lse^2 per row
  float eps;        // label smoothing
  float inv_vocab;  // 1 / V
  bool with_grad;
};

// ---------------------------------------------------------------------------------------------
// Device helpers of the fused kernels (the shared ones are in ce_device.cuh).

// The row's loss from (m, s), the label's logit and (label smoothing only) m - mean_v x_v.
__device__ __forceinline__ float row_loss(const CeParams& p, Stat st, float x_label, int label,
                                          float m_minus_mean) {
  if (label < 0) return __int_as_float(0x7fffffff);
  const float ls = log2f(st.s) * kLn2;
  float l = p.eps != 0.f ? fmaf(1.f - p.eps, st.m - x_label, p.eps * m_minus_mean) + ls
                         : (st.m - x_label) + ls;
  if (p.z_loss != 0.f) {
    const float lse = st.m + ls;
    l = fmaf(p.z_loss * lse, lse, l);
  }
  return l;
}

// The row's gradient coefficients (ce_device.cuh) from its (m, s).
__device__ __forceinline__ GradCoef row_coef(const CeParams& p, Stat st) {
  return grad_coef(p.grad_scale, p.z_loss, st.m + log2f(st.s) * kLn2, p.eps, p.inv_vocab);
}

// The Cluster kernel and its exchange helpers need thread-block clusters and bulk copies
// (ENGINE_ARCH_SM90, cuda/common/arch.cuh); elsewhere the kernel is a trap that the plan never
// picks (cross_entropy.cu: no Cluster plan without arch::current().clusters).
#ifdef ENGINE_ARCH_SM90
// Cluster paths (C > 1): the row's (m, s) and (label smoothing) sum of x - x0 from the block
// totals `st` and `xsum` (the same in every thread) of the C blocks, merged in rank order through
// distributed shared memory, the same in every thread of the cluster. Returns with this block
// arrived at the cluster barrier: the caller waits on it (barrier_wait) before it exits, so that
// no block leaves while another may still read its shared memory.
__device__ __forceinline__ void cluster_merge(int C, bool smooth, Stat& st, float& xsum,
                                              Stat* block_stat, float* block_xsum) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) {
    *block_stat = st;
    *block_xsum = xsum;
  }
  cluster.sync();  // release/acquire: every block's block_stat is visible
  st = *cluster.map_shared_rank(block_stat, 0);
  for (int r = 1; r < C; ++r) st = merge(st, *cluster.map_shared_rank(block_stat, r));
  if (smooth) {
    xsum = *cluster.map_shared_rank(block_xsum, 0);
    for (int r = 1; r < C; ++r) xsum += *cluster.map_shared_rank(block_xsum, r);
  }
  // Done reading the other blocks' shared memory; the matching wait (before exit) keeps
  // every block alive until all have read.
  cluster.barrier_arrive();
}

// The push exchange (ClusterExchange::Push): block r's (m, s, sum of x - x0) lands in slot r of
// every block's PushSlots, completing on its barrier (armed by its own thread 0 for the
// (C - 1) x 16 bytes of the other blocks; its own slot is a plain store before that arrival). Thread 0 initialises the barrier (push_init) before fence_mbar_init; every thread then
// arrives once at the cluster barrier (cluster_arrive_relaxed), and cluster_push_merge waits on
// that phase before pushing: every block's barrier is initialised by then.
struct PushSlots {
  uint4 slot[8];
  uint64_t bar;
  float label_logit;  // Cluster: x[label] (rank 0), parked (see cluster_push_merge)
};
__device__ __forceinline__ void push_init(PushSlots& x) { mbar_init(&x.bar, 1); }

// As cluster_merge (same merge order, so bitwise the same result), with pushes instead of reads
// of the other blocks' shared memory after a fenced barrier. Returns with every thread arrived
// at the next cluster barrier phase: the caller waits on it (cluster_wait) before it exits.
// Without cluster_merge's fence, a read of another block's elements (x[label], x[0]) must have
// its value used before the block's __syncthreads ahead of this call (stored to shared memory,
// summed into a reduced value), so that it is complete before the pushes release the other
// blocks to overwrite those elements with their gradient.
__device__ __forceinline__ void cluster_push_merge(int C, int rank, bool smooth, Stat& st,
                                                   float& xsum, PushSlots& x) {
  const int tid = static_cast<int>(threadIdx.x);
  cluster_wait();  // every block's barrier is initialised
  const uint4 mine =
      make_uint4(__float_as_uint(st.m), __float_as_uint(st.s), __float_as_uint(xsum), 0u);
  if (tid == 0) {  // this block's own slot: a plain store, released by the arrival
    x.slot[rank] = mine;
    mbar_expect_tx(&x.bar, static_cast<uint32_t>(C - 1) * 16u);
  } else if (tid < C) {  // thread i pushes to block rank + i (mod C)
    const uint32_t dst = static_cast<uint32_t>((rank + tid) % C);
    st_async(cluster_addr(&x.slot[rank], dst), mine, cluster_addr(&x.bar, dst));
  }
  // The exit guard: no block leaves before every block has pushed (the pushes into a block's
  // shared memory complete before it reads them, so it is alive while they land).
  cluster_arrive_relaxed();
  mbar_wait_cluster(&x.bar, 0);
  uint4 v = x.slot[0];
  st = {__uint_as_float(v.x), __uint_as_float(v.y)};
  if (smooth) xsum = __uint_as_float(v.z);
  for (int r = 1; r < C; ++r) {
    v = x.slot[r];
    st = merge(st, {__uint_as_float(v.x), __uint_as_float(v.y)});
    if (smooth) xsum += __uint_as_float(v.z);
  }
}

#endif  // ENGINE_ARCH_SM90

// ---------------------------------------------------------------------------------------------
// WarpRows (kGroup = 32) and BlockRows (kGroup = kThreads): kGroup threads stream one row.

template <typename T, int kGroup, int kThreads>
__global__ void __launch_bounds__(kThreads) ce_rows_kernel(const CeParams p) {
  static_assert(kGroup == 32 || kGroup == kThreads);
  constexpr int kN = kVec<T>;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup) + threadIdx.x / kGroup;
  if (row >= p.rows) return;  // whole groups only: a block-wide group never leaves early here
  T* x = static_cast<T*>(p.logits) + row * p.ld;
  const RowLayout l = row_layout(x, p.vocab);
  uint4* body = reinterpret_cast<uint4*>(x + l.head);
  const int ecol = lane < l.head + l.tail ? extra_col<T>(lane, l) : -1;

  if (!p.mask[row]) {
    if (lane == 0) p.losses[row] = 0.f;
    if (p.with_grad) {
      for (int i = lane; i < l.nvec; i += kGroup) body[i] = make_uint4(0, 0, 0, 0);
      if (ecol >= 0) x[ecol] = from_float<T>(0.f);
    }
    return;
  }
  const int label = checked_label(p, row, lane == 0);
  const float x_label = lane == 0 && label >= 0 ? to_float(x[label]) : 0.f;
  const float xe = ecol >= 0 ? to_float(x[ecol]) : -INFINITY;
  const bool smooth = p.eps != 0.f;
  const float x0 = smooth ? to_float(x[0]) : 0.f;  // label smoothing's reference logit
  float xsum = smooth && ecol >= 0 ? xe - x0 : 0.f;

  const Stat st =
      stream_row_stats<T, kGroup, kThreads, kUnroll>(body, l.nvec, lane, xe, smooth, x0, xsum);
  if (lane == 0) p.losses[row] = row_loss(p, st, x_label, label, (st.m - x0) - xsum * p.inv_vocab);
  if (!p.with_grad) return;
  // Lane 0's read of x[label] is ordered before the writes below: by __syncthreads in
  // block_reduce, and here for the warp.
  if constexpr (kGroup == 32) __syncwarp();

  const float l2s = log2f(st.s);
  const GradCoef coef = row_coef(p, st);
  for (int i = lane; i < l.nvec; i += kGroup * kUnroll) {
    uint4 u[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = i + k * kGroup;
      if (j < l.nvec) u[k] = body[j];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = i + k * kGroup;
      if (j < l.nvec) body[j] = grad_vec<T>(u[k], l.head + j * kN, label, st.m, l2s, coef);
    }
  }
  if (ecol >= 0) x[ecol] = from_float<T>(grad_scalar(xe, ecol == label, st.m, l2s, coef));
}

// ---------------------------------------------------------------------------------------------
// Cluster: C blocks per row, each holding slice [v0, v0 + n) of the row's vectors in shared
// memory (dynamic, p.slice_vecs * 16 bytes), filled by bulk copies completing on mbarriers.

template <typename T, bool kPush>
__global__ void __launch_bounds__(kClusterThreads) ce_cluster_kernel(const CeParams p) {
#ifdef ENGINE_ARCH_SM90
  constexpr int kN = kVec<T>;
  constexpr int kPerThread = kChunkVecs / kClusterThreads;  // vectors per thread per chunk
  extern __shared__ __align__(128) uint4 slice[];
  __shared__ uint64_t bars[kMaxChunks];
  __shared__ Stat red[kClusterThreads / 32];
  __shared__ float red_sum[kClusterThreads / 32];
  __shared__ Stat block_stat;   // this block's (m, s), read by the whole cluster
  __shared__ float block_xsum;  // this block's sum of x - x0 (label smoothing), likewise
  __shared__ PushSlots push;    // kPush: the blocks' totals

  const int C = p.cluster;
  const int rank = C > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t row = static_cast<int64_t>(blockIdx.x) / C;
  T* x = static_cast<T*>(p.logits) + row * p.ld;
  const RowLayout l = row_layout(x, p.vocab);
  uint4* body = reinterpret_cast<uint4*>(x + l.head);
  const int v0 = min(rank * p.slice_vecs, l.nvec);
  const int n = min(l.nvec - v0, p.slice_vecs);
  const int ecol = rank == 0 && tid < l.head + l.tail ? extra_col<T>(tid, l) : -1;

  // Masked: the whole cluster leaves here together, before any cluster barrier.
  if (!p.mask[row]) {
    if (rank == 0 && tid == 0) p.losses[row] = 0.f;
    if (p.with_grad) {
      for (int i = tid; i < n; i += kClusterThreads) body[v0 + i] = make_uint4(0, 0, 0, 0);
      if (ecol >= 0) x[ecol] = from_float<T>(0.f);
    }
    return;
  }

  const int nchunks = (n + kChunkVecs - 1) / kChunkVecs;
  if (tid == 0) {
    for (int c = 0; c < nchunks; ++c) mbar_init(&bars[c], 1);
    if constexpr (kPush)
      if (C > 1) push_init(push);
    fence_mbar_init();
  }
  __syncthreads();
  if constexpr (kPush)
    if (C > 1) cluster_arrive_relaxed();  // cluster_push_merge waits on it
  if (tid == 0) {
    for (int c = 0; c < nchunks; ++c) {
      const uint32_t bytes = static_cast<uint32_t>(min(kChunkVecs, n - c * kChunkVecs)) * 16u;
      mbar_expect_tx(&bars[c], bytes);
      bulk_load(slice + c * kChunkVecs, body + v0 + c * kChunkVecs, bytes, &bars[c]);
    }
  }
  const bool reporter = rank == 0 && tid == 0;
  const int label = checked_label(p, row, reporter);
  float x_label = reporter && label >= 0 ? to_float(x[label]) : 0.f;
  if constexpr (kPush)  // the value, hence the read, complete before the exchange (see there)
    if (reporter) push.label_logit = x_label;
  const float xe = ecol >= 0 ? to_float(x[ecol]) : -INFINITY;
  const bool smooth = p.eps != 0.f;
  const float x0 = smooth ? to_float(x[0]) : 0.f;  // label smoothing's reference logit
  float xsum = smooth && ecol >= 0 ? xe - x0 : 0.f;

  Stat st{-INFINITY, 0.f};
  for (int c = 0; c < nchunks; ++c) {
    mbar_wait(&bars[c], 0);
    uint4 u[kPerThread];
    unsigned valid = 0;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = c * kChunkVecs + k * kClusterThreads + tid;
      u[k] = i < n ? slice[i] : neg_inf_vec<T>();
      valid |= static_cast<unsigned>(i < n) << k;
    }
    float v[kPerThread * kN];
    unpack_batch<T>(u, v);
    accumulate(st, v);
    if (smooth) add_relative<T, kPerThread>(xsum, v, valid, x0);
  }
  {
    const float e[1] = {xe};
    accumulate(st, e);
  }
  st = block_reduce<kClusterThreads>(st, red);
  if (smooth) xsum = block_sum<kClusterThreads>(xsum, red_sum);
  if (C > 1) {
    if constexpr (kPush)
      cluster_push_merge(C, rank, smooth, st, xsum, push);
    else
      cluster_merge(C, smooth, st, xsum, &block_stat, &block_xsum);
  }
  if constexpr (kPush)
    if (reporter) x_label = push.label_logit;
  if (reporter) p.losses[row] = row_loss(p, st, x_label, label, (st.m - x0) - xsum * p.inv_vocab);

  if (p.with_grad) {
    const float l2s = log2f(st.s);
    const GradCoef coef = row_coef(p, st);
#pragma unroll 4
    for (int i = tid; i < n; i += kClusterThreads)
      body[v0 + i] = grad_vec<T>(slice[i], l.head + (v0 + i) * kN, label, st.m, l2s, coef);
    if (ecol >= 0) x[ecol] = from_float<T>(grad_scalar(xe, ecol == label, st.m, l2s, coef));
  }
  if (C > 1) cg::this_cluster().barrier_wait();  // (kPush too: the same barrier.cluster.wait)
#else
  ENGINE_ARCH_UNAVAILABLE();
#endif  // ENGINE_ARCH_SM90
}

}  // namespace
}  // namespace engine::cuda
