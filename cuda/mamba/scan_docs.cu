// One-pass forward of the selective scan (ScanForward::kDocs*, scan.cuh): each block walks one
// document from its first token to its last with the true state, so every (token, channel,
// state) takes one exp instead of the chunked forward's two (chunk summary, then output), and
// there is no combine step. Its parallelism is documents x channels only: right for a batch of
// several documents (8 x 4096 tokens, Di 4096: 8 x 4096 x kLanes threads), wrong for one long
// document (1 x 32768: Di x kLanes threads, a fraction of the machine, for the whole length).
//
// Layout: kLanes threads per channel (2 or 4), each holding kN / kLanes of its states; a warp
// covers 32 / kLanes channels (lane = group * (32 / kLanes) + channel), a block of 128 threads
// 128 / kLanes channels of one document (grid: documents x channel groups).
// Per group of kLanes tokens, thread group g computes the per-channel quantities of token t0 + g
// (softplus delta, delta x, the gate z silu(z), D x: one softplus and one sigmoid per token and
// channel, not per thread) and the kLanes tokens' values are broadcast by shuffles; each token's
// y sums the channel's partial sums C h over its kLanes threads (log2 kLanes xor-shuffles) and
// thread group g finalises and stores token t0 + g. B and C rows are staged in shared memory, 32
// tokens at a time, the next stage's loads issued before the current stage's arithmetic; the
// next token group's dt, x, z likewise one group ahead.
// chunk_states (the backward's entry points, ops/mamba.h) are written on the way: entry c (the
// state after token c L - 1) by the block of the document that holds that token; entry 0 is
// zeroed by the launcher.
// Trusts cu_seqlens (non-decreasing from 0 to T, as ops/mamba.h requires); a document outside
// [0, T) is clipped to it.
#include <cstdint>
#include <initializer_list>

#include "cuda/mamba/scan_impl.cuh"

namespace engine::cuda::scan_impl {

namespace {

constexpr int kStage = 32;  // tokens of B and C rows per shared-memory stage

// Blocks per multiprocessor the register budget is set for: 8 x 4096 tokens at Di 4096 make
// 8 x 4096 / (128 / kLanes) blocks, 3.9 (kLanes 2) or 7.8 (kLanes 4) per multiprocessor.
template <int kLanes> constexpr int kDocsMinBlocks = kLanes == 4 ? 8 : 6;

template <int kLanes, int kPoly>
static __global__ void __launch_bounds__(kThreads, kDocsMinBlocks<kLanes>) docs_forward_kernel(ScanParams p) {
  constexpr int kS = kN / kLanes;              // states per thread
  constexpr int kCh = 32 / kLanes;             // channels per warp
  constexpr int kBlockCh = kThreads / kLanes;  // channels per block
  constexpr int kRow = 2 * kN;                 // a staged token: B[0, kN) then C[0, kN)
  constexpr int kPre = kStage * kRow / kThreads;
  static_assert(kS % 4 == 0 && kStage % kLanes == 0 && kRow == 32 && kStage == kWarps * kPre);
  __shared__ __align__(16) float sBC[kStage * kRow];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ch = lane % kCh, grp = lane / kCh;
  const int d = blockIdx.y * kBlockCh + warp * kCh + ch;
  const bool active = d < p.channels;
  const int dc = active ? d : p.channels - 1;  // idle lanes compute on a real channel, store nothing
  const int64_t beg = min(max(static_cast<int64_t>(p.cu[blockIdx.x]), int64_t{0}), p.tokens);
  const int64_t end = min(max(static_cast<int64_t>(p.cu[blockIdx.x + 1]), beg), p.tokens);
  if (beg >= end) return;  // the whole block: an empty document

  float a2[kS], h[kS];  // states n = grp * kS + s
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const int n = grp * kS + s;
    a2[s] = n < p.states ? -expf(mamba::bf(p.A_log[static_cast<int64_t>(dc) * p.states + n])) * kLog2e : 0.f;
    h[s] = 0.f;
  }
  const float bias = mamba::bf(p.dt_bias[dc]), dd = mamba::bf(p.D[dc]);

  // Staging: this thread stages column `lane` of the B|C rows (B[n] for lane < kN, else C[n]) of
  // the stage's tokens warp + kWarps r, r < kPre; 0 past the document or N.
  const int n_st = lane % kN;
  const bool st_ok = n_st < p.states;
  const bf16_t* st_col = lane < kN ? p.B + n_st : p.C + n_st;
  const int64_t st_ld = lane < kN ? p.ldb : p.ldc;
  float pre[kPre];
  auto fetch = [&](int64_t s0) {
    const bf16_t* q = st_col + (s0 + warp) * st_ld;
    const int64_t left = end - s0 - warp;
#pragma unroll
    for (int r = 0; r < kPre; ++r, q += kWarps * st_ld)
      pre[r] = st_ok && kWarps * r < left ? mamba::bf(*q) : 0.f;
  };
  fetch(beg);
  // dt, x, z of this thread's token of the next group, loaded one group ahead; the pointers are
  // at the token to load next.
  const int sdt = kLanes * p.channels, sx = kLanes * static_cast<int>(p.ldx),
            sz = kLanes * static_cast<int>(p.ldz), sy = kLanes * static_cast<int>(p.ldy);
  const bf16_t* dtp = p.dt + (beg + grp) * p.channels + dc;
  const bf16_t* xp = p.x + (beg + grp) * p.ldx + dc;
  const bf16_t* zp = p.z + (beg + grp) * p.ldz + dc;
  bf16_t* yp = p.y + (beg + grp) * p.ldy + d;
  float dt_n = 0.f, x_n = 0.f, z_n = 0.f;
  if (grp < end - beg) dt_n = mamba::bf(*dtp), x_n = mamba::bf(*xp), z_n = mamba::bf(*zp);

