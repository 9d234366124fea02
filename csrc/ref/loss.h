// CPU reference of the fused cross-entropy (f32 or f64 logits; losses in the same dtype; labels
// i32; mask u8), same signature as ops/loss.h.
#pragma once
#include "core/tensor.h"

namespace engine::ref {

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale);

}  // namespace engine::ref
