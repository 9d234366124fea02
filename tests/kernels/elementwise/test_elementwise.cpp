// CUDA element-wise ops against the CPU reference on the same inputs: add, add_inplace (incl.
// out aliasing a) and scale_inplace must equal the reference bit for bit (the same f32 / double
// operations, rounded the same way); cast f32 <-> bf16 bit for bit (ties, -0, inf, NaN); f64
// rejected. sum / sum_squares within 1e-6 of the reference's double sums (f32 partials over 8
// elements) and bitwise repeatable; count_nonfinite exact. Sizes cross the vector width (8), the
// peeled head and tail, and the grid (cast bf16 -> f32 also its unrolled loop over warp spans);
// operands at odd element offsets exercise the peeled head (all misaligned alike) and the
// element-by-element path (misaligned differently).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/elementwise.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

const std::vector<int64_t> kSizes = {1, 7, 8, 4097, 70001, (1 << 20) + 3};
const std::vector<DType> kDtypes = {DType::F32, DType::BF16};

// Element offsets of (first, second, out): aligned, all misaligned alike, misaligned differently.
struct Offsets {
  int64_t a, b, out;
};
const std::vector<Offsets> kOffsets = {{0, 0, 0}, {1, 1, 1}, {0, 3, 1}};

}  // namespace

TEST_CASE("cuda add, add_inplace and scale_inplace equal the CPU reference bit for bit" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (int64_t n : kSizes) {
    SUBCASE(("n = " + std::to_string(n)).c_str()) {
      for (DType dt : kDtypes)
        for (const Offsets& off : kOffsets) {
          INFO(dtype_name(dt), " offsets ", off.a, "/", off.b, "/", off.out);
          Owned a = randn({n}, dt, "ew.a"), b = randn({n}, dt, "ew.b");
          Owned want = empty({n}, dt, Device::CPU);
          ops::add(a, b, want);
          DeviceTensor da = to_gpu(a, off.a), db = to_gpu(b, off.b);
          DeviceTensor dout = to_gpu(a, off.out);
          poison(dout.t);
          ops::add(da.t, db.t, dout.t);
          CHECK(bitwise_equal(dout.t, want));

          ops::add(da.t, db.t, da.t);  // out aliases a
          CHECK(bitwise_equal(da.t, want));

          DeviceTensor acc = to_gpu(a, off.out);
          ops::add_inplace(acc.t, db.t);
          CHECK(bitwise_equal(acc.t, want));

          Owned scaled = empty({n}, dt, Device::CPU);
          copy_tensor(scaled, b);
          ops::scale_inplace(scaled, -0.3);
          ops::scale_inplace(db.t, -0.3);
          CHECK(bitwise_equal(db.t, scaled));
        }
    }
  }
}

TEST_CASE("cuda cast between f32 and bf16 equals the reference bit for bit; f64 is rejected" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const int64_t n = 10007;
  Owned x = randn({n}, DType::F32, "ew.cast", 5.0);
  set(x, 0, 1.0 + 1.0 / 256);  // a bf16 tie: rounds to even (1.0)
  set(x, 1, -0.0);
  set(x, 2, std::numeric_limits<double>::infinity());
  set(x, 3, -std::numeric_limits<double>::infinity());
  set(x, 4, 3.3e38);  // near the largest bf16
  set(x, 5, 1e-40);   // subnormal
  set(x, 9000, std::nan(""));
  for (DType src : kDtypes)
    for (DType dst : kDtypes)
      for (int64_t offset : {0, 1}) {
        INFO(dtype_name(src), " -> ", dtype_name(dst), " offset ", offset);
        Owned s = empty({n}, src, Device::CPU);
        ops::cast(x, s);
        Owned want = empty({n}, dst, Device::CPU);
        ops::cast(s, want);
        DeviceTensor ds = to_gpu(s, offset);
        DeviceTensor dd = to_gpu(want);
        poison(dd.t);
        ops::cast(ds.t, dd.t);
        Owned got = to_host(dd.t, dd.t.dtype);
        int64_t differ = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double g = get(got, i), w = get(want, i);
          const bool same = (std::isnan(g) && std::isnan(w)) ||
                            (g == w && std::signbit(g) == std::signbit(w));
          differ += !same;
        }
        CHECK(differ == 0);
      }
  Owned d64 = empty({4}, DType::F64, Device::CUDA), d32 = empty({4}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(ops::cast(d64, d32), Error);
  CHECK_THROWS_AS(ops::cast(d32, d64), Error);
}

