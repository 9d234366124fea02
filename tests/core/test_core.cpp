#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <vector>

#include "core/buffer.h"
#include "core/check.h"
#include "core/rng.h"
#include "tests/common/gpu_testing.h"
#include "tests/common/testing.h"

using namespace engine;

TEST_CASE("ENSURE throws Error with expression, message and location") {
  try {
    int x = 3;
    ENSURE(x == 4, "x was ", x);
    FAIL_CHECK("no throw");
  } catch (const Error& e) {
    std::string w = e.what();
    CHECK(w.find("x was 3") != std::string::npos);
    CHECK(w.find("x == 4") != std::string::npos);
    CHECK(w.find("test_core.cpp") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(ENSURE_EQ(1, 2), doctest::Contains("(1 vs 2)"), Error);
}

TEST_CASE("Tensor views: shape, view, slice, dtype checks") {
  Owned o = zeros({4, 3, 2}, DType::F32, Device::CPU);
  CHECK(o->numel() == 24);
  CHECK(o->nbytes() == 96);
  Tensor s = o->slice(1, 3);
  CHECK(s.shape == Shape({2, 3, 2}));
  CHECK(static_cast<float*>(s.data) == o.ptr<float>() + 6);
  CHECK(o->rows().shape == Shape({12, 2}));
  CHECK_THROWS_AS(o->view({5, 5}), Error);
  CHECK_THROWS_AS(o->slice(2, 5), Error);
  CHECK_THROWS_AS(o->ptr<double>(), Error);
  for (int i = 0; i < 24; ++i) CHECK(o.ptr<float>()[i] == 0.f);
}

TEST_CASE("bf16 round to nearest even, NaN kept") {
  CHECK(static_cast<float>(bf16(1.0f)) == 1.0f);
  CHECK(static_cast<float>(bf16(1.0f + 1.0f / 256)) == 1.0f);          // tie -> even
  CHECK(static_cast<float>(bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);  // tie -> even (up)
  CHECK(std::isnan(static_cast<float>(bf16(std::nanf("")))));
  CHECK(static_cast<float>(bf16(-2.5f)) == -2.5f);
}

TEST_CASE("caching allocator reuses freed blocks: no system allocation on repeat") {
  { Buffer warm(12345, Device::CPU); }
  auto before = memory_stats(Device::CPU).system_allocs;
  for (int i = 0; i < 10; ++i) Buffer b(12345, Device::CPU);
  CHECK(memory_stats(Device::CPU).system_allocs == before);
  Buffer a(1000, Device::CPU), b(1000, Device::CPU);
  CHECK(a.data() != b.data());
  CHECK(memory_stats(Device::CPU).peak_in_use >= 2000);
}

TEST_CASE("Philox: known-answer vector and statistics of the normal draw") {
  // Random123's kat_vectors for philox4x32_10: counter 0, key 0.
  Philox4 r = philox4x32({0, 0}, 0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  PhiloxKey k = philox_key(42, "layers.0.attn.wq");
  CHECK(philox_normal(k, 17) == philox_normal(k, 17));
  CHECK(philox_normal(k, 17) != philox_normal(philox_key(43, "layers.0.attn.wq"), 17));
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double z = philox_normal(k, i);
    s += z;
    s2 += z * z;
  }
  CHECK(std::fabs(s / n) < 0.01);
  CHECK(std::fabs(s2 / n - 1.0) < 0.02);
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(philox_below(k, i, 10));
  CHECK(seen.size() == 10);
}

TEST_CASE("upload_bytes to the CPU is a copy") {
  std::vector<int32_t> src = {1, 2, 3, 4, 5};
  std::vector<int32_t> dst(5, 0);
  upload_bytes(dst.data(), Device::CPU, src.data(), src.size() * sizeof(int32_t));
  CHECK(dst == src);
}

TEST_CASE("upload_bytes to the GPU: stream order behind queued work, the source freed at once, staging reused" * doctest::test_suite("gpu")) {
  using namespace engine::testing;
  if (!gpu_available_or_skip()) return;
  // Busy the stream (device copies of 512 MiB), then many uploads of fresh host vectors that
  // die at once: each must land intact, after the queued work, in its own buffer.
  Owned big_a = zeros({int64_t{1} << 27}, DType::F32, Device::CUDA), big_b = empty({int64_t{1} << 27}, DType::F32, Device::CUDA);
  std::vector<Owned> dst;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4; ++i) copy_tensor(big_b, big_a);
    for (int k = 0; k < 100; ++k) {
      const int64_t n = 1 + (k * 7919) % 3000;
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(j)] = static_cast<int32_t>(round * 1000003 + k * 131 + j);
      dst.push_back(empty({n}, DType::I32, Device::CUDA));
      upload_bytes(dst.back()->data, Device::CUDA, v.data(), v.size() * sizeof(int32_t));
    }  // v freed here, before its copy has run
  }
  for (int round = 0, at = 0; round < 3; ++round)
    for (int k = 0; k < 100; ++k, ++at) {
      const Owned h = to_host(dst[static_cast<size_t>(at)], DType::I32);
      bool ok = true;
      for (int64_t j = 0; j < h->numel(); ++j) ok &= h.ptr<int32_t>()[j] == round * 1000003 + k * 131 + j;
      CHECK(ok);
    }
}

TEST_CASE("compare_rows: the worst row relative to max(|ref|, floor); NaN or inf anywhere fails") {
  auto rows = [](std::vector<double> got, std::vector<double> ref, double floor) {
    Owned g = empty({static_cast<int64_t>(got.size())}, DType::F64, Device::CPU);
    Owned r = empty({static_cast<int64_t>(ref.size())}, DType::F64, Device::CPU);
    for (size_t i = 0; i < got.size(); ++i) g.ptr<double>()[i] = got[i];
    for (size_t i = 0; i < ref.size(); ++i) r.ptr<double>()[i] = ref[i];
    return testing::compare_rows(g.t, r.t, floor);
  };
  const double nan = std::nan("");
  testing::RowComparison c = rows({1.0, 0.01 + 2e-7, 10.5}, {1.0, 0.01, 10.0}, 1.0);
  CHECK(c.row == 2);
  CHECK(c.worst == doctest::Approx(0.05));
  c = rows({1.0, 0.01 + 2e-7}, {1.0, 0.01}, 0.0);  // no floor: relative to the value itself
  CHECK(c.worst == doctest::Approx(2e-5));
  c = rows({nan, 1.0, 1.0}, {1.0, 1.0, 1.0}, 1.0);  // a NaN in got, then good rows
  CHECK(std::isinf(c.worst));
  CHECK(c.row == 0);
  c = rows({1.0, 1.0, 1.0}, {1.0, nan, 1.0}, 1.0);  // a NaN in the reference
  CHECK(std::isinf(c.worst));
  CHECK(c.row == 1);
  c = rows({0.0, 0.0}, {0.0, 0.0}, 0.0);  // 0 / 0
  CHECK(std::isinf(c.worst));
  c = rows({}, {}, 1.0);
  CHECK(c.worst == 0.0);
  c = rows({1.0}, {1.0, 2.0}, 1.0);
  CHECK(std::isinf(c.worst));
}
