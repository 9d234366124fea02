// XXH64 against published vectors and in pieces; the safetensors writer and strict reader: round
// trips of every float dtype the reader converts, and a corrupt-header matrix where each case
// must fail with a message naming the file and (where there is one) the tensor.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "checkpoint/safetensors.h"
#include "checkpoint/xxhash.h"
#include "core/dtype.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::checkpoint;
using namespace engine::testing;

TEST_CASE("xxh64: published test vectors, and any split of the input gives the same digest") {
  CHECK(xxh64("", 0) == 0xef46db3751d8e999ull);
  CHECK(xxh64("a", 1) == 0xd24ec4f1a98c6e5bull);
  CHECK(xxh64("abc", 3) == 0x44bc2cf5ad770999ull);
  const std::string s = "Nobody inspects the spammish repetition";  // > 32 bytes: the stripe loop
  CHECK(xxh64(s.data(), s.size()) == 0xfbcea83c8a378bf1ull);
  std::vector<unsigned char> data(1000);
  PhiloxKey key = test_key("xxh64");
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(philox_below(key, i, 256));
  const uint64_t whole = xxh64(data.data(), data.size(), 7);
  for (size_t step : {1, 3, 31, 32, 33, 200}) {
    CAPTURE(step);
    Xxh64 h(7);
    for (size_t at = 0; at < data.size(); at += step) h.update(data.data() + at, std::min(step, data.size() - at));
    CHECK(h.digest() == whole);
  }
  uint64_t back = 0;
  CHECK(parse_hex64(hex64(whole), &back));
  CHECK(back == whole);
  CHECK_FALSE(parse_hex64("12345", &back));
  CHECK_FALSE(parse_hex64("ABCDEF0123456789", &back));  // lowercase only
}

namespace {

// A file holding a raw header and `data_bytes` zero bytes after it.
std::string raw_file(const std::string& dir, const std::string& name, const std::string& header, uint64_t data_bytes,
                     int64_t size_field = -1) {
  const std::string path = dir + "/" + name;
  std::string bytes(8, '\0');
  const uint64_t n = size_field >= 0 ? static_cast<uint64_t>(size_field) : header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header;
  bytes.append(data_bytes, '\0');
  write_text(path, bytes);
  return path;
}

}  // namespace

TEST_CASE("safetensors: written tensors read back exactly (F32, BF16, F16, F64, I32) with metadata") {
  const std::string dir = scratch_dir("st-roundtrip");
  const int64_t n = 37;
  Owned x = randn({n}, DType::F32, "st-x");
  const float* xv = x.ptr<float>();
  std::vector<uint16_t> f16(static_cast<size_t>(n));
  // F16 bits of a few exactly representable values, subnormals and infinities included.
  const uint16_t f16_vals[] = {0x0000, 0x3c00, 0xc000, 0x0001, 0x03ff, 0x7bff, 0x7c00, 0xfc00, 0x3555};
  const float f16_expect[] = {0.f, 1.f, -2.f, 5.9604645e-8f, 6.097555e-5f, 65504.f, INFINITY, -INFINITY, 0.33325195f};
  SafetensorsWriter w;
  w.set_metadata({{"format", "pt"}, {"note", "x"}});
  w.add("a.f32", "F32", {n}, [&](OutFile& f) { f.write(xv, n * 4); });
  w.add("b.bf16", "BF16", {1, n}, [&](OutFile& f) {
    std::vector<unsigned char> b;
    encode_f32(xv, n, "BF16", &b);
    f.write(b.data(), b.size());
  });
  w.add("c.f16", "F16", {9}, [&](OutFile& f) { f.write(f16_vals, sizeof f16_vals); });
  w.add("d.f64", "F64", {n, 1}, [&](OutFile& f) {
    for (int64_t i = 0; i < n; ++i) {
      const double d = xv[i];
      f.write(&d, 8);
    }
  });
  w.add("e.empty", "F32", {0, 3}, [](OutFile&) {});
  w.add("f.i32", "I32", {2}, [](OutFile& f) {
    const int32_t v[2] = {-3, 9};
    f.write(v, 8);
  });
  const FileDigest d = w.write(dir + "/t.safetensors");
  CHECK(d.bytes == std::filesystem::file_size(dir + "/t.safetensors"));

  SafetensorsFile r(dir + "/t.safetensors");
  CHECK(r.metadata().at("note") == "x");
  CHECK(r.data_offset() % 8 == 0);
  REQUIRE(r.tensors().size() == 6);
  std::vector<float> got(static_cast<size_t>(n));
  r.read_f32(r.at("a.f32"), 0, n, got.data());
  for (int64_t i = 0; i < n; ++i) CHECK(got[static_cast<size_t>(i)] == xv[i]);
  r.read_f32(r.at("b.bf16"), 0, n, got.data());
  for (int64_t i = 0; i < n; ++i) CHECK(got[static_cast<size_t>(i)] == static_cast<float>(bf16(xv[i])));
  CHECK(r.at("b.bf16").shape == std::vector<int64_t>{1, n});
  r.read_f32(r.at("d.f64"), 3, 10, got.data());
  for (int64_t i = 3; i < 10; ++i) CHECK(got[static_cast<size_t>(i - 3)] == xv[i]);
  float h[9];
  r.read_f32(r.at("c.f16"), 0, 9, h);
  for (int i = 0; i < 9; ++i) CHECK(h[i] == f16_expect[i]);
  CHECK(r.at("e.empty").numel == 0);
  check_mentions(error_of([&] { r.read_f32(r.at("f.i32"), 0, 2, got.data()); }), {"t.safetensors", "f.i32", "I32"});
  check_mentions(error_of([&] { r.at("nope"); }), {"t.safetensors", "nope"});
  check_mentions(error_of([&] { r.read_f32(r.at("a.f32"), 5, n + 1, got.data()); }), {"a.f32", "out of range"});
}

