// GPU tests of cuda/embedding against the f64 CPU reference (csrc/ref/embedding.cpp): forward
// (= and +=) and the deterministic backward with duplicate ids, a popular id whose tokens span
// many cells of the sorted order, vocabularies needing 1 to 3 radix passes, odd widths and
// misaligned views (scalar kernels); out-of-range ids raise naming the token position, or with
// trusted ids (the model's calls) are skipped without a read-back.
// Tolerances: a gathered row is copied exactly (0); bf16 += within twice the error of rounding
// the exact sum to bf16, plus 1e-4; f32 += within 1e-6 (one rounding); dtable (f32 sums of up
// to T rows into random prefills) within 1e-5. Backward bits are equal over repeated runs.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops/embedding.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr ops::IdCheck kRaise = ops::IdCheck::kRaise;  // an id out of range raises

struct EmbCase {
  int64_t t, vocab, c;
  int64_t offset;  // 1: table / out / dout / dtable one element past a 16-byte boundary
  std::string name() const {
    return "T" + std::to_string(t) + " V" + std::to_string(vocab) + " C" + std::to_string(c) +
           (offset ? " misaligned" : "");
  }
};
// V < T forces duplicates; V = 1 and the popular id make runs over many 32-entry cells, longer
// than the 64 entries one cell sums whole; V = 50 or 64 at T = 4000 make runs of about 40-60
// (whole runs crossing cell edges, some just past 64); V = 300000 needs 19 key bits (3 radix
// passes); T = 2049 leaves a partial sort tile; T = 32768 is the longest sort whose scatters count
// their digits themselves, T = 33000 and 70000 the histogram and scan kernels' (33 and 69 tiles).
// The small tier ("gpu") holds each of these but the long sorts on narrow rows; the large tier
// ("gpu-slow") the long sorts and the same properties on wide rows and tables.
const std::vector<EmbCase> kCases = {
    {1, 1, 11, 0},     {7, 5, 64, 0},       {1000, 3, 64, 0},    {5000, 1, 16, 0},
    {100, 9, 64, 1},   {300, 11, 2047, 1},  {64, 2, 4096, 0},    {4000, 50, 40, 0},
    {3000, 300000, 2, 0}, {2049, 7000, 40, 0}};
const std::vector<EmbCase> kLargeCases = {
    {1000, 37, 2047, 0},   {1000, 5003, 1024, 0}, {3000, 300000, 24, 0},
    {2049, 70000, 40, 0},  {4000, 64, 2048, 1},   {32768, 300000, 16, 0},
    {33000, 400, 24, 0},   {70000, 50000, 24, 0}, {70000, 300000, 8, 1}};

// Random ids in [0, V) where about a third of the tokens carry one popular id.
Owned random_ids(const EmbCase& k) {
  Owned ids = randint({k.t}, 0, k.vocab, "emb.ids");
  Owned coin = randint({k.t}, 0, 3, "emb.coin");
  for (int64_t i = 0; i < k.t; ++i)
    if (coin.ptr<int32_t>()[i] == 0) ids.ptr<int32_t>()[i] = static_cast<int32_t>(k.vocab / 2);
  return ids;
}

// Calls f and checks that it throws engine::Error whose message holds every one of `parts`.
template <typename F>
void check_error_mentions(F&& f, const std::vector<std::string>& parts) {
  bool thrown = false;
  try {
    f();
  } catch (const Error& e) {
    thrown = true;
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      INFO("message: ", msg, "  expected to contain: ", p);
      CHECK(msg.find(p) != std::string::npos);
    }
  }
  CHECK(thrown);
}

}  // namespace

namespace {
void forward_sweep(const std::vector<EmbCase>& cases) {
  if (!gpu_available_or_skip()) return;
  for (const EmbCase& k : cases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dtype_name(dt));
        Owned ids = random_ids(k);
        Owned table = randn({k.vocab, k.c}, DType::F32, "emb.table"),
              base = randn({k.t, k.c}, DType::F32, "emb.base");
        DeviceTensor gids = to_gpu(ids, DType::I32);
        auto [gtable, table64] = device_input(table, dt, k.offset);
        Owned ref = empty({k.t, k.c}, DType::F64, Device::CPU);
        ops::embedding_forward(ids, table64, ref, false, 0, 0, kRaise);

        DeviceTensor gout = gpu_poisoned({k.t, k.c}, dt, k.offset);
        ops::embedding_forward(gids.t, gtable.t, gout.t, false, 0, 0, kRaise);
        CHECK_CLOSE(gout.t, ref.t, 0.0);

        auto [gacc, ref_acc] = device_input(base, dt, k.offset);
        ops::embedding_forward(ids, table64, ref_acc, true, 0, 0, kRaise);
        ops::embedding_forward(gids.t, gtable.t, gacc.t, true, 0, 0, kRaise);
        CHECK_CLOSE(gacc.t, ref_acc.t, output_tol(dt, ref_acc, 1e-6));
      }
    }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda embedding forward gathers rows (= and +=, bf16 and f32)",
               forward_sweep, kCases, kLargeCases)

