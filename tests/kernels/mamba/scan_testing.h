// Helpers of the GPU tests of the Mamba, Mamba-2 and Gated DeltaNet kernels (test_mamba.cpp,
// test_ssd.cpp, test_delta.cpp, test_delta_norm.cpp): packed documents, column blocks read back in
// f64, the poison outside a block, a tolerance check that can print its error, the check of a
// parameter gradient that sums over the tokens.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/common/gpu_testing.h"

namespace engine::testing::scan_testing {

constexpr int64_t kOffset = 1;  // every device tensor starts one element into its allocation

inline int64_t total(const std::vector<int32_t>& lengths) {
  int64_t s = 0;
  for (int32_t l : lengths) s += l;
  return s;
}

// `count` documents of random lengths in [1, max_len].
inline std::vector<int32_t> random_docs(int count, int max_len, const std::string& name) {
  Owned l = randint({count}, 1, max_len + 1, name);
  return std::vector<int32_t>(l.ptr<int32_t>(), l.ptr<int32_t>() + count);
}

// Columns [col, col + width) of any tensor as a contiguous f64 host tensor.
inline Owned block_host(const Tensor& base, int64_t col, int64_t width) {
  Owned h = to_host(base, DType::F64);
  const int64_t rows = base.size(0), ld = base.size(1);
  Owned out = empty({rows, width}, DType::F64, Device::CPU);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < width; ++j) set(out, t * width + j, get(h, t * ld + col + j));
  return out;
}

// Every element of base outside columns [col, col + width) is still NaN (its poison).
inline bool outside_poisoned(const Tensor& base, int64_t col, int64_t width) {
  Owned h = to_host(base, DType::F64);
  const int64_t rows = base.size(0), ld = base.size(1);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < ld; ++j)
      if ((j < col || j >= col + width) && !std::isnan(get(h, t * ld + j))) return false;
  return true;
}

inline Owned f64_from(const Tensor& gpu_minus, const Tensor& prefill) {  // gpu result - prefill, in f64
  Owned a = to_host(gpu_minus, DType::F64);
  for (int64_t i = 0; i < a->numel(); ++i) set(a, i, get(a, i) - get(prefill, i));
  return a;
}

// A parameter gradient that sums per-token terms over the batch (dt_bias's: the terms are the
// per-token gradients of the input it is added to): a sum whose terms cancel loses the terms'
// relative precision, so each element's error is held to tol times the sum of its terms' sizes,
// l1[h] = sum_t |term[t, h]| (f64, got and ref (H)).
inline Comparison close_sums(const Tensor& got, const Tensor& ref, const Tensor& l1, double tol) {
  Comparison c = compare(got, ref, "sum");
  c.rel_rms = 0;
  for (int64_t h = 0; h < ref.numel(); ++h)
    c.rel_rms = std::max(c.rel_rms, std::fabs(get(got, h) - get(ref, h)) / std::max(get(l1, h), 1e-30));
  return c;
}

// sum_t |x[t, col0 + h]| for h < width of a (T, ld) f64 host tensor, times scale(t, h) if given.
template <typename F>
inline Owned column_l1(const Tensor& x, int64_t col0, int64_t width, F&& scale) {
  Owned out = zeros({width}, DType::F64, Device::CPU);
  const int64_t rows = x.size(0), ld = x.size(1);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < width; ++h) set(out, h, get(out, h) + std::fabs(get(x, t * ld + col0 + h) * scale(t, h)));
  return out;
}

// CHECK_CLOSE that also prints the error with TEST_VERBOSE=1 (for the tests' tolerances).
inline void close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  Comparison c = compare(got, ref, what);
  if (std::getenv("TEST_VERBOSE")) MESSAGE(what << ": rel_rms " << c.rel_rms);
  INFO(c.report);
  CHECK(c.nonfinite == 0);
  CHECK(c.rel_rms <= tol);
}

}  // namespace engine::testing::scan_testing
