// Per-head q/k RMSNorm (ops/qk_norm.h): forward against the formula written out here (v heads
// untouched, the input saved), backward against fp64 finite differences of x and both weights,
// f32 against f64, argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/qk_norm.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

struct QkCase {
  int64_t t, q, k, v, dim;
  std::string name() const {
    return "T" + std::to_string(t) + " q" + std::to_string(q) + " k" + std::to_string(k) + " v" +
           std::to_string(v) + " D" + std::to_string(dim);
  }
};
const std::vector<QkCase> kCases = {{1, 1, 1, 1, 2}, {5, 4, 2, 2, 6}, {3, 2, 1, 1, 7}, {4, 3, 3, 0, 16}, {2, 0, 2, 1, 4}};
constexpr float kEps = 1e-6f;

// The weight (2, D) near 1, as trained norms are.
Owned weight_for(const QkCase& c, DType dt) {
  Owned w = randn({2, c.dim}, dt, "qk.w", 0.3);
  for (int64_t i = 0; i < w->numel(); ++i) set(w, i, 1.0 + get(w, i));
  return w;
}

}  // namespace

TEST_CASE("qk_norm forward matches the per-head rmsnorm formula and leaves v heads untouched") {
  for (const QkCase& c : kCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        const int64_t NH = c.q + c.k + c.v, N = c.q + c.k;
        Owned x = randn({c.t, NH, c.dim}, dt, "qk.x"), w = weight_for(c, dt);
        Owned x0 = clone(x), ref = converted(x, DType::F64), ref_rstd = empty({c.t, N}, DType::F64, Device::CPU);
        for (int64_t t = 0; t < c.t; ++t)
          for (int64_t h = 0; h < N; ++h) {
            const int64_t base = (t * NH + h) * c.dim;
            double ss = 0;
            for (int64_t j = 0; j < c.dim; ++j) ss += get(x, base + j) * get(x, base + j);
            const double rs = 1.0 / std::sqrt(ss / c.dim + kEps);
            set(ref_rstd, t * N + h, rs);
            for (int64_t j = 0; j < c.dim; ++j)
              set(ref, base + j, get(x, base + j) * rs * get(w, (h < c.q ? 0 : c.dim) + j));
          }
        Owned in = empty({c.t, N, c.dim}, dt, Device::CPU), rstd = empty({c.t, N}, dt, Device::CPU);
        poison(in);
        poison(rstd);
        ops::qk_norm_forward(x, w, static_cast<int>(c.q), kEps, in, rstd);
        const double tol = dt == DType::F64 ? 1e-14 : 3e-7;
        CHECK_CLOSE(x.t, ref.t, tol);
        CHECK_CLOSE(rstd.t, ref_rstd.t, tol);
        bool saved = true, untouched = true;
        for (int64_t t = 0; t < c.t; ++t)
          for (int64_t h = 0; h < NH; ++h)
            for (int64_t j = 0; j < c.dim; ++j) {
              const int64_t i = (t * NH + h) * c.dim + j;
              if (h < N) saved = saved && get(in, (t * N + h) * c.dim + j) == get(x0, i);
              else untouched = untouched && get(x, i) == get(x0, i);
            }
        CHECK(saved);
        CHECK(untouched);
      }
    }
  }
}

