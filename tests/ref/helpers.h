// Helpers of the reference-op tests (tests/ref only): the random-projection loss, fp64 central
// differences over a whole tensor, dtype conversion and bitwise comparison. Own namespace, so
// they never collide with the shared helpers of tests/common.
#pragma once
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/common/testing.h"

namespace engine::reftest {

using namespace engine::testing;

// Tolerance of an fp64 finite-difference check (relative RMS over the whole tensor).
constexpr double kGradTol = 1e-6;

// sum_i out_i * r_i in double: the loss L = sum(out * R) of a random projection R.
inline double projection(const Tensor& out, const Tensor& r) {
  REQUIRE(out.numel() == r.numel());
  double s = 0;
  if (out.dtype == DType::F64 && r.dtype == DType::F64) {  // the finite-difference hot path
    const double *po = out.ptr<double>(), *pr = r.ptr<double>();
    for (int64_t i = 0; i < out.numel(); ++i) s += po[i] * pr[i];
    return s;
  }
  for (int64_t i = 0; i < out.numel(); ++i) s += get(out, i) * get(r, i);
  return s;
}

inline double sum_all(const Tensor& a) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += get(a, i);
  return s;
}

inline double sum_squares_of(const Tensor& a) { return projection(a, a); }

// dL/dx by central differences, element by element over the whole of x (x is restored).
inline Owned numeric_grad(const Tensor& x, const std::function<double()>& loss, double h = 1e-5) {
  Owned g = empty(x.shape, DType::F64, Device::CPU);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = get(x, i);
    set(x, i, x0 + h);
    const double lp = loss();
    set(x, i, x0 - h);
    const double lm = loss();
    set(x, i, x0);
    g.ptr<double>()[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// A new CPU tensor holding t's values in dtype.
inline Owned converted(const Tensor& t, DType dtype) {
  Owned o = empty(t.shape, dtype, Device::CPU);
  for (int64_t i = 0; i < t.numel(); ++i) set(o.t, i, get(t, i));
  return o;
}
inline Owned clone(const Tensor& t) { return converted(t, t.dtype); }

// Bytes equal (same results bit for bit).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

inline const char* float_name(DType t) { return t == DType::F64 ? "f64" : "f32"; }

}  // namespace engine::reftest