namespace {
void backward_sweep(const std::vector<EmbCase>& cases) {
  if (!gpu_available_or_skip()) return;
  for (const EmbCase& k : cases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO("dout ", dtype_name(dt));
        Owned ids = random_ids(k);
        Owned dout = randn({k.t, k.c}, DType::F32, "emb.dout"),
              dtable0 = randn({k.vocab, k.c}, DType::F32, "emb.dtable0");
        DeviceTensor gids = to_gpu(ids, DType::I32);
        auto [gdout, dout64] = device_input(dout, dt, k.offset);
        Owned ref = to_host(dtable0, DType::F64);
        ops::embedding_backward(ids, dout64, ref, 0, 0, kRaise);

        DeviceTensor gd1 = to_gpu(dtable0, DType::F32, k.offset),
            gd2 = to_gpu(dtable0, DType::F32, k.offset);
        ops::embedding_backward(gids.t, gdout.t, gd1.t, 0, 0, kRaise);
        CHECK_CLOSE(gd1.t, ref.t, 1e-5);
        ops::embedding_backward(gids.t, gdout.t, gd2.t, 0, 0, kRaise);
        CHECK(bitwise_equal(gd1.t, gd2.t));
      }
    }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda embedding backward accumulates duplicate ids into f32 dtable, deterministically",
               backward_sweep, kCases, kLargeCases)

TEST_CASE("cuda embedding backward: runs of 64 and 65 entries at cell offsets 0, 1 and 63, over poisoned scratch" * doctest::test_suite("gpu")) {
  // Sorted entries come in cells of 64; a run of at most 64 entries is summed whole by the cell
  // where it starts, a longer one in per-cell pieces that the last arriving cell adds up. Runs of
  // exactly 64 and 65 entries start at offsets 0, 1 and 63 of a cell (fillers of one id in
  // between), a long run ends on a cell edge (65 from offset 63), the last one ends at T; tokens
  // in random order. The caching allocator's free blocks of the op's scratch sizes (sort, counts,
  // the long runs' first and last cells, their pieces) are filled with 0x7f bytes first; the
  // long runs' arrival counters live in a buffer of their own that each run's last piece resets,
  // so a counter left non-zero would show in the second and third calls' bits.
  if (!gpu_available_or_skip()) return;
  const std::vector<std::pair<int64_t, int64_t>> runs = {  // (length, offset in its cell)
      {64, 0}, {65, 0}, {64, 1}, {65, 1}, {64, 63}, {65, 63}, {96, 63}, {200, 5}, {33, 0}, {130, 3}};
  std::vector<int32_t> sorted;
  int32_t id = 0;
  for (const auto& [len, offset] : runs) {
    const int64_t pad = (offset - static_cast<int64_t>(sorted.size()) % 64 + 64) % 64;
    if (pad > 0) sorted.insert(sorted.end(), pad, id++);  // a filler run
    sorted.insert(sorted.end(), len, id++);
  }
  const int64_t t = static_cast<int64_t>(sorted.size()), vocab = id + 3;
  Owned perm = randint({t}, 0, 1 << 30, "emb.runs.perm");
  std::vector<int64_t> order(t);
  for (int64_t i = 0; i < t; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::pair(perm.ptr<int32_t>()[a], a) < std::pair(perm.ptr<int32_t>()[b], b);
  });
  Owned ids = empty({t}, DType::I32, Device::CPU);
  for (int64_t i = 0; i < t; ++i) ids.ptr<int32_t>()[i] = sorted[order[i]];
  DeviceTensor gids = to_gpu(ids, DType::I32);
  for (const int64_t c : {int64_t{24}, int64_t{2048}, int64_t{4100}}) {
    for (DType dt : {DType::BF16, DType::F32}) {
      INFO("C ", c, " dout ", dtype_name(dt));
      {  // blocks of the sizes the op asks for, poisoned and returned to the cache
        std::vector<Owned> junk;
        for (const int64_t bytes : {4 * t * 4, 2 * 256 * ((t + 1023) / 1024) * 4,
                                    vocab * 2 * ((c + 255) / 256) * 4, 2 * ((t + 63) / 64) * c * 4})
          junk.push_back(std::move(gpu_poisoned({bytes / 4}, DType::F32).storage));
      }
      Owned dout = randn({t, c}, DType::F32, "emb.runs.dout"),
            dtable0 = randn({vocab, c}, DType::F32, "emb.runs.dtable0");
      auto [gdout, dout64] = device_input(dout, dt, 0);
      Owned ref = to_host(dtable0, DType::F64);
      ops::embedding_backward(ids, dout64, ref, 0, 0, kRaise);
      DeviceTensor gd1 = to_gpu(dtable0, DType::F32), gd2 = to_gpu(dtable0, DType::F32);
      ops::embedding_backward(gids.t, gdout.t, gd1.t, 0, 0, kRaise);
      CHECK_CLOSE(gd1.t, ref.t, 1e-5);
      ops::embedding_backward(gids.t, gdout.t, gd2.t, 0, 0, kRaise);
      CHECK(bitwise_equal(gd1.t, gd2.t));
      DeviceTensor gd3 = to_gpu(dtable0, DType::F32);
      ops::embedding_backward(gids.t, gdout.t, gd3.t, 0, 0, kRaise);
      CHECK(bitwise_equal(gd1.t, gd3.t));
    }
  }
  // No columns: nothing to add, and nothing to fail on.
  Owned dout0 = empty({t, 0}, DType::F32, Device::CUDA);
  Owned dtable00 = empty({vocab, 0}, DType::F32, Device::CUDA);
  ops::embedding_backward(gids.t, dout0, dtable00, 0, 0, kRaise);
  Owned out0 = empty({t, 0}, DType::F32, Device::CUDA);
  ops::embedding_forward(gids.t, dtable00, out0, false, 0, 0, kRaise);
}

