// layernorm and rmsnorm: forward and statistics against the direct formulas, backward against
// fp64 finite differences of L = sum(y * R) (dx written, dweight and dbias accumulated), f32 vs
// f64, and argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/elementwise.h"
#include "ops/norm.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

struct NormCase {
  int64_t t, c;
  std::string name() const { return std::to_string(t) + "x" + std::to_string(c); }
};
// Odd sizes, one row, two columns, and more columns than one parameter-gradient chunk (256).
const std::vector<NormCase> kNormCases = {{1, 7}, {5, 13}, {17, 33}, {3, 2}, {4, 301}};
constexpr float kEps = 1e-5f;
// The gradient checks use a larger eps: with C = 2 a layernorm row is +-1 whatever x, and the
// gradient with respect to x flows only through eps (1e-5 would leave it at the level of the
// finite-difference rounding).
constexpr float kGradEps = 1e-2f;

struct NormOut {
  Owned y, mean, rstd;
};

// y, mean and rstd for x, poisoned.
NormOut poisoned_out(const Tensor& x) {
  const int64_t t = x.size(0);
  NormOut o{empty(x.shape, x.dtype, Device::CPU), empty({t}, x.dtype, Device::CPU),
            empty({t}, x.dtype, Device::CPU)};
  poison(o.y);
  poison(o.mean);
  poison(o.rstd);
  return o;
}

NormOut run_forward(bool layer, const Tensor& x, const Tensor& w, const Tensor& b,
                    float eps = kEps) {
  NormOut o = poisoned_out(x);
  if (layer)
    ops::layernorm_forward(x, w, b, eps, o.y, o.mean, o.rstd, {});
  else
    ops::rmsnorm_forward(x, w, eps, o.y, o.rstd, {});
  return o;
}

// Direct formulas in double: y, mean (layernorm), rstd.
NormOut direct(bool layer, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t t = x.size(0), c = x.size(1);
  NormOut o{empty(x.shape, DType::F64, Device::CPU), empty({t}, DType::F64, Device::CPU),
            empty({t}, DType::F64, Device::CPU)};
  for (int64_t r = 0; r < t; ++r) {
    double mean = 0, var = 0;
    if (layer) {
      for (int64_t j = 0; j < c; ++j) mean += get(x, r * c + j) / c;
    }
    for (int64_t j = 0; j < c; ++j) var += std::pow(get(x, r * c + j) - mean, 2) / c;
    const double rstd = 1 / std::sqrt(var + kEps);
    for (int64_t j = 0; j < c; ++j)
      o.y.ptr<double>()[r * c + j] =
          (get(x, r * c + j) - mean) * rstd * get(w, j) + (layer ? get(b, j) : 0.0);
    o.mean.ptr<double>()[r] = mean;
    o.rstd.ptr<double>()[r] = rstd;
  }
  return o;
}

void check_forward(bool layer) {
  for (const NormCase& nc : kNormCases) {
    SUBCASE(nc.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned x = randn({nc.t, nc.c}, dt, "norm.x", 2.0);
        for (int64_t i = 0; i < x->numel(); ++i) set(x, i, get(x, i) + 0.5);  // nonzero mean
        Owned w = randn({nc.c}, dt, "norm.w"), b = randn({nc.c}, dt, "norm.b");
        NormOut got = run_forward(layer, x, w, b), ref = direct(layer, x, w, b);
        const double tol = dt == DType::F64 ? 1e-13 : 1e-6;
        CHECK_CLOSE(got.y.t, ref.y.t, tol);
        CHECK_CLOSE(got.rstd.t, ref.rstd.t, tol);
        if (layer) {  // a row mean can be ~0: measure its error against the size of x
          Comparison cm = compare(got.mean, ref.mean, "mean");
          INFO(cm.report);
          CHECK(cm.nonfinite == 0);
          CHECK(cm.rel_rms * cm.scale <= tol * std::sqrt(sum_squares_of(x) / x->numel()));
        }
        // Statistics of the normalised rows: with w = 1, b = 0 each row has mean 0 (layernorm)
        // and mean square var / (var + eps).
        Owned ones = empty({nc.c}, dt, Device::CPU), zeros_b = zeros({nc.c}, dt, Device::CPU);
        for (int64_t j = 0; j < nc.c; ++j) set(ones, j, 1.0);
        NormOut unit = run_forward(layer, x, ones, zeros_b);
        for (int64_t r = 0; r < nc.t; ++r) {
          double m = 0, ms = 0;
          for (int64_t j = 0; j < nc.c; ++j) {
            m += get(unit.y, r * nc.c + j) / nc.c;
            ms += std::pow(get(unit.y, r * nc.c + j), 2) / nc.c;
          }
          const double rs = get(ref.rstd, r), var = 1 / (rs * rs) - kEps;
          if (layer) CHECK(std::fabs(m) < 1e-5);
          CHECK(ms == doctest::Approx(var / (var + kEps)).epsilon(1e-5));
        }
      }
    }
  }
}

