// The token-id scan before training (data/token_scan.h): the first id outside the vocabulary is
// found wherever it is (small documents grouped, a long document split over threads), named by
// file, document, token and byte offset; the range is cached next to the dataset, else in the
// user cache, keyed by the files' stamps, and a changed or too recent file is scanned again.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "data/dataset_writer.h"
#include "data/sampler.h"
#include "data/token_scan.h"
#include "tests/common/testing.h"
#include "tests/data/data_test_util.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Options that cache a file however recently it was written, in a cache folder of the test's own.
TokenScanOptions fresh(const std::string& dir) {
  TokenScanOptions o;
  o.settle_seconds = 0;
  o.cache_dir = dir + "/user-cache";
  return o;
}

}  // namespace

TEST_CASE("token scan: the first id outside the vocabulary, named by file, document, token and byte offset") {
  const std::string dir = data_testing::data_test_dir("scan_errors");
  SUBCASE("small documents, .bin/.idx") {
    write_token_dataset(dir + "/a", {{1, 2, 3}, {4, 5, 6, 7, 399, 8}, {9, 399}}, 400);
    auto ds = open_token_dataset(dir + "/a");
    CHECK(ds->scan_token_ids() == TokenIdRange{1, 399});
    check_token_ids(*ds, 400, fresh(dir));
    const std::string e = error_of([&] { check_token_ids(*ds, 399, fresh(dir)); });
    CHECK(e.find(dir + "/a.bin: document 1, token offset 4 (byte 14): token id 399 >= model.vocab_size (399)") !=
          std::string::npos);
  }
  SUBCASE(".fast_llm_dataset") {
    write_token_dataset(dir + "/b.fast_llm_dataset", {{1, 2}, {3, 77}}, 100);
    auto ds = open_token_dataset(dir + "/b.fast_llm_dataset");
    const std::string e = error_of([&] { check_token_ids(*ds, 50, fresh(dir)); });
    CHECK(e.find(dir + "/b.fast_llm_dataset: document 1, token offset 1 (byte ") != std::string::npos);
    CHECK(e.find("token id 77 >= model.vocab_size (50)") != std::string::npos);
  }
  SUBCASE("a negative id of a signed token type") {
    data_testing::RawIndex r;
    r.dtype_code = 3;  // int16
    r.docs = {{1, 2}, {3, -5, 4}};
    data_testing::write_raw_index(dir + "/neg", r);
    auto ds = open_token_dataset(dir + "/neg");
    CHECK(ds->scan_token_ids() == TokenIdRange{-5, 4});
    CHECK(error_of([&] { check_token_ids(*ds, 10, fresh(dir)); })
              .find("neg.bin: document 1, token offset 1 (byte 6): token id -5 is negative") != std::string::npos);
  }
  SUBCASE("a long document scanned in pieces: the first bad id in document order") {
    std::vector<int32_t> big((int64_t{3} << 20) / 2, 7);  // 1.5M tokens: two pieces
    big[1200000] = 90;
    big.back() = 91;
    write_token_dataset(dir + "/long", {{1, 2, 3}, std::vector<int32_t>(5, 4), big, {95}}, 100);
    auto ds = open_token_dataset(dir + "/long");
    CHECK(ds->scan_token_ids() == TokenIdRange{1, 95});
    const std::string e = error_of([&] { check_token_ids(*ds, 50, fresh(dir)); });
    INFO(e);
    CHECK(e.find("document 2, token offset 1200000 (byte " + std::to_string((8 + 1200000) * 2) +
                 "): token id 90 >= model.vocab_size (50)") != std::string::npos);
  }
  SUBCASE("the sample source names the config entry") {
    write_token_dataset(dir + "/c", {{1, 2, 3}, {4, 5, 6, 7, 399, 8}, {9}}, 400);
    Config c = data_testing::data_config({dir + "/c"}, 4, 399, true);
    auto src = make_sample_source(c, Split::Train, 3);
    CHECK(error_of([&] { src->check_token_ids(); })
              .rfind("data.train[0]: " + dir + "/c.bin: document 1, token offset 4 (byte 14): token id 399", 0) == 0);
  }
}

