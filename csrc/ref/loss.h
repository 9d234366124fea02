// CPU reference of the losses of ops/loss.h (contract there), same signatures: the fused
// cross-entropy (with z-loss and label smoothing) and the fused distillation losses (f32 or f64
// logits; losses in the same dtype; labels i32; mask u8), and the vocabulary-parallel steps of
// both (partial, combine, grad), whose stats, lse, row statistics and losses are in the logits'
// dtype (f32 or f64). Everything is computed in double.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/loss.h"

namespace engine::ref {

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale, float z_loss = 0.f,
                   float label_smoothing = 0.f, int64_t columns = 0);

void cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                           int64_t vocab_begin, int64_t vocab_total, const Tensor& stats);
void cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                           const Tensor& losses, float z_loss = 0.f, float label_smoothing = 0.f);
void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale,
                        float z_loss = 0.f, float label_smoothing = 0.f, int64_t vocab_total = 0);

void distillation_loss(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, const ops::DistillParams& p, const Tensor& losses,
                       const Tensor& distill_losses, bool with_grad, float grad_scale);

void distillation_partial(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                          const Tensor& mask, int64_t vocab_begin, int64_t vocab_total,
                          const ops::DistillParams& p, const Tensor& stats);
void distillation_combine(const Tensor& partials, const Tensor& mask, const ops::DistillParams& p,
                          const Tensor& row_stats, const Tensor& losses,
                          const Tensor& distill_losses);
void distillation_grad(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, int64_t vocab_begin, const ops::DistillParams& p,
                       const Tensor& row_stats, float grad_scale);

}  // namespace engine::ref
