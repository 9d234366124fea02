// Vocabulary-parallel cross-entropy on CUDA: the backends of ops::cross_entropy_partial,
// cross_entropy_combine and cross_entropy_grad (contract: csrc/ops/loss.h; CPU reference
// csrc/ref/loss.cpp). On CUDA the logits are bf16 or f32 and the stats, partials, lse and losses
// f32. A label outside [0, vocab_total) at a masked-in token raises engine::Error naming the
// position and the label after the partial's kernel ran (a flag read back: that call
// synchronises the compute stream once); combine and grad do not synchronise. No scratch beyond
// the partial's 8-byte flag. A shard's logits x (T, Vl) are columns [B, B + Vl) of the
// vocabulary; per masked-in row:
//   partial  m = max_v x_v, s = sum_v exp(x_v - m): one streaming read of the row, online (a
//            batch of values that raises the running max rescales s by exp(m_old - m_new) first;
//            partial (m, s) merge as (max, s_a e^(m_a - m) + s_b e^(m_b - m)), as the fused
//            kernel does: ce_device.cuh); z = x[label - B] if the label is in the shard, else 0;
//            with K = 4 stats rows also sum_v x_v / V as x_0 Vl / V + sum_v (x_v - x_0) / V
//            (x_0 the shard row's first logit, so the sum keeps f32 accuracy at any magnitude)
//   combine  one thread per row over the P shards in order: M = max m_p,
//            S = sum_p s_p e^(m_p - M), lse = M + log S, loss = (M - sum_p z_p) + log S
//            (M - z formed first, so logits of magnitude ~1e3 keep the loss's f32 accuracy);
//            label smoothing: (1 - eps)(M - z) + eps (M - mean) + log S; z-loss: + z lse^2
//   grad     x_v <- grad_scale * ((1 + 2 z lse) exp(x_v - lse) - (1 - eps)[v + B == label]
//            - eps / V): one read, one write
// Both row kernels treat a row as 16-byte vectors (8 bf16 or 4 f32) from its first 16-byte-aligned
// element, with the up to 2 x 7 elements before and after them as scalars, one per thread; a warp
// per row (8 rows per block) when the row is at most 4 KB, else a 256-thread block per row,
// kUnroll vectors in flight per thread. exp is ex2.approx of (x - m) * log2(e); statistics are
// f32; the logits never exist in f32 in memory. Results are deterministic (fixed reduction
// orders, no float atomics).
// Traffic per masked-in row of B = Vl * sizeof(logit) bytes: partial reads B, grad reads and
// writes B; combine reads 12 P bytes and writes 8. Masked rows read only the mask (and grad
// writes the zero row).
// Limits: logits contiguous and element-aligned; Vl < 2^31, vocab_total < 2^31; T < 2^31 rows.
// A bad label (outside [0, vocab_total), masked-in) makes the row's z NaN; the launcher reads the
// flag back and raises.
// The shared preconditions ran before (ops/loss.cpp); the launchers check what is theirs: logits
// bf16 or f32, element-aligned, within the 32-bit limits above; partials f32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/loss/ce_device.cuh"
#include "ops/loss.h"

namespace engine::cuda {
namespace {

using namespace ce;

constexpr int kUnroll = 4;                   // 16-byte loads in flight per thread
constexpr int kThreads = 256;                // both row paths and combine
constexpr int64_t kWarpRowsMaxBytes = 4096;  // rows up to this: a warp per row

struct VpParams {
  void* logits;                   // (T, Vl) bf16 or f32; grad: written in place
  const int32_t* labels;          // (T)
  const uint8_t* mask;            // (T)
  float* stats;                   // partial: (K, T), K = 3 or 4
  const float* lse;               // grad: (T)
  unsigned long long* bad_label;  // partial: min over bad rows of (row << 32 | label), else ~0
  int64_t rows;                   // T
  int64_t vocab_begin;            // B
  int64_t vocab_total;
  int32_t vocab;      // Vl
  int32_t stat_rows;  // partial: K (4: also the shard's share of the mean logit)
  float grad_scale;
  float z_loss;     // grad
  float eps;        // grad: label smoothing
  float inv_vocab;  // grad: 1 / vocab_total (label smoothing only)
};

// ---------------------------------------------------------------------------------------------
// partial: kGroup threads (a warp, or the whole block) per row.

template <typename T, int kGroup>
__global__ void __launch_bounds__(kThreads) ce_partial_kernel(const VpParams p) {
  static_assert(kGroup == 32 || kGroup == kThreads);
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup) + threadIdx.x / kGroup;
  if (row >= p.rows) return;  // whole groups only: a block-wide group never leaves early here
  if (!p.mask[row]) {
    if (lane == 0)
      for (int k = 0; k < p.stat_rows; ++k) p.stats[k * p.rows + row] = 0.f;
    return;
  }
  const T* x = static_cast<const T*>(p.logits) + row * p.vocab;
  const RowLayout l = row_layout(x, p.vocab);
  const uint4* body = reinterpret_cast<const uint4*>(x + l.head);
  const int ecol = lane < l.head + l.tail ? extra_col<T>(lane, l) : -1;