void check_backward(bool layer) {
  for (const NormCase& nc : kNormCases) {
    SUBCASE(nc.name().c_str()) {
      const DType dt = DType::F64;
      Owned x = randn({nc.t, nc.c}, dt, "norm.x");
      Owned w = randn({nc.c}, dt, "norm.w"), b = randn({nc.c}, dt, "norm.b");
      Owned r = randn({nc.t, nc.c}, dt, "norm.r");
      auto loss = [&] { return projection(run_forward(layer, x, w, b, kGradEps).y, r); };
      NormOut fwd = run_forward(layer, x, w, b, kGradEps);
      Owned dx = empty(x->shape, dt, Device::CPU);
      poison(dx);
      Owned dw = randn({nc.c}, dt, "norm.dw0"), db = randn({nc.c}, dt, "norm.db0");
      Owned dw0 = clone(dw), db0 = clone(db);  // backward accumulates onto these
      if (layer)
        ops::layernorm_backward(r, x, w, fwd.mean, fwd.rstd, dx, dw, db);
      else
        ops::rmsnorm_backward(r, x, w, fwd.rstd, dx, dw);
      Owned nx = numeric_grad(x, loss), nw = numeric_grad(w, loss), nb = numeric_grad(b, loss);
      for (int64_t j = 0; j < nc.c; ++j) {
        nw.ptr<double>()[j] += get(dw0, j);
        nb.ptr<double>()[j] += get(db0, j);
      }
      CHECK_CLOSE(dx.t, nx.t, kGradTol);
      CHECK_CLOSE(dw.t, nw.t, kGradTol);
      if (layer) CHECK_CLOSE(db.t, nb.t, kGradTol);
      if (!layer) CHECK(bitwise_equal(db, db0));  // rmsnorm has no bias
    }
  }
}

// f32 on f32-rounded inputs vs f64 on the same values, forward and backward.
void check_f32_vs_f64(bool layer) {
  const int64_t t = 9, c = 45;
  Owned x32 = randn({t, c}, DType::F32, "norm.x"), w32 = randn({c}, DType::F32, "norm.w");
  Owned b32 = randn({c}, DType::F32, "norm.b"), r32 = randn({t, c}, DType::F32, "norm.r");
  Owned x64 = converted(x32, DType::F64), w64 = converted(w32, DType::F64);
  Owned b64 = converted(b32, DType::F64), r64 = converted(r32, DType::F64);
  NormOut f32 = run_forward(layer, x32, w32, b32), f64 = run_forward(layer, x64, w64, b64);
  CHECK_CLOSE(f32.y.t, f64.y.t, 1e-6);
  CHECK_CLOSE(f32.rstd.t, f64.rstd.t, 1e-6);
  Owned dx32 = empty({t, c}, DType::F32, Device::CPU),
        dx64 = empty({t, c}, DType::F64, Device::CPU);
  Owned dw32 = zeros({c}, DType::F32, Device::CPU), dw64 = zeros({c}, DType::F64, Device::CPU);
  Owned db32 = zeros({c}, DType::F32, Device::CPU), db64 = zeros({c}, DType::F64, Device::CPU);
  if (layer) {
    ops::layernorm_backward(r32, x32, w32, f32.mean, f32.rstd, dx32, dw32, db32);
    ops::layernorm_backward(r64, x64, w64, f64.mean, f64.rstd, dx64, dw64, db64);
  } else {
    ops::rmsnorm_backward(r32, x32, w32, f32.rstd, dx32, dw32);
    ops::rmsnorm_backward(r64, x64, w64, f64.rstd, dx64, dw64);
  }
  CHECK_CLOSE(dx32.t, dx64.t, 1e-6);
  CHECK_CLOSE(dw32.t, dw64.t, 1e-6);
  CHECK_CLOSE(db32.t, db64.t, 1e-6);
}

}  // namespace

TEST_CASE("layernorm forward and statistics match the direct formula") { check_forward(true); }
TEST_CASE("rmsnorm forward and statistics match the direct formula") { check_forward(false); }
TEST_CASE("layernorm backward matches fp64 finite differences (dx =, dweight/dbias +=)") {
  check_backward(true);
}
TEST_CASE("rmsnorm backward matches fp64 finite differences (dx =, dweight +=)") {
  check_backward(false);
}
TEST_CASE("layernorm f32 agrees with f64") { check_f32_vs_f64(true); }
TEST_CASE("rmsnorm f32 agrees with f64") { check_f32_vs_f64(false); }

