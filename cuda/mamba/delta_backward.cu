// The Gated DeltaNet mixer backward (ops/delta.h) on the GPU, in the chunked form of
// delta_impl.cuh. The forward's steps 1-3 run again (delta_prepare: U, W, the entering states S0,
// D). Then, with dS1 the gradient of the state leaving a chunk, P = Q K^T * E (lower with the
// diagonal), Dm = dO D^T * E (likewise), per chunk of one value head:
//   dD  = P^T dO + diag(El) K dS1                       (= dU)
//   dS0 = Gam[n-1] dS1 + (diag(Gam) Q)^T dO - W^T dD     (the gradient entering the chunk)
//   dQ  = diag(Gam) dO S0^T + Dm K,   dK = Dm^T Q + diag(El) D dS1^T + the WY terms below
//   dW  = -dD S0^T;  through U = T B_v, W = T B_k (B_v = diag(beta) V, B_k = diag(beta Gam) K):
//   dB_v = T^T dU, dB_k = T^T dW, dT = dU B_v^T + dW B_k^T, dL = -T^T dT T^T (strictly lower),
//   dK += diag(beta Gam) dB_k + R K + R^T K with R = diag(beta) dL * E,  dV = diag(beta) dB_v
//   d gc: from every exp(gc[r] - gc[j]) (+ at r, - at j), exp(gc[r]) and exp(gc[n-1]); dg is its
//   reverse cumulative sum over the chunk, then through softplus, sigmoid, exp(A_log).
// Kernels after delta_prepare:
//   4. per (document, value head, kSlice state columns), the document's chunks in reverse: dS1
//      kept (bf16, in the slot of the next chunk's entering state), dD written; each chunk's tiles
//      copied asynchronously while its gates are computed (delta_dstate_kernel);
//   5. per (chunk, value head): dQ, the output and state parts of dK (f32, per value head), dW, the
//      d gc of those terms (delta_dqk_kernel);
//   6. per (chunk, value head): the WY terms: dv, the rest of dK, dbeta, d gc, then da, db and the
//      chunk's parameter partials (delta_wy_backward_kernel);
//   7. per (token, key head): dq^, dk^ summed over the key head's value heads in order, through
//      the unit vectors' norms (delta_unit_backward_kernel); the parameter gradients summed over
//      the chunks in order (delta_param_kernel).
// Every sum runs in a fixed order: the results are reproducible bit for bit.
#include <cmath>

#include "cuda/mamba/delta_impl.cuh"

