// Layer norms over the last dimension of x (T, C). A row lives in registers, as packs: a pack is
// one 16-byte vector (8 bf16 or 4 f32) when C is a multiple of it and every pointer is 16-byte
// aligned, else one element (scalar variant).
//   forward:  mean = sum(x) / C (layernorm; 0 for rmsnorm), var = sum((x - mean)^2) / C (two
//             passes over the registers), rstd = 1 / sqrt(var + eps), y = (x - mean) rstd w (+ b)
//   backward: xhat = (x - mean) rstd, g = dy w,
//             dx = rstd (g - mean(g) - xhat mean(g xhat))        (mean(g): layernorm only)
//             dweight += sum_t dy xhat,  dbias += sum_t dy
// Kernels (their figures: docs/PERF.md):
//   - rmsnorm forward (plain and residual), 16-byte packs, 65..512 packs: one row per block of
//     a plain grid, two packs per thread (norm_forward_row_kernel). Nothing is kept across rows,
//     so a thread needs few registers and many blocks fit per multiprocessor: their loads are
//     the bytes in flight. The weight packs are all asked for before the first store (a load
//     after a store of y would wait for it: y may alias the weight as far as the compiler knows);
//   - layernorm forward, 16-byte packs, C <= 512 packs, plain: one warp per row (warp sums
//     only, no barrier, every load of the row in flight at once; 4 rows per block, a plain grid);
//   - the other forwards (layernorm + residual, scalar packs, other widths): one block per row
//     of a persistent grid, thread i holding packs i, i + B, ..., i + (K-1) B and its columns'
//     weight and bias packs for all its rows, the next row loaded before this one is reduced;
//     which kernel serves which case: launch_forward;
//   - backward, 16-byte packs, C <= 128 packs (bf16 C <= 1024, f32 C <= 512): one warp per row
//     of a persistent grid (norm_backward_warp_kernel: lane l holds packs l, l + 32, ...; the two
//     row sums are warp butterflies, no barrier; the per-column sums in registers per lane, added
//     over the block's warps in warp order at the end; the weight packs in shared memory). bf16
//     loads each row at the top of its iteration, 8 warps per block, 16 warps per multiprocessor;
//     f32 loads the warp's next row before this one is reduced, 4 warps per block. The grid is
//     trimmed so that every warp has the same number of rows (balanced_blocks). With kColSum
//     (the residual forms' dx_colsum) each warp also adds the dx it stores, as rounded, into its
//     own float4 slots of shared memory (in registers they would spill), and they join the
//     block's partial rows like dw and db: no second pass over dx;
//   - backward, the other layouts: one block per row of a persistent grid, at least 2 packs per
//     thread where C allows (fewer, fatter threads keep more bytes in flight per register), the
//     next row's x and dy loaded before this row is reduced, the weight packs held in registers,
//     the per-column sums in shared memory (up to 48 KB of them: past the default by the
//     kernel's static 512 bytes, so it asks for that once) or in registers. With kColSum the dx
//     column sums are a third such sum beside dw and db. The plain layernorm in 128-thread rows
//     (C 1025..2048 in bf16) runs four such rows a block, each group of 128 threads behind its
//     own named barrier with its own column sums, added in group order at the end: a quarter of
//     the partial rows. The residual forms and rmsnorm keep one row a block (groups were slower
//     there). Both backward kernels compute xhat and dx in FMA forms (fewer instructions).
// Residual forms (kResidual): the forward loads the residual's packs beside x's, adds them in f32
// and rounds to T in registers (the add kernel's arithmetic), writes that pack to sum and
// normalises it unchanged; the backward loads dresidual's packs before the row's sums and adds
// them to dx rounded to T (__fadd_rn: never contracted into an FMA, so f32 rounds as the
// separate add does). The plain instantiations are the kernels as they were.
// Every sum is f32 in a fixed order (shuffle trees, warps and blocks in index order): bitwise
// reproducible (for a given device: the persistent grids follow its multiprocessor count).
// Weight gradients without float atomics: each block keeps per-column partial sums of its rows
// (shared memory or registers) and writes them to a scratch (blocks, C) f32 buffer taken from the
// caching allocator; a second kernel adds the partials into dweight / dbias in a fixed order
// (norm_param_grad_kernel: 8 columns a block, 128 row lanes, every partial row in flight at
// once, launched as a programmatic dependent of the first so that it waits resident rather than
// being launched after it). One kernel with a grid barrier before the final sums was slower:
// every block waits for the slowest, then few blocks share the sums.
// Memory: x, weight, bias, y, dy, dx all bf16 or all f32; mean, rstd, dweight, dbias f32. Each
// row is read by one warp or block before it writes that row, so y may alias x (or residual),
// sum may alias x or residual, and dx may alias dy, x or dresidual.
// Limits: C <= 8192 (at most 16 vector elements or 8 scalar elements per thread, blocks of at
// most 512 / 1024 threads), C >= 1, T < 2^31.
// The shared preconditions ran before (ops/norm.cpp); the launchers check what is theirs: x in
// bf16 or f32, T < 2^31, C within the kernels' widths, 16-byte alignment for the packs.
// Files: this one (the forward kernels and the four forward ops), norm_backward.cu (the
// backward kernels and the four backward ops), norm_common.cuh (what both use).
#include "ops/norm.h"

