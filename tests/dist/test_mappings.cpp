// The tensor-parallel conjugate pairs (comm/mappings.h) on exact integer data: each forward gives
// the predicted values, each backward too, and every pair is an adjoint pair — the sum over ranks
// of <F(x), dy> equals that of <x, B(dy)>, where a replicated tensor is counted once.
#include <doctest/doctest.h>

#include "comm/mappings.h"
#include "core/buffer.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr int64_t kRows = 5, kCols = 3;

// Small integers (exact in f64 sums): replicated when `rank` is -1, else different per rank.
Owned ints(int64_t rows, const std::string& name, int rank) {
  Owned t = empty({rows, kCols}, DType::F64, Device::CPU);
  PhiloxKey key = test_key(name + (rank < 0 ? "" : std::to_string(rank)));
  for (int64_t i = 0; i < t->numel(); ++i) set(t, i, static_cast<double>(philox_below(key, static_cast<uint64_t>(i), 19)) - 9.0);
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += get(a, i) * get(b, i);
  return s;
}

}  // namespace

TEST_CASE("copy_to_tp / reduce_from_tp: identity and all-reduce, adjoint") {
  Comm& tp = world();
  const int r = tp.rank(), n = tp.size();
  // copy_to_tp: replicated in, replicated out; partial gradients are summed.
  Owned x = ints(kRows, "c.x", -1), y = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::copy_to_tp_forward(tp, x, y);
  for (int64_t i = 0; i < x->numel(); ++i) REQUIRE(get(y, i) == get(x, i));
  Owned dy = ints(kRows, "c.dy", r), dx = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::copy_to_tp_backward(tp, dy, dx);
  for (int64_t i = 0; i < dx->numel(); ++i) {
    double expect = 0;
    for (int q = 0; q < n; ++q) expect += get(ints(kRows, "c.dy", q), i);
    REQUIRE(get(dx, i) == expect);
  }
  CHECK(tp.all_reduce_sum(dot(y, dy)) == dot(x, dx));

  // reduce_from_tp: partial in, replicated (summed) out; the gradient passes through.
  Owned p = ints(kRows, "r.x", r), s = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::reduce_from_tp_forward(tp, p, s);
  Owned g = ints(kRows, "r.dy", -1), dp = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::reduce_from_tp_backward(tp, g, dp);
  for (int64_t i = 0; i < dp->numel(); ++i) REQUIRE(get(dp, i) == get(g, i));
  CHECK(dot(s, g) == tp.all_reduce_sum(dot(p, dp)));
}

TEST_CASE("gather_from_sp / scatter_to_sp / split_to_sp: row blocks in rank order, adjoint") {
  Comm& tp = world();
  const int r = tp.rank(), n = tp.size();
  // gather: sharded rows in, the full (replicated) rows out; partial gradients reduce-scattered.
  Owned x = ints(kRows, "g.x", r), y = empty({kRows * n, kCols}, DType::F64, Device::CPU);
  tp::gather_from_sp_forward(tp, x, y);
  for (int q = 0; q < n; ++q) {
    Owned xq = ints(kRows, "g.x", q);
    for (int64_t i = 0; i < xq->numel(); ++i) REQUIRE(get(y, q * kRows * kCols + i) == get(xq, i));
  }
  Owned dy = ints(kRows * n, "g.dy", r), dx = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::gather_from_sp_backward(tp, dy, dx);
  CHECK(tp.all_reduce_sum(dot(y, dy)) == tp.all_reduce_sum(dot(x, dx)));

  // scatter: partial full rows in, this rank's block of the sum out; gradient all-gathered.
  Owned f = ints(kRows * n, "s.x", r), b = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::scatter_to_sp_forward(tp, f, b);
  for (int64_t i = 0; i < b->numel(); ++i) {
    double expect = 0;
    for (int q = 0; q < n; ++q) expect += get(ints(kRows * n, "s.x", q), r * kRows * kCols + i);
    REQUIRE(get(b, i) == expect);
  }
  Owned db = ints(kRows, "s.dy", r), df = empty({kRows * n, kCols}, DType::F64, Device::CPU);
  tp::scatter_to_sp_backward(tp, db, df);
  CHECK(tp.all_reduce_sum(dot(b, db)) == tp.all_reduce_sum(dot(f, df)));

  // split: replicated full rows in, own block out (no communication); gradient all-gathered.
  Owned full = ints(kRows * n, "p.x", -1), own = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::split_to_sp_forward(tp, full, own);
  for (int64_t i = 0; i < own->numel(); ++i) REQUIRE(get(own, i) == get(full, r * kRows * kCols + i));
  Owned down = ints(kRows, "p.dy", r), dfull = empty({kRows * n, kCols}, DType::F64, Device::CPU);
  tp::split_to_sp_backward(tp, down, dfull);
  CHECK(tp.all_reduce_sum(dot(own, down)) == dot(full, dfull));
  CHECK_THROWS_AS(tp::split_to_sp_forward(tp, full, empty({kRows + 1, kCols}, DType::F64, Device::CPU).t), Error);
}

TEST_CASE("the *_async forms give what the blocking forms give, once their fence is waited") {
  Comm& tp = world();
  const int r = tp.rank(), n = tp.size();
  const auto wait = [](const std::function<void()>& fence) {
    if (fence) fence();
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    if (a.numel() != b.numel()) return false;
    for (int64_t i = 0; i < a.numel(); ++i)
      if (get(a, i) != get(b, i)) return false;
    return true;
  };
  Owned dy = ints(kRows, "a.dy", r), dx = empty({kRows, kCols}, DType::F64, Device::CPU),
        dx_async = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::copy_to_tp_backward(tp, dy, dx);
  wait(tp::copy_to_tp_backward_async(tp, dy, dx_async));
  CHECK(same(dx_async, dx));

  Owned x = ints(kRows, "a.x", r), y = empty({kRows * n, kCols}, DType::F64, Device::CPU),
        y_async = empty({kRows * n, kCols}, DType::F64, Device::CPU);
  tp::gather_from_sp_forward(tp, x, y);
  wait(tp::gather_from_sp_forward_async(tp, x, y_async));
  CHECK(same(y_async, y));

  Owned g = ints(kRows * n, "a.g", r), s = empty({kRows, kCols}, DType::F64, Device::CPU),
        s_async = empty({kRows, kCols}, DType::F64, Device::CPU);
  tp::gather_from_sp_backward(tp, g, s);
  wait(tp::gather_from_sp_backward_async(tp, g, s_async));
  CHECK(same(s_async, s));
  CHECK_THROWS_AS(tp::gather_from_sp_backward_async(tp, g, empty({kRows + 1, kCols}, DType::F64, Device::CPU).t),
                  Error);
}
