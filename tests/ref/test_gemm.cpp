// GEMM and sum_rows: against a direct triple loop for every transpose combination with alpha,
// beta and bias; f32 vs f64; bitwise determinism over thread counts; the gradient identities a
// linear layer uses, by fp64 finite differences; argument checks.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "ops/gemm.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

struct GemmCase {
  int64_t m, n, k;
  float alpha, beta;
  bool bias;
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " alpha " +
           std::to_string(alpha) + " beta " + std::to_string(beta) + (bias ? " bias" : "");
  }
};

// Sizes cross the blocking (64 rows per task, 256-deep chunks, 512-column blocks, 16/8-wide
// panels) and hit the edges (1, odd, K = 0).
const std::vector<GemmCase> kGemmCases = {
    {37, 53, 29, 1.f, 0.f, false},    {37, 53, 29, 0.7f, 0.3f, true},
    {1, 1, 1, 1.f, 0.f, false},       {1, 19, 7, -2.f, 0.f, true},
    {5, 3, 0, 1.f, 0.5f, true},       {67, 131, 259, -1.3f, 1.f, true},
    {129, 17, 3, 1.f, -0.25f, false}, {33, 601, 37, 0.5f, 1.f, true},
};

// Shape of an operand: (rows, cols) of op(X), transposed in memory when trans.
Shape stored(int64_t rows, int64_t cols, bool trans) {
  return trans ? Shape{cols, rows} : Shape{rows, cols};
}

// C = alpha op(A) op(B) + beta C0 + bias, by the definition, in double.
Owned naive_matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c0,
                   const GemmCase& g, const Tensor& bias) {
  Owned c = empty({g.m, g.n}, DType::F64, Device::CPU);
  Owned a64 = converted(a, DType::F64), b64 = converted(b, DType::F64);
  const double *pa = a64.ptr<double>(), *pb = b64.ptr<double>();
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      double s = 0;
      for (int64_t k = 0; k < g.k; ++k)
        s += pa[ta ? k * g.m + i : i * g.k + k] * pb[tb ? j * g.k + k : k * g.n + j];
      double v = g.alpha * s;
      if (g.beta != 0.f) v += g.beta * get(c0, i * g.n + j);
      if (g.bias) v += get(bias, j);
      c.ptr<double>()[i * g.n + j] = v;
    }
  return c;
}

}  // namespace

TEST_CASE("matmul matches the triple loop: 4 transpose combos, alpha, beta, bias, f32 and f64") {
  for (const GemmCase& g : kGemmCases) {
    SUBCASE(g.name().c_str()) {
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (DType dt : {DType::F32, DType::F64}) {
            CAPTURE(ta);
            CAPTURE(tb);
            INFO(float_name(dt));
            Owned a = randn(stored(g.m, g.k, ta), dt, "gemm.a");
            Owned b = randn(stored(g.k, g.n, tb), dt, "gemm.b");
            Owned bias = randn({g.n}, dt, "gemm.bias");
            Owned c = randn({g.m, g.n}, dt, "gemm.c");
            if (g.beta == 0.f) poison(c);  // beta = 0 must not read C
            Owned ref = naive_matmul(a, ta, b, tb, c, g, bias);
            ops::MatmulOptions opt{g.alpha, g.beta, g.bias ? bias.t : Tensor()};
            ops::matmul(a, ta, b, tb, c, opt);
            CHECK_CLOSE(c.t, ref.t, dt == DType::F64 ? 1e-14 : 1e-6);
          }
    }
  }
}

TEST_CASE("matmul with an addend equals beta on c holding it; bad addends are named") {
  for (const GemmCase& g : kGemmCases) {
    SUBCASE(g.name().c_str()) {
      Owned a = randn({g.m, g.k}, DType::F32, "gemm.a");
      Owned b = randn({g.n, g.k}, DType::F32, "gemm.b");
      Owned bias = randn({g.n}, DType::F32, "gemm.bias");
      Owned r = randn({g.m, g.n}, DType::F32, "gemm.r");
      Owned want = empty({g.m, g.n}, DType::F32, Device::CPU), got = empty({g.m, g.n}, DType::F32, Device::CPU);
      copy_tensor(want, r);
      ops::matmul(a, false, b, true, want, {g.alpha, 0.5f, g.bias ? bias.t : Tensor()});
      poison(got);
      ops::MatmulOptions o{g.alpha, 0.5f, g.bias ? bias.t : Tensor()};
      o.addend = r.t;
      ops::matmul(a, false, b, true, got, o);
      CHECK(bitwise_equal(got, want));
      copy_tensor(got, r);  // the addend may be c itself
      o.addend = got.t;
      ops::matmul(a, false, b, true, got, o);
      CHECK(bitwise_equal(got, want));
    }
  }
  Owned a = randn({4, 3}, DType::F32, "gemm.a"), b = randn({5, 3}, DType::F32, "gemm.b");
  Owned c = empty({4, 5}, DType::F32, Device::CPU), big = empty({40}, DType::F32, Device::CPU);
  ops::MatmulOptions o{1.f, 1.f, {}};
  o.addend = big->slice(0, 20).view({5, 4});
  CHECK_THROWS_WITH_AS(ops::matmul(a, false, b, true, c, o), doctest::Contains("addend is f32 (5, 4)"), Error);
  o.addend = big->slice(0, 20).view({4, 5});
  CHECK_THROWS_WITH_AS(ops::matmul(a, false, b, true, big->slice(10, 30).view({4, 5}), o),
                       doctest::Contains("addend overlaps c"), Error);
}

