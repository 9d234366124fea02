// AdamW (Loshchilov & Hutter) on a contiguous range of a flat parameter buffer, with decoupled
// weight decay. All f32, same length n:
//   g = grad * grad_scale                  (grad_scale folds in clipping)
//   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p = p - lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p)
// compute_copy, when defined, receives p converted to its dtype (the bf16 weights used by the
// GPU's forward) in the same pass.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::ops {

struct AdamWParams {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;        // t, counted from 1
  float grad_scale = 1.f;
};

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p, const Tensor& compute_copy = {});

}  // namespace engine::ops
