// Fused distillation loss with its gradient in place over the student's logits (contract and
// formulas: csrc/ops/loss.h; the CUDA-only entry points and the paths: distillation.cuh; CPU
// reference csrc/ref/loss.cpp).
// Per masked-in row of x = logits (T, V) and y = teacher (T, V):
//   pass 1   the statistics of distill_device.cuh over (x_v, y_v) pairs, reading each row once:
//            online maxima of x and y, sums of 2^(a - ma) and 2^(b - mb) (a, b the tempered
//            logits in log2 units relative to the row's first logits), the kind's weighted sum,
//            and with a label term the untempered sum (tau != 1) and the label's logit; the
//            threads' (and a cluster's blocks') statistics merge in a fixed order
//   loss     the statistics as one shard's partial, combined (distill_device.cuh's combine)
//   pass 2   x_v <- grad_scale (label_weight dC/dx_v + distill_weight dD/dx_v), in the
//            logits' dtype, from (x_v, y_v) and the row's constants (DGrad)
// All statistics are f32; rows never exist in f32 in memory; scratch is the bad-label flag (8
// bytes, only with a label term), so memory is O(1) beyond the tensors.
//
// Memory traffic per masked-in row of B = V * sizeof(logit) bytes per tensor (with_grad;
// without it pass 2 is skipped and every path reads 2 B):
//   WarpRows   read 2 B, re-read 2 B (mostly from L1/L2: a warp re-reads its own few-KB rows at
//              once), write B. 8 rows per 256-thread block; for rows up to 4 KB.
//   BlockRows  read 2 B, re-read 2 B, write B: 5 B from DRAM once the rows in flight outgrow L2.
//              The fallback for rows too large for the cluster path and for a teacher whose rows
//              sit at another 16-byte offset than the logits' (then every element is a scalar
//              load: correct, slow).
//   Cluster    a cluster of C in {1, 2, 4, 8} blocks per row; block r copies its slices of both
//              rows (V / C elements each) into shared memory with bulk copies (16 KB per tensor
//              per mbarrier, all issued at once), reduces them while the chunks land, the blocks
//              exchange their statistics through distributed shared memory, and each writes its
//              slice's gradient from shared memory: read 2 B + write B, the bytes floor. Auto
//              takes the smallest C <= 4 whose two slices are <= 72 KB (3 blocks per SM), e.g.
//              50257 bf16 -> C = 4, 32000 bf16 -> C = 2, and BlockRows beyond: where C = 8 would
//              be needed (128256 bf16) BlockRows is faster (figures: docs/PERF.md), as the
//              cross-entropy's C = 8 is slower than its C = 4 (8-block clusters schedule
//              poorly). Tests and benchmarks may force C = 8 or slices beyond 72 KB (the same
//              kernel).
// Rows are 16-byte vectors (8 bf16 or 4 f32) from the first 16-byte-aligned element (the same
// for x and y when their rows are co-aligned); the up to 2 x 7 elements before and after the
// vectors are scalars. Masked rows read nothing but the mask and write zeros.
//
// Limits: logits and teacher bf16 or f32, contiguous, element-aligned, finite; 0 < V < 2^31;
// T * C < 2^31 blocks; Cluster slices up to the device's shared memory per block. Results are
// deterministic (fixed reduction orders, no float atomics). A bad label makes that row's loss NaN
// and drops its one-hot term; the launcher reads the flag back and raises.
// The shared preconditions ran before (ops/loss.cpp); the launcher checks what is its own:
// logits bf16 or f32, both tensors element-aligned, T < 2^31, a plan that holds the row.
#include "cuda/loss/distillation.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/buffer.h"
#include "cuda/common/arch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/loss/bulk_copy.cuh"
#include "cuda/loss/cluster_launch.cuh"
#include "cuda/loss/ce_device.cuh"
#include "cuda/loss/distill_device.cuh"

namespace cg = cooperative_groups;

