// Fused cross-entropy with its gradient in place over the logits (launcher contract in
// cross_entropy.cuh; CPU reference csrc/ref/loss.cpp). Per masked-in row of x = logits (T, V):
//   pass 1   m = max_v x_v,  s = sum_v exp(x_v - m)   one read, online: whenever a batch of
//            values raises the running max, s is rescaled by exp(m_old - m_new) first;
//            partial (m, s) pairs merge as (max, s_a e^(m_a - m) + s_b e^(m_b - m))
//   loss     (m - x_label) + log s                      (= lse - x_label, f32)
//            with label smoothing eps: (1 - eps)(m - x_label) + eps (m - mean_v x_v) + log s,
//            the mean from a sum of x_v - x_0 (x_0 the row's first logit) taken in pass 1;
//            with z-loss z: + z lse^2, lse = m + log s
//   pass 2   x_v <- grad_scale * ((1 + 2 z lse) exp((x_v - m) - log s) - (1 - eps)[v == label]
//            - eps / V)   in the logits' dtype (z = eps = 0: softmax - onehot)
// exp is ex2.approx on (x - m) * log2(e): x - m is formed first so that logits of any magnitude
// (|x| ~ 1e3) keep f32 accuracy in the exponent. All statistics are f32; rows never exist in
// f32 in memory; scratch is one 8-byte flag (bad labels), so memory is O(1) beyond the tensors.
//
// Memory traffic per masked-in row of B = V * sizeof(logit) bytes (with_grad; without it pass
// 2 is skipped and every path reads the row once):
//   WarpRows   read B, re-read B (mostly from L1/L2: a warp re-reads its own few-KB row at
//              once), write B. 8 rows per 256-thread block; for rows up to 4 KB.
//   BlockRows  read B, re-read B, write B: 3 B from DRAM once the rows in flight outgrow L2 (a
//              fused in-place kernel that keeps nothing on chip cannot do better than two
//              reads and one write). Fallback for rows too large for the cluster path.
//   Cluster    a cluster of C in {1, 2, 4, 8} blocks per row; block r copies its slice of the
//              row (V / C elements) into shared memory with bulk copies (cp.async.bulk, 16 KB
//              per mbarrier, all issued at once), reduces it while the chunks land, the blocks
//              exchange (m, s) through distributed shared memory, and each writes its slice's
//              gradient from shared memory: read B + write B, the bytes floor. Auto takes C = 1
//              (no exchange) while two such blocks fit on a multiprocessor (rows <= 110 KB),
//              else the smallest C whose slice is <= 72 KB (3 blocks per SM): 32000 and 50304
//              bf16 -> C = 1, 128256 bf16 -> C = 4 (62.6 KB). The exchange costs more than the
//              blocks per SM win: on one H200, 32768 x 50304 bf16 fwd+grad took 1.63 ms with
//              C = 1 (98 KB, 2 blocks per SM) against 1.85 ms with C = 2 (49 KB, 4 per SM), and
//              16384 x 128256 2.56 ms with C = 4 against 2.75 ms with C = 3 (2 per SM) and
//              2.88 ms with C = 2; clusters of 5-7 blocks (4-6 per SM) were slower than 4 too.
// Rows are 16-byte vectors (8 bf16 or 4 f32) from the first 16-byte-aligned element; the up to
// 2 x 7 elements before and after the vectors (rows of odd V are not aligned) are scalars,
// one per thread. Masked rows read nothing but the mask and write zeros.
//
// Limits: logits bf16 or f32, contiguous, element-aligned; 0 < V <= 2^31 - 1; T * C < 2^31
// blocks; Cluster slices up to the device's shared memory per block (227 KB on H100/H200:
// V <= 8 x 227 KB / sizeof(logit)); larger rows take BlockRows. Results are deterministic
// (fixed reduction order, no float atomics). A bad label makes that row's loss NaN and drops
// its one-hot term; the launcher reads the flag back and raises. The per-device limits and
// the cluster-occupancy answers are cached for the first device that asks (one GPU per
// process).
#include "cuda/loss/cross_entropy.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/loss/bulk_copy.cuh"
#include "cuda/loss/cluster_launch.cuh"
#include "cuda/loss/ce_device.cuh"
#include "ops/loss.h"

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

