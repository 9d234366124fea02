// Shared by the Gated DeltaNet kernels (delta.cu, delta_backward.cu; .cu only): the parameters,
// the chunk table, the per-token gates of a chunk and the chunk's triangular solve.
//
// The chunked form (Yang, Kautz and Hatamizadeh 2024; the WY representation of the delta rule).
// Each document is cut into chunks of kChunk tokens (its last one shorter), so a chunk never holds
// two documents and the state is zero entering a document's first chunk. For one value head and a
// chunk of tokens r = 0 .. n-1 (q, k the unit vectors of ops/delta.h, q scaled by 1/sqrt(dk)), with
// gc[r] = g[0] + .. + g[r] and E[r][j] = exp(gc[r] - gc[j]) (j <= r), Gam[r] = exp(gc[r]),
// El[j] = E[n-1][j]:
//   L = strictly lower (beta[r] E[r][j] k[r] . k[j]),  T = (I + L)^-1          (64 x 64)
//   U = T diag(beta) V,  W = T diag(beta Gam) K       (the deltas are U - W S0)
//   D = U - W S0                                      (S0 the entering state, dk x dv)
//   O = diag(Gam) Q S0 + (Q K^T * E, lower with the diagonal) D
//   S_next = Gam[n-1] S0 + (diag(El) K)^T D
// Kernels: chunk table; unit vectors (q^, k^ in bf16); per (chunk, value head) U and W; per
// (document, value head, 32 state columns) the walk over the document's chunks (entering
// states kept in bf16 in slots: a document's first chunk has none, so they take at most
// tokens / kChunk slots whatever the documents), D written; per (chunk, value head) the output.
// Many documents far shorter than a chunk cost a chunk's work each. Products are bf16 tiles
// in shared memory with f32 accumulators (tiles.cuh); states are f32 in shared memory, rounded
// to bf16 as operands. Head dims pad to 64 or 128 (the kernels' templates); zeros stay zeros.
#pragma once
#include <cstdint>

#include "cuda/mamba/tiles.cuh"
#include "ops/delta.h"

namespace engine::cuda::delta_impl {

using namespace mamba;
using namespace tiles;

constexpr int kChunk = static_cast<int>(ops::kDeltaChunk);  // tokens of a chunk
constexpr int kSlice = 32;   // state columns of one walk
constexpr float kL2Eps = 1e-6f;

struct DeltaParams {
  const bf16_t *q, *k, *v, *a, *b;  // column-block starts
  int64_t ldq, ldk, ldv, lda, ldb;
  const bf16_t *alog, *bias;         // (Hv)
  int64_t T;
  int Hk, Hv, dk, dv, per;           // per = Hv / Hk value heads a key head
  float scale;                        // 1 / sqrt(dk)
  int docs, max_chunks;              // cu_seqlens' documents, the chunk table's capacity
  const int32_t* doc_chunk;          // (docs + 1) first chunk of each document; [docs]: the count
  const int32_t* chunk_start;        // (max_chunks) first token
  const int32_t* chunk_len;          // (max_chunks) tokens
  const int32_t* chunk_slot;         // (max_chunks) its entering state's slot, -1: zero (delta_chunks_kernel)
  // Workspaces (bf16 unless noted): q^, k^ (T, Hk dk); U, D (T, Hv dv); W (T, Hv dk);
  // entering states (slots, Hv, dk, dv).
  bf16_t *qn, *kn, *U, *W, *D, *H;
};

// One block: each thread counts the chunks and the non-empty documents of a run of documents,
// thread 0 turns the counts into first indices, each thread writes its documents' chunks. A
// chunk's state slot: its index less the documents begun at or before it (-1 for a document's
// first chunk, whose entering state is zero), so the slots number at most tokens / kChunk.
static __global__ void delta_chunks_kernel(const int32_t* __restrict__ cu, int docs, int32_t* __restrict__ doc_chunk,
                                           int32_t* __restrict__ start, int32_t* __restrict__ len,
                                           int32_t* __restrict__ slot) {
  __shared__ int32_t first[1024], begun[1024];
  const int per = (docs + 1023) / 1024, d0 = min(docs, static_cast<int>(threadIdx.x) * per),
            d1 = min(docs, d0 + per);
  int count = 0, nonempty = 0;
  for (int d = d0; d < d1; ++d) {
    const int n = max(cu[d + 1] - cu[d], 0);
    count += (n + kChunk - 1) / kChunk;
    nonempty += n > 0;
  }
  first[threadIdx.x] = count;
  begun[threadIdx.x] = nonempty;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0, run_docs = 0;
    for (int i = 0; i < 1024; ++i) {
      const int v = first[i], w = begun[i];
      first[i] = run;
      begun[i] = run_docs;
      run += v;
      run_docs += w;
    }
    doc_chunk[docs] = run;
  }
  __syncthreads();
  int c = first[threadIdx.x], b = begun[threadIdx.x];
  for (int d = d0; d < d1; ++d) {
    doc_chunk[d] = c;
    const int n = max(cu[d + 1] - cu[d], 0);
    b += n > 0;
    for (int s = 0; s < n; s += kChunk, ++c) {
      start[c] = cu[d] + s;
      len[c] = min(kChunk, n - s);
      slot[c] = s == 0 ? -1 : c - b;
    }
  }
}