#include <algorithm>
#include <cstdint>

#include "cuda/fp8/amax.cuh"
#include "cuda/norm/norm_common.cuh"

namespace engine::cuda {

using namespace norm_detail;

constexpr int kWarpRowWarps = 4;         // warp-per-row forward: rows (warps) per block
constexpr int kMaxWarpPacks = 16;        // warp-per-row forward: packs per lane (C <= 512 packs)
constexpr int kRowThreads = 256;         // row-per-block forward: block size cap
constexpr int kRowMinBlocks = 4;         // ... and 4 such blocks resident: <= 64 registers

// x += r in f32, rounded to T: the add kernel's x + r (bf16: round to nearest even).
template <typename T, int N>
static __device__ __forceinline__ void add_rounded(Pack<T, N>& x, const Pack<T, N>& r) {
#pragma unroll
  for (int j = 0; j < N; ++j) x.v[j] = from_float<T>(__fadd_rn(to_float(x.v[j]), to_float(r.v[j])));
}

// N: elements per pack (16-byte vector or 1); K: packs per thread; kCentered: layernorm;
// kResidual: the row normalised is x + residual, rounded to T and written to sum.
// The next row of the block is loaded before this row's reductions, so its latency overlaps them.
template <typename T, int N, int K, bool kCentered, bool kResidual>
static __global__ void __launch_bounds__(N == 1 ? kMaxScalarThreads : kMaxVecThreads)
    norm_forward_kernel(const NormFwdParams<T> p) {
  wait_for_previous_kernel();
  __shared__ float smem[2 * 32];
  int phase = 0;
  const int64_t packs = p.cols / N;
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  constexpr int KR = kResidual ? K : 1;  // residual packs held (unused by the plain form)
  Pack<T, N> cur[K], nxt[K], rcur[KR], rnxt[KR], wk[K], bk[K];
  load_row<T, N, K>(p.x, blockIdx.x, p.cols, packs, cur);  // the grid has at most one block per row
  if constexpr (kResidual) load_row<T, N, K>(p.residual, blockIdx.x, p.cols, packs, rcur);
  // The weight and bias packs of the thread's columns, held for all the block's rows (loaded
  // beside the stores of y, each would wait for the store before it: y may alias them as far as
  // the compiler knows).
  load_row<T, N, K>(p.weight, 0, p.cols, packs, wk);
  if (p.bias) load_row<T, N, K>(p.bias, 0, p.cols, packs, bk);
  unsigned m = 0;  // y's largest magnitude (the amax), over the block's rows
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    if (row + gridDim.x < p.rows) {
      load_row<T, N, K>(p.x, row + gridDim.x, p.cols, packs, nxt);
      if constexpr (kResidual) load_row<T, N, K>(p.residual, row + gridDim.x, p.cols, packs, rnxt);
    }
    if constexpr (kResidual) {
      Pack<T, N>* sr = reinterpret_cast<Pack<T, N>*>(p.sum + row * p.cols);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t q = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (q < packs) {
          add_rounded<T, N>(cur[k], rcur[k]);
          sr[q] = cur[k];
        }
      }
    }
    float v[K][N];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t q = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (q < packs) {
        unpack<T, N>(cur[k], v[k]);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) v[k][j] = 0.f;
      }
    }
    float mu = 0.f;
    if constexpr (kCentered) {
      float s[1] = {0.f};
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int j = 0; j < N; ++j) s[0] += v[k][j];
      block_sum(s, smem, phase);
      mu = s[0] * inv_cols;
    }
    float ss[1] = {0.f};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t q = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (q < packs) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float d = v[k][j] - mu;
          ss[0] += d * d;
        }
      }
    }
    block_sum(ss, smem, phase);
    const float rs = rsqrtf(ss[0] * inv_cols + p.eps);
    T* yr = p.y + row * p.cols;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t q = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (q < packs) {
        float w[N], b[N], o[N];
        unpack<T, N>(wk[k], w);
        if (p.bias) {
          unpack<T, N>(bk[k], b);
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) b[j] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < N; ++j) {
          o[j] = (v[k][j] - mu) * rs * w[j] + b[j];
          m = max(m, stored_magnitude<T>(o[j]));
        }
        store_pack<T, N>(yr + q * N, o);
      }
    }
    if (threadIdx.x == 0) {
      if constexpr (kCentered) p.mean[row] = mu;
      p.rstd[row] = rs;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      cur[k] = nxt[k];
      if constexpr (kResidual) rcur[k] = rnxt[k];
    }
  }
  commit_amax(m, p.amax);
}