// The bf16 -> f32 body converts 256-element warp spans, four spans per loop trip once a thread
// has that many (over 8.6M elements on an H200); both loops, the head and the tail run here.
TEST_CASE("cuda cast bf16 -> f32 over many spans equals the reference bit for bit" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (int64_t n : {int64_t{(1 << 24) + 777}, int64_t{(1 << 22) + 5}, int64_t{300}}) {
    for (int64_t offset : {0, 4}) {  // 4: both pointers 8 bytes past 16, a 4-element head
      INFO("n ", n, " offset ", offset);
      Owned x = randn({n}, DType::BF16, "ew.cast_big");
      Owned want = empty({n}, DType::F32, Device::CPU);
      ops::cast(x, want);
      DeviceTensor dx = to_gpu(x, offset);
      DeviceTensor dy = gpu_poisoned({n}, DType::F32, offset);
      ops::cast(dx.t, dy.t);
      CHECK(bitwise_equal(dy.t, want));
    }
  }
}

TEST_CASE("cuda sum and sum_squares match the reference's double sums and repeat bit for bit" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  std::vector<int64_t> sizes = kSizes;
  sizes.push_back((1 << 22) + 5);
  for (int64_t n : sizes) {
    SUBCASE(("n = " + std::to_string(n)).c_str()) {
      for (DType dt : kDtypes)
        for (int64_t offset : {0, 1}) {
          INFO(dtype_name(dt), " offset ", offset);
          Owned x = randn({n}, dt, "ew.sum");
          double abs_sum = 0;
          for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(get(x, i));
          const double want_s = ops::sum(x), want_ss = ops::sum_squares(x);
          DeviceTensor dx = to_gpu(x, offset);
          const double s = ops::sum(dx.t), ss = ops::sum_squares(dx.t);
          CHECK(std::fabs(s - want_s) <= 1e-6 * abs_sum);
          CHECK(std::fabs(ss - want_ss) <= 1e-6 * want_ss);
          const double s2 = ops::sum(dx.t), ss2 = ops::sum_squares(dx.t);
          CHECK(std::memcmp(&s, &s2, sizeof s) == 0);
          CHECK(std::memcmp(&ss, &ss2, sizeof ss) == 0);
        }
    }
  }
  Owned empty_t = empty({0}, DType::F32, Device::CUDA);
  CHECK(ops::sum(empty_t) == 0.0);
  CHECK(ops::sum_squares(empty_t) == 0.0);
}

TEST_CASE("cuda count_nonfinite counts NaN, +inf and -inf, in the head, body and tail" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{70001}}) {
    for (DType dt : kDtypes)
      for (int64_t offset : {0, 1}) {
        INFO(n, " ", dtype_name(dt), " offset ", offset);
        Owned x = randn({n}, dt, "ew.nonfinite");
        const double specials[] = {std::nan(""), std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity()};
        int64_t placed = 0;
        for (int64_t i : {int64_t{0}, n / 2, n - 1, int64_t{5}, n / 3}) {
          if (i >= n || std::isnan(get(x, i)) || std::isinf(get(x, i))) continue;
          set(x, i, specials[placed % 3]);
          ++placed;
        }
        DeviceTensor dx = to_gpu(x, offset);
        CHECK(ops::count_nonfinite(dx.t) == placed);
        CHECK(ops::count_nonfinite(dx.t) == ops::count_nonfinite(x));
      }
  }
}

TEST_CASE("cuda element-wise ops reject mismatched operands" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  Owned a = empty({8}, DType::F32, Device::CUDA), b16 = empty({8}, DType::BF16, Device::CUDA);
  Owned shorter = empty({7}, DType::F32, Device::CUDA), i32 = empty({8}, DType::I32, Device::CUDA);
  CHECK_THROWS_AS(ops::add(a, b16, a), Error);
  CHECK_THROWS_AS(ops::add(a, shorter, a), Error);
  CHECK_THROWS_AS(ops::add_inplace(a, b16), Error);
  CHECK_THROWS_AS(ops::scale_inplace(i32, 2.0), Error);
  CHECK_THROWS_AS(ops::sum(i32), Error);
  CHECK_THROWS_AS(ops::cast(a, shorter), Error);
}

TEST_CASE("cuda copy_columns equals the CPU reference bit for bit (=, +=, bf16 <-> f32)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const int64_t rows = 37, cs = 40, cd = 24, width = 16;
  for (DType sd : kDtypes)
    for (DType dd : kDtypes)
      for (bool acc : {false, true}) {
        INFO(dtype_name(sd), " -> ", dtype_name(dd), acc ? " (+=)" : " (=)");
        Owned src = randn({rows, cs}, sd, "cc.src"), dst = randn({rows, cd}, dd, "cc.dst");
        DeviceTensor dsrc = to_gpu(src, 1), ddst = to_gpu(dst, 1);
        ops::copy_columns(src, 8, dst, 5, width, acc);
        ops::copy_columns(dsrc.t, 8, ddst.t, 5, width, acc);
        CHECK(bitwise_equal(ddst.t, dst));
      }
}
