// The layer norms' backward kernels and launchers (the contract, the kernels' design and their
// measurements: norm.cu's header; shared pieces: norm_common.cuh).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/buffer.h"
#include "ops/norm.h"
#include "cuda/norm/norm_common.cuh"

namespace engine::cuda {

using namespace norm_detail;

constexpr int kBwdMinPacks = 2;          // backward: at least 2 packs per thread where C allows
constexpr int kRowGroups = 4;            // block-per-row plain layernorm backward: rows a block
constexpr size_t kMaxAccSmem = 48 * 1024;  // backward: column sums in shared memory up to this
// Second pass (the partial rows' sums): blocks of kGradLanes row lanes x kGradGroups groups of
// 4 columns, kGradUnroll partial rows in flight per thread.
constexpr int kGradGroups = 2;
constexpr int kGradLanes = 128;
constexpr int kGradThreads = kGradGroups * kGradLanes;
constexpr int kGradUnroll = 8;

// Backward, one block per row of a persistent grid. The thread's packs (columns) are the same
// in every row, so its weight packs stay in registers. Rows come through D + 1 register stages:
// row r + D G (G = gridDim.x RG) is asked for before row r is reduced (D = 1; D = 0: no prefetch,
// for the scalar variant and wide rows, where the stages would spill). xhat and g are recomputed
// from the raw packs in the second pass rather than kept. kSmemAcc: the per-column sums of
// dy xhat and dy live in shared memory (each thread owns its columns' float4 slots, so no barrier
// or atomics) instead of registers, which leaves registers for more resident blocks. kColSum:
// the same for the column sums of dx as stored (the residual forms' dx_colsum). RG > 1 (with
// kSmemAcc): the block is RG groups of blockDim / RG threads, each group a row at a time (rows
// b RG + grp, then every RG G-th), its row sums behind its own named barrier and its own column
// sums, which the block adds in group order at the end: one partial row per RG rows in flight,
// a quarter of the partial rows' traffic at RG = 4. Both passes use FMA forms: xhat = x rs +
// (-mu rs), dx = g rs + (x a + b) with a = -rs^2 mean(g xhat), b = -a mu - rs mean(g): fewer
// instructions than (x - mu) rs and rs (g - mean(g) - xhat mean(g xhat)). Their rounding differs
// from those forms' in the last bits (the mean's share of x is rounded once in b): within the f32
// tolerances of the tests.
template <typename T, int N, int K, int D, bool kCentered, bool kSmemAcc, bool kResidual,
          bool kColSum, int RG>
static __global__ void __launch_bounds__(N == 1 ? kMaxScalarThreads : kMaxVecThreads)
    norm_backward_kernel(const NormBwdParams<T> p) {
  static_assert(RG == 1 || kSmemAcc, "row groups need the column sums in shared memory");
  wait_for_previous_kernel();  // and the partial rows' sums (norm_param_grad_kernel) may launch
  constexpr int S = D + 1;  // ring stages
  // RG groups of B threads, each a row at a time: thread t of group grp.
  const unsigned B = RG == 1 ? blockDim.x : blockDim.x / RG;
  const unsigned t = RG == 1 ? threadIdx.x : threadIdx.x % B;
  const int grp = RG == 1 ? 0 : static_cast<int>(threadIdx.x / B);
  constexpr int kRegN = kSmemAcc ? 1 : N;
  constexpr int kRegC = kColSum && !kSmemAcc ? N : 1;  // dx sums in registers
  constexpr int kDxSlot = (kCentered ? 2 : 1) * (N / 4);  // kSmemAcc: the dx sums' first float4
  __shared__ float smem_all[RG][2 * 32 * 2];
  float* smem = smem_all[grp];
  // kSmemAcc: dw, then db (kCentered), then the dx sums (kColSum); float4 c of pack q of the
  // quantity starting at float4 b lives at (b + c) packs + q, group grp's at grp slots + that.
  extern __shared__ float4 acc_all[];
  constexpr int kQuantities = (kCentered ? 2 : 1) + (kColSum ? 1 : 0);
  int phase = 0;
  const int64_t packs = p.cols / N;
  const int64_t slots = kQuantities * (N / 4) * packs;  // float4 per group (kSmemAcc)
  float4* acc_smem = acc_all + (kSmemAcc ? grp * slots : 0);
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  auto pack_of = [&](int k) { return t + static_cast<int64_t>(k) * B; };
  float dw[K][kRegN], db[K][kRegN], dxs[K][kRegC];
  Pack<T, N> w[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int j = 0; j < kRegN; ++j) dw[k][j] = db[k][j] = 0.f;
#pragma unroll
    for (int j = 0; j < kRegC; ++j) dxs[k][j] = 0.f;
    if (pack_of(k) < packs) {
      w[k] = reinterpret_cast<const Pack<T, N>*>(p.weight)[pack_of(k)];
      if constexpr (kSmemAcc) {
#pragma unroll
        for (int c = 0; c < N / 4; ++c) {
          acc_smem[c * packs + pack_of(k)] = make_float4(0.f, 0.f, 0.f, 0.f);
          if constexpr (kCentered)
            acc_smem[(N / 4 + c) * packs + pack_of(k)] = make_float4(0.f, 0.f, 0.f, 0.f);
          if constexpr (kColSum)
            acc_smem[(kDxSlot + c) * packs + pack_of(k)] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
    }
  }
  Pack<T, N> xs[S][K], ds[S][K];
  float mus[S], rss[S];
  auto load = [&](int64_t r, Pack<T, N>(&xd)[K], Pack<T, N>(&dd)[K], float& mu, float& rs) {
    load_row<T, N, K>(p.x, r, p.cols, packs, xd, t, B);
    load_row<T, N, K>(p.dy, r, p.cols, packs, dd, t, B);
    mu = kCentered ? p.mean[r] : 0.f;
    rs = p.rstd[r];
  };
  const int64_t g = static_cast<int64_t>(gridDim.x) * RG;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * RG + grp;
#pragma unroll
  for (int s = 0; s < D; ++s)
    if (first + s * g < p.rows) load(first + s * g, xs[s], ds[s], mus[s], rss[s]);
  for (int64_t row = first; row < p.rows; row += g) {
    if (row + D * g < p.rows) load(row + D * g, xs[D], ds[D], mus[D], rss[D]);
    const float mu = mus[0], rs = rss[0];
    const float nmr = -mu * rs;  // xhat = x rs + nmr
    float s[2] = {0.f, 0.f};  // sum g, sum g xhat
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (pack_of(k) < packs) {
        float pw[N], pb[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float dv = to_float(ds[0][k].v[j]);
          const float xh = kCentered ? fmaf(to_float(xs[0][k].v[j]), rs, nmr)
                                     : to_float(xs[0][k].v[j]) * rs;
          const float gv = dv * to_float(w[k].v[j]);
          s[0] += gv;
          s[1] += gv * xh;
          pw[j] = dv * xh;
          pb[j] = dv;
        }
        if constexpr (kSmemAcc) {
#pragma unroll
          for (int c = 0; c < N / 4; ++c) {
            float4& a = acc_smem[c * packs + pack_of(k)];
            a.x += pw[4 * c], a.y += pw[4 * c + 1], a.z += pw[4 * c + 2], a.w += pw[4 * c + 3];
            if constexpr (kCentered) {
              float4& e = acc_smem[(N / 4 + c) * packs + pack_of(k)];
              e.x += pb[4 * c], e.y += pb[4 * c + 1], e.z += pb[4 * c + 2], e.w += pb[4 * c + 3];
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < kRegN; ++j) {
            dw[k][j] += pw[j];
            if constexpr (kCentered) db[k][j] += pb[j];
          }
        }
      }
    }
    // kResidual: this row's dresidual packs, asked for before the block sum's barrier.
    constexpr int KR = kResidual ? K : 1;
    Pack<T, N> dr[KR];
    if constexpr (kResidual) load_row<T, N, K>(p.dresidual, row, p.cols, packs, dr, t, B);
    if constexpr (RG == 1)
      block_sum(s, smem, phase);
    else
      group_sum(s, smem, phase, static_cast<int>(t), static_cast<int>(B), grp);
    const float mg = kCentered ? s[0] * inv_cols : 0.f;
    const float mgx = s[1] * inv_cols;
    // dx = rs (g - mg - xhat mgx) = g rs + (x a + b): a = -rs^2 mgx, b = -a mu - rs mg.
    const float ca = -rs * rs * mgx;
    const float cb = kCentered ? fmaf(-ca, mu, -rs * mg) : 0.f;
    T* dxr = p.dx + row * p.cols;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (pack_of(k) < packs) {
        float o[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float gv = to_float(ds[0][k].v[j]) * to_float(w[k].v[j]);
          const float xa = kCentered ? fmaf(to_float(xs[0][k].v[j]), ca, cb)
                                     : to_float(xs[0][k].v[j]) * ca;
          o[j] = fmaf(gv, rs, xa);
          if constexpr (kResidual)
            o[j] = __fadd_rn(to_float(from_float<T>(o[j])), to_float(dr[k].v[j]));
        }
        store_pack<T, N>(dxr + pack_of(k) * N, o);
        if constexpr (kColSum) {  // dx as stored
          float st[N];
#pragma unroll
          for (int j = 0; j < N; ++j) st[j] = to_float(from_float<T>(o[j]));
          if constexpr (kSmemAcc) {
#pragma unroll
            for (int c = 0; c < N / 4; ++c) {
              float4& a = acc_smem[(kDxSlot + c) * packs + pack_of(k)];
              a.x += st[4 * c], a.y += st[4 * c + 1], a.z += st[4 * c + 2], a.w += st[4 * c + 3];
            }
          } else {
#pragma unroll
            for (int j = 0; j < kRegC; ++j) dxs[k][j] += st[j];
          }
        }
      }
    }
#pragma unroll
    for (int s2 = 0; s2 < D; ++s2) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        xs[s2][k] = xs[s2 + 1][k];
        ds[s2][k] = ds[s2 + 1][k];
      }
      mus[s2] = mus[s2 + 1];
      rss[s2] = rss[s2 + 1];
    }
  }
  if constexpr (RG > 1) {
    // The groups' sums added in group order: one partial row per block. Slot
    // i = (u C4 + c) packs + q holds float4 c of pack q of quantity u (dw, db, the dx sums).
    __syncthreads();
    constexpr int C4 = N / 4;
    const int64_t out = static_cast<int64_t>(blockIdx.x) * p.cols;
    for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) {
      float4 a = acc_all[i];
#pragma unroll
      for (int r = 1; r < RG; ++r) {
        const float4 b = acc_all[r * slots + i];
        a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      }
      const int u = static_cast<int>(i / (C4 * packs));
      const int64_t rem = i % (C4 * packs), q = rem % packs;
      const int c = static_cast<int>(rem / packs);
      float* dst = u == 0 ? p.partial_dw : (kCentered && u == 1) ? p.partial_db : p.partial_dxs;
      if (dst) reinterpret_cast<float4*>(dst + out + q * N)[c] = a;
    }
    return;
  }
  float* pdw = p.partial_dw + static_cast<int64_t>(blockIdx.x) * p.cols;
  float* pdb = p.partial_db ? p.partial_db + static_cast<int64_t>(blockIdx.x) * p.cols : nullptr;
  float* pdxs = kColSum ? p.partial_dxs + static_cast<int64_t>(blockIdx.x) * p.cols : nullptr;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (pack_of(k) < packs) {
      if constexpr (kSmemAcc) {
#pragma unroll
        for (int c = 0; c < N / 4; ++c) {
          reinterpret_cast<float4*>(pdw + pack_of(k) * N)[c] = acc_smem[c * packs + pack_of(k)];
          if constexpr (kCentered)
            if (pdb)
              reinterpret_cast<float4*>(pdb + pack_of(k) * N)[c] =
                  acc_smem[(N / 4 + c) * packs + pack_of(k)];
          if constexpr (kColSum)
            reinterpret_cast<float4*>(pdxs + pack_of(k) * N)[c] =
                acc_smem[(kDxSlot + c) * packs + pack_of(k)];
        }
      } else {
        store_pack<float, N>(pdw + pack_of(k) * N, dw[k]);
        if constexpr (kCentered)
          if (pdb) store_pack<float, N>(pdb + pack_of(k) * N, db[k]);
        if constexpr (kColSum) store_pack<float, N>(pdxs + pack_of(k) * N, dxs[k]);
      }
    }
  }
}

}  // namespace engine::cuda

