// The chunked selective scan of scan.cu (same steps, same layout: a thread per channel with its
// 16 states in registers, chunks of the packed batch in parallel) with fewer instructions per
// (token, state), for the ScanForward::kLean* and ScanBackward::kLean* variants (scan.cuh).
// scan.cu's inner loops issue more instructions than the special-function unit's work takes
// (per token and warp, cuobjdump -sass: output 199 instructions for 20 special-function ops at 8
// issue-slot equivalents each, summary 138; backward summary 187, pass F 406, pass R 487), so
// they are issue bound, not exp bound. Here:
//   - a document start no longer zeroes 16 states with 16 selects: the decay's argument gets -inf
//     (decay(), scan_impl.cuh; per token from a shared-memory row), so h = a h + b restarts by
//     itself;
//   - exp and sigmoid in their one-instruction flush-to-zero forms, softplus branch free with one
//     exp (softplus_fast, sigmoid_fast) instead of __expf, __logf, a divergent series and the
//     correctly rounded reciprocal (a call and a dozen instructions);
//   - pointers advance by a 32-bit stride per token instead of recomputing 64-bit offsets;
//   - the backward's passes run over the chunk's document parts (resets once per part, not as
//     selects per token and state), its per-state arithmetic is regrouped (pass F: v = gs h first,
//     gy h = C v; pass R: the g b terms one FMA each, q = du sum_n A2 g B), and its per-state
//     arrays are lane-permuted so that the dB/dC butterfly needs 6 selects instead of 30;
//   - the combine steps load 24 chunks' inputs at a time (scan.cu's wait on a load per chunk: 511
//     dependent memory round trips at 32768 tokens).
// Per token and warp then: summary 104, output 145 (19 special-function ops), backward summary
// 117, pass F 292, pass R 307. The forward kernels are then at the special-function unit's bound
// (8 x 17 = 136 and 8 x 19 = 152 issue-slot equivalents), so the kPoly template moves the first
// kPoly states' exps to the FMA pipes (poly_math.h: 11 instructions for one ex2, within 1 ulp):
// by the counts, 2 of 16 balance the summaries (125 instructions against 120), none the output
// step (poly 1: 156 against 144); the backward's main kernel stays on ex2 (it issues far more than
// its exps).
// Everything else (shapes, chunk_states, the partial buffers and their reductions) as scan.cu.
#include <cmath>
#include <cstdint>

#include "cuda/mamba/scan_impl.cuh"