namespace engine::cuda {
namespace {

using namespace ce;
using dl::DConst;
using dl::DGrad;
using dl::DPart;
using dl::DRow;
using dl::DStat;
using dl::Frame;

constexpr int kUnroll = 4;                   // streaming paths: vector pairs in flight per thread
constexpr int kWarpRowsThreads = 256;        // WarpRows: 8 rows of one warp each per block
constexpr int kBlockRowsThreads = 256;       // BlockRows: one row per block
constexpr int kClusterThreads = 256;         // Cluster: one slice pair per block
constexpr int kChunkVecs = 1024;             // Cluster: 16 KB per tensor per bulk copy pair
constexpr int kMaxChunks = 8;                // 2 x 8 x 16 KB > 227 KB, the largest slice pair
constexpr int64_t kWarpRowsMaxBytes = 4096;  // Auto: rows up to this take WarpRows
constexpr int64_t kAutoSliceBytes = 72 * 1024;  // Auto: preferred Cluster slice pair (3 per SM)
constexpr int kAutoMaxCluster = 4;              // Auto: larger clusters lost to BlockRows
static_assert(kChunkVecs % kClusterThreads == 0);

struct DlParams {
  void* logits;                   // (T, V) bf16 or f32; gradient written in place
  const void* teacher;            // (T, V) same dtype
  const int32_t* labels;          // (T), null without a label term
  const uint8_t* mask;            // (T)
  float* losses;                  // (T)
  float* distill_losses;          // (T) or null
  unsigned long long* bad_label;  // (1) min over bad rows of (row << 32 | label), else ~0
  int64_t rows;                   // T
  int32_t vocab;                  // V
  int32_t cluster;                // Cluster: blocks per row (C), else 1
  int32_t slice_vecs;             // Cluster: 16-byte vectors per tensor per block
  bool vec;                       // rows of x and y co-aligned: 16-byte vectors
  DConst c;
  float grad_scale;
  bool with_grad;
};

__device__ __forceinline__ Frame make_frame(const DlParams& p, float x0, float y0) {
  Frame f;
  f.k = kLog2e * p.c.inv_tau;
  f.tau = p.c.tau;
  f.xr = x0 * f.k;
  f.yr = y0 * f.k;
  f.kind = p.c.kind;
  f.sx = p.c.label && p.c.tau != 1.f;
  return f;
}

// The row's statistics as one shard, combined; the loss written by `writer`.
__device__ __forceinline__ DRow finish_row(const DlParams& p, const DStat& st, const Frame& f,
                                           int64_t row, int label, float x_label, bool writer) {
  const DPart part = dl::to_part(st, f, p.c.label);
  const DRow r = dl::combine(
      1, [&](int) { return part; }, x_label, p.c);
  if (writer) {
    p.losses[row] = p.c.label && label < 0 ? __int_as_float(0x7fffffff) : r.total;
    if (p.distill_losses) p.distill_losses[row] = r.d;
  }
  return r;
}

__device__ __forceinline__ DGrad row_grad(const DlParams& p, const DRow& r) {
  return dl::make_grad(r.mx, r.lsx, r.lss, r.my, r.lsq, r.c, p.c, p.grad_scale);
}

// ---------------------------------------------------------------------------------------------
// WarpRows (kGroup = 32) and BlockRows (kGroup = kThreads): kGroup threads stream one row pair.

template <typename T, int kGroup, int kThreads>
__global__ void __launch_bounds__(kThreads) distill_rows_kernel(const DlParams p) {
  static_assert(kGroup == 32 || kGroup == kThreads);
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup) + threadIdx.x / kGroup;
  if (row >= p.rows) return;  // whole groups only: a block-wide group never leaves early here
  T* x = static_cast<T*>(p.logits) + row * p.vocab;
  const T* y = static_cast<const T*>(p.teacher) + row * p.vocab;
  const RowLayout l = p.vec ? row_layout(x, p.vocab) : RowLayout{p.vocab, 0, 0};

  if (!p.mask[row]) {
    if (lane == 0) {
      p.losses[row] = 0.f;
      if (p.distill_losses) p.distill_losses[row] = 0.f;
    }
    if (p.with_grad) dl::zero_row<T, kGroup>(x, l, lane);
    return;
  }
  const int label = p.c.label ? checked_label(p, row, lane == 0) : -1;
  const float x_label = lane == 0 && label >= 0 ? to_float(x[label]) : 0.f;
  const Frame f = make_frame(p, to_float(x[0]), to_float(y[0]));

