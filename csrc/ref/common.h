// Shared helpers of the CPU reference ops: precondition checks that name the argument, and the
// switch from a runtime dtype to the template instantiation (float or double) that does the work.
#pragma once
#include <cstdint>
#include <utility>

#include "core/check.h"
#include "core/tensor.h"

namespace engine::ref {

inline void expect_cpu(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.device == Device::CPU, op, ": ", name, " is on ", device_name(t.device),
         ", the reference runs on the CPU");
  ENSURE(t.data != nullptr || t.numel() == 0, op, ": ", name, " is undefined");
}

inline void expect_dtype(const Tensor& t, DType dtype, const char* op, const char* name) {
  ENSURE(t.dtype == dtype, op, ": ", name, " is ", dtype_name(t.dtype), ", expected ",
         dtype_name(dtype));
}

inline void expect_shape(const Tensor& t, const Shape& s, const char* op, const char* name) {
  ENSURE(t.shape == s, op, ": ", name, " has shape ", t.shape.str(), ", expected ", s.str());
}

inline void expect_ndim(const Tensor& t, int ndim, const char* op, const char* name) {
  ENSURE(t.ndim() == ndim, op, ": ", name, " must be ", ndim, "-D, got shape ", t.shape.str());
}

// A CPU tensor of the given dtype and shape (the common case of one line per argument).
inline void expect(const Tensor& t, DType dtype, const Shape& s, const char* op,
                   const char* name) {
  expect_cpu(t, op, name);
  expect_dtype(t, dtype, op, name);
  expect_shape(t, s, op, name);
}

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
