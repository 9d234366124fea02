// Shared by the Mamba-2 scan kernels (ssd.cu, ssd_backward.cu; .cu only): the parameters, the
// block-level tensor-core product over shared memory, and the per-token preparation of a
// sub-chunk (delta, the cumulative decay, where documents start).
//
// The chunked form. Tokens are cut into chunks of chunk_len (chunk_states' unit, 256 in the
// layer) and each chunk into sub-chunks of kSub = 32 tokens, the unit of the matrix products.
// Within a sub-chunk, with a[t] = delta[t] A and cum[t] = a[t0] + ... + a[t] from its first token,
// the decay from token s to token t >= s of the same document is exp(cum[t] - cum[s]), and a
// token t whose document began before the sub-chunk (seg[t] < 0) sees the entering state S0
// through exp(cum[t]). For one head (rows t, s of the sub-chunk; u[s] = delta[s] x[s]):
//   y[t]  = sum_{seg[t] <= s <= t} (C[t] . B[s]) exp(cum[t] - cum[s]) u[s]     (intra: L x L)
//         + [seg[t] < 0] exp(cum[t]) S0 C[t] + D x[t]                           (from the state)
//   S_end = f S0 + sum_{s >= seg[end]} exp(cum[end] - cum[s]) u[s] B[s]^T,
//   f = [seg[end] < 0] exp(cum[end]) (0 when a document starts in the sub-chunk)
// Each sum is a product of bf16 tiles in shared memory with f32 accumulators (wmma 16x16x16):
// C B^T (L x L over N), the masked decays times delta[s] times x (L x P over L: x is exact in bf16,
// the one rounded operand is that matrix), C S0^T (L x P over N), U_w^T B (P x N over L). Padding: P and N rounded up to the template's PP and NP (64 or 128),
// the padded rows and columns zeros that stay zeros; tokens past the batch have delta 0 and
// zero rows.
#pragma once
#include <cstdint>

#include "cuda/mamba/tiles.cuh"
#include "ops/ssd.h"

namespace engine::cuda::ssd_impl {

using namespace mamba;
using namespace tiles;

constexpr int kSub = 32;        // tokens of a sub-chunk

struct SsdParams {
  const bf16_t *x, *dt, *B, *C;           // column-block starts
  int64_t ldx, lddt, ldb, ldc;           // their row strides
  const bf16_t *alog, *D, *bias;          // (H)
  const uint32_t* starts;                  // document-start bitmask
  int64_t start_count;                     // its words
  int64_t T;
  int H, P, G, N, hpg;                     // heads, head dim, groups, states, heads per group
  int chunk, chunks;                       // chunk_len and the number of chunks
  float dt_min, dt_max;                    // dt_max <= 0: no upper clamp
};

inline SsdParams ssd_params(const ops::SsdArgs& a, const uint32_t* starts) {
  SsdParams p;
  p.x = block_ptr<const bf16_t>(a.x);
  p.dt = block_ptr<const bf16_t>(a.dt);
  p.B = block_ptr<const bf16_t>(a.B);
  p.C = block_ptr<const bf16_t>(a.C);
  p.ldx = a.x.ld();
  p.lddt = a.dt.ld();
  p.ldb = a.B.ld();
  p.ldc = a.C.ld();
  p.alog = static_cast<const bf16_t*>(a.A_log.data);
  p.D = static_cast<const bf16_t*>(a.D.data);
  p.bias = static_cast<const bf16_t*>(a.dt_bias.data);
  p.starts = starts;
  p.T = a.x.rows();
  p.start_count = start_words(p.T);
  p.H = static_cast<int>(a.A_log.size(0));
  p.P = static_cast<int>(a.head_dim);
  p.G = static_cast<int>(a.groups);
  p.N = static_cast<int>(a.B.width / a.groups);
  p.hpg = p.H / p.G;
  p.chunk = static_cast<int>(a.chunk_len);
  p.chunks = static_cast<int>(ops::scan_num_chunks(p.T, a.chunk_len));
  p.dt_min = static_cast<float>(a.dt_min);
  p.dt_max = static_cast<float>(a.dt_max);
  return p;
}

// Per-token values of a sub-chunk, in shared memory.
struct SubTokens {
  float delta[kSub];  // 0 past the batch
  float cum[kSub];    // inclusive sums of delta A from the sub-chunk's first token
  float dsig[kSub];   // d delta / d dt: sigmoid(dt + bias) where the clamp passes it, else 0
  int seg[kSub];      // the last document start at or before the token in the sub-chunk, -1 if none
  float from_s[kSub]; // what the entering state reaches the token with: [seg < 0] exp(cum)
  float to_e[kSub];   // what the token's update reaches the end with: [s >= seg[end]] exp(cum[end] - cum)
  float carry;        // the entering state's factor through the whole sub-chunk (0: a document starts)
};

// Fills `tok` for tokens [t0, t0 + kSub) of head h (warp 0; callers synchronise).
__device__ __forceinline__ void prepare_tokens(const SsdParams& p, int h, int64_t t0, float A, float bias,
                                               SubTokens& tok) {
  if (threadIdx.x >= 32) return;
  const int i = threadIdx.x;
  const int64_t t = t0 + i;
  const bool valid = t < p.T;
  float delta = 0.f, dsig = 0.f;
  if (valid) {
    const float pre = bf(p.dt[t * p.lddt + h]) + bias;
    const float sp = softplus_f(pre);
    delta = sp;
    dsig = 1.f / (1.f + __expf(-pre));
    if (sp < p.dt_min) delta = p.dt_min, dsig = 0.f;
    if (p.dt_max > 0.f && sp > p.dt_max) delta = p.dt_max, dsig = 0.f;
  }
  float cum = delta * A;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float v = __shfl_up_sync(0xffffffffu, cum, o);
    if (i >= o) cum += v;
  }
  const uint32_t starts = __ballot_sync(0xffffffffu, valid && is_start(p.starts, t));
  const uint32_t upto = starts & (0xffffffffu >> (31 - i));
  tok.delta[i] = delta;
  tok.cum[i] = cum;
  tok.dsig[i] = dsig;
  const int seg = upto ? 31 - __clz(upto) : -1;
  const float cum_end = __shfl_sync(0xffffffffu, cum, 31);
  const int seg_end = __shfl_sync(0xffffffffu, seg, 31);
  tok.seg[i] = seg;
  tok.from_s[i] = seg < 0 ? __expf(cum) : 0.f;
  tok.to_e[i] = i >= seg_end ? __expf(cum_end - cum) : 0.f;
  if (i == 31) tok.carry = seg < 0 ? __expf(cum) : 0.f;
}

