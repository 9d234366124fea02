// Vocabulary-parallel cross-entropy on the CPU reference: the logits split into P column shards
// (P = 1, 2, 3, uneven and empty shards too), partial on each shard, the stats stacked in shard
// order, combine, grad on each shard; the losses and the reassembled gradient must equal the
// fused cross_entropy (f64: to 1e-12, bitwise for P = 1; f32: 1e-6), also at logits near +-1000.
// Masked rows give zero stats, lse, loss and gradient rows and their (invalid) labels are never
// read; a bad label at a masked-in row is an error naming position and label; argument checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/loss.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

struct VpCase {
  int64_t t, vocab;
  std::vector<int64_t> cuts;  // shard p holds columns [cuts[p], cuts[p + 1]); 0 ... vocab
  double shift = 0;
  std::string name() const {
    std::string s = "T" + std::to_string(t) + " V" + std::to_string(vocab) + " cuts";
    for (int64_t c : cuts) s += " " + std::to_string(c);
    return s + " shift " + std::to_string(shift);
  }
};

const std::vector<VpCase> kCases = {
    {1, 5, {0, 5}},
    {7, 11, {0, 11}},
    {7, 11, {0, 5, 11}},
    {7, 11, {0, 1, 11}},  // a one-column shard
    {13, 67, {0, 22, 45, 67}},
    {13, 67, {0, 3, 60, 67}},  // uneven
    {6, 3, {0, 1, 2, 3}},      // one column each
    {9, 20, {0, 20, 20}},      // an empty shard (P = 2)
    {9, 50, {0, 17, 34, 50}, 1000.0},
    {9, 50, {0, 30, 31, 50}, -1000.0},
};

struct Batch {
  Owned logits, labels, mask;
};

// Every third row masked and given an invalid label (never read); labels at 0 and V - 1.
Batch make_batch(int64_t t, int64_t vocab, DType dt, double shift) {
  Batch b{randn({t, vocab}, dt, "vp.logits", 3.0), randint({t}, 0, vocab, "vp.labels"),
          empty({t}, DType::U8, Device::CPU)};
  for (int64_t i = 0; i < b.logits->numel(); ++i) set(b.logits, i, get(b.logits, i) + shift);
  for (int64_t r = 0; r < t; ++r) {
    b.mask.ptr<uint8_t>()[r] = r % 3 != 1;
    if (r % 3 == 1) b.labels.ptr<int32_t>()[r] = r % 2 ? -7 : static_cast<int32_t>(vocab + 3);
  }
  b.labels.ptr<int32_t>()[0] = static_cast<int32_t>(vocab - 1);
  if (t > 2) b.labels.ptr<int32_t>()[2] = 0;
  return b;
}

// A contiguous copy of columns [c0, c1) of x (T, V).
Owned columns(const Tensor& x, int64_t c0, int64_t c1) {
  const int64_t t = x.size(0), v = x.size(1);
  Owned out = empty({t, c1 - c0}, x.dtype, Device::CPU);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = c0; j < c1; ++j) set(out, r * (c1 - c0) + (j - c0), get(x, r * v + j));
  return out;
}

struct VpResult {
  Owned partials, lse, losses, grad;  // grad: the shards' gradients reassembled (T, V)
};