TEST_CASE("norms reject bad arguments, naming them") {
  Owned x = randn({3, 5}, DType::F32, "bad.x"), w = randn({5}, DType::F32, "bad.w");
  Owned w4 = randn({4}, DType::F32, "bad.w4"), y = empty({3, 5}, DType::F32, Device::CPU);
  Owned rstd = empty({3}, DType::F32, Device::CPU), rstd64 = empty({3}, DType::F64, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_forward(x, w4, kEps, y, rstd, {}), doctest::Contains("weight"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_forward(x, w, kEps, y, rstd64, {}),
                       doctest::Contains("rstd is f64"), Error);
  Owned mean2 = empty({2}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::layernorm_forward(x, w, w, kEps, y, mean2, rstd, {}),
                       doctest::Contains("mean has shape"), Error);
}

// ---- residual forms ---------------------------------------------------------------------------
// *_residual_forward / *_residual_backward against ops::add / add_inplace and the plain forms,
// bitwise (the reference rounds the sum and dx exactly as the separate ops do), including the
// aliases the header allows: sum over x, y over residual, dx over dresidual.

namespace {

void residual_forward(bool layer, const Tensor& x, const Tensor& r, const Tensor& w,
                      const Tensor& b, const Tensor& sum, const Tensor& y, const NormOut& stats) {
  if (layer)
    ops::layernorm_residual_forward(x, r, w, b, kEps, sum, y, stats.mean, stats.rstd, {});
  else
    ops::rmsnorm_residual_forward(x, r, w, kEps, sum, y, stats.rstd, {});
}

void plain_backward(bool layer, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const NormOut& f, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  if (layer)
    ops::layernorm_backward(dy, x, w, f.mean, f.rstd, dx, dw, db);
  else
    ops::rmsnorm_backward(dy, x, w, f.rstd, dx, dw);
}

void residual_backward(bool layer, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const NormOut& f, const Tensor& dres, const Tensor& dx, const Tensor& dw,
                       const Tensor& db) {
  if (layer)
    ops::layernorm_residual_backward(dy, x, w, f.mean, f.rstd, dres, dx, dw, db, Tensor());
  else
    ops::rmsnorm_residual_backward(dy, x, w, f.rstd, dres, dx, dw, Tensor());
}

void check_residual_forms(bool layer, bool with_bias) {
  std::vector<NormCase> cases = kNormCases;
  cases.push_back({130, 257});  // above the rows-in-parallel threshold
  for (const NormCase& nc : cases) {
    SUBCASE(nc.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned x = randn({nc.t, nc.c}, dt, "normres.x", 2.0);
        Owned r = randn({nc.t, nc.c}, dt, "normres.r");
        for (int64_t i = 0; i < r->numel(); ++i) set(r, i, get(r, i) + 0.3);
        Owned w = randn({nc.c}, dt, "normres.w"), b = randn({nc.c}, dt, "normres.b");
        const Tensor bias = with_bias ? b.t : Tensor();

        // Separate: sum = x + r, then the plain norm of sum.
        Owned sum_sep = empty(x->shape, dt, Device::CPU);
        ops::add(x, r, sum_sep);
        NormOut sep = run_forward(layer, sum_sep, w, bias);

        NormOut fused = poisoned_out(x);
        Owned sum = empty(x->shape, dt, Device::CPU);
        poison(sum);
        residual_forward(layer, x, r, w, bias, sum, fused.y, fused);
        CHECK(bitwise_equal(sum, sum_sep));
        CHECK(bitwise_equal(fused.y, sep.y));
        CHECK(bitwise_equal(fused.rstd, sep.rstd));
        if (layer) CHECK(bitwise_equal(fused.mean, sep.mean));

        // In place: sum over x, y over the residual.
        Owned xa = clone(x), ra = clone(r);
        NormOut alias = poisoned_out(x);
        residual_forward(layer, xa, ra, w, bias, xa, ra, alias);
        CHECK(bitwise_equal(xa, sum_sep));
        CHECK(bitwise_equal(ra, sep.y));

        // Backward: dx = norm backward + dresidual; dweight, dbias accumulate onto prefills.
        Owned dy = randn({nc.t, nc.c}, dt, "normres.dy"), dres = randn({nc.t, nc.c}, dt, "normres.dres");
        Owned dw0 = randn({nc.c}, dt, "normres.dw0"), db0 = randn({nc.c}, dt, "normres.db0");
        Owned dx_sep = empty(x->shape, dt, Device::CPU), dw_sep = clone(dw0), db_sep = clone(db0);
        plain_backward(layer, dy, sum_sep, w, sep, dx_sep, dw_sep, with_bias ? db_sep.t : Tensor());
        ops::add_inplace(dx_sep, dres);

        Owned dx = empty(x->shape, dt, Device::CPU), dwf = clone(dw0), dbf = clone(db0);
        poison(dx);
        residual_backward(layer, dy, sum_sep, w, sep, dres, dx, dwf, with_bias ? dbf.t : Tensor());
        CHECK(bitwise_equal(dx, dx_sep));
        CHECK(bitwise_equal(dwf, dw_sep));
        CHECK(bitwise_equal(dbf, db_sep));

        Owned dxa = clone(dres), dwa = clone(dw0), dba = clone(db0);  // dx over dresidual
        residual_backward(layer, dy, sum_sep, w, sep, dxa, dxa, dwa, with_bias ? dba.t : Tensor());
        CHECK(bitwise_equal(dxa, dx_sep));
        CHECK(bitwise_equal(dwa, dw_sep));
      }
    }
  }
}

}  // namespace

