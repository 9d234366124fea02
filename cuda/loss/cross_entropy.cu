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
//   Regs       as Cluster (C in {1, 2, 4, 8} blocks per row, read B + write B), but each block
//              holds its slice in registers: threads x kK 16-byte vectors, thread t's vector k
//              at slice offset k * threads + t, all kK loads of a thread issued at once; the
//              part of a slice beyond the registers goes to shared memory by bulk copies as in
//              Cluster. Pure register shapes need shared memory only for the reductions, so the
//              blocks per SM are set by registers (64-128 a thread, __launch_bounds__ minimum
//              blocks); the shared part adds on-chip room beyond the register file. Shapes
//              (threads x kK, blocks per SM): 1024 x 8 (1), 512 x 8 (2), 256 x 8 (4),
//              256 x 12 (3), 128 x 24 (4): 128-192 KB of the row per SM in registers, none
//              spilling (ptxas). A launch sets the kernel's shared-memory carveout to what its
//              blocks take, so that the rest stays L1, where the register loads land.
// Cluster exchange (C > 1): Barrier, each block writes its (m, s) to its shared memory, a
// cluster barrier with release/acquire semantics (a GPU-scope MEMBAR before the arrive), every
// block reads all C through distributed shared memory, and a second (release) arrive before the
// gradient guards the exit; Push, each block stores its (m, s) into slot r of every block
// (st.async, 16 bytes, completing on an mbarrier of the receiving block): no fence, and only
// relaxed cluster-barrier arrivals (one after the barrier's initialisation, one as the exit
// guard). Both merge the C values in rank order: bitwise the same results.
// Rows are 16-byte vectors (8 bf16 or 4 f32) from the first 16-byte-aligned element; the up to
// 2 x 7 elements before and after the vectors (rows of odd V are not aligned) are scalars,
// one per thread. Masked rows read nothing but the mask and write zeros.
//
// Limits: logits bf16 or f32, contiguous, element-aligned; 0 < V <= 2^31 - 1; T * C < 2^31
// blocks; Cluster slices (Regs: their part beyond the registers) up to the device's shared
// memory per block (227 KB on H100/H200: V <= 8 x 227 KB / sizeof(logit)); larger rows take
// BlockRows. Results are deterministic (fixed reduction order, no float atomics). A bad label
// makes that row's loss NaN and drops its one-hot term; the launcher reads the flag back and
// raises. The per-device limits and the cluster-occupancy answers are cached for the first
// device that asks (one GPU per process).
#include "cuda/loss/cross_entropy.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

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

// Regs: the compiled block shapes (threads, vectors per thread in registers), each with the
// blocks per multiprocessor its register cap is set for (__launch_bounds__' minimum blocks:
// 64 registers a thread for 1, 2 and 4 blocks, 80 for 3; 128 for 4 blocks of 128 threads).
struct RegsShape {
  int threads, vecs, min_blocks;
};
constexpr RegsShape kRegsShapes[] = {{1024, 8, 1}, {512, 8, 2}, {256, 8, 4}, {256, 12, 3},
                                     {128, 24, 4}};
constexpr int kRegsShapeCount = static_cast<int>(sizeof kRegsShapes / sizeof kRegsShapes[0]);

template <typename T, bool kPush>
KernelFn regs_kernel_of(int shape) {
  static_assert(kRegsShapeCount == 5);
  switch (shape) {
    case 0:
      return ce_regs_kernel<T, 1024, 8, 1, kPush>;
    case 1:
      return ce_regs_kernel<T, 512, 8, 2, kPush>;
    case 2:
      return ce_regs_kernel<T, 256, 8, 4, kPush>;
    case 3:
      return ce_regs_kernel<T, 256, 12, 3, kPush>;
    default:
      return ce_regs_kernel<T, 128, 24, 4, kPush>;
  }
}
KernelFn regs_kernel(DType dtype, int shape, bool push) {
  if (push)
    return dtype == DType::BF16 ? regs_kernel_of<bf16_t, true>(shape)
                                : regs_kernel_of<float, true>(shape);
  return dtype == DType::BF16 ? regs_kernel_of<bf16_t, false>(shape)
                              : regs_kernel_of<float, false>(shape);
}
int regs_shape_index(int threads, int vecs) {
  for (int i = 0; i < kRegsShapeCount; ++i)
    if (kRegsShapes[i].threads == threads && kRegsShapes[i].vecs == vecs) return i;
  return -1;
}

