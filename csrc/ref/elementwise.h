// CPU reference of the whole-tensor operations (f32, f64 or bf16), same signatures as
// ops/elementwise.h. Operands of one call share dtype and shape, except cast (any two of f32,
// f64, bf16). Reductions accumulate in double over fixed chunks combined in order, so they are
// deterministic whatever the thread count.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::ref {

void add(const Tensor& a, const Tensor& b, const Tensor& out);
void add_inplace(const Tensor& acc, const Tensor& x);
void scale_inplace(const Tensor& x, double s);
void cast(const Tensor& src, const Tensor& dst);
double sum(const Tensor& x);
double sum_squares(const Tensor& x);
int64_t count_nonfinite(const Tensor& x);
void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,
                  bool accumulate);
// The argument checks of copy_columns, shared with the CUDA launcher.
void check_copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,
                        const char* op);

}  // namespace engine::ref