  DStat st = dl::stream_stats<T, kGroup, kUnroll>(x, y, l, lane, f);
  st = dl::group_reduce<kGroup, kThreads>(st, f);
  const DRow r = finish_row(p, st, f, row, label, x_label, lane == 0);
  if (!p.with_grad) return;
  // Every thread's reads of x[0] (and lane 0's of x[label]) are ordered before the writes
  // below: by __syncthreads in block_reduce, and here for the warp.
  if constexpr (kGroup == 32) __syncwarp();
  dl::stream_grad<T, kGroup, kUnroll>(x, y, l, lane, label, row_grad(p, r));
}

// ---------------------------------------------------------------------------------------------
// Cluster: C blocks per row, each holding slice [v0, v0 + n) of both rows' vectors in shared
// memory (dynamic: p.slice_vecs vectors of x, then p.slice_vecs of y), filled by bulk copies
// completing on mbarriers (one barrier per chunk, armed with both tensors' bytes).

template <typename T>
__global__ void __launch_bounds__(kClusterThreads) distill_cluster_kernel(const DlParams p) {
#ifdef ENGINE_ARCH_SM90  // clusters and bulk copies (cuda/common/arch.cuh)
  constexpr int kN = kVec<T>;
  constexpr int kPerThread = kChunkVecs / kClusterThreads;  // vector pairs per thread per chunk
  extern __shared__ __align__(128) uint4 smem[];
  __shared__ uint64_t bars[kMaxChunks];
  __shared__ DStat red[kClusterThreads / 32];
  __shared__ DStat block_stat;  // this block's statistics, read by the whole cluster

  uint4* xs = smem;
  uint4* ys = smem + p.slice_vecs;
  const int C = p.cluster;
  const int rank = C > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t row = static_cast<int64_t>(blockIdx.x) / C;
  T* x = static_cast<T*>(p.logits) + row * p.vocab;
  const T* y = static_cast<const T*>(p.teacher) + row * p.vocab;
  const RowLayout l = row_layout(x, p.vocab);  // the launcher has checked co-alignment
  uint4* xb = reinterpret_cast<uint4*>(x + l.head);
  const uint4* yb = reinterpret_cast<const uint4*>(y + l.head);
  const int v0 = min(rank * p.slice_vecs, l.nvec);
  const int n = min(l.nvec - v0, p.slice_vecs);
  const int ecol = rank == 0 && tid < l.head + l.tail ? extra_col<T>(tid, l) : -1;

  // Masked: the whole cluster leaves here together, before any cluster barrier.
  if (!p.mask[row]) {
    if (rank == 0 && tid == 0) {
      p.losses[row] = 0.f;
      if (p.distill_losses) p.distill_losses[row] = 0.f;
    }
    if (p.with_grad) {
      for (int i = tid; i < n; i += kClusterThreads) xb[v0 + i] = make_uint4(0, 0, 0, 0);
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
      mbar_expect_tx(&bars[c], 2 * bytes);
      bulk_load(xs + c * kChunkVecs, xb + v0 + c * kChunkVecs, bytes, &bars[c]);
      bulk_load(ys + c * kChunkVecs, yb + v0 + c * kChunkVecs, bytes, &bars[c]);
    }
  }
  const bool reporter = rank == 0 && tid == 0;
  const int label = p.c.label ? checked_label(p, row, reporter) : -1;
  const float x_label = reporter && label >= 0 ? to_float(x[label]) : 0.f;
  const float xe = ecol >= 0 ? to_float(x[ecol]) : 0.f;
  const float ye = ecol >= 0 ? to_float(y[ecol]) : 0.f;
  const Frame f = make_frame(p, to_float(x[0]), to_float(y[0]));

  DStat st = dl::empty_stat();
  for (int c = 0; c < nchunks; ++c) {
    mbar_wait(&bars[c], 0);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = c * kChunkVecs + k * kClusterThreads + tid;
      if (i < n) {
        float xv[kN], yv[kN];
        unpack(xs[i], xv, T{});
        unpack(ys[i], yv, T{});
        dl::accumulate(st, xv, yv, f);
      }
    }
  }
  if (ecol >= 0) {
    const float xv[1] = {xe}, yv[1] = {ye};
    dl::accumulate(st, xv, yv, f);
  }
  st = dl::block_reduce<kClusterThreads>(st, red, f);
  if (C > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    if (tid == 0) block_stat = st;
    cluster.sync();  // release/acquire: every block's block_stat is visible
    st = *cluster.map_shared_rank(&block_stat, 0);
    for (int r = 1; r < C; ++r) st = dl::merge(st, *cluster.map_shared_rank(&block_stat, r), f);
    // Done reading the other blocks' shared memory; the matching wait (before exit) keeps
    // every block alive until all have read.
    cluster.barrier_arrive();
  }
  const DRow r = finish_row(p, st, f, row, label, x_label, reporter);

  if (p.with_grad) {
    const DGrad g = row_grad(p, r);
#pragma unroll 4
    for (int i = tid; i < n; i += kClusterThreads)
      xb[v0 + i] = dl::grad_vec<T>(xs[i], ys[i], l.head + (v0 + i) * kN, label, g);
    if (ecol >= 0) x[ecol] = from_float<T>(dl::grad_elem(xe, ye, ecol == label, g));
  }
  if (C > 1) cg::this_cluster().barrier_wait();
#else
  ENGINE_ARCH_UNAVAILABLE();  // never planned: distillation_plan needs arch::current().clusters
#endif  // ENGINE_ARCH_SM90
}

