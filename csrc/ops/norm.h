// Layer norms over the last dimension. x, y, dy, dx: (T, C); weight, bias, dweight, dbias: (C);
// mean, rstd: (T), saved by forward for backward. Statistics are f64 when x is f64, else f32.
// Backward writes dx (=) and accumulates dweight, dbias (+=). LayerNorm's bias and dbias may be
// undefined (a LayerNorm without bias).
//   layernorm: y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps)
//   rmsnorm:   y = x * rstd * weight,                  rstd = 1 / sqrt(mean(x^2) + eps)
//
// Residual forms (the pre-norm residual stream, one pass instead of a separate add):
//   *_residual_forward:  sum = x + residual (rounded to the dtype of x, exactly as ops::add),
//                        then the norm of sum: y, mean, rstd as above with sum as its input.
//                        residual, sum: (T, C), the dtype of x. sum may alias x or residual;
//                        y may alias x or residual but not sum.
//   *_residual_backward: dx = (the norm's input gradient, rounded to the dtype) + dresidual
//                        (rounded again, exactly as ops::add_inplace after the plain backward).
//                        x is the norm's input (the forward's sum). dresidual: (T, C), the dtype
//                        of x. dx may alias dresidual (and, as in the plain form, dy or x).
//                        dx_colsum (C), optional: += sum_t dx(t), dx as written (the bias
//                        gradient of the layer whose output gradient dx also is); the same as
//                        ops::sum_rows(dx, dx_colsum, 1) after the call, without reading dx
//                        again where the kernel allows (the GPU's warp-per-row kernel).
// amax (the forwards), optional: one f32 element that gets the FP8 amax of y as stored (ops/fp8.h
// fp8_amax per tensor), computed as y is written, for an FP8 product of y (layers/linear.h).
// On the CPU every result is bitwise that of the separate ops::add / add_inplace and the plain
// norm; on the GPU the sum is, and the rest agree within f32 rounding (the fused kernels may
// reduce in another order).
#pragma once
#include "core/tensor.h"
#include "ops/op.h"

// dx_colsum: undefined (Tensor{}) when not asked for.
#define ENGINE_NORM_OPS(OP)                                                                  \
  OP(void, layernorm_forward,                                                                \
     (const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& y,  \
      const Tensor& mean, const Tensor& rstd, const Tensor& amax),                           \
     (x, weight, bias, eps, y, mean, rstd, amax))                                            \
  OP(void, layernorm_backward,                                                               \
     (const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,           \
      const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias),     \
     (dy, x, weight, mean, rstd, dx, dweight, dbias))                                        \
  OP(void, rmsnorm_forward,                                                                  \
     (const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd,  \
      const Tensor& amax),                                                                   \
     (x, weight, eps, y, rstd, amax))                                                        \
  OP(void, rmsnorm_backward,                                                                 \
     (const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,           \
      const Tensor& dx, const Tensor& dweight),                                              \
     (dy, x, weight, rstd, dx, dweight))                                                     \
  OP(void, layernorm_residual_forward,                                                       \
     (const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,     \
      float eps, const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd,  \
      const Tensor& amax),                                                                   \
     (x, residual, weight, bias, eps, sum, y, mean, rstd, amax))                             \
  OP(void, layernorm_residual_backward,                                                      \
     (const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,           \
      const Tensor& rstd, const Tensor& dresidual, const Tensor& dx, const Tensor& dweight,  \
      const Tensor& dbias, const Tensor& dx_colsum),                                         \
     (dy, x, weight, mean, rstd, dresidual, dx, dweight, dbias, dx_colsum))                  \
  OP(void, rmsnorm_residual_forward,                                                         \
     (const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,              \
      const Tensor& sum, const Tensor& y, const Tensor& rstd, const Tensor& amax),           \
     (x, residual, weight, eps, sum, y, rstd, amax))                                         \
  OP(void, rmsnorm_residual_backward,                                                        \
     (const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,           \
      const Tensor& dresidual, const Tensor& dx, const Tensor& dweight,                      \
      const Tensor& dx_colsum),                                                              \
     (dy, x, weight, rstd, dresidual, dx, dweight, dx_colsum))

ENGINE_DECLARE_OPS(ENGINE_NORM_OPS)