TEST_CASE("matmul f32 agrees with f64 on the same inputs") {
  const GemmCase g{45, 77, 263, 1.f, 0.f, true};
  Owned a64 = randn({g.m, g.k}, DType::F64, "gemm.a"),
        b64 = randn({g.n, g.k}, DType::F64, "gemm.b");
  Owned bias64 = randn({g.n}, DType::F64, "gemm.bias");
  Owned a32 = converted(a64, DType::F32), b32 = converted(b64, DType::F32);
  Owned bias32 = converted(bias64, DType::F32);
  Owned a64r = converted(a32, DType::F64), b64r = converted(b32, DType::F64);  // same inputs
  Owned bias64r = converted(bias32, DType::F64);
  Owned c32 = empty({g.m, g.n}, DType::F32, Device::CPU),
        c64 = empty({g.m, g.n}, DType::F64, Device::CPU);
  poison(c32);
  poison(c64);
  ops::matmul(a32, false, b32, true, c32, {1.f, 0.f, bias32.t});
  ops::matmul(a64r, false, b64r, true, c64, {1.f, 0.f, bias64r.t});
  CHECK_CLOSE(c32.t, c64.t, 1e-6);
}

TEST_CASE("matmul is bitwise identical on 1, 2 and 3 threads") {
  const int saved = omp_get_max_threads();
  for (DType dt : {DType::F32, DType::F64}) {
    INFO(float_name(dt));
    Owned a = randn({300, 131}, dt, "gemm.det.a"), b = randn({530, 300}, dt, "gemm.det.b");
    std::vector<Owned> results;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      Owned c = empty({131, 530}, dt, Device::CPU);
      poison(c);
      ops::matmul(a, true, b, true, c, {0.5f, 0.f, Tensor()});
      results.push_back(std::move(c));
    }
    CHECK(bitwise_equal(results[0], results[1]));
    CHECK(bitwise_equal(results[0], results[2]));
  }
  omp_set_num_threads(saved);
}

TEST_CASE("linear layer gradients from matmul and sum_rows match fp64 finite differences") {
  // y = x w^T + b, L = sum(y * R):  dx = R w,  dw += R^T x,  db += sum_rows(R)
  struct Case {
    int64_t t, in, out;
  };
  for (const Case& c : std::vector<Case>{{1, 3, 2}, {7, 5, 11}, {13, 9, 4}}) {
    SUBCASE(
        (std::to_string(c.t) + "x" + std::to_string(c.in) + "->" + std::to_string(c.out)).c_str()) {
      Owned x = randn({c.t, c.in}, DType::F64, "lin.x"),
            w = randn({c.out, c.in}, DType::F64, "lin.w");
      Owned b = randn({c.out}, DType::F64, "lin.b"), r = randn({c.t, c.out}, DType::F64, "lin.r");
      Owned y = empty({c.t, c.out}, DType::F64, Device::CPU);
      auto loss = [&] {
        ops::matmul(x, false, w, true, y, {1.f, 0.f, b.t});
        return projection(y, r);
      };
      Owned dx = empty(x->shape, DType::F64, Device::CPU);
      poison(dx);
      ops::matmul(r, false, w, false, dx, {});
      Owned dw = randn(w->shape, DType::F64, "lin.dw0"), dw0 = clone(dw);  // += onto old values
      ops::matmul(r, true, x, false, dw, {1.f, 1.f, Tensor()});
      Owned db = randn(b->shape, DType::F64, "lin.db0"), db0 = clone(db);
      ops::sum_rows(r, db, 1.f);
      Owned nx = numeric_grad(x, loss), nw = numeric_grad(w, loss), nb = numeric_grad(b, loss);
      for (int64_t i = 0; i < nw->numel(); ++i) nw.ptr<double>()[i] += dw0.ptr<double>()[i];
      for (int64_t i = 0; i < nb->numel(); ++i) nb.ptr<double>()[i] += db0.ptr<double>()[i];
      CHECK_CLOSE(dx.t, nx.t, kGradTol);
      CHECK_CLOSE(dw.t, nw.t, kGradTol);
      CHECK_CLOSE(db.t, nb.t, kGradTol);
    }
  }
}

