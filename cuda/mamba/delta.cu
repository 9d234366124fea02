// The Gated DeltaNet mixer forward (ops/delta.h) on the GPU, in the chunked form of delta_impl.cuh:
//   1. the chunk table from cu_seqlens, and q^, k^ (delta_unit_kernel);
//   2. per (chunk, value head): K K^T times the decays, T by forward substitution, U = T (beta V)
//      and W = T (beta Gam K) (delta_wy_kernel, also run by the backward);
//   3. per (document, value head, kSlice state columns): the walk over the document's chunks: the
//      entering state kept (bf16), D = U - W S0 written, S = Gam[n-1] S0 + K^T (El D) (f32 in
//      shared memory; each chunk's tiles copied asynchronously while its gates are computed)
//      (delta_state_kernel, also run by the backward);
//   4. per (chunk, value head): O = diag(Gam) Q S0 + (Q K^T * E) D (delta_output_kernel).
// Memory: q, k, v, a, b, o bf16 column blocks (any alignment: scalar loads), A_log and dt_bias bf16;
// the workspaces of ops::gated_delta_workspace_bytes. The head norm and the one-token step are
// delta_norm.cu.
#include "cuda/mamba/delta_impl.cuh"

#include <cmath>

namespace engine::cuda {
namespace delta_impl {

template <int DK, int DV> struct WyLayout {
  static constexpr int LK = DK + kPadB, LV = DV + kPadB, LA = kChunk + kPadF, LT = kChunk + kPadB,
                       LO = (DK > DV ? DK : DV) + kPadF;
  static constexpr size_t bytes() {
    return 2 * carve_bytes(kChunk * LK * 2) + carve_bytes(kChunk * LV * 2) + carve_bytes(kChunk * LA * 4) +
           carve_bytes(kChunk * LT * 2) + carve_bytes(kChunk * LO * 4) + carve_bytes(sizeof(ChunkTok));
  }
};

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads) delta_wy_kernel(DeltaParams p) {
  const int c = blockIdx.x, h = blockIdx.y, kh = h / p.per;
  if (c >= p.doc_chunk[p.docs]) return;
  using L = WyLayout<DK, DV>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Kb = cv.take<bf16_t>(kChunk * L::LK), *Bk = cv.take<bf16_t>(kChunk * L::LK);
  bf16_t* Bv = cv.take<bf16_t>(kChunk * L::LV);
  float* A = cv.take<float>(kChunk * L::LA);
  bf16_t* Tb = cv.take<bf16_t>(kChunk * L::LT);
  float* O = cv.take<float>(kChunk * L::LO);
  ChunkTok& tok = *cv.take<ChunkTok>(1);
  chunk_gates(p, c, h, tok);
  if (threadIdx.x < kChunk) O[threadIdx.x] = tok.beta[threadIdx.x] * tok.gam[threadIdx.x];  // (row scales)
  __syncthreads();
  const int64_t ldn = int64_t{p.Hk} * p.dk;
  load_tile<kChunk, DK>(Kb, L::LK, p.kn, ldn, tok.t0, tok.n, int64_t{kh} * p.dk, p.dk, nullptr);
  load_tile<kChunk, DK>(Bk, L::LK, p.kn, ldn, tok.t0, tok.n, int64_t{kh} * p.dk, p.dk, O);
  load_tile<kChunk, DV>(Bv, L::LV, p.v, p.ldv, tok.t0, tok.n, int64_t{h} * p.dv, p.dv, tok.beta);
  __syncthreads();
  decayed_gram<DK>(Kb, L::LK, tok, A, L::LA);
  solve_tril(A, L::LA, tok, Tb, L::LT);
  __syncthreads();
  tile_mma<kChunk, DV, kChunk, RowM, RowM>(Tb, L::LT, Bv, L::LV, O, L::LO, 0.f);
  __syncthreads();
  const int64_t ldu = int64_t{p.Hv} * p.dv, ldw = int64_t{p.Hv} * p.dk;
  for (int i = threadIdx.x; i < tok.n * p.dv; i += kThreads) {
    const int r = i / p.dv, j = i % p.dv;
    p.U[(tok.t0 + r) * ldu + int64_t{h} * p.dv + j] = __float2bfloat16(O[r * L::LO + j]);
  }
  __syncthreads();
  tile_mma<kChunk, DK, kChunk, RowM, RowM>(Tb, L::LT, Bk, L::LK, O, L::LO, 0.f);
  __syncthreads();
  for (int i = threadIdx.x; i < tok.n * p.dk; i += kThreads) {
    const int r = i / p.dk, j = i % p.dk;
    p.W[(tok.t0 + r) * ldw + int64_t{h} * p.dk + j] = __float2bfloat16(O[r * L::LO + j]);
  }
}

template <int DK> struct StateLayout {
  static constexpr int LK = DK + kPadB, LN = kSlice + kPadB, LS = kSlice + kPadF;
  static constexpr size_t bytes() {
    return 2 * carve_bytes(kChunk * LK * 2) + 2 * carve_bytes(kChunk * LN * 2) + carve_bytes(size_t{DK} * LS * 4) +
           carve_bytes(size_t{DK} * LN * 2) + carve_bytes(kChunk * LS * 4) + carve_bytes(sizeof(ChunkTok));
  }
};

template <int DK>
__global__ void __launch_bounds__(kThreads) delta_state_kernel(DeltaParams p) {
  const int d = blockIdx.x, h = blockIdx.y, kh = h / p.per, col0 = blockIdx.z * kSlice;
  const int width = min(kSlice, p.dv - col0);
  using L = StateLayout<DK>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Wb = cv.take<bf16_t>(kChunk * L::LK), *Kp = cv.take<bf16_t>(kChunk * L::LK);
  bf16_t *Db = cv.take<bf16_t>(kChunk * L::LN), *Ub = cv.take<bf16_t>(kChunk * L::LN);
  float* S = cv.take<float>(DK * L::LS);
  bf16_t* Sb = cv.take<bf16_t>(DK * L::LN);
  float* X = cv.take<float>(kChunk * L::LS);
  ChunkTok& tok = *cv.take<ChunkTok>(1);
  for (int i = threadIdx.x; i < DK * kSlice; i += kThreads) S[i / kSlice * L::LS + i % kSlice] = 0.f;
  const int64_t ldn = int64_t{p.Hk} * p.dk, ldu = int64_t{p.Hv} * p.dv, ldw = int64_t{p.Hv} * p.dk;
  for (int c = p.doc_chunk[d]; c < p.doc_chunk[d + 1]; ++c) {
    // The chunk's tiles in flight while its gates are computed.
    const int64_t t0 = p.chunk_start[c];
    const int n = p.chunk_len[c];
    load_tile_async<kChunk, DK>(Wb, L::LK, p.W, ldw, t0, n, int64_t{h} * p.dk, p.dk);
    load_tile_async<kChunk, DK>(Kp, L::LK, p.kn, ldn, t0, n, int64_t{kh} * p.dk, p.dk);
    load_tile_async<kChunk, kSlice>(Ub, L::LN, p.U, ldu, t0, n, int64_t{h} * p.dv + col0, width);
    chunk_gates(p, c, h, tok);
    bf16_t* enter = tok.slot < 0 ? nullptr : p.H + (int64_t{tok.slot} * p.Hv + h) * p.dk * p.dv;
    for (int i = threadIdx.x; i < DK * kSlice; i += kThreads) {
      const int r = i / kSlice, j = i % kSlice;
      const bf16_t v = __float2bfloat16(S[r * L::LS + j]);
      Sb[r * L::LN + j] = v;
      if (enter && r < p.dk && j < width) enter[int64_t{r} * p.dv + col0 + j] = v;
    }
    cp_async_wait_all();
    __syncthreads();
    tile_mma<kChunk, kSlice, DK, RowM, RowM>(Wb, L::LK, Sb, L::LN, X, L::LS, 0.f);  // W S0
    __syncthreads();
    for (int i = threadIdx.x; i < kChunk * kSlice; i += kThreads) {
      const int r = i / kSlice, j = i % kSlice;
      const float v = bf(Ub[r * L::LN + j]) - X[r * L::LS + j];  // (0 past the chunk and the slice)
      if (r < tok.n && j < width) p.D[(tok.t0 + r) * ldu + int64_t{h} * p.dv + col0 + j] = __float2bfloat16(v);
      Db[r * L::LN + j] = __float2bfloat16(tok.el[r] * v);  // (diag(El) K)^T D = K^T (El D)
    }
    __syncthreads();
    tile_mma<DK, kSlice, kChunk, ColM, RowM>(Kp, L::LK, Db, L::LN, S, L::LS, tok.gam_last);
    __syncthreads();
  }
}

template <int DK, int DV> struct OutLayout {
  static constexpr int LK = DK + kPadB, LV = DV + kPadB, LA = kChunk + kPadF, LT = kChunk + kPadB, LO = DV + kPadF;
  static constexpr size_t bytes() {
    return 2 * carve_bytes(kChunk * LK * 2) + carve_bytes(size_t{DK} * LV * 2) + carve_bytes(kChunk * LV * 2) +
           carve_bytes(kChunk * LA * 4) + carve_bytes(kChunk * LT * 2) + carve_bytes(kChunk * LO * 4) +
           carve_bytes(sizeof(ChunkTok));
  }
};

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads) delta_output_kernel(DeltaParams p, bf16_t* __restrict__ o, int64_t ldo) {
  const int c = blockIdx.x, h = blockIdx.y, kh = h / p.per;
  if (c >= p.doc_chunk[p.docs]) return;
  using L = OutLayout<DK, DV>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Qb = cv.take<bf16_t>(kChunk * L::LK), *Kb = cv.take<bf16_t>(kChunk * L::LK);
  bf16_t *Sb = cv.take<bf16_t>(DK * L::LV), *Db = cv.take<bf16_t>(kChunk * L::LV);
  float* A = cv.take<float>(kChunk * L::LA);
  bf16_t* Pb = cv.take<bf16_t>(kChunk * L::LT);
  float* O = cv.take<float>(kChunk * L::LO);
  ChunkTok& tok = *cv.take<ChunkTok>(1);
  chunk_gates(p, c, h, tok);
  const int64_t ldn = int64_t{p.Hk} * p.dk, ldu = int64_t{p.Hv} * p.dv;
  load_tile<kChunk, DK>(Qb, L::LK, p.qn, ldn, tok.t0, tok.n, int64_t{kh} * p.dk, p.dk, nullptr);
  load_tile<kChunk, DK>(Kb, L::LK, p.kn, ldn, tok.t0, tok.n, int64_t{kh} * p.dk, p.dk, nullptr);
  load_tile<kChunk, DV>(Db, L::LV, p.D, ldu, tok.t0, tok.n, int64_t{h} * p.dv, p.dv, nullptr);
  load_state<DK, DV>(p, p.H, tok.slot, h, Sb, L::LV);
  __syncthreads();
  tile_mma<kChunk, kChunk, DK, RowM, ColM>(Qb, L::LK, Kb, L::LK, A, L::LA, 0.f);  // Q K^T
  tile_mma<kChunk, DV, DK, RowM, RowM>(Qb, L::LK, Sb, L::LV, O, L::LO, 0.f);      // Q S0
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, j = i % kChunk;
    Pb[r * L::LT + j] = __float2bfloat16(A[r * L::LA + j] * decay(tok, r, j, false));
  }
  for (int i = threadIdx.x; i < kChunk * DV; i += kThreads) O[i / DV * L::LO + i % DV] *= tok.gam[i / DV];
  __syncthreads();
  tile_mma<kChunk, DV, kChunk, RowM, RowM>(Pb, L::LT, Db, L::LV, O, L::LO, 1.f);
  __syncthreads();
  for (int i = threadIdx.x; i < tok.n * p.dv; i += kThreads) {
    const int r = i / p.dv, j = i % p.dv;
    o[(tok.t0 + r) * ldo + int64_t{h} * p.dv + j] = __float2bfloat16(O[r * L::LO + j]);
  }
}

