// Vocabulary-parallel distillation on CUDA: the backends of ops::distillation_partial,
// distillation_combine and distillation_grad (contract and formulas: csrc/ops/loss.h; CPU
// reference csrc/ref/loss.cpp; kernels: distillation_vocab_parallel.cu). logits and teacher
// (T, Vl) bf16 or f32 are the same columns [vocab_begin, vocab_begin + Vl) of a vocabulary of
// vocab_total:
//   partial  logits, teacher, labels i32 (T) (read only with a label term; may then be
//            undefined otherwise), mask u8 (T) -> stats f32 (7, T): the shard's maxima, sums of
//            exponentials and the kind's weighted sum (ops/loss.h), zeros for masked rows. With
//            a label term, a label outside [0, vocab_total) at a masked-in token raises
//            engine::Error after the kernel ran (a flag read back: the call then synchronises
//            the compute stream once).
//   combine  partials f32 (P, 7, T), mask u8 (T) -> row_stats f32 (6, T), losses f32 (T),
//            distill_losses f32 (T) or undefined; masked rows 0. Fixed order over the shards:
//            the same bits on every rank.
//   grad     in place on the shard's logits from its teacher columns and row_stats f32 (6, T);
//            masked rows become zero rows.
// combine and grad do not synchronise. No scratch beyond the partial's 8-byte flag.
// Plain C++ declarations: includable from g++-built files.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/loss.h"

namespace engine::cuda {

void distillation_partial(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                          const Tensor& mask, int64_t vocab_begin, int64_t vocab_total,
                          const ops::DistillParams& p, const Tensor& stats);
void distillation_combine(const Tensor& partials, const Tensor& mask, const ops::DistillParams& p,
                          const Tensor& row_stats, const Tensor& losses,
                          const Tensor& distill_losses);
void distillation_grad(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, int64_t vocab_begin, const ops::DistillParams& p,
                       const Tensor& row_stats, float grad_scale);

}  // namespace engine::cuda