// The decay from s to t inside the sub-chunk (0 unless seg[t] <= s <= t).
__device__ __forceinline__ float sub_decay(const SubTokens& tok, int t, int s) {
  return s <= t && s >= tok.seg[t] ? __expf(tok.cum[t] - tok.cum[s]) : 0.f;
}

// dst[r][c] (bf16, ld) for r < kSub, c < COLS: the block's element (t0 + r, col0 + c) times
// row_scale[r] (nullptr: 1) where r is a batch token and c < width, else 0.
template <int COLS>
__device__ __forceinline__ void load_rows(bf16_t* dst, int ld, const bf16_t* src, int64_t ld_src, int64_t t0,
                                          int64_t T, int col0, int width, const float* row_scale) {
  load_tile<kSub, COLS>(dst, ld, src, ld_src, t0, T - t0, col0, width, row_scale);
}

// The launchers' checks beyond ops/mamba.cpp's: bf16 activations and weights, f32 states, the
// kernels' limits.
inline void check_ssd_cuda(const char* op, const ops::SsdArgs& a) {
  expect_bf16(a.x.base, op, "x");
  ENSURE(a.head_dim <= 128 && a.B.width / a.groups <= 128, op, ": head_dim ", a.head_dim, " and d_state ",
         a.B.width / a.groups, " must be at most 128 on the GPU");
  ENSURE(a.chunk_len % kSub == 0, op, ": chunk_len ", a.chunk_len, " must be a multiple of ", kSub, " on the GPU");
  ENSURE(a.x.rows() < (int64_t{1} << 31), op, ": ", a.x.rows(), " tokens, at most 2^31 - 1 on the GPU");
}

// f.template operator()<PP, NP>() with the head dim and the state count padded to 64 or 128.
template <typename F> void with_dims(int64_t P, int64_t N, F&& f) {
  if (P <= 64 && N <= 64) return f.template operator()<64, 64>();
  if (P <= 64) return f.template operator()<64, 128>();
  if (N <= 64) return f.template operator()<128, 64>();
  return f.template operator()<128, 128>();
}

// The pass over the chunks (one thread per state element e of a (chunk, H, PN) buffer, `factors`
// (chunks, H)): forward, slot 0 = 0 and slot c + 1 = factor c x slot c + (slot c + 1 as found);
// reverse, slot chunks - 1 = 0 and slot c - 1 = factor c x slot c + (slot c - 1 as found).
static __global__ void ssd_pass_kernel(float* __restrict__ buf, const float* __restrict__ factors, int chunks, int H,
                                       int64_t PN, bool reverse) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= H * PN) return;
  const int h = static_cast<int>(e / PN);
  const int64_t stride = H * PN;
  buf[(reverse ? chunks - 1 : 0) * stride + e] = 0.f;
  float v = 0.f;
  for (int i = 1; i < chunks; ++i) {
    const int slot = reverse ? chunks - 1 - i : i, from = reverse ? chunks - i : i - 1;
    float* at = buf + slot * stride + e;
    v = factors[int64_t{from} * H + h] * v + *at;
    *at = v;
  }
}
inline void ssd_pass(float* buf, const float* factors, int chunks, int H, int64_t PN, bool reverse) {
  ssd_pass_kernel<<<static_cast<unsigned>(ceil_div(H * PN, 256)), 256, 0, stream()>>>(buf, factors, chunks, H, PN,
                                                                                     reverse);
  check_launch("ssd_pass_kernel");
}

}  // namespace engine::cuda::ssd_impl
