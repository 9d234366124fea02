// Tensor-parallel blocks of parameters split along any dimension (core/params.h): full_index maps
// every rank's block into the full tensor as a bijection and agrees with the coordinates,
// for_each_full_run cuts a local range into runs contiguous on both sides, and block_of_full is
// the inverse of both (rank, local index, run length). 1-, 2- and 3-D shapes, every split dim,
// tp 1 to 4.
#include <doctest/doctest.h>

#include <vector>

#include "core/params.h"

using namespace engine;

namespace {

// Full coordinates -> row-major full index.
int64_t flat(const Shape& s, const std::vector<int64_t>& c) {
  int64_t i = 0;
  for (int d = 0; d < s.ndim; ++d) i = i * s[d] + c[d];
  return i;
}
std::vector<int64_t> coords(const Shape& s, int64_t i) {
  std::vector<int64_t> c(s.ndim);
  for (int d = s.ndim - 1; d >= 0; --d) {
    c[d] = i % s[d];
    i /= s[d];
  }
  return c;
}

}  // namespace

TEST_CASE("parameter blocks split along any dimension: full_index, runs, block_of_full") {
  const std::vector<Shape> shapes = {{12}, {6, 12}, {4, 6, 12}, {3, 4, 6, 12}};
  for (const Shape& full : shapes) {
    for (int d = 0; d < full.ndim; ++d) {
      for (int tp : {1, 2, 3, 4}) {
        if (full[d] % tp) continue;
        CAPTURE(full.str());
        CAPTURE(d);
        CAPTURE(tp);
        std::vector<int> seen(full.numel(), 0);
        for (int r = 0; r < tp; ++r) {
          ParamTable t(r, tp);
          t.add({.name = "p", .shape = full, .split_dim = d});
          const ParamSpec& s = t.get("p");
          CHECK(s.shape[d] == full[d] / tp);
          const int64_t n = s.shape.numel();
          for (int64_t i = 0; i < n; ++i) {
            std::vector<int64_t> c = coords(s.shape, i);
            c[d] += s.split_begin;
            const int64_t g = full_index(s, i);
            REQUIRE(g == flat(full, c));
            seen[g]++;
            const BlockRun b = block_of_full(full, d, tp, g, full.numel());
            CHECK(b.rank == r);
            CHECK(b.local == i);
          }
          // Runs over an odd local range: contiguous in both numberings, covering it in order.
          const int64_t lo = n / 5, hi = n - n / 7;
          int64_t next = lo;
          for_each_full_run(s, lo, hi, [&](int64_t g0, int64_t count, int64_t l0) {
            CHECK(l0 == next);
            for (int64_t q = 0; q < count; ++q) CHECK(full_index(s, l0 + q) == g0 + q);
            next += count;
          });
          CHECK(next == std::max(lo, hi));
        }
        for (int64_t g = 0; g < full.numel(); ++g) REQUIRE(seen[g] == 1);
        // block_of_full runs: maximal, inside one rank, and bounded by hi.
        const int64_t hi = full.numel() - 1;
        for (int64_t g = 0; g < hi;) {
          const BlockRun b = block_of_full(full, d, tp, g, hi);
          REQUIRE(b.count >= 1);
          REQUIRE(g + b.count <= hi);
          for (int64_t q = 1; q < b.count; ++q) {
            const BlockRun c = block_of_full(full, d, tp, g + q, hi);
            CHECK(c.rank == b.rank);
            CHECK(c.local == b.local + q);
          }
          if (g + b.count < hi) {
            const BlockRun c = block_of_full(full, d, tp, g + b.count, hi);
            CHECK((c.rank != b.rank || c.local != b.local + b.count));
          }
          g += b.count;
        }
      }
    }
  }
}