namespace engine::cuda::scan_impl {

namespace {

// ---- forward ----

// Step 1 (scan.cu's scan_chunk_summary_kernel): chunk c < chunks - 1 from a zero state; its end
// state into chunk_states[c + 1], its delta sum (-1: a document starts in it) into sums[c].
template <int kPoly>
static __global__ void __launch_bounds__(kThreads, 8) lean_summary_kernel(ScanParams p) {
  __shared__ __align__(16) float sB[kMaxChunk * kN];
  __shared__ float2 sR[kMaxChunk];
  const int c = blockIdx.x;
  const int64_t t0 = static_cast<int64_t>(c) * p.chunk;
  const int len = static_cast<int>(min(static_cast<int64_t>(p.chunk), p.tokens - t0));
  load_rows(p.B, p.ldb, t0, len, p.states, sB);
  const bool reset = __syncthreads_or(load_resets(p, t0, len, sR));  // a document starts in the chunk
  const int d = blockIdx.y * kThreads + threadIdx.x;
  if (d >= p.channels) return;
  float a2[kN], h[kN];
  load_a2(p, d, a2);
#pragma unroll
  for (int n = 0; n < kN; ++n) h[n] = 0.f;
  const float bias = mamba::bf(p.dt_bias[d]);
  float sum = 0.f;
  const int sdt = p.channels, sx = static_cast<int>(p.ldx);
  const bf16_t* dtp = p.dt + t0 * p.channels + d;
  const bf16_t* xp = p.x + t0 * p.ldx + d;
  float dt_next = mamba::bf(*dtp), x_next = mamba::bf(*xp);
  for (int i = 0; i < len; ++i) {
    const float dtv = dt_next, xv = x_next;
    if (i + 1 < len) {
      dtp += sdt;
      xp += sx;
      dt_next = mamba::bf(*dtp);
      x_next = mamba::bf(*xp);
    }
    const float2 r = sR[i];  // (decay argument, running-sum factor)
    const float delta = softplus_fast(dtv + bias), du = delta * xv;
    sum = fmaf(r.y, sum, delta);
    const float rb = r.x;
    const float* row = sB + i * kN;
#pragma unroll
    for (int q = 0; q < kN / 4; ++q) {
      const float4 b = quad(row, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int n = 4 * q + k;
        h[n] = fmaf(decay_n<kPoly>(n, delta, a2[n], rb), h[n], du * at(b, k));
      }
    }
  }
  float* out = p.chunk_states + (static_cast<int64_t>(c + 1) * p.states) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n)
    if (n < p.states) out[static_cast<int64_t>(n) * p.channels] = h[n];
  p.sums[static_cast<int64_t>(c) * p.channels + d] = reset ? -1.f : sum;
}

constexpr int kAhead = 24;  // chunks whose inputs the combine steps load before using any

// Step 2 (scan.cu's scan_chunk_combine_kernel): chunk_states[c] for every chunk, in place over
// the summaries, one thread per (state, channel); the inputs of kAhead chunks are loaded before
// any is used, so the walk waits on one memory round trip per kAhead chunks (scan.cu's: one per
// chunk). 128 registers (4 blocks of 128 per multiprocessor) keep the 65536 threads of Di 4096,
// N 16 in one wave.
static __global__ void __launch_bounds__(128, 4) lean_combine_kernel(ScanParams p) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= static_cast<int64_t>(p.states) * p.channels) return;
  const int n = static_cast<int>(i / p.channels), d = static_cast<int>(i % p.channels);
  const float a2 = -expf(mamba::bf(p.A_log[static_cast<int64_t>(d) * p.states + n])) * kLog2e;
  const int64_t stride = static_cast<int64_t>(p.states) * p.channels;
  float* st = p.chunk_states + i;
  st[0] = 0.f;
  const int steps = p.chunks - 1;  // chunk c < steps: the state after it is chunk_states[c + 1]
  float state = 0.f;
  for (int c0 = 0; c0 < steps; c0 += kAhead) {
    float s[kAhead], m[kAhead];  // delta sum and summary of chunk c0 + j
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int c = c0 + j;
      s[j] = c < steps ? p.sums[static_cast<int64_t>(c) * p.channels + d] : 0.f;
      m[j] = c < steps ? st[(c + 1) * stride] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int c = c0 + j;
      if (c < steps) {
        state = (s[j] < 0.f ? 0.f : ex2(a2 * s[j]) * state) + m[j];
        st[(c + 1) * stride] = state;
      }
    }
  }
}

