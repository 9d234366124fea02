// Selective scan of Mamba over packed documents (csrc/ops/mamba.h), per channel d and state n:
//   delta = softplus(dt + dt_bias),  a = exp(delta A) with A = -exp(A_log),
//   h[t] = a h[t-1] + delta B[t] x[t] (h = 0 before a document),
//   y = (sum_n C h + D x) silu(z)
// Layout: a thread owns one channel and holds its N (<= kN = 16; missing states are zeros that
// stay zero) states in registers; channels run across the warp, so each token row is read as
// whole 32-byte sectors; B and C of the chunk's tokens (shared by all channels) sit in shared
// memory. Tokens are cut into chunks of L (chunk_len) consecutive tokens of the packed batch;
// documents start anywhere inside them (document starts are a bitmask built from cu_seqlens).
//
// Forward, three kernels:
//   1. chunk summary: each (chunk, channel) runs its chunk from a zero state and writes the end
//      state and the chunk's sum of delta (-1 when a document starts in it: nothing flows through);
//   2. combine: each (state, channel) walks the chunks in order, state after chunk c =
//      exp(A sum_c) state after chunk c-1 + summary c; this is chunk_states, saved for backward;
//   3. output: each (chunk, channel) reruns its chunk from its entering state and writes y.
// Steps 1-2 are skipped with one chunk. Every chunk runs in parallel: T / L x Di threads, however
// long the documents. The cost: two passes of exp per (token, channel, state) instead of one.
//
// Backward, with g[t] = dL/dh[t] = gy[t] + a[t+1] g[t+1], gy = dy silu(z) C:
//   1-2. the same two steps in reverse give carry[c] = a g flowing into chunk c's last token from
//        the chunks after it;
//   3. per (chunk, channel): pass F runs the chunk forward from chunk_states (dz, dD, dC terms),
//      pass R runs it backward from carry (dx, ddt, dB terms). The term of ddelta and dA that
//      pairs g[t] with h[t-1], q[t] = g[t] a[t] h[t-1], needs both directions at one token; it is
//      rewritten with q[t] = sum_{s >= t in the document} (gy[s] h[s] - g[s] b[s]) (b = delta B x;
//      by induction: g h - g b at t equals gy h - g b at t plus q[t+1]): split at the chunk end,
//      q[t] = sum_{s = t}^{end} (gy h)[s] - sum_{s = t}^{end} (g b)[s] + carry h[end]. Pass F stores
//      P[t] = sum_n A gy h per token (shared memory), pass R subtracts sum_n A g b, so ddelta
//      needs no stored states; dA = sum_t delta q is split the same way (pass F: sum_s (gy h)[s]
//      times the chunk-local cumulative delta, pass R: sum_t delta times the running sum of g b).
//   dB and dC (sums over channels) are reduced across the warp (a transposing butterfly: 16
//   values over 32 lanes in 16 shuffles), across the block's warps in shared memory, and across
//   blocks through a scratch (channel groups, T, 32) f32 buffer summed by a second kernel;
//   dA_log, dD, ddt_bias likewise through per-chunk-block partials. No float atomics: bitwise
//   reproducible.
// exp is ex2.approx with A pre-multiplied by log2(e); state and sums f32.
// Measured on one H200 (8 x 4096 and 1 x 32768 tokens, Di 4096, N 16, chunk 64; csrc/bench/mamba.cpp):
// forward 2.17 ms (1.98 T ex2/s over its two passes, about half the special-function units'
// 16 per clock and multiprocessor; 11.6% of copy bandwidth on the bytes that must move),
// backward 8.3 ms (5.3%). The bound is exp and instruction issue, not memory: one ex2 per
// (token, channel, state) is 2.1G per pass, 0.55 ms at the units' peak, against 0.25 ms for the
// forward's bytes at copy speed. These are the ScanForward/ScanBackward::kChunked kernels of
// scan.cuh (the default); its other variants (scan_lean.cu: the same steps in fewer instructions,
// some exps on the FMA pipes; scan_docs.cu: a one-pass forward per document) share this file's
// launchers, checks and reductions (scan_impl.cuh). Static instruction counts of the inner loops
// per token and warp (cuobjdump -sass): output 199 (20 special-function ops, at 8 issue slots
// each on the unit), summary 138; backward summary 187, pass F 406, pass R 487: issue bound.
// Memory: x, dt, z, B, C, dy, dx, ddt, dz, dB, dC bf16 (column blocks, any alignment: scalar
// loads); A_log, D, dt_bias bf16; chunk_states f32 (chunks, N, Di); dA_log, dD, ddt_bias f32 +=.
// Limits: N <= 16, chunk_len <= 128, T < 2^31, Di < 2^31 / 16.
#include "cuda/mamba/scan.cuh"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "cuda/mamba/scan_impl.cuh"