// Everything a kernel needs (one struct for all three kernels).
struct CeParams {
  void* logits;                   // (T, V) bf16 or f32; gradient written in place
  const int32_t* labels;          // (T)
  const uint8_t* mask;            // (T)
  float* losses;                  // (T)
  unsigned long long* bad_label;  // (1) min over bad rows of (row << 32 | label), else ~0
  int64_t rows;                   // T
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

// The row's label, or -1 when it is out of range (flagged once per row by `reporter`).
__device__ __forceinline__ int checked_label(const CeParams& p, int64_t row, bool reporter) {
  const int label = p.labels[row];
  if (static_cast<unsigned>(label) < static_cast<unsigned>(p.vocab)) return label;
  if (reporter)
    atomicMin(p.bad_label,
              (static_cast<unsigned long long>(row) << 32) | static_cast<uint32_t>(label));
  return -1;
}

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

// ---------------------------------------------------------------------------------------------
// WarpRows (kGroup = 32) and BlockRows (kGroup = kThreads): kGroup threads stream one row.

template <typename T, int kGroup, int kThreads>
__global__ void __launch_bounds__(kThreads) ce_rows_kernel(const CeParams p) {
  static_assert(kGroup == 32 || kGroup == kThreads);
  constexpr int kN = kVec<T>;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup) + threadIdx.x / kGroup;
  if (row >= p.rows) return;  // whole groups only: a block-wide group never leaves early here
  T* x = static_cast<T*>(p.logits) + row * p.vocab;
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

  Stat st{-INFINITY, 0.f};
  for (int i = lane; i < l.nvec; i += kGroup * kUnroll) {
    uint4 u[kUnroll];
    unsigned valid = 0;
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = i + k * kGroup;
      u[k] = j < l.nvec ? body[j] : neg_inf_vec<T>();
      valid |= static_cast<unsigned>(j < l.nvec) << k;
    }
    float v[kUnroll * kN];
    unpack_batch<T>(u, v);
    accumulate(st, v);
    if (smooth) add_relative<T, kUnroll>(xsum, v, valid, x0);
  }
  {
    const float e[1] = {xe};
    accumulate(st, e);
  }
  if constexpr (kGroup == 32) {
    st = warp_reduce(st);
    if (smooth)
      for (int o = 16; o > 0; o >>= 1) xsum += __shfl_xor_sync(0xffffffffu, xsum, o);
  } else {
    __shared__ Stat red[kThreads / 32];
    __shared__ float red_sum[kThreads / 32];
    st = block_reduce<kThreads>(st, red);
    if (smooth) xsum = block_sum<kThreads>(xsum, red_sum);
  }
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

template <typename T>
__global__ void __launch_bounds__(kClusterThreads) ce_cluster_kernel(const CeParams p) {
  constexpr int kN = kVec<T>;
  constexpr int kPerThread = kChunkVecs / kClusterThreads;  // vectors per thread per chunk
  extern __shared__ __align__(128) uint4 slice[];
  __shared__ uint64_t bars[kMaxChunks];
  __shared__ Stat red[kClusterThreads / 32];
  __shared__ float red_sum[kClusterThreads / 32];
  __shared__ Stat block_stat;   // this block's (m, s), read by the whole cluster
  __shared__ float block_xsum;  // this block's sum of x - x0 (label smoothing), likewise

  const int C = p.cluster;
  const int rank = C > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t row = static_cast<int64_t>(blockIdx.x) / C;
  T* x = static_cast<T*>(p.logits) + row * p.vocab;
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
    fence_mbar_init();
  }
  __syncthreads();
  if (tid == 0) {
    for (int c = 0; c < nchunks; ++c) {
      const uint32_t bytes = static_cast<uint32_t>(min(kChunkVecs, n - c * kChunkVecs)) * 16u;
      mbar_expect_tx(&bars[c], bytes);
      bulk_load(slice + c * kChunkVecs, body + v0 + c * kChunkVecs, bytes, &bars[c]);
    }
  }
  const bool reporter = rank == 0 && tid == 0;
  const int label = checked_label(p, row, reporter);
  const float x_label = reporter && label >= 0 ? to_float(x[label]) : 0.f;
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
    cg::cluster_group cluster = cg::this_cluster();
    if (tid == 0) {
      block_stat = st;
      block_xsum = xsum;
    }
    cluster.sync();  // release/acquire: every block's block_stat is visible
    st = *cluster.map_shared_rank(&block_stat, 0);
    for (int r = 1; r < C; ++r) st = merge(st, *cluster.map_shared_rank(&block_stat, r));
    if (smooth) {
      xsum = *cluster.map_shared_rank(&block_xsum, 0);
      for (int r = 1; r < C; ++r) xsum += *cluster.map_shared_rank(&block_xsum, r);
    }
    // Done reading the other blocks' shared memory; the matching wait (before exit) keeps
    // every block alive until all have read.
    cluster.barrier_arrive();
  }
  if (reporter) p.losses[row] = row_loss(p, st, x_label, label, (st.m - x0) - xsum * p.inv_vocab);

  if (p.with_grad) {
    const float l2s = log2f(st.s);
    const GradCoef coef = row_coef(p, st);
#pragma unroll 4
    for (int i = tid; i < n; i += kClusterThreads)
      body[v0 + i] = grad_vec<T>(slice[i], l.head + (v0 + i) * kN, label, st.m, l2s, coef);
    if (ecol >= 0) x[ecol] = from_float<T>(grad_scalar(xe, ecol == label, st.m, l2s, coef));
  }
  if (C > 1) cg::this_cluster().barrier_wait();
}