// Step 3 (scan.cu's scan_output_kernel): each chunk from its entering state; writes y.
template <int kPoly>
static __global__ void __launch_bounds__(kThreads, 7) lean_output_kernel(ScanParams p) {
  __shared__ __align__(16) float sB[kMaxChunk * kN];
  __shared__ __align__(16) float sC[kMaxChunk * kN];
  __shared__ float2 sR[kMaxChunk];
  const int c = blockIdx.x;
  const int64_t t0 = static_cast<int64_t>(c) * p.chunk;
  const int len = static_cast<int>(min(static_cast<int64_t>(p.chunk), p.tokens - t0));
  load_rows(p.B, p.ldb, t0, len, p.states, sB);
  load_rows(p.C, p.ldc, t0, len, p.states, sC);
  load_resets(p, t0, len, sR);
  __syncthreads();
  const int d = blockIdx.y * kThreads + threadIdx.x;
  if (d >= p.channels) return;
  float a2[kN], h[kN];
  load_a2(p, d, a2);
  const float* in = p.chunk_states + (static_cast<int64_t>(c) * p.states) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n) h[n] = n < p.states ? in[static_cast<int64_t>(n) * p.channels] : 0.f;
  const float bias = mamba::bf(p.dt_bias[d]), dd = mamba::bf(p.D[d]);
  const int sdt = p.channels, sx = static_cast<int>(p.ldx), sz = static_cast<int>(p.ldz),
            sy = static_cast<int>(p.ldy);
  const bf16_t* dtp = p.dt + t0 * p.channels + d;
  const bf16_t* xp = p.x + t0 * p.ldx + d;
  const bf16_t* zp = p.z + t0 * p.ldz + d;
  bf16_t* yp = p.y + t0 * p.ldy + d;
  float dt_next = mamba::bf(*dtp), x_next = mamba::bf(*xp), z_next = mamba::bf(*zp);
  for (int i = 0; i < len; ++i) {
    const float dtv = dt_next, xv = x_next, zv = z_next;
    if (i + 1 < len) {
      dtp += sdt;
      xp += sx;
      zp += sz;
      dt_next = mamba::bf(*dtp);
      x_next = mamba::bf(*xp);
      z_next = mamba::bf(*zp);
    }
    const float delta = softplus_fast(dtv + bias), du = delta * xv;
    const float rb = sR[i].x;
    const float* rowb = sB + i * kN;
    const float* rowc = sC + i * kN;
    float acc = dd * xv;
#pragma unroll
    for (int q = 0; q < kN / 4; ++q) {
      const float4 b = quad(rowb, q), cc = quad(rowc, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int n = 4 * q + k;
        h[n] = fmaf(decay_n<kPoly>(n, delta, a2[n], rb), h[n], du * at(b, k));
        acc = fmaf(at(cc, k), h[n], acc);
      }
    }
    *yp = __float2bfloat16(acc * zv * sigmoid_fast(zv));
    yp += sy;
  }
}

// ---- backward ----

// Step 1 (scan.cu's scan_bwd_chunk_summary_kernel): chunk c >= 1 run backward from nothing; the
// a g flowing out of its first token into carry[c], its delta sum into sums[c].
template <int kPoly>
static __global__ void __launch_bounds__(kThreads, 7) lean_bwd_summary_kernel(ScanParams p) {
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
    const float gs = gy * zv * sigmoid_fast(zv);
    sum += delta;
    const float rb = sR[i].x;  // -inf at a document start: nothing flows into the previous one
    const float* row = sC + i * kN;
#pragma unroll
    for (int q = 0; q < kN / 4; ++q) {
      const float4 cc = quad(row, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int n = 4 * q + k;
        g[n] = decay_n<kPoly>(n, delta, a2[n], rb) * fmaf(gs, at(cc, k), g[n]);
      }
    }
  }
  float* out = p.carry + (static_cast<int64_t>(c) * p.states) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n)
    if (n < p.states) out[static_cast<int64_t>(n) * p.channels] = g[n];
  p.sums[static_cast<int64_t>(c) * p.channels + d] = reset ? -1.f : sum;
}

