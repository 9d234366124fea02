// Vocabulary-parallel distillation on CUDA: the backends of ops::distillation_partial,
// distillation_combine and distillation_grad (contract and formulas: csrc/ops/loss.h; CPU
// reference csrc/ref/loss.cpp). On CUDA the logits and teacher are bf16 or f32 and the stats,
// partials, row_stats and losses f32. With a label term, a label outside [0, vocab_total) at a
// masked-in token raises engine::Error after the partial's kernel ran (a flag read back: that
// call then synchronises the compute stream once); combine and grad do not synchronise. No
// scratch beyond the partial's 8-byte flag. A shard's logits x and teacher columns y (T, Vl) are
// columns [B, B + Vl) of the vocabulary; per masked-in row:
//   partial  the statistics pass of distill_device.cuh over the shard's (x_v, y_v) pairs (one
//            streaming read of both rows, online maxima and sums, the kind's weighted sum), then
//            its statistics relative to the shard's raw maxima (to_part): (mx, sx, z, ss, my, sq,
//            w); z = x[label - B] if the label is in the shard (label term only), else 0
//   combine  one thread per row over the P shards in order (distill_device.cuh's combine, the
//            same code the fused kernel runs on its single part): row_stats (Mx, log Sx,
//            log Ss, My, log Sq, c), D and the weighted loss
//   grad     x_v <- grad_scale (label_weight dC/dx_v + distill_weight dD/dx_v) from (x_v, y_v)
//            and the row's statistics: one read of both rows, one write
// Both row kernels take the rows as 16-byte vectors from their first 16-byte-aligned element
// when the teacher's rows are co-aligned with the logits' (else as scalars), a warp per row (8
// rows per block) when a row is at most 4 KB, else a 256-thread block per row. Statistics are
// f32; the logits never exist in f32 in memory. Deterministic (fixed reduction orders, no float
// atomics).
// Traffic per masked-in row of B = Vl * sizeof(logit) bytes per tensor: partial reads 2 B, grad
// reads 2 B and writes B; combine reads 28 P bytes and writes 32. Masked rows read only the mask
// (and grad writes the zero row).
// Limits: logits and teacher contiguous, element-aligned, finite; Vl < 2^31, vocab_total < 2^31;
// T < 2^31 rows. A bad label (outside [0, vocab_total), masked-in, label term on) makes the row's
// z NaN; the launcher reads the flag back and raises.
// The shared preconditions ran before (ops/loss.cpp); the launchers check what is theirs: logits
// bf16 or f32, both tensors element-aligned, within the 32-bit limits above; partials f32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/loss/ce_device.cuh"
#include "cuda/loss/distill_device.cuh"
#include "ops/loss.h"

