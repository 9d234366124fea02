// Scaled dot-product attention over packed variable-length sequences (varlen), grouped-query.
// Tokens of all sequences are concatenated: sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]).
// q head h uses kv head h / (num_heads / num_kv_heads). For query i and key j of one sequence
// (indices relative to the sequence start), j is visible iff (!causal || j <= i) and
// (window == 0 || i - j < window). No token sees another sequence.
//   out_i = sum_j softmax_j(scale * q_i . k_j) v_j,   lse_i = log sum_j exp(scale * q_i . k_j)
// Backward writes dqkv (=) from dout, recomputing probabilities from the saved lse.
#pragma once
#include "core/tensor.h"

namespace engine::ops {

struct AttentionParams {
  Tensor qkv;         // (T, H + 2*Hkv, D): q heads, then k heads, then v heads
  Tensor out;         // (T, H, D)
  Tensor lse;         // (T, H) f32 (f64 when qkv is f64): log-sum-exp of the scaled scores
  Tensor cu_seqlens;  // (S + 1) i32 on the same device: sequence offsets, cu_seqlens[S] == T
  int max_seqlen = 0;     // longest sequence (kernels size their grids from it)
  int num_heads = 0;      // H
  int num_kv_heads = 0;   // Hkv, divides H
  int head_dim = 0;       // D
  float softmax_scale = 0.f;  // usually 1 / sqrt(D)
  bool causal = true;
  int window = 0;         // sliding window in tokens, 0 = unlimited
};

struct AttentionBackwardParams {
  AttentionParams fwd;  // the forward's tensors (qkv, out, lse) and settings
  Tensor dout;          // (T, H, D)
  Tensor dqkv;          // (T, H + 2*Hkv, D), written
};

void attention_forward(const AttentionParams& p);
void attention_backward(const AttentionBackwardParams& p);

}  // namespace engine::ops
