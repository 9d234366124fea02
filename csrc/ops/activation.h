// Pointwise activations of the MLPs. Backward writes dx (=).
//   gelu (tanh approximation, GPT-2's "gelu_new"):
//     y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))        x, y, dy, dx: any equal shapes
//   gelu_erf (exact, torch's and transformers' "gelu": Llava's projector):
//     y = 0.5 x (1 + erf(x / sqrt(2))),  dy/dx = 0.5 (1 + erf(x / sqrt(2))) + x exp(-x^2 / 2) / sqrt(2 pi)
//   swiglu: gate_up (T, 2F) holds [gate | up] along the last dimension (the output of one GEMM
//     over the adjacent gate and up weights); y (T, F) = silu(gate) * up, silu(g) = g / (1 + e^-g)
//   amax (swiglu): undefined, or one f32 element that gets the FP8 amax (ops/fp8.h fp8_amax, per
//     tensor) of the output as stored (y, or all of dgate_up), computed as the output is written
//     so that an FP8 product of it needs no pass of its own (layers/linear.h).
// Every tensor of one call has one dtype: f32 or f64 on the CPU (computed in double), bf16 or f32
// on the GPU (computed in f32). Outputs may alias inputs element for element (y = x, dx = dy,
// dgate_up = gate_up).
#pragma once
#include "core/tensor.h"
#include "ops/op.h"

#define ENGINE_ACTIVATION_OPS(OP)                                                             \
  OP(void, gelu_forward, (const Tensor& x, const Tensor& y), (x, y))                          \
  OP(void, gelu_backward, (const Tensor& dy, const Tensor& x, const Tensor& dx), (dy, x, dx)) \
  OP(void, gelu_erf_forward, (const Tensor& x, const Tensor& y), (x, y))                      \
  OP(void, gelu_erf_backward, (const Tensor& dy, const Tensor& x, const Tensor& dx), (dy, x, dx)) \
  OP(void, swiglu_forward, (const Tensor& gate_up, const Tensor& y, const Tensor& amax),      \
     (gate_up, y, amax))                                                                      \
  OP(void, swiglu_backward,                                                                   \
     (const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up, const Tensor& amax),   \
     (dy, gate_up, dgate_up, amax))

ENGINE_DECLARE_OPS(ENGINE_ACTIVATION_OPS)
