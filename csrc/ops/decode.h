// One-token decode ops (text generation, train/generate.h): each new token costs one step
// against a cache of what the earlier tokens left, instead of a forward over the whole sequence.
//
// attention_decode (one query against the keys and values cached so far, grouped-query):
//   the query is the q heads of qkv's single row (1, H + 2 Hkv, D) (its k and v heads are not
//   read: the caller appended them to the cache first); cache (L, 2 Hkv, D) holds the keys (heads
//   0 .. Hkv-1) and values (heads Hkv .. 2 Hkv-1) of positions 0 .. L-1, the new token's last.
//   q head h reads kv head h / (H / Hkv). The query's position is L - 1: key j is visible iff
//   window == 0 || L - 1 - j < window (causality holds by construction).
//     out[h] = sum_j softmax_j(scale q_h . k_j) v_j
//   This is ops/attention.h's formula for the last query of a sequence of L tokens.
// causal_conv1d_step (ops/mamba.h's depthwise causal conv for the next token of a document):
//   state (K - 1, Di) holds the conv inputs of the previous K - 1 tokens, oldest first (zeros
//   before the document's first token);
//     pre[d] = bias[d] + sum_{k < K-1} weight[d, k] state[k, d] + weight[d, K-1] x[d]
//     y = silu(pre) when `silu`, else pre
//   then the state shifts by one row and takes x as its newest row.
// selective_scan_step (ops/mamba.h's scan for the next token): state (Di, N) is h of the previous
//   token (zeros before the document), updated in place:
//     delta = softplus(dt + dt_bias), h[d, n] = exp(delta A[d, n]) h[d, n] + delta B[n] x[d]
//     y[d] = (sum_n C[n] h[d, n] + D[d] x[d]) silu(z[d])
//   The ScanArgs' blocks have one row; cu_seqlens and chunk_len are not used (may be unset).
//
// Dtypes: CPU: everything f32 or f64 (the state too). CUDA: activations, weights, the attention
// cache and the conv state bf16 (as training's activations), the scan state f32; the CUDA kernels
// take D <= 256 (attention) and ops/mamba.h's N and K limits.
#pragma once
#include "core/tensor.h"
#include "ops/mamba.h"
#include "ops/op.h"

namespace engine::ops {

struct DecodeAttentionParams {
  Tensor qkv;    // (1, H + 2 Hkv, D): the new token's heads; only the q heads are read
  Tensor cache;  // (L, 2 Hkv, D), L >= 1: keys then values of every position so far
  Tensor out;    // (1, H, D), written
  int num_heads = 0;     // H
  int num_kv_heads = 0;  // Hkv, divides H
  int head_dim = 0;      // D
  float softmax_scale = 0.f;
  int window = 0;        // sliding window in tokens, 0 = unlimited
};

template <typename F>
void visit_tensors(const DecodeAttentionParams& p, const char*, F&& f) {
  f(p.qkv, "qkv");
  f(p.cache, "cache");
  f(p.out, "out");
}

}  // namespace engine::ops

#define ENGINE_DECODE_OPS(OP)                                                                     \
  OP(void, attention_decode, (const ops::DecodeAttentionParams& p), (p))                         \
  OP(void, causal_conv1d_step,                                                                    \
     (const ops::ColumnBlock& x, const Tensor& state, const Tensor& weight, const Tensor& bias,  \
      bool silu, const ops::ColumnBlock& y),                                                      \
     (x, state, weight, bias, silu, y))                                                           \
  OP(void, selective_scan_step, (const ops::ScanArgs& a, const Tensor& state, const ops::ColumnBlock& y), \
     (a, state, y))

ENGINE_DECLARE_OPS(ENGINE_DECODE_OPS)
