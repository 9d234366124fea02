// CPU reference of the MLP activations (f32 or f64), same signatures as ops/activation.h.
// Computed in double per element; outputs may alias inputs (y = x, dx = dy).
#pragma once
#include "core/tensor.h"

namespace engine::ref {

void gelu_forward(const Tensor& x, const Tensor& y);
void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx);

void swiglu_forward(const Tensor& gate_up, const Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up);

}  // namespace engine::ref
