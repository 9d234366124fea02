// The varlen preprocessing: document lengths -> segments, positions; slices of a micro-batch
// whose keys start in earlier slices.
#include <doctest/doctest.h>

#include "data/varlen.h"
#include "tests/common/testing.h"

using namespace engine;

namespace {
Sample sample_of(std::vector<int32_t> docs, int32_t padding = 0) {
  Sample s;
  s.doc_lengths = std::move(docs);
  s.padding = padding;
  return s;
}
}  // namespace

TEST_CASE("build_varlen: segments, restarting positions, padding kept apart") {
  Sample a = sample_of({1, 4, 2}), b = sample_of({3, 4}, 4);  // b: one document then padding
  VarlenLayout v = build_varlen({&a, &b}, 7, false);
  CHECK(v.cu_seqlens == std::vector<int32_t>{0, 1, 5, 7, 10, 14});
  CHECK(v.max_seqlen == 4);
  CHECK(v.position_ids == std::vector<int32_t>{0, 0, 1, 2, 3, 0, 1, 0, 1, 2, 0, 1, 2, 3});
  CHECK(v.segment == std::vector<int32_t>{0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4, 4});
  VarlenLayout x = build_varlen({&a, &b}, 7, true);  // cross-document: whole sequences
  CHECK(x.cu_seqlens == std::vector<int32_t>{0, 7, 10, 14});
  CHECK(x.position_ids == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 0, 1, 2, 3});
  Sample bad = sample_of({3, 3});
  CHECK_THROWS_WITH_AS(build_varlen({&bad}, 7, false), doctest::Contains("cover"), Error);
}

TEST_CASE("slice_varlen: any chunking gives each query exactly the keys of its segment up to itself") {
  Sample a = sample_of({1, 9, 3}), b = sample_of({13}), c = sample_of({2, 2, 2, 2, 5});
  VarlenLayout v = build_varlen({&a, &b, &c}, 13, false);
  const int64_t T = 39;
  VarlenSlice whole = slice_varlen(v, 0, T);
  CHECK(whole.cu_seqlens_q == v.cu_seqlens);
  CHECK(whole.cu_seqlens_k == v.cu_seqlens);
  CHECK(whole.key_begin == 0);
  CHECK(whole.max_seqlen_k == v.max_seqlen);
  // Random chunkings from the test seed, including empty and single-row chunks.
  PhiloxKey key = testing::test_key("varlen-chunks");
  for (uint64_t trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> cuts = {0};
    while (cuts.back() < T) cuts.push_back(std::min<int64_t>(T, cuts.back() + static_cast<int64_t>(philox_below(key, trial * 100 + cuts.size(), 12))));
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t b0 = cuts[k], e0 = cuts[k + 1];
      VarlenSlice s = slice_varlen(v, b0, e0);
      CAPTURE(b0);
      CAPTURE(e0);
      REQUIRE(s.cu_seqlens_q.back() == e0 - b0);
      REQUIRE(s.position_ids.size() == static_cast<size_t>(e0 - b0));
      for (int64_t r = b0; r < e0; ++r) {
        const int32_t i = s.segment[static_cast<size_t>(r - b0)];
        const int64_t seg = v.segment[static_cast<size_t>(r)];
        const int64_t k_first = s.key_begin + s.cu_seqlens_k[static_cast<size_t>(i)];
        const int64_t k_last = s.key_begin + s.cu_seqlens_k[static_cast<size_t>(i) + 1] - 1;
        const int64_t q_last = b0 + s.cu_seqlens_q[static_cast<size_t>(i) + 1] - 1;
        CHECK(k_first == v.cu_seqlens[static_cast<size_t>(seg)]);  // keys start at the segment start
        CHECK(k_last == q_last);                                    // and end with the last query
        CHECK(s.position_ids[static_cast<size_t>(r - b0)] == r - k_first);
      }
    }
  }
}
