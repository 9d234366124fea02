// Mamba-2 mixer ops (state-space duality, SSD), as Hugging Face Mamba2Mixer, over packed varlen
// batches: T tokens, documents from cu_seqlens (S + 1) i32 as in ops/mamba.h (the state is zero
// before every document's first token). The causal conv over [x | B | C] is ops/mamba.h's.
//
// ssd_scan (H heads of P channels, G groups of N states; head h reads group g = h / (H / G)):
//   delta[t, h] = clamp(softplus(dt[t, h] + dt_bias[h]), dt_min, dt_max),   A[h] = -exp(A_log[h])
//   S[t, h]     = exp(delta A[h]) S[t-1, h] + delta x[t, h, :] B[t, g, :]^T      (P x N, 0 before the doc)
//   y[t, h, p]  = sum_n S[t, h][p, n] C[t, g, n] + D[h] x[t, h, p]
// with x[t, h, p] column h P + p of x, B[t, g, n] column g N + n of B (and of C).
// The clamp passes gradient where dt_min <= softplus <= dt_max (torch.clamp's rule); dt_max <= 0
// means no upper limit.
//
// gated_rmsnorm (Mamba2's MambaRMSNormGated, the gate before the norm), over rows of width W that
// may be one tensor-parallel rank's share of a row of total_width columns:
//   v = y silu(z),  out = weight v / sqrt(sumsq / total_width + eps),  sumsq = sum over the row of v^2
// in two ops each way so that the caller can all-reduce the row sums between them:
//   forward:  gated_rmsnorm_sumsq (sumsq of this share), [all-reduce], gated_rmsnorm_forward
//   backward: gated_rmsnorm_dot (dot = sum_i dout_i weight_i v_i of this share), [all-reduce],
//             gated_rmsnorm_backward:  r = (sumsq / total_width + eps)^-1/2,
//             dv = r weight dout - v r^3 dot / total_width,  dy = dv silu(z),  dz = dv y silu'(z),
//             dweight += r dout v
//
// Activations are ColumnBlocks (ops/mamba.h) of the GEMM outputs: x, B, C of the conv's output,
// dt and z of in_proj's. Blocks written by an op only have their own columns touched.
// chunk_states ((scan_num_chunks(T, chunk_len), H, P, N), statistics dtype): entry [c] is the state
// S after the last token of the previous chunk of the packed batch (0 for chunk 0), written by
// forward, so a backward can restart inside the batch; the CPU reference writes them and, like
// the Mamba reference, recomputes from the document starts in backward.
//
// Dtypes: CPU: everything f32, or everything f64 (fp64 gradient checks); sumsq, dot and
// chunk_states in that dtype. CUDA: activations and weights bf16; sumsq, dot, chunk_states and the
// parameter gradients (dA_log, dD, ddt_bias, dweight) f32. The CUDA scan (cuda/mamba/ssd*.cu)
// takes head_dim and N up to 128 and chunk_len a multiple of 32.
// Gradients: activation gradients are written (=); parameter gradients accumulated (+=).
#pragma once
#include <cstdint>

#include "ops/mamba.h"