namespace engine::cuda {

namespace {

using namespace scan_impl;


// ---- forward ----

// Chunk c (< chunks - 1) from a zero state: its end state into chunk_states[c + 1] (the combine
// step turns it into the entering state of chunk c + 1) and its delta sum (-1: a document starts).
static __global__ void __launch_bounds__(kThreads, 8) scan_chunk_summary_kernel(ScanParams p) {
  __shared__ __align__(16) float sB[kMaxChunk * kN];
  const int c = blockIdx.x;
  const int64_t t0 = static_cast<int64_t>(c) * p.chunk;
  const int len = static_cast<int>(min(static_cast<int64_t>(p.chunk), p.tokens - t0));
  load_rows(p.B, p.ldb, t0, len, p.states, sB);
  __syncthreads();
  const int d = blockIdx.y * kThreads + threadIdx.x;
  if (d >= p.channels) return;
  const mamba::ChunkStarts starts = chunk_starts(p, t0);
  float a2[kN], h[kN];
  load_a2(p, d, a2);
#pragma unroll
  for (int n = 0; n < kN; ++n) h[n] = 0.f;
  const float bias = mamba::bf(p.dt_bias[d]);
  float sum = 0.f;
  bool reset = false;
  float dt_next = mamba::bf(p.dt[t0 * p.channels + d]), x_next = mamba::bf(p.x[t0 * p.ldx + d]);
  for (int i = 0; i < len; ++i) {
    const float dtv = dt_next, xv = x_next;
    if (i + 1 < len) {
      dt_next = mamba::bf(p.dt[(t0 + i + 1) * p.channels + d]);
      x_next = mamba::bf(p.x[(t0 + i + 1) * p.ldx + d]);
    }
    if (starts(i)) {
#pragma unroll
      for (int n = 0; n < kN; ++n) h[n] = 0.f;
      sum = 0.f;
      reset = true;
    }
    const float delta = mamba::softplus(dtv + bias), du = delta * xv;
    sum += delta;
    float bv[kN];
    row16(sB + i * kN, bv);
#pragma unroll
    for (int n = 0; n < kN; ++n) h[n] = ex2(delta * a2[n]) * h[n] + du * bv[n];
  }
  float* out = p.chunk_states + (static_cast<int64_t>(c + 1) * p.states) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n)
    if (n < p.states) out[static_cast<int64_t>(n) * p.channels] = h[n];
  p.sums[static_cast<int64_t>(c) * p.channels + d] = reset ? -1.f : sum;
}

// chunk_states[c] for every chunk, in place over the summaries: one thread per (state, channel).
static __global__ void scan_chunk_combine_kernel(ScanParams p) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= static_cast<int64_t>(p.states) * p.channels) return;
  const int n = static_cast<int>(i / p.channels), d = static_cast<int>(i % p.channels);
  const float a2 = -expf(mamba::bf(p.A_log[static_cast<int64_t>(d) * p.states + n])) * kLog2e;
  const int64_t stride = static_cast<int64_t>(p.states) * p.channels;
  float* st = p.chunk_states + i;
  st[0] = 0.f;
  float state = 0.f;
  // The next chunk's values are loaded before this one's store (different addresses), so the
  // loop waits on one load latency per chunk at most.
  float s_next = p.sums[d], summary_next = st[stride];
  for (int c = 0; c + 1 < p.chunks; ++c) {
    const float s = s_next, summary = summary_next;
    if (c + 2 < p.chunks) {
      s_next = p.sums[static_cast<int64_t>(c + 1) * p.channels + d];
      summary_next = st[(c + 2) * stride];
    }
    state = (s < 0.f ? 0.f : ex2(a2 * s) * state) + summary;
    st[(c + 1) * stride] = state;
  }
}

