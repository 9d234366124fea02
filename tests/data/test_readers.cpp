// Token dataset readers and writers: round trips for .bin/.idx v1, v2 (spans) and
// .fast_llm_dataset (with and without spans), hand-built v3 files with preference spans, every
// token dtype, out-of-range reads and atomic writes.
#include <doctest/doctest.h>

#include <filesystem>

#include "data/dataset_writer.h"
#include "data/memmap_dataset.h"
#include "data/token_dataset.h"
#include "tests/common/testing.h"
#include "tests/data/data_test_util.h"

namespace engine {
namespace {

using data_testing::data_test_dir;

// Random spans [begin, end) inside each document (some documents without any).
std::vector<std::vector<TokenSpan>> random_spans(const std::vector<std::vector<int32_t>>& docs,
                                                 const std::string& name) {
  PhiloxKey key = testing::test_key(name);
  uint64_t c = 0;
  std::vector<std::vector<TokenSpan>> out(docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    int64_t size = static_cast<int64_t>(docs[d].size());
    int64_t pos = 0;
    while (size > 0 && pos < size && philox_below(key, c++, 3) != 0) {
      int64_t b = pos + static_cast<int64_t>(philox_below(key, c++, static_cast<uint64_t>(size - pos)));
      int64_t e = b + 1 + static_cast<int64_t>(philox_below(key, c++, static_cast<uint64_t>(size - b)));
      out[d].push_back({b, e});
      pos = e + 1;
    }
  }
  return out;
}

void check_same(const TokenDataset& ds, const std::vector<std::vector<int32_t>>& docs,
                const std::vector<std::vector<TokenSpan>>& spans) {
  REQUIRE(ds.num_documents() == static_cast<int64_t>(docs.size()));
  int64_t total = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    INFO("document " << d);
    int64_t doc = static_cast<int64_t>(d);
    CHECK(ds.document_size(doc) == static_cast<int64_t>(docs[d].size()));
    CHECK(ds.read(doc) == docs[d]);
    if (docs[d].size() >= 3) {
      std::vector<int32_t> mid(docs[d].begin() + 1, docs[d].end() - 1);
      CHECK(ds.read(doc, 1, static_cast<int64_t>(mid.size())) == mid);
    }
    std::vector<TokenSpan> expected;
    if (!spans.empty())
      for (const TokenSpan& s : spans[d])
        if (s.end > s.begin) expected.push_back(s);
    CHECK(ds.loss_masking_spans(doc) == expected);
    total += static_cast<int64_t>(docs[d].size());
  }
  CHECK(ds.num_tokens() == total);
  CHECK(ds.has_loss_masking_spans() == !spans.empty());
}

TEST_CASE("token datasets: writer -> reader round trips (v1, v2, fast_llm; uint16 and int32)") {
  struct Case {
    const char* file;  // relative to the case folder
    int vocab;
    bool spans;
    TokenType type;
    int version;  // .idx version, 0 for .fast_llm_dataset
  };
  const Case cases[] = {
      {"v1_u16", 50257, false, TokenType::U16, 1},
      {"v1_i32", 70001, false, TokenType::I32, 1},
      {"v2_u16", 32003, true, TokenType::U16, 2},
      {"v2_i32", 131073, true, TokenType::I32, 2},
      {"plain_u16.fast_llm_dataset", 50257, false, TokenType::U16, 0},
      {"spans_i32.fast_llm_dataset", 100003, true, TokenType::I32, 0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.file);
    {
      std::string dir = data_test_dir(str_cat("roundtrip_", c.file));
      std::string path = dir + "/" + c.file;
      auto docs = data_testing::random_documents(str_cat("docs ", c.file), 23, 0, 41, c.vocab);
      docs[3] = {c.vocab - 1};  // a one-token document with the largest id
      docs[5].clear();          // an empty document
      std::vector<std::vector<TokenSpan>> spans;
      if (c.spans) spans = random_spans(docs, str_cat("spans ", c.file));
      if (c.spans) spans[7].push_back({0, 0});  // an empty span is dropped
      write_token_dataset(path, docs, c.vocab, spans);
      auto ds = open_token_dataset(path);
      CHECK(ds->token_type() == c.type);
      if (c.version) CHECK(dynamic_cast<const MemmapDataset&>(*ds).version() == c.version);
      check_same(*ds, docs, spans);
      CHECK_THROWS_AS(ds->read(0, 0, ds->document_size(0) + 1), Error);
      CHECK_THROWS_AS(ds->read(ds->num_documents(), 0, 0), Error);
      CHECK_THROWS_AS(ds->document_size(-1), Error);
      // Nothing left behind but the dataset files.
      int files = 0;
      for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
      CHECK(files == (c.version ? 2 : 1));
    }
  }
}

TEST_CASE("token datasets: empty datasets and the .bin/.idx suffix of a path") {
  std::string dir = data_test_dir("empty");
  write_token_dataset(dir + "/e", {}, 100);
  write_token_dataset(dir + "/e.fast_llm_dataset", {}, 100);
  for (std::string p : {dir + "/e", dir + "/e.idx", dir + "/e.bin", dir + "/e.fast_llm_dataset"}) {
    auto ds = open_token_dataset(p);
    CHECK(ds->num_documents() == 0);
    CHECK(ds->num_tokens() == 0);
  }
}

TEST_CASE("token datasets: hand-built v3 files with preference spans") {
  std::string dir = data_test_dir("v3");
  for (bool loss_spans : {false, true}) {
    CAPTURE(loss_spans);
    data_testing::RawIndex r;
    r.version = 3;
    r.dtype_code = 4;
    r.docs = {{5, 6, 7, 8, 9, 10}, {11, 12, 13}, {14}};
    r.has_spans = loss_spans;
    r.spans = {{{0, 1}, {4, 5}}, {}, {{0, 0}}};
    r.has_preference = true;
    r.chosen = {{1, 2}, {0, 1}, {0, 0}};
    r.rejected = {{3, 5}, {2, 2}, {0, 0}};
    write_raw_index(dir + "/v3", r);
    auto ds = open_token_dataset(dir + "/v3");
    auto& mm = dynamic_cast<const MemmapDataset&>(*ds);
    CHECK(mm.version() == 3);
    CHECK(mm.has_preference_spans());
    CHECK(ds->num_tokens() == 10);
    CHECK(ds->read(0) == std::vector<int32_t>{5, 6, 7, 8, 9, 10});
    CHECK(ds->read(2) == std::vector<int32_t>{14});
    CHECK(ds->has_loss_masking_spans() == loss_spans);
    if (loss_spans) {
      // Inclusive [0, 1] and [4, 5] on disk become [0, 2) and [4, 6).
      CHECK(ds->loss_masking_spans(0) == std::vector<TokenSpan>{{0, 2}, {4, 6}});
      CHECK(ds->loss_masking_spans(1).empty());
      CHECK(ds->loss_masking_spans(2) == std::vector<TokenSpan>{{0, 1}});
    }
  }
}

TEST_CASE("token datasets: every integer dtype of the .idx code table") {
  std::string dir = data_test_dir("dtypes");
  struct Case {
    uint8_t code;
    TokenType type;
    int64_t big;  // the largest id the type holds (within int32)
  };
  const Case cases[] = {{1, TokenType::U8, 255},     {2, TokenType::I8, 127},
                        {3, TokenType::I16, 32767},  {4, TokenType::I32, 2147483647},
                        {5, TokenType::I64, 2147483647}, {8, TokenType::U16, 65535}};
  for (const Case& c : cases) {
    CAPTURE(int(c.code));
    data_testing::RawIndex r;
    r.dtype_code = c.code;
    r.docs = {{0, 1, c.big}, {}, {c.big - 1, 3}};
    write_raw_index(dir + "/t", r);
    auto ds = open_token_dataset(dir + "/t");
    CHECK(ds->token_type() == c.type);
    CHECK(ds->read(0) == std::vector<int32_t>{0, 1, static_cast<int32_t>(c.big)});
    CHECK(ds->read(2) == std::vector<int32_t>{static_cast<int32_t>(c.big - 1), 3});
  }
  // Stored values that are not token ids: an error naming the file, document and offset.
  data_testing::RawIndex r;
  r.dtype_code = 5;
  r.docs = {{1, 2}, {3, int64_t{1} << 40}};
  write_raw_index(dir + "/big", r);
  auto ds = open_token_dataset(dir + "/big");
  CHECK(ds->read(0) == std::vector<int32_t>{1, 2});
  CHECK_THROWS_WITH_AS(ds->read(1), doctest::Contains(str_cat(dir, "/big.bin: document 1, token offset 1").c_str()), Error);
  r.dtype_code = 2;
  r.docs = {{1, -3}};
  write_raw_index(dir + "/neg", r);
  CHECK_THROWS_WITH_AS(open_token_dataset(dir + "/neg")->read(0),
                       doctest::Contains("document 0, token offset 1: token id -3"), Error);
}

TEST_CASE("token datasets: writers validate input and write atomically") {
  std::string dir = data_test_dir("writer");
  const std::vector<int32_t> doc = {1, 2, 3};
  for (std::string path : {dir + "/w", dir + "/w.fast_llm_dataset"}) {
    CAPTURE(path);
    {
      auto w = make_token_dataset_writer(path, 10, false);
      CHECK_THROWS_WITH_AS(w->add_document(std::vector<int32_t>{1, 10}), doctest::Contains("id 10 outside [0, vocab_size = 10)"), Error);
      CHECK_THROWS_AS(w->add_document(std::vector<int32_t>{-1}), Error);
      const TokenSpan span{0, 1};
      CHECK_THROWS_AS(w->add_document(doc, std::span<const TokenSpan>(&span, 1)), Error);
      w->add_document(doc);
      // Destroyed without finish(): no file appears.
    }
    for (auto& e : std::filesystem::directory_iterator(dir)) FAIL("left behind: " << e.path());
    {
      auto w = make_token_dataset_writer(path, 10, true);
      const TokenSpan bad{2, 4};
      CHECK_THROWS_WITH_AS(w->add_document(doc, std::span<const TokenSpan>(&bad, 1)),
                           doctest::Contains("span [2, 4) outside its 3 tokens"), Error);
    }
    // A finished dataset stays intact while a second writer is open and then abandoned.
    write_token_dataset(path, {doc}, 10);
    { make_token_dataset_writer(path, 10)->add_document(std::vector<int32_t>{4, 5}); }
    CHECK(open_token_dataset(path)->read(0) == doc);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
}

}  // namespace
}  // namespace engine
