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

// A block of columns of one 2-D matrix into another with as many rows, converting the dtype:
//   dst[r, dst_col + c] (= or +=) src[r, src_col + c]   for r < rows, c < width
// src (rows, Cs), dst (rows, Cd) of any float dtypes (bf16 / f32 on the GPU); accumulation adds
// in f32 (f64 for f64 operands) and rounds once. The micro-sequence key/value buffers use it.
void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,
                  bool accumulate = false);

}  // namespace engine::ops
