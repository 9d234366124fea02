// Shared by the selective scan's kernel files (scan.cu: the forward, scan_backward.cu: the
// backward): the kernels' parameters, device helpers and launcher checks (what the CUDA kernels
// take beyond the shared preconditions of ops/mamba.cpp). .cu only.
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/mamba/common.cuh"
#include "cuda/mamba/poly_math.h"
#include "ops/mamba.h"

namespace engine::cuda::scan_impl {

constexpr int kN = ops::kMambaMaxState;  // states per channel held in registers
constexpr int kThreads = 128;   // channels per block
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChunk = 128;
constexpr int kAhead = 24;  // chunks whose inputs the combine steps load before using any

struct ScanParams {
  const bf16_t* x;          // (T, ldx): channel d of token t at x[t * ldx + d]
  int64_t ldx;
  const bf16_t* dt;         // (T, Di)
  const bf16_t* A_log;      // (Di, N)
  const bf16_t* B;          // (T, ldb): state n of token t at B[t * ldb + n]
  int64_t ldb;
  const bf16_t* C;          // (T, ldc)
  int64_t ldc;
  const bf16_t* D;          // (Di)
  const bf16_t* dt_bias;    // (Di)
  const bf16_t* z;          // (T, ldz)
  int64_t ldz;
  const uint32_t* starts;   // (start_words) document-start bits
  int64_t start_words;
  int64_t tokens;
  int channels, states, chunk, chunks;
  float* chunk_states;      // (chunks, N, Di)
  float* sums;              // (chunks, Di) scratch: delta summed over a chunk, -1: a document starts
  bf16_t* y;                // forward: (T, ldy)
  int64_t ldy;
  const bf16_t* dy;         // backward: (T, lddy)
  int64_t lddy;
  float* carry;             // backward: (chunks, N, Di) scratch
  bf16_t* dx;               // (T, lddx)
  int64_t lddx;
  bf16_t* ddt;              // (T, Di)
  bf16_t* dz;               // (T, lddz)
  int64_t lddz;
  float* dbc_part;          // (channel groups, T, 2 kN): dB partials in [0, kN), dC in [kN, 2 kN)
  float* param_part;        // (chunk blocks, kN + 2, Di): dA_log partials, then dD, ddt_bias
  int chunks_per_block;
};

// log(1 + e^v) = max(v, 0) + log1p(u), u = e^-|v| in (0, 1]: one exp (flushed to 0 below
// 2^-126, where softplus is below 1e-38) and the polynomial log1p_q (poly_math.h), branch free;
// within a few 1e-7 relative (the ex2's 2 ulp and log1p_q's 1.8e-7). An exp and a log, or an exp
// and a series chosen by a branch, would diverge within a warp when channels' dt biases differ.
__device__ __forceinline__ float softplus_fast(float v) {
  const float u = ex2(fabsf(v) * -kLog2e);
  return fmaf(u, mamba::log1p_q(u), fmaxf(v, 0.f));
}
// The decay 2^(delta a2 + rb) of one state: rb is 0, or -inf at a document's first token, which
// makes the decay 0, so that h = a h + b restarts the state without a select per state.
__device__ __forceinline__ float decay(float delta, float a2, float rb) {
  return ex2(fmaf(delta, a2, rb));
}

// Four states [4q, 4q + 4) of a shared-memory row of kN floats.
__device__ __forceinline__ float4 quad(const float* row, int q) {
  return reinterpret_cast<const float4*>(row)[q];
}
__device__ __forceinline__ float at(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// A[n] log2(e) for channel d (0 for missing states: they stay zero).
__device__ __forceinline__ void load_a2(const ScanParams& p, int d, float (&a2)[kN]) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
    a2[n] = n < p.states ? -expf(mamba::bf(p.A_log[static_cast<int64_t>(d) * p.states + n])) * kLog2e
                         : 0.f;
}

// Shared-memory rows of the chunk's tokens [t0, t0 + len): s[i * kN + n] = M[t0 + i, n] (0 past N).
__device__ __forceinline__ void load_rows(const bf16_t* m, int64_t ld, int64_t t0, int len,
                                          int states, float* s) {
  for (int i = threadIdx.x; i < len * kN; i += blockDim.x) {
    const int r = i / kN, n = i % kN;
    s[i] = n < states ? mamba::bf(m[(t0 + r) * ld + n]) : 0.f;
  }
}

__device__ __forceinline__ mamba::ChunkStarts chunk_starts(const ScanParams& p, int64_t t0) {
  return mamba::chunk_starts(p.starts, p.start_words, t0);
}

// The reset arguments of a chunk's tokens [t0, t0 + len) in shared memory, so that the token
// loops read one float2 instead of extracting a bit: r[i] = (-inf, 0) at a document's first token
// (the decay's argument and the factor that restarts a running sum), else (0, 1). Returns whether
// this thread's tokens hold a document start (the block's OR is __syncthreads_or of it).
__device__ __forceinline__ bool load_resets(const ScanParams& p, int64_t t0, int len, float2* r) {
  const mamba::ChunkStarts st = chunk_starts(p, t0);
  bool any = false;
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const bool s = st(i);
    r[i] = s ? make_float2(-INFINITY, 0.f) : make_float2(0.f, 1.f);
    any = any || s;
  }
  return any;
}

