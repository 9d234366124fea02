// Whole-tensor operations on f32, f64 and bf16: add (incl. aliasing), add_inplace,
// scale_inplace, cast between every pair, sum and sum_squares against direct double sums
// (deterministic over thread counts), count_nonfinite, and argument checks.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/elementwise.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

// Sizes around the reduction chunk (4096) and the parallel threshold (65536).
const std::vector<int64_t> kSizes = {0, 1, 7, 4097, 70001};
const std::vector<DType> kDtypes = {DType::F32, DType::F64, DType::BF16};

// v rounded to dtype the way the ops store results.
double rounded(double v, DType dt) {
  if (dt == DType::F64) return v;
  if (dt == DType::F32) return static_cast<float>(v);
  return static_cast<float>(bf16(static_cast<float>(v)));
}

}  // namespace

TEST_CASE("add, add_inplace and scale_inplace match element-wise formulas (aliasing allowed)") {
  for (int64_t n : kSizes) {
    SUBCASE(("n = " + std::to_string(n)).c_str()) {
      for (DType dt : kDtypes) {
        INFO(dtype_name(dt));
        Owned a = randn({n}, dt, "ew.a"), b = randn({n}, dt, "ew.b");
        Owned sum_ref = empty({n}, DType::F64, Device::CPU),
              scaled_ref = empty({n}, DType::F64, Device::CPU);
        for (int64_t i = 0; i < n; ++i) {
          // f32 and bf16 add in f32, then round (exactly what a GPU kernel does)
          const double s = dt == DType::F64 ? get(a, i) + get(b, i)
                                            : static_cast<float>(static_cast<float>(get(a, i)) +
                                                                 static_cast<float>(get(b, i)));
          sum_ref.ptr<double>()[i] = rounded(s, dt);
          scaled_ref.ptr<double>()[i] = rounded(get(a, i) * -0.3, dt);
        }
        Owned out = empty({n}, dt, Device::CPU);
        poison(out);
        ops::add(a, b, out);
        CHECK_CLOSE(out.t, sum_ref.t, 0.0);
        Owned alias = clone(a);
        ops::add(alias, b, alias);  // out aliases a
        CHECK(bitwise_equal(alias, out));
        Owned acc = clone(a);
        ops::add_inplace(acc, b);
        CHECK(bitwise_equal(acc, out));
        Owned sc = clone(a);
        ops::scale_inplace(sc, -0.3);
        CHECK_CLOSE(sc.t, scaled_ref.t, 0.0);
      }
    }
  }
}

TEST_CASE("cast between f32, f64 and bf16 rounds once to nearest even") {
  Owned x64 = randn({1001}, DType::F64, "ew.cast", 5.0);
  set(x64, 0, 1.0 + 1.0 / 256);  // a bf16 tie: rounds to even (1.0)
  set(x64, 1, -0.0);
  set(x64, 2, std::numeric_limits<double>::infinity());
  for (DType src : kDtypes)
    for (DType dst : kDtypes) {
      INFO(dtype_name(src), " -> ", dtype_name(dst));
      Owned s = empty({1001}, src, Device::CPU);
      ops::cast(x64, s);  // exercised as well: f64 -> src
      Owned d = empty({1001}, dst, Device::CPU);
      poison(d);
      ops::cast(s, d);
      Owned ref = empty({1001}, DType::F64, Device::CPU);
      for (int64_t i = 0; i < 1001; ++i) ref.ptr<double>()[i] = rounded(get(s, i), dst);
      bool exact = true;
      for (int64_t i = 0; i < 1001; ++i) exact = exact && get(d, i) == get(ref, i);
      CHECK(exact);
      CHECK(get(d, 0) == (dst == DType::BF16 || src == DType::BF16 ? 1.0 : 1.0 + 1.0 / 256));
      CHECK(std::signbit(get(d, 1)));
    }
}

