// Linear layer y = x W^T + b with W stored (out, in) as Hugging Face and Megatron do, so a
// column-parallel split is a split of dim 0 and checkpoint conversion needs no transpose.
// Gradient conventions: dx is written (=); dweight and dbias accumulate (+=), so micro-batches
// add into the flat gradient buffer. The caller keeps x for backward (and, for FP8, the amax
// slots below).
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
// gradients e4m3, which the per-row scales keep in range. When one call wants both gradients, dy
// is quantised in both layouts from one read (ops::fp8_quantize_pair, where its kernel takes the
// shapes); a backward split around a collective (tensor_parallel.h) quantises it once a call. No FP8 bytes are kept
// between calls.
// Shared amaxes (tensorwise): an operand's one amax serves every product of the layer that
// quantises it, where the caller holds the slots (Fp8Amax; the attention's and MLP's linears do,
// the Mamba and Gated DeltaNet projections do not): `saved` (LinearAmaxes) gets x's and W's in
// the forward and gives them to the backward, so neither is read for its amax again; dy_amax
// carries dy's between the two calls of a split backward. An Fp8Amax the caller set before the
// call (written by the kernel that wrote x or dy: the norms, ops/norm.h, and the SwiGLU,
// ops/activation.h) is used as it is, after its maximum over the tensor-parallel group where
// the split cuts it. Rowwise recipes, whose products need the amaxes of different rows, ignore
// the slots.
// Tensor parallelism: where a rank holds part of what an amax spans (the split operand, per
// tensor; a row cut by the split, per row) the amax is the maximum over the group, so every rank
// quantises its part exactly as one rank would the whole and the layouts agree with one rank.
// The widths the GPU product needs (multiples of 16) are checked at config time (config_fp8.cpp).
#pragma once
#include "core/buffer.h"
#include "core/tensor.h"
#include "layers/common.h"

namespace engine::layers {

// The per-tensor amax of one operand of a linear's FP8 products (above): one f32 on the
// operand's device, undefined until set.
struct Fp8Amax {
  Owned t;
  bool reduced = false;  // already the maximum over the tensor-parallel ranks that share the operand
  explicit operator bool() const { return t->data != nullptr; }
  // A fresh amax for a kernel to write (its producer's, unreduced).
  static Fp8Amax on(Device device) { return {empty({1}, DType::F32, device), false}; }
};
// What a linear's forward leaves its backward: the amaxes of x and W.
struct LinearAmaxes {
  Fp8Amax x, w;
};

// y = x W^T + bias (+ addend: c's shape, read in the GEMM's epilogue; may be y itself).
// saved: x's amax in (where set) and x's and W's out, for the backward (tensorwise FP8).
void linear_forward(const LinearPrecision& p, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& y, const Tensor& addend = {}, LinearAmaxes* saved = nullptr);
// dx may be undefined (first layer: no input gradient needed); dweight too (a frozen weight:
// its GEMM is skipped); x is read only for dweight. saved: what the forward of the same x and W
// left; dy_amax: dy's amax in where set (its producer's, or an earlier call's on the same dy),
// and out where not.
void linear_backward(const LinearPrecision& p, const Tensor& dy, const Tensor& x, const Tensor& weight,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                     const LinearAmaxes* saved = nullptr, Fp8Amax* dy_amax = nullptr);

}  // namespace engine::layers
