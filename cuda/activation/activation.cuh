// CUDA launchers of the MLP activations (contract: csrc/ops/activation.h; kernels:
// activation.cu). Every tensor of one call is bf16, or every one f32; math in f32.
//   gelu (tanh approximation): x, y, dy, dx any equal shapes
//   swiglu: gate_up (..., 2F) = [gate | up], y / dy (..., F)
// Outputs may alias inputs element for element (y = x, dx = dy, dgate_up = gate_up).
#pragma once
#include "core/tensor.h"

namespace engine::cuda {

void gelu_forward(const Tensor& x, const Tensor& y);
void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx);

void swiglu_forward(const Tensor& gate_up, const Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up);

}  // namespace engine::cuda