static __global__ void __launch_bounds__(kThreads, 7) scan_output_kernel(ScanParams p) {
  __shared__ __align__(16) float sB[kMaxChunk * kN];
  __shared__ __align__(16) float sC[kMaxChunk * kN];
  const int c = blockIdx.x;
  const int64_t t0 = static_cast<int64_t>(c) * p.chunk;
  const int len = static_cast<int>(min(static_cast<int64_t>(p.chunk), p.tokens - t0));
  load_rows(p.B, p.ldb, t0, len, p.states, sB);
  load_rows(p.C, p.ldc, t0, len, p.states, sC);
  __syncthreads();
  const int d = blockIdx.y * kThreads + threadIdx.x;
  if (d >= p.channels) return;
  const mamba::ChunkStarts starts = chunk_starts(p, t0);
  float a2[kN], h[kN];
  load_a2(p, d, a2);
  const float* in = p.chunk_states + (static_cast<int64_t>(c) * p.states) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n) h[n] = n < p.states ? in[static_cast<int64_t>(n) * p.channels] : 0.f;
  const float bias = mamba::bf(p.dt_bias[d]), dd = mamba::bf(p.D[d]);
  float dt_next = mamba::bf(p.dt[t0 * p.channels + d]), x_next = mamba::bf(p.x[t0 * p.ldx + d]),
        z_next = mamba::bf(p.z[t0 * p.ldz + d]);
  for (int i = 0; i < len; ++i) {
    const int64_t t = t0 + i;
    const float dtv = dt_next, xv = x_next, zv = z_next;
    if (i + 1 < len) {
      dt_next = mamba::bf(p.dt[(t + 1) * p.channels + d]);
      x_next = mamba::bf(p.x[(t + 1) * p.ldx + d]);
      z_next = mamba::bf(p.z[(t + 1) * p.ldz + d]);
    }
    if (starts(i)) {
#pragma unroll
      for (int n = 0; n < kN; ++n) h[n] = 0.f;
    }
    const float delta = mamba::softplus(dtv + bias), du = delta * xv;
    float bv[kN], cv[kN];
    row16(sB + i * kN, bv);
    row16(sC + i * kN, cv);
    float acc = dd * xv;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      h[n] = ex2(delta * a2[n]) * h[n] + du * bv[n];
      acc += cv[n] * h[n];
    }
    p.y[t * p.ldy + d] = __float2bfloat16(acc * zv * mamba::sigmoid(zv));
  }
}

// ---- backward ----

// Chunk c (>= 1) run backward from nothing: the a g that flows out of its first token into chunk
// c - 1 (into carry[c]; the combine step turns it into chunk c's carry) and its delta sum.
static __global__ void __launch_bounds__(kThreads) scan_bwd_chunk_summary_kernel(ScanParams p) {
  __shared__ __align__(16) float sC[kMaxChunk * kN];
  const int c = blockIdx.x + 1;
  const int64_t t0 = static_cast<int64_t>(c) * p.chunk;
  const int len = static_cast<int>(min(static_cast<int64_t>(p.chunk), p.tokens - t0));
  load_rows(p.C, p.ldc, t0, len, p.states, sC);
  __syncthreads();
  const int d = blockIdx.y * kThreads + threadIdx.x;
  if (d >= p.channels) return;
  const mamba::ChunkStarts starts = chunk_starts(p, t0);
  float a2[kN], g[kN];
  load_a2(p, d, a2);
#pragma unroll
  for (int n = 0; n < kN; ++n) g[n] = 0.f;
  const float bias = mamba::bf(p.dt_bias[d]);
  float sum = 0.f;
  bool reset = false;
  int64_t t = t0 + len - 1;
  float dt_next = mamba::bf(p.dt[t * p.channels + d]), z_next = mamba::bf(p.z[t * p.ldz + d]),
        dy_next = mamba::bf(p.dy[t * p.lddy + d]);
  for (int i = len - 1; i >= 0; --i, --t) {
    const float dtv = dt_next, zv = z_next, gy = dy_next;
    if (i > 0) {
      dt_next = mamba::bf(p.dt[(t - 1) * p.channels + d]);
      z_next = mamba::bf(p.z[(t - 1) * p.ldz + d]);
      dy_next = mamba::bf(p.dy[(t - 1) * p.lddy + d]);
    }
    const float delta = mamba::softplus(dtv + bias);
    const float gs = gy * zv * mamba::sigmoid(zv);
    sum += delta;
    float cv[kN];
    row16(sC + i * kN, cv);
    if (starts(i)) {  // nothing flows from t into the previous document
      reset = true;
#pragma unroll
      for (int n = 0; n < kN; ++n) g[n] = 0.f;
    } else {
#pragma unroll
      for (int n = 0; n < kN; ++n) g[n] = ex2(delta * a2[n]) * (gs * cv[n] + g[n]);
    }
  }
  float* out = p.carry + (static_cast<int64_t>(c) * p.states) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n)
    if (n < p.states) out[static_cast<int64_t>(n) * p.channels] = g[n];
  p.sums[static_cast<int64_t>(c) * p.channels + d] = reset ? -1.f : sum;
}

