// CPU reference of layernorm and rmsnorm (f32 or f64; statistics in the dtype of x), same
// signatures as ops/norm.h. Statistics are reduced in double. Backward writes dx (=) and
// accumulates dweight, dbias (+=), summing rows in order (deterministic).
#pragma once
#include "core/tensor.h"

namespace engine::ref {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias);

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                     const Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight);

}  // namespace engine::ref
