// Layer norms over the last dimension of x (T, C). A row lives in registers, as packs: a pack is
// one 16-byte vector (8 bf16 or 4 f32) when C is a multiple of it and every pointer is 16-byte
// aligned, else one element (scalar variant).
//   forward:  mean = sum(x) / C (layernorm; 0 for rmsnorm), var = sum((x - mean)^2) / C (two
//             passes over the registers), rstd = 1 / sqrt(var + eps), y = (x - mean) rstd w (+ b)
//   backward: xhat = (x - mean) rstd, g = dy w,
//             dx = rstd (g - mean(g) - xhat mean(g xhat))        (mean(g): layernorm only)
//             dweight += sum_t dy xhat,  dbias += sum_t dy
// Kernels (measured on one H200, T = 16384, C = 2048 / 4096; docs/PERF.md):
//   - layernorm forward, 16-byte packs, C <= 512 packs: one warp per row (warp sums only, no
//     barrier, every load of the row in flight at once; 4 rows per block, a plain grid);
//   - rmsnorm forward and the other layouts: one block per row of a persistent grid, thread i
//     holding packs i, i + B, ..., i + (K-1) B, the next row loaded before this one is reduced;
//   - backward, 16-byte packs, C <= 128 packs (bf16 C <= 1024, f32 C <= 512): one warp per row
//     of a persistent grid (norm_backward_warp_kernel: lane l holds packs l, l + 32, ...; the two
//     row sums are warp butterflies, no barrier; the per-column sums in registers per lane, added
//     over the block's warps in warp order at the end; the weight packs in shared memory). bf16
//     loads each row at the top of its iteration, 8 warps per block, 16 warps per multiprocessor
//     (128 registers); f32 loads the warp's next row before this one is reduced, 4 warps per
//     block. Layernorm+residual at T = 32768, C = 768 (bf16): 78.9 / 79.4% of copy in two runs
//     against 69.1 / 68.3% for the block per row; rmsnorm+residual 80.1 / 81.7% against 72.5 /
//     71.8%. Variants measured slower there: the next row prefetched (12 warps fit: 75.1 /
//     74.8%), the column sums in shared memory (76.2 / 76.2%), the same at 24 warps per
//     multiprocessor (registers spill: 51%);
//   - backward, the other layouts: one block per row of a persistent grid, at least 2 packs per
//     thread where C allows (fewer, fatter threads keep more bytes in flight per register), the
//     next row's x and dy loaded before this row is reduced (a deeper prefetch measured slower:
//     46% against 71% of copy), the weight packs held in registers, the per-column sums in
//     shared memory.
// Residual forms (kResidual): the forward loads the residual's packs beside x's, adds them in f32
// and rounds to T in registers (the add kernel's arithmetic), writes that pack to sum and
// normalises it unchanged; the backward loads dresidual's packs before the row's sums and adds
// them to dx rounded to T (__fadd_rn: never contracted into an FMA, so f32 rounds as the
// separate add does). The plain instantiations are the kernels as they were.
// Every sum is f32 in a fixed order (shuffle trees, warps and blocks in index order): bitwise
// reproducible (for a given device: the persistent grids follow its multiprocessor count).
// Weight gradients without float atomics: each block keeps per-column partial sums of its rows
// (shared memory or registers) and writes them to a scratch (blocks, C) f32 buffer taken from the
// caching allocator; a second kernel adds the partials in block order into dweight / dbias.
// Memory: x, weight, bias, y, dy, dx all bf16 or all f32; mean, rstd, dweight, dbias f32. Each
// row is read by one warp or block before it writes that row, so y may alias x (or residual),
// sum may alias x or residual, and dx may alias dy, x or dresidual.
// Limits: C <= 8192 (at most 16 vector elements or 8 scalar elements per thread, blocks of at
// most 512 / 1024 threads), C >= 1, T < 2^31.
#include "cuda/norm/norm.cuh"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"

