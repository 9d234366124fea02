// Small whole-tensor operations used by layers, the optimizer and the trainer.
#pragma once
#include "core/tensor.h"

namespace engine::ops {

void add(const Tensor& a, const Tensor& b, const Tensor& out);  // out = a + b (out may alias a or b)
void add_inplace(const Tensor& acc, const Tensor& x);           // acc += x
void scale_inplace(const Tensor& x, double s);                  // x *= s
void cast(const Tensor& src, const Tensor& dst);                // dst = src, converting the dtype
double sum(const Tensor& x);                                    // sum of all elements, on the host
double sum_squares(const Tensor& x);                            // sum of x^2 (f64 accumulation)
int64_t count_nonfinite(const Tensor& x);                       // number of NaN / inf elements

}  // namespace engine::ops
