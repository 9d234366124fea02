// Gated DeltaNet mixer ops (the gated delta rule of Yang, Kautz and Hatamizadeh 2024, as Hugging
// Face's Qwen3NextGatedDeltaNet computes it), over packed varlen batches: T tokens, documents
// from cu_seqlens (S + 1) i32 as in ops/mamba.h (the state is zero before every document).
//
// gated_delta (Hk key heads of dk channels, Hv value heads of dv channels, Hv a multiple of Hk;
// value head h reads key head h / (Hv / Hk)):
//   q^ = q / sqrt(|q|^2 + 1e-6) / sqrt(dk),  k^ = k / sqrt(|k|^2 + 1e-6)     (per key head)
//   beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)                 (per value head)
//   S' = exp(g) S[t-1]                                                       (dk x dv, 0 before the doc)
//   S[t] = S' + k^ (beta (v - S'^T k^))^T,   o[t] = S[t]^T q^
// with q[t, i, :] columns i dk .. of q (k likewise), v[t, h, :] columns h dv .. of v.
//
// head_rmsnorm_gated (Qwen3NextRMSNormGated: the norm before the gate, per head of `head_dim`
// columns, one weight for every head):
//   out = weight (y / sqrt(mean_head(y^2) + eps)) silu(z);  rstd (T, heads) saved for backward
//
// Activations are ColumnBlocks (ops/mamba.h) of the GEMM and conv outputs. Blocks written by an op
// only have their own columns touched.
// Dtypes: CPU: everything f32, or everything f64 (fp64 gradient checks). CUDA: activations and
// weights bf16; the state of a step, rstd and the parameter gradients (dA_log, ddt_bias, dweight)
// f32. The chunked rule's kernels (cuda/mamba/delta*.cu) take head dims up to 128; the norm and
// the step are cuda/mamba/delta_norm.cu.
// Gradients: activation gradients are written (=); parameter gradients accumulated (+=).
#pragma once
#include <algorithm>
#include <cstdint>

#include "ops/mamba.h"

namespace engine::ops {

// The CUDA kernels cut each document into chunks of kDeltaChunk tokens; a chunk table holds at
// most delta_max_chunks of them, and the entering states of all but each document's first chunk
// take delta_state_slots slots. gated_delta_workspace_bytes: what one forward (backward: false)
// or backward call allocates for its duration, at `docs` documents.
constexpr int64_t kDeltaChunk = 64;
inline int64_t delta_max_chunks(int64_t tokens, int64_t docs) { return (tokens + kDeltaChunk - 1) / kDeltaChunk + docs; }
inline int64_t delta_state_slots(int64_t tokens) { return std::max<int64_t>(tokens / kDeltaChunk, 1); }
inline int64_t gated_delta_workspace_bytes(int64_t tokens, int64_t docs, int64_t hk, int64_t hv, int64_t dk,
                                           int64_t dv, bool backward) {
  const int64_t chunks = delta_max_chunks(tokens, docs), states = delta_state_slots(tokens) * hv * dk * dv;
  // The chunk table; q^, k^, U, D, W, the entering states (bf16).
  int64_t bytes = 4 * (docs + 1 + 3 * chunks) + 2 * (2 * tokens * hk * dk + 2 * tokens * hv * dv + tokens * hv * dk + states);
  // The states' gradients, dU, dW (bf16); dq^ and dk^ per value head, d gc, parameter partials (f32).
  if (backward)
    bytes += 2 * (states + tokens * hv * dv + tokens * hv * dk) + 4 * (2 * tokens * hv * dk + tokens * hv + 2 * chunks * hv);
  return bytes;
}

struct DeltaArgs {
  ColumnBlock q, k;   // (T, Hk dk)
  ColumnBlock v;      // (T, Hv dv)
  ColumnBlock a, b;   // (T, Hv) the decay and the write-strength inputs
  Tensor A_log;       // (Hv)
  Tensor dt_bias;     // (Hv)
  Tensor cu_seqlens;  // (S + 1) i32
  int64_t key_heads = 1;  // Hk (Hv is A_log's size)
};

template <typename F>
void visit_tensors(const DeltaArgs& x, const char*, F&& f) {
  visit_tensors(x.q, "q", f);
  visit_tensors(x.k, "k", f);
  visit_tensors(x.v, "v", f);
  visit_tensors(x.a, "a", f);
  visit_tensors(x.b, "b", f);
  f(x.A_log, "A_log");
  f(x.dt_bias, "dt_bias");
  f(x.cu_seqlens, "cu_seqlens");
}

struct DeltaGrads {
  ColumnBlock dq, dk, dv, da, db;  // =
  Tensor dA_log, ddt_bias;         // (Hv) +=
};

template <typename F>
void visit_tensors(const DeltaGrads& g, const char*, F&& f) {
  visit_tensors(g.dq, "dq", f);
  visit_tensors(g.dk, "dk", f);
  visit_tensors(g.dv, "dv", f);
  visit_tensors(g.da, "da", f);
  visit_tensors(g.db, "db", f);
  f(g.dA_log, "dA_log");
  f(g.ddt_bias, "ddt_bias");
}

}  // namespace engine::ops

// gated_delta: o, do_ (T, Hv dv) blocks.
// gated_delta_step (text generation: the next token of a document, the DeltaArgs' blocks one
//   row; cu_seqlens unused): state (Hv, dk, dv) is S of the previous token (zeros before the
//   document), updated in place; o as gated_delta_forward writes it.
// head_rmsnorm_gated: y, z, dout, out, dy, dz (T, heads x head_dim) blocks; weight, dweight
// (head_dim); rstd (T, heads): a statistic (layers allocate it with Env::stat_tensor), in the
// activations' dtype on the CPU.
#define ENGINE_DELTA_OPS(OP)                                                                     \
  OP(void, gated_delta_forward, (const ops::DeltaArgs& a, const ops::ColumnBlock& o), (a, o))     \
  OP(void, gated_delta_backward,                                                                 \
     (const ops::DeltaArgs& a, const ops::ColumnBlock& do_, const ops::DeltaGrads& g),           \
     (a, do_, g))                                                                                \
  OP(void, gated_delta_step, (const ops::DeltaArgs& a, const Tensor& state, const ops::ColumnBlock& o), \
     (a, state, o))                                                                              \
  OP(void, head_rmsnorm_gated_forward,                                                           \
     (const ops::ColumnBlock& y, const ops::ColumnBlock& z, const Tensor& weight, float eps,     \
      const ops::ColumnBlock& out, const Tensor& rstd),                                          \
     (y, z, weight, eps, out, rstd))                                                             \
  OP(void, head_rmsnorm_gated_backward,                                                          \
     (const ops::ColumnBlock& dout, const ops::ColumnBlock& y, const ops::ColumnBlock& z,        \
      const Tensor& weight, const Tensor& rstd, const ops::ColumnBlock& dy,                      \
      const ops::ColumnBlock& dz, const Tensor& dweight),                                        \
     (dout, y, z, weight, rstd, dy, dz, dweight))

ENGINE_DECLARE_OPS(ENGINE_DELTA_OPS)