namespace engine::cuda {

constexpr int kMaxVecThreads = 512;      // block size cap of the 16-byte variant
constexpr int kMaxScalarThreads = 1024;  // block size cap of the scalar variant
constexpr int kMaxVecElems = 16;         // elements per thread and row, 16-byte variant
constexpr int kScalarIters = 8;          // elements per thread and row, scalar variant
constexpr int kRowLanes = 16;            // partial rows summed in parallel by the second pass
constexpr int kWarpRowWarps = 4;         // warp-per-row forward: rows (warps) per block
constexpr int kMaxWarpPacks = 16;        // warp-per-row forward: packs per lane (C <= 512 packs)
constexpr int kBwdMinPacks = 2;          // backward: at least 2 packs per thread where C allows
constexpr size_t kMaxAccSmem = 48 * 1024;  // backward: column sums in shared memory up to this
constexpr int kGradUnroll = 8;           // second pass: partial rows in flight per thread
constexpr int kBwdWarpPacks = 4;         // warp-per-row backward: packs per lane (C <= 128 packs)
// Warp-per-row backward, block size and the blocks per multiprocessor its registers must allow:
// bf16 (no prefetch) 8 warps, 2 blocks (at most 128 registers); f32 (prefetch) 4 warps, 3 blocks.
template <bool kPrefetch>
constexpr int kBwdWarpThreads = kPrefetch ? 128 : 256;
template <bool kPrefetch>
constexpr int kBwdWarpMinBlocks = kPrefetch ? 3 : 2;

// Butterfly sum over the warp: every lane ends with the same bits (a + b == b + a).
template <int M>
static __device__ __forceinline__ void warp_sum(float (&v)[M]) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] += __shfl_xor_sync(0xffffffffu, v[m], o);
}

// Sum of v over the block, the same bits in every thread. smem holds 2 x (32 M) floats used in
// turn (phase), so one barrier per call suffices: a half is written again two calls later, only
// after every warp passed the barrier of the call in between, hence after it read that half.
template <int M>
static __device__ __forceinline__ void block_sum(float (&v)[M], float* smem, int& phase) {
  warp_sum(v);
  float* buf = smem + (phase & 1) * 32 * M;
  ++phase;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) buf[m * 32 + warp] = v[m];
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < M; ++m) v[m] = lane < warps ? buf[m * 32 + lane] : 0.f;
  warp_sum(v);
}

template <typename T>
struct NormFwdParams {
  const T* x;       // (rows, cols)
  const T* residual;  // (rows, cols), residual form only (else nullptr)
  T* sum;             // (rows, cols): x + residual rounded to T, residual form only
  const T* weight;  // (cols)
  const T* bias;    // (cols), nullptr: no bias
  T* y;             // (rows, cols)
  float* mean;      // (rows), nullptr for rmsnorm
  float* rstd;      // (rows)
  int64_t rows, cols;
  float eps;
};

template <typename T>
struct NormBwdParams {
  const T* dy;        // (rows, cols)
  const T* x;         // (rows, cols)
  const T* weight;    // (cols)
  const float* mean;  // (rows), nullptr for rmsnorm
  const float* rstd;  // (rows)
  const T* dresidual;  // (rows, cols), residual form only (else nullptr): added to dx
  T* dx;              // (rows, cols)
  float* partial_dw;  // (gridDim.x, cols): sum of dy xhat over the rows of each block
  float* partial_db;  // (gridDim.x, cols) or nullptr: sum of dy over the rows of each block
  int64_t rows, cols;
};

// Packs i, i + B, ..., i + (K-1) B of row `row` (those below `packs`) into registers, raw.
template <typename T, int N, int K>
static __device__ __forceinline__ void load_row(const T* base, int64_t row, int64_t cols,
                                                int64_t packs, Pack<T, N> (&dst)[K]) {
  const Pack<T, N>* r = reinterpret_cast<const Pack<T, N>*>(base + row * cols);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (q < packs) dst[k] = r[q];
  }
}

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
  __shared__ float smem[2 * 32];
  int phase = 0;
  const int64_t packs = p.cols / N;
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  constexpr int KR = kResidual ? K : 1;  // residual packs held (unused by the plain form)
  Pack<T, N> cur[K], nxt[K], rcur[KR], rnxt[KR];
  load_row<T, N, K>(p.x, blockIdx.x, p.cols, packs, cur);  // the grid has at most one block per row
  if constexpr (kResidual) load_row<T, N, K>(p.residual, blockIdx.x, p.cols, packs, rcur);
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
        load_pack<T, N>(p.weight + q * N, w);
        if (p.bias) {
          load_pack<T, N>(p.bias + q * N, b);
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) b[j] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < N; ++j) o[j] = (v[k][j] - mu) * rs * w[j] + b[j];
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
}