TEST_CASE("layernorm residual forms are bitwise the separate add and layernorm (with bias)") {
  check_residual_forms(true, true);
}
TEST_CASE("layernorm residual forms are bitwise the separate add and layernorm (without bias)") {
  check_residual_forms(true, false);
}
TEST_CASE("rmsnorm residual forms are bitwise the separate add and rmsnorm") {
  check_residual_forms(false, false);
}

TEST_CASE("norm residual forms reject bad arguments, naming them") {
  Owned x = randn({3, 5}, DType::F32, "bad.x"), w = randn({5}, DType::F32, "bad.w");
  Owned y = empty({3, 5}, DType::F32, Device::CPU), sum = empty({3, 5}, DType::F32, Device::CPU);
  Owned r4 = empty({3, 4}, DType::F32, Device::CPU), r64 = empty({3, 5}, DType::F64, Device::CPU);
  Owned rstd = empty({3}, DType::F32, Device::CPU), mean = empty({3}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_residual_forward(x, r4, w, kEps, sum, y, rstd, {}),
                       doctest::Contains("residual"), Error);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_residual_forward(x, r64, w, kEps, sum, y, rstd, {}),
                       doctest::Contains("residual is f64"), Error);
  CHECK_THROWS_WITH_AS(ops::layernorm_residual_forward(x, x, w, Tensor(), kEps, r4, y, mean, rstd, {}),
                       doctest::Contains("sum"), Error);
  CHECK_THROWS_WITH_AS(ops::layernorm_residual_forward(x, x, w, Tensor(), kEps, y, y, mean, rstd, {}),
                       doctest::Contains("y must not alias sum"), Error);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_residual_forward(x, Tensor(), w, kEps, sum, y, rstd, {}),
                       doctest::Contains("residual and sum must be given"), Error);
  Owned dw = zeros({5}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_residual_backward(x, x, w, rstd, r4, y, dw, Tensor()),
                       doctest::Contains("dresidual"), Error);
  CHECK_THROWS_WITH_AS(ops::layernorm_residual_backward(x, x, w, mean, rstd, Tensor(), y, dw, Tensor(), Tensor()),
                       doctest::Contains("dresidual must be given"), Error);
}

TEST_CASE("norm forwards: the amax beside y is its largest magnitude as stored") {
  Owned x = randn({6, 10}, DType::F32, "norm.amax.x", 2.0), r = randn({6, 10}, DType::F32, "norm.amax.r");
  Owned w = randn({10}, DType::F32, "norm.amax.w"), b = randn({10}, DType::F32, "norm.amax.b");
  Owned y = empty({6, 10}, DType::F32, Device::CPU), sum = empty({6, 10}, DType::F32, Device::CPU);
  Owned mean = empty({6}, DType::F32, Device::CPU), rstd = empty({6}, DType::F32, Device::CPU);
  Owned amax = empty({1}, DType::F32, Device::CPU);
  auto largest = [&] {
    double m = 0;
    for (int64_t i = 0; i < y->numel(); ++i) m = std::max(m, std::fabs(get(y, i)));
    return m;
  };
  ops::rmsnorm_forward(x, w, 1e-5f, y, rstd, amax);
  CHECK(get(amax, 0) == largest());
  ops::layernorm_forward(x, w, b, 1e-5f, y, mean, rstd, amax);
  CHECK(get(amax, 0) == largest());
  ops::rmsnorm_residual_forward(x, r, w, 1e-5f, sum, y, rstd, amax);
  CHECK(get(amax, 0) == largest());
  ops::layernorm_residual_forward(x, r, w, b, 1e-5f, sum, y, mean, rstd, amax);
  CHECK(get(amax, 0) == largest());
  CHECK(largest() > 0);
  Owned wrong = empty({1}, DType::F64, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_forward(x, w, 1e-5f, y, rstd, wrong), doctest::Contains("amax is f64"), Error);
}