// The rmsnorm forward, one row per block of a plain grid (blocks start as others finish), thread
// i holding packs i, i + B, ..., i + (K-1) B as raw vectors: no prefetch of another row and
// nothing kept across rows, so few registers and many blocks resident per multiprocessor, which
// keeps enough bytes in flight. The weight packs are all asked for before the first store of y
// (y may alias them as far as the compiler knows, so a load after a store would wait for it).
// Layernorm does not use it (two reductions: 62 registers, slower; see launch_forward).
template <typename T, int N, int K, bool kResidual>
static __global__ void __launch_bounds__(kRowThreads, kRowMinBlocks)
    norm_forward_row_kernel(const NormFwdParams<T> p) {
  wait_for_previous_kernel();
  __shared__ float smem[2 * 32];
  int phase = 0;
  const int packs = static_cast<int>(p.cols / N);
  const int64_t row = blockIdx.x;
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  Pack<T, N> raw[K];
  load_row<T, N, K>(p.x, row, p.cols, packs, raw);
  if constexpr (kResidual) {
    Pack<T, N> res[K];
    load_row<T, N, K>(p.residual, row, p.cols, packs, res);
    Pack<T, N>* sr = reinterpret_cast<Pack<T, N>*>(p.sum + row * p.cols);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int q = threadIdx.x + k * blockDim.x;
      if (q < packs) {
        add_rounded<T, N>(raw[k], res[k]);
        sr[q] = raw[k];
      }
    }
  }
  float ss[1] = {0.f};
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (static_cast<int>(threadIdx.x + k * blockDim.x) < packs)
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float v = to_float(raw[k].v[j]);
        ss[0] += v * v;
      }
  block_sum(ss, smem, phase);
  const float rs = rsqrtf(ss[0] * inv_cols + p.eps);
  Pack<T, N> wk[K];
  load_row<T, N, K>(p.weight, 0, p.cols, packs, wk);
  T* yr = p.y + row * p.cols;
  unsigned m = 0;  // y's largest magnitude (the amax)
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int q = threadIdx.x + k * blockDim.x;
    if (q < packs) {
      float o[N];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        o[j] = to_float(raw[k].v[j]) * rs * to_float(wk[k].v[j]);
        m = max(m, stored_magnitude<T>(o[j]));
      }
      store_pack<T, N>(yr + q * N, o);
    }
  }
  if (threadIdx.x == 0) p.rstd[row] = rs;
  commit_amax(m, p.amax);
}