struct ScanShape {
  int64_t tokens;
  int channels, states, chunks;
};

// A_log in bf16 (every activation and weight has its dtype, checked before), chunk_states f32,
// and the kernels' limits.
inline ScanShape check_scan(const char* op, const ops::ScanArgs& a, const Tensor& chunk_states) {
  mamba::expect_bf16(a.A_log, op, "A_log");
  const int64_t di = a.A_log.size(0), n = a.A_log.size(1), t = a.x.rows();
  ENSURE(n >= 1 && n <= kN, op, ": N = ", n, " states, the CUDA kernels hold 1 to ", kN);
  ENSURE(di >= 1 && di < (int64_t{1} << 27), op, ": ", di, " channels");
  ENSURE(t < (int64_t{1} << 31), op, ": T = ", t, " tokens");
  ENSURE(a.chunk_len >= 1 && a.chunk_len <= kMaxChunk, op, ": chunk_len ", a.chunk_len,
         " not in [1, ", kMaxChunk, "] (CUDA kernels)");
  ops::expect_dtype(chunk_states, DType::F32, op, "chunk_states");
  const int64_t chunks = ops::scan_num_chunks(t, a.chunk_len);
  return {t, static_cast<int>(di), static_cast<int>(n), static_cast<int>(chunks)};
}

// The token loops step the pointers into the (T, Di) blocks (x, z, y, dy, dx, dz) by 32-bit row
// strides, one add a token instead of a 64-bit offset (B and C rows are indexed in 64 bits, dt and
// ddt are Di wide): a row of 2^31 elements is no model's.
inline void expect_int_stride(const ops::ColumnBlock& b, const char* op, const char* name) {
  ENSURE(b.ld() < (int64_t{1} << 31), op, ": ", name, "'s row stride ", b.ld(), " does not fit 32 bits");
}

inline ScanParams scan_params(const ScanShape& s, const ops::ScanArgs& a, const Tensor& chunk_states,
                       const Owned& starts, const Owned& sums) {
  ScanParams p{};
  p.x = mamba::block_ptr<const bf16_t>(a.x);
  p.ldx = a.x.ld();
  p.dt = static_cast<const bf16_t*>(a.dt.data);
  p.A_log = static_cast<const bf16_t*>(a.A_log.data);
  p.B = mamba::block_ptr<const bf16_t>(a.B);
  p.ldb = a.B.ld();
  p.C = mamba::block_ptr<const bf16_t>(a.C);
  p.ldc = a.C.ld();
  p.D = static_cast<const bf16_t*>(a.D.data);
  p.dt_bias = static_cast<const bf16_t*>(a.dt_bias.data);
  p.z = mamba::block_ptr<const bf16_t>(a.z);
  p.ldz = a.z.ld();
  p.starts = static_cast<const uint32_t*>(starts.t.data);
  p.start_words = mamba::start_words(s.tokens);
  p.tokens = s.tokens;
  p.channels = s.channels;
  p.states = s.states;
  p.chunk = static_cast<int>(a.chunk_len);
  p.chunks = s.chunks;
  p.chunk_states = static_cast<float*>(chunk_states.data);
  p.sums = static_cast<float*>(sums.t.data);
  return p;
}

inline unsigned channel_blocks(int channels) { return static_cast<unsigned>(ceil_div(channels, kThreads)); }
inline unsigned flat_blocks(int64_t items, int threads) { return static_cast<unsigned>(ceil_div(items, threads)); }

}  // namespace engine::cuda::scan_impl
