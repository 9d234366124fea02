// GPU tests of the vocabulary-sharded embedding (cuda/embedding) against the f64 CPU reference
// run on the same shard: forward (= and +=) and the deterministic backward over row shards of
// the table (uneven, one-row and empty shards, a popular id, odd widths, misaligned views), the
// shards' outputs summed giving the unsharded lookup; ids are checked against the whole
// vocabulary (an id of another shard is fine, one outside [0, vocab_total) raises naming the
// token position). Tolerances as in test_embedding.cpp: gathered rows and zero rows exact; bf16
// += within twice the bf16 rounding of the exact sum plus 1e-4, f32 1e-6; dtable 1e-5.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ops/embedding.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr ops::IdCheck kRaise = ops::IdCheck::kRaise;  // an id out of range raises

struct ShardCase {
  int64_t t, vocab, c;
  std::vector<int64_t> cuts;  // shard p holds ids [cuts[p], cuts[p + 1])
  int64_t offset;             // 1: every device tensor one element past a 16-byte boundary
  std::string name() const {
    std::string s = "T" + std::to_string(t) + " V" + std::to_string(vocab) + " C" +
                    std::to_string(c) + " cuts";
    for (int64_t x : cuts) s += " " + std::to_string(x);
    return s + (offset ? " misaligned" : "");
  }
};
const std::vector<ShardCase> kCases = {
    {7, 5, 64, {0, 2, 5}, 0},
    {1000, 37, 2047, {0, 18, 37}, 0},            // odd width: scalar path
    {5000, 3, 16, {0, 1, 3}, 0},                 // popular ids over many cells
    {3000, 300000, 24, {0, 100000, 200001, 300000}, 0},  // several radix passes per shard
    {2049, 70000, 40, {0, 35000, 70000, 70000}, 0},      // an empty shard
    {300, 11, 2047, {0, 5, 11}, 1},
    {64, 2, 4096, {0, 1, 2}, 0},
};

// Random ids in [0, V) where about a third of the tokens carry one popular id.
Owned random_ids(const ShardCase& k) {
  Owned ids = randint({k.t}, 0, k.vocab, "embs.ids");
  Owned coin = randint({k.t}, 0, 3, "embs.coin");
  for (int64_t i = 0; i < k.t; ++i)
    if (coin.ptr<int32_t>()[i] == 0) ids.ptr<int32_t>()[i] = static_cast<int32_t>(k.vocab / 2);
  return ids;
}

// Rows [r0, r1) of a CPU tensor as a new CPU tensor.
Owned rows_of(const Tensor& x, int64_t r0, int64_t r1) {
  Owned out = empty({r1 - r0, x.size(1)}, x.dtype, Device::CPU);
  copy_tensor(out, x.slice(r0, r1));
  return out;
}

}  // namespace

TEST_CASE("cuda sharded embedding forward: zero rows for other shards, shards sum to the lookup" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const ShardCase& k : kCases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dtype_name(dt));
        Owned ids = random_ids(k);
        DeviceTensor gids = to_gpu(ids, DType::I32);
        Owned table = randn({k.vocab, k.c}, DType::F32, "embs.table"),
              base = randn({k.t, k.c}, DType::F32, "embs.base");
        Owned table64 = to_host(to_host(table, dt), DType::F64);
        Owned full = empty({k.t, k.c}, DType::F64, Device::CPU);
        ops::embedding_forward(ids, table64, full, false, 0, 0, kRaise);
        Owned sum = zeros({k.t, k.c}, DType::F64, Device::CPU);
        for (size_t p = 0; p + 1 < k.cuts.size(); ++p) {
          INFO("shard [", k.cuts[p], ", ", k.cuts[p + 1], ")");
          Owned shard64 = rows_of(table64, k.cuts[p], k.cuts[p + 1]);
          DeviceTensor gshard = gpu_poisoned(shard64->shape, dt, k.offset);
          copy_tensor(gshard.t, to_host(shard64, dt));
          Owned ref = empty({k.t, k.c}, DType::F64, Device::CPU);
          ops::embedding_forward(ids, shard64, ref, false, k.cuts[p], k.vocab, kRaise);
          DeviceTensor gout = gpu_poisoned({k.t, k.c}, dt, k.offset);
          ops::embedding_forward(gids.t, gshard.t, gout.t, false, k.cuts[p], k.vocab, kRaise);
          CHECK_CLOSE(gout.t, ref.t, 0.0);
          const Owned out64 = to_host(gout.t, DType::F64);
          for (int64_t i = 0; i < sum->numel(); ++i)
            sum.ptr<double>()[i] += out64.ptr<double>()[i];

          auto [gacc, ref_acc] = device_input(base, dt, k.offset);
          ops::embedding_forward(ids, shard64, ref_acc, true, k.cuts[p], k.vocab, kRaise);
          ops::embedding_forward(gids.t, gshard.t, gacc.t, true, k.cuts[p], k.vocab, kRaise);
          CHECK_CLOSE(gacc.t, ref_acc.t, output_tol(dt, ref_acc, 1e-6));
        }
        CHECK_CLOSE(sum.t, full.t, 0.0);
      }
    }
  }
}