namespace engine::cuda {
namespace {

using namespace delta_impl;

struct DeltaBwd {
  const bf16_t* dout;  // do_ block start
  int64_t lddo;
  bf16_t *dH, *dU, *dW;          // (slots, Hv, dk, dv), (T, Hv dv), (T, Hv dk)
  float *dq, *dk, *dgc, *pgrad;  // (T, Hv, dk) x 2, (T, Hv), (max_chunks, Hv, 2)
  bf16_t *dv, *da, *db;          // the gradient blocks
  int64_t lddv, ldda, lddb;
};

// dst[r ld + c] += F[r][c] (f32, ldf) for r < rows, c < width: every load issued before any store.
template <int ROWS, int COLS>
__device__ __forceinline__ void add_rows(float* __restrict__ dst, int64_t ld, int rows, int width, const float* F,
                                         int ldf) {
  constexpr int kPer = (ROWS * COLS + kThreads - 1) / kThreads;
  float v[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int i = threadIdx.x + e * kThreads, r = i / COLS, c = i % COLS;
    v[e] = i < ROWS * COLS && r < rows && c < width ? dst[r * ld + c] : 0.f;
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int i = threadIdx.x + e * kThreads, r = i / COLS, c = i % COLS;
    if (i < ROWS * COLS && r < rows && c < width) dst[r * ld + c] = v[e] + F[r * ldf + c];
  }
}

// Whether chunk c has a next chunk in its document (so a dS1 in that chunk's slot).
__device__ __forceinline__ int next_slot(const DeltaParams& p, int c) {
  return c + 1 < p.doc_chunk[p.docs] ? p.chunk_slot[c + 1] : -1;
}

template <int DK> struct DstateLayout {
  static constexpr int LK = DK + kPadB, LN = kSlice + kPadB, LS = kSlice + kPadF, LA = kChunk + kPadF,
                       LT = kChunk + kPadB;
  static constexpr size_t bytes() {
    return 3 * carve_bytes(kChunk * LK * 2) + 2 * carve_bytes(kChunk * LN * 2) + carve_bytes(kChunk * LA * 4) +
           carve_bytes(kChunk * LT * 2) + carve_bytes(size_t{DK} * LS * 4) + carve_bytes(size_t{DK} * LN * 2) +
           carve_bytes(kChunk * LS * 4) + carve_bytes(sizeof(ChunkTok));
  }
};

template <int DK>
__global__ void __launch_bounds__(kThreads) delta_dstate_kernel(DeltaParams p, DeltaBwd o) {
  const int d = blockIdx.x, h = blockIdx.y, kh = h / p.per, col0 = blockIdx.z * kSlice;
  const int width = min(kSlice, p.dv - col0);
  using L = DstateLayout<DK>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Qb = cv.take<bf16_t>(kChunk * L::LK), *Kb = cv.take<bf16_t>(kChunk * L::LK),
         *Wb = cv.take<bf16_t>(kChunk * L::LK);
  bf16_t *dOb = cv.take<bf16_t>(kChunk * L::LN), *dDb = cv.take<bf16_t>(kChunk * L::LN);
  float* A = cv.take<float>(kChunk * L::LA);
  bf16_t* Pb = cv.take<bf16_t>(kChunk * L::LT);
  float* dS = cv.take<float>(DK * L::LS);
  bf16_t* dSb = cv.take<bf16_t>(DK * L::LN);
  float* dD = cv.take<float>(kChunk * L::LS);
  ChunkTok& tok = *cv.take<ChunkTok>(1);
  for (int i = threadIdx.x; i < DK * kSlice; i += kThreads) dS[i / kSlice * L::LS + i % kSlice] = 0.f;
  const int64_t ldn = int64_t{p.Hk} * p.dk, ldu = int64_t{p.Hv} * p.dv, ldw = int64_t{p.Hv} * p.dk;
  for (int c = p.doc_chunk[d + 1] - 1; c >= p.doc_chunk[d]; --c) {
    // The chunk's tiles in flight while its gates are computed.
    const int64_t t0 = p.chunk_start[c];
    const int n = p.chunk_len[c];
    load_tile_async<kChunk, DK>(Qb, L::LK, p.qn, ldn, t0, n, int64_t{kh} * p.dk, p.dk);
    load_tile_async<kChunk, DK>(Kb, L::LK, p.kn, ldn, t0, n, int64_t{kh} * p.dk, p.dk);
    load_tile_async<kChunk, DK>(Wb, L::LK, p.W, ldw, t0, n, int64_t{h} * p.dk, p.dk);
    load_tile_async<kChunk, kSlice>(dOb, L::LN, o.dout, o.lddo, t0, n, int64_t{h} * p.dv + col0, width);
    chunk_gates(p, c, h, tok);
    const int slot = next_slot(p, c);
    bf16_t* keep = slot < 0 ? nullptr : o.dH + (int64_t{slot} * p.Hv + h) * p.dk * p.dv;
    for (int i = threadIdx.x; i < DK * kSlice; i += kThreads) {
      const int r = i / kSlice, j = i % kSlice;
      const bf16_t v = __float2bfloat16(dS[r * L::LS + j]);
      dSb[r * L::LN + j] = v;
      if (keep && r < p.dk && j < width) keep[int64_t{r} * p.dv + col0 + j] = v;
    }
    cp_async_wait_all();
    __syncthreads();
    tile_mma<kChunk, kChunk, DK, RowM, ColM>(Qb, L::LK, Kb, L::LK, A, L::LA, 0.f);  // Q K^T
    __syncthreads();
    for (int i = threadIdx.x; i < kChunk * kChunk; i += kThreads) {
      const int r = i / kChunk, j = i % kChunk;
      Pb[r * L::LT + j] = __float2bfloat16(A[r * L::LA + j] * decay(tok, r, j, false));
    }
    for (int i = threadIdx.x; i < kChunk * DK; i += kThreads) {  // Q by Gam, K by El (rows)
      const int r = i / DK, j = i % DK;
      Qb[r * L::LK + j] = __float2bfloat16(bf(Qb[r * L::LK + j]) * tok.gam[r]);
      Kb[r * L::LK + j] = __float2bfloat16(bf(Kb[r * L::LK + j]) * tok.el[r]);
    }
    __syncthreads();
    tile_mma<kChunk, kSlice, kChunk, ColM, RowM>(Pb, L::LT, dOb, L::LN, dD, L::LS, 0.f);  // P^T dO
    __syncthreads();
    tile_mma<kChunk, kSlice, DK, RowM, RowM>(Kb, L::LK, dSb, L::LN, dD, L::LS, 1.f);  // + El K dS1
    __syncthreads();
    for (int i = threadIdx.x; i < kChunk * kSlice; i += kThreads) {
      const int r = i / kSlice, j = i % kSlice;
      const float v = dD[r * L::LS + j];
      if (r < tok.n && j < width) o.dU[(tok.t0 + r) * ldu + int64_t{h} * p.dv + col0 + j] = __float2bfloat16(v);
      dDb[r * L::LN + j] = __float2bfloat16(-v);
    }
    __syncthreads();
    tile_mma<DK, kSlice, kChunk, ColM, RowM>(Qb, L::LK, dOb, L::LN, dS, L::LS, tok.gam_last);  // (Gam Q)^T dO
    __syncthreads();
    tile_mma<DK, kSlice, kChunk, ColM, RowM>(Wb, L::LK, dDb, L::LN, dS, L::LS, 1.f);  // - W^T dD
    __syncthreads();
  }
}

template <int DK, int DV> struct DqkLayout {
  static constexpr int LK = DK + kPadB, LV = DV + kPadB, LA = kChunk + kPadF, LT = kChunk + kPadB, LF = DK + kPadF;
  static_assert(size_t{DK} * LV * 2 <= 2 * carve_bytes(kChunk * LA * 4), "dS1 fits A1 and A2's area");
  static constexpr size_t bytes() {
    return 2 * carve_bytes(kChunk * LK * 2) + 2 * carve_bytes(kChunk * LV * 2) + carve_bytes(size_t{DK} * LV * 2) +
           2 * carve_bytes(kChunk * LA * 4) + carve_bytes(kChunk * LT * 2) + 2 * carve_bytes(kChunk * LF * 4) +
           carve_bytes(sizeof(ChunkTok)) + carve_bytes(5 * kChunk * 4 + kWarps * 4);
  }
};

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads) delta_dqk_kernel(DeltaParams p, DeltaBwd o) {
  const int c = blockIdx.x, h = blockIdx.y, kh = h / p.per;
  if (c >= p.doc_chunk[p.docs]) return;
  using L = DqkLayout<DK, DV>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Qb = cv.take<bf16_t>(kChunk * L::LK), *Kb = cv.take<bf16_t>(kChunk * L::LK);
  bf16_t *Xb = cv.take<bf16_t>(kChunk * L::LV), *Db = cv.take<bf16_t>(kChunk * L::LV);  // dO then dD; D
  bf16_t* Sb = cv.take<bf16_t>(DK * L::LV);                                                // S0 then dS1
  float *A1 = cv.take<float>(kChunk * L::LA), *A2 = cv.take<float>(kChunk * L::LA);
  bf16_t* Dm = cv.take<bf16_t>(kChunk * L::LT);
  float *F1 = cv.take<float>(kChunk * L::LF), *F2 = cv.take<float>(kChunk * L::LF);
  ChunkTok& tok = *cv.take<ChunkTok>(1);
  float* small = cv.take<float>(5 * kChunk + kWarps);
  float *rsum = small, *csum = small + kChunk, *qsum = small + 2 * kChunk, *dgc = small + 3 * kChunk,
        *xs = small + 4 * kChunk, *red = small + 5 * kChunk;
  chunk_gates(p, c, h, tok);
  const int64_t ldn = int64_t{p.Hk} * p.dk, ldu = int64_t{p.Hv} * p.dv, ldw = int64_t{p.Hv} * p.dk;
  load_tile<kChunk, DK>(Qb, L::LK, p.qn, ldn, tok.t0, tok.n, int64_t{kh} * p.dk, p.dk, nullptr);
  load_tile<kChunk, DK>(Kb, L::LK, p.kn, ldn, tok.t0, tok.n, int64_t{kh} * p.dk, p.dk, nullptr);
  load_tile<kChunk, DV>(Xb, L::LV, o.dout, o.lddo, tok.t0, tok.n, int64_t{h} * p.dv, p.dv, nullptr);
  load_tile<kChunk, DV>(Db, L::LV, p.D, ldu, tok.t0, tok.n, int64_t{h} * p.dv, p.dv, nullptr);
  load_state<DK, DV>(p, p.H, tok.slot, h, Sb, L::LV);
  __syncthreads();
  tile_mma<kChunk, kChunk, DK, RowM, ColM>(Qb, L::LK, Kb, L::LK, A1, L::LA, 0.f);  // Q K^T
  tile_mma<kChunk, kChunk, DV, RowM, ColM>(Xb, L::LV, Db, L::LV, A2, L::LA, 0.f);  // dO D^T
  tile_mma<kChunk, DK, DV, RowM, ColM>(Xb, L::LV, Sb, L::LV, F1, L::LF, 0.f);      // dO S0^T
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, j = i % kChunk;
    const float d2 = A2[r * L::LA + j] * decay(tok, r, j, false);
    Dm[r * L::LT + j] = __float2bfloat16(d2);
    A2[r * L::LA + j] = A1[r * L::LA + j] * d2;  // d gc through E[r][j]
  }
  __syncthreads();
  {
    const int w = threadIdx.x / kChunk, r = threadIdx.x % kChunk;  // four groups of 64 threads
    float acc = 0.f;
    if (w == 0)
      for (int j = 0; j < kChunk; ++j) acc += A2[r * L::LA + j];
    else if (w == 1)
      for (int j = 0; j < kChunk; ++j) acc += A2[j * L::LA + r];
    else if (w == 2)
      for (int i = 0; i < DK; ++i) acc += bf(Qb[r * L::LK + i]) * F1[r * L::LF + i];
    if (w < 3) (w == 0 ? rsum : w == 1 ? csum : qsum)[r] = acc;
  }
  __syncthreads();
  if (threadIdx.x < kChunk) {
    const int r = threadIdx.x;
    dgc[r] = rsum[r] - csum[r] + tok.gam[r] * qsum[r];
  }
  for (int i = threadIdx.x; i < kChunk * DK; i += kThreads) F1[i / DK * L::LF + i % DK] *= tok.gam[i / DK];
  __syncthreads();
  tile_mma<kChunk, DK, kChunk, RowM, RowM>(Dm, L::LT, Kb, L::LK, F1, L::LF, 1.f);  // dQ
  tile_mma<kChunk, DK, kChunk, ColM, RowM>(Dm, L::LT, Qb, L::LK, F2, L::LF, 0.f);  // Dm^T Q
  __syncthreads();
  const int64_t part = int64_t{p.Hv} * p.dk;
  for (int i = threadIdx.x; i < tok.n * p.dk; i += kThreads) {
    const int r = i / p.dk, j = i % p.dk;
    o.dq[(tok.t0 + r) * part + int64_t{h} * p.dk + j] = F1[r * L::LF + j];
  }
  load_tile<kChunk, DV>(Xb, L::LV, o.dU, ldu, tok.t0, tok.n, int64_t{h} * p.dv, p.dv, nullptr);  // dD
  __syncthreads();
  tile_mma<kChunk, DK, DV, RowM, ColM>(Xb, L::LV, Sb, L::LV, F1, L::LF, 0.f);  // dD S0^T
  __syncthreads();
  for (int i = threadIdx.x; i < tok.n * p.dk; i += kThreads) {
    const int r = i / p.dk, j = i % p.dk;
    o.dW[(tok.t0 + r) * ldw + int64_t{h} * p.dk + j] = __float2bfloat16(-F1[r * L::LF + j]);
  }
  // dS1 (zeros after a document's last chunk) into A1 and A2's area, free from here; <dS1, S0>.
  bf16_t* G1 = reinterpret_cast<bf16_t*>(A1);
  load_state<DK, DV>(p, o.dH, next_slot(p, c), h, G1, L::LV);
  __syncthreads();
  float dot = 0.f;
  for (int i = threadIdx.x; i < DK * DV; i += kThreads)
    dot += bf(G1[i / DV * L::LV + i % DV]) * bf(Sb[i / DV * L::LV + i % DV]);
  dot = block_sum(dot, red);
  tile_mma<kChunk, DK, DV, RowM, ColM>(Db, L::LV, G1, L::LV, F1, L::LF, 0.f);  // D dS1^T
  __syncthreads();
  if (threadIdx.x < kChunk) {
    const int r = threadIdx.x;
    float acc = 0.f;
    for (int i = 0; i < DK; ++i) acc += bf(Kb[r * L::LK + i]) * F1[r * L::LF + i];
    xs[r] = tok.el[r] * acc;  // d gc through El[r]: - at r, + at n - 1
    dgc[r] -= xs[r];
  }
  __syncthreads();
  if (threadIdx.x == 0 && tok.n > 0) {
    float s = 0.f;
    for (int r = 0; r < tok.n; ++r) s += xs[r];
    dgc[tok.n - 1] += s + tok.gam_last * dot;
  }
  for (int i = threadIdx.x; i < tok.n * p.dk; i += kThreads) {
    const int r = i / p.dk, j = i % p.dk;
    o.dk[(tok.t0 + r) * part + int64_t{h} * p.dk + j] = F2[r * L::LF + j] + tok.el[r] * F1[r * L::LF + j];
  }
  __syncthreads();
  if (threadIdx.x < tok.n) o.dgc[(tok.t0 + threadIdx.x) * p.Hv + h] = dgc[threadIdx.x];
}

