// gelu (tanh form) and swiglu: forward against the formulas written out here, backward against
// fp64 finite differences of L = sum(y * R), f32 vs f64, outputs aliasing inputs, and checks.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

struct ActCase {
  int64_t t, f;  // rows, features (gelu: x is (t, f); swiglu: gate_up is (t, 2f), y is (t, f))
  std::string name() const { return std::to_string(t) + "x" + std::to_string(f); }
};
const std::vector<ActCase> kActCases = {{1, 1}, {3, 7}, {11, 13}, {2, 129}};

// The tanh GELU, 0.5 x (1 + tanh u) with u = sqrt(2/pi) (x + 0.044715 x^3), as transformers
// writes it where u >= 0; for u < 0, where 1 + tanh u cancels (the reference's sigmoid form
// exists for that), the same value as 1 + tanh u = 2 / (1 + e^(-2u)).
double gelu(double x) {
  const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
  return u >= 0 ? 0.5 * x * (1 + std::tanh(u)) : x / (1 + std::exp(-2 * u));
}
double silu(double g) { return g / (1 + std::exp(-g)); }

Owned run_gelu(const Tensor& x) {
  Owned y = empty(x.shape, x.dtype, Device::CPU);
  poison(y);
  ops::gelu_forward(x, y);
  return y;
}

Owned run_swiglu(const Tensor& gu) {
  Owned y = empty({gu.size(0), gu.size(1) / 2}, gu.dtype, Device::CPU);
  poison(y);
  ops::swiglu_forward(gu, y, {});
  return y;
}

}  // namespace

TEST_CASE("gelu forward matches the tanh formula; y may alias x") {
  for (const ActCase& c : kActCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned x = randn({c.t, c.f}, dt, "act.x", 3.0);
        Owned ref = empty(x->shape, DType::F64, Device::CPU);
        for (int64_t i = 0; i < x->numel(); ++i) ref.ptr<double>()[i] = gelu(get(x, i));
        Owned y = run_gelu(x);
        CHECK_CLOSE(y.t, ref.t, dt == DType::F64 ? 1e-15 : 2e-7);
        ops::gelu_forward(x, x);  // in place
        CHECK(bitwise_equal(x, y));
      }
    }
  }
}

TEST_CASE("swiglu forward matches silu(gate) * up on [gate | up] rows") {
  for (const ActCase& c : kActCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned gu = randn({c.t, 2 * c.f}, dt, "act.gu", 2.0);
        Owned ref = empty({c.t, c.f}, DType::F64, Device::CPU);
        for (int64_t r = 0; r < c.t; ++r)
          for (int64_t j = 0; j < c.f; ++j)
            ref.ptr<double>()[r * c.f + j] =
                silu(get(gu, r * 2 * c.f + j)) * get(gu, r * 2 * c.f + c.f + j);
        CHECK_CLOSE(run_swiglu(gu).t, ref.t, dt == DType::F64 ? 1e-15 : 2e-7);
      }
    }
  }
}

TEST_CASE("gelu backward matches fp64 finite differences; dx may alias dy") {
  for (const ActCase& c : kActCases) {
    SUBCASE(c.name().c_str()) {
      // std 1: far in the tails the gelu slope is ~0 and a single element (case 1x1) would be
      // measured against finite-difference rounding alone.
      Owned x = randn({c.t, c.f}, DType::F64, "act.x");
      Owned r = randn({c.t, c.f}, DType::F64, "act.r");
      Owned dx = empty(x->shape, DType::F64, Device::CPU);
      poison(dx);
      ops::gelu_backward(r, x, dx);
      CHECK_CLOSE(dx.t, numeric_grad(x, [&] { return projection(run_gelu(x), r); }).t, kGradTol);
      Owned dy = clone(r);
      ops::gelu_backward(dy, x, dy);
      CHECK(bitwise_equal(dy, dx));
    }
  }
}

TEST_CASE("swiglu backward matches fp64 finite differences") {
  for (const ActCase& c : kActCases) {
    SUBCASE(c.name().c_str()) {
      Owned gu = randn({c.t, 2 * c.f}, DType::F64, "act.gu");
      Owned r = randn({c.t, c.f}, DType::F64, "act.r");
      Owned dgu = empty(gu->shape, DType::F64, Device::CPU);
      poison(dgu);
      ops::swiglu_backward(r, gu, dgu, {});
      CHECK_CLOSE(dgu.t, numeric_grad(gu, [&] { return projection(run_swiglu(gu), r); }).t,
                  kGradTol);
    }
  }
}