// The three steps over the shards of `cuts`, as P ranks would run them (the all-gather being
// the stacking of the stats into partials).
VpResult run_vocab_parallel(const Batch& b, const std::vector<int64_t>& cuts, float scale) {
  const int64_t t = b.logits->size(0), vocab = b.logits->size(1);
  const int64_t np = static_cast<int64_t>(cuts.size()) - 1;
  const DType dt = b.logits->dtype;
  VpResult r{empty({np, 3, t}, dt, Device::CPU), empty({t}, dt, Device::CPU),
             empty({t}, dt, Device::CPU), empty({t, vocab}, dt, Device::CPU)};
  poison(r.partials);
  poison(r.lse);
  poison(r.losses);
  poison(r.grad);
  std::vector<Owned> shards;
  for (int64_t p = 0; p < np; ++p) {
    shards.push_back(columns(b.logits, cuts[p], cuts[p + 1]));
    ops::cross_entropy_partial(shards.back(), b.labels, b.mask, cuts[p], vocab,
                               r.partials->slice(p, p + 1).view({3, t}));
  }
  ops::cross_entropy_combine(r.partials, b.mask, r.lse, r.losses, 0.f, 0.f);
  for (int64_t p = 0; p < np; ++p) {
    ops::cross_entropy_grad(shards[p], b.labels, b.mask, cuts[p], r.lse, scale, 0.f, 0.f, 0);
    const int64_t w = cuts[p + 1] - cuts[p];
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < w; ++j)
        set(r.grad, i * vocab + cuts[p] + j, get(shards[p], i * w + j));
  }
  return r;
}

// The fused reference: losses and the in-place gradient.
struct Fused {
  Owned losses, grad;
};
Fused run_fused(const Batch& b, float scale) {
  Fused f{empty({b.logits->size(0)}, b.logits->dtype, Device::CPU), clone(b.logits)};
  ops::cross_entropy(f.grad, b.labels, b.mask, f.losses, true, scale, 0.f, 0.f, 0);
  return f;
}

// Relative RMS error against ref, normalised by max(rms(ref), floor) (so that all-zero or tiny
// references compare absolutely).
double rel_err(const Tensor& got, const Tensor& ref, double floor = 1.0) {
  REQUIRE(got.numel() == ref.numel());
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double d = get(got, i) - get(ref, i);
    num += std::isfinite(d) ? d * d : INFINITY;
    den += get(ref, i) * get(ref, i);
  }
  const double n = static_cast<double>(std::max<int64_t>(ref.numel(), 1));
  return std::sqrt(num / n) / std::max(std::sqrt(den / n), floor);
}

}  // namespace

TEST_CASE("vocab-parallel cross_entropy (partial, combine, grad) equals the fused op, f64") {
  for (const VpCase& c : kCases) {
    SUBCASE(c.name().c_str()) {
      const float scale = 0.37f;
      const Batch b = make_batch(c.t, c.vocab, DType::F64, c.shift);
      const Fused f = run_fused(b, scale);
      const VpResult r = run_vocab_parallel(b, c.cuts, scale);
      CHECK(rel_err(r.losses, f.losses) <= 1e-12);
      CHECK(rel_err(r.grad, f.grad, 1e-3) <= 1e-12);
      if (c.cuts.size() == 2) {  // P = 1: the very same double operations
        CHECK(bitwise_equal(r.losses, f.losses));
        CHECK(bitwise_equal(r.grad, f.grad));
      }
      // Masked rows: zero stats in every shard, zero lse / loss / gradient row.
      const int64_t np = static_cast<int64_t>(c.cuts.size()) - 1;
      for (int64_t row = 0; row < c.t; ++row) {
        if (b.mask.ptr<uint8_t>()[row]) continue;
        for (int64_t p = 0; p < np; ++p)
          for (int k = 0; k < 3; ++k) CHECK(get(r.partials, (p * 3 + k) * c.t + row) == 0.0);
        CHECK(get(r.lse, row) == 0.0);
        CHECK(get(r.losses, row) == 0.0);
        for (int64_t v = 0; v < c.vocab; ++v) CHECK(get(r.grad, row * c.vocab + v) == 0.0);
      }
      // Masked-in rows: the lse is the row's log-sum-exp, z sits in the label's shard only.
      for (int64_t row = 0; row < c.t; ++row) {
        if (!b.mask.ptr<uint8_t>()[row]) continue;
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < c.vocab; ++v) m = std::max(m, get(b.logits, row * c.vocab + v));
        for (int64_t v = 0; v < c.vocab; ++v) s += std::exp(get(b.logits, row * c.vocab + v) - m);
        CHECK(std::abs(get(r.lse, row) - (m + std::log(s))) <= 1e-12 * std::max(1.0, std::abs(m)));
        const int32_t label = b.labels.ptr<int32_t>()[row];
        for (int64_t p = 0; p < np; ++p) {
          const bool here = label >= c.cuts[p] && label < c.cuts[p + 1];
          const double z = get(r.partials, (p * 3 + 2) * c.t + row);
          CHECK(z == (here ? get(b.logits, row * c.vocab + label) : 0.0));
        }
      }
    }
  }
}