namespace engine::cuda {
namespace {

using namespace ce;
using dl::DConst;
using dl::DPart;
using dl::DRow;
using dl::DStat;
using dl::Frame;

constexpr int kUnroll = 4;                   // vector pairs in flight per thread
constexpr int kThreads = 256;                // both row paths and combine
constexpr int64_t kWarpRowsMaxBytes = 4096;  // rows up to this: a warp per row
constexpr int kStats = static_cast<int>(ops::kDistillStats);
constexpr int kRowStats = static_cast<int>(ops::kDistillRowStats);

struct VpParams {
  void* logits;                   // (T, Vl) bf16 or f32; grad: written in place
  const void* teacher;            // (T, Vl)
  const int32_t* labels;          // (T), null without a label term
  const uint8_t* mask;            // (T)
  float* stats;                   // partial: (7, T)
  const float* row_stats;         // grad: (6, T)
  unsigned long long* bad_label;  // partial: min over bad rows of (row << 32 | label), else ~0
  int64_t rows;                   // T
  int64_t vocab_begin;            // B
  int64_t vocab_total;
  int32_t vocab;  // Vl
  bool vec;       // rows of x and y co-aligned: 16-byte vectors
  DConst c;
  float grad_scale;
};

DConst make_const(const ops::DistillParams& dp) {
  static_assert(static_cast<int>(ops::DistillKind::SoftCE) == dl::kSoftCE &&
                static_cast<int>(ops::DistillKind::ForwardKL) == dl::kForwardKL &&
                static_cast<int>(ops::DistillKind::ReverseKL) == dl::kReverseKL);
  DConst c;
  c.kind = static_cast<int>(dp.kind);
  c.tau = dp.temperature;
  c.inv_tau = static_cast<float>(1.0 / static_cast<double>(dp.temperature));
  c.label_weight = dp.label_weight;
  c.distill_weight = dp.distill_weight;
  c.z_loss = dp.z_loss;
  c.label = dp.label_weight != 0.f;
  return c;
}

template <typename T>
__device__ __forceinline__ RowLayout layout(const VpParams& p, const T* x) {
  return p.vec ? row_layout(x, p.vocab) : RowLayout{p.vocab, 0, 0};
}

// ---------------------------------------------------------------------------------------------
// partial: kGroup threads (a warp, or the whole block) per row.

template <typename T, int kGroup>
__global__ void __launch_bounds__(kThreads) distill_partial_kernel(const VpParams p) {
  static_assert(kGroup == 32 || kGroup == kThreads);
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup) + threadIdx.x / kGroup;
  if (row >= p.rows) return;  // whole groups only
  if (!p.mask[row]) {
    if (lane == 0)
      for (int k = 0; k < kStats; ++k) p.stats[k * p.rows + row] = 0.f;
    return;
  }
  const T* x = static_cast<const T*>(p.logits) + row * p.vocab;
  const T* y = static_cast<const T*>(p.teacher) + row * p.vocab;
  const RowLayout l = layout(p, x);

  float z = 0.f;
  if (lane == 0 && p.c.label) {
    const int32_t label = p.labels[row];
    if (label < 0 || label >= p.vocab_total) {
      atomicMin(p.bad_label,
                (static_cast<unsigned long long>(row) << 32) | static_cast<uint32_t>(label));
      z = __int_as_float(0x7fffffff);
    } else {
      const int64_t local = label - p.vocab_begin;
      if (local >= 0 && local < p.vocab) z = to_float(x[local]);
    }
  }
  Frame f;
  f.k = kLog2e * p.c.inv_tau;
  f.tau = p.c.tau;
  f.xr = p.vocab > 0 ? to_float(x[0]) * f.k : 0.f;
  f.yr = p.vocab > 0 ? to_float(y[0]) * f.k : 0.f;
  f.kind = p.c.kind;
  f.sx = p.c.label && p.c.tau != 1.f;

  DStat st = dl::stream_stats<T, kGroup, kUnroll>(x, y, l, lane, f);
  st = dl::group_reduce<kGroup, kThreads>(st, f);
  if (lane == 0) {
    const DPart part = dl::to_part(st, f, p.c.label);
    const float out[kStats] = {part.mx, part.sx, z, part.ss, part.my, part.sq, part.w};
#pragma unroll
    for (int k = 0; k < kStats; ++k) p.stats[k * p.rows + row] = out[k];
  }
}

// ---------------------------------------------------------------------------------------------
// grad: kGroup threads per row.

template <typename T, int kGroup>
__global__ void __launch_bounds__(kThreads) distill_grad_kernel(const VpParams p) {
  static_assert(kGroup == 32 || kGroup == kThreads);
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup) + threadIdx.x / kGroup;
  if (row >= p.rows) return;
  T* x = static_cast<T*>(p.logits) + row * p.vocab;
  const T* y = static_cast<const T*>(p.teacher) + row * p.vocab;
  const RowLayout l = layout(p, static_cast<const T*>(x));
  if (!p.mask[row]) {
    dl::zero_row<T, kGroup>(x, l, lane);
    return;
  }
  const float* rs = p.row_stats;
  const int64_t t = p.rows;
  const dl::DGrad g = dl::make_grad(rs[row], rs[t + row], rs[2 * t + row], rs[3 * t + row],
                                    rs[4 * t + row], rs[5 * t + row], p.c, p.grad_scale);
  int label = -1;
  if (p.c.label) {
    const int64_t local = static_cast<int64_t>(p.labels[row]) - p.vocab_begin;
    label = local >= 0 && local < p.vocab ? static_cast<int>(local) : -1;  // -1: not here
  }
  dl::stream_grad<T, kGroup, kUnroll>(x, y, l, lane, label, g);
}

