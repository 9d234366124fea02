// Shared helpers of the CPU reference ops: the switch from a runtime dtype to the template
// instantiation (float or double) that does the work, and the argument checks of ops/op.h.
#pragma once
#include <cstdint>
#include <utility>

#include "core/check.h"
#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ref {

// The checks that name the argument, shared with the op files (ops/op.h).
using ops::expect_dtype;
using ops::expect_ndim;
using ops::expect_shape;

// Calls f(float{}) or f(double{}) for an f32 or f64 dtype; anything else is an error naming the
// argument that set the dtype.
template <typename F>
decltype(auto) float_switch(DType dtype, const char* op, const char* name, F&& f) {
  switch (dtype) {
    case DType::F32: return std::forward<F>(f)(float{});
    case DType::F64: return std::forward<F>(f)(double{});
    default: break;
  }
  RAISE(op, ": ", name, " is ", dtype_name(dtype), ", the CPU reference takes f32 or f64");
}

}  // namespace engine::ref
