// Linear layer y = x W^T + b with W stored (out, in) as Hugging Face and Megatron do, so a
// column-parallel split is a split of dim 0 and checkpoint conversion needs no transpose.
// Gradient conventions: dx is written (=); dweight and dbias accumulate (+=), so micro-batches
// add into the flat gradient buffer. Nothing is saved here: the caller keeps x for backward.
//   x, dx: (T, in)   y, dy: (T, out)   weight, dweight: (out, in)   bias, dbias: (out) or undefined
#pragma once
#include "core/tensor.h"

namespace engine::layers {

// y = x W^T + bias (+ addend: c's shape, read in the GEMM's epilogue; may be y itself).
void linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                    const Tensor& addend = {});
// dx may be undefined (first layer: no input gradient needed); dweight too (a frozen weight:
// its GEMM is skipped).
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                     const Tensor& dweight, const Tensor& dbias);

}  // namespace engine::layers
