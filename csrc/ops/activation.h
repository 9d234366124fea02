// Pointwise activations of the MLPs. Backward writes dx (=).
//   gelu (tanh approximation, GPT-2's "gelu_new"):
//     y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))        x, y, dy, dx: any equal shapes
//   swiglu: gate_up (T, 2F) holds [gate | up] along the last dimension (the output of one GEMM
//     over the adjacent gate and up weights); y (T, F) = silu(gate) * up, silu(g) = g / (1 + e^-g)
#pragma once
#include "core/tensor.h"

namespace engine::ops {

void gelu_forward(const Tensor& x, const Tensor& y);
void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx);

void swiglu_forward(const Tensor& gate_up, const Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up);

}  // namespace engine::ops
