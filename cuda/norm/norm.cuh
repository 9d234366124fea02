// CUDA launchers of layernorm and rmsnorm (contract: csrc/ops/norm.h; kernels: norm.cu).
// x, weight, bias, y, dy, dx: bf16 (mixed precision) or all f32; mean, rstd: f32;
// dweight, dbias: f32, accumulated (+=) by a deterministic two-pass reduction. bias / dbias may
// be undefined (data == nullptr). C up to 8192 for any layout, larger when rows are 16-byte
// vectors (C % 8 == 0 for bf16, C % 4 == 0 for f32, 16-byte aligned pointers).
// Residual forms: residual, sum, dresidual in the dtype of x; sum = x + residual is rounded to it
// before it is normalised, and dx is rounded before dresidual is added (then rounded again), as
// the separate add kernels and the plain norm do: sum is bitwise theirs, the statistics, y, dx
// and the weight gradients agree within f32 rounding (measured on an H200: not bitwise; the
// misaligned scalar path reduces in another order). Aliasing: sum may alias
// x or residual, y may alias x or residual (not sum), dx may alias dresidual, dy or x.
// dx_colsum (residual backward, optional): f32 (C), += the column sums of dx as stored, summed
// by the norm kernel itself (no second pass over dx).
#pragma once
#include "core/tensor.h"

namespace engine::cuda {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                        const Tensor& dbias);

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

}  // namespace engine::cuda