#include "cuda/norm/norm_backward_warp.cuh"

namespace engine::cuda {


// The column sums a backward kernel leaves per block, and where each goes: dweight, dbias (when
// given), the dx column sums (when asked for).
struct ParamGrads {
  const float* partial[3];
  float* grad[3];
};

// grad[j] += sum_b partial[b][j] over the `blocks` partial rows, in a fixed order. A block
// takes kGradGroups groups of 4 columns (8 columns: 32-byte row segments, whole sectors) and all
// partial rows: thread (lane y, group x) sums rows b = y, y + kGradLanes, ... in turn (U rows in
// flight, added in that order, rows past the last as zeros: up to U kGradLanes = 1024 rows in
// one round of loads), then the lanes' sums are added by a butterfly over each warp's lanes of
// the group and the warps' sums in warp order. blockIdx.y selects the (partial, grad) pair.
// kVec: 16-byte loads of the partial rows (cols a multiple of 4), else scalar. Launched as a
// programmatic dependent of the backward kernel that writes the partials (which allows it at its
// start): its blocks take the multiprocessors as that kernel's blocks leave, and wait there for
// the partials.
template <int U, bool kVec>
static __global__ void __launch_bounds__(kGradThreads)
    norm_param_grad_kernel(const ParamGrads g, int blocks, int64_t cols) {
  static_assert(32 % kGradGroups == 0 && kGradThreads % 32 == 0);
  __shared__ float4 warp_sums[kGradThreads / 32][kGradGroups];
  const int x = static_cast<int>(threadIdx.x) % kGradGroups;
  const int y = static_cast<int>(threadIdx.x) / kGradGroups;
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * kGradGroups + x) * 4;
  const unsigned q = blockIdx.y;  // selected without indexing the parameter arrays (no stack copy)
  const float* partial = q == 0 ? g.partial[0] : q == 1 ? g.partial[1] : g.partial[2];
  float* grad = q == 0 ? g.grad[0] : q == 1 ? g.grad[1] : g.grad[2];
  auto load = [&](int b) {
    const float* row = partial + static_cast<int64_t>(b) * cols + j;
    if constexpr (kVec) {
      return *reinterpret_cast<const float4*>(row);
    } else {
      float4 v;
      v.x = row[0];
      v.y = j + 1 < cols ? row[1] : 0.f;
      v.z = j + 2 < cols ? row[2] : 0.f;
      v.w = j + 3 < cols ? row[3] : 0.f;
      return v;
    }
  };
  auto add = [](float4& a, const float4& b) { a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w; };
  wait_for_previous_kernel();
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  if (j < cols) {
    for (int b = y; b < blocks; b += U * kGradLanes) {
      float4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        v[u] = b + u * kGradLanes < blocks ? load(b + u * kGradLanes)
                                           : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < U; ++u) add(s, v[u]);
    }
  }
  // Lanes x, x + kGradGroups, ... of a warp hold one group's sums: a butterfly over the lane bits
  // above the group's.
