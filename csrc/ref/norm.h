// CPU reference of layernorm and rmsnorm (f32 or f64; statistics in the dtype of x), same
// signatures as ops/norm.h. Statistics are reduced in double. Backward writes dx (=) and
// accumulates dweight, dbias (+=), summing rows in order (deterministic).
// The residual forms round sum = x + residual (and dx = dnorm + dresidual) to the dtype exactly
// as ref::add does, so they are bitwise the separate add and the plain norm.
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

void layernorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, float eps, const Tensor& sum, const Tensor& y,
                                const Tensor& mean, const Tensor& rstd);
void layernorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                                 const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dx_colsum);

void rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              float eps, const Tensor& sum, const Tensor& y, const Tensor& rstd);
void rmsnorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& rstd, const Tensor& dresidual, const Tensor& dx,
                               const Tensor& dweight, const Tensor& dx_colsum);

}  // namespace engine::ref