TEST_CASE("cuda sharded embedding backward: each shard gets its rows of the gradient, bitwise twice" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const ShardCase& k : kCases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO("dout ", dtype_name(dt));
        Owned ids = random_ids(k);
        DeviceTensor gids = to_gpu(ids, DType::I32);
        Owned dout = randn({k.t, k.c}, DType::F32, "embs.dout"),
              dtable0 = randn({k.vocab, k.c}, DType::F32, "embs.dtable0");
        auto [gdout, dout64] = device_input(dout, dt, k.offset);
        Owned full = to_host(dtable0, DType::F64);
        ops::embedding_backward(ids, dout64, full, 0, 0, kRaise);
        for (size_t p = 0; p + 1 < k.cuts.size(); ++p) {
          INFO("shard [", k.cuts[p], ", ", k.cuts[p + 1], ")");
          Owned shard0 = rows_of(dtable0, k.cuts[p], k.cuts[p + 1]);
          DeviceTensor gd1 = gpu_poisoned(shard0->shape, DType::F32, k.offset),
                       gd2 = gpu_poisoned(shard0->shape, DType::F32, k.offset);
          copy_tensor(gd1.t, shard0);
          copy_tensor(gd2.t, shard0);
          ops::embedding_backward(gids.t, gdout.t, gd1.t, k.cuts[p], k.vocab, kRaise);
          CHECK_CLOSE(gd1.t, rows_of(full, k.cuts[p], k.cuts[p + 1]).t, 1e-5);
          ops::embedding_backward(gids.t, gdout.t, gd2.t, k.cuts[p], k.vocab, kRaise);
          CHECK(bitwise_equal(gd1.t, gd2.t));
        }
      }
    }
  }
}

TEST_CASE("cuda sharded embedding checks ids against the whole vocabulary" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const int64_t t = 300, vocab = 17, c = 24, begin = 5, rows = 6;  // the shard holds [5, 11)
  for (int32_t bad : {-1, static_cast<int32_t>(vocab), 1 << 30}) {
    for (int64_t where : {int64_t{0}, int64_t{123}, t - 1}) {
      INFO("ids[", where, "] = ", bad);
      Owned ids = randint({t}, 0, vocab, "embs.ids");
      ids.ptr<int32_t>()[where] = bad;
      if (where != t - 1) ids.ptr<int32_t>()[t - 1] = -5;  // a later bad id: the first is named
      DeviceTensor gids = to_gpu(ids, DType::I32);
      DeviceTensor table = to_gpu(randn({rows, c}, DType::F32, "embs.table"), DType::BF16);
      DeviceTensor out = gpu_poisoned({t, c}, DType::BF16);
      DeviceTensor dtable = to_gpu(randn({rows, c}, DType::F32, "embs.dtable0"), DType::F32);
      const std::string msg = "ids[" + std::to_string(where) + "] = " + std::to_string(bad) +
                              " out of range [0, " + std::to_string(vocab) +
                              ") (token position " + std::to_string(where) + ")";
      CHECK_THROWS_WITH_AS(ops::embedding_forward(gids.t, table.t, out.t, false, begin, vocab, kRaise),
                           doctest::Contains(msg.c_str()), Error);
      CHECK_THROWS_WITH_AS(ops::embedding_backward(gids.t, out.t, dtable.t, begin, vocab, kRaise),
                           doctest::Contains(msg.c_str()), Error);
    }
  }
  Owned ids = randint({t}, 0, vocab, "embs.ids");  // mostly other shards' ids: fine
  DeviceTensor gids = to_gpu(ids, DType::I32);
  DeviceTensor table = to_gpu(randn({rows, c}, DType::F32, "embs.table"), DType::F32);
  DeviceTensor out = gpu_poisoned({t, c}, DType::F32);
  CHECK_NOTHROW(ops::embedding_forward(gids.t, table.t, out.t, false, begin, vocab, kRaise));
  CHECK_THROWS_WITH_AS(ops::embedding_forward(gids.t, table.t, out.t, false, 12, vocab, kRaise),
                       doctest::Contains("rows hold ids [12, 18), not a shard of a vocabulary of 17"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::embedding_backward(gids.t, out.t, table.t, 3, 0, kRaise),
                       doctest::Contains("vocab_begin = 3 but vocab_total = 0"), Error);
}