// Largest dynamic shared memory a Regs block may take (as max_slice_bytes, for every shape).
int64_t max_regs_smem_bytes() {
  static const int64_t bytes = [] {
    std::vector<const void*> kernels;
    for (DType dt : {DType::BF16, DType::F32})
      for (int i = 0; i < kRegsShapeCount; ++i)
        for (bool push : {false, true})
          kernels.push_back(reinterpret_cast<const void*>(regs_kernel(dt, i, push)));
    return cluster_launch::raise_dynamic_smem(kernels, int64_t{kMaxChunks} * kChunkVecs * 16, 16);
  }();
  return bytes;
}

// The shared-memory carveout of a Regs launch: what as many blocks as the registers and threads
// allow take (dynamic + static + the per-block reservation), in percent of the multiprocessor's
// shared memory, which the driver rounds up to a supported size; the rest of the L1/shared array
// stays L1, where the registers' global loads land (raise_dynamic_smem's maximal carveout would
// leave ~28 KB of L1 for the 128-192 KB of loads a multiprocessor has in flight). Set only when
// it changes (cached per kernel).
void set_regs_carveout(KernelFn kernel, int threads, int64_t smem) {
  static std::mutex mu;
  static std::map<const void*, int> current;
  const void* k = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> lock(mu);
  int device = 0, regs_sm = 0, threads_sm = 0, smem_sm = 0, reserved = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&regs_sm, cudaDevAttrMaxRegistersPerMultiprocessor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&threads_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, k));
  const int64_t warp_regs = ceil_div(int64_t{attr.numRegs} * 32, 256) * 256;  // 256-register units
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>({regs_sm / (warp_regs * (threads / 32)), threads_sm / threads, 32}));
  const int64_t need = std::min<int64_t>(
      smem_sm, blocks * (smem + static_cast<int64_t>(attr.sharedSizeBytes) + reserved));
  const int percent =
      static_cast<int>(std::clamp<int64_t>(ceil_div(need * 100, smem_sm), 1, 100));
  if (auto it = current.find(k); it != current.end() && it->second == percent) return;
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
  current[k] = percent;
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
    case CrossEntropyPath::Regs:
      return "Regs";
  }
  return "?";
}

}  // namespace