// Warp-per-row forward (16-byte packs, C <= 32 kMaxWarpPacks packs): warp w of the block
// normalises row blockIdx.x * kWarpRowWarps + w; lane l holds packs l, l + 32, ... of the row as
// raw vectors (all K loads in flight at once), and the sums are warp butterflies (no barrier).
// Independent warps keep many rows in flight per multiprocessor while others reduce.
template <typename T, int N, int K, bool kCentered, bool kResidual>
static __global__ void __launch_bounds__(kWarpRowWarps * 32)
    norm_forward_warp_kernel(const NormFwdParams<T> p) {
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
  if constexpr (kResidual) {
    const Pack<T, N>* rr = reinterpret_cast<const Pack<T, N>*>(p.residual + row * p.cols);
    Pack<T, N>* sr = reinterpret_cast<Pack<T, N>*>(p.sum + row * p.cols);
    Pack<T, N> res[K];
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < packs) res[k] = rr[lane + 32 * k];
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < packs) {
        add_rounded<T, N>(raw[k], res[k]);
        sr[lane + 32 * k] = raw[k];
      }
  }
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  float mu = 0.f;
  if constexpr (kCentered) {
    float s[1] = {0.f};
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < packs)
#pragma unroll
        for (int j = 0; j < N; ++j) s[0] += to_float(raw[k].v[j]);
    warp_sum(s);
    mu = s[0] * inv_cols;
  }
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
      for (int j = 0; j < N; ++j) o[j] = (to_float(raw[k].v[j]) - mu) * rs * w[j] + b[j];
      store_pack<T, N>(yr + q * N, o);
    }
  }
  if (lane == 0) {
    if constexpr (kCentered) p.mean[row] = mu;
    p.rstd[row] = rs;
  }
}

