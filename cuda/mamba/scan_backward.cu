// Backward of the selective scan (scan.cu: the recurrence, the layout and the forward's steps),
// with g[t] = dL/dh[t] = gy[t] + a[t+1] g[t+1], gy = dy silu(z) C:
//   1-2. the forward's two steps in reverse give carry[c] = a g flowing into chunk c's last token
//        from the chunks after it;
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
// Instructions per (token, state), beside those of the forward's kernels (scan.cu): the passes
// run over the chunk's document parts (resets once per part, not as selects per token and
// state), the per-state arithmetic is regrouped (pass F: v = gs h first, gy h = C v; pass R: the
// g b terms one FMA each, q = du sum_n A2 g B), and the per-state arrays are lane-permuted so that
// the dB/dC butterfly needs 6 selects instead of 30.
#include "ops/mamba.h"

#include <algorithm>
#include <cstdint>

#include "cuda/mamba/scan_impl.cuh"

namespace engine::cuda {

namespace {

using namespace scan_impl;

// Shared memory of the main backward kernel for chunks of `len` tokens: 56 KB for 64 tokens, so
// 4 blocks (16 warps) fit a multiprocessor's 228 KB with their 1 KB reserves.
inline size_t bwd_smem_bytes(int len) {
  return sizeof(float) * (2 * len * kN + len * kThreads + kWarps * len * kN);
}

// Sums the block's per-warp partials red[w][i][n] and stores them for tokens t0 + i at
// column offset `half` (0: dB, kN: dC) of this channel group's rows of dbc_part.
__device__ __forceinline__ void store_bc_partial(const ScanParams& p, const float* red, int len,
                                                 int64_t t0, int half) {
  float* out = p.dbc_part + (static_cast<int64_t>(blockIdx.y) * p.tokens + t0) * (2 * kN) + half;
  for (int j = threadIdx.x; j < len * kN; j += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w * len * kN + j];
    out[(j / kN) * (2 * kN) + j % kN] = s;
  }
}

// Step 1: chunk c >= 1 run backward from nothing; the a g that flows out of its first token into
// chunk c - 1 goes to carry[c] (the combine step turns it into chunk c's carry), its delta sum
// (-1: a document starts in it) to sums[c].
static __global__ void __launch_bounds__(kThreads, 7) scan_bwd_summary_kernel(ScanParams p) {
  __shared__ __align__(16) float sC[kMaxChunk * kN];
  __shared__ float2 sR[kMaxChunk];
  const int c = blockIdx.x + 1;
  const int64_t t0 = static_cast<int64_t>(c) * p.chunk;
  const int len = static_cast<int>(min(static_cast<int64_t>(p.chunk), p.tokens - t0));
  load_rows(p.C, p.ldc, t0, len, p.states, sC);
  const bool reset = __syncthreads_or(load_resets(p, t0, len, sR));  // a document starts in the chunk
  const int d = blockIdx.y * kThreads + threadIdx.x;
  if (d >= p.channels) return;
  float a2[kN], g[kN];
  load_a2(p, d, a2);
#pragma unroll
  for (int n = 0; n < kN; ++n) g[n] = 0.f;
  const float bias = mamba::bf(p.dt_bias[d]);
  float sum = 0.f;
  const int64_t t = t0 + len - 1;
  const int sdt = p.channels, sz = static_cast<int>(p.ldz), sdy = static_cast<int>(p.lddy);
  const bf16_t* dtp = p.dt + t * p.channels + d;
  const bf16_t* zp = p.z + t * p.ldz + d;
  const bf16_t* dyp = p.dy + t * p.lddy + d;
  float dt_next = mamba::bf(*dtp), z_next = mamba::bf(*zp), dy_next = mamba::bf(*dyp);
  for (int i = len - 1; i >= 0; --i) {
    const float dtv = dt_next, zv = z_next, gy = dy_next;
    if (i > 0) {
      dtp -= sdt;
      zp -= sz;
      dyp -= sdy;
      dt_next = mamba::bf(*dtp);
      z_next = mamba::bf(*zp);
      dy_next = mamba::bf(*dyp);
    }
    const float delta = softplus_fast(dtv + bias);
    const float gs = gy * zv * sigmoid_ex2(zv);
    sum += delta;
    const float rb = sR[i].x;  // -inf at a document start: nothing flows into the previous one
    const float* row = sC + i * kN;
#pragma unroll
    for (int q = 0; q < kN / 4; ++q) {
      const float4 cc = quad(row, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int n = 4 * q + k;
        g[n] = decay(delta, a2[n], rb) * fmaf(gs, at(cc, k), g[n]);
      }
    }
  }
  float* out = p.carry + (static_cast<int64_t>(c) * p.states) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n)
    if (n < p.states) out[static_cast<int64_t>(n) * p.channels] = g[n];
  p.sums[static_cast<int64_t>(c) * p.channels + d] = reset ? -1.f : sum;
}