namespace engine::ops {

// Chunk length of the Mamba-2 layer: chunk_states hold T H P N / 256 floats (N is 64 to 128 in
// the published models, 8 times Mamba's 16).
constexpr int64_t kSsdChunk = 256;

// The CUDA backward's workspaces (cuda/mamba/ssd_backward.cu), here so that the launcher and the
// memory estimate agree: the group's heads are split into slices that run side by side (enough
// blocks for ~264 at once, at most the group's heads); f32 buffers of the gradient of each
// chunk's end state and the sub-chunks' entering states (head dim and states padded to 64 or
// 128), the slices' dB and dC partial sums and the parameter partials.
inline int64_t ssd_backward_slices(int64_t chunks, int64_t groups, int64_t heads_per_group) {
  const int64_t want = (264 + chunks * groups - 1) / (chunks * groups);
  return want < 1 ? 1 : want > heads_per_group ? heads_per_group : want;
}
inline int64_t ssd_padded_dim(int64_t d) { return d <= 64 ? 64 : 128; }
inline int64_t ssd_backward_workspace_bytes(int64_t tokens, int64_t heads, int64_t head_dim, int64_t groups,
                                            int64_t d_state, int64_t chunk_len) {
  const int64_t chunks = scan_num_chunks(tokens, chunk_len), pad = ssd_padded_dim(head_dim) * ssd_padded_dim(d_state);
  const int64_t slices = ssd_backward_slices(chunks, groups, heads / groups);
  return 4 * (chunks * heads * pad + chunks * groups * slices * (chunk_len / 32) * pad +
              2 * slices * tokens * groups * d_state + chunks * heads * 4);
}

struct SsdArgs {
  ColumnBlock x;      // (T, H P) the conv output's x part
  ColumnBlock dt;     // (T, H) before dt_bias, softplus and the clamp
  Tensor A_log;       // (H)
  ColumnBlock B;      // (T, G N)
  ColumnBlock C;      // (T, G N)
  Tensor D;           // (H)
  Tensor dt_bias;     // (H)
  Tensor cu_seqlens;  // (S + 1) i32
  int64_t head_dim = 64;  // P
  int64_t groups = 1;     // G; divides H
  double dt_min = 0.0, dt_max = 0.0;  // the clamp of delta (dt_max <= 0: none above)
  int64_t chunk_len = kSsdChunk;
};

template <typename F>
void visit_tensors(const SsdArgs& a, const char*, F&& f) {
  visit_tensors(a.x, "x", f);
  visit_tensors(a.dt, "dt", f);
  f(a.A_log, "A_log");
  visit_tensors(a.B, "B", f);
  visit_tensors(a.C, "C", f);
  f(a.D, "D");
  f(a.dt_bias, "dt_bias");
  f(a.cu_seqlens, "cu_seqlens");
}

struct SsdGrads {
  ColumnBlock dx;   // (T, H P)  =
  ColumnBlock ddt;  // (T, H)    =  (of dt as SsdArgs takes it)
  ColumnBlock dB;   // (T, G N)  =
  ColumnBlock dC;   // (T, G N)  =
  Tensor dA_log;    // (H)       +=
  Tensor dD;        // (H)       +=
  Tensor ddt_bias;  // (H)       +=
};

template <typename F>
void visit_tensors(const SsdGrads& g, const char*, F&& f) {
  visit_tensors(g.dx, "dx", f);
  visit_tensors(g.ddt, "ddt", f);
  visit_tensors(g.dB, "dB", f);
  visit_tensors(g.dC, "dC", f);
  f(g.dA_log, "dA_log");
  f(g.dD, "dD");
  f(g.ddt_bias, "ddt_bias");
}

}  // namespace engine::ops

// ssd_scan: y, dy (T, H P) blocks; chunk_states as above.
// ssd_scan_step (text generation: the next token of a document, the SsdArgs' blocks one row;
//   cu_seqlens and chunk_len unused): state (H, P, N) is S of the previous token (zeros before
//   the document), updated in place; y as ssd_scan_forward writes it.
// gated_rmsnorm: y, z, dout, out, dy, dz (T, W) blocks; weight (W); sumsq, dot (T); dweight (W) +=.
#define ENGINE_SSD_OPS(OP)                                                                     \
  OP(void, ssd_scan_forward,                                                                   \
     (const ops::SsdArgs& a, const ops::ColumnBlock& y, const Tensor& chunk_states),           \
     (a, y, chunk_states))                                                                     \
  OP(void, ssd_scan_backward,                                                                  \
     (const ops::SsdArgs& a, const ops::ColumnBlock& dy, const Tensor& chunk_states,           \
      const ops::SsdGrads& g),                                                                 \
     (a, dy, chunk_states, g))                                                                 \
  OP(void, ssd_scan_step, (const ops::SsdArgs& a, const Tensor& state, const ops::ColumnBlock& y), \
     (a, state, y))                                                                            \
  OP(void, gated_rmsnorm_sumsq,                                                                \
     (const ops::ColumnBlock& y, const ops::ColumnBlock& z, const Tensor& sumsq),              \
     (y, z, sumsq))                                                                            \
  OP(void, gated_rmsnorm_forward,                                                              \
     (const ops::ColumnBlock& y, const ops::ColumnBlock& z, const Tensor& weight,              \
      const Tensor& sumsq, int64_t total_width, float eps, const ops::ColumnBlock& out),       \
     (y, z, weight, sumsq, total_width, eps, out))                                             \
  OP(void, gated_rmsnorm_dot,                                                                  \
     (const ops::ColumnBlock& dout, const ops::ColumnBlock& y, const ops::ColumnBlock& z,      \
      const Tensor& weight, const Tensor& dot),                                                \
     (dout, y, z, weight, dot))                                                                \
  OP(void, gated_rmsnorm_backward,                                                             \
     (const ops::ColumnBlock& dout, const ops::ColumnBlock& y, const ops::ColumnBlock& z,      \
      const Tensor& weight, const Tensor& sumsq, const Tensor& dot, int64_t total_width,       \
      float eps, const ops::ColumnBlock& dy, const ops::ColumnBlock& dz, const Tensor& dweight), \
     (dout, y, z, weight, sumsq, dot, total_width, eps, dy, dz, dweight))

ENGINE_DECLARE_OPS(ENGINE_SSD_OPS)
