// Vocabulary-sharded embedding on the CPU reference: a table split into row shards (uneven,
// one-row and empty shards too); the forward outputs of all shards summed equal the unsharded
// lookup (=: every other shard writes a zero row; +=: only the owning shard adds), each shard's
// backward is exactly its rows of the unsharded backward (bitwise: the same sums in the same
// order); ids are checked against the whole vocabulary (naming the token position), a shard
// outside the vocabulary and vocab_begin without vocab_total are errors.
#include <doctest/doctest.h>

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

struct ShardCase {
  int64_t t, vocab, c;
  std::vector<int64_t> cuts;  // shard p holds ids [cuts[p], cuts[p + 1])
  std::string name() const {
    std::string s = "T" + std::to_string(t) + " V" + std::to_string(vocab) + " C" +
                    std::to_string(c) + " cuts";
    for (int64_t x : cuts) s += " " + std::to_string(x);
    return s;
  }
};
// V < T forces duplicate ids; C > 256 crosses the backward's column chunks.
const std::vector<ShardCase> kCases = {
    {1, 1, 3, {0, 1}},          {17, 5, 7, {0, 2, 5}},       {17, 5, 7, {0, 1, 2, 5}},
    {9, 31, 40, {0, 10, 20, 31}}, {23, 4, 257, {0, 3, 4}},     {12, 6, 5, {0, 0, 6}},
    {0, 3, 4, {0, 1, 3}},         {40, 10, 9, {0, 9, 10, 10}}};

// Rows [r0, r1) of x (V, C) as a new tensor.
Owned rows_of(const Tensor& x, int64_t r0, int64_t r1) {
  Owned out = empty({r1 - r0, x.size(1)}, x.dtype, Device::CPU);
  copy_tensor(out, x.slice(r0, r1));
  return out;
}

}  // namespace

TEST_CASE("sharded embedding forward: the shards' outputs sum to the unsharded lookup") {
  for (const ShardCase& e : kCases) {
    SUBCASE(e.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned ids = randint({e.t}, 0, e.vocab, "embs.ids");
        Owned table = randn({e.vocab, e.c}, dt, "embs.table");
        Owned base = randn({e.t, e.c}, dt, "embs.base");
        Owned full = empty({e.t, e.c}, dt, Device::CPU), full_acc = clone(base);
        ops::embedding_forward(ids, table, full, false, 0, 0, kRaise);
        ops::embedding_forward(ids, table, full_acc, true, 0, 0, kRaise);

        Owned sum = zeros({e.t, e.c}, dt, Device::CPU), acc = clone(base);
        for (size_t p = 0; p + 1 < e.cuts.size(); ++p) {
          INFO("shard [", e.cuts[p], ", ", e.cuts[p + 1], ")");
          Owned shard = rows_of(table, e.cuts[p], e.cuts[p + 1]);
          Owned out = empty({e.t, e.c}, dt, Device::CPU);
          poison(out);
          ops::embedding_forward(ids, shard, out, false, e.cuts[p], e.vocab, kRaise);
          for (int64_t r = 0; r < e.t; ++r) {  // the own ids' rows, zeros elsewhere
            const int32_t id = ids.ptr<int32_t>()[r];
            const bool mine = id >= e.cuts[p] && id < e.cuts[p + 1];
            for (int64_t j = 0; j < e.c; ++j)
              CHECK(get(out, r * e.c + j) == (mine ? get(table, id * e.c + j) : 0.0));
          }
          for (int64_t i = 0; i < sum->numel(); ++i) set(sum, i, get(sum, i) + get(out, i));
          ops::embedding_forward(ids, shard, acc, true, e.cuts[p], e.vocab, kRaise);
        }
        CHECK(bitwise_equal(sum, full));
        CHECK(bitwise_equal(acc, full_acc));
      }
    }
  }
}

TEST_CASE("sharded embedding backward: each shard gets exactly its rows of the full gradient") {
  for (const ShardCase& e : kCases) {
    SUBCASE(e.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned ids = randint({e.t}, 0, e.vocab, "embs.ids");
        Owned dout = randn({e.t, e.c}, dt, "embs.dout");
        Owned dtable0 = randn({e.vocab, e.c}, dt, "embs.dtable0"), full = clone(dtable0);
        ops::embedding_backward(ids, dout, full, 0, 0, kRaise);
        for (size_t p = 0; p + 1 < e.cuts.size(); ++p) {
          INFO("shard [", e.cuts[p], ", ", e.cuts[p + 1], ")");
          Owned shard = rows_of(dtable0, e.cuts[p], e.cuts[p + 1]);
          ops::embedding_backward(ids, dout, shard, e.cuts[p], e.vocab, kRaise);
          CHECK(bitwise_equal(shard, rows_of(full, e.cuts[p], e.cuts[p + 1])));
        }
      }
    }
  }
}

TEST_CASE("sharded embedding: ids checked against the whole vocabulary, shard arguments checked") {
  const int64_t vocab = 10, c = 3;
  Owned ids = randint({6}, 0, vocab, "embs.bad.ids");
  Owned table = randn({4, c}, DType::F32, "embs.bad.table");  // ids [3, 7)
  Owned out = randn({6, c}, DType::F32, "embs.bad.out"), out0 = clone(out);
  ids.ptr<int32_t>()[1] = 9;  // another shard's id: fine
  CHECK_NOTHROW(ops::embedding_forward(ids, table, out, false, 3, vocab, kRaise));
  CHECK_NOTHROW(ops::embedding_backward(ids, out, table, 3, vocab, kRaise));
  out = clone(out0);
  for (int32_t bad : {10, -1}) {
    ids.ptr<int32_t>()[4] = bad;
    CHECK_THROWS_WITH_AS(
        ops::embedding_forward(ids, table, out, false, 3, vocab, kRaise),
        doctest::Contains(("ids[4] = " + std::to_string(bad) + " out of range [0, 10) (token "
                                                                "position 4)")
                              .c_str()),
        Error);
    CHECK_THROWS_WITH_AS(ops::embedding_backward(ids, out, table, 3, vocab, kRaise),
                         doctest::Contains("token position 4"), Error);
    CHECK(bitwise_equal(out, out0));  // nothing written
  }
  ids.ptr<int32_t>()[4] = 3;
  CHECK_THROWS_WITH_AS(ops::embedding_forward(ids, table, out, false, 7, vocab, kRaise),
                       doctest::Contains("rows hold ids [7, 11), not a shard of a vocabulary of 10"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::embedding_backward(ids, out, table, -1, vocab, kRaise),
                       doctest::Contains("not a shard"), Error);
  CHECK_THROWS_WITH_AS(ops::embedding_forward(ids, table, out, false, 2, 0, kRaise),
                       doctest::Contains("vocab_begin = 2 but vocab_total = 0"), Error);
  // Unsharded with the vocabulary spelled out is the same as vocab_total = 0.
  Owned a = empty({6, c}, DType::F32, Device::CPU), b = empty({6, c}, DType::F32, Device::CPU);
  for (int64_t i = 0; i < 6; ++i) ids.ptr<int32_t>()[i] = static_cast<int32_t>(i % 4);
  ops::embedding_forward(ids, table, a, false, 0, 0, kRaise);
  ops::embedding_forward(ids, table, b, false, 0, 4, kRaise);
  CHECK(bitwise_equal(a, b));
}