// The unit vectors of q (times scale) and k: a warp per (token, key head).
static __global__ void delta_unit_kernel(DeltaParams p) {
  const int64_t w = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (w >= p.T * p.Hk) return;
  const int64_t t = w / p.Hk;
  const int i = static_cast<int>(w % p.Hk), lane = threadIdx.x % 32;
  constexpr int kPer = 128 / 32;  // dk <= 128 (check_delta_cuda)
  for (int which = 0; which < 2; ++which) {
    const bf16_t* src = (which ? p.k + t * p.ldk : p.q + t * p.ldq) + int64_t{i} * p.dk;
    float x[kPer], ss = 0.f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      x[e] = lane + 32 * e < p.dk ? bf(src[lane + 32 * e]) : 0.f;
      ss += x[e] * x[e];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float f = (which ? 1.f : p.scale) * rsqrtf(ss + kL2Eps);
    bf16_t* dst = (which ? p.kn : p.qn) + t * (int64_t{p.Hk} * p.dk) + int64_t{i} * p.dk;
#pragma unroll
    for (int e = 0; e < kPer; ++e)
      if (lane + 32 * e < p.dk) dst[lane + 32 * e] = __float2bfloat16(x[e] * f);
  }
}

__device__ __forceinline__ float softplus_f(float v) { return v > 20.f ? v : log1pf(__expf(v)); }
__device__ __forceinline__ float sigmoid_f(float v) { return 1.f / (1.f + __expf(-v)); }

// Per-token values of a chunk for one value head, in shared memory.
struct ChunkTok {
  float beta[kChunk], g[kChunk], gc[kChunk];  // 0 past the chunk
  float gam[kChunk], el[kChunk];              // exp(gc), exp(gc[n-1] - gc) (0 past the chunk)
  float dgda[kChunk];                         // d g / d a = -exp(A_log) sigmoid(a + dt_bias)
  float gam_last;                             // exp(gc[n-1])
  int64_t t0;
  int n, slot;                                // tokens; the entering state's slot (-1: zero)
};

// Fills `tok` for chunk c, value head h (warps 0-1; every thread calls it: it synchronises).
__device__ __forceinline__ void chunk_gates(const DeltaParams& p, int c, int h, ChunkTok& tok) {
  __shared__ float warp0_total;
  const int r = threadIdx.x;
  const int64_t t0 = p.chunk_start[c];
  const int n = p.chunk_len[c];
  if (r < kChunk) {
    float beta = 0.f, g = 0.f, dgda = 0.f;
    if (r < n) {
      const int64_t t = t0 + r;
      const float A = __expf(bf(p.alog[h])), pre = bf(p.a[t * p.lda + h]) + bf(p.bias[h]);
      beta = sigmoid_f(bf(p.b[t * p.ldb + h]));
      g = -A * softplus_f(pre);
      dgda = -A * sigmoid_f(pre);
    }
    float cum = g;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float v = __shfl_up_sync(0xffffffffu, cum, o);
      if (r % 32 >= o) cum += v;
    }
    if (r == 31) warp0_total = cum;
    tok.beta[r] = beta;
    tok.g[r] = g;
    tok.dgda[r] = dgda;
    tok.gc[r] = cum;
  }
  if (r == 0) tok.t0 = t0, tok.n = n, tok.slot = p.chunk_slot[c];
  __syncthreads();
  if (r >= 32 && r < kChunk) tok.gc[r] += warp0_total;
  __syncthreads();
  if (r < kChunk) {
    const float last = tok.gc[max(n - 1, 0)];
    tok.gam[r] = r < n ? __expf(tok.gc[r]) : 0.f;
    tok.el[r] = r < n ? __expf(last - tok.gc[r]) : 0.f;
    if (r == 0) tok.gam_last = n > 0 ? __expf(last) : 0.f;
  }
  __syncthreads();
}