// carry[c] for every chunk (c = chunks - 1 down to 0), in place over the summaries.
static __global__ void scan_bwd_chunk_combine_kernel(ScanParams p) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= static_cast<int64_t>(p.states) * p.channels) return;
  const int n = static_cast<int>(i / p.channels), d = static_cast<int>(i % p.channels);
  const float a2 = -expf(mamba::bf(p.A_log[static_cast<int64_t>(d) * p.states + n])) * kLog2e;
  const int64_t stride = static_cast<int64_t>(p.states) * p.channels;
  float* cr = p.carry + i;
  float carry = 0.f;
  const int64_t last = p.chunks - 1;
  float summary_next = cr[last * stride], s_next = p.sums[last * p.channels + d];
  for (int c = p.chunks - 1; c >= 1; --c) {
    const float summary = summary_next, s = s_next;
    if (c >= 2) {
      summary_next = cr[(c - 1) * stride];
      s_next = p.sums[static_cast<int64_t>(c - 1) * p.channels + d];
    }
    cr[c * stride] = carry;
    carry = summary + (s < 0.f ? 0.f : ex2(a2 * s) * carry);
  }
  cr[0] = carry;
}


static __global__ void __launch_bounds__(kThreads, 4) scan_bwd_kernel(ScanParams p) {
  extern __shared__ __align__(16) float smem[];
  const int L = p.chunk;
  float* sB = smem;                     // [L][kN]
  float* sC = sB + L * kN;              // [L][kN]
  float* sP = sC + L * kN;              // [L][kThreads]: sum_n A2 gy h of each thread's tokens
  float* sRed = sP + L * kThreads;      // [kWarps][L][kN]: per-warp dC, then dB
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int d = blockIdx.y * kThreads + tid;
  const bool active = d < p.channels;
  const int dc = active ? d : p.channels - 1;  // idle lanes compute on a real channel, with dy = 0
  float a2[kN];
  load_a2(p, dc, a2);
  const float bias = mamba::bf(p.dt_bias[dc]), dd = mamba::bf(p.D[dc]);
  float acc[kN];  // dA[n] of this channel over the block's chunks
#pragma unroll
  for (int n = 0; n < kN; ++n) acc[n] = 0.f;
  float dD = 0.f, dbias = 0.f;
  const int c_begin = blockIdx.x * p.chunks_per_block;
  const int c_end = min(c_begin + p.chunks_per_block, p.chunks);
  for (int c = c_begin; c < c_end; ++c) {
    const int64_t t0 = static_cast<int64_t>(c) * L;
    const int len = static_cast<int>(min(static_cast<int64_t>(L), p.tokens - t0));
    __syncthreads();  // the previous chunk's readers of shared memory are done
    load_rows(p.B, p.ldb, t0, len, p.states, sB);
    load_rows(p.C, p.ldc, t0, len, p.states, sC);
    const mamba::ChunkStarts starts = chunk_starts(p, t0);
    __syncthreads();

    // Pass F: states forward from chunk_states[c]; dz, dD, dC; P[t] and the gy h part of dA.
    float h[kN];
    {
      const float* in = p.chunk_states + (static_cast<int64_t>(c) * p.states) * p.channels + dc;
#pragma unroll
      for (int n = 0; n < kN; ++n)
        h[n] = active && n < p.states ? in[static_cast<int64_t>(n) * p.channels] : 0.f;
    }
    float cum = 0.f;  // delta summed from the start of the token's document within the chunk
    for (int i = 0; i < len; ++i) {
      const int64_t t = t0 + i;
      if (starts(i)) {
#pragma unroll
        for (int n = 0; n < kN; ++n) h[n] = 0.f;
        cum = 0.f;
      }
      const float delta = mamba::softplus(mamba::bf(p.dt[t * p.channels + dc]) + bias);
      const float xv = mamba::bf(p.x[t * p.ldx + dc]), du = delta * xv;
      const float zv = mamba::bf(p.z[t * p.ldz + dc]), sg = mamba::sigmoid(zv);
      const float gy = active ? mamba::bf(p.dy[t * p.lddy + d]) : 0.f, gs = gy * zv * sg;
      cum += delta;
      float bv[kN], cv[kN], v[kN];
      row16(sB + i * kN, bv);
      row16(sC + i * kN, cv);
      float ysum = dd * xv, P = 0.f;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        h[n] = ex2(delta * a2[n]) * h[n] + du * bv[n];
        const float ch = cv[n] * h[n];
        ysum += ch;
        const float gyh = gs * ch;  // gy[n] h[n]
        P += a2[n] * gyh;
        acc[n] += gyh * cum;
        v[n] = gs * h[n];
      }
      if (active) p.dz[t * p.lddz + d] = __float2bfloat16(gy * ysum * mamba::dsilu(zv, sg));
      dD += gs * xv;
      sP[i * kThreads + tid] = P;
      const float r = warp_sum16(v, lane);
      if (!(lane & 1)) sRed[(warp * len + i) * kN + (lane >> 1)] = r;
    }
    __syncthreads();
    store_bc_partial(p, sRed, len, t0, kN);  // dC

    // Junction: g flowing in from the later chunks, and its q term carry h[end].
    float g[kN], cterm = 0.f;
    {
      const float* in = p.carry + (static_cast<int64_t>(c) * p.states) * p.channels + dc;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        g[n] = active && n < p.states ? in[static_cast<int64_t>(n) * p.channels] : 0.f;
        const float ch = g[n] * h[n];
        cterm += a2[n] * ch;
        acc[n] += cum * ch;  // sum of delta over the chunk's last document part, times carry h
        h[n] = 0.f;          // from here on: the running sum of g b over the document part
      }
    }
    __syncthreads();  // the dC partials are read out of sRed

    // Pass R: g backward from carry[c]; dx, ddt, dB; ddelta's decay term and the g b part of dA.
    float rsum = 0.f;  // sum over the document part after t of (P - sum_n A2 g b)
    for (int i = len - 1; i >= 0; --i) {
      const int64_t t = t0 + i;
      const float pre = mamba::bf(p.dt[t * p.channels + dc]) + bias, delta = mamba::softplus(pre);
      const float xv = mamba::bf(p.x[t * p.ldx + dc]), du = active ? delta * xv : 0.f;
      const float zv = mamba::bf(p.z[t * p.ldz + dc]);
      const float gy = active ? mamba::bf(p.dy[t * p.lddy + d]) : 0.f, gs = gy * zv * mamba::sigmoid(zv);
      float bv[kN], cv[kN], v[kN];
      row16(sB + i * kN, bv);
      row16(sC + i * kN, cv);
      float gb_sum = 0.f, q = 0.f;  // sum_n g B, sum_n A2 g b
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        g[n] += gs * cv[n];
        const float gB = g[n] * bv[n];
        gb_sum += gB;
        const float gb = gB * du;
        q += a2[n] * gb;
        h[n] += gb;
        acc[n] -= delta * h[n];
        v[n] = g[n] * du;
      }
      rsum += sP[i * kThreads + tid] - q;
      const float ddelta = xv * gb_sum + kLn2 * (rsum + cterm);
      const float gdt = ddelta * mamba::sigmoid(pre);
      if (active) {
        p.dx[t * p.lddx + d] = __float2bfloat16(delta * gb_sum + dd * gs);
        p.ddt[t * p.channels + d] = __float2bfloat16(gdt);
      }
      dbias += gdt;
      const float r = warp_sum16(v, lane);
      if (!(lane & 1)) sRed[(warp * len + i) * kN + (lane >> 1)] = r;
      if (starts(i)) {  // tokens before t belong to another document
        cterm = 0.f;
        rsum = 0.f;
#pragma unroll
        for (int n = 0; n < kN; ++n) g[n] = 0.f, h[n] = 0.f;
      } else {
#pragma unroll
        for (int n = 0; n < kN; ++n) g[n] *= ex2(delta * a2[n]);
      }
    }
    __syncthreads();
    store_bc_partial(p, sRed, len, t0, 0);  // dB
  }
  if (!active) return;
  float* part = p.param_part + static_cast<int64_t>(blockIdx.x) * (kN + 2) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n)  // dA_log = dA A = dA A2 ln 2
    part[static_cast<int64_t>(n) * p.channels] = acc[n] * a2[n] * kLn2;
  part[static_cast<int64_t>(kN) * p.channels] = active ? dD : 0.f;
  part[static_cast<int64_t>(kN + 1) * p.channels] = dbias;
}

