// Fused cross-entropy with its gradient in place over the logits (contract: csrc/ops/loss.h;
// the CUDA-only entry points and the paths: cross_entropy.cuh; CPU reference
// csrc/ref/loss.cpp). Per masked-in row of x = logits (T, V):
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
//              reads and one write). Fallback for rows too large for the cluster path, and
//              Auto's choice for large rows where clusters are absent (cuda/common/arch.h:
//              compute capability 9 and code for sm_90 or later).
//   Cluster    a cluster of C in {1, 2, 4, 8} blocks per row; block r copies its slice of the
//              row (V / C elements) into shared memory with bulk copies (cp.async.bulk, 16 KB
//              per mbarrier, all issued at once), reduces it while the chunks land, the blocks
//              exchange (m, s) through distributed shared memory, and each writes its slice's
//              gradient from shared memory: read B + write B, the bytes floor. Auto takes C = 1
//              (no exchange) while two such blocks fit on a multiprocessor (rows <= 110 KB),
//              else the smallest C whose slice is <= 72 KB (3 blocks per SM): 32000 and 50304
//              bf16 -> C = 1, 128256 bf16 -> C = 4 (62.6 KB). The exchange costs more than the
//              extra blocks per SM win, so one block per row is faster than two while it fits,
//              and four blocks at 128256 faster than 2, 3 and 5-8 (figures: docs/PERF.md). Rows
//              whose 72 KB slices would need more than 8 blocks take the first C whose slice
//              fits the shared memory at all.
// Cluster exchange (C > 1): Barrier, each block writes its (m, s) to its shared memory, a
// cluster barrier with release/acquire semantics (a GPU-scope MEMBAR before the arrive), every
// block reads all C through distributed shared memory, and a second (release) arrive before the
// gradient guards the exit; Push, each block stores its (m, s) into slot r of every block
// (st.async, 16 bytes, completing on an mbarrier of the receiving block): no fence, and only
// relaxed cluster-barrier arrivals (one after the barrier's initialisation, one as the exit
// guard). Both merge the C values in rank order: bitwise the same results. Auto pushes (no
// GPU-scope fence: faster; figures: docs/PERF.md) wherever the push kernel's slice fits; its
// static shared memory is 128 bytes larger than the barrier kernel's, so slices within those
// last 128 bytes of the limit exchange by Barrier (on H100/H200: bf16 rows of 464136-464391
// logits at C = 4 and 928264-928775 at C = 8; f32 232068-232195 and 464132-464387).
// Rows are 16-byte vectors (8 bf16 or 4 f32) from the first 16-byte-aligned element; the up to
// 2 x 7 elements before and after the vectors (rows of odd V are not aligned) are scalars,
// one per thread. Masked rows read nothing but the mask and write zeros.
//
// Limits: logits bf16 or f32, contiguous, element-aligned; 0 < V <= 2^31 - 1; T * C < 2^31
// blocks; Cluster slices up to the device's shared memory per block (227 KB on H100/H200:
// V <= 8 x 227 KB / sizeof(logit)); larger rows take BlockRows. Results are deterministic
// (fixed reduction order, no float atomics). A bad label makes that row's loss NaN and drops its
// one-hot term; the launcher reads the flag back and raises. The per-device limits and the
// cluster-occupancy answers are cached for the first device that asks (one GPU per process).
// The shared preconditions ran before (ops/loss.cpp); the launcher checks what is its own:
// logits bf16 or f32, element-aligned, a plan that holds the row, T * C within the grid.
#include "cuda/loss/cross_entropy.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/loss/bulk_copy.cuh"
#include "cuda/loss/cluster_launch.cuh"
#include "cuda/loss/ce_device.cuh"
#include "cuda/loss/cross_entropy_kernels.cuh"
#include "ops/loss.h"

