// cuDNN's fused attention, which cuda::attention_forward / attention_backward
// (cuda/attention/attention.cu) run when AttentionParams::backend is Cudnn
// (model.attention_backend = "cudnn"), after the shared checks of ops/attention.cpp and the
// window clamp; contract in csrc/ops/attention.h, CPU oracle csrc/ref/attention.cpp. Plain C++
// declarations, so g++-built files include this header.
//
// Built on cuDNN's graph (backend) API, no frontend library: the attention is spelled as the
// operation graph that cuDNN's fused flash-attention engines recognise (matmul, scale, padding /
// causal / sliding-window masks from gen_index + compare + binary_select, softmax from reductions
// and pointwise ops, matmul; the backward likewise), over the packed rows through ragged offsets
// and per-sequence lengths (the padding mask). Separate keys (micro-sequences) use the
// bottom-right aligned diagonal, which is the contract's "queries are the last positions".
//   bf16 only, head_dim a multiple of 8 up to 256, any GQA grouping, causal or not, any window.
//   lse: cuDNN's softmax statistics are the natural-log log-sum-exp of the scaled scores, written
//   (B, H, S) dense in a scratch buffer and copied into lse (T, H) (and back before the backward).
// Execution plans are built once per shape key and cached: the number of sequences is bucketed
// to a power of two (unused ones get length 0) and the longest sequence to a power of two >= 64,
// so a varlen run builds a handful of plans, not one per step. The workspaces (cuDNN's, the
// (B, H, S) statistics, the backward's f32 dQ accumulator) come from the caching allocator.
// Builds without cuDNN (no ENGINE_CUDNN) keep these entry points; they raise an error naming
// model.attention_backend.
#pragma once
#include <string>

#include "ops/attention.h"

namespace engine::cuda {

void cudnn_attention_forward(const ops::AttentionParams& p);
void cudnn_attention_backward(const ops::AttentionBackwardParams& p);

// Whether this binary was built with cuDNN (ENGINE_CUDNN).
bool cudnn_built();
// The loaded library's version ("9.19.0"); "" without cuDNN.
std::string cudnn_version();
// Execution plans built so far in this process (forward and backward): tests check the cache.
int cudnn_attention_plans_built();

}  // namespace engine::cuda
