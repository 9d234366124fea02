// AdamW step on the GPU (ops/adamw.h), element by element over flat f32 buffers:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p = p - lr * (m / bc1 / (sqrt(v / bc2) + eps) + weight_decay * p)
//   compute_copy (optional, bf16 or f32) = p
// bc1 = 1 - b1^t and bc2 = 1 - b2^t are computed on the host in double and rounded to f32, as the
// CPU reference does; every operation is a correctly rounded IEEE f32 op written with the _rn
// intrinsics, in the reference's order, so no multiply-add is fused and the result matches the
// CPU bit for bit.
// Memory: each thread moves 4 elements of each array per step (16-byte f32 accesses, 8-byte bf16
// copy stores) in a grid-stride loop; misaligned heads are peeled, and buffers that disagree on
// their misalignment fall back to element accesses (cuda/common/vector.cuh). Reads 16 and
// writes 12 (+2 or 4 for the copy) bytes per element: judged against the copy bandwidth.
// Weight decay by runs (AdamWParams::decay_runs): the run table (up to kMaxRuns runs a launch)
// travels in the kernel's parameters; a thread finds the run of its first vector by bisection
// and walks forward from there (its vectors come in increasing order), each element taking its
// own run's decay. One launch updates a whole flat buffer (a longer table takes one launch per
// kMaxRuns runs).
// A split master (param u16, ops/split_master.h) runs adamw_split_kernel: the same update on
// the master joined from the bf16 weights' bits and param's, split again after it (reads 16 and
// writes 12 bytes per element, 4 fewer than an f32 master with its bf16 copy).
// Every precondition is checked before (ops/adamw.cpp): f32 state of one element count,
// compute_copy bf16, f32 or undefined (bf16 with a split master).
#include "ops/adamw.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"
#include "ops/split_master.h"

namespace engine::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kE = 4;          // elements per vector step: 16 bytes of f32
constexpr int kMaxRuns = 200;  // decay runs per launch (the table is a kernel parameter)

struct Hyper {
  float b1, b2, one_minus_b1, one_minus_b2, eps, grad_scale, bc1, bc2;  // (the lr is per run: RunTable)
};

// Run k covers [end[k - 1], end[k]) of the launch's range (end[count - 1] = its length).
struct RunTable {
  int count;
  int64_t end[kMaxRuns];
  float wd[kMaxRuns];
  float lr[kMaxRuns];  // ops::run_lr: lr x the run's lr_scale
};

// The run holding element i, searching forward from run r (i never below run r's start).
__device__ __forceinline__ int run_from(const RunTable& t, int r, int64_t i) {
  while (t.end[r] <= i) ++r;
  return r;
}

// The run holding element i, by bisection.
__device__ __forceinline__ int run_of(const RunTable& t, int64_t i) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (t.end[mid] <= i) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ void adamw_element(const Hyper& h, float wd, float lr, float& p, float g0,
                                              float& m, float& v) {
  const float g = __fmul_rn(g0, h.grad_scale);
  m = __fadd_rn(__fmul_rn(h.b1, m), __fmul_rn(h.one_minus_b1, g));
  v = __fadd_rn(__fmul_rn(h.b2, v), __fmul_rn(__fmul_rn(h.one_minus_b2, g), g));
  const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(v, h.bc2)), h.eps);
  const float update = __fadd_rn(__fdiv_rn(__fdiv_rn(m, h.bc1), denom), __fmul_rn(wd, p));
  p = __fsub_rn(p, __fmul_rn(lr, update));
}