TEST_CASE("cuda embedding with trusted ids: the checked call's bits, bad ids skipped unreported" * doctest::test_suite("gpu")) {
  // ops::IdCheck::kTrusted (the model's calls): no flag is read back. Valid ids give bitwise the
  // checked call's results; a bad id gives a zero row (=), leaves its row of out untouched (+=)
  // and adds nothing backward, as another shard's id does, and nothing is raised.
  if (!gpu_available_or_skip()) return;
  for (const EmbCase& k : {kCases[2], kCases[5], kCases[6], kCases[9]}) {
    SUBCASE(k.name().c_str()) {
      Owned ids = random_ids(k);
      DeviceTensor gids = to_gpu(ids, DType::I32);
      DeviceTensor table = to_gpu(randn({k.vocab, k.c}, DType::F32, "emb.table"), DType::BF16, k.offset);
      DeviceTensor dout = to_gpu(randn({k.t, k.c}, DType::F32, "emb.dout"), DType::BF16, k.offset);
      Owned dtable0 = randn({k.vocab, k.c}, DType::F32, "emb.dtable0");
      DeviceTensor a = gpu_poisoned({k.t, k.c}, DType::BF16, k.offset), b = gpu_poisoned({k.t, k.c}, DType::BF16, k.offset);
      ops::embedding_forward(gids.t, table.t, a.t, false, 0, 0, kRaise);
      ops::embedding_forward(gids.t, table.t, b.t, false, 0, 0, ops::IdCheck::kTrusted);
      CHECK(bitwise_equal(a.t, b.t));
      DeviceTensor d1 = to_gpu(dtable0, DType::F32, k.offset), d2 = to_gpu(dtable0, DType::F32, k.offset);
      ops::embedding_backward(gids.t, dout.t, d1.t, 0, 0, kRaise);
      ops::embedding_backward(gids.t, dout.t, d2.t, 0, 0, ops::IdCheck::kTrusted);
      CHECK(bitwise_equal(d1.t, d2.t));

      // Bad ids at the first, a middle and the last position: what the CPU reference gives for
      // the same ids with the bad ones moved to another shard's range is not defined here, so
      // compare against the valid-only reference directly.
      Owned bad = empty({k.t}, DType::I32, Device::CPU);
      copy_tensor(bad, ids);
      const std::vector<int64_t> where = {0, k.t / 2, k.t - 1};
      const std::vector<int32_t> value = {-1, static_cast<int32_t>(k.vocab), 1 << 30};
      for (size_t i = 0; i < where.size(); ++i) bad.ptr<int32_t>()[where[i]] = value[i];
      DeviceTensor gbad = to_gpu(bad, DType::I32);
      DeviceTensor c = gpu_poisoned({k.t, k.c}, DType::BF16, k.offset);
      ops::embedding_forward(gbad.t, table.t, c.t, false, 0, 0, ops::IdCheck::kTrusted);
      Owned got = to_host(c.t, DType::F32), want = to_host(a.t, DType::F32);
      for (int64_t w : where)
        for (int64_t j = 0; j < k.c; ++j) want.ptr<float>()[w * k.c + j] = 0.f;
      CHECK(bitwise_equal(got, want));
      DeviceTensor acc = to_gpu(randn({k.t, k.c}, DType::F32, "emb.base"), DType::BF16, k.offset);
      Owned before = to_host(acc.t, DType::F32);
      ops::embedding_forward(gbad.t, table.t, acc.t, true, 0, 0, ops::IdCheck::kTrusted);
      Owned after = to_host(acc.t, DType::F32);
      for (int64_t w : where)
        for (int64_t j = 0; j < k.c; ++j) CHECK(after.ptr<float>()[w * k.c + j] == before.ptr<float>()[w * k.c + j]);
      // Backward: the bad tokens add nothing, i.e. the same as their dout rows being zero.
      Owned dout_masked = to_host(dout.t, DType::F32);
      for (int64_t w : where)
        for (int64_t j = 0; j < k.c; ++j) dout_masked.ptr<float>()[w * k.c + j] = 0.f;
      DeviceTensor gmasked = to_gpu(dout_masked, DType::BF16, k.offset);
      DeviceTensor d3 = to_gpu(dtable0, DType::F32, k.offset), d4 = to_gpu(dtable0, DType::F32, k.offset);
      ops::embedding_backward(gbad.t, dout.t, d3.t, 0, 0, ops::IdCheck::kTrusted);
      ops::embedding_backward(gids.t, gmasked.t, d4.t, 0, 0, ops::IdCheck::kTrusted);
      CHECK_CLOSE(d3.t, to_host(d4.t, DType::F64).t, 1e-6);
    }
  }
}