  float z = 0.f;
  if (lane == 0) {
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
  const float xe = ecol >= 0 ? to_float(x[ecol]) : -INFINITY;
  const bool with_sum = p.stat_rows == 4;
  const float x0 = with_sum && p.vocab > 0 ? to_float(x[0]) : 0.f;  // the sum's reference
  float xsum = with_sum && ecol >= 0 ? xe - x0 : 0.f;

  const Stat st =
      stream_row_stats<T, kGroup, kThreads, kUnroll>(body, l.nvec, lane, xe, with_sum, x0, xsum);
  if (lane == 0) {
    p.stats[row] = st.m;
    p.stats[p.rows + row] = st.s;
    p.stats[2 * p.rows + row] = z;
    if (with_sum) {
      const double inv_total = 1.0 / static_cast<double>(p.vocab_total);
      p.stats[3 * p.rows + row] =
          fmaf(x0, static_cast<float>(p.vocab * inv_total), xsum * static_cast<float>(inv_total));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// grad: kGroup threads per row; softmax = exp2((x - lse) * log2e), grad_vec with m = lse and
// log2 s = 0 (ce_device.cuh), the label's element (p - 1) * scale.

template <typename T, int kGroup>
__global__ void __launch_bounds__(kThreads) ce_grad_kernel(const VpParams p) {
  static_assert(kGroup == 32 || kGroup == kThreads);
  constexpr int kN = kVec<T>;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup) + threadIdx.x / kGroup;
  if (row >= p.rows) return;
  T* x = static_cast<T*>(p.logits) + row * p.vocab;
  const RowLayout l = row_layout(x, p.vocab);
  uint4* body = reinterpret_cast<uint4*>(x + l.head);
  const int ecol = lane < l.head + l.tail ? extra_col<T>(lane, l) : -1;

  if (!p.mask[row]) {
    for (int i = lane; i < l.nvec; i += kGroup) body[i] = make_uint4(0, 0, 0, 0);
    if (ecol >= 0) x[ecol] = from_float<T>(0.f);
    return;
  }
  const float lse = p.lse[row];
  const GradCoef coef = grad_coef(p.grad_scale, p.z_loss, lse, p.eps, p.inv_vocab);
  const int64_t local = static_cast<int64_t>(p.labels[row]) - p.vocab_begin;
  const int label = local >= 0 && local < p.vocab ? static_cast<int>(local) : -1;  // -1: none
  if (ecol >= 0)
    x[ecol] = from_float<T>(grad_scalar(to_float(x[ecol]), ecol == label, lse, 0.f, coef));
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
      if (j < l.nvec) body[j] = grad_vec<T>(u[k], l.head + j * kN, label, lse, 0.f, coef);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// combine: one thread per row, the shards in order.

__global__ void __launch_bounds__(kThreads)
    ce_combine_kernel(const float* partials, const uint8_t* mask, float* lse, float* losses,
                      int64_t shards, int64_t k, int64_t rows, float z_loss, float eps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (r >= rows) return;
  if (!mask[r]) {
    lse[r] = 0.f;
    losses[r] = 0.f;
    return;
  }
  float m = -INFINITY;
  for (int64_t q = 0; q < shards; ++q) m = fmaxf(m, partials[q * k * rows + r]);
  float s = 0.f, z = 0.f, mean = 0.f;
  for (int64_t q = 0; q < shards; ++q) {
    const float mq = partials[q * k * rows + r];
    if (mq != -INFINITY) s += partials[(q * k + 1) * rows + r] * expf(mq - m);  // empty: 0
    z += partials[(q * k + 2) * rows + r];
    if (k == 4) mean += partials[(q * k + 3) * rows + r];
  }
  const float ls = logf(s);
  const float l = m + ls;
  lse[r] = l;
  float loss = eps != 0.f ? fmaf(1.f - eps, m - z, eps * (m - mean)) + ls : (m - z) + ls;
  if (z_loss != 0.f) loss = fmaf(z_loss * l, l, loss);
  losses[r] = loss;
}

// ---------------------------------------------------------------------------------------------
// Host side.

// logits (T, Vl) bf16 or f32, element-aligned; returns the row path's group size.
int check_logits(const Tensor& logits, const char* op) {
  ENSURE(logits.dtype == DType::BF16 || logits.dtype == DType::F32, op, ": logits is ",
         dtype_name(logits.dtype), ", expected bf16 or f32");
  ENSURE(logits.size(1) <= INT32_MAX, op, ": a shard of ", logits.size(1), " columns is too wide");
  ENSURE(logits.size(0) <= INT32_MAX, op, ": ", logits.size(0), " rows are too many");
  ENSURE(reinterpret_cast<uintptr_t>(logits.data) % dtype_size(logits.dtype) == 0, op,
         ": logits are not aligned to their element size");
  return logits.size(1) * static_cast<int64_t>(dtype_size(logits.dtype)) <= kWarpRowsMaxBytes
             ? 32
             : kThreads;
}

// Launches kernel<T, group> over the rows: 8 rows per block (warps) or one per block.
template <typename Launch>
void launch_rows(DType dtype, int group, int64_t rows, Launch&& launch) {
  const unsigned blocks =
      static_cast<unsigned>(group == 32 ? ceil_div(rows, kThreads / 32) : rows);
  float_switch(dtype, [&](auto tag) { launch(tag, blocks); });
}

}  // namespace

void cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                           int64_t vocab_begin, int64_t vocab_total, const Tensor& stats) {
  const char* op = "cross_entropy_partial";
  const int group = check_logits(logits, op);
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(vocab_total <= INT32_MAX, op, ": logits hold columns [", vocab_begin, ", ",
         vocab_begin + v, "), not a shard of a vocabulary of ", vocab_total);
  const int64_t k = stats.size(0);  // 3, or 4 with the mean logit
  if (t == 0) return;

  Owned flag = empty({1}, DType::I64, Device::CUDA);
  CUDA_CHECK(cudaMemsetAsync(flag.t.data, 0xff, sizeof(unsigned long long), stream()));
  VpParams p{};
  p.logits = logits.data;
  p.labels = labels.ptr<int32_t>();
  p.mask = mask.ptr<uint8_t>();
  p.stats = stats.ptr<float>();
  p.bad_label = static_cast<unsigned long long*>(flag.t.data);
  p.rows = t;
  p.vocab_begin = vocab_begin;
  p.vocab_total = vocab_total;
  p.vocab = static_cast<int32_t>(v);
  p.stat_rows = static_cast<int32_t>(k);
  launch_rows(logits.dtype, group, t, [&](auto tag, unsigned blocks) {
    using T = decltype(tag);
    const auto kernel = group == 32 ? ce_partial_kernel<T, 32> : ce_partial_kernel<T, kThreads>;
    kernel<<<blocks, kThreads, 0, stream()>>>(p);
    check_launch("ce_partial_kernel");
  });

  unsigned long long bad = 0;
  device::copy(&bad, false, flag.t.data, true, sizeof bad);  // synchronises the compute stream
  if (bad != ~0ull) {
    const int64_t pos = static_cast<int64_t>(bad >> 32);
    const int32_t label = static_cast<int32_t>(static_cast<uint32_t>(bad & 0xffffffffu));
    RAISE(op, ": labels[", pos, "] = ", label, " out of range [0, ", vocab_total,
          ") at a masked-in token (position ", pos, ")");
  }
}

void cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                           const Tensor& losses, float z_loss, float label_smoothing) {
  const char* op = "cross_entropy_combine";
  ENSURE(partials.dtype == DType::F32, op, ": partials is ", dtype_name(partials.dtype),
         ", expected f32");
  const int64_t np = partials.size(0), k = partials.size(1), t = partials.size(2);
  if (t == 0) return;
  ce_combine_kernel<<<static_cast<unsigned>(ceil_div(t, kThreads)), kThreads, 0, stream()>>>(
      partials.ptr<float>(), mask.ptr<uint8_t>(), lse.ptr<float>(), losses.ptr<float>(), np, k, t,
      z_loss, label_smoothing);
  check_launch("ce_combine_kernel");
}

void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale, float z_loss,
                        float label_smoothing, int64_t vocab_total) {
  const char* op = "cross_entropy_grad";
  const int group = check_logits(logits, op);
  const int64_t t = logits.size(0), v = logits.size(1);
  if (t == 0) return;
  VpParams p{};
  p.logits = logits.data;
  p.labels = labels.ptr<int32_t>();
  p.mask = mask.ptr<uint8_t>();
  p.lse = lse.ptr<float>();
  p.rows = t;
  p.vocab_begin = vocab_begin;
  p.vocab = static_cast<int32_t>(v);
  p.grad_scale = grad_scale;
  p.z_loss = z_loss;
  p.eps = label_smoothing;
  p.inv_vocab =
      label_smoothing != 0 ? static_cast<float>(1.0 / static_cast<double>(vocab_total)) : 0.f;
  launch_rows(logits.dtype, group, t, [&](auto tag, unsigned blocks) {
    using T = decltype(tag);
    const auto kernel = group == 32 ? ce_grad_kernel<T, 32> : ce_grad_kernel<T, kThreads>;
    kernel<<<blocks, kThreads, 0, stream()>>>(p);
    check_launch("ce_grad_kernel");
  });
}

}  // namespace engine::cuda
