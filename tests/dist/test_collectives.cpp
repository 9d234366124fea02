// Collectives on exactly predictable data (integers held exactly in f32), on whatever world size
// mpirun gives (the suite runs with 2, 3 and 4 ranks): results must be equal, not close.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "comm/comm.h"
#include "comm/nccl_comm.h"
#include "core/buffer.h"
#include "tests/common/testing.h"

using namespace engine;

namespace {
Owned filled(int64_t n, DType t, const std::function<double(int64_t)>& f) {
  Owned o = empty({n}, t, Device::CPU);
  for (int64_t i = 0; i < n; ++i) testing::set(o, i, f(i));
  return o;
}
}  // namespace

TEST_CASE("all_reduce sum and max: exact, f32 / f64 / i32 / i64") {
  Comm& w = world();
  const int r = w.rank(), n = w.size();
  for (DType t : {DType::F32, DType::F64, DType::I32, DType::I64}) {
    CAPTURE(dtype_name(t));
    Owned x = filled(1001, t, [&](int64_t i) { return r * 1000.0 + static_cast<double>(i); });
    w.all_reduce(x, ReduceOp::Sum);
    for (int64_t i = 0; i < 1001; ++i) REQUIRE(testing::get(x, i) == n * (n - 1) / 2 * 1000.0 + n * static_cast<double>(i));
    Owned y = filled(17, t, [&](int64_t i) { return static_cast<double>((r * 7 + i) % (n + 3)); });
    w.all_reduce(y, ReduceOp::Max);
    for (int64_t i = 0; i < 17; ++i) {
      double expect = 0;
      for (int q = 0; q < n; ++q) expect = std::max(expect, static_cast<double>((q * 7 + i) % (n + 3)));
      REQUIRE(testing::get(y, i) == expect);
    }
  }
  CHECK(w.all_reduce_sum(int64_t{r + 1}) == int64_t{n} * (n + 1) / 2);
  CHECK(w.all_reduce_max(static_cast<double>(r)) == n - 1);
}

TEST_CASE("reduce_scatter and all_gather (also in place): exact") {
  Comm& w = world();
  const int r = w.rank(), n = w.size();
  const int64_t k = 37;
  Owned in = filled(k * n, DType::F32, [&](int64_t j) { return static_cast<double>(r + 3 * j); });
  Owned out = empty({k}, DType::F32, Device::CPU);
  testing::poison(out);
  w.reduce_scatter(in, out);
  for (int64_t i = 0; i < k; ++i) REQUIRE(testing::get(out, i) == n * (n - 1) / 2.0 + n * 3.0 * (r * k + i));

  Owned mine = filled(k, DType::F32, [&](int64_t i) { return r * 100.0 + static_cast<double>(i); });
  Owned all = empty({k * n}, DType::F32, Device::CPU);
  testing::poison(all);
  w.all_gather(mine, all);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < k; ++i) REQUIRE(testing::get(all, q * k + i) == q * 100.0 + static_cast<double>(i));

  Owned inplace = empty({k * n}, DType::F32, Device::CPU);
  testing::poison(inplace);
  for (int64_t i = 0; i < k; ++i) testing::set(inplace, r * k + i, -r - static_cast<double>(i));
  w.all_gather(inplace->slice(r * k, (r + 1) * k), inplace);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < k; ++i) REQUIRE(testing::get(inplace, q * k + i) == -q - static_cast<double>(i));
}

