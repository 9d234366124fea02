// Rotary embedding: against the rotate-half formula written out here, forward then backward is
// the identity, rotated q . k depends only on the position difference, heads past
// rotated_heads stay bit-identical, backward vs fp64 finite differences, f32 vs f64, checks.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/rope.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

struct RopeCase {
  int64_t t, heads, rotated, dim;
  float theta;
  int max_pos;
  std::string name() const {
    return "T" + std::to_string(t) + " NH" + std::to_string(heads) + " rot" +
           std::to_string(rotated) + " D" + std::to_string(dim) + " theta " +
           std::to_string(static_cast<int>(theta));
  }
};
const std::vector<RopeCase> kRopeCases = {
    {1, 1, 1, 2, 10000.f, 5},      {5, 3, 2, 6, 10000.f, 7}, {7, 4, 4, 10, 500000.f, 100},
    {3, 10, 8, 64, 10000.f, 4096}, {6, 5, 0, 6, 10000.f, 9},
};

// Positions restarting like packed documents: random in [0, max_pos).
Owned positions_for(const RopeCase& c) { return randint({c.t}, 0, c.max_pos, "rope.pos"); }

}  // namespace

TEST_CASE("rope forward matches the rotate-half formula and leaves other heads untouched") {
  for (const RopeCase& c : kRopeCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned x = randn({c.t, c.heads, c.dim}, dt, "rope.x"), pos = positions_for(c);
        Owned ref = converted(x, DType::F64);
        const int64_t half = c.dim / 2;
        for (int64_t t = 0; t < c.t; ++t)
          for (int64_t h = 0; h < c.rotated; ++h)
            for (int64_t i = 0; i < half; ++i) {
              const double angle =
                  pos.ptr<int32_t>()[t] * std::pow(double(c.theta), -2.0 * i / c.dim);
              const int64_t base = (t * c.heads + h) * c.dim;
              const double a = get(x, base + i), b = get(x, base + i + half);
              ref.ptr<double>()[base + i] = a * std::cos(angle) - b * std::sin(angle);
              ref.ptr<double>()[base + i + half] = b * std::cos(angle) + a * std::sin(angle);
            }
        Owned x0 = clone(x);
        ops::rope_forward(x, pos, static_cast<int>(c.rotated), c.theta);
        CHECK_CLOSE(x.t, ref.t, dt == DType::F64 ? 1e-14 : 2e-7);
        const int64_t row = c.heads * c.dim;
        bool untouched = true;
        for (int64_t t = 0; t < c.t; ++t)
          for (int64_t j = c.rotated * c.dim; j < row; ++j)
            untouched = untouched && get(x, t * row + j) == get(x0, t * row + j);
        CHECK(untouched);
      }
    }
  }
}

TEST_CASE("rope backward undoes forward (identity) and matches fp64 finite differences") {
  for (const RopeCase& c : kRopeCases) {
    SUBCASE(c.name().c_str()) {
      Owned x = randn({c.t, c.heads, c.dim}, DType::F64, "rope.x"), pos = positions_for(c);
      Owned y = clone(x);
      ops::rope_forward(y, pos, static_cast<int>(c.rotated), c.theta);
      ops::rope_backward(y, pos, static_cast<int>(c.rotated), c.theta);
      CHECK_CLOSE(y.t, x.t, 1e-14);
      Owned r = randn(x->shape, DType::F64, "rope.r"), dx = clone(r);
      ops::rope_backward(dx, pos, static_cast<int>(c.rotated), c.theta);
      auto loss = [&] {
        Owned out = clone(x);
        ops::rope_forward(out, pos, static_cast<int>(c.rotated), c.theta);
        return projection(out, r);
      };
      CHECK_CLOSE(dx.t, numeric_grad(x, loss).t, kGradTol);
    }
  }
}

TEST_CASE("rope: rotated q . k depends only on the position difference") {
  // Rows 0, 1 hold q at p and k at p'; rows 2, 3 the same vectors at p + s and p' + s.
  for (int64_t dim : {6, 10, 64}) {
    CAPTURE(dim);
    Owned qk = randn({2, 1, dim}, DType::F64, "rope.qk");
    Owned x = empty({4, 1, dim}, DType::F64, Device::CPU),
          pos = empty({4}, DType::I32, Device::CPU);
    for (int64_t i = 0; i < 4 * dim; ++i) set(x, i, get(qk, i % (2 * dim)));
    Owned pq = randint({3}, 0, 2000, "rope.shift");
    const int32_t p = pq.ptr<int32_t>()[0], p2 = pq.ptr<int32_t>()[1], s = pq.ptr<int32_t>()[2];
    for (int32_t i : {0, 1, 2, 3}) pos.ptr<int32_t>()[i] = (i % 2 ? p2 : p) + (i >= 2 ? s : 0);
    ops::rope_forward(x, pos, 1, 10000.f);
    double d01 = 0, d23 = 0;
    for (int64_t j = 0; j < dim; ++j) {
      d01 += get(x, j) * get(x, dim + j);
      d23 += get(x, 2 * dim + j) * get(x, 3 * dim + j);
    }
    CHECK(d23 == doctest::Approx(d01).epsilon(1e-10));
  }
}

TEST_CASE("rope f32 agrees with f64") {
  const RopeCase c{9, 6, 4, 10, 10000.f, 300};
  Owned x32 = randn({c.t, c.heads, c.dim}, DType::F32, "rope.x"), pos = positions_for(c);
  Owned x64 = converted(x32, DType::F64);
  ops::rope_forward(x32, pos, 4, c.theta);
  ops::rope_forward(x64, pos, 4, c.theta);
  CHECK_CLOSE(x32.t, x64.t, 2e-7);
  ops::rope_backward(x32, pos, 4, c.theta);
  ops::rope_backward(x64, pos, 4, c.theta);
  CHECK_CLOSE(x32.t, x64.t, 2e-7);
}

TEST_CASE("rope rejects bad arguments, naming them") {
  Owned x = randn({3, 2, 5}, DType::F32, "bad.x"), pos = randint({3}, 0, 9, "bad.pos");
  CHECK_THROWS_WITH_AS(ops::rope_forward(x, pos, 1, 10000.f), doctest::Contains("even"), Error);
  Owned x6 = randn({3, 2, 6}, DType::F32, "bad.x6");
  CHECK_THROWS_WITH_AS(ops::rope_forward(x6, pos, 3, 10000.f), doctest::Contains("rotated_heads"),
                       Error);
  Owned pos4 = randint({4}, 0, 9, "bad.pos4");
  CHECK_THROWS_WITH_AS(ops::rope_backward(x6, pos4, 1, 10000.f), doctest::Contains("positions"),
                       Error);
}
