// CPU reference of rotary position embedding (f32 or f64), same signatures as ops/rope.h.
// Angles and their sines and cosines are computed in double.
#pragma once
#include "core/tensor.h"

namespace engine::ref {

void rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads, float theta);
void rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads, float theta);

}  // namespace engine::ref
