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

}  // namespace engine::ref