namespace engine::cuda {
namespace {

using namespace ce;

// ---------------------------------------------------------------------------------------------
// Host side.

using KernelFn = void (*)(CeParams);

KernelFn cluster_kernel(DType dtype, bool push = false) {
  if (push) return dtype == DType::BF16 ? ce_cluster_kernel<bf16_t, true> : ce_cluster_kernel<float, true>;
  return dtype == DType::BF16 ? ce_cluster_kernel<bf16_t, false> : ce_cluster_kernel<float, false>;
}

// Largest dynamic shared memory a Cluster block may take (the opt-in limit less the kernel's
// static shared memory), after raising the kernels' limits to it once (per exchange).
int64_t max_slice_bytes(bool push = false) {
  auto raise = [](bool x) {
    return cluster_launch::raise_dynamic_smem(
        {reinterpret_cast<const void*>(cluster_kernel(DType::BF16, x)),
         reinterpret_cast<const void*>(cluster_kernel(DType::F32, x))},
        int64_t{kMaxChunks} * kChunkVecs * 16, 16);
  };
  static const int64_t barrier_bytes = raise(false);
  if (!push) return barrier_bytes;
  static const int64_t push_bytes = raise(true);
  return push_bytes;
}

cudaLaunchConfig_t cluster_config(int64_t blocks, int cluster, int64_t slice_bytes,
                                  cudaLaunchAttribute* attr) {
  return cluster_launch::config(blocks, kClusterThreads, cluster, slice_bytes, stream(), attr);
}

// Whether the device can run at least one cluster of this shape (cached).
bool cluster_schedulable(DType dtype, bool push, int cluster, int64_t slice_bytes) {
  max_slice_bytes(push);  // raises the dynamic shared-memory limits first
  return cluster_launch::schedulable(reinterpret_cast<const void*>(cluster_kernel(dtype, push)),
                                     kClusterThreads, cluster, slice_bytes);
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
                                                   const CrossEntropyChoice& choice) {
  ENSURE(dtype == DType::BF16 || dtype == DType::F32, "cross_entropy: logits are ",
         dtype_name(dtype), ", expected bf16 or f32");
  ENSURE(vocab > 0 && vocab <= INT32_MAX, "cross_entropy: vocabulary of ", vocab,
         " outside [1, 2^31)");
  const CrossEntropyPath path = choice.path;
  const int cluster = choice.cluster;
  const bool push = choice.exchange == ClusterExchange::Push;
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  const int64_t max_vecs = vocab * esize / 16;  // >= the vector count of any row
  auto slice = [&](int c) { return ceil_div(max_vecs, c) * 16; };
  // Cluster needs thread-block clusters on the device and in the code it runs (arch.h);
  // without them Auto takes WarpRows or BlockRows and a forced Cluster has no plan.
  auto fits = [&](int c) {
    return arch::current().clusters && slice(c) <= max_slice_bytes(push) &&
           cluster_schedulable(dtype, push, c, slice(c));
  };
  auto cluster_plan = [&](int c) {
    CrossEntropyPlan plan{CrossEntropyPath::Cluster, c, slice(c)};
    plan.exchange = choice.exchange;
    return plan;
  };
  auto choose_cluster = [&]() -> std::optional<CrossEntropyPlan> {
    if (slice(1) <= kAutoSoloBytes && fits(1)) return cluster_plan(1);
    for (int c : {1, 2, 4, 8})
      if (slice(c) <= kAutoSliceBytes && fits(c)) return cluster_plan(c);
    for (int c : {1, 2, 4, 8})
      if (fits(c)) return cluster_plan(c);
    return std::nullopt;
  };
  const bool valid_cluster = cluster == 0 || cluster == 1 || cluster == 2 || cluster == 4 ||
                             cluster == 8;
  if (push && path != CrossEntropyPath::Cluster) return std::nullopt;
  switch (path) {
    case CrossEntropyPath::Auto:
      if (vocab * esize <= kWarpRowsMaxBytes)
        return CrossEntropyPlan{CrossEntropyPath::WarpRows, 1, 0};
      if (auto plan = choose_cluster()) {
        // Clusters of several blocks exchange (m, s) by st.async pushes where the slice fits
        // the push kernel, without the GPU-scope fence of cluster.sync(): faster (figures:
        // docs/PERF.md), bitwise the same results.
        const int c = plan->cluster;
        if (c > 1 && slice(c) <= max_slice_bytes(true) && cluster_schedulable(dtype, true, c, slice(c)))
          plan->exchange = ClusterExchange::Push;
        return plan;
      }
      return CrossEntropyPlan{CrossEntropyPath::BlockRows, 1, 0};
    case CrossEntropyPath::Cluster:
      if (cluster == 0) return choose_cluster();
      if (!valid_cluster || !fits(cluster)) return std::nullopt;
      return cluster_plan(cluster);
    case CrossEntropyPath::WarpRows:
    case CrossEntropyPath::BlockRows:
      if (cluster > 1) return std::nullopt;
      return CrossEntropyPlan{path, 1, 0};
  }
  return std::nullopt;
}

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale,
                   const CrossEntropyChoice& choice, float z_loss, float label_smoothing,
                   int64_t columns) {
  ENSURE(logits.dtype == DType::BF16 || logits.dtype == DType::F32, "cross_entropy: logits are ",
         dtype_name(logits.dtype), ", expected bf16 or f32");
  const int64_t t = logits.size(0), ld = logits.size(1), v = columns > 0 ? columns : ld;
  ENSURE(reinterpret_cast<uintptr_t>(logits.data) % dtype_size(logits.dtype) == 0,
         "cross_entropy: logits are not aligned to their element size");
  const std::optional<CrossEntropyPlan> plan = cross_entropy_plan(v, logits.dtype, choice);
  ENSURE(plan.has_value(), "cross_entropy: the ", path_name(choice.path),
         " path with cluster size ", choice.cluster,
         choice.exchange == ClusterExchange::Push ? " (push exchange)" : "",
         " cannot run a row of ", v, " ", dtype_name(logits.dtype), " logits");
  if (t == 0) return;
  ENSURE(t * plan->cluster <= INT32_MAX, "cross_entropy: ", t, " rows x ", plan->cluster,
         " blocks exceed the grid");

  Owned flag = empty({1}, DType::I64, Device::CUDA);
  CUDA_CHECK(cudaMemsetAsync(flag.t.data, 0xff, sizeof(unsigned long long), stream()));
  const int64_t slice_vecs = plan->slice_bytes / 16;  // Cluster: the slice, else 0
  const CeParams p{logits.data,
                   labels.ptr<int32_t>(),
                   mask.ptr<uint8_t>(),
                   losses.ptr<float>(),
                   static_cast<unsigned long long*>(flag.t.data),
                   t,
                   ld,
                   static_cast<int32_t>(v),
                   plan->cluster,
                   static_cast<int32_t>(slice_vecs),
                   grad_scale,
                   z_loss,
                   label_smoothing,
                   static_cast<float>(1.0 / static_cast<double>(v)),
                   with_grad};
  const bool bf = logits.dtype == DType::BF16;
  const bool push = plan->exchange == ClusterExchange::Push;
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
      max_slice_bytes(push);  // raises the dynamic shared-memory limit once
      cudaLaunchAttribute attr{};
      const cudaLaunchConfig_t cfg =
          cluster_config(t * plan->cluster, plan->cluster, plan->slice_bytes, &attr);
      CUDA_CHECK(cudaLaunchKernelEx(&cfg, cluster_kernel(logits.dtype, push), p));
      check_launch("cross_entropy (Cluster)");
      break;
    }
    case CrossEntropyPath::Auto:
      RAISE("cross_entropy: unresolved plan");
  }

  unsigned long long bad = 0;
  device::copy(&bad, false, flag.t.data, true, sizeof bad);  // synchronises the compute stream
  if (bad != ~0ull) {
    const int64_t pos = static_cast<int64_t>(bad >> 32);
    const int32_t label = static_cast<int32_t>(static_cast<uint32_t>(bad & 0xffffffffu));
    RAISE("cross_entropy: labels[", pos, "] = ", label, " out of range [0, ", v,
          ") at a masked-in token (position ", pos, ")");
  }
}

// ops/loss.h's entry: the Auto plan.
void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale, float z_loss,
                   float label_smoothing, int64_t columns) {
  cross_entropy(logits, labels, mask, losses, with_grad, grad_scale, CrossEntropyChoice{}, z_loss,
                label_smoothing, columns);
}

}  // namespace engine::cuda