// ---------------------------------------------------------------------------------------------
// Host side.

using KernelFn = void (*)(CeParams);

KernelFn cluster_kernel(DType dtype) {
  return dtype == DType::BF16 ? ce_cluster_kernel<bf16_t> : ce_cluster_kernel<float>;
}

// Largest dynamic shared memory a Cluster block may take (the opt-in limit less the kernel's
// static shared memory), after raising the kernels' limits to it once.
int64_t max_slice_bytes() {
  static const int64_t bytes = cluster_launch::raise_dynamic_smem(
      {reinterpret_cast<const void*>(cluster_kernel(DType::BF16)), reinterpret_cast<const void*>(cluster_kernel(DType::F32))},
      int64_t{kMaxChunks} * kChunkVecs * 16, 16);
  return bytes;
}

cudaLaunchConfig_t cluster_config(int64_t blocks, int cluster, int64_t slice_bytes,
                                  cudaLaunchAttribute* attr) {
  return cluster_launch::config(blocks, kClusterThreads, cluster, slice_bytes, stream(), attr);
}

// Whether the device can run at least one cluster of this shape (cached).
bool cluster_schedulable(DType dtype, int cluster, int64_t slice_bytes) {
  max_slice_bytes();  // raises the dynamic shared-memory limits first
  return cluster_launch::schedulable(reinterpret_cast<const void*>(cluster_kernel(dtype)), kClusterThreads, cluster,
                                     slice_bytes);
}

const char* path_name(CrossEntropyPath path) {
  switch (path) {
    case CrossEntropyPath::Auto:
      return "Auto";
    case CrossEntropyPath::WarpRows:
      return "WarpRows";
    case CrossEntropyPath::BlockRows:
      return "BlockRows";
    case CrossEntropyPath::Cluster:
      return "Cluster";
  }
  return "?";
}

}  // namespace

