// Small whole-tensor operations used by layers, the optimizer and the trainer.
//   add:             out = a + b (out may alias a or b); a, b, out one dtype and one shape
//   add_inplace:     acc += x (x of acc's dtype and shape)
//   scale_inplace:   x *= s
//   cast:            dst = src, converting the dtype (dst of src's shape)
//   sum:             sum of all elements, on the host
//   sum_squares:     sum of x^2 (f64 accumulation)
//   count_nonfinite: number of NaN / inf elements
//   copy_columns:    a block of columns of one 2-D matrix into another with as many rows,
//                    converting the dtype:
//                      dst[r, dst_col + c] (= or +=) src[r, src_col + c]   for r < rows, c < width
//                    src (rows, Cs), dst (rows, Cd) of any float dtypes (bf16 / f32 on the GPU);
//                    accumulate adds in f32 (f64 for f64 operands) and rounds once. The
//                    micro-sequence key/value buffers use it.
// CPU: f32, f64 or bf16 (cast: any two of them). GPU: bf16 or f32 (cast: any pair of them; f64
// is refused, the GPU holds no f64 tensors); the reductions read back to the host after syncing
// the compute stream. Reductions are deterministic: the same tensor gives the same bits every run.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/op.h"

#define ENGINE_ELEMENTWISE_OPS(OP)                                                             \
  OP(void, add, (const Tensor& a, const Tensor& b, const Tensor& out), (a, b, out))            \
  OP(void, add_inplace, (const Tensor& acc, const Tensor& x), (acc, x))                        \
  OP(void, scale_inplace, (const Tensor& x, double s), (x, s))                                 \
  OP(void, cast, (const Tensor& src, const Tensor& dst), (src, dst))                           \
  OP(double, sum, (const Tensor& x), (x))                                                      \
  OP(double, sum_squares, (const Tensor& x), (x))                                              \
  OP(int64_t, count_nonfinite, (const Tensor& x), (x))                                         \
  OP(void, copy_columns,                                                                       \
     (const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,   \
      bool accumulate),                                                                        \
     (src, src_col, dst, dst_col, width, accumulate))

ENGINE_DECLARE_OPS(ENGINE_ELEMENTWISE_OPS)