template <int DK, int DV> struct WyBwdLayout {
  static constexpr int LK = DK + kPadB, LV = DV + kPadB, LA = kChunk + kPadF, LT = kChunk + kPadB,
                       LO = (DK > DV ? DK : DV) + kPadF;
  static constexpr size_t bytes() {
    return 3 * carve_bytes(kChunk * LK * 2) + 2 * carve_bytes(kChunk * LV * 2) + 2 * carve_bytes(kChunk * LA * 4) +
           2 * carve_bytes(kChunk * LT * 2) + carve_bytes(kChunk * LO * 4) + carve_bytes(sizeof(ChunkTok)) +
           carve_bytes(8 * kChunk * 4);
  }
};

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads) delta_wy_backward_kernel(DeltaParams p, DeltaBwd o) {
  const int c = blockIdx.x, h = blockIdx.y, kh = h / p.per;
  if (c >= p.doc_chunk[p.docs]) return;
  using L = WyBwdLayout<DK, DV>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Kb = cv.take<bf16_t>(kChunk * L::LK), *Bk = cv.take<bf16_t>(kChunk * L::LK),
         *dWb = cv.take<bf16_t>(kChunk * L::LK);
  bf16_t *Bv = cv.take<bf16_t>(kChunk * L::LV), *dUb = cv.take<bf16_t>(kChunk * L::LV);
  float *A = cv.take<float>(kChunk * L::LA), *dT = cv.take<float>(kChunk * L::LA);
  bf16_t *Tb = cv.take<bf16_t>(kChunk * L::LT), *Xb = cv.take<bf16_t>(kChunk * L::LT);
  float* F = cv.take<float>(kChunk * L::LO);
  ChunkTok& tok = *cv.take<ChunkTok>(1);
  float* small = cv.take<float>(8 * kChunk);
  float *bg = small, *dbv = small + kChunk, *kd = small + 2 * kChunk, *ysum = small + 3 * kChunk,
        *ycol = small + 4 * kChunk, *dgc = small + 5 * kChunk, *pa = small + 6 * kChunk, *pb = small + 7 * kChunk;
  chunk_gates(p, c, h, tok);
  if (threadIdx.x < kChunk) bg[threadIdx.x] = tok.beta[threadIdx.x] * tok.gam[threadIdx.x];
  __syncthreads();
  const int64_t ldn = int64_t{p.Hk} * p.dk, ldu = int64_t{p.Hv} * p.dv, ldw = int64_t{p.Hv} * p.dk;
  load_tile<kChunk, DK>(Kb, L::LK, p.kn, ldn, tok.t0, tok.n, int64_t{kh} * p.dk, p.dk, nullptr);
  load_tile<kChunk, DK>(Bk, L::LK, p.kn, ldn, tok.t0, tok.n, int64_t{kh} * p.dk, p.dk, bg);
  load_tile<kChunk, DK>(dWb, L::LK, o.dW, ldw, tok.t0, tok.n, int64_t{h} * p.dk, p.dk, nullptr);
  load_tile<kChunk, DV>(Bv, L::LV, p.v, p.ldv, tok.t0, tok.n, int64_t{h} * p.dv, p.dv, tok.beta);
  load_tile<kChunk, DV>(dUb, L::LV, o.dU, ldu, tok.t0, tok.n, int64_t{h} * p.dv, p.dv, nullptr);
  __syncthreads();
  decayed_gram<DK>(Kb, L::LK, tok, A, L::LA);
  solve_tril(A, L::LA, tok, Tb, L::LT);
  __syncthreads();
  tile_mma<kChunk, DV, kChunk, ColM, RowM>(Tb, L::LT, dUb, L::LV, F, L::LO, 0.f);  // dB_v = T^T dU
  tile_mma<kChunk, kChunk, DV, RowM, ColM>(dUb, L::LV, Bv, L::LV, dT, L::LA, 0.f);  // dT = dU B_v^T
  __syncthreads();
  tile_mma<kChunk, kChunk, DK, RowM, ColM>(dWb, L::LK, Bk, L::LK, dT, L::LA, 1.f);  //    + dW B_k^T
  for (int i = threadIdx.x; i < tok.n * p.dv; i += kThreads) {
    const int r = i / p.dv, j = i % p.dv;
    o.dv[(tok.t0 + r) * o.lddv + int64_t{h} * p.dv + j] = __float2bfloat16(tok.beta[r] * F[r * L::LO + j]);
  }
  if (threadIdx.x < kChunk) {
    const int r = threadIdx.x;
    float acc = 0.f;
    if (r < tok.n)
      for (int j = 0; j < p.dv; ++j) acc += F[r * L::LO + j] * bf(p.v[(tok.t0 + r) * p.ldv + int64_t{h} * p.dv + j]);
    dbv[r] = acc;
  }
  __syncthreads();
  tile_mma<kChunk, DK, kChunk, ColM, RowM>(Tb, L::LT, dWb, L::LK, F, L::LO, 0.f);  // dB_k = T^T dW
  for (int i = threadIdx.x; i < kChunk * kChunk; i += kThreads) Xb[i / kChunk * L::LT + i % kChunk] =
      __float2bfloat16(dT[i / kChunk * L::LA + i % kChunk]);
  __syncthreads();
  tile_mma<kChunk, kChunk, kChunk, ColM, RowM>(Tb, L::LT, Xb, L::LT, dT, L::LA, 0.f);  // T^T dT
  if (threadIdx.x < kChunk) {
    const int r = threadIdx.x;
    float acc = 0.f;
    for (int j = 0; j < DK; ++j) acc += F[r * L::LO + j] * bf(Kb[r * L::LK + j]);
    kd[r] = acc;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * DK; i += kThreads) F[i / DK * L::LO + i % DK] *= bg[i / DK];
  for (int i = threadIdx.x; i < kChunk * kChunk; i += kThreads) Xb[i / kChunk * L::LT + i % kChunk] =
      __float2bfloat16(dT[i / kChunk * L::LA + i % kChunk]);
  __syncthreads();
  tile_mma<kChunk, kChunk, kChunk, RowM, ColM>(Xb, L::LT, Tb, L::LT, dT, L::LA, 0.f);  // (T^T dT) T^T = -dL
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, j = i % kChunk;
    const float e = decay(tok, r, j, true), dl = e != 0.f ? -dT[r * L::LA + j] : 0.f;
    Xb[r * L::LT + j] = __float2bfloat16(tok.beta[r] * dl * e);  // R = d (K K^T)
    dT[r * L::LA + j] = dl * A[r * L::LA + j];                    // dL times K K^T E
  }
  __syncthreads();
  if (threadIdx.x < 2 * kChunk) {
    const int r = threadIdx.x % kChunk;
    float acc = 0.f;
    if (threadIdx.x < kChunk)
      for (int j = 0; j < kChunk; ++j) acc += dT[r * L::LA + j];
    else
      for (int j = 0; j < kChunk; ++j) acc += tok.beta[j] * dT[j * L::LA + r];
    (threadIdx.x < kChunk ? ysum : ycol)[r] = acc;
  }
  tile_mma<kChunk, DK, kChunk, RowM, RowM>(Xb, L::LT, Kb, L::LK, F, L::LO, 1.f);  // + R K
  __syncthreads();
  tile_mma<kChunk, DK, kChunk, ColM, RowM>(Xb, L::LT, Kb, L::LK, F, L::LO, 1.f);  // + R^T K
  __syncthreads();
  add_rows<kChunk, DK>(o.dk + tok.t0 * int64_t{p.Hv} * p.dk + int64_t{h} * p.dk, int64_t{p.Hv} * p.dk, tok.n, p.dk,
                       F, L::LO);
  float dbeta = 0.f;
  if (threadIdx.x < tok.n) {
    const int r = threadIdx.x;
    dbeta = dbv[r] + tok.gam[r] * kd[r] + ysum[r];
    dgc[r] = o.dgc[(tok.t0 + r) * p.Hv + h] + bg[r] * kd[r] + tok.beta[r] * ysum[r] - ycol[r];
  }
  __syncthreads();
  if (threadIdx.x < tok.n) {
    const int r = threadIdx.x;
    float dg = 0.f;
    for (int i = tok.n - 1; i >= r; --i) dg += dgc[i];  // gc[i] sums g[r] for every i >= r
    const float da = dg * tok.dgda[r], beta = tok.beta[r];
    const int64_t t = tok.t0 + r;
    o.da[t * o.ldda + h] = __float2bfloat16(da);
    o.db[t * o.lddb + h] = __float2bfloat16(dbeta * beta * (1.f - beta));
    pa[r] = dg * tok.g[r];  // d g / d A_log = g
    pb[r] = da;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sa = 0.f, sb = 0.f;
    for (int r = 0; r < tok.n; ++r) sa += pa[r], sb += pb[r];
    o.pgrad[(int64_t{c} * p.Hv + h) * 2] = sa;
    o.pgrad[(int64_t{c} * p.Hv + h) * 2 + 1] = sb;
  }
}

