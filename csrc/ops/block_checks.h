// The shared precondition checks of the ops over packed token rows (ops/mamba.h, ops/ssd.h,
// ops/delta.h): column blocks inside their tensors, cu_seqlens' dtype and shape.
#pragma once
#include "ops/mamba.h"

namespace engine::ops::block_checks {

// Defined and of shape s, any dtype.
inline void expect_sized(const Tensor& t, const Shape& s, const char* op, const char* name) {
  expect_defined(t, op, name);
  expect_shape(t, s, op, name);
}

// A column block of `rows` rows and `width` columns of `dtype` inside its 2-D tensor.
inline void expect_block(const ColumnBlock& b, DType dtype, int64_t rows, int64_t width, const char* op,
                  const char* name) {
  expect_defined(b.base, op, name);
  expect_dtype(b.base, dtype, op, name);
  ENSURE(b.base.ndim() == 2, op, ": ", name, " must be a 2-D tensor, got shape ",
         b.base.shape.str());
  ENSURE(b.rows() == rows, op, ": ", name, " has ", b.rows(), " rows, expected ", rows);
  ENSURE(b.width == width, op, ": ", name, " has ", b.width, " columns, expected ", width);
  ENSURE(b.col >= 0 && b.col + b.width <= b.ld(), op, ": ", name, " columns [", b.col, ", ",
         b.col + b.width, ") outside its tensor of ", b.ld(), " columns");
}

// cu_seqlens (S + 1) i32; its values are the backends' (the CPU reads them, the GPU does not).
inline void check_cu_seqlens(const Tensor& cu, const char* op) {
  expect_defined(cu, op, "cu_seqlens");
  expect_dtype(cu, DType::I32, op, "cu_seqlens");
  ENSURE(cu.ndim() == 1 && cu.numel() >= 1, op, ": cu_seqlens must be (S + 1), got shape ",
         cu.shape.str());
}

}  // namespace engine::ops::block_checks