// ---------------------------------------------------------------------------------------------
// combine: one thread per row, the shards in order.

__global__ void __launch_bounds__(kThreads)
    distill_combine_kernel(const float* partials, const uint8_t* mask, float* row_stats,
                           float* losses, float* distill_losses, int64_t shards, int64_t rows,
                           DConst c) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (r >= rows) return;
  float out[kRowStats] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  float total = 0.f, d = 0.f;
  if (mask[r]) {
    auto at = [&](int64_t q, int k) { return partials[(q * kStats + k) * rows + r]; };
    float zsum = 0.f;
    for (int64_t q = 0; q < shards; ++q) zsum += at(q, 2);
    const DRow row = dl::combine(
        static_cast<int>(shards),
        [&](int q) { return DPart{at(q, 0), at(q, 1), at(q, 3), at(q, 4), at(q, 5), at(q, 6)}; },
        zsum, c);
    out[0] = row.mx;
    out[1] = row.lsx;
    out[2] = row.lss;
    out[3] = row.my;
    out[4] = row.lsq;
    out[5] = row.c;
    total = row.total;
    d = row.d;
  }
#pragma unroll
  for (int k = 0; k < kRowStats; ++k) row_stats[k * rows + r] = out[k];
  losses[r] = total;
  if (distill_losses) distill_losses[r] = d;
}

// ---------------------------------------------------------------------------------------------
// Host side.

// logits and teacher (T, Vl) bf16 or f32, element-aligned; returns the row path's group size.
int check_pair(const Tensor& logits, const Tensor& teacher, const char* op) {
  ENSURE(logits.dtype == DType::BF16 || logits.dtype == DType::F32, op, ": logits is ",
         dtype_name(logits.dtype), ", expected bf16 or f32");
  ENSURE(logits.size(1) <= INT32_MAX, op, ": a shard of ", logits.size(1), " columns is too wide");
  ENSURE(logits.size(0) <= INT32_MAX, op, ": ", logits.size(0), " rows are too many");
  const size_t esize = dtype_size(logits.dtype);
  ENSURE(reinterpret_cast<uintptr_t>(logits.data) % esize == 0 &&
             reinterpret_cast<uintptr_t>(teacher.data) % esize == 0,
         op, ": logits and teacher must be aligned to their element size");
  return logits.size(1) * static_cast<int64_t>(esize) <= kWarpRowsMaxBytes ? 32 : kThreads;
}

bool is_undefined(const Tensor& t) { return t.data == nullptr && t.ndim() == 0; }

template <typename Launch>
void launch_rows(DType dtype, int group, int64_t rows, Launch&& launch) {
  const unsigned blocks = static_cast<unsigned>(group == 32 ? ceil_div(rows, kThreads / 32) : rows);
  float_switch(dtype, [&](auto tag) { launch(tag, blocks); });
}

}  // namespace