// Step 2: carry[c] for c = chunks - 1 down to 0, in place over the summaries, kAhead chunks'
// inputs loaded at a time as the forward's combine step (scan.cu).
static __global__ void __launch_bounds__(128, 4) scan_bwd_combine_kernel(ScanParams p) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= static_cast<int64_t>(p.states) * p.channels) return;
  const int n = static_cast<int>(i / p.channels), d = static_cast<int>(i % p.channels);
  const float a2 = -expf(mamba::bf(p.A_log[static_cast<int64_t>(d) * p.states + n])) * kLog2e;
  const int64_t stride = static_cast<int64_t>(p.states) * p.channels;
  float* cr = p.carry + i;
  float carry = 0.f;
  for (int c0 = p.chunks - 1; c0 >= 1; c0 -= kAhead) {
    float s[kAhead], m[kAhead];  // delta sum and summary of chunk c0 - j
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int c = c0 - j;
      s[j] = c >= 1 ? p.sums[static_cast<int64_t>(c) * p.channels + d] : 0.f;
      m[j] = c >= 1 ? cr[c * stride] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int c = c0 - j;
      if (c >= 1) {
        cr[c * stride] = carry;
        carry = m[j] + (s[j] < 0.f ? 0.f : ex2(a2 * s[j]) * carry);
      }
    }
  }
  cr[0] = carry;
}

// ---- the main backward kernel ----

// Sum over the warp's 32 lanes of each of a lane's 16 per-state values, whose register slot s
// holds state s ^ state_perm(lane); lanes 2m and 2m + 1 return the sum of state m. Each step
// halves the values a lane keeps and doubles the lanes they sum (8 + 4 + 2 + 1 + 1 shuffles
// instead of 16 x 5). Lanes whose bits 3 and 4 differ hold their states in XOR-permuted slots, so
// the first two levels (xor 16, xor 8) pair equal states without the 24 selects that pick which
// half a lane keeps and which it sends; the xor 4 and xor 2 levels select as usual.
__device__ __forceinline__ int state_perm(int lane) { return ((lane >> 3) & 3) << 2; }
__device__ __forceinline__ float warp_sum16_perm(const float (&v)[kN], int lane) {
  float a[8], b[4], c[2];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = v[i] + __shfl_xor_sync(0xffffffffu, v[i + 8], 16);
#pragma unroll
  for (int i = 0; i < 4; ++i) b[i] = a[i] + __shfl_xor_sync(0xffffffffu, a[i + 4], 8);
  bool hi = lane & 4;  // b[i] holds state state_perm(lane) + i from here
#pragma unroll
  for (int i = 0; i < 2; ++i)
    c[i] = (hi ? b[i + 2] : b[i]) + __shfl_xor_sync(0xffffffffu, hi ? b[i] : b[i + 2], 4);
  hi = lane & 2;
  const float r = (hi ? c[1] : c[0]) + __shfl_xor_sync(0xffffffffu, hi ? c[0] : c[1], 2);
  return r + __shfl_xor_sync(0xffffffffu, r, 1);
}