// Backward, one block per row of a persistent grid. The thread's packs (columns) are the same
// in every row, so its weight packs stay in registers. Rows come through D + 1 register stages:
// row r + D G (G = gridDim.x) is asked for before row r is reduced (D = 1; D = 0: no prefetch,
// for the scalar variant and wide rows, where the stages would spill). xhat and g are recomputed
// from the raw packs in the second pass rather than kept. kSmemAcc: the per-column sums of
// dy xhat and dy live in shared memory (each thread owns its columns' float4 slots, so no barrier
// or atomics) instead of registers, which leaves registers for more resident blocks.
template <typename T, int N, int K, int D, bool kCentered, bool kSmemAcc, bool kResidual>
static __global__ void __launch_bounds__(N == 1 ? kMaxScalarThreads : kMaxVecThreads)
    norm_backward_kernel(const NormBwdParams<T> p) {
  constexpr int S = D + 1;  // ring stages
  constexpr int kRegN = kSmemAcc ? 1 : N;
  __shared__ float smem[2 * 32 * 2];
  extern __shared__ float4 acc_smem[];  // kSmemAcc: dw then db, float4 c of pack q at c packs + q
  int phase = 0;
  const int64_t packs = p.cols / N;
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  auto pack_of = [&](int k) { return threadIdx.x + static_cast<int64_t>(k) * blockDim.x; };
  float dw[K][kRegN], db[K][kRegN];
  Pack<T, N> w[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int j = 0; j < kRegN; ++j) dw[k][j] = db[k][j] = 0.f;
    if (pack_of(k) < packs) {
      w[k] = reinterpret_cast<const Pack<T, N>*>(p.weight)[pack_of(k)];
      if constexpr (kSmemAcc) {
#pragma unroll
        for (int c = 0; c < N / 4; ++c) {
          acc_smem[c * packs + pack_of(k)] = make_float4(0.f, 0.f, 0.f, 0.f);
          if constexpr (kCentered)
            acc_smem[(N / 4 + c) * packs + pack_of(k)] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
    }
  }
  Pack<T, N> xs[S][K], ds[S][K];
  float mus[S], rss[S];
  auto load = [&](int64_t r, Pack<T, N>(&xd)[K], Pack<T, N>(&dd)[K], float& mu, float& rs) {
    load_row<T, N, K>(p.x, r, p.cols, packs, xd);
    load_row<T, N, K>(p.dy, r, p.cols, packs, dd);
    mu = kCentered ? p.mean[r] : 0.f;
    rs = p.rstd[r];
  };
  const int64_t g = gridDim.x;
#pragma unroll
  for (int s = 0; s < D; ++s)
    if (blockIdx.x + s * g < p.rows) load(blockIdx.x + s * g, xs[s], ds[s], mus[s], rss[s]);
  for (int64_t row = blockIdx.x; row < p.rows; row += g) {
    if (row + D * g < p.rows) load(row + D * g, xs[D], ds[D], mus[D], rss[D]);
    const float mu = mus[0], rs = rss[0];
    float s[2] = {0.f, 0.f};  // sum g, sum g xhat
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (pack_of(k) < packs) {
        float pw[N], pb[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float dv = to_float(ds[0][k].v[j]);
          const float xh = (to_float(xs[0][k].v[j]) - mu) * rs;
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
    if constexpr (kResidual) load_row<T, N, K>(p.dresidual, row, p.cols, packs, dr);
    block_sum(s, smem, phase);
    const float mg = kCentered ? s[0] * inv_cols : 0.f;
    const float mgx = s[1] * inv_cols;
    T* dxr = p.dx + row * p.cols;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (pack_of(k) < packs) {
        float o[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xh = (to_float(xs[0][k].v[j]) - mu) * rs;
          const float gv = to_float(ds[0][k].v[j]) * to_float(w[k].v[j]);
          o[j] = rs * (gv - mg - xh * mgx);
          if constexpr (kResidual)
            o[j] = __fadd_rn(to_float(from_float<T>(o[j])), to_float(dr[k].v[j]));
        }
        store_pack<T, N>(dxr + pack_of(k) * N, o);
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
  float* pdw = p.partial_dw + static_cast<int64_t>(blockIdx.x) * p.cols;
  float* pdb = p.partial_db ? p.partial_db + static_cast<int64_t>(blockIdx.x) * p.cols : nullptr;
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
        }
      } else {
        store_pack<float, N>(pdw + pack_of(k) * N, dw[k]);
        if constexpr (kCentered)
          if (pdb) store_pack<float, N>(pdb + pack_of(k) * N, db[k]);
      }
    }
  }
}

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
// (16 at 128 registers) keep the loads in flight: it measured 79% of copy against 75% with the
// prefetch (165 registers: 12 warps per multiprocessor) and 76% with the column sums in shared
// memory (layernorm+residual, T = 32768, C = 768). At the end each warp copies its sums into its slice
// of shared memory and the block adds the slices in warp order: one partial row per block.
template <typename T, int N, int K, bool kCentered, bool kResidual, bool kPrefetch>
static __global__ void __launch_bounds__(kBwdWarpThreads<kPrefetch>, kBwdWarpMinBlocks<kPrefetch>)
    norm_backward_warp_kernel(const NormBwdParams<T> p) {
  constexpr int C4 = N / 4;                      // float4 per pack of column sums
  constexpr int kQuantities = kCentered ? 2 : 1;  // dw (and db)
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
          const float xh = (to_float(xc[k].v[j]) - mu) * rs;
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
          const float xh = (to_float(xc[k].v[j]) - mu) * rs;
          const float gv = to_float(dc[k].v[j]) * to_float(wk.v[j]);
          o[j] = rs * (gv - mg - xh * mgx);
          if constexpr (kResidual)
            o[j] = __fadd_rn(to_float(from_float<T>(o[j])), to_float(dr[k].v[j]));
        }
        store_pack<T, N>(reinterpret_cast<T*>(dxr + q), o);
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
  for (int i = threadIdx.x; i < C4 * packs; i += blockDim.x) {
    const int q = i / C4, c = i % C4;
    float4 a = acc[c * packs + q];
    for (int w = 1; w < warps; ++w) {
      const float4 b = acc[w * slice + c * packs + q];
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
    }
    pdw[i] = a;
    if constexpr (kCentered) {
      if (pdb) {
        float4 e = acc[(C4 + c) * packs + q];
        for (int w = 1; w < warps; ++w) {
          const float4 b = acc[w * slice + (C4 + c) * packs + q];
          e.x += b.x, e.y += b.y, e.z += b.z, e.w += b.w;
        }
        pdb[i] = e;
      }
    }
  }
}