// dq, dk from dq^, dk^ (per value head) summed over the key head's value heads in order, through
// x^ = f x / sqrt(|x|^2 + eps): dx = f (dx^ / n - x (x . dx^) / n^3). A warp per (token, key head).
__global__ void delta_unit_backward_kernel(DeltaParams p, DeltaBwd o, bf16_t* __restrict__ dq, int64_t lddq,
                                           bf16_t* __restrict__ dk, int64_t lddk) {
  const int64_t w = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (w >= p.T * p.Hk) return;
  const int64_t t = w / p.Hk;
  const int i = static_cast<int>(w % p.Hk), lane = threadIdx.x % 32;
  constexpr int kPer = 128 / 32;  // dk <= 128
  for (int which = 0; which < 2; ++which) {
    const bf16_t* x = (which ? p.k + t * p.ldk : p.q + t * p.ldq) + int64_t{i} * p.dk;
    const float* part = (which ? o.dk : o.dq) + t * int64_t{p.Hv} * p.dk;
    float xv[kPer], g[kPer], ss = 0.f, dot = 0.f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int j = lane + 32 * e;
      xv[e] = g[e] = 0.f;
      if (j >= p.dk) continue;
      xv[e] = bf(x[j]);
      for (int h = i * p.per; h < (i + 1) * p.per; ++h) g[e] += part[int64_t{h} * p.dk + j];
      ss += xv[e] * xv[e];
      dot += xv[e] * g[e];
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      ss += __shfl_xor_sync(0xffffffffu, ss, s);
      dot += __shfl_xor_sync(0xffffffffu, dot, s);
    }
    const float rn = rsqrtf(ss + kL2Eps), f = which ? 1.f : p.scale;
    bf16_t* out = (which ? dk + t * lddk : dq + t * lddq) + int64_t{i} * p.dk;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int j = lane + 32 * e;
      if (j < p.dk) out[j] = __float2bfloat16(f * (g[e] * rn - xv[e] * dot * rn * rn * rn));
    }
  }
}