TEST_CASE("sum_rows matches a direct column sum, beta 0 (poisoned out) and beta 1") {
  struct Case {
    int64_t m, n;
  };
  for (const Case& c : std::vector<Case>{{1, 1}, {37, 53}, {301, 517}, {0, 5}}) {
    SUBCASE((std::to_string(c.m) + "x" + std::to_string(c.n)).c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        Owned x = randn({c.m, c.n}, dt, "sum_rows.x");
        Owned out0 = randn({c.n}, dt, "sum_rows.out");
        for (float beta : {0.f, 1.f}) {
          Owned ref = empty({c.n}, DType::F64, Device::CPU);
          for (int64_t j = 0; j < c.n; ++j) {
            double s = beta * get(out0, j);
            for (int64_t i = 0; i < c.m; ++i) s += get(x, i * c.n + j);
            ref.ptr<double>()[j] = s;
          }
          Owned out = clone(out0);
          if (beta == 0.f) poison(out);
          ops::sum_rows(x, out, beta);
          CHECK_CLOSE(out.t, ref.t, dt == DType::F64 ? 1e-14 : 1e-7);
        }
      }
    }
  }
}

TEST_CASE("matmul and sum_rows reject bad arguments, naming them") {
  Owned a = randn({4, 5}, DType::F32, "bad.a"), b = randn({6, 3}, DType::F32, "bad.b");
  Owned c = empty({4, 3}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::matmul(a, false, b, false, c, {}), doctest::Contains("inner dimensions"),
                       Error);
  Owned b64 = randn({5, 3}, DType::F64, "bad.b64");
  CHECK_THROWS_WITH_AS(ops::matmul(a, false, b64, false, c, {}), doctest::Contains("b (must match a)"),
                       Error);
  Owned b5 = randn({5, 3}, DType::F32, "bad.b5"), bias = randn({4}, DType::F32, "bad.bias");
  CHECK_THROWS_WITH_AS(ops::matmul(a, false, b5, false, c, {1.f, 0.f, bias.t}),
                       doctest::Contains("bias"), Error);
  Owned c_wrong = empty({3, 4}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::matmul(a, false, b5, false, c_wrong, {}), doctest::Contains("c has shape"),
                       Error);
  Owned x16 = empty({4, 5}, DType::BF16, Device::CPU), o16 = empty({5}, DType::BF16, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::sum_rows(x16, o16, 0.f), doctest::Contains("f32 or f64"), Error);
  // A tensor that claims to live on the GPU (never dereferenced): the dispatch refuses the mix.
  Tensor fake_gpu(c->data, DType::F32, Device::CUDA, {4, 3});
  CHECK_THROWS_WITH_AS(ops::matmul(a, false, b5, false, fake_gpu, {}),
                       doctest::Contains("share a device"), Error);
}

TEST_CASE("matmul GELU epilogues equal the separate ops: gelu (+ saved input), dgelu (+ bias gradient)") {
  const int64_t m = 11, n = 13, k = 7;
  Owned a = randn({m, k}, DType::F64, "ep.a"), b = randn({n, k}, DType::F64, "ep.b");
  Owned bias = randn({n}, DType::F64, "ep.bias"), h = randn({m, n}, DType::F64, "ep.h");
  // forward: c = gelu(a b^T + bias), pre saved
  Owned c = empty({m, n}, DType::F64, Device::CPU), pre = empty({m, n}, DType::F64, Device::CPU);
  ops::MatmulOptions o;
  o.bias = bias;
  o.gelu = true;
  o.gelu_input = pre;
  ops::matmul(a, false, b, true, c, o);
  Owned want_pre = empty({m, n}, DType::F64, Device::CPU), want = empty({m, n}, DType::F64, Device::CPU);
  ops::matmul(a, false, b, true, want_pre, {1.f, 0.f, bias});
  ops::gelu_forward(want_pre, want);
  CHECK(bitwise_equal(pre, want_pre));
  CHECK(bitwise_equal(c, want));
  // backward: c = (0.5 a b^T) * gelu'(h), dbias = column sums
  ops::MatmulOptions d;
  d.alpha = 0.5f;
  d.dgelu_input = h;
  Owned db = empty({n}, DType::F64, Device::CPU), want_db = empty({n}, DType::F64, Device::CPU);
  d.dbias = db;
  ops::matmul(a, false, b, true, c, d);
  Owned g = empty({m, n}, DType::F64, Device::CPU);
  ops::matmul(a, false, b, true, g, {0.5f, 0.f, {}});
  ops::gelu_backward(g, h, want);
  ops::sum_rows(want, want_db, 0.f);
  CHECK(bitwise_equal(c, want));
  CHECK(bitwise_equal(db, want_db));
  // what the epilogues do not take
  d.beta = 1.f;
  CHECK_THROWS_WITH(ops::matmul(a, false, b, true, c, d), doctest::Contains("beta == 0"));
  ops::MatmulOptions e;
  e.dbias = db;
  CHECK_THROWS_WITH(ops::matmul(a, false, b, true, c, e), doctest::Contains("needs dgelu_input"));
  ops::MatmulOptions f;
  f.gelu_input = pre;
  CHECK_THROWS_WITH(ops::matmul(a, false, b, true, c, f), doctest::Contains("gelu is false"));
}