// ---------------------------------------------------------------------------------------------
// Host side.

using KernelFn = void (*)(DlParams);

KernelFn cluster_kernel(DType dtype) {
  return dtype == DType::BF16 ? distill_cluster_kernel<bf16_t> : distill_cluster_kernel<float>;
}

// Largest dynamic shared memory a Cluster block may take (both slices), after raising the
// kernels' limits to it once.
int64_t max_slice_bytes() {
  static const int64_t bytes = cluster_launch::raise_dynamic_smem(
      {reinterpret_cast<const void*>(cluster_kernel(DType::BF16)), reinterpret_cast<const void*>(cluster_kernel(DType::F32))},
      int64_t{2} * kMaxChunks * kChunkVecs * 16, 32);
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

const char* path_name(DistillPath path) {
  switch (path) {
    case DistillPath::Auto:
      return "Auto";
    case DistillPath::WarpRows:
      return "WarpRows";
    case DistillPath::BlockRows:
      return "BlockRows";
    case DistillPath::Cluster:
      return "Cluster";
  }
  return "?";
}


}  // namespace

std::optional<DistillPlan> distillation_plan(int64_t vocab, DType dtype, bool aligned,
                                             DistillPath path, int cluster) {
  ENSURE(dtype == DType::BF16 || dtype == DType::F32, "distillation_loss: logits are ",
         dtype_name(dtype), ", expected bf16 or f32");
  ENSURE(vocab > 0 && vocab <= INT32_MAX, "distillation_loss: vocabulary of ", vocab,
         " outside [1, 2^31)");
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  const int64_t max_vecs = vocab * esize / 16;  // >= the vector count of any row
  auto slice = [&](int c) { return 2 * ceil_div(max_vecs, c) * 16; };  // both tensors
  // Cluster needs thread-block clusters on the device and in the code it runs (arch.h);
  // without them Auto takes WarpRows or BlockRows and a forced Cluster has no plan.
  auto fits = [&](int c) {
    return arch::current().clusters && aligned && slice(c) <= max_slice_bytes() &&
           cluster_schedulable(dtype, c, slice(c));
  };
  auto choose_cluster = [&]() -> std::optional<DistillPlan> {
    for (int c : {1, 2, 4, 8})
      if (slice(c) <= kAutoSliceBytes && fits(c))
        return DistillPlan{DistillPath::Cluster, c, slice(c)};
    for (int c : {1, 2, 4, 8})
      if (fits(c)) return DistillPlan{DistillPath::Cluster, c, slice(c)};
    return std::nullopt;
  };
  switch (path) {
    case DistillPath::Auto:
      if (vocab * esize <= kWarpRowsMaxBytes) return DistillPlan{DistillPath::WarpRows, 1, 0};
      for (int c = 1; c <= kAutoMaxCluster; c *= 2)
        if (slice(c) <= kAutoSliceBytes && fits(c))
          return DistillPlan{DistillPath::Cluster, c, slice(c)};
      return DistillPlan{DistillPath::BlockRows, 1, 0};
    case DistillPath::Cluster:
      if (cluster == 0) return choose_cluster();
      if ((cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) || !fits(cluster))
        return std::nullopt;
      return DistillPlan{DistillPath::Cluster, cluster, slice(cluster)};
    case DistillPath::WarpRows:
    case DistillPath::BlockRows:
      if (cluster > 1) return std::nullopt;
      return DistillPlan{path, 1, 0};
  }
  return std::nullopt;
}

