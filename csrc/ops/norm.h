// Layer norms over the last dimension. x, y, dy, dx: (T, C); weight, bias, dweight, dbias: (C);
// mean, rstd: (T), saved by forward for backward. Statistics are f64 when x is f64, else f32.
// Backward writes dx (=) and accumulates dweight, dbias (+=). LayerNorm's bias and dbias may be
// undefined (a LayerNorm without bias).
//   layernorm: y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps)
//   rmsnorm:   y = x * rstd * weight,                  rstd = 1 / sqrt(mean(x^2) + eps)
#pragma once
#include "core/tensor.h"

namespace engine::ops {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias);

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                     const Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight);

}  // namespace engine::ops