TEST_CASE("vocab-parallel cross_entropy equals the fused op in f32 (stats, lse, losses in f32)") {
  const Batch b = make_batch(11, 301, DType::F32, 0.0);
  const Fused f = run_fused(b, 0.5f);
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{0, 301}, {0, 150, 301}, {0, 7, 200, 301}}) {
    INFO("shards: ", cuts.size() - 1);
    const VpResult r = run_vocab_parallel(b, cuts, 0.5f);
    CHECK(r.partials->dtype == DType::F32);
    CHECK(rel_err(r.losses, f.losses) <= 1e-6);
    CHECK(rel_err(r.grad, f.grad, 1e-3) <= 1e-6);
  }
}

TEST_CASE("vocab-parallel combine of two equal shards gives m + log(2 s), the same bits twice") {
  // Every rank combining the same partials gets the same bits (a pure function of its input).
  const int64_t t = 4;
  Owned partials = empty({2, 3, t}, DType::F64, Device::CPU);
  Owned mask = empty({t}, DType::U8, Device::CPU);
  for (int64_t r = 0; r < t; ++r) {
    mask.ptr<uint8_t>()[r] = 1;
    for (int64_t p = 0; p < 2; ++p) {
      set(partials, (p * 3 + 0) * t + r, 2.0 + r);
      set(partials, (p * 3 + 1) * t + r, 1.5);
      set(partials, (p * 3 + 2) * t + r, p == 0 ? 0.0 : 1.0 + r);
    }
  }
  Owned lse = empty({t}, DType::F64, Device::CPU), losses = empty({t}, DType::F64, Device::CPU);
  Owned lse2 = empty({t}, DType::F64, Device::CPU), losses2 = empty({t}, DType::F64, Device::CPU);
  ops::cross_entropy_combine(partials, mask, lse, losses, 0.f, 0.f);
  ops::cross_entropy_combine(partials, mask, lse2, losses2, 0.f, 0.f);
  CHECK(bitwise_equal(lse, lse2));
  CHECK(bitwise_equal(losses, losses2));
  for (int64_t r = 0; r < t; ++r) {
    CHECK(get(lse, r) == doctest::Approx(2.0 + r + std::log(3.0)).epsilon(1e-14));
    CHECK(get(losses, r) == doctest::Approx(1.0 + std::log(3.0)).epsilon(1e-14));
  }
}