TEST_CASE("sum and sum_squares match a direct double sum and do not depend on the thread count") {
  for (int64_t n : kSizes) {
    SUBCASE(("n = " + std::to_string(n)).c_str()) {
      for (DType dt : kDtypes) {
        INFO(dtype_name(dt));
        Owned x = randn({n}, dt, "ew.sum");
        double s = 0, ss = 0, scale = 0;
        for (int64_t i = 0; i < n; ++i) {
          s += get(x, i);
          ss += get(x, i) * get(x, i);
          scale += std::fabs(get(x, i));
        }
        CHECK(std::fabs(ops::sum(x) - s) <= 1e-13 * scale);
        CHECK(std::fabs(ops::sum_squares(x) - ss) <= 1e-13 * ss);
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        const double s1 = ops::sum(x), ss1 = ops::sum_squares(x);
        omp_set_num_threads(3);
        const double s3 = ops::sum(x), ss3 = ops::sum_squares(x);
        omp_set_num_threads(saved);
        CHECK(s1 == s3);
        CHECK(ss1 == ss3);
      }
    }
  }
}

TEST_CASE("count_nonfinite counts NaN, +inf and -inf") {
  for (DType dt : kDtypes) {
    INFO(dtype_name(dt));
    Owned x = randn({5003}, dt, "ew.nonfinite");
    CHECK(ops::count_nonfinite(x) == 0);
    set(x, 0, std::nan(""));
    set(x, 4096, std::numeric_limits<double>::infinity());
    set(x, 5002, -std::numeric_limits<double>::infinity());
    CHECK(ops::count_nonfinite(x) == 3);
    CHECK(std::isnan(ops::sum(x)));
  }
}

TEST_CASE("elementwise ops reject mismatched shapes and dtypes, naming the argument") {
  Owned a = randn({5}, DType::F32, "bad.a"), b4 = randn({4}, DType::F32, "bad.b4");
  Owned b64 = randn({5}, DType::F64, "bad.b64"), out = empty({5}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::add(a, b4, out), doctest::Contains("b has shape"), Error);
  CHECK_THROWS_WITH_AS(ops::add_inplace(a, b64), doctest::Contains("x is f64"), Error);
  Owned ids = empty({5}, DType::I32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::sum(ids), doctest::Contains("expected f32, f64 or bf16"), Error);
  CHECK_THROWS_WITH_AS(ops::cast(a, b4), doctest::Contains("dst has shape"), Error);
}

TEST_CASE("copy_columns copies and accumulates a block of columns between dtypes; checks ranges") {
  const int64_t rows = 5, cs = 11, cd = 9, width = 4;
  for (DType sd : kDtypes)
    for (DType dd : kDtypes)
      for (bool acc : {false, true}) {
        INFO(dtype_name(sd), " -> ", dtype_name(dd), acc ? " (+=)" : " (=)");
        Owned src = randn({rows, cs}, sd, "cc.src"), dst = randn({rows, cd}, dd, "cc.dst");
        Owned before = empty({rows, cd}, DType::F64, Device::CPU);
        ops::cast(dst, before);
        ops::copy_columns(src, 6, dst, 3, width, acc);
        const bool f64 = sd == DType::F64 || dd == DType::F64;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cd; ++c) {
            const double old = get(before, r * cd + c);
            double want = old;  // columns outside [3, 7) untouched
            if (c >= 3 && c < 3 + width) {
              const double v = get(src, r * cs + 6 + c - 3);
              want = !acc ? v : f64 ? old + v : static_cast<float>(static_cast<float>(old) + static_cast<float>(v));
              want = rounded(want, dd);
            }
            CHECK(get(dst, r * cd + c) == want);
          }
      }
  Owned a = zeros({3, 4}, DType::F32, Device::CPU), b = zeros({3, 4}, DType::F32, Device::CPU),
        c = zeros({2, 4}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH(ops::copy_columns(a, 2, b, 0, 3, false), doctest::Contains("columns [2, 5) of src"));
  CHECK_THROWS_WITH(ops::copy_columns(a, 0, b, 2, 3, false), doctest::Contains("columns [2, 5) of dst"));
  CHECK_THROWS_WITH(ops::copy_columns(a, 0, c, 0, 1, false), doctest::Contains("rows"));
}
