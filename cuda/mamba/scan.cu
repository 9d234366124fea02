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
// Forward (this file), three kernels:
//   1. chunk summary: each (chunk, channel) runs its chunk from a zero state and writes the end
//      state and the chunk's sum of delta (-1 when a document starts in it: nothing flows through);
//   2. combine: each (state, channel) walks the chunks in order, state after chunk c =
//      exp(A sum_c) state after chunk c-1 + summary c; this is chunk_states, saved for backward;
//   3. output: each (chunk, channel) reruns its chunk from its entering state and writes y.
// Steps 1-2 are skipped with one chunk. Every chunk runs in parallel: T / L x Di threads, however
// long the documents. The cost: two passes of exp per (token, channel, state) instead of one.
// Backward (scan_backward.cu): the same two steps in reverse give the gradient flowing into each
// chunk from the later ones, then one kernel per chunk runs a pass forward and a pass backward.
//
// The kernels are bound by instruction issue and the special-function unit (one ex2 per token,
// channel and state and pass), not by memory (docs/PERF.md), so the token loops are kept short:
//   - a document start does not zero 16 states with 16 selects: the decay's argument gets -inf
//     (decay(), scan_impl.cuh; per token from a shared-memory row), so h = a h + b restarts by
//     itself;
//   - exp and sigmoid in their one-instruction flush-to-zero forms, softplus branch free with one
//     exp (softplus_fast, sigmoid_ex2) instead of __expf, __logf, a divergent series and the
//     correctly rounded reciprocal (a call and a dozen instructions);
//   - pointers advance by a 32-bit stride per token instead of recomputing 64-bit offsets;
//   - the combine steps load kAhead chunks' inputs at a time instead of waiting on a load per
//     chunk.
// exp is ex2.approx with A pre-multiplied by log2(e); state and sums f32.
// Memory: x, dt, z, B, C, dy, dx, ddt, dz, dB, dC bf16 (column blocks, any alignment: scalar
// loads); A_log, D, dt_bias bf16; chunk_states f32 (chunks, N, Di); dA_log, dD, ddt_bias f32 +=.
// Limits: N <= 16, chunk_len <= 128, T < 2^31, Di < 2^31 / 16, row strides of the (T, Di) blocks
// below 2^31.
// The shared preconditions ran before (ops/mamba.cpp: shapes, blocks inside their tensors, one
// dtype for the activations and weights); the launchers check what is theirs (check_scan,
// scan_impl.cuh): bf16, chunk_states and the parameter gradients f32, and the limits above.
#include "ops/mamba.h"

#include <cstdint>

#include "cuda/mamba/scan_impl.cuh"

namespace engine::cuda {

namespace {

using namespace scan_impl;

// Step 1: chunk c < chunks - 1 from a zero state; its end state into chunk_states[c + 1] (the
// combine step turns it into the entering state of chunk c + 1), its delta sum (-1: a document
// starts in it) into sums[c].
static __global__ void __launch_bounds__(kThreads, 8) scan_summary_kernel(ScanParams p) {
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
        h[n] = fmaf(decay(delta, a2[n], rb), h[n], du * at(b, k));
      }
    }
  }
  float* out = p.chunk_states + (static_cast<int64_t>(c + 1) * p.states) * p.channels + d;
#pragma unroll
  for (int n = 0; n < kN; ++n)
    if (n < p.states) out[static_cast<int64_t>(n) * p.channels] = h[n];
  p.sums[static_cast<int64_t>(c) * p.channels + d] = reset ? -1.f : sum;
}

// Step 2: chunk_states[c] for every chunk, in place over the summaries, one thread per (state,
// channel); the inputs of kAhead chunks are loaded before any is used, so the walk waits on one
// memory round trip per kAhead chunks. 128 registers (4 blocks of 128 per multiprocessor) keep
// the 65536 threads of Di 4096, N 16 in one wave.
static __global__ void __launch_bounds__(128, 4) scan_combine_kernel(ScanParams p) {
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

// Step 3: each chunk from its entering state; writes y.
static __global__ void __launch_bounds__(kThreads, 7) scan_output_kernel(ScanParams p) {
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
        h[n] = fmaf(decay(delta, a2[n], rb), h[n], du * at(b, k));
        acc = fmaf(at(cc, k), h[n], acc);
      }
    }
    *yp = __float2bfloat16(acc * zv * sigmoid_ex2(zv));
    yp += sy;
  }
}

}  // namespace

void selective_scan_forward(const ops::ScanArgs& a, const ops::ColumnBlock& y,
                            const Tensor& chunk_states) {
  const char* op = "selective_scan_forward";
  const ScanShape s = check_scan(op, a, chunk_states);
  expect_int_stride(a.x, op, "x");
  expect_int_stride(a.z, op, "z");
  expect_int_stride(y, op, "y");
  if (s.tokens == 0) return;
  Owned starts = mamba::doc_start_bits(a.cu_seqlens, s.tokens);
  Owned sums = empty({s.chunks, s.channels}, DType::F32, Device::CUDA);
  ScanParams p = scan_params(s, a, chunk_states, starts, sums);
  p.y = mamba::block_ptr<bf16_t>(y);
  p.ldy = y.ld();
  const unsigned groups = channel_blocks(p.channels);
  if (p.chunks > 1) {
    scan_summary_kernel<<<dim3(p.chunks - 1, groups), kThreads, 0, stream()>>>(p);
    check_launch("scan_summary_kernel");
    scan_combine_kernel<<<flat_blocks(int64_t{p.states} * p.channels, 128), 128, 0, stream()>>>(p);
    check_launch("scan_combine_kernel");
  } else {
    CUDA_CHECK(cudaMemsetAsync(p.chunk_states, 0, sizeof(float) * p.states * p.channels, stream()));
  }
  scan_output_kernel<<<dim3(p.chunks, groups), kThreads, 0, stream()>>>(p);
  check_launch("scan_output_kernel");
}

}  // namespace engine::cuda