// The first document start after token i of a chunk (its bit in ChunkStarts), or 128.
__device__ __forceinline__ int next_start_after(const mamba::ChunkStarts& st, int i) {
  const int j = i + 1;  // 1 .. 128
  if (j < 64) {
    const uint64_t m = st.lo >> j;
    if (m) return j + __ffsll(static_cast<long long>(m)) - 1;
  }
  const int k = max(j - 64, 0);
  if (k < 64) {
    const uint64_t m = st.hi >> k;
    if (m) return 64 + k + __ffsll(static_cast<long long>(m)) - 1;
  }
  return 128;
}
// The last document start at or before token i of a chunk, or -1.
__device__ __forceinline__ int last_start_at_or_before(const mamba::ChunkStarts& st, int i) {
  if (i >= 64) {
    const uint64_t m = st.hi << (127 - i);  // bit i - 64 to the top
    if (m) return i - __clzll(static_cast<long long>(m));
  }
  const int j = min(i, 63);
  const uint64_t m = st.lo << (63 - j);
  return m ? j - __clzll(static_cast<long long>(m)) : -1;
}

// Step 3 (the passes and the q rewriting: the file comment), with each pass run over the chunk's
// document parts (the token ranges between document starts): the resets (h, cum in pass F; g, h,
// cterm, rsum in pass R) happen once per part outside the token loop instead of as selects per
// token and state, and the per-state arrays are lane-permuted for warp_sum16_perm (slot s holds
// state s ^ sp; B and C rows are read a float4 group q ^ pq).
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
  const int sp = state_perm(lane), pq = sp >> 2;  // slot s: state s ^ sp; slot group q: float4 q ^ pq
  float a2[kN];
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    const int n = s ^ sp;
    a2[s] = n < p.states ? -expf(mamba::bf(p.A_log[static_cast<int64_t>(dc) * p.states + n])) * kLog2e : 0.f;
  }
  const float bias = mamba::bf(p.dt_bias[dc]), dd = mamba::bf(p.D[dc]);
  float acc[kN];  // dA of this channel's states (slot order) over the block's chunks
