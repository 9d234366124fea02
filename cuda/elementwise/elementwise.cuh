// CUDA launchers of ops/elementwise.h (host declarations only; kernels in elementwise.cu).
// Dtypes: add / add_inplace / scale_inplace take bf16 or f32 (all operands one dtype and one
// shape); cast takes any pair of f32 and bf16 (f64 is rejected: the GPU has no f64 tensors);
// sum / sum_squares / count_nonfinite read bf16 or f32 and return on the host after syncing the
// compute stream. Reductions are deterministic: the same tensor gives the same bits every run.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::cuda {

void add(const Tensor& a, const Tensor& b, const Tensor& out);  // out may alias a or b
void add_inplace(const Tensor& acc, const Tensor& x);
void scale_inplace(const Tensor& x, double s);
void cast(const Tensor& src, const Tensor& dst);
double sum(const Tensor& x);
double sum_squares(const Tensor& x);
int64_t count_nonfinite(const Tensor& x);
void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,
                  bool accumulate);

}  // namespace engine::cuda