TEST_CASE("vocab-parallel cross_entropy: bad labels where the mask is set, and argument checks") {
  const int64_t t = 5, vocab = 7;
  Batch b = make_batch(t, vocab, DType::F32, 0.0);
  Owned shard = columns(b.logits, 3, 7);
  Owned stats = empty({3, t}, DType::F32, Device::CPU);
  // A label of another shard is fine; outside the whole vocabulary it is an error.
  b.labels.ptr<int32_t>()[2] = 1;
  CHECK_NOTHROW(ops::cross_entropy_partial(shard, b.labels, b.mask, 3, vocab, stats));
  CHECK(get(stats, 2 * t + 2) == 0.0);
  b.labels.ptr<int32_t>()[2] = 7;
  CHECK_THROWS_WITH_AS(
      ops::cross_entropy_partial(shard, b.labels, b.mask, 3, vocab, stats),
      doctest::Contains("cross_entropy_partial: labels[2] = 7 out of range [0, 7) at a masked-in "
                        "token (position 2)"),
      Error);
  b.labels.ptr<int32_t>()[2] = -2;
  CHECK_THROWS_WITH_AS(ops::cross_entropy_partial(shard, b.labels, b.mask, 3, vocab, stats),
                       doctest::Contains("labels[2] = -2"), Error);
  b.mask.ptr<uint8_t>()[2] = 0;  // masked: never read
  CHECK_NOTHROW(ops::cross_entropy_partial(shard, b.labels, b.mask, 3, vocab, stats));
  b.labels.ptr<int32_t>()[2] = 0;

  // The shard must lie inside the vocabulary; stats in the logits' dtype, shaped (3, T).
  CHECK_THROWS_WITH_AS(ops::cross_entropy_partial(shard, b.labels, b.mask, 4, vocab, stats),
                       doctest::Contains("not a shard of a vocabulary of 7"), Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_partial(shard, b.labels, b.mask, -1, vocab, stats),
                       doctest::Contains("not a shard"), Error);
  Owned stats64 = empty({3, t}, DType::F64, Device::CPU), stats_t = empty({t, 3}, DType::F32,
                                                                           Device::CPU);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_partial(shard, b.labels, b.mask, 3, vocab, stats64),
                       doctest::Contains("stats is f64, expected f32"), Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_partial(shard, b.labels, b.mask, 3, vocab, stats_t),
                       doctest::Contains("stats has shape (5, 3), expected (3, 5)"), Error);

  Owned lse = empty({t}, DType::F32, Device::CPU), losses = empty({t}, DType::F32, Device::CPU);
  Owned flat = empty({3, t}, DType::F32, Device::CPU), none = empty({0, 3, t}, DType::F32,
                                                                     Device::CPU);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_combine(flat, b.mask, lse, losses, 0.f, 0.f),
                       doctest::Contains("partials must be (P, 3, T)"), Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_combine(none, b.mask, lse, losses, 0.f, 0.f),
                       doctest::Contains("P = 0"), Error);
  Owned lse64 = empty({t}, DType::F64, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_grad(shard, b.labels, b.mask, 3, lse64, 1.f, 0.f, 0.f, 0),
                       doctest::Contains("lse is f64, expected f32"), Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_grad(shard, b.labels, b.mask, -3, lse, 1.f, 0.f, 0.f, 0),
                       doctest::Contains("vocab_begin = -3 is negative"), Error);
}

// ---- z-loss and label smoothing through the three steps: (K = 4, T) stats carry each shard's
// share of the mean logit; combine adds the z-loss and the smoothing term, grad their gradients.

namespace {

VpResult run_vocab_parallel_reg(const Batch& b, const std::vector<int64_t>& cuts, float scale,
                                float z, float eps) {
  const int64_t t = b.logits->size(0), vocab = b.logits->size(1);
  const int64_t np = static_cast<int64_t>(cuts.size()) - 1;
  const DType dt = b.logits->dtype;
  VpResult r{empty({np, 4, t}, dt, Device::CPU), empty({t}, dt, Device::CPU),
             empty({t}, dt, Device::CPU), empty({t, vocab}, dt, Device::CPU)};
  poison(r.partials);
  poison(r.lse);
  poison(r.losses);
  poison(r.grad);
  std::vector<Owned> shards;
  for (int64_t p = 0; p < np; ++p) {
    shards.push_back(columns(b.logits, cuts[p], cuts[p + 1]));
    ops::cross_entropy_partial(shards.back(), b.labels, b.mask, cuts[p], vocab,
                               r.partials->slice(p, p + 1).view({4, t}));
  }
  ops::cross_entropy_combine(r.partials, b.mask, r.lse, r.losses, z, eps);
  for (int64_t p = 0; p < np; ++p) {
    ops::cross_entropy_grad(shards[p], b.labels, b.mask, cuts[p], r.lse, scale, z, eps, vocab);
    const int64_t w = cuts[p + 1] - cuts[p];
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < w; ++j)
        set(r.grad, i * vocab + cuts[p] + j, get(shards[p], i * w + j));
  }
  return r;
}

}  // namespace

