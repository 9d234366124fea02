// The warp-per-row layer-norm backward kernel (and the helpers only it uses), part of
// norm_backward.cu, which includes it after the block-per-row kernel.
#pragma once
#include "cuda/norm/norm_common.cuh"

namespace engine::cuda {

using namespace norm_detail;

constexpr int kBwdWarpPacks = 4;         // warp-per-row backward: packs per lane (C <= 128 packs)
// Warp-per-row backward, block size and the blocks per multiprocessor its registers must allow:
// bf16 (no prefetch) 8 warps, 2 blocks (at most 128 registers); f32 (prefetch) 4 warps, 3 blocks.
template <bool kPrefetch>
constexpr int kBwdWarpThreads = kPrefetch ? 128 : 256;
template <bool kPrefetch>
constexpr int kBwdWarpMinBlocks = kPrefetch ? 3 : 2;

// Hides v's value from the compiler (no instruction): what is computed from it after this point
// is computed again rather than kept in registers from before (common subexpressions would keep
// the unpacked f32 values of a row alive across its reduction, twice the registers of the packs).
template <typename T, int N>
static __device__ __forceinline__ void opaque(Pack<T, N>& pk) {
  static_assert(sizeof(pk) % 4 == 0, "whole 32-bit words");
  uint32_t* u = reinterpret_cast<uint32_t*>(&pk);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(pk) / 4); ++i) asm volatile("" : "+r"(u[i]));
}
static __device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

// Warp-per-row backward (16-byte packs, C <= 32 kBwdWarpPacks packs): warp w of block b takes
// rows b W + w, b W + w + G W, ... (W warps per block, G blocks of a persistent grid); lane l
// holds packs l, l + 32, ... of the row. The two row sums are warp butterflies (no barrier), so
// the warps of a block never wait for one another inside the row loop. The weight packs sit in
// shared memory (one copy per block, read in each pass instead of held in registers); the
// per-column sums of dy xhat and dy are in registers per lane (K N each). kPrefetch: the warp's
// next row (x, dy and the statistics) is asked for before this row is reduced (f32); without it
// (bf16) the row is loaded at the top of its iteration, and the other warps of the multiprocessor
// (16 at 128 registers) keep the loads in flight, which measured faster than the prefetch (fewer
// warps at its register count) and than the column sums in shared memory (docs/PERF.md). At the end each warp copies its sums into its
// slice of shared memory and the block adds the slices in warp order: one partial row per block.
template <typename T, int N, int K, bool kCentered, bool kResidual, bool kPrefetch, bool kColSum>
static __global__ void __launch_bounds__(kBwdWarpThreads<kPrefetch>, kBwdWarpMinBlocks<kPrefetch>)
    norm_backward_warp_kernel(const NormBwdParams<T> p) {
  wait_for_previous_kernel();  // and the partial rows' sums (norm_param_grad_kernel) may launch
  constexpr int C4 = N / 4;  // float4 per pack of column sums
  constexpr int kQuantities = (kCentered ? 2 : 1) + (kColSum ? 1 : 0);  // dw (db) (dx sums)
  constexpr int kDxs = kCentered ? 2 : 1;                               // the dx sums' quantity
  extern __shared__ float4 warp_smem[];  // weight packs, then per warp kQuantities C4 packs float4
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int packs = static_cast<int>(p.cols / N);
  const int slice = kQuantities * C4 * packs;  // float4 per warp: float4 c of quantity u and pack
                                               // q at (u C4 + c) packs + q (conflict-free)
  Pack<T, N>* wsm = reinterpret_cast<Pack<T, N>*>(warp_smem);
  float4* acc = warp_smem + packs;
  float4* mine = acc + warp * slice;
  for (int q = threadIdx.x; q < packs; q += blockDim.x)
    wsm[q] = reinterpret_cast<const Pack<T, N>*>(p.weight)[q];
  float dw[K][N], db[K][N];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < N; ++j) dw[k][j] = db[k][j] = 0.f;
  // kColSum: the dx sums stay in the warp's slice of shared memory (each lane adding into its
  // own float4s: no barrier), as registers would spill (128 at K = 3, layernorm+residual).
  float4* mine_dxs = mine + kDxs * C4 * packs;
  if constexpr (kColSum) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < packs)