#pragma unroll
  for (int s = 0; s < kN; ++s) acc[s] = 0.f;
  float dD = 0.f, dbias = 0.f;
  const int sdt = p.channels, sx = static_cast<int>(p.ldx), sz = static_cast<int>(p.ldz),
            sdy = active ? static_cast<int>(p.lddy) : 0, sdx = static_cast<int>(p.lddx),
            sdz = static_cast<int>(p.lddz);
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
      for (int s = 0; s < kN; ++s)
        h[s] = active && (s ^ sp) < p.states ? in[static_cast<int64_t>(s ^ sp) * p.channels] : 0.f;
    }
    float cum = 0.f;  // delta summed from the start of the token's document within the chunk
    {
      const bf16_t* dtp = p.dt + t0 * p.channels + dc;
      const bf16_t* xp = p.x + t0 * p.ldx + dc;
      const bf16_t* zp = p.z + t0 * p.ldz + dc;
      const bf16_t* dyp = p.dy + (active ? t0 * p.lddy + d : 0);  // idle lanes read dy[0]
      bf16_t* dzp = p.dz + t0 * p.lddz + d;
      for (int i = 0; i < len;) {
        if (starts(i)) {  // a document's first token: once per part, uniform over the block
          cum = 0.f;
#pragma unroll
          for (int s = 0; s < kN; ++s) h[s] = 0.f;
        }
        const int part_end = min(next_start_after(starts, i), len);
        for (; i < part_end; ++i) {
          const float delta = softplus_fast(mamba::bf(*dtp) + bias);
          const float xv = mamba::bf(*xp), du = delta * xv;
          const float zv = mamba::bf(*zp), sg = sigmoid_ex2(zv);
          const float gy = active ? mamba::bf(*dyp) : 0.f, gs = gy * zv * sg;
          cum += delta;
          const float* rowb = sB + i * kN;
          const float* rowc = sC + i * kN;
          float v[kN];
          float ysum = dd * xv, P = 0.f;
#pragma unroll
          for (int q = 0; q < kN / 4; ++q) {
            const float4 b = quad(rowb, q ^ pq), cc = quad(rowc, q ^ pq);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int s = 4 * q + k;
              h[s] = fmaf(ex2(delta * a2[s]), h[s], du * at(b, k));
              ysum = fmaf(at(cc, k), h[s], ysum);
              v[s] = gs * h[s];
              const float gyh = at(cc, k) * v[s];  // gy[n] h[n]
              P = fmaf(a2[s], gyh, P);
              acc[s] = fmaf(gyh, cum, acc[s]);
            }
          }
          if (active) *dzp = __float2bfloat16(gy * ysum * mamba::dsilu(zv, sg));
          dD += gs * xv;
          sP[i * kThreads + tid] = P;
          const float r = warp_sum16_perm(v, lane);
          if (!(lane & 1)) sRed[(warp * len + i) * kN + (lane >> 1)] = r;
          dtp += sdt;
          xp += sx;
          zp += sz;
          dyp += sdy;
          dzp += sdz;
        }
      }
    }
    __syncthreads();
    store_bc_partial(p, sRed, len, t0, kN);  // dC

    // Junction: g flowing in from the later chunks, and its q term carry h[end].
    float g[kN], cterm = 0.f;
    {
      const float* in = p.carry + (static_cast<int64_t>(c) * p.states) * p.channels + dc;
#pragma unroll
      for (int s = 0; s < kN; ++s) {
        g[s] = active && (s ^ sp) < p.states ? in[static_cast<int64_t>(s ^ sp) * p.channels] : 0.f;
        const float ch = g[s] * h[s];
        cterm = fmaf(a2[s], ch, cterm);
        acc[s] = fmaf(cum, ch, acc[s]);  // delta summed over the chunk's last document part, times carry h
        h[s] = 0.f;                      // from here on: the running sum of g b over the document part
      }
    }
    __syncthreads();  // the dC partials are read out of sRed

    // Pass R: g backward from carry[c]; dx, ddt, dB; ddelta's decay term and the g b part of dA.
    {
      float rsum = 0.f;  // sum over the document part after t of (P - sum_n A2 g b)
      const int64_t tl = t0 + len - 1;
      const bf16_t* dtp = p.dt + tl * p.channels + dc;
      const bf16_t* xp = p.x + tl * p.ldx + dc;
      const bf16_t* zp = p.z + tl * p.ldz + dc;
      const bf16_t* dyp = p.dy + (active ? tl * p.lddy + d : 0);
      bf16_t* dxp = p.dx + tl * p.lddx + d;
      bf16_t* ddtp = p.ddt + tl * p.channels + d;
      for (int i = len - 1; i >= 0;) {
        const int part_start = last_start_at_or_before(starts, i);  // -1: the part runs on into chunk c - 1
        for (const int lo = max(part_start, 0); i >= lo; --i) {
          const float pre = mamba::bf(*dtp) + bias, delta = softplus_fast(pre);
          const float xv = mamba::bf(*xp), du = active ? delta * xv : 0.f;
          const float zv = mamba::bf(*zp);
          const float gy = active ? mamba::bf(*dyp) : 0.f, gs = gy * zv * sigmoid_ex2(zv);
          const float* rowb = sB + i * kN;
          const float* rowc = sC + i * kN;
          float v[kN];
          float gb_sum = 0.f, qb = 0.f;  // sum_n g B, sum_n A2 g B
#pragma unroll
          for (int q = 0; q < kN / 4; ++q) {
            const float4 b = quad(rowb, q ^ pq), cc = quad(rowc, q ^ pq);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int s = 4 * q + k;
              g[s] = fmaf(gs, at(cc, k), g[s]);
              const float gB = g[s] * at(b, k);
              gb_sum += gB;
              qb = fmaf(a2[s], gB, qb);
              h[s] = fmaf(gB, du, h[s]);  // running sum of g b, b = delta B x
              acc[s] = fmaf(-delta, h[s], acc[s]);
              v[s] = g[s] * du;
            }
          }
          rsum += sP[i * kThreads + tid] - qb * du;
          const float ddelta = xv * gb_sum + kLn2 * (rsum + cterm);
          const float gdt = ddelta * sigmoid_ex2(pre);
          if (active) {
            *dxp = __float2bfloat16(delta * gb_sum + dd * gs);
            *ddtp = __float2bfloat16(gdt);
          }
          dbias += gdt;
          const float r = warp_sum16_perm(v, lane);
          if (!(lane & 1)) sRed[(warp * len + i) * kN + (lane >> 1)] = r;
#pragma unroll
          for (int s = 0; s < kN; ++s) g[s] *= ex2(delta * a2[s]);
          dtp -= sdt;
          xp -= sx;
          zp -= sz;
          dyp -= sdy;
          dxp -= sdx;
          ddtp -= sdt;
        }
        if (part_start >= 0) {  // tokens before it belong to another document: once per part
          cterm = 0.f;
          rsum = 0.f;
#pragma unroll
          for (int s = 0; s < kN; ++s) g[s] = 0.f, h[s] = 0.f;
        }
      }
    }
    __syncthreads();
    store_bc_partial(p, sRed, len, t0, 0);  // dB
  }
  if (!active) return;
  float* part = p.param_part + static_cast<int64_t>(blockIdx.x) * (kN + 2) * p.channels + d;