namespace {
// reduce and reduce_async onto every root in turn, over ranges of one buffer as ZeRO cuts them
// (the async ones all in flight before one wait_async): each root's range holds the exact sum.
// Then broadcast_async from every root with fences, as ZeRO gathers the weights.
void check_owner_collectives(Comm& c, Device dev) {
  const int r = c.rank(), n = c.size();
  const int64_t k = 29;
  for (bool async : {false, true}) {
    CAPTURE(async);
    Owned host = filled(k * n, DType::F32, [&](int64_t j) { return static_cast<double>(r * 1000 + j); });
    Owned buf = testing::to_device(host, dev);
    for (int q = 0; q < n; ++q) {
      if (async)
        c.reduce_async(buf->slice(q * k, (q + 1) * k), q);
      else
        c.reduce(buf->slice(q * k, (q + 1) * k), q);
    }
    c.wait_async();
    Owned got = testing::to_host(buf, DType::F64);
    for (int64_t i = 0; i < k; ++i)
      REQUIRE(testing::get(got, r * k + i) == n * (n - 1) / 2 * 1000.0 + n * static_cast<double>(r * k + i));
  }
  Owned small = testing::to_device(filled(3, DType::F32, [](int64_t) { return 0.0; }), dev);
  CHECK_THROWS_WITH_AS(c.reduce(small, n), doctest::Contains("root"), std::exception);

  // The weights' way back: each range broadcast from its owner, a fence after each, the fences
  // waited in order (device backends give one; host ones complete at once and give none).
  Owned host = filled(k * n, DType::F32, [&](int64_t j) { return j / k == r ? 7.0 * static_cast<double>(j) : -1.0; });
  Owned buf = testing::to_device(host, dev);
  std::vector<std::function<void()>> fences;
  for (int q = 0; q < n; ++q) {
    c.broadcast_async(buf->slice(q * k, (q + 1) * k), q);
    fences.push_back(c.fence());
  }
  CHECK(static_cast<bool>(fences.back()) == (dev == Device::CUDA));
  for (auto& f : fences)
    if (f) f();
  Owned got = testing::to_host(buf, DType::F64);
  for (int64_t j = 0; j < k * n; ++j) REQUIRE(testing::get(got, j) == 7.0 * static_cast<double>(j));
}
}  // namespace

TEST_CASE("reduce and reduce_async onto each rank's range, broadcast_async from it with fences: exact") {
  check_owner_collectives(world(), Device::CPU);
}

TEST_CASE("GPUs with NCCL: reduce and reduce_async onto each rank's range, broadcast_async from it with fences, exact" *
          doctest::test_suite("gpu")) {
  if (!testing::gpus_for_ranks_or_skip(world().size())) return;
  auto nccl = make_nccl_comm(world());
  check_owner_collectives(*nccl, Device::CUDA);
}

TEST_CASE("broadcast, send/recv around a ring, barrier") {
  Comm& w = world();
  const int r = w.rank(), n = w.size();
  Owned b = filled(9, DType::I32, [&](int64_t i) { return r == n - 1 ? 5.0 * static_cast<double>(i) : -1.0; });
  w.broadcast(b, n - 1);
  for (int64_t i = 0; i < 9; ++i) REQUIRE(testing::get(b, i) == 5.0 * static_cast<double>(i));
  Owned send = filled(5, DType::F64, [&](int64_t i) { return r + 0.25 * static_cast<double>(i); });
  Owned recv = empty({5}, DType::F64, Device::CPU);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {  // even ranks send first: no deadlock for any n
    w.send(send, next);
    w.recv(recv, prev);
  } else {
    w.recv(recv, prev);
    w.send(send, next);
  }
  for (int64_t i = 0; i < 5; ++i) REQUIRE(testing::get(recv, i) == prev + 0.25 * static_cast<double>(i));
  w.barrier();
}

TEST_CASE("split: groups by color, ordered by key, collectives stay inside a group") {
  Comm& w = world();
  const int r = w.rank(), n = w.size();
  auto g = w.split(r % 2, -r);  // reversed order inside each group
  int members = 0, higher = 0;
  for (int q = 0; q < n; ++q)
    if (q % 2 == r % 2) {
      ++members;
      higher += q > r;
    }
  CHECK(g->size() == members);
  CHECK(g->rank() == higher);
  CHECK(g->all_reduce_sum(int64_t{1} << r) == [&] {
    int64_t s = 0;
    for (int q = 0; q < n; ++q)
      if (q % 2 == r % 2) s += int64_t{1} << q;
    return s;
  }());
}
