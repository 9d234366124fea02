// Helpers of the GPU attention tests (flash and cuDNN): heads of a packed (T, NH, D) tensor,
// a relative-RMS check against a reference, and the all-NaN check of poisoned outputs.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/buffer.h"
#include "tests/common/testing.h"

namespace engine::testing {

// Heads [h0, h0 + n) of a (T, NH, D) tensor, as a CPU f64 (T, n, D) tensor.
inline Owned heads_of(const Tensor& x, int64_t h0, int64_t n) {
  Owned host = to_host(x, DType::F64);
  const int64_t t = x.size(0), nh = x.size(1), d = x.size(2);
  Owned part = empty({t, n, d}, DType::F64, Device::CPU);
  for (int64_t i = 0; i < t; ++i)
    std::memcpy(part.ptr<double>() + i * n * d, host.ptr<double>() + (i * nh + h0) * d,
                static_cast<size_t>(n * d) * sizeof(double));
  return part;
}

// CHECKs got against ref at tolerance tol (relative RMS, no NaN/inf); returns the error.
inline double check_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  const Comparison cmp = compare(got, ref, what);
  INFO(cmp.report);
  CHECK(cmp.nonfinite == 0);
  CHECK(cmp.rel_rms <= tol);
  return cmp.rel_rms;
}

// Whether every element is NaN (an output left as poisoned).
inline bool all_nan(const Tensor& x) {
  Owned host = to_host(x, DType::F64);
  for (int64_t i = 0; i < host->numel(); ++i)
    if (!std::isnan(host.ptr<double>()[i])) return false;
  return true;
}

}  // namespace engine::testing