std::optional<CrossEntropyPlan> cross_entropy_plan(int64_t vocab, DType dtype,
                                                   CrossEntropyPath path, int cluster) {
  ENSURE(dtype == DType::BF16 || dtype == DType::F32, "cross_entropy: logits are ",
         dtype_name(dtype), ", expected bf16 or f32");
  ENSURE(vocab > 0 && vocab <= INT32_MAX, "cross_entropy: vocabulary of ", vocab,
         " outside [1, 2^31)");
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  const int64_t max_vecs = vocab * esize / 16;  // >= the vector count of any row
  auto slice = [&](int c) { return ceil_div(max_vecs, c) * 16; };
  auto fits = [&](int c) {
    return slice(c) <= max_slice_bytes() && cluster_schedulable(dtype, c, slice(c));
  };
  auto choose_cluster = [&]() -> std::optional<CrossEntropyPlan> {
    if (slice(1) <= kAutoSoloBytes && fits(1))
      return CrossEntropyPlan{CrossEntropyPath::Cluster, 1, slice(1)};
    for (int c : {1, 2, 4, 8})
      if (slice(c) <= kAutoSliceBytes && fits(c))
        return CrossEntropyPlan{CrossEntropyPath::Cluster, c, slice(c)};
    for (int c : {1, 2, 4, 8})
      if (fits(c)) return CrossEntropyPlan{CrossEntropyPath::Cluster, c, slice(c)};
    return std::nullopt;
  };
  switch (path) {
    case CrossEntropyPath::Auto:
      if (vocab * esize <= kWarpRowsMaxBytes)
        return CrossEntropyPlan{CrossEntropyPath::WarpRows, 1, 0};
      if (auto plan = choose_cluster()) return plan;
      return CrossEntropyPlan{CrossEntropyPath::BlockRows, 1, 0};
    case CrossEntropyPath::Cluster:
      if (cluster == 0) return choose_cluster();
      if ((cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) || !fits(cluster))
        return std::nullopt;
      return CrossEntropyPlan{CrossEntropyPath::Cluster, cluster, slice(cluster)};
    case CrossEntropyPath::WarpRows:
    case CrossEntropyPath::BlockRows:
      if (cluster > 1) return std::nullopt;
      return CrossEntropyPlan{path, 1, 0};
  }
  return std::nullopt;
}

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale, CrossEntropyPath path,
                   int cluster, float z_loss, float label_smoothing) {
  ENSURE(logits.device == Device::CUDA, "cross_entropy: logits are on ", device_name(logits.device),
         ", expected cuda");
  ENSURE(logits.ndim() == 2, "cross_entropy: logits must be 2-D (T, V), got shape ",
         logits.shape.str());
  ENSURE(logits.dtype == DType::BF16 || logits.dtype == DType::F32, "cross_entropy: logits are ",
         dtype_name(logits.dtype), ", expected bf16 or f32");
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(v > 0, "cross_entropy: logits has shape ", logits.shape.str(),
         ", the vocabulary is empty");
  ops::check_loss_coefficients(z_loss, label_smoothing, "cross_entropy");
  expect_cuda(labels, DType::I32, {t}, "cross_entropy", "labels");
  expect_cuda(mask, DType::U8, {t}, "cross_entropy", "mask");
  expect_cuda(losses, DType::F32, {t}, "cross_entropy", "losses");
  ENSURE(reinterpret_cast<uintptr_t>(logits.data) % dtype_size(logits.dtype) == 0,
         "cross_entropy: logits are not aligned to their element size");
  const std::optional<CrossEntropyPlan> plan = cross_entropy_plan(v, logits.dtype, path, cluster);
  ENSURE(plan.has_value(), "cross_entropy: the ", path_name(path), " path with cluster size ",
         cluster, " cannot run a row of ", v, " ", dtype_name(logits.dtype), " logits");
  if (t == 0) return;
  ENSURE(t * plan->cluster <= INT32_MAX, "cross_entropy: ", t, " rows x ", plan->cluster,
         " blocks exceed the grid");

  Owned flag = empty({1}, DType::I64, Device::CUDA);
  CUDA_CHECK(cudaMemsetAsync(flag.t.data, 0xff, sizeof(unsigned long long), stream()));
  const CeParams p{logits.data,
                   labels.ptr<int32_t>(),
                   mask.ptr<uint8_t>(),
                   losses.ptr<float>(),
                   static_cast<unsigned long long*>(flag.t.data),
                   t,
                   static_cast<int32_t>(v),
                   plan->cluster,
                   static_cast<int32_t>(plan->slice_bytes / 16),
                   grad_scale,
                   z_loss,
                   label_smoothing,
                   static_cast<float>(1.0 / static_cast<double>(v)),
                   with_grad};
  const bool bf = logits.dtype == DType::BF16;
  switch (plan->path) {
    case CrossEntropyPath::WarpRows: {
      constexpr int kRows = kWarpRowsThreads / 32;
      const auto kernel = bf ? ce_rows_kernel<bf16_t, 32, kWarpRowsThreads>
                             : ce_rows_kernel<float, 32, kWarpRowsThreads>;
      kernel<<<static_cast<unsigned>(ceil_div(t, kRows)), kWarpRowsThreads, 0, stream()>>>(p);
      check_launch("cross_entropy (WarpRows)");
      break;
    }
    case CrossEntropyPath::BlockRows: {
      const auto kernel = bf ? ce_rows_kernel<bf16_t, kBlockRowsThreads, kBlockRowsThreads>
                             : ce_rows_kernel<float, kBlockRowsThreads, kBlockRowsThreads>;
      kernel<<<static_cast<unsigned>(t), kBlockRowsThreads, 0, stream()>>>(p);
      check_launch("cross_entropy (BlockRows)");
      break;
    }
    case CrossEntropyPath::Cluster: {
      max_slice_bytes();  // raises the dynamic shared-memory limit once
      cudaLaunchAttribute attr{};
      const cudaLaunchConfig_t cfg =
          cluster_config(t * plan->cluster, plan->cluster, plan->slice_bytes, &attr);
      CUDA_CHECK(cudaLaunchKernelEx(&cfg, cluster_kernel(logits.dtype), p));
      check_launch("cross_entropy (Cluster)");
      break;
    }
    case CrossEntropyPath::Auto:
      RAISE("cross_entropy: unresolved plan");
  }

  unsigned long long bad = 0;
  copy_bytes(&bad, false, flag.t.data, true, sizeof bad);  // synchronises the compute stream
  if (bad != ~0ull) {
    const int64_t pos = static_cast<int64_t>(bad >> 32);
    const int32_t label = static_cast<int32_t>(static_cast<uint32_t>(bad & 0xffffffffu));
    RAISE("cross_entropy: labels[", pos, "] = ", label, " out of range [0, ", v,
          ") at a masked-in token (position ", pos, ")");
  }
}

}  // namespace engine::cuda