// dB, dC (bf16 column blocks) = sums over channel groups of dbc_part, in group order.
static __global__ void scan_bc_reduce_kernel(const float* __restrict__ part, int groups,
                                             int64_t tokens, int states, bf16_t* db, int64_t lddb,
                                             bf16_t* dc, int64_t lddc) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= tokens * 2 * kN) return;
  const int64_t t = i / (2 * kN);
  const int j = static_cast<int>(i % (2 * kN)), n = j % kN;
  if (n >= states) return;
  float s = 0.f;
  for (int g = 0; g < groups; ++g) s += part[g * tokens * 2 * kN + i];
  if (j < kN)
    db[t * lddb + n] = __float2bfloat16(s);
  else
    dc[t * lddc + n] = __float2bfloat16(s);
}

// dA_log[d, n] += sum_b part[b, n, d]; dD[d] += sum_b part[b, kN, d]; ddt_bias likewise.
static __global__ void scan_param_reduce_kernel(const float* __restrict__ part, int blocks,
                                                int channels, int states, float* dA_log, float* dD,
                                                float* ddt_bias) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= static_cast<int64_t>(kN + 2) * channels) return;
  const int k = static_cast<int>(i / channels), d = static_cast<int>(i % channels);
  if (k < kN && k >= states) return;
  float s = 0.f;
  for (int b = 0; b < blocks; ++b) s += part[static_cast<int64_t>(b) * (kN + 2) * channels + i];
  if (k < kN)
    dA_log[static_cast<int64_t>(d) * states + k] += s;
  else if (k == kN)
    dD[d] += s;
  else
    ddt_bias[d] += s;
}


