// Vocabulary-parallel cross-entropy on CUDA: the backends of ops::cross_entropy_partial,
// cross_entropy_combine and cross_entropy_grad (contract: csrc/ops/loss.h; CPU reference
// csrc/ref/loss.cpp; kernels: cross_entropy_vocab_parallel.cu). logits (T, Vl) are the columns
// [vocab_begin, vocab_begin + Vl) of a vocabulary of vocab_total:
//   partial  logits bf16 or f32, labels i32 (T), mask u8 (T) -> stats f32 (K, T), K = 3 or 4:
//            (max, sum exp(x - max), x_label if the label is in the shard else 0 [, sum x / V])
//            per masked-in row, zeros for masked rows. A label outside [0, vocab_total) at a
//            masked-in token raises engine::Error naming the position and the label after the
//            kernel ran (a flag read back: the call synchronises the compute stream once).
//   combine  partials f32 (P, K, T), mask u8 (T) -> lse f32 (T), losses f32 (T) with z-loss and
//            label smoothing (K = 4) as ops/loss.h; masked rows 0. Fixed order over the shards:
//            the same bits on every rank.
//   grad     in place on logits bf16 or f32 (T, Vl): grad_scale * ((1 + 2 z lse) softmax -
//            (1 - eps) onehot - eps / V) from the combined lse f32 (T); masked rows become zero
//            rows.
// combine and grad do not synchronise. No scratch beyond the partial's 8-byte flag.
// Plain C++ declarations: includable from g++-built files.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::cuda {

void cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                           int64_t vocab_begin, int64_t vocab_total, const Tensor& stats);
void cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                           const Tensor& losses, float z_loss = 0.f, float label_smoothing = 0.f);
void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale,
                        float z_loss = 0.f, float label_smoothing = 0.f, int64_t vocab_total = 0);

}  // namespace engine::cuda