// Copy is void (no copy), float or bf16_t.
template <typename Copy>
__global__ void adamw_kernel(Hyper h, const __grid_constant__ RunTable runs, float* param,
                             const float* grad, float* exp_avg, float* exp_avg_sq, Copy* copy,
                             int64_t n, int64_t head) {
  wait_for_previous_kernel();
  constexpr bool kCopy = !std::is_void_v<Copy>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t nvec = (n - head) / kE, tail = head + nvec * kE;
  int r = tid < nvec ? run_of(runs, head + tid * kE) : 0;  // the run of the current vector
  for (int64_t q = tid; q < nvec; q += stride) {
    const int64_t i = head + q * kE;
    r = run_from(runs, r, i);
    float p[kE], g[kE], m[kE], v[kE];
    load_pack(param + i, p);
    load_pack(grad + i, g);
    load_pack(exp_avg + i, m);
    load_pack(exp_avg_sq + i, v);
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      const int rk = run_from(runs, r, i + k);
      adamw_element(h, runs.wd[rk], runs.lr[rk], p[k], g[k], m[k], v[k]);
    }
    store_pack(param + i, p);
    store_pack(exp_avg + i, m);
    store_pack(exp_avg_sq + i, v);
    if constexpr (kCopy) store_pack(copy + i, p);
  }
  auto one = [&](int64_t i) {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    const int ri = run_of(runs, i);
    adamw_element(h, runs.wd[ri], runs.lr[ri], p, grad[i], m, v);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if constexpr (kCopy) copy[i] = from_float<Copy>(p);
  };
  for (int64_t i = tid; i < head; i += stride) one(i);
  for (int64_t i = tail + tid; i < n; i += stride) one(i);
}

// The split master: hi (the bf16 weights' bits) and lo, 4 elements a vector (8-byte accesses).
__device__ __forceinline__ void adamw_split_element(const Hyper& h, float wd, float lr, uint16_t& hi, uint16_t& lo,
                                                    float g, float& m, float& v) {
  float p = __uint_as_float(split_master_join(hi, lo));
  adamw_element(h, wd, lr, p, g, m, v);
  const uint32_t bits = __float_as_uint(p);
  hi = split_master_hi(bits);
  lo = split_master_lo(bits, hi);
}