ScanVariant g_variant;  // set_scan_variant

// The variants' kernels step pointers by 32-bit row strides.
bool int_strides(std::initializer_list<int64_t> lds) {
  for (int64_t ld : lds)
    if (ld >= (int64_t{1} << 31)) return false;
  return true;
}

}  // namespace

void set_scan_variant(ScanVariant v) { g_variant = v; }
ScanVariant scan_variant() { return g_variant; }

const char* scan_variant_name(ScanForward v) {
  switch (v) {
    case ScanForward::kChunked: return "chunked";
    case ScanForward::kLean: return "lean";
    case ScanForward::kLeanPoly1: return "lean-poly1";
    case ScanForward::kLeanPoly2: return "lean-poly2";
    case ScanForward::kLeanPoly4: return "lean-poly4";
    case ScanForward::kLeanPoly2S: return "lean-poly2s";
    case ScanForward::kDocs2: return "docs2";
    case ScanForward::kDocs2Poly1: return "docs2-poly1";
    case ScanForward::kDocs4: return "docs4";
  }
  return "?";
}

const char* scan_variant_name(ScanBackward v) {
  switch (v) {
    case ScanBackward::kChunked: return "chunked";
    case ScanBackward::kLean: return "lean";
    case ScanBackward::kLeanPoly1: return "lean-poly1";
    case ScanBackward::kLeanPoly2: return "lean-poly2";
  }
  return "?";
}