#pragma unroll
  for (int s = 0; s < kN; ++s)  // dA_log = dA A = dA A2 ln 2
    if ((s ^ sp) < p.states) part[static_cast<int64_t>(s ^ sp) * p.channels] = acc[s] * a2[s] * kLn2;
  part[static_cast<int64_t>(kN) * p.channels] = dD;
  part[static_cast<int64_t>(kN + 1) * p.channels] = dbias;
}

// ---- reductions ----

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


}  // namespace

void selective_scan_backward(const ops::ScanArgs& a, const ops::ColumnBlock& dy,
                             const Tensor& chunk_states, const ops::ScanGrads& g) {
  const char* op = "selective_scan_backward";
  const ScanShape s = check_scan(op, a, chunk_states);
  ops::expect_dtype(g.dA_log, DType::F32, op, "dA_log");
  ops::expect_dtype(g.dD, DType::F32, op, "dD");
  ops::expect_dtype(g.ddt_bias, DType::F32, op, "ddt_bias");
  expect_int_stride(a.x, op, "x");
  expect_int_stride(a.z, op, "z");
  expect_int_stride(dy, op, "dy");
  expect_int_stride(g.dx, op, "dx");
  expect_int_stride(g.dz, op, "dz");
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
  if (s.chunks > 1) {
    scan_bwd_summary_kernel<<<dim3(p.chunks - 1, channel_blocks(p.channels)), kThreads, 0, stream()>>>(p);
    check_launch("scan_bwd_summary_kernel");
    scan_bwd_combine_kernel<<<flat_blocks(int64_t{p.states} * p.channels, 128), 128, 0, stream()>>>(p);
    check_launch("scan_bwd_combine_kernel");
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
  CUDA_CHECK(cudaFuncSetAttribute(scan_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bwd_smem_bytes(kMaxChunk))));
  scan_bwd_kernel<<<dim3(static_cast<unsigned>(chunk_blocks), static_cast<unsigned>(groups)), kThreads,
                    bwd_smem_bytes(p.chunk), stream()>>>(p);
  check_launch("scan_bwd_kernel");
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