TEST_CASE("activations: f32 agrees with f64") {
  Owned x32 = randn({7, 40}, DType::F32, "act.x", 3.0), r32 = randn({7, 20}, DType::F32, "act.r");
  Owned x64 = converted(x32, DType::F64), r64 = converted(r32, DType::F64);
  CHECK_CLOSE(run_gelu(x32).t, run_gelu(x64).t, 2e-7);
  CHECK_CLOSE(run_swiglu(x32).t, run_swiglu(x64).t, 2e-7);
  Owned d32 = empty({7, 40}, DType::F32, Device::CPU),
        d64 = empty({7, 40}, DType::F64, Device::CPU);
  ops::swiglu_backward(r32, x32, d32, {});
  ops::swiglu_backward(r64, x64, d64, {});
  CHECK_CLOSE(d32.t, d64.t, 2e-7);
  Owned g32 = empty({7, 40}, DType::F32, Device::CPU),
        g64 = empty({7, 40}, DType::F64, Device::CPU);
  ops::gelu_backward(x32, x32, g32);
  ops::gelu_backward(x64, x64, g64);
  CHECK_CLOSE(g32.t, g64.t, 2e-7);
}

TEST_CASE("swiglu: the amax beside each output is the largest magnitude it stored, NaN included") {
  Owned gu = randn({5, 16}, DType::F32, "act.amax.gu", 3.0), r = randn({5, 8}, DType::F32, "act.amax.r");
  Owned y = empty({5, 8}, DType::F32, Device::CPU), dgu = empty({5, 16}, DType::F32, Device::CPU);
  Owned amax = empty({1}, DType::F32, Device::CPU);
  auto largest = [](const Tensor& t) {
    double m = 0;
    for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(get(t, i)));
    return m;
  };
  ops::swiglu_forward(gu, y, amax);
  CHECK(get(amax, 0) == largest(y));
  CHECK(largest(y) > 0);
  ops::swiglu_backward(r, gu, dgu, amax);
  CHECK(get(amax, 0) == largest(dgu));
  set(r, 11, NAN);
  ops::swiglu_backward(r, gu, dgu, amax);
  CHECK(std::isnan(get(amax, 0)));
  Owned wrong = empty({2}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::swiglu_forward(gu, y, wrong), doctest::Contains("amax has shape (2)"), Error);
}

TEST_CASE("activations reject bad arguments, naming them") {
  Owned gu = randn({3, 7}, DType::F32, "bad.gu"), y = empty({3, 3}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::swiglu_forward(gu, y, {}), doctest::Contains("2 * F"), Error);
  Owned gu8 = randn({3, 8}, DType::F32, "bad.gu8"), y5 = empty({3, 5}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::swiglu_forward(gu8, y5, {}), doctest::Contains("y has shape"), Error);
  Owned x = randn({4}, DType::F32, "bad.x"), y64 = empty({4}, DType::F64, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::gelu_forward(x, y64), doctest::Contains("y is f64"), Error);
}

TEST_CASE("gelu_erf (exact GELU): values of torch's gelu, fp64 finite differences, f32 against f64") {
  // x Phi(x) at -3, -1, -0.5, 0, 0.5, 1, 3 (the definition torch's gelu(approximate="none")
  // computes), from Python's math.erf in double.
  const double xs[] = {-3, -1, -0.5, 0, 0.5, 1, 3};
  const double ys[] = {-0.00404969409489031, -0.15865525393145707, -0.15426876936299344, 0.0,
                       0.34573123063700656, 0.8413447460685429, 2.99595030590511};
  Owned x = empty({7}, DType::F64, Device::CPU), y = empty({7}, DType::F64, Device::CPU);
  for (int i = 0; i < 7; ++i) x.ptr<double>()[i] = xs[i];
  ops::gelu_erf_forward(x, y);
  for (int i = 0; i < 7; ++i) CHECK(get(y, i) == doctest::Approx(ys[i]).epsilon(1e-13));
  for (const ActCase& c : kActCases) {
    SUBCASE(c.name().c_str()) {
      Owned xv = randn({c.t, c.f}, DType::F64, "erf.x"), r = randn({c.t, c.f}, DType::F64, "erf.r");
      Owned dx = empty(xv->shape, DType::F64, Device::CPU);
      poison(dx);
      ops::gelu_erf_backward(r, xv, dx);
      auto run = [&] {
        Owned out = empty(xv->shape, DType::F64, Device::CPU);
        ops::gelu_erf_forward(xv, out);
        return out;
      };
      CHECK_CLOSE(dx.t, numeric_grad(xv, [&] { return projection(run(), r); }).t, kGradTol);
      Owned x32 = converted(xv, DType::F32), y32 = empty(xv->shape, DType::F32, Device::CPU);
      ops::gelu_erf_forward(x32, y32);
      Owned y64 = run();
      CHECK_CLOSE(y32.t, y64.t, 1e-6);
    }
  }
}