void selective_scan_forward(const ops::ScanArgs& a, const ops::ColumnBlock& y,
                            const Tensor& chunk_states) {
  const char* op = "selective_scan_forward";
  const ScanShape s = check_scan(op, a, chunk_states);
  mamba::expect_block(y, s.tokens, s.channels, op, "y");
  if (s.tokens == 0) return;
  const ScanForward variant =
      int_strides({a.x.ld(), a.B.ld(), a.C.ld(), a.z.ld(), y.ld()}) ? g_variant.forward : ScanForward::kChunked;
  const bool docs = one_pass(variant);
  // The one-pass variant walks cu_seqlens itself: no start bits, no chunk sums.
  Owned starts = docs ? Owned() : mamba::doc_start_bits(a.cu_seqlens, s.tokens);
  Owned sums = docs ? Owned() : empty({s.chunks, s.channels}, DType::F32, Device::CUDA);
  ScanParams p = scan_params(s, a, chunk_states, starts, sums);
  p.y = mamba::block_ptr<bf16_t>(y);
  p.ldy = y.ld();
  p.cu = static_cast<const int32_t*>(a.cu_seqlens.data);
  p.segments = static_cast<int>(a.cu_seqlens.numel() - 1);
  switch (variant) {
    case ScanForward::kLean: return forward_lean(p, 0, 0);
    case ScanForward::kLeanPoly1: return forward_lean(p, 1, 1);
    case ScanForward::kLeanPoly2: return forward_lean(p, 2, 2);
    case ScanForward::kLeanPoly4: return forward_lean(p, 4, 4);
    case ScanForward::kLeanPoly2S: return forward_lean(p, 2, 0);
    case ScanForward::kDocs2: return forward_docs(p, 2, 0);
    case ScanForward::kDocs2Poly1: return forward_docs(p, 2, 1);
    case ScanForward::kDocs4: return forward_docs(p, 4, 0);
    case ScanForward::kChunked: break;
  }
  if (s.chunks > 1) {
    scan_chunk_summary_kernel<<<dim3(s.chunks - 1, channel_blocks(s.channels)), kThreads, 0, stream()>>>(p);
    check_launch("scan_chunk_summary_kernel");
    scan_chunk_combine_kernel<<<flat_blocks(int64_t{s.states} * s.channels, 128), 128, 0, stream()>>>(p);
    check_launch("scan_chunk_combine_kernel");
  } else {
    CUDA_CHECK(cudaMemsetAsync(chunk_states.data, 0, chunk_states.nbytes(), stream()));
  }
  scan_output_kernel<<<dim3(s.chunks, channel_blocks(s.channels)), kThreads, 0, stream()>>>(p);
  check_launch("scan_output_kernel");
}