TEST_CASE("cuda embedding raises on an out-of-range id, naming the token position and id" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const int64_t t = 300, vocab = 17, c = 24;
  for (int32_t bad : {-1, static_cast<int32_t>(vocab), 1 << 30}) {
    for (int64_t where : {int64_t{0}, int64_t{123}, t - 1}) {
      INFO("ids[", where, "] = ", bad);
      Owned ids = randint({t}, 0, vocab, "emb.ids");
      ids.ptr<int32_t>()[where] = bad;
      if (where != t - 1) ids.ptr<int32_t>()[t - 1] = -5;  // a later bad id: the first is named
      DeviceTensor gids = to_gpu(ids, DType::I32);
      DeviceTensor table = to_gpu(randn({vocab, c}, DType::F32, "emb.table"), DType::BF16);
      DeviceTensor out = gpu_poisoned({t, c}, DType::BF16);
      DeviceTensor dtable = to_gpu(randn({vocab, c}, DType::F32, "emb.dtable0"), DType::F32);
      const std::vector<std::string> parts = {
          "ids[" + std::to_string(where) + "] = " + std::to_string(bad),
          "token position " + std::to_string(where)};
      check_error_mentions(
          [&] { ops::embedding_forward(gids.t, table.t, out.t, false, 0, 0, kRaise); }, parts);
      check_error_mentions(
          [&] { ops::embedding_backward(gids.t, out.t, dtable.t, 0, 0, kRaise); }, parts);
    }
  }
  // The device is still usable afterwards, and empty inputs are fine.
  Owned ids = randint({5}, 0, vocab, "emb.ids");
  DeviceTensor gids = to_gpu(ids, DType::I32);
  DeviceTensor table = to_gpu(randn({vocab, c}, DType::F32, "emb.table"), DType::F32);
  DeviceTensor out = gpu_poisoned({5, c}, DType::F32);
  ops::embedding_forward(gids.t, table.t, out.t, false, 0, 0, kRaise);
  Owned ref = empty({5, c}, DType::F32, Device::CPU);
  ops::embedding_forward(ids, to_host(table.t, DType::F32), ref, false, 0, 0, kRaise);
  CHECK_CLOSE(out.t, ref.t, 0.0);
  DeviceTensor none = to_gpu(randint({0}, 0, vocab, "emb.none"), DType::I32);
  DeviceTensor out0 = gpu_poisoned({0, c}, DType::F32);
  DeviceTensor dtable = to_gpu(randn({vocab, c}, DType::F32, "emb.dtable0"), DType::F32);
  ops::embedding_forward(none.t, table.t, out0.t, true, 0, 0, kRaise);
  ops::embedding_backward(none.t, out0.t, dtable.t, 0, 0, kRaise);
}
