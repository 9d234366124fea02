// The split master (ops/split_master.h, AdamW's master beside resident bf16 weights): every f32
// bit pattern's round trip and rounding over whole ranges of low halves, and the reference
// AdamW on a split master against the same steps on an f32 master (the same f32 bits).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/adamw.h"
#include "ops/split_master.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST_CASE("split master: every low half of many high halves joins back exactly, hi rounds to nearest, ties down") {
  // High halves: zeros, the smallest and largest normals, 1 and -1, values near a binade edge,
  // the largest finite (its hi rounds to infinity), infinities.
  const std::vector<uint32_t> highs = {0x0000, 0x8000, 0x0001, 0x0080, 0x3f80, 0xbf80, 0x3f7f, 0xbf7f,
                                       0x4000, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x1234, 0xc321};
  int64_t checked = 0;
  for (uint32_t h : highs) {
    for (uint32_t low = 0; low <= 0xffff; ++low) {
      const uint32_t m = (h << 16) | low;
      if ((m & 0x7fffffffu) > 0x7f800000u) continue;  // NaN: never a master weight
      const uint16_t hi = split_master_hi(m), lo = split_master_lo(m, hi);
      REQUIRE(split_master_join(hi, lo) == m);
      // hi is a nearest bf16: equal to round-to-nearest-even except on exact ties, where the
      // magnitude rounds down.
      const uint16_t rne = bf16(bits_to_float(m)).bits;
      if (low == 0x8000)
        REQUIRE(hi == static_cast<uint16_t>(h));
      else
        REQUIRE(hi == rne);
      ++checked;
    }
  }
  CHECK(checked == 13 * 65536 + 2);  // the infinities' other low halves are NaNs
}

TEST_CASE("split master: the reference AdamW on a split master keeps the f32 master's bits") {
  const int64_t n = 5003;
  Owned p = randn({n}, DType::F32, "split.p");
  // Some exact ties and values whose hi rounds up, to cover both halves of lo's range.
  for (int64_t i = 0; i < n; i += 97) p.ptr<float>()[i] = bits_to_float((float_to_bits(p.ptr<float>()[i]) & 0xffff0000u) | 0x8000u);
  Owned hi = empty({n}, DType::BF16, Device::CPU), lo = empty({n}, DType::U16, Device::CPU);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t m = float_to_bits(p.ptr<float>()[i]);
    hi.ptr<bf16>()[i].bits = split_master_hi(m);
    lo.ptr<uint16_t>()[i] = split_master_lo(m, hi.ptr<bf16>()[i].bits);
  }
  Owned m1 = zeros({n}, DType::F32, Device::CPU), v1 = zeros({n}, DType::F32, Device::CPU);
  Owned m2 = zeros({n}, DType::F32, Device::CPU), v2 = zeros({n}, DType::F32, Device::CPU);
  ops::AdamWParams o;
  o.lr = 1e-2f;
  o.grad_scale = 0.5f;
  o.decay_runs = {{1000, 0.1f}, {3000, 0.f}, {n, 0.03f}};
  for (int64_t step = 1; step <= 4; ++step) {
    CAPTURE(step);
    o.step = step;
    Owned g = randn({n}, DType::F32, "split.g" + std::to_string(step));
    ops::adamw_step(p, g, m1, v1, o, Tensor{});
    ops::adamw_step(lo, g, m2, v2, o, hi);
    int64_t differ = 0, hi_wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t want = float_to_bits(p.ptr<float>()[i]);
      differ += split_master_join(hi.ptr<bf16>()[i].bits, lo.ptr<uint16_t>()[i]) != want;
      hi_wrong += hi.ptr<bf16>()[i].bits != split_master_hi(want);
    }
    CHECK(differ == 0);
    CHECK(hi_wrong == 0);
    CHECK(std::memcmp(m1.t.data, m2.t.data, n * 4) == 0);
    CHECK(std::memcmp(v1.t.data, v2.t.data, n * 4) == 0);
  }
  // A split master needs its bf16 high halves.
  Owned g = randn({n}, DType::F32, "split.g");
  CHECK_THROWS_WITH_AS(ops::adamw_step(lo, g, m2, v2, o, Tensor{}), doctest::Contains("split master"), Error);
  Owned f32_copy = empty({n}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::adamw_step(lo, g, m2, v2, o, f32_copy), doctest::Contains("split master"), Error);
}