  const int L = p.chunk;
  int64_t cb = beg / L + 1;               // next chunk_states entry on the way (state after token cb L - 1)
  int to_entry = static_cast<int>(cb * L - beg);  // tokens to process before writing it
  int ts = 0;                             // position of the group in the current stage
  const int count = static_cast<int>(end - beg);
  for (int o = 0; o < count; o += kLanes) {  // the group of tokens beg + o + [0, kLanes)
    const int left = min(count - o, kLanes);
    if (ts == 0) {  // uniform over the block
      __syncthreads();  // the previous stage's readers are done
#pragma unroll
      for (int r = 0; r < kPre; ++r) sBC[tid + r * kThreads] = pre[r];
      __syncthreads();
      if (o + kStage < count) fetch(beg + o + kStage);
    }
    const float dtv = dt_n, xv = x_n, zv = z_n;
    dtp += sdt;
    xp += sx;
    zp += sz;
    if (o + kLanes + grp < count) dt_n = mamba::bf(*dtp), x_n = mamba::bf(*xp), z_n = mamba::bf(*zp);
    // Token beg + o + grp's per-channel values (stale but finite past the document: never used).
    const float delta_g = softplus_fast(dtv + bias), du_g = delta_g * xv;
    const float gate_g = zv * sigmoid_fast(zv), dx_g = dd * xv;
    float y_own = 0.f;  // y of token beg + o + grp
#pragma unroll
    for (int k = 0; k < kLanes; ++k) {
      if (k >= left) break;  // uniform
      const float delta = __shfl_sync(0xffffffffu, delta_g, ch + k * kCh);
      const float du = __shfl_sync(0xffffffffu, du_g, ch + k * kCh);
      const float* row = sBC + (ts + k) * kRow + grp * kS;
      float part = 0.f;
#pragma unroll
      for (int q = 0; q < kS / 4; ++q) {
        const float4 b = quad(row, q), c = quad(row + kN, q);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int s = 4 * q + e;
          h[s] = fmaf(decay_n<kPoly>(s, delta, a2[s], 0.f), h[s], du * at(b, e));
          part = fmaf(at(c, e), h[s], part);
        }
      }
#pragma unroll
      for (int m = kCh; m < 32; m <<= 1) part += __shfl_xor_sync(0xffffffffu, part, m);
      if (grp == k) y_own = (part + dx_g) * gate_g;
      if (--to_entry == 0) {  // uniform: the state after token beg + o + k is chunk_states[cb]
        if (cb * L < p.tokens && active) {
          float* out = p.chunk_states + (cb * p.states + grp * kS) * p.channels + d;
#pragma unroll
          for (int s = 0; s < kS; ++s)
            if (grp * kS + s < p.states) out[static_cast<int64_t>(s) * p.channels] = h[s];
        }
        ++cb;
        to_entry = L;
      }
    }
    if (active && grp < left) *yp = __float2bfloat16(y_own);
    yp += sy;
    ts = ts + kLanes == kStage ? 0 : ts + kLanes;
  }
}

template <int kLanes, int kPoly>
void launch_docs(const ScanParams& p) {
  constexpr int kBlockCh = kThreads / kLanes;
  const int64_t groups = ceil_div(int64_t{p.channels}, int64_t{kBlockCh});
  ENSURE(groups <= 65535, "selective_scan_forward: ", p.channels, " channels exceed the one-pass grid");
  for (int64_t ld : {int64_t{p.channels}, p.ldx, p.ldz, p.ldy})
    ENSURE(kLanes * ld < (int64_t{1} << 31), "selective_scan_forward: row stride ", ld, " too large (one-pass)");
  docs_forward_kernel<kLanes, kPoly><<<dim3(p.segments, static_cast<unsigned>(groups)), kThreads, 0, stream()>>>(p);
  check_launch("docs_forward_kernel");
}

}  // namespace

void forward_docs(const ScanParams& p, int lanes, int poly) {
  // chunk_states[0]: nothing precedes the first chunk.
  CUDA_CHECK(cudaMemsetAsync(p.chunk_states, 0, sizeof(float) * p.states * p.channels, stream()));
  if (p.segments < 1) return;
  if (lanes == 4)
    launch_docs<4, 0>(p);
  else if (poly == 1)
    launch_docs<2, 1>(p);
  else
    launch_docs<2, 0>(p);
}

}  // namespace engine::cuda::scan_impl