// The plain layernorm forward, a warp per row (16-byte packs, C <= 32 kMaxWarpPacks packs): warp
// w of the block normalises row blockIdx.x * kWarpRowWarps + w; lane l holds packs l, l + 32, ...
// of the row as raw vectors (all K loads in flight at once), and the sums are warp butterflies
// (no barrier). Independent warps keep many rows in flight per multiprocessor while others
// reduce. (The residual forms measured faster in the other kernels: launch_forward.)
template <typename T, int N, int K>
static __global__ void __launch_bounds__(kWarpRowWarps * 32)
    norm_forward_warp_kernel(const NormFwdParams<T> p) {
  wait_for_previous_kernel();
  const int lane = threadIdx.x & 31;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kWarpRowWarps + static_cast<int>(threadIdx.x >> 5);
  if (row >= p.rows) return;
  const int packs = static_cast<int>(p.cols / N);
  const Pack<T, N>* xr = reinterpret_cast<const Pack<T, N>*>(p.x + row * p.cols);
  Pack<T, N> raw[K];
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < packs) raw[k] = xr[lane + 32 * k];
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  float s[1] = {0.f};
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < packs)
#pragma unroll
      for (int j = 0; j < N; ++j) s[0] += to_float(raw[k].v[j]);
  warp_sum(s);
  const float mu = s[0] * inv_cols;
  float ss[1] = {0.f};
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < packs)
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float d = to_float(raw[k].v[j]) - mu;
        ss[0] += d * d;
      }
  warp_sum(ss);
  const float rs = rsqrtf(ss[0] * inv_cols + p.eps);
  T* yr = p.y + row * p.cols;
  unsigned m = 0;  // y's largest magnitude (the amax)
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int q = lane + 32 * k;
    if (q < packs) {
      float w[N], b[N], o[N];
      load_pack<T, N>(p.weight + q * N, w);
      if (p.bias) {
        load_pack<T, N>(p.bias + q * N, b);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) b[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < N; ++j) {
        o[j] = (to_float(raw[k].v[j]) - mu) * rs * w[j] + b[j];
        m = max(m, stored_magnitude<T>(o[j]));
      }
      store_pack<T, N>(yr + q * N, o);
    }
  }
  if (lane == 0) {
    p.mean[row] = mu;
    p.rstd[row] = rs;
  }
  commit_amax(m, p.amax);  // (the whole warp has this row, so every lane is here)
}

// ---------------------------------------------------------------------------------------------
// Host side.

// Packs per lane of the warp-per-row forward for `packs` 16-byte packs: the smallest power of
// two covering the row with 32 lanes (0: the row is too wide for one warp).
static int warp_row_packs(int64_t packs) {
  for (int k = 1; k <= kMaxWarpPacks; k *= 2)
    if (32 * k >= packs) return k;
  return 0;
}

template <typename T, int K>
static void launch_forward_warp(const NormFwdParams<T>& p) {
  constexpr int V = 16 / sizeof(T);
  const auto grid = static_cast<unsigned>(ceil_div(p.rows, kWarpRowWarps));
  launch_dependent(norm_forward_warp_kernel<T, V, K>, grid, kWarpRowWarps * 32, 0, p);
  check_launch("layernorm_forward_kernel");
}