TEST_CASE("vocab-parallel cross_entropy with z-loss and label smoothing equals the fused op") {
  const std::vector<std::pair<float, float>> regs = {{1e-2f, 0.f}, {0.f, 0.1f}, {0.3f, 0.25f}};
  for (const VpCase& c : kCases) {
    SUBCASE(c.name().c_str()) {
      for (auto [z, eps] : regs) {
        INFO("z ", z, " eps ", eps);
        const float scale = 0.37f;
        const Batch b = make_batch(c.t, c.vocab, DType::F64, c.shift);
        Fused f{empty({c.t}, DType::F64, Device::CPU), clone(b.logits)};
        ops::cross_entropy(f.grad, b.labels, b.mask, f.losses, true, scale, z, eps, 0);
        const VpResult r = run_vocab_parallel_reg(b, c.cuts, scale, z, eps);
        CHECK(rel_err(r.losses, f.losses) <= 1e-12);
        CHECK(rel_err(r.grad, f.grad, 1e-3) <= 1e-12);
        if (c.cuts.size() == 2) {  // P = 1: the very same double operations
          CHECK(bitwise_equal(r.losses, f.losses));
          CHECK(bitwise_equal(r.grad, f.grad));
        }
        for (int64_t row = 0; row < c.t; ++row) {
          if (b.mask.ptr<uint8_t>()[row]) continue;
          for (int64_t p = 0; p + 1 < static_cast<int64_t>(c.cuts.size()); ++p)
            CHECK(get(r.partials, (p * 4 + 3) * c.t + row) == 0.0);
        }
      }
    }
  }
}

TEST_CASE("vocab-parallel cross_entropy: the (4, T) stats leave the plain loss unchanged") {
  const Batch b = make_batch(7, 31, DType::F64, 0.0);
  const VpResult plain = run_vocab_parallel(b, {0, 10, 31}, 0.5f);
  const VpResult four = run_vocab_parallel_reg(b, {0, 10, 31}, 0.5f, 0.f, 0.f);
  CHECK(bitwise_equal(plain.losses, four.losses));
  CHECK(bitwise_equal(plain.grad, four.grad));
}

TEST_CASE("vocab-parallel cross_entropy: label smoothing needs the mean row and the vocabulary") {
  const int64_t t = 5, vocab = 7;
  Batch b = make_batch(t, vocab, DType::F32, 0.0);
  Owned three = empty({1, 3, t}, DType::F32, Device::CPU);
  Owned lse = empty({t}, DType::F32, Device::CPU), losses = empty({t}, DType::F32, Device::CPU);
  ops::cross_entropy_partial(b.logits, b.labels, b.mask, 0, vocab, three->view({3, t}));
  CHECK_NOTHROW(ops::cross_entropy_combine(three, b.mask, lse, losses, 0.1f, 0.f));
  CHECK_THROWS_WITH_AS(ops::cross_entropy_combine(three, b.mask, lse, losses, 0.f, 0.1f),
                       doctest::Contains("label smoothing needs (P, 4, T) partials"), Error);
  Owned five = empty({5, t}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_partial(b.logits, b.labels, b.mask, 0, vocab, five),
                       doctest::Contains("stats has shape (5, 5), expected (3, 5)"), Error);
  Owned logits = clone(b.logits);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_grad(logits, b.labels, b.mask, 0, lse, 1.f, 0.f, 0.1f, 0),
                       doctest::Contains("label smoothing needs the vocabulary size"), Error);
  CHECK_NOTHROW(ops::cross_entropy_grad(logits, b.labels, b.mask, 0, lse, 1.f, 0.f, 0.1f, vocab));
}