#pragma unroll
        for (int c = 0; c < C4; ++c)
          mine_dxs[c * packs + lane + 32 * k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncthreads();  // the weight packs

  const float inv_cols = 1.f / static_cast<float>(p.cols);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps;
  constexpr int KP = kPrefetch ? K : 1;  // next-row packs held (unused without kPrefetch)
  Pack<T, N> xc[K], dc[K], xn[KP], dn[KP];
  float muc = 0.f, rsc = 0.f, mun = 0.f, rsn = 0.f;
  auto load = [&](int64_t r, auto& xd, auto& dd, float& mu, float& rs) {
    const Pack<T, N>* xr = reinterpret_cast<const Pack<T, N>*>(p.x + r * p.cols);
    const Pack<T, N>* dr = reinterpret_cast<const Pack<T, N>*>(p.dy + r * p.cols);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < packs) {
        xd[k] = xr[lane + 32 * k];
        dd[k] = dr[lane + 32 * k];
      }
    mu = kCentered ? p.mean[r] : 0.f;
    rs = p.rstd[r];
  };
  int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if constexpr (kPrefetch)
    if (row < p.rows) load(row, xc, dc, muc, rsc);
  for (; row < p.rows; row += stride) {
    if constexpr (kPrefetch) {
      if (row + stride < p.rows) load(row + stride, xn, dn, mun, rsn);
    } else {
      load(row, xc, dc, muc, rsc);
    }
    // kResidual: this row's dresidual packs, asked for before the sums.
    constexpr int KR = kResidual ? K : 1;
    Pack<T, N> dr[KR];
    if constexpr (kResidual) {
      const Pack<T, N>* rr = reinterpret_cast<const Pack<T, N>*>(p.dresidual + row * p.cols);
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (lane + 32 * k < packs) dr[k] = rr[lane + 32 * k];
    }
    const float mu = muc, rs = rsc;
    const float nmr = -mu * rs;  // xhat = x rs + nmr (the FMA forms of norm_backward_kernel)
    float s[2] = {0.f, 0.f};  // sum g, sum g xhat
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int q = lane + 32 * k;
      if (q < packs) {
        const Pack<T, N> wk = wsm[q];
        float pw[N], pb[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float dv = to_float(dc[k].v[j]);
          const float xh = kCentered ? fmaf(to_float(xc[k].v[j]), rs, nmr)
                                     : to_float(xc[k].v[j]) * rs;
          const float gv = dv * to_float(wk.v[j]);
          s[0] += gv;
          s[1] += gv * xh;
          pw[j] = dv * xh;
          pb[j] = dv;
        }
#pragma unroll
        for (int j = 0; j < N; ++j) {
          dw[k][j] += pw[j];
          if constexpr (kCentered) db[k][j] += pb[j];
        }
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      opaque(xc[k]);
      opaque(dc[k]);
    }
    warp_sum(s);
    const float mg = kCentered ? s[0] * inv_cols : 0.f;
    const float mgx = s[1] * inv_cols;
    const float ca = -rs * rs * mgx;  // dx = g rs + (x ca + cb)
    const float cb = kCentered ? fmaf(-ca, mu, -rs * mg) : 0.f;
    Pack<T, N>* dxr = reinterpret_cast<Pack<T, N>*>(p.dx + row * p.cols);
    const int lane2 = opaque(lane);  // the weight packs read again, not kept
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int q = lane + 32 * k;
      if (q < packs) {
        const Pack<T, N> wk = wsm[lane2 + 32 * k];
        float o[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float gv = to_float(dc[k].v[j]) * to_float(wk.v[j]);
          const float xa = kCentered ? fmaf(to_float(xc[k].v[j]), ca, cb)
                                     : to_float(xc[k].v[j]) * ca;
          o[j] = fmaf(gv, rs, xa);
          if constexpr (kResidual)
            o[j] = __fadd_rn(to_float(from_float<T>(o[j])), to_float(dr[k].v[j]));
        }
        Pack<T, N> out;  // N * sizeof(T) = 16 bytes
#pragma unroll
        for (int j = 0; j < N; ++j) out.v[j] = from_float<T>(o[j]);
        dxr[q] = out;
        if constexpr (kColSum) {  // dx as stored
#pragma unroll
          for (int c = 0; c < C4; ++c) {
            float4& a = mine_dxs[c * packs + q];
            a.x += to_float(out.v[4 * c]);
            a.y += to_float(out.v[4 * c + 1]);
            a.z += to_float(out.v[4 * c + 2]);
            a.w += to_float(out.v[4 * c + 3]);
          }
        }
      }
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        xc[k] = xn[k];
        dc[k] = dn[k];
      }
      muc = mun;
      rsc = rsn;
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int q = lane + 32 * k;
    if (q < packs) {
#pragma unroll
      for (int c = 0; c < C4; ++c) {
        mine[c * packs + q] =
            make_float4(dw[k][4 * c], dw[k][4 * c + 1], dw[k][4 * c + 2], dw[k][4 * c + 3]);
        if constexpr (kCentered)
          mine[(C4 + c) * packs + q] =
              make_float4(db[k][4 * c], db[k][4 * c + 1], db[k][4 * c + 2], db[k][4 * c + 3]);
      }
    }
  }
  __syncthreads();
  // The block's partial rows: float4 i = columns 4 i .. 4 i + 3 = float4 c = i % C4 of pack
  // q = i / C4, summed over the warps in order.
  float4* pdw = reinterpret_cast<float4*>(p.partial_dw + static_cast<int64_t>(blockIdx.x) * p.cols);
  float4* pdb = p.partial_db ? reinterpret_cast<float4*>(p.partial_db +
                                                         static_cast<int64_t>(blockIdx.x) * p.cols)
                             : nullptr;
  float4* pdxs =
      kColSum ? reinterpret_cast<float4*>(p.partial_dxs + static_cast<int64_t>(blockIdx.x) * p.cols)
              : nullptr;
  for (int i = threadIdx.x; i < C4 * packs; i += blockDim.x) {
    const int q = i / C4, c = i % C4;
    auto warp_sum_of = [&](int u) {  // quantity u's float4, summed over the warps in order
      float4 a = acc[(u * C4 + c) * packs + q];
      for (int w = 1; w < warps; ++w) {
        const float4 b = acc[w * slice + (u * C4 + c) * packs + q];
        a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      }
      return a;
    };
    pdw[i] = warp_sum_of(0);
    if constexpr (kCentered)
      if (pdb) pdb[i] = warp_sum_of(1);
    if constexpr (kColSum) pdxs[i] = warp_sum_of(kDxs);
  }
}

}  // namespace engine::cuda
