// Cross-entropy of next-token prediction over logits (T, V), fused with its gradient.
// For every row t with mask(t) != 0:
//   losses(t) = lse(logits_t) - logits_t[labels(t)]
//   with_grad: logits_t <- grad_scale * (softmax(logits_t) - onehot(labels(t)))  (in place)
// Masked rows get losses(t) = 0 and (with_grad) a zero gradient row. labels (T) i32 in [0, V)
// where the mask is set; mask (T) u8; losses (T) f32 (f64 when logits are f64). The caller sums
// losses and divides by the number of loss tokens in the global batch (grad_scale = 1 / that).
#pragma once
#include "core/tensor.h"

namespace engine::ops {

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale);

}  // namespace engine::ops
