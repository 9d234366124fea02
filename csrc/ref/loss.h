// CPU reference of the fused cross-entropy (f32 or f64 logits; losses in the same dtype; labels
// i32; mask u8), same signature as ops/loss.h; and of the vocabulary-parallel steps (partial,
// combine, grad; contract in ops/loss.h), whose stats, lse and losses are in the logits' dtype
// (f32 or f64), computed in double.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::ref {

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale);

void cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                           int64_t vocab_begin, int64_t vocab_total, const Tensor& stats);
void cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                           const Tensor& losses);
void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale);

}  // namespace engine::ref