TEST_CASE("safetensors: a corrupt header is rejected, naming the file and the tensor") {
  const std::string dir = scratch_dir("st-corrupt");
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  const std::string good = "{" + entry("w", "F32", "[2,3]", 0, 24) + "," + entry("b", "BF16", "[4]", 24, 32) + "}";
  struct Case {
    const char* name;
    std::string header;
    uint64_t data_bytes;
    int64_t size_field;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"shorter than the size field", "", 0, -2, {"shorter than the 8-byte"}},
      {"header size past the end", good, 32, 1 << 20, {"does not fit the file"}},
      {"header size over the limit", good, 32, int64_t{200'000'000}, {"larger than the limit"}},
      {"not JSON", "{\"w\": {\"dtype\": ", 0, -1, {"not valid JSON"}},
      {"not an object", "[1, 2, 3]", 0, -1, {"not a JSON object"}},
      {"unknown dtype", "{" + entry("w", "F13", "[2]", 0, 8) + "}", 8, -1, {"'w'", "unknown dtype", "F13"}},
      {"shape vs bytes", "{" + entry("w", "F32", "[2,3]", 0, 20) + "}", 20, -1, {"'w'", "needs 6 x 4 bytes"}},
      {"negative size", "{" + entry("w", "F32", "[-2]", 0, 8) + "}", 8, -1, {"'w'", "negative"}},
      {"gap between tensors", "{" + entry("w", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[1]", 12, 16) + "}", 16,
       -1, {"'b'", "gap"}},
      {"overlapping tensors", "{" + entry("w", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", 12,
       -1, {"'b'", "overlap"}},
      {"offsets past the data (truncated)", good, 30, -1, {"'b'", "run past the data section", "truncated"}},
      {"trailing bytes", good, 40, -1, {"trailing bytes"}},
      {"not starting at 0", "{" + entry("w", "F32", "[1]", 4, 8) + "}", 8, -1, {"'w'", "gap"}},
      {"end before begin", "{" + entry("w", "F32", "[0]", 8, 4) + "}", 8, -1, {"'w'", "end before they begin"}},
      {"duplicate name", "{" + entry("w", "F32", "[1]", 0, 4) + "," + entry("w", "F32", "[1]", 4, 8) + "}", 8, -1,
       {"'w'", "twice"}},
      {"unknown field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, -1,
       {"'w'", "unknown field 'x'"}},
      {"missing data_offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, -1, {"'w'", "data_offsets"}},
      {"float offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4, -1,
       {"'w'", "data_offsets"}},
      {"metadata not strings", "{\"__metadata__\":{\"a\":1}," + entry("w", "F32", "[1]", 0, 4) + "}", 4, -1,
       {"__metadata__", "'a'"}},
  };
  for (const Case& k : cases) {
    SUBCASE(k.name) {
      const std::string path = k.size_field == -2 ? dir + "/short.safetensors"
                                                  : raw_file(dir, "c.safetensors", k.header, k.data_bytes, k.size_field);
      if (k.size_field == -2) write_text(path, "abc");
      std::vector<std::string> expect = k.expect;
      expect.push_back(path);
      check_mentions(error_of([&] { SafetensorsFile f(path); }), expect);
    }
  }
  SUBCASE("the good header reads") {
    const std::string path = raw_file(dir, "good.safetensors", good, 32);
    SafetensorsFile f(path);
    CHECK(f.tensors().size() == 2);
  }
}
