// Linear layer y = x W^T + b with W stored (out, in) as Hugging Face and Megatron do, so a
// column-parallel split is a split of dim 0 and checkpoint conversion needs no transpose.
// Gradient conventions: dx is written (=); dweight and dbias accumulate (+=), so micro-batches
// add into the flat gradient buffer. Nothing is saved here: the caller keeps x for backward.
//   x, dx: (T, in)   y, dy: (T, out)   weight, dweight: (out, in)   bias, dbias: (out) or undefined
//
// Precision (LinearPrecision, layers/common.h; training.fp8): Fp8Recipe::Off multiplies in the
// activations' dtype (ops::matmul). Otherwise each product's operands are quantised to FP8 from
// their current amax (ops/fp8.h) and multiplied by ops::fp8_matmul (f32 accumulation, the output
// in the activations' dtype, dweight still += in f32):
//   forward  y  = x W^T:   x e4m3, W e4m3
//   dgrad    dx = dy W:    dy (gradient format), W^T e4m3 (W quantised transposed)
//   wgrad    dW += dy^T x: dy^T (gradient format), x^T e4m3, both quantised transposed
// tensorwise: one scale per operand, gradients e5m2 (their wider range); rowwise: one scale per
// row of each operand as the product sees it (per token for x and dy, per output or input
// channel for W, per channel of dy and x in wgrad: the scales factor out of every sum), and
// gradients e4m3, which the per-row scales keep in range. Nothing FP8 is kept between calls.
// Tensor parallelism: where a rank holds part of what an amax spans (the split operand, per
// tensor; a row cut by the split, per row) the amax is the maximum over the group, so every rank
// quantises its part exactly as one rank would the whole and the layouts agree with one rank.
// The widths the GPU product needs (multiples of 16) are checked at config time (config_fp8.cpp).
#pragma once
#include "core/tensor.h"
#include "layers/common.h"

namespace engine::layers {

// y = x W^T + bias (+ addend: c's shape, read in the GEMM's epilogue; may be y itself).
void linear_forward(const LinearPrecision& p, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& y, const Tensor& addend = {});
// dx may be undefined (first layer: no input gradient needed); dweight too (a frozen weight:
// its GEMM is skipped); x is read only for dweight.
void linear_backward(const LinearPrecision& p, const Tensor& dy, const Tensor& x, const Tensor& weight,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias);

}  // namespace engine::layers