void selective_scan_backward(const ops::ScanArgs& a, const ops::ColumnBlock& dy,
                             const Tensor& chunk_states, const ops::ScanGrads& g) {
  const char* op = "selective_scan_backward";
  const ScanShape s = check_scan(op, a, chunk_states);
  mamba::expect_block(dy, s.tokens, s.channels, op, "dy");
  mamba::expect_block(g.dx, s.tokens, s.channels, op, "dx");
  expect_cuda(g.ddt, DType::BF16, {s.tokens, s.channels}, op, "ddt");
  mamba::expect_block(g.dB, s.tokens, s.states, op, "dB");
  mamba::expect_block(g.dC, s.tokens, s.states, op, "dC");
  mamba::expect_block(g.dz, s.tokens, s.channels, op, "dz");
  expect_cuda(g.dA_log, DType::F32, {s.channels, s.states}, op, "dA_log");
  expect_cuda(g.dD, DType::F32, {s.channels}, op, "dD");
  expect_cuda(g.ddt_bias, DType::F32, {s.channels}, op, "ddt_bias");
  if (s.tokens == 0) return;
  Owned starts = mamba::doc_start_bits(a.cu_seqlens, s.tokens);
  Owned sums = empty({s.chunks, s.channels}, DType::F32, Device::CUDA);
  Owned carry = empty({s.chunks, s.states, s.channels}, DType::F32, Device::CUDA);
  ScanParams p = scan_params(s, a, chunk_states, starts, sums);
  p.dy = mamba::block_ptr<const bf16_t>(dy);
  p.lddy = dy.ld();
  p.carry = carry.ptr<float>();
  p.dx = mamba::block_ptr<bf16_t>(g.dx);
  p.lddx = g.dx.ld();
  p.ddt = static_cast<bf16_t*>(g.ddt.data);
  p.dz = mamba::block_ptr<bf16_t>(g.dz);
  p.lddz = g.dz.ld();
  const ScanBackward variant =
      int_strides({a.x.ld(), a.B.ld(), a.C.ld(), a.z.ld(), dy.ld(), g.dx.ld(), g.dz.ld()})
          ? g_variant.backward
          : ScanBackward::kChunked;
  const bool lean = variant != ScanBackward::kChunked;
  if (s.chunks > 1 && lean) {
    backward_lean_carry(p, variant == ScanBackward::kLeanPoly2 ? 2 : variant == ScanBackward::kLeanPoly1 ? 1 : 0);
  } else if (s.chunks > 1) {
    scan_bwd_chunk_summary_kernel<<<dim3(s.chunks - 1, channel_blocks(s.channels)), kThreads, 0, stream()>>>(p);
    check_launch("scan_bwd_chunk_summary_kernel");
    scan_bwd_chunk_combine_kernel<<<flat_blocks(int64_t{s.states} * s.channels, 128), 128, 0, stream()>>>(p);
    check_launch("scan_bwd_chunk_combine_kernel");
  } else {
    CUDA_CHECK(cudaMemsetAsync(p.carry, 0, carry.t.nbytes(), stream()));
  }
  // Several chunks per block when there are many (fewer parameter partials), keeping about four
  // waves of blocks.
  const int groups = static_cast<int>(channel_blocks(s.channels));
  const int64_t wave = int64_t{sm_count()} * 4;
  p.chunks_per_block = static_cast<int>(std::clamp<int64_t>(int64_t{s.chunks} * groups / (4 * wave), 1, 16));
  const int chunk_blocks = static_cast<int>(ceil_div(s.chunks, p.chunks_per_block));
  Owned bc_part = empty({groups, s.tokens, 2 * kN}, DType::F32, Device::CUDA);
  Owned param_part = empty({chunk_blocks, kN + 2, s.channels}, DType::F32, Device::CUDA);
  p.dbc_part = bc_part.ptr<float>();
  p.param_part = param_part.ptr<float>();
  if (lean) {
    backward_lean_main(p, static_cast<unsigned>(chunk_blocks), static_cast<unsigned>(groups));
  } else {
    const size_t smem = bwd_smem_bytes(p.chunk);
    CUDA_CHECK(cudaFuncSetAttribute(scan_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bwd_smem_bytes(kMaxChunk))));
    scan_bwd_kernel<<<dim3(chunk_blocks, groups), kThreads, smem, stream()>>>(p);
    check_launch("scan_bwd_kernel");
  }
  scan_bc_reduce_kernel<<<flat_blocks(s.tokens * 2 * kN, 256), 256, 0, stream()>>>(
      bc_part.ptr<float>(), groups, s.tokens, s.states, mamba::block_ptr<bf16_t>(g.dB), g.dB.ld(),
      mamba::block_ptr<bf16_t>(g.dC), g.dC.ld());
  check_launch("scan_bc_reduce_kernel");
  scan_param_reduce_kernel<<<flat_blocks(int64_t{kN + 2} * s.channels, 256), 256, 0, stream()>>>(
      param_part.ptr<float>(), chunk_blocks, s.channels, s.states, g.dA_log.ptr<float>(),
      g.dD.ptr<float>(), g.ddt_bias.ptr<float>());
  check_launch("scan_param_reduce_kernel");
}

}  // namespace engine::cuda