std::vector<CrossEntropyRegsShape> cross_entropy_regs_shapes() {
  std::vector<CrossEntropyRegsShape> out;
  for (const RegsShape& r : kRegsShapes) out.push_back({r.threads, r.vecs});
  return out;
}

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
  auto fits = [&](int c) {
    return slice(c) <= max_slice_bytes(push) && cluster_schedulable(dtype, push, c, slice(c));
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
  // Regs: shape i with cluster c, its shared part (bytes) beyond the registers; nullopt when
  // that is over the limit or the device cannot schedule the cluster.
  auto regs_plan = [&](int i, int c) -> std::optional<CrossEntropyPlan> {
    const RegsShape& r = kRegsShapes[i];
    const int64_t smem = std::max<int64_t>(0, slice(c) - int64_t{r.threads} * r.vecs * 16);
    if (smem > max_regs_smem_bytes() ||
        !cluster_launch::schedulable(reinterpret_cast<const void*>(regs_kernel(dtype, i, push)),
                                     r.threads, c, smem))
      return std::nullopt;
    return CrossEntropyPlan{CrossEntropyPath::Regs, c, smem, r.threads, r.vecs, choice.exchange};
  };
  // Regs without a shape: the first (in kRegsShapes' order) that holds the whole slice in
  // registers, else the first that fits with a shared part.
  auto choose_regs = [&](int c) -> std::optional<CrossEntropyPlan> {
    std::optional<CrossEntropyPlan> any;
    for (int i = 0; i < kRegsShapeCount; ++i)
      if (auto plan = regs_plan(i, c)) {
        if (plan->slice_bytes == 0) return plan;
        if (!any) any = plan;
      }
    return any;
  };
  const bool valid_cluster = cluster == 0 || cluster == 1 || cluster == 2 || cluster == 4 ||
                             cluster == 8;
  if (path != CrossEntropyPath::Regs && (choice.threads != 0 || choice.reg_vecs != 0))
    return std::nullopt;
  if (push && path != CrossEntropyPath::Regs && path != CrossEntropyPath::Cluster)
    return std::nullopt;
  switch (path) {
    case CrossEntropyPath::Regs: {
      if (!valid_cluster) return std::nullopt;
      int shape = -1;
      if (choice.threads != 0) {
        for (int i = 0; i < kRegsShapeCount && shape < 0; ++i)
          if (kRegsShapes[i].threads == choice.threads &&
              (choice.reg_vecs == 0 || kRegsShapes[i].vecs == choice.reg_vecs))
            shape = i;
        if (shape < 0) return std::nullopt;
      } else if (choice.reg_vecs != 0) {
        return std::nullopt;
      }
      for (int c : {1, 2, 4, 8}) {
        if (cluster != 0 && c != cluster) continue;
        if (auto plan = shape >= 0 ? regs_plan(shape, c) : choose_regs(c)) return plan;
      }
      return std::nullopt;
    }
    case CrossEntropyPath::Auto:
      if (vocab * esize <= kWarpRowsMaxBytes)
        return CrossEntropyPlan{CrossEntropyPath::WarpRows, 1, 0};
      if (auto plan = choose_cluster()) {
        // Clusters of several blocks exchange (m, s) by st.async pushes, without the GPU-scope
        // fence of cluster.sync(): on one H200, 16384 x 128256 bf16 fwd+grad took 2.11 ms with
        // C = 4 pushing against 2.56 ms with the barrier exchange (same results, bitwise).
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
  ENSURE(logits.device == Device::CUDA, "cross_entropy: logits are on ", device_name(logits.device),
         ", expected cuda");
  ENSURE(logits.ndim() == 2, "cross_entropy: logits must be 2-D (T, V), got shape ",
         logits.shape.str());
  ENSURE(logits.dtype == DType::BF16 || logits.dtype == DType::F32, "cross_entropy: logits are ",
         dtype_name(logits.dtype), ", expected bf16 or f32");
  ENSURE(columns >= 0 && columns <= logits.size(1), "cross_entropy: columns = ", columns,
         " outside [0, ", logits.size(1), "] (the logits' width)");
  const int64_t t = logits.size(0), ld = logits.size(1), v = columns > 0 ? columns : ld;
  ENSURE(v > 0, "cross_entropy: logits has shape ", logits.shape.str(),
         ", the vocabulary is empty");
  ops::check_loss_coefficients(z_loss, label_smoothing, "cross_entropy");
  expect_cuda(labels, DType::I32, {t}, "cross_entropy", "labels");
  expect_cuda(mask, DType::U8, {t}, "cross_entropy", "mask");
  expect_cuda(losses, DType::F32, {t}, "cross_entropy", "losses");
  ENSURE(reinterpret_cast<uintptr_t>(logits.data) % dtype_size(logits.dtype) == 0,
         "cross_entropy: logits are not aligned to their element size");
  const std::optional<CrossEntropyPlan> plan = cross_entropy_plan(v, logits.dtype, choice);
  ENSURE(plan.has_value(), "cross_entropy: the ", path_name(choice.path),
         " path with cluster size ", choice.cluster,
         choice.path == CrossEntropyPath::Regs
             ? " and block shape " + std::to_string(choice.threads) + "x" +
                   std::to_string(choice.reg_vecs)
             : std::string(),
         choice.exchange == ClusterExchange::Push ? " (push exchange)" : "",
         " cannot run a row of ", v, " ", dtype_name(logits.dtype), " logits");
  if (t == 0) return;
  ENSURE(t * plan->cluster <= INT32_MAX, "cross_entropy: ", t, " rows x ", plan->cluster,
         " blocks exceed the grid");

  Owned flag = empty({1}, DType::I64, Device::CUDA);
  CUDA_CHECK(cudaMemsetAsync(flag.t.data, 0xff, sizeof(unsigned long long), stream()));
  // Cluster: slice_bytes is the slice; Regs: the slice is ceil(vectors / C), slice_bytes only
  // its part beyond the registers.
  const int64_t slice_vecs =
      plan->path == CrossEntropyPath::Regs
          ? ceil_div(v * static_cast<int64_t>(dtype_size(logits.dtype)) / 16, plan->cluster)
          : plan->slice_bytes / 16;
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
    case CrossEntropyPath::Regs: {
      max_regs_smem_bytes();  // raises the dynamic shared-memory limits once
      const KernelFn kernel =
          regs_kernel(logits.dtype, regs_shape_index(plan->threads, plan->reg_vecs), push);
      set_regs_carveout(kernel, plan->threads, plan->slice_bytes);
      cudaLaunchAttribute attr{};
      const cudaLaunchConfig_t cfg = cluster_launch::config(
          t * plan->cluster, plan->threads, plan->cluster, plan->slice_bytes, stream(), &attr);
      CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
      check_launch("cross_entropy (Regs)");
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