template <typename T, bool kCentered, bool kResidual>
static void launch_forward(const NormFwdParams<T>& p, const RowPlan& plan) {
  constexpr int V = 16 / sizeof(T);
  // Which kernel (the fastest of the three in `./bench memory_bound`; figures: docs/PERF.md):
  //   rmsnorm, 16-byte packs, 64..256 threads at two packs each: one row per block of a plain
  //     grid, plain and residual;
  //   layernorm, 16-byte packs, plain: warp per row (a row per block needs 62 registers a
  //     thread for the two reductions, so fewer blocks fit);
  //   layernorm + residual: the persistent block kernel;
  //   every other layout (scalar packs, rows too wide or too narrow): the persistent block
  //     kernel.
  if (plan.vec) {
    if constexpr (!kCentered) {
      const int threads = round_up_warp(ceil_div(p.cols / V, 2));
      if (threads >= 64 && threads <= kRowThreads) {
        launch_dependent(norm_forward_row_kernel<T, V, 2, kResidual>, static_cast<unsigned>(p.rows),
                         static_cast<unsigned>(threads), 0, p);
        return check_launch("rmsnorm_forward_kernel");
      }
    }
    if constexpr (kCentered && !kResidual) {
      switch (warp_row_packs(p.cols / V)) {
        case 1: return launch_forward_warp<T, 1>(p);
        case 2: return launch_forward_warp<T, 2>(p);
        case 4: return launch_forward_warp<T, 4>(p);
        case 8: return launch_forward_warp<T, 8>(p);
        case 16: return launch_forward_warp<T, 16>(p);
        default: break;
      }
    }
  }
  plan_switch<T>(plan, "norm forward", [&](auto n, auto k) {
    auto kernel =
        norm_forward_kernel<T, decltype(n)::value, decltype(k)::value, kCentered, kResidual>;
    const int grid = persistent_grid(kernel, plan.threads, 0, p.rows);
    launch_dependent(kernel, grid, plan.threads, 0, p);
    check_launch(kCentered ? "layernorm_forward_kernel" : "rmsnorm_forward_kernel");
  });
}

// mean == nullptr: rmsnorm. residual == nullptr: the plain form (sum unused), else both given.
static void norm_forward(const char* op, const Tensor& x, const Tensor* residual,
                         const Tensor& weight, const Tensor* bias, float eps, const Tensor* sum,
                         const Tensor& y, const Tensor* mean, const Tensor& rstd, const Tensor& amax) {
  auto [rows, cols] = check_x(x, op);
  const bool res = residual != nullptr;
  const bool has_bias = bias && bias->data;
  float* pa = zero_amax(amax);
  if (rows == 0) return;
  const bool aligned = aligned16(x.data) && aligned16(weight.data) && aligned16(y.data) &&
                       (!has_bias || aligned16(bias->data)) &&
                       (!res || (aligned16(residual->data) && aligned16(sum->data)));
  const RowPlan plan = plan_rows(cols, static_cast<int>(16 / dtype_size(x.dtype)), aligned, op);
  float_switch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    NormFwdParams<T> p{};
    p.x = static_cast<const T*>(x.data);
    p.residual = res ? static_cast<const T*>(residual->data) : nullptr;
    p.sum = res ? static_cast<T*>(sum->data) : nullptr;
    p.weight = static_cast<const T*>(weight.data);
    p.bias = has_bias ? static_cast<const T*>(bias->data) : nullptr;
    p.y = static_cast<T*>(y.data);
    p.mean = mean ? static_cast<float*>(mean->data) : nullptr;
    p.rstd = static_cast<float*>(rstd.data);
    p.amax = pa;
    p.rows = rows;
    p.cols = cols;
    p.eps = eps;
    if (mean && res)
      launch_forward<T, true, true>(p, plan);
    else if (mean)
      launch_forward<T, true, false>(p, plan);
    else if (res)
      launch_forward<T, false, true>(p, plan);
    else
      launch_forward<T, false, false>(p, plan);
  });
}

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& amax) {
  norm_forward("layernorm_forward", x, nullptr, weight, &bias, eps, nullptr, y, &mean, rstd, amax);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                     const Tensor& rstd, const Tensor& amax) {
  norm_forward("rmsnorm_forward", x, nullptr, weight, nullptr, eps, nullptr, y, nullptr, rstd, amax);
}

void layernorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, float eps, const Tensor& sum, const Tensor& y,
                                const Tensor& mean, const Tensor& rstd, const Tensor& amax) {
  norm_forward("layernorm_residual_forward", x, &residual, weight, &bias, eps, &sum, y, &mean,
               rstd, amax);
}

void rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              float eps, const Tensor& sum, const Tensor& y, const Tensor& rstd,
                              const Tensor& amax) {
  norm_forward("rmsnorm_residual_forward", x, &residual, weight, nullptr, eps, &sum, y, nullptr,
               rstd, amax);
}

}  // namespace engine::cuda