DeltaParams delta_prepare(const ops::DeltaArgs& a, DeltaWork& w) {
  DeltaParams p{};
  p.q = block_ptr<const bf16_t>(a.q);
  p.k = block_ptr<const bf16_t>(a.k);
  p.v = block_ptr<const bf16_t>(a.v);
  p.a = block_ptr<const bf16_t>(a.a);
  p.b = block_ptr<const bf16_t>(a.b);
  p.ldq = a.q.ld();
  p.ldk = a.k.ld();
  p.ldv = a.v.ld();
  p.lda = a.a.ld();
  p.ldb = a.b.ld();
  p.alog = static_cast<const bf16_t*>(a.A_log.data);
  p.bias = static_cast<const bf16_t*>(a.dt_bias.data);
  p.T = a.q.rows();
  p.Hk = static_cast<int>(a.key_heads);
  p.Hv = static_cast<int>(a.A_log.size(0));
  p.dk = static_cast<int>(a.q.width / p.Hk);
  p.dv = static_cast<int>(a.v.width / p.Hv);
  p.per = p.Hv / p.Hk;
  p.scale = 1.f / std::sqrt(static_cast<float>(p.dk));
  p.docs = static_cast<int>(a.cu_seqlens.numel() - 1);
  const int64_t chunks = ops::delta_max_chunks(p.T, p.docs), slots = ops::delta_state_slots(p.T);
  p.max_chunks = static_cast<int>(chunks);
  w.table = empty({p.docs + 1 + 3 * chunks}, DType::I32, Device::CUDA);
  int32_t *table = static_cast<int32_t*>(w.table.t.data), *start = table + p.docs + 1, *len = start + chunks,
          *slot = len + chunks;
  p.doc_chunk = table;
  p.chunk_start = start;
  p.chunk_len = len;
  p.chunk_slot = slot;
  const auto bf16_buffer = [](Owned& o, int64_t n) {
    o = empty({n}, DType::BF16, Device::CUDA);
    return static_cast<bf16_t*>(o.t.data);
  };
  p.qn = bf16_buffer(w.qn, p.T * p.Hk * p.dk);
  p.kn = bf16_buffer(w.kn, p.T * p.Hk * p.dk);
  p.U = bf16_buffer(w.U, p.T * p.Hv * p.dv);
  p.D = bf16_buffer(w.D, p.T * p.Hv * p.dv);
  p.W = bf16_buffer(w.W, p.T * p.Hv * p.dk);
  p.H = bf16_buffer(w.H, slots * p.Hv * p.dk * p.dv);
  delta_chunks_kernel<<<1, 1024, 0, stream()>>>(static_cast<const int32_t*>(a.cu_seqlens.data), p.docs, table,
                                                start, len, slot);
  check_launch("delta_chunks_kernel");
  delta_unit_kernel<<<static_cast<unsigned>(ceil_div(p.T * p.Hk, kWarps)), kThreads, 0, stream()>>>(p);
  check_launch("delta_unit_kernel");
  with_dims(p.dk, p.dv, [&]<int DK, int DV>() {
    const size_t wy = WyLayout<DK, DV>::bytes(), state = StateLayout<DK>::bytes();
    allow_smem(delta_wy_kernel<DK, DV>, wy);
    delta_wy_kernel<DK, DV><<<dim3(p.max_chunks, p.Hv), kThreads, wy, stream()>>>(p);
    check_launch("delta_wy_kernel");
    if (p.docs > 0) {
      allow_smem(delta_state_kernel<DK>, state);
      delta_state_kernel<DK><<<dim3(p.docs, p.Hv, ceil_div(p.dv, kSlice)), kThreads, state, stream()>>>(p);
      check_launch("delta_state_kernel");
    }
  });
  return p;
}

}  // namespace delta_impl

using namespace delta_impl;

void gated_delta_forward(const ops::DeltaArgs& a, const ops::ColumnBlock& o) {
  const char* op = "gated_delta_forward";
  check_delta_cuda(op, a);
  expect_bf16(o.base, op, "o");
  if (a.q.rows() == 0) return;
  DeltaWork w;
  const DeltaParams p = delta_prepare(a, w);
  with_dims(p.dk, p.dv, [&]<int DK, int DV>() {
    const size_t smem = OutLayout<DK, DV>::bytes();
    allow_smem(delta_output_kernel<DK, DV>, smem);
    delta_output_kernel<DK, DV><<<dim3(p.max_chunks, p.Hv), kThreads, smem, stream()>>>(p, block_ptr<bf16_t>(o),
                                                                                       o.ld());
    check_launch("delta_output_kernel");
  });
}

}  // namespace engine::cuda