TEST_CASE("token scan: cached next to the dataset, keyed by the files, used on the next open") {
  const std::string dir = data_testing::data_test_dir("scan_cache");
  write_token_dataset(dir + "/a", {{1, 2, 3}, {4, 30}}, 40);
  const std::string sidecar = dir + "/a.token_ids.json";
  {
    auto ds = open_token_dataset(dir + "/a");
    const TokenScan s = scan_token_ids_cached(*ds, fresh(dir));
    CHECK(s.range == TokenIdRange{1, 30});
    CHECK_FALSE(s.from_cache);
    CHECK(s.cache_file == sidecar);
    CHECK(fs::exists(sidecar));
  }
  {
    auto ds = open_token_dataset(dir + "/a");
    const TokenScan s = scan_token_ids_cached(*ds, fresh(dir));
    CHECK(s.from_cache);
    CHECK(s.cache_file == sidecar);
    CHECK(s.range == TokenIdRange{1, 30});
  }
  // The entry is what the check trusts: one edited by hand to claim id 35 is read (and named).
  std::ifstream in(sidecar);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = text.find("\"max\":30");
  REQUIRE(at != std::string::npos);
  text.replace(at, 8, "\"max\":35");
  std::ofstream(sidecar) << text;
  {
    auto ds = open_token_dataset(dir + "/a");
    CHECK(error_of([&] { check_token_ids(*ds, 32, fresh(dir)); }).find("token-id cache " + sidecar) != std::string::npos);
  }
  // A changed file (in place, same size: a new modification time) is scanned again.
  {
    std::fstream f(dir + "/a.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2 * 4);
    const char id[2] = {33, 0};
    f.write(id, 2);
  }
  fs::last_write_time(dir + "/a.bin", fs::last_write_time(dir + "/a.bin") + std::chrono::seconds(10));
  {
    auto ds = open_token_dataset(dir + "/a");
    const TokenScan s = scan_token_ids_cached(*ds, fresh(dir));
    CHECK_FALSE(s.from_cache);
    CHECK(s.range == TokenIdRange{1, 33});
    CHECK(error_of([&] { check_token_ids(*ds, 32, fresh(dir)); }).find("document 1, token offset 1 (byte 8): token id 33") !=
          std::string::npos);
  }
}

TEST_CASE("token scan: a damaged or wrongly typed cache entry is no entry: the files are scanned") {
  const std::string dir = data_testing::data_test_dir("scan_cache_damaged");
  write_token_dataset(dir + "/a", {{1, 2, 3}, {4, 30}}, 40);
  const std::string sidecar = dir + "/a.token_ids.json";
  // Found by fuzz_token_cache: a string "version" made the reader throw a bare JSON type error.
  for (const char* text : {"{\"version\":\"1\",\"files\":[],\"min\":1,\"max\":2}", "{\"version\":1.5}", "[1]", "{",
                           "{\"version\":1,\"files\":[],\"min\":\"1\",\"max\":null}"}) {
    CAPTURE(text);
    std::ofstream(sidecar) << text;
    auto ds = open_token_dataset(dir + "/a");
    TokenScanOptions o = fresh(dir);
    o.settle_seconds = 1e9;  // never rewrite the entry under test
    const TokenScan s = scan_token_ids_cached(*ds, o);
    CHECK_FALSE(s.from_cache);
    CHECK(s.range == TokenIdRange{1, 30});
  }
}

TEST_CASE("token scan: a folder that takes no entry falls back to the user cache; recent files are not cached") {
  const std::string dir = data_testing::data_test_dir("scan_fallback");
  write_token_dataset(dir + "/a", {{1, 2, 3}}, 40);
  // The sidecar's place is taken by a folder that is not empty: the entry cannot go there.
  fs::create_directories(dir + "/a.token_ids.json/x");
  {
    auto ds = open_token_dataset(dir + "/a");
    const TokenScan s = scan_token_ids_cached(*ds, fresh(dir));
    CHECK_FALSE(s.from_cache);
    CHECK(s.cache_file.rfind(dir + "/user-cache/token_ids/", 0) == 0);
    CHECK(fs::is_regular_file(s.cache_file));
    auto again = open_token_dataset(dir + "/a");
    const TokenScan t = scan_token_ids_cached(*again, fresh(dir));
    CHECK(t.from_cache);
    CHECK(t.cache_file == s.cache_file);
    CHECK(t.range == TokenIdRange{1, 3});
  }
  // With the default settling time a file written just now is scanned but not cached.
  write_token_dataset(dir + "/b", {{4, 5}}, 40);
  {
    auto ds = open_token_dataset(dir + "/b");
    TokenScanOptions o;
    o.cache_dir = dir + "/user-cache";
    const TokenScan s = scan_token_ids_cached(*ds, o);
    CHECK(s.range == TokenIdRange{4, 5});
    CHECK(s.cache_file.empty());
    CHECK_FALSE(fs::exists(dir + "/b.token_ids.json"));
  }
}

TEST_CASE("token scan: the user cache folder is $XDG_CACHE_HOME/engine, else ~/.cache/engine") {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  ::setenv("HOME", "/h", 1);
  CHECK(default_token_cache_dir() == "/x/cache/engine");
  ::unsetenv("XDG_CACHE_HOME");
  CHECK(default_token_cache_dir() == "/h/.cache/engine");
  ::unsetenv("HOME");
  CHECK(default_token_cache_dir().empty());
  if (xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (home) ::setenv("HOME", saved_home.c_str(), 1);
}

}  // namespace engine