TEST_CASE("qk_norm backward matches fp64 finite differences of x and both weights") {
  for (const QkCase& c : kCases) {
    SUBCASE(c.name().c_str()) {
      const int64_t NH = c.q + c.k + c.v, N = c.q + c.k;
      Owned x = randn({c.t, NH, c.dim}, DType::F64, "qk.x"), w = weight_for(c, DType::F64);
      Owned r = randn(x->shape, DType::F64, "qk.r");
      auto loss = [&] {
        Owned out = clone(x), in = empty({c.t, N, c.dim}, DType::F64, Device::CPU),
              rstd = empty({c.t, N}, DType::F64, Device::CPU);
        ops::qk_norm_forward(out, w, static_cast<int>(c.q), kEps, in, rstd);
        return projection(out, r);
      };
      Owned y = clone(x), in = empty({c.t, N, c.dim}, DType::F64, Device::CPU),
            rstd = empty({c.t, N}, DType::F64, Device::CPU);
      ops::qk_norm_forward(y, w, static_cast<int>(c.q), kEps, in, rstd);
      Owned dx = clone(r), dw = randn({2, c.dim}, DType::F64, "qk.dw0"), dw0 = clone(dw);
      ops::qk_norm_backward(dx, in, w, static_cast<int>(c.q), rstd, dw);
      CHECK_CLOSE(dx.t, numeric_grad(x, loss).t, kGradTol);
      Owned ndw = numeric_grad(w, loss);
      for (int64_t i = 0; i < ndw->numel(); ++i) set(ndw, i, get(ndw, i) + get(dw0, i));  // accumulated (+=)
      CHECK_CLOSE(dw.t, ndw.t, kGradTol);
    }
  }
}

TEST_CASE("qk_norm f32 agrees with f64") {
  const QkCase c{9, 4, 2, 2, 10};
  const int64_t NH = c.q + c.k + c.v, N = c.q + c.k;
  auto run = [&](DType dt, Owned& x, Owned& dx, Owned& dw) {
    x = converted(randn({c.t, NH, c.dim}, DType::F64, "qk.x"), dt);
    Owned w = weight_for(c, dt), in = empty({c.t, N, c.dim}, dt, Device::CPU), rstd = empty({c.t, N}, dt, Device::CPU);
    ops::qk_norm_forward(x, w, static_cast<int>(c.q), kEps, in, rstd);
    dx = converted(randn(x->shape, DType::F64, "qk.r"), dt);
    dw = zeros({2, c.dim}, dt, Device::CPU);
    ops::qk_norm_backward(dx, in, w, static_cast<int>(c.q), rstd, dw);
  };
  Owned x32, dx32, dw32, x64, dx64, dw64;
  run(DType::F32, x32, dx32, dw32);
  run(DType::F64, x64, dx64, dw64);
  CHECK_CLOSE(x32.t, x64.t, 3e-7);
  CHECK_CLOSE(dx32.t, dx64.t, 3e-7);
  CHECK_CLOSE(dw32.t, dw64.t, 3e-7);
}

TEST_CASE("qk_norm rejects bad arguments, naming them") {
  Owned x = randn({3, 4, 6}, DType::F32, "bad.x"), w = randn({2, 6}, DType::F32, "bad.w");
  Owned in = empty({3, 3, 6}, DType::F32, Device::CPU), rstd = empty({3, 3}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::qk_norm_forward(x, w, 4, kEps, in, rstd), doctest::Contains("q_heads"), Error);
  Owned in2 = empty({3, 2, 6}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::qk_norm_forward(x, w, 2, kEps, in2, rstd), doctest::Contains("input"), Error);
  Owned w5 = randn({2, 5}, DType::F32, "bad.w5");
  CHECK_THROWS_WITH_AS(ops::qk_norm_forward(x, w5, 2, kEps, in, rstd), doctest::Contains("weight"), Error);
  Owned rstd64 = empty({3, 3}, DType::F64, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::qk_norm_forward(x, w, 2, kEps, in, rstd64), doctest::Contains("rstd"), Error);
  Owned dw = empty({6}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::qk_norm_backward(x, in, w, 2, rstd, dw), doctest::Contains("dweight"), Error);
  CHECK_THROWS_WITH_AS(ops::qk_norm_forward(x, w, 2, -1.f, in, rstd), doctest::Contains("eps"), Error);
  Owned x3 = randn({3, 3, 6}, DType::F32, "bad.x3");
  CHECK_THROWS_WITH_AS(ops::qk_norm_forward(x3, w, 2, kEps, x3, rstd), doctest::Contains("alias"), Error);
}