// grad[j] += sum_b partial[b][j] over the `blocks` partial rows, in a fixed order: thread
// (x, y) sums rows b = y, y + kRowLanes, ... in turn (U loads in flight, added in that order),
// then y == 0 adds the kRowLanes sums in order. blockIdx.y selects (partial_dw, dw) or
// (partial_db, db).
template <int U>
static __global__ void __launch_bounds__(32 * kRowLanes)
    norm_param_grad_kernel(const float* partial_dw, float* dw, const float* partial_db, float* db,
                           int blocks, int64_t cols) {
  __shared__ float sums[kRowLanes][33];
  const float* partial = blockIdx.y == 0 ? partial_dw : partial_db;
  float* grad = blockIdx.y == 0 ? dw : db;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.f;
  if (j < cols) {
    int b = threadIdx.y;
    for (; b + (U - 1) * kRowLanes < blocks; b += U * kRowLanes) {
      float v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = partial[(b + u * kRowLanes) * cols + j];
#pragma unroll
      for (int u = 0; u < U; ++u) s += v[u];
    }
    for (; b < blocks; b += kRowLanes) s += partial[b * cols + j];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float t = 0.f;
#pragma unroll
    for (int r = 0; r < kRowLanes; ++r) t += sums[r][threadIdx.x];
    grad[j] += t;
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

struct RowPlan {
  bool vec;     // 16-byte packs (else one element per pack)
  int iters;    // packs per thread (K)
  int threads;  // block size
};

static int round_up_warp(int64_t n) { return static_cast<int>(ceil_div(n, 32) * 32); }

static RowPlan plan_rows(int64_t cols, int vec_elems, bool aligned, const char* op,
                         int min_k = 1) {
  if (aligned && cols % vec_elems == 0) {
    const int64_t packs = cols / vec_elems;
    for (int k = min_k; k * vec_elems <= kMaxVecElems; k *= 2)
      if (ceil_div(packs, k) <= kMaxVecThreads) return {true, k, round_up_warp(ceil_div(packs, k))};
    for (int k = 1; k * vec_elems <= kMaxVecElems; k *= 2)
      if (ceil_div(packs, k) <= kMaxVecThreads) return {true, k, round_up_warp(ceil_div(packs, k))};
  } else if (ceil_div(cols, kScalarIters) <= kMaxScalarThreads) {
    return {false, kScalarIters, round_up_warp(ceil_div(cols, kScalarIters))};
  }
  RAISE(op, ": C = ", cols, " is wider than the kernels take (at most ",
        kMaxVecThreads * kMaxVecElems, ")");
}

// x (T, C) with C >= 1 in bf16 or f32; returns {T, C}.
static std::pair<int64_t, int64_t> check_x(const Tensor& x, const char* op) {
  ENSURE(x.ndim() == 2, op, ": x must be 2-D (T, C), got shape ", x.shape.str());
  ENSURE(x.dtype == DType::BF16 || x.dtype == DType::F32, op, ": x is ", dtype_name(x.dtype),
         ", the kernel takes bf16 or f32 (statistics f32)");
  ENSURE(x.size(1) > 0, op, ": x has shape ", x.shape.str(), ", normalising needs columns");
  ENSURE(x.size(0) < (int64_t{1} << 31), op, ": T = ", x.size(0), " rows is too many");
  expect_cuda(x, x.dtype, x.shape, op, "x");
  return {x.size(0), x.size(1)};
}

// f(N, K) with std::integral_constant elements per pack N and packs per thread K of the plan:
// (1, kScalarIters) for the scalar variant, (16 / sizeof(T), plan.iters) for 16-byte packs.
template <typename T, typename F>
static void plan_switch(const RowPlan& plan, const char* what, F&& f) {
  constexpr int V = 16 / sizeof(T);
  using std::integral_constant;
  if (!plan.vec) return f(integral_constant<int, 1>{}, integral_constant<int, kScalarIters>{});
  switch (plan.iters) {
    case 1:
      return f(integral_constant<int, V>{}, integral_constant<int, 1>{});
    case 2:
      return f(integral_constant<int, V>{}, integral_constant<int, 2>{});
    case 4:
      if constexpr (4 * V <= kMaxVecElems)
        return f(integral_constant<int, V>{}, integral_constant<int, 4>{});
      break;
  }
  RAISE(what, ": no kernel for ", plan.iters, " packs per thread");
}

// Packs per lane of the warp-per-row forward for `packs` 16-byte packs: the smallest power of
// two covering the row with 32 lanes (0: the row is too wide for one warp).
static int warp_row_packs(int64_t packs) {
  for (int k = 1; k <= kMaxWarpPacks; k *= 2)
    if (32 * k >= packs) return k;
  return 0;
}

template <typename T, int K, bool kCentered, bool kResidual>
static void launch_forward_warp(const NormFwdParams<T>& p) {
  constexpr int V = 16 / sizeof(T);
  const auto grid = static_cast<unsigned>(ceil_div(p.rows, kWarpRowWarps));
  norm_forward_warp_kernel<T, V, K, kCentered, kResidual>
      <<<grid, kWarpRowWarps * 32, 0, stream()>>>(p);
  check_launch(kCentered ? "layernorm_forward_kernel" : "rmsnorm_forward_kernel");
}

template <typename T, bool kCentered, bool kResidual>
static void launch_forward(const NormFwdParams<T>& p, const RowPlan& plan) {
  constexpr int V = 16 / sizeof(T);
  // Layernorm: warp per row (its two reductions and the bias made the block-per-row kernel the
  // slower one: 63% vs 72% of copy at C = 2048). Rmsnorm keeps the block-per-row kernel, which
  // measured 1-3 points faster than a warp per row at C = 2048 and 4096.
  if constexpr (kCentered) {
    if (plan.vec) {
      switch (warp_row_packs(p.cols / V)) {
        case 1: return launch_forward_warp<T, 1, kCentered, kResidual>(p);
        case 2: return launch_forward_warp<T, 2, kCentered, kResidual>(p);
        case 4: return launch_forward_warp<T, 4, kCentered, kResidual>(p);
        case 8: return launch_forward_warp<T, 8, kCentered, kResidual>(p);
        case 16: return launch_forward_warp<T, 16, kCentered, kResidual>(p);
        default: break;
      }
    }
  }
  plan_switch<T>(plan, "norm forward", [&](auto n, auto k) {
    auto kernel =
        norm_forward_kernel<T, decltype(n)::value, decltype(k)::value, kCentered, kResidual>;
    const int grid = persistent_grid(kernel, plan.threads, 0, p.rows);
    kernel<<<grid, plan.threads, 0, stream()>>>(p);
    check_launch(kCentered ? "layernorm_forward_kernel" : "rmsnorm_forward_kernel");
  });
}

// Runs a backward kernel on `grid` blocks with a scratch of `grid` partial rows per parameter
// gradient, then adds the partials into dweight (and dbias).
template <typename T, typename Kernel>
static void run_backward(Kernel kernel, int grid, int threads, size_t smem, NormBwdParams<T> p,
                         float* dweight, float* dbias, const char* name) {
  // Released to the cache at return; later users of the block run after these kernels on the
  // same (compute) stream.
  Buffer scratch(static_cast<size_t>(grid) * p.cols * sizeof(float) * (dbias ? 2 : 1),
                 Device::CUDA);
  p.partial_dw = static_cast<float*>(scratch.data());
  p.partial_db = dbias ? p.partial_dw + static_cast<int64_t>(grid) * p.cols : nullptr;
  kernel<<<grid, threads, smem, stream()>>>(p);
  check_launch(name);
  const dim3 rgrid(static_cast<unsigned>(ceil_div(p.cols, 32)), dbias ? 2u : 1u);
  norm_param_grad_kernel<kGradUnroll><<<rgrid, dim3(32, kRowLanes), 0, stream()>>>(
      p.partial_dw, dweight, p.partial_db, dbias, grid, p.cols);
  check_launch("norm_param_grad_kernel");
}

// The warp-per-row backward with K packs per lane: bf16 without the prefetch (measured faster),
// f32 with it (not measured; the variant its GPU tests ran).
template <typename T, int K, bool kCentered, bool kResidual>
static void launch_backward_warp(const NormBwdParams<T>& p, float* dweight, float* dbias) {
  constexpr int N = 16 / sizeof(T);
  constexpr bool kPrefetch = !std::is_same_v<T, bf16_t>;
  constexpr int threads = kBwdWarpThreads<kPrefetch>, warps = threads / 32;
  auto kernel = norm_backward_warp_kernel<T, N, K, kCentered, kResidual, kPrefetch>;
  const int64_t packs = p.cols / N;
  const size_t smem = static_cast<size_t>(packs) * 16 *
                      (1 + static_cast<size_t>(warps) * (kCentered ? 2 : 1) * (N / 4));
  if (smem > 48 * 1024)  // 49.5 KB for bf16 layernorm at C = 768
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
  const int grid = persistent_grid(kernel, threads, smem, ceil_div(p.rows, warps));
  run_backward<T>(kernel, grid, threads, smem, p, dweight, dbias,
                  kCentered ? "layernorm_backward_kernel" : "rmsnorm_backward_kernel");
}

template <typename T, bool kCentered, bool kResidual>
static void launch_backward(NormBwdParams<T> p, const RowPlan& plan, float* dweight, float* dbias) {
  constexpr int V = 16 / sizeof(T);
  // Rows of at most 128 16-byte packs: a warp per row (79% of copy against 69% for the block
  // per row, layernorm+residual at T = 32768, C = 768).
  if (plan.vec && p.cols / V <= 32 * kBwdWarpPacks) {
    switch (ceil_div(p.cols / V, 32)) {
      case 1: return launch_backward_warp<T, 1, kCentered, kResidual>(p, dweight, dbias);
      case 2: return launch_backward_warp<T, 2, kCentered, kResidual>(p, dweight, dbias);
      case 3: return launch_backward_warp<T, 3, kCentered, kResidual>(p, dweight, dbias);
      case 4: return launch_backward_warp<T, 4, kCentered, kResidual>(p, dweight, dbias);
      default: break;
    }
  }
  plan_switch<T>(plan, "norm backward", [&](auto n, auto k) {
    constexpr int N = decltype(n)::value, K = decltype(k)::value;
    // Prefetch the next row where the stages fit in registers (not in the scalar variant nor
    // beyond 32 bytes per thread and tensor); then keep the column sums in shared memory when
    // they fit the default 48 KB.
    constexpr bool kPrefetch = N > 1 && K * N * sizeof(T) <= 32;
    const char* name = kCentered ? "layernorm_backward_kernel" : "rmsnorm_backward_kernel";
    auto run = [&](auto kernel, size_t smem) {
      const int grid = persistent_grid(kernel, plan.threads, smem, p.rows);
      run_backward<T>(kernel, grid, plan.threads, smem, p, dweight, dbias, name);
    };
    if constexpr (kPrefetch) {
      const size_t acc_bytes = static_cast<size_t>(p.cols) * sizeof(float) * (kCentered ? 2 : 1);
      if (acc_bytes <= kMaxAccSmem)
        return run(norm_backward_kernel<T, N, K, 1, kCentered, true, kResidual>, acc_bytes);
      return run(norm_backward_kernel<T, N, K, 1, kCentered, false, kResidual>, 0);
    } else {
      return run(norm_backward_kernel<T, N, K, 0, kCentered, false, kResidual>, 0);
    }
  });
}

// mean == nullptr: rmsnorm. residual == nullptr: the plain form (sum unused), else both given.
static void norm_forward(const char* op, const Tensor& x, const Tensor* residual,
                         const Tensor& weight, const Tensor* bias, float eps, const Tensor* sum,
                         const Tensor& y, const Tensor* mean, const Tensor& rstd) {
  auto [rows, cols] = check_x(x, op);
  const bool res = residual != nullptr;
  if (res) {
    ENSURE(residual->defined() && sum && sum->defined(), op, ": residual and sum must be given");
    expect_cuda(*residual, x.dtype, x.shape, op, "residual");
    expect_cuda(*sum, x.dtype, x.shape, op, "sum");
    ENSURE(y.data != sum->data || rows == 0, op, ": y must not alias sum");
  }
  expect_cuda(weight, x.dtype, {cols}, op, "weight");
  const bool has_bias = bias && bias->data;
  if (has_bias) expect_cuda(*bias, x.dtype, {cols}, op, "bias");
  expect_cuda(y, x.dtype, x.shape, op, "y");
  if (mean) expect_cuda(*mean, DType::F32, {rows}, op, "mean");
  expect_cuda(rstd, DType::F32, {rows}, op, "rstd");
  ENSURE(eps >= 0.f, op, ": eps must be >= 0, got ", eps);
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

// dresidual == nullptr: the plain form.
static void norm_backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor* mean, const Tensor& rstd, const Tensor* dresidual,
                          const Tensor& dx, const Tensor& dweight, const Tensor* dbias) {
  auto [rows, cols] = check_x(x, op);
  const bool res = dresidual != nullptr;
  if (res) {
    ENSURE(dresidual->defined(), op, ": dresidual must be given");
    expect_cuda(*dresidual, x.dtype, x.shape, op, "dresidual");
  }
  expect_cuda(dy, x.dtype, x.shape, op, "dy");
  expect_cuda(weight, x.dtype, {cols}, op, "weight");
  if (mean) expect_cuda(*mean, DType::F32, {rows}, op, "mean");
  expect_cuda(rstd, DType::F32, {rows}, op, "rstd");
  expect_cuda(dx, x.dtype, x.shape, op, "dx");
  expect_cuda(dweight, DType::F32, {cols}, op, "dweight");
  const bool has_dbias = dbias && dbias->data;
  if (has_dbias) expect_cuda(*dbias, DType::F32, {cols}, op, "dbias");
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
    if (mean && res)
      launch_backward<T, true, true>(p, plan, dw, db);
    else if (mean)
      launch_backward<T, true, false>(p, plan, dw, db);
    else if (res)
      launch_backward<T, false, true>(p, plan, dw, nullptr);
    else
      launch_backward<T, false, false>(p, plan, dw, nullptr);
  });
}

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  norm_forward("layernorm_forward", x, nullptr, weight, &bias, eps, nullptr, y, &mean, rstd);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                        const Tensor& dbias) {
  norm_backward("layernorm_backward", dy, x, weight, &mean, rstd, nullptr, dx, dweight, &dbias);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                     const Tensor& rstd) {
  norm_forward("rmsnorm_forward", x, nullptr, weight, nullptr, eps, nullptr, y, nullptr, rstd);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight) {
  norm_backward("rmsnorm_backward", dy, x, weight, nullptr, rstd, nullptr, dx, dweight, nullptr);
}

void layernorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, float eps, const Tensor& sum, const Tensor& y,
                                const Tensor& mean, const Tensor& rstd) {
  norm_forward("layernorm_residual_forward", x, &residual, weight, &bias, eps, &sum, y, &mean,
               rstd);
}

void layernorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                                 const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  norm_backward("layernorm_residual_backward", dy, x, weight, &mean, rstd, &dresidual, dx, dweight,
                &dbias);
}

void rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              float eps, const Tensor& sum, const Tensor& y, const Tensor& rstd) {
  norm_forward("rmsnorm_residual_forward", x, &residual, weight, nullptr, eps, &sum, y, nullptr,
               rstd);
}

void rmsnorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& rstd, const Tensor& dresidual, const Tensor& dx,
                               const Tensor& dweight) {
  norm_backward("rmsnorm_residual_backward", dy, x, weight, nullptr, rstd, &dresidual, dx,
                dweight, nullptr);
}

}  // namespace engine::cuda