// Step 2 (scan.cu's scan_bwd_chunk_combine_kernel): carry[c] for c = chunks - 1 down to 0, in
// place over the summaries, kAhead chunks' inputs loaded at a time as lean_combine_kernel.
static __global__ void __launch_bounds__(128, 4) lean_bwd_combine_kernel(ScanParams p) {
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

// warp_sum16 (scan_impl.cuh) for per-state arrays whose register slot s holds state
// s ^ state_perm(lane): lanes whose bits 3 and 4 differ hold their states in XOR-permuted slots,
// so the butterfly's first two levels (xor 16, xor 8) pair equal states without the 24 selects
// that pick which half a lane keeps and which it sends. Lanes 2m and 2m + 1 return the sum of
// state m, as warp_sum16.
__device__ __forceinline__ int state_perm(int lane) { return ((lane >> 3) & 3) << 2; }
__device__ __forceinline__ float warp_sum16_perm(const float (&v)[kN], int lane) {
  float a[8], b[4], c[2];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = v[i] + __shfl_xor_sync(0xffffffffu, v[i + 8], 16);
#pragma unroll
  for (int i = 0; i < 4; ++i) b[i] = a[i] + __shfl_xor_sync(0xffffffffu, a[i + 4], 8);
  bool hi = lane & 4;  // b[i] holds state state_perm(lane) + i from here: as warp_sum16
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

// Step 3 (scan.cu's scan_bwd_kernel, whose comments explain the passes and the q rewriting), with
// each pass run over the chunk's document parts (the token ranges between document starts): the
// resets (h, cum in pass F; g, h, cterm, rsum in pass R) happen once per part outside the token
// loop instead of as selects per token and state, and the per-state arrays are lane-permuted for
// warp_sum16_perm (slot s holds state s ^ sp; B and C rows are read a float4 group q ^ pq).
static __global__ void __launch_bounds__(kThreads, 4) lean_bwd_kernel(ScanParams p) {
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
          const float zv = mamba::bf(*zp), sg = sigmoid_fast(zv);
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
          const float gy = active ? mamba::bf(*dyp) : 0.f, gs = gy * zv * sigmoid_fast(zv);
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
          const float gdt = ddelta * sigmoid_fast(pre);
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

}  // namespace

void forward_lean(const ScanParams& p, int poly_summary, int poly_output) {
  const dim3 summary_grid(p.chunks - 1, channel_blocks(p.channels));
  const dim3 grid(p.chunks, channel_blocks(p.channels));
  if (p.chunks > 1) {
    switch (poly_summary) {
      case 0: lean_summary_kernel<0><<<summary_grid, kThreads, 0, stream()>>>(p); break;
      case 1: lean_summary_kernel<1><<<summary_grid, kThreads, 0, stream()>>>(p); break;
      case 2: lean_summary_kernel<2><<<summary_grid, kThreads, 0, stream()>>>(p); break;
      default: lean_summary_kernel<4><<<summary_grid, kThreads, 0, stream()>>>(p); break;
    }
    check_launch("lean_summary_kernel");
    lean_combine_kernel<<<flat_blocks(int64_t{p.states} * p.channels, 128), 128, 0, stream()>>>(p);
    check_launch("lean_combine_kernel");
  } else {
    CUDA_CHECK(cudaMemsetAsync(p.chunk_states, 0, sizeof(float) * p.states * p.channels, stream()));
  }
  switch (poly_output) {
    case 0: lean_output_kernel<0><<<grid, kThreads, 0, stream()>>>(p); break;
    case 1: lean_output_kernel<1><<<grid, kThreads, 0, stream()>>>(p); break;
    case 2: lean_output_kernel<2><<<grid, kThreads, 0, stream()>>>(p); break;
    default: lean_output_kernel<4><<<grid, kThreads, 0, stream()>>>(p); break;
  }
  check_launch("lean_output_kernel");
}

void backward_lean_carry(const ScanParams& p, int poly) {
  const dim3 summary_grid(p.chunks - 1, channel_blocks(p.channels));
  switch (poly) {
    case 0: lean_bwd_summary_kernel<0><<<summary_grid, kThreads, 0, stream()>>>(p); break;
    case 1: lean_bwd_summary_kernel<1><<<summary_grid, kThreads, 0, stream()>>>(p); break;
    default: lean_bwd_summary_kernel<2><<<summary_grid, kThreads, 0, stream()>>>(p); break;
  }
  check_launch("lean_bwd_summary_kernel");
  lean_bwd_combine_kernel<<<flat_blocks(int64_t{p.states} * p.channels, 128), 128, 0, stream()>>>(p);
  check_launch("lean_bwd_combine_kernel");
}

void backward_lean_main(const ScanParams& p, unsigned chunk_blocks, unsigned groups) {
  CUDA_CHECK(cudaFuncSetAttribute(lean_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bwd_smem_bytes(kMaxChunk))));
  lean_bwd_kernel<<<dim3(chunk_blocks, groups), kThreads, bwd_smem_bytes(p.chunk), stream()>>>(p);
  check_launch("lean_bwd_kernel");
}

}  // namespace engine::cuda::scan_impl
