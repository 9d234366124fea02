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
// Dtypes: CPU: everything f32, or everything f64 (fp64 gradient checks). CUDA (the norm and the
// step: cuda/mamba/delta_norm.cu): activations and weights bf16; rstd, dweight and the step's
// state f32. (No CUDA kernels yet for gated_delta_forward and backward: cuda/mamba/delta.cu
// refuses, and the run plan refuses G blocks on the GPU.)
// Gradients: activation gradients are written (=); parameter gradients accumulated (+=).
#pragma once
#include <cstdint>

#include "ops/mamba.h"

namespace engine::ops {

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