__global__ void adamw_split_kernel(Hyper h, const __grid_constant__ RunTable runs, uint16_t* lo,
                                   const float* grad, float* exp_avg, float* exp_avg_sq, uint16_t* hi,
                                   int64_t n, int64_t head) {
  wait_for_previous_kernel();
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t nvec = (n - head) / kE, tail = head + nvec * kE;
  using Half = Pack<uint16_t, kE>;
  int r = tid < nvec ? run_of(runs, head + tid * kE) : 0;
  for (int64_t q = tid; q < nvec; q += stride) {
    const int64_t i = head + q * kE;
    r = run_from(runs, r, i);
    float g[kE], m[kE], v[kE];
    Half ph = *reinterpret_cast<const Half*>(hi + i), pl = *reinterpret_cast<const Half*>(lo + i);
    load_pack(grad + i, g);
    load_pack(exp_avg + i, m);
    load_pack(exp_avg_sq + i, v);
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      const int rk = run_from(runs, r, i + k);
      adamw_split_element(h, runs.wd[rk], runs.lr[rk], ph.v[k], pl.v[k], g[k], m[k], v[k]);
    }
    *reinterpret_cast<Half*>(hi + i) = ph;
    *reinterpret_cast<Half*>(lo + i) = pl;
    store_pack(exp_avg + i, m);
    store_pack(exp_avg_sq + i, v);
  }
  auto one = [&](int64_t i) {
    float m = exp_avg[i], v = exp_avg_sq[i];
    const int ri = run_of(runs, i);
    adamw_split_element(h, runs.wd[ri], runs.lr[ri], hi[i], lo[i], grad[i], m, v);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  };
  for (int64_t i = tid; i < head; i += stride) one(i);
  for (int64_t i = tail + tid; i < n; i += stride) one(i);
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const ops::AdamWParams& p, const Tensor& compute_copy) {
  const int64_t n = param.numel();
  const bool copy = compute_copy.data != nullptr;
  if (n == 0) return;
  const auto t = static_cast<double>(p.step);
  Hyper h{};
  h.b1 = p.beta1;
  h.b2 = p.beta2;
  h.one_minus_b1 = 1.f - p.beta1;
  h.one_minus_b2 = 1.f - p.beta2;
  h.eps = p.eps;
  h.grad_scale = p.grad_scale;
  h.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), t));
  h.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), t));
  std::vector<ops::DecayRun> all = p.decay_runs;
  if (all.empty()) all.push_back({n, p.weight_decay, 1.f});

  // One launch per kMaxRuns runs, over their range [begin, end).
  for (size_t first = 0; first < all.size(); first += kMaxRuns) {
    const size_t count = std::min<size_t>(kMaxRuns, all.size() - first);
    const int64_t begin = first == 0 ? 0 : all[first - 1].end, end = all[first + count - 1].end;
    RunTable runs{};
    runs.count = static_cast<int>(count);
    for (size_t k = 0; k < count; ++k) {
      runs.end[k] = all[first + k].end - begin;
      runs.wd[k] = all[first + k].weight_decay;
      runs.lr[k] = ops::run_lr(p, all[first + k]);
    }
    const int64_t len = end - begin;
    if (param.dtype == DType::U16) {  // split master: param holds the low halves, the copy the high
      auto* lo = static_cast<uint16_t*>(param.data) + begin;
      auto* hi = static_cast<uint16_t*>(compute_copy.data) + begin;
      auto* sg = static_cast<const float*>(grad.data) + begin;
      auto* sm = static_cast<float*>(exp_avg.data) + begin;
      auto* sv = static_cast<float*>(exp_avg_sq.data) + begin;
      const int64_t head = vector_head({{lo, 2}, {hi, 2}, {sg, 4}, {sm, 4}, {sv, 4}}, kE, len);
      const int64_t want = std::max<int64_t>(1, ceil_div(vector_items(len, head, kE), kThreads));
      const auto blocks = static_cast<unsigned>(persistent_grid(adamw_split_kernel, kThreads, 0, want));
      launch_dependent(adamw_split_kernel, blocks, kThreads, 0, h, runs, lo, sg, sm, sv, hi, len, head);
      check_launch("adamw_split_kernel");
      continue;
    }
    auto* pp = static_cast<float*>(param.data) + begin;
    auto* pg = static_cast<const float*>(grad.data) + begin;
    auto* pm = static_cast<float*>(exp_avg.data) + begin;
    auto* pv = static_cast<float*>(exp_avg_sq.data) + begin;
    const size_t copy_elem = copy ? dtype_size(compute_copy.dtype) : 0;
    void* pc = copy ? static_cast<char*>(compute_copy.data) + begin * copy_elem : nullptr;
    const int64_t head =
        vector_head({{pp, 4}, {pg, 4}, {pm, 4}, {pv, 4}, {pc, copy_elem}}, kE, len);
    // One wave of the blocks that fit at once, not stream_blocks' 8 a multiprocessor: with 8 a
    // second, partial wave followed the first, which was slower (figures: docs/PERF.md).
    const int64_t want = std::max<int64_t>(1, ceil_div(vector_items(len, head, kE), kThreads));
    auto go = [&](auto kernel, auto* pcopy, const char* name) {
      const auto blocks = static_cast<unsigned>(persistent_grid(kernel, kThreads, 0, want));
      launch_dependent(kernel, blocks, kThreads, 0, h, runs, pp, pg, pm, pv, pcopy, len, head);
      check_launch(name);
    };
    if (!copy)
      go(adamw_kernel<void>, static_cast<void*>(nullptr), "adamw_kernel");
    else if (compute_copy.dtype == DType::BF16)
      go(adamw_kernel<bf16_t>, static_cast<bf16_t*>(pc), "adamw_kernel<bf16 copy>");
    else
      go(adamw_kernel<float>, static_cast<float*>(pc), "adamw_kernel<f32 copy>");
  }
}

}  // namespace engine::cuda