// E[r][j] = exp(gc[r] - gc[j]) where j <= r < n (strict: j < r), else 0.
__device__ __forceinline__ float decay(const ChunkTok& tok, int r, int j, bool strict) {
  return (strict ? j < r : j <= r) && r < tok.n ? __expf(tok.gc[r] - tok.gc[j]) : 0.f;
}

// KKE (kChunk x kChunk f32, ld) holds k[r] . k[j] E[r][j] below the diagonal (0 elsewhere):
// Tb (bf16, ldt) = (I + diag(beta) KKE)^-1 by forward substitution, a thread per column (threads
// 0-63). Callers synchronise before and after.
__device__ __forceinline__ void solve_tril(const float* KKE, int ld, const ChunkTok& tok, bf16_t* Tb, int ldt) {
  const int c = threadIdx.x;
  if (c >= kChunk) return;
  float x[kChunk];
#pragma unroll
  for (int r = 0; r < kChunk; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < r; ++j) acc += KKE[r * ld + j] * x[j];
    x[r] = (r == c ? 1.f : 0.f) - tok.beta[r] * acc;
  }
#pragma unroll
  for (int r = 0; r < kChunk; ++r) Tb[r * ldt + c] = __float2bfloat16(x[r]);
}

// K K^T times the strict decays (f32, ld LA) of the chunk's k^ tile Kb: the matrix solve_tril takes.
template <int DK>
__device__ __forceinline__ void decayed_gram(const bf16_t* Kb, int ldk, const ChunkTok& tok, float* A, int lda) {
  tile_mma<kChunk, kChunk, DK, RowM, ColM>(Kb, ldk, Kb, ldk, A, lda, 0.f);
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, j = i % kChunk;
    A[r * lda + j] *= decay(tok, r, j, true);
  }
  __syncthreads();
}

// Tile (DK x DV, bf16, ld) of the state in `slot` of a (slots, Hv, dk, dv) buffer for value head
// h: zeros for slot -1 and in the padding.
template <int DK, int DV>
__device__ __forceinline__ void load_state(const DeltaParams& p, const bf16_t* states, int slot, int h, bf16_t* dst,
                                           int ld) {
  const bf16_t* src = states + (int64_t{max(slot, 0)} * p.Hv + h) * p.dk * p.dv;
  load_tile<DK, DV>(dst, ld, src, p.dv, 0, slot >= 0 ? p.dk : 0, 0, p.dv, nullptr);
}

// The launchers' checks beyond ops/delta.cpp's: bf16 activations and weights, the head dims.
inline void check_delta_cuda(const char* op, const ops::DeltaArgs& a) {
  expect_bf16(a.q.base, op, "q");
  const int64_t hk = a.key_heads, hv = a.A_log.size(0);
  ENSURE(a.q.width / hk <= 128 && a.v.width / hv <= 128, op, ": key head dim ", a.q.width / hk,
         " and value head dim ", a.v.width / hv, " must be at most 128 on the GPU");
  ENSURE(a.q.rows() < (int64_t{1} << 31), op, ": ", a.q.rows(), " tokens, at most 2^31 - 1 on the GPU");
  ENSURE(hv <= 65535, op, ": ", hv, " value heads, at most 65535 on the GPU (a grid dimension)");
}

// The workspaces of one op call (ops::gated_delta_workspace_bytes counts them).
struct DeltaWork {
  Owned table, qn, kn, U, W, D, H;
};

// Steps 1-3 of delta.cu (the chunk table, q^ and k^, U and W, the entering states and D) into `w`;
// the parameters for the kernels that follow.
DeltaParams delta_prepare(const ops::DeltaArgs& a, DeltaWork& w);

// f.template operator()<DK, DV>() with the head dims padded to 64 or 128.
template <typename F> void with_dims(int64_t dk, int64_t dv, F&& f) {
  if (dk <= 64 && dv <= 64) return f.template operator()<64, 64>();
  if (dk <= 64) return f.template operator()<64, 128>();
  if (dv <= 64) return f.template operator()<128, 64>();
  return f.template operator()<128, 128>();
}

}  // namespace engine::cuda::delta_impl