// dA_log, ddt_bias += the chunks' partial sums in order.
__global__ void delta_param_kernel(DeltaParams p, const float* __restrict__ pgrad, float* __restrict__ dalog,
                                   float* __restrict__ dbias) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= p.Hv) return;
  float a = 0.f, b = 0.f;
  for (int c = 0; c < p.doc_chunk[p.docs]; ++c) {
    a += pgrad[(int64_t{c} * p.Hv + h) * 2];
    b += pgrad[(int64_t{c} * p.Hv + h) * 2 + 1];
  }
  dalog[h] += a;
  dbias[h] += b;
}

}  // namespace

void gated_delta_backward(const ops::DeltaArgs& a, const ops::ColumnBlock& do_, const ops::DeltaGrads& g) {
  const char* op = "gated_delta_backward";
  check_delta_cuda(op, a);
  expect_bf16(do_.base, op, "do");
  expect_bf16(g.dq.base, op, "dq");
  expect_bf16(g.dk.base, op, "dk");
  expect_bf16(g.dv.base, op, "dv");
  expect_bf16(g.da.base, op, "da");
  expect_bf16(g.db.base, op, "db");
  ENSURE(g.dA_log.dtype == DType::F32 && g.ddt_bias.dtype == DType::F32, op, ": dA_log and ddt_bias must be f32");
  if (a.q.rows() == 0) return;
  DeltaWork w;
  const DeltaParams p = delta_prepare(a, w);  // (steps 1-3; their workspaces: ops::gated_delta_workspace_bytes)
  const int64_t T = p.T, slots = ops::delta_state_slots(T);
  Owned dH = empty({slots * p.Hv * p.dk * p.dv}, DType::BF16, Device::CUDA);
  Owned dU = empty({T * p.Hv * p.dv}, DType::BF16, Device::CUDA), dW = empty({T * p.Hv * p.dk}, DType::BF16, Device::CUDA);
  Owned parts = empty({2 * T * p.Hv * p.dk + T * p.Hv}, DType::F32, Device::CUDA);
  Owned pgrad = empty({int64_t{p.max_chunks} * p.Hv * 2}, DType::F32, Device::CUDA);
  float* pf = static_cast<float*>(parts.t.data);
  DeltaBwd o{block_ptr<const bf16_t>(do_), do_.ld(), static_cast<bf16_t*>(dH.t.data), static_cast<bf16_t*>(dU.t.data),
             static_cast<bf16_t*>(dW.t.data), pf, pf + T * p.Hv * p.dk, pf + 2 * T * p.Hv * p.dk,
             static_cast<float*>(pgrad.t.data), block_ptr<bf16_t>(g.dv), block_ptr<bf16_t>(g.da),
             block_ptr<bf16_t>(g.db), g.dv.ld(), g.da.ld(), g.db.ld()};
  with_dims(p.dk, p.dv, [&]<int DK, int DV>() {
    const size_t s4 = DstateLayout<DK>::bytes(), s5 = DqkLayout<DK, DV>::bytes(), s6 = WyBwdLayout<DK, DV>::bytes();
    if (p.docs > 0) {
      allow_smem(delta_dstate_kernel<DK>, s4);
      delta_dstate_kernel<DK><<<dim3(p.docs, p.Hv, ceil_div(p.dv, kSlice)), kThreads, s4, stream()>>>(p, o);
      check_launch("delta_dstate_kernel");
    }
    allow_smem(delta_dqk_kernel<DK, DV>, s5);
    delta_dqk_kernel<DK, DV><<<dim3(p.max_chunks, p.Hv), kThreads, s5, stream()>>>(p, o);
    check_launch("delta_dqk_kernel");
    allow_smem(delta_wy_backward_kernel<DK, DV>, s6);
    delta_wy_backward_kernel<DK, DV><<<dim3(p.max_chunks, p.Hv), kThreads, s6, stream()>>>(p, o);
    check_launch("delta_wy_backward_kernel");
  });
  delta_unit_backward_kernel<<<static_cast<unsigned>(ceil_div(T * p.Hk, kWarps)), kThreads, 0, stream()>>>(
      p, o, block_ptr<bf16_t>(g.dq), g.dq.ld(), block_ptr<bf16_t>(g.dk), g.dk.ld());
  check_launch("delta_unit_backward_kernel");
  delta_param_kernel<<<static_cast<unsigned>(ceil_div(p.Hv, 128)), 128, 0, stream()>>>(
      p, o.pgrad, static_cast<float*>(g.dA_log.data), static_cast<float*>(g.ddt_bias.data));
  check_launch("delta_param_kernel");
}

}  // namespace engine::cuda