void distillation_loss(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, const ops::DistillParams& dp, const Tensor& losses,
                       const Tensor& distill_losses, bool with_grad, float grad_scale,
                       DistillPath path, int cluster) {
  const char* op = "distillation_loss";
  ENSURE(logits.dtype == DType::BF16 || logits.dtype == DType::F32, op, ": logits is ",
         dtype_name(logits.dtype), ", expected bf16 or f32");
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(t <= INT32_MAX, op, ": ", t, " rows are too many");
  const bool label = dp.label_weight != 0.f;
  const bool want_d = !(distill_losses.data == nullptr && distill_losses.ndim() == 0);
  const size_t esize = dtype_size(logits.dtype);
  ENSURE(reinterpret_cast<uintptr_t>(logits.data) % esize == 0 &&
             reinterpret_cast<uintptr_t>(teacher.data) % esize == 0,
         op, ": logits and teacher must be aligned to their element size");
  const bool aligned = dl::coaligned(logits.data, teacher.data);
  const std::optional<DistillPlan> plan =
      distillation_plan(v, logits.dtype, aligned, path, cluster);
  ENSURE(plan.has_value(), op, ": the ", path_name(path), " path with cluster size ", cluster,
         " cannot run a row of ", v, " ", dtype_name(logits.dtype), " logits",
         aligned ? "" : " (the teacher's rows are not co-aligned with the logits')");
  if (t == 0) return;
  ENSURE(t * plan->cluster <= INT32_MAX, op, ": ", t, " rows x ", plan->cluster,
         " blocks exceed the grid");

  Owned flag;
  if (label) {
    flag = empty({1}, DType::I64, Device::CUDA);
    CUDA_CHECK(cudaMemsetAsync(flag.t.data, 0xff, sizeof(unsigned long long), stream()));
  }
  DlParams p{};
  p.logits = logits.data;
  p.teacher = teacher.data;
  p.labels = label ? labels.ptr<int32_t>() : nullptr;
  p.mask = mask.ptr<uint8_t>();
  p.losses = losses.ptr<float>();
  p.distill_losses = want_d ? distill_losses.ptr<float>() : nullptr;
  p.bad_label = label ? static_cast<unsigned long long*>(flag.t.data) : nullptr;
  p.rows = t;
  p.vocab = static_cast<int32_t>(v);
  p.cluster = plan->cluster;
  p.slice_vecs = static_cast<int32_t>(plan->slice_bytes / 32);
  p.vec = aligned;
  p.c.kind = static_cast<int>(dp.kind);
  p.c.tau = dp.temperature;
  p.c.inv_tau = static_cast<float>(1.0 / static_cast<double>(dp.temperature));
  p.c.label_weight = dp.label_weight;
  p.c.distill_weight = dp.distill_weight;
  p.c.z_loss = dp.z_loss;
  p.c.label = label;
  p.grad_scale = grad_scale;
  p.with_grad = with_grad;
  static_assert(static_cast<int>(ops::DistillKind::SoftCE) == dl::kSoftCE &&
                static_cast<int>(ops::DistillKind::ForwardKL) == dl::kForwardKL &&
                static_cast<int>(ops::DistillKind::ReverseKL) == dl::kReverseKL);

  const bool bf = logits.dtype == DType::BF16;
  switch (plan->path) {
    case DistillPath::WarpRows: {
      constexpr int kRows = kWarpRowsThreads / 32;
      const auto kernel = bf ? distill_rows_kernel<bf16_t, 32, kWarpRowsThreads>
                             : distill_rows_kernel<float, 32, kWarpRowsThreads>;
      kernel<<<static_cast<unsigned>(ceil_div(t, kRows)), kWarpRowsThreads, 0, stream()>>>(p);
      check_launch("distillation_loss (WarpRows)");
      break;
    }
    case DistillPath::BlockRows: {
      const auto kernel = bf ? distill_rows_kernel<bf16_t, kBlockRowsThreads, kBlockRowsThreads>
                             : distill_rows_kernel<float, kBlockRowsThreads, kBlockRowsThreads>;
      kernel<<<static_cast<unsigned>(t), kBlockRowsThreads, 0, stream()>>>(p);
      check_launch("distillation_loss (BlockRows)");
      break;
    }
    case DistillPath::Cluster: {
      max_slice_bytes();  // raises the dynamic shared-memory limit once
      cudaLaunchAttribute attr{};
      const cudaLaunchConfig_t cfg =
          cluster_config(t * plan->cluster, plan->cluster, plan->slice_bytes, &attr);
      CUDA_CHECK(cudaLaunchKernelEx(&cfg, cluster_kernel(logits.dtype), p));
      check_launch("distillation_loss (Cluster)");
      break;
    }
    case DistillPath::Auto:
      RAISE(op, ": unresolved plan");
  }

  if (!label) return;
  unsigned long long bad = 0;
  device::copy(&bad, false, flag.t.data, true, sizeof bad);  // synchronises the compute stream
  if (bad != ~0ull) {
    const int64_t pos = static_cast<int64_t>(bad >> 32);
    const int32_t lab = static_cast<int32_t>(static_cast<uint32_t>(bad & 0xffffffffu));
    RAISE(op, ": labels[", pos, "] = ", lab, " out of range [0, ", v,
          ") at a masked-in token (position ", pos, ")");
  }
}

// ops/loss.h's entry: the Auto plan.
void distillation_loss(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, const ops::DistillParams& p, const Tensor& losses,
                       const Tensor& distill_losses, bool with_grad, float grad_scale) {
  distillation_loss(logits, teacher, labels, mask, p, losses, distill_losses, with_grad,
                    grad_scale, DistillPath::Auto, 0);
}

}  // namespace engine::cuda
