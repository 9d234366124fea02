// Embedding: forward (= and +=) against a direct gather, backward with duplicate ids against a
// direct scatter-add and fp64 finite differences, bitwise determinism over thread counts, and an
// out-of-range id reported with its token position before anything is written.
#include <doctest/doctest.h>
#include <omp.h>

#include <string>
#include <vector>

#include "ops/embedding.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

constexpr ops::IdCheck kRaise = ops::IdCheck::kRaise;  // an id out of range raises

struct EmbCase {
  int64_t t, vocab, c;
  std::string name() const {
    return "T" + std::to_string(t) + " V" + std::to_string(vocab) + " C" + std::to_string(c);
  }
};
// Vocab smaller than T forces duplicate ids; C > 256 crosses the backward's column chunks.
const std::vector<EmbCase> kEmbCases = {
    {1, 1, 1}, {17, 5, 7}, {9, 31, 40}, {0, 3, 4}, {23, 4, 257}};

}  // namespace

TEST_CASE("embedding forward gathers rows (= and +=), f32 and f64") {
  for (const EmbCase& e : kEmbCases) {
    SUBCASE(e.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned ids = randint({e.t}, 0, e.vocab, "emb.ids");
        Owned table = randn({e.vocab, e.c}, dt, "emb.table"),
              out = empty({e.t, e.c}, dt, Device::CPU);
        Owned base = randn({e.t, e.c}, dt, "emb.base");
        Owned ref = empty({e.t, e.c}, DType::F64, Device::CPU),
              ref_acc = empty({e.t, e.c}, DType::F64, Device::CPU);
        for (int64_t t = 0; t < e.t; ++t)
          for (int64_t j = 0; j < e.c; ++j) {
            const double v = get(table, ids.ptr<int32_t>()[t] * e.c + j);
            ref.ptr<double>()[t * e.c + j] = v;
            ref_acc.ptr<double>()[t * e.c + j] = v + get(base, t * e.c + j);
          }
        poison(out);
        ops::embedding_forward(ids, table, out, false, 0, 0, kRaise);
        CHECK_CLOSE(out.t, ref.t, 0.0);
        Owned acc = clone(base);
        ops::embedding_forward(ids, table, acc, true, 0, 0, kRaise);
        CHECK_CLOSE(acc.t, ref_acc.t, dt == DType::F64 ? 1e-16 : 1e-7);
      }
    }
  }
}

TEST_CASE("embedding backward accumulates duplicate ids and matches fp64 finite differences") {
  for (const EmbCase& e : kEmbCases) {
    SUBCASE(e.name().c_str()) {
      Owned ids = randint({e.t}, 0, e.vocab, "emb.ids");
      Owned table = randn({e.vocab, e.c}, DType::F64, "emb.table"),
            r = randn({e.t, e.c}, DType::F64, "emb.r");
      Owned dtable = randn({e.vocab, e.c}, DType::F64, "emb.dtable0"), ref = clone(dtable);
      for (int64_t t = 0; t < e.t; ++t)
        for (int64_t j = 0; j < e.c; ++j)
          ref.ptr<double>()[ids.ptr<int32_t>()[t] * e.c + j] += get(r, t * e.c + j);
      ops::embedding_backward(ids, r, dtable, 0, 0, kRaise);
      CHECK_CLOSE(dtable.t, ref.t, 1e-15);
      Owned out = empty({e.t, e.c}, DType::F64, Device::CPU),
            grad = zeros({e.vocab, e.c}, DType::F64, Device::CPU);
      ops::embedding_backward(ids, r, grad, 0, 0, kRaise);
      auto loss = [&] {
        ops::embedding_forward(ids, table, out, false, 0, 0, kRaise);
        return projection(out, r);
      };
      CHECK_CLOSE(grad.t, numeric_grad(table, loss).t, kGradTol);
    }
  }
}

TEST_CASE("embedding backward is bitwise identical on 1 and 3 threads") {
  const int saved = omp_get_max_threads();
  Owned ids = randint({400}, 0, 7, "emb.det.ids"),
        dout = randn({400, 600}, DType::F32, "emb.det.dout");
  Owned d1 = zeros({7, 600}, DType::F32, Device::CPU),
        d3 = zeros({7, 600}, DType::F32, Device::CPU);
  omp_set_num_threads(1);
  ops::embedding_backward(ids, dout, d1, 0, 0, kRaise);
  omp_set_num_threads(3);
  ops::embedding_backward(ids, dout, d3, 0, 0, kRaise);
  omp_set_num_threads(saved);
  CHECK(bitwise_equal(d1, d3));
}

TEST_CASE("embedding: an out-of-range id names its token position and nothing is written") {
  Owned ids = randint({6}, 0, 5, "emb.bad.ids"), table = randn({5, 3}, DType::F32, "emb.bad.table");
  Owned out = randn({6, 3}, DType::F32, "emb.bad.out"), out0 = clone(out);
  for (int32_t bad : {5, -1}) {
    ids.ptr<int32_t>()[3] = bad;
    CHECK_THROWS_WITH_AS(ops::embedding_forward(ids, table, out, false, 0, 0, kRaise),
                         doctest::Contains(("ids[3] = " + std::to_string(bad)).c_str()), Error);
    CHECK_THROWS_WITH_AS(ops::embedding_backward(ids, out, table, 0, 0, kRaise),
                         doctest::Contains("token position 3"), Error);
    CHECK(bitwise_equal(out, out0));
  }
  ids.ptr<int32_t>()[3] = 0;
  Owned out_wrong = empty({6, 4}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::embedding_forward(ids, table, out_wrong, false, 0, 0, kRaise),
                       doctest::Contains("out has shape"), Error);
  Owned ids64 = empty({6}, DType::I64, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::embedding_forward(ids64, table, out, false, 0, 0, kRaise),
                       doctest::Contains("ids is i64"), Error);
}
