// Checked size arithmetic (core/checked.h) where sizes are computed: shapes, byte counts, the
// allocator and the parameter tables refuse a product that would wrap, with a message, instead
// of allocating or looping over a wrapped size.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

#include "core/buffer.h"
#include "core/checked.h"
#include "core/params.h"

using namespace engine;

TEST_CASE("checked_mul and checked_add: exact results, or an error naming what overflowed") {
  CHECK(checked_mul<int64_t>(3, 4, "x") == 12);
  CHECK(checked_add<size_t>(3, 4) == 7);
  CHECK(checked_mul<int64_t>(int64_t{1} << 31, int64_t{1} << 31, "a") == int64_t{1} << 62);
  CHECK_THROWS_WITH_AS(checked_mul<int64_t>(int64_t{1} << 32, int64_t{1} << 31, "rows x cols of ", "w"),
                       doctest::Contains("rows x cols of w: 4294967296 x 2147483648 overflows 64-bit signed"), Error);
  CHECK_THROWS_WITH_AS(checked_add<int64_t>(std::numeric_limits<int64_t>::max(), 1, "offset"),
                       doctest::Contains("offset: "), Error);
  CHECK_THROWS_WITH_AS(checked_mul<int>(1 << 16, 1 << 16), doctest::Contains("overflows 32-bit signed"), Error);
  CHECK_THROWS_AS(checked_size(-1, "n"), Error);
  int64_t r = 0;
  CHECK(mul_overflows<int64_t>(int64_t{3} << 61, 4, &r));
  CHECK_FALSE(mul_overflows<int64_t>(0, std::numeric_limits<int64_t>::max(), &r));
}

TEST_CASE("shapes and tensors: an element or byte count past 64 bits is an error, not a wrapped size") {
  const Shape ok = {1 << 20, 1 << 20, 1 << 20};
  CHECK(ok.numel() == int64_t{1} << 60);
  const Shape big = {int64_t{1} << 32, int64_t{1} << 32};  // 2^64 elements: numel wrapped to 0
  CHECK_THROWS_WITH_AS(big.numel(), doctest::Contains("the element count overflows 64-bit integers"), Error);
  const Tensor t(nullptr, DType::F32, Device::CPU, {int64_t{1} << 31, int64_t{1} << 31});  // 2^62 elements x 4 bytes
  CHECK_THROWS_WITH_AS(t.nbytes(), doctest::Contains("bytes of a f32 tensor of shape"), Error);
  CHECK_THROWS_AS(empty({int64_t{1} << 31, int64_t{1} << 31}, DType::F32, Device::CPU), Error);
}

TEST_CASE("allocator: a request larger than any memory is refused at once (its size class used to loop forever)") {
  CHECK_THROWS_WITH_AS(Buffer(std::numeric_limits<size_t>::max(), Device::CPU),
                       doctest::Contains("more than any host holds"), Error);
  CHECK_THROWS_WITH_AS(Buffer(size_t{1} << 63, Device::CPU), doctest::Contains("bytes of cpu memory"), Error);
  // Past the limit but below 2^64: the host says it is out of memory, with what is in use.
  CHECK_THROWS_WITH_AS(Buffer(size_t{1} << 55, Device::CPU), doctest::Contains("out of host memory allocating"), Error);
  Buffer small(1000, Device::CPU);  // the allocator still works afterwards
  CHECK(small.data() != nullptr);
}

TEST_CASE("parameter tables: offsets and buffer lengths past 64 bits name the parameter") {
  ParamTable t;  // (a table holds no memory)
  for (const char* name : {"a", "b", "c"}) t.add({.name = name, .shape = {int64_t{1} << 30, int64_t{1} << 31}});  // 2^61
  CHECK_THROWS_WITH_AS(t.add({.name = "d", .shape = {int64_t{1} << 30, int64_t{1} << 31}}),
                       doctest::Contains("parameter d (1073741824, 2147483648): the flat parameter buffers' length"),
                       Error);
  ParamTable u;
  CHECK_THROWS_WITH_AS(u.add({.name = "huge", .shape = {int64_t{1} << 40, int64_t{1} << 40}}),
                       doctest::Contains("parameter huge: shape"), Error);
}