void distillation_partial(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                          const Tensor& mask, int64_t vocab_begin, int64_t vocab_total,
                          const ops::DistillParams& dp, const Tensor& stats) {
  const char* op = "distillation_partial";
  const int group = check_pair(logits, teacher, op);
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(vocab_total <= INT32_MAX, op, ": logits hold columns [", vocab_begin, ", ",
         vocab_begin + v, "), not a shard of a vocabulary of ", vocab_total);
  const DConst c = make_const(dp);
  if (t == 0) return;

  Owned flag;
  if (c.label) {
    flag = empty({1}, DType::I64, Device::CUDA);
    CUDA_CHECK(cudaMemsetAsync(flag.t.data, 0xff, sizeof(unsigned long long), stream()));
  }
  VpParams p{};
  p.logits = logits.data;
  p.teacher = teacher.data;
  p.labels = c.label ? labels.ptr<int32_t>() : nullptr;
  p.mask = mask.ptr<uint8_t>();
  p.stats = stats.ptr<float>();
  p.bad_label = c.label ? static_cast<unsigned long long*>(flag.t.data) : nullptr;
  p.rows = t;
  p.vocab_begin = vocab_begin;
  p.vocab_total = vocab_total;
  p.vocab = static_cast<int32_t>(v);
  p.vec = dl::coaligned(logits.data, teacher.data);
  p.c = c;
  launch_rows(logits.dtype, group, t, [&](auto tag, unsigned blocks) {
    using T = decltype(tag);
    const auto kernel =
        group == 32 ? distill_partial_kernel<T, 32> : distill_partial_kernel<T, kThreads>;
    kernel<<<blocks, kThreads, 0, stream()>>>(p);
    check_launch("distill_partial_kernel");
  });

  if (!c.label) return;
  unsigned long long bad = 0;
  device::copy(&bad, false, flag.t.data, true, sizeof bad);  // synchronises the compute stream
  if (bad != ~0ull) {
    const int64_t pos = static_cast<int64_t>(bad >> 32);
    const int32_t label = static_cast<int32_t>(static_cast<uint32_t>(bad & 0xffffffffu));
    RAISE(op, ": labels[", pos, "] = ", label, " out of range [0, ", vocab_total,
          ") at a masked-in token (position ", pos, ")");
  }
}

void distillation_combine(const Tensor& partials, const Tensor& mask, const ops::DistillParams& dp,
                          const Tensor& row_stats, const Tensor& losses,
                          const Tensor& distill_losses) {
  const char* op = "distillation_combine";
  ENSURE(partials.dtype == DType::F32, op, ": partials is ", dtype_name(partials.dtype),
         ", expected f32");
  const int64_t np = partials.size(0), t = partials.size(2);
  ENSURE(np <= INT32_MAX, op, ": ", np, " shards are too many");
  const bool want_d = !is_undefined(distill_losses);
  if (t == 0) return;
  distill_combine_kernel<<<static_cast<unsigned>(ceil_div(t, kThreads)), kThreads, 0, stream()>>>(
      partials.ptr<float>(), mask.ptr<uint8_t>(), row_stats.ptr<float>(), losses.ptr<float>(),
      want_d ? distill_losses.ptr<float>() : nullptr, np, t, make_const(dp));
  check_launch("distill_combine_kernel");
}

void distillation_grad(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, int64_t vocab_begin, const ops::DistillParams& dp,
                       const Tensor& row_stats, float grad_scale) {
  const char* op = "distillation_grad";
  const int group = check_pair(logits, teacher, op);
  const int64_t t = logits.size(0), v = logits.size(1);
  const DConst c = make_const(dp);
  if (t == 0) return;
  VpParams p{};
  p.logits = logits.data;
  p.teacher = teacher.data;
  p.labels = c.label ? labels.ptr<int32_t>() : nullptr;
  p.mask = mask.ptr<uint8_t>();
  p.row_stats = row_stats.ptr<float>();
  p.rows = t;
  p.vocab_begin = vocab_begin;
  p.vocab = static_cast<int32_t>(v);
  p.vec = dl::coaligned(logits.data, teacher.data);
  p.c = c;
  p.grad_scale = grad_scale;
  launch_rows(logits.dtype, group, t, [&](auto tag, unsigned blocks) {
    using T = decltype(tag);
    const auto kernel = group == 32 ? distill_grad_kernel<T, 32> : distill_grad_kernel<T, kThreads>;
    kernel<<<blocks, kThreads, 0, stream()>>>(p);
    check_launch("distill_grad_kernel");
  });
}

}  // namespace engine::cuda