#pragma unroll
  for (int off = kGradGroups; off < 32; off *= 2) {
    s.x += __shfl_xor_sync(0xffffffffu, s.x, off);
    s.y += __shfl_xor_sync(0xffffffffu, s.y, off);
    s.z += __shfl_xor_sync(0xffffffffu, s.z, off);
    s.w += __shfl_xor_sync(0xffffffffu, s.w, off);
  }
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (lane < kGradGroups) warp_sums[warp][lane] = s;
  __syncthreads();
  if (y == 0 && j < cols) {  // threads 0 .. kGradGroups - 1: group x = threadIdx.x
    float4 t = warp_sums[0][x];
#pragma unroll
    for (int w = 1; w < kGradThreads / 32; ++w) add(t, warp_sums[w][x]);
    grad[j] += t.x;  // grad: any alignment (a flat buffer's slice)
    if (j + 1 < cols) grad[j + 1] += t.y;
    if (j + 2 < cols) grad[j + 2] += t.z;
    if (j + 3 < cols) grad[j + 3] += t.w;
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// Lets kKernel take `bytes` of dynamic shared memory: the attribute is a per-kernel maximum,
// raised to the largest size asked for so far (one driver call per kernel in steady state).
// Host side, called from the thread that launches (the compute stream's).
template <auto kKernel>
static void allow_dynamic_smem(size_t bytes) {
  static size_t granted = 0;
  if (bytes <= granted) return;
  CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
  granted = bytes;
}

// Runs a backward kernel on `grid` blocks with a scratch of `grid` partial rows per column sum,
// then adds the partials into dweight (and dbias, and dx_colsum: the kernels' kColSum).
template <typename T, typename Kernel>
static void run_backward(Kernel kernel, int grid, int threads, size_t smem, NormBwdParams<T> p,
                         float* dweight, float* dbias, float* dx_colsum, const char* name) {
  // Released to the cache at return; later users of the block run after these kernels on the
  // same (compute) stream.
  const int64_t part = static_cast<int64_t>(grid) * p.cols;
  const int quantities = 1 + (dbias ? 1 : 0) + (dx_colsum ? 1 : 0);
  Buffer scratch(static_cast<size_t>(part) * sizeof(float) * quantities, Device::CUDA);
  ParamGrads g{};
  float* next = static_cast<float*>(scratch.data());
  int u = 0;
  for (auto [partial, grad] : {std::pair{&p.partial_dw, dweight}, std::pair{&p.partial_db, dbias},
                               std::pair{&p.partial_dxs, dx_colsum}}) {
    *partial = nullptr;
    if (!grad) continue;
    *partial = next;
    g.partial[u] = next;
    g.grad[u++] = grad;
    next += part;
  }
  launch_dependent(kernel, grid, threads, smem, p);
  check_launch(name);
  const dim3 rgrid(static_cast<unsigned>(ceil_div(p.cols, 4 * kGradGroups)),
                   static_cast<unsigned>(u));
  // 16-byte loads: every partial row starts 16-byte aligned (the scratch is, and cols % 4 == 0).
  if (p.cols % 4 == 0)
    launch_dependent(norm_param_grad_kernel<kGradUnroll, true>, rgrid, kGradThreads, 0, g, grid,
                     p.cols);
  else
    launch_dependent(norm_param_grad_kernel<kGradUnroll, false>, rgrid, kGradThreads, 0, g, grid,
                     p.cols);
  check_launch("norm_param_grad_kernel");
}

// The warp-per-row backward with K packs per lane: bf16 without the prefetch (measured faster),
// f32 with it (not measured; the variant its GPU tests ran).
template <typename T, int K, bool kCentered, bool kResidual, bool kColSum>
static void launch_backward_warp(const NormBwdParams<T>& p, float* dweight, float* dbias,
                                 float* dx_colsum) {
  constexpr int N = 16 / sizeof(T);
  constexpr bool kPrefetch = !std::is_same_v<T, bf16_t>;
  constexpr int threads = kBwdWarpThreads<kPrefetch>, warps = threads / 32;
  constexpr int quantities = (kCentered ? 2 : 1) + (kColSum ? 1 : 0);
  constexpr auto kernel =
      norm_backward_warp_kernel<T, N, K, kCentered, kResidual, kPrefetch, kColSum>;
  const int64_t packs = p.cols / N;
  // 49.5 KB for bf16 layernorm at C = 768 (73.5 KB with the dx sums): past the default 48 KB.
  const size_t smem = static_cast<size_t>(packs) * 16 *
                      (1 + static_cast<size_t>(warps) * quantities * (N / 4));
  allow_dynamic_smem<kernel>(smem);
  // Every warp the same number of rows (balanced_blocks): at T = 32768, C = 768, 256 blocks of
  // 16 rows a warp instead of 264 blocks and half the warps idle in the last round.
  const int64_t warp_rows = ceil_div(p.rows, warps);  // rounds of the block's warps, a row each
  const int grid = static_cast<int>(
      balanced_blocks(warp_rows, persistent_grid(kernel, threads, smem, warp_rows)));
  run_backward<T>(kernel, grid, threads, smem, p, dweight, dbias, dx_colsum,
                  kCentered ? "layernorm_backward_kernel" : "rmsnorm_backward_kernel");
}

// The kernel with the dx column sums where they are asked for: the residual forms only (the
// plain ones take no dx_colsum, so no such kernel is built for them).
template <typename T, int K, bool kCentered, bool kResidual>
static void launch_backward_warp_colsum(const NormBwdParams<T>& p, float* dweight, float* dbias,
                                        float* dx_colsum) {
  if constexpr (kResidual) {
    if (dx_colsum)
      return launch_backward_warp<T, K, kCentered, kResidual, true>(p, dweight, dbias, dx_colsum);
  }
  ENSURE(!dx_colsum, "norm backward: dx column sums without a residual form");
  launch_backward_warp<T, K, kCentered, kResidual, false>(p, dweight, dbias, nullptr);
}

// Picks the kernel for the layout and runs it; dx_colsum (nullptr: not asked for) is summed by
// the kernel itself, the warp-per-row and the block-per-row ones alike.
template <typename T, bool kCentered, bool kResidual>
static void launch_backward(NormBwdParams<T> p, const RowPlan& plan, float* dweight, float* dbias,
                            float* dx_colsum) {
  constexpr int V = 16 / sizeof(T);
  // Rows of at most 128 16-byte packs: a warp per row (faster than a block per row there).
  if (plan.vec && p.cols / V <= 32 * kBwdWarpPacks) {
    auto warp = [&](auto k) {
      launch_backward_warp_colsum<T, decltype(k)::value, kCentered, kResidual>(p, dweight, dbias,
                                                                              dx_colsum);
    };
    switch (ceil_div(p.cols / V, 32)) {
      case 1: return warp(std::integral_constant<int, 1>{});
      case 2: return warp(std::integral_constant<int, 2>{});
      case 3: return warp(std::integral_constant<int, 3>{});
      case 4: return warp(std::integral_constant<int, 4>{});
      default: break;
    }
  }
  auto block = [&](auto colsum) {
    constexpr bool kColSum = decltype(colsum)::value;
    plan_switch<T>(plan, "norm backward", [&](auto n, auto k) {
      constexpr int N = decltype(n)::value, K = decltype(k)::value;
      // Prefetch the next row where the stages fit in registers (not in the scalar variant nor
      // beyond 32 bytes per thread and tensor); then keep the column sums in shared memory when
      // they fit kMaxAccSmem (48 KB: with the static 512 bytes, past the default limit).
      // (The f32 scalar variants spill a little, with or without kColSum; bf16 ones do not.)
      constexpr bool kPrefetch = N > 1 && K * N * sizeof(T) <= 32;
      const char* name = kCentered ? "layernorm_backward_kernel" : "rmsnorm_backward_kernel";
      // The kernel on a persistent grid of blocks of rg rows at a time (rg row groups).
      auto run = [&](auto kernel, size_t smem, int rg) {
        const int threads = rg * plan.threads;
        const int grid = persistent_grid(kernel, threads, smem, ceil_div(p.rows, rg));
        run_backward<T>(kernel, grid, threads, smem, p, dweight, dbias, dx_colsum, name);
      };
      if constexpr (kPrefetch) {
        constexpr int quantities = (kCentered ? 2 : 1) + (kColSum ? 1 : 0);
        const size_t acc_bytes = static_cast<size_t>(p.cols) * sizeof(float) * quantities;
        if (acc_bytes <= kMaxAccSmem) {
          auto grouped = [&](auto groups) {
            constexpr int RG = decltype(groups)::value;
            constexpr auto kernel = norm_backward_kernel<T, N, K, 1, kCentered, true, kResidual,
                                                         kColSum, RG>;
            // Up to kMaxAccSmem a group besides the kernel's static bytes: past the default 48
            // KB (three sums at C = 4096: a launch error without the attribute).
            const size_t smem = RG * acc_bytes;
            allow_dynamic_smem<kernel>(smem);
            run(kernel, smem, RG);
          };
          // The plain layernorm in 128-thread rows: four rows a block (a quarter of the
          // partial rows; measured faster, see norm.cu). The other forms: one (the residual
          // ones hit the register cap with groups and measured slower, rmsnorm too).
          if constexpr (kCentered && !kResidual && !kColSum) {
            if (kRowGroups * plan.threads <= kMaxVecThreads)
              return grouped(std::integral_constant<int, kRowGroups>{});
          }
          return grouped(std::integral_constant<int, 1>{});
        }
        return run(norm_backward_kernel<T, N, K, 1, kCentered, false, kResidual, kColSum, 1>, 0,
                   1);
      } else {
        return run(norm_backward_kernel<T, N, K, 0, kCentered, false, kResidual, kColSum, 1>, 0,
                   1);
      }
    });
  };
  // As for the warp kernels: the dx column sums are built into the residual forms only.
  if constexpr (kResidual) {
    if (dx_colsum) return block(std::true_type{});
  }
  ENSURE(!dx_colsum, "norm backward: dx column sums without a residual form");
  block(std::false_type{});
}

// dresidual == nullptr: the plain form. dx_colsum: nullptr or undefined, or += sum_t dx(t).
static void norm_backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor* mean, const Tensor& rstd, const Tensor* dresidual,
                          const Tensor& dx, const Tensor& dweight, const Tensor* dbias,
                          const Tensor* dx_colsum = nullptr) {
  auto [rows, cols] = check_x(x, op);
  const bool res = dresidual != nullptr;
  const bool has_dbias = dbias && dbias->data;
  const bool has_colsum = dx_colsum && dx_colsum->data;
  if (rows == 0) return;  // dx is empty and the parameter gradients gain nothing
  const bool aligned = aligned16(x.data) && aligned16(dy.data) && aligned16(weight.data) &&
                       aligned16(dx.data) && (!res || aligned16(dresidual->data));
  const RowPlan plan = plan_rows(cols, static_cast<int>(16 / dtype_size(x.dtype)), aligned, op,
                                 kBwdMinPacks);
  float_switch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    NormBwdParams<T> p{};
    p.dy = static_cast<const T*>(dy.data);
    p.x = static_cast<const T*>(x.data);
    p.weight = static_cast<const T*>(weight.data);
    p.mean = mean ? static_cast<const float*>(mean->data) : nullptr;
    p.rstd = static_cast<const float*>(rstd.data);
    p.dresidual = res ? static_cast<const T*>(dresidual->data) : nullptr;
    p.dx = static_cast<T*>(dx.data);
    p.rows = rows;
    p.cols = cols;
    float* dw = static_cast<float*>(dweight.data);
    float* db = has_dbias ? static_cast<float*>(dbias->data) : nullptr;
    float* dxs = has_colsum ? static_cast<float*>(dx_colsum->data) : nullptr;
    if (mean && res)
      launch_backward<T, true, true>(p, plan, dw, db, dxs);
    else if (mean)
      launch_backward<T, true, false>(p, plan, dw, db, dxs);
    else if (res)
      launch_backward<T, false, true>(p, plan, dw, nullptr, dxs);
    else
      launch_backward<T, false, false>(p, plan, dw, nullptr, dxs);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                        const Tensor& dbias) {
  norm_backward("layernorm_backward", dy, x, weight, &mean, rstd, nullptr, dx, dweight, &dbias);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight) {
  norm_backward("rmsnorm_backward", dy, x, weight, nullptr, rstd, nullptr, dx, dweight, nullptr);
}

void layernorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                                 const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dx_colsum) {
  norm_backward("layernorm_residual_backward", dy, x, weight, &mean, rstd, &dresidual, dx, dweight,
                &dbias, &dx_colsum);
}

void rmsnorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& rstd, const Tensor& dresidual, const Tensor& dx,
                               const Tensor& dweight, const Tensor& dx_colsum) {
  norm_backward("rmsnorm_residual_backward", dy, x, weight, nullptr, rstd, &dresidual, dx,
                dweight, nullptr, &dx_colsum);
}

}  // namespace engine::cuda
