// The sharded dataset manifest (data/manifest_dataset.h): shards written by the engine's own
// writer read back as one dataset (documents, spans, sizes, token-id checks naming the shard),
// sampled through the engine's sample source, and every inconsistency refused with the file and
// key named. The manifests prepare_data.py writes are tested in test_prepare_data.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/dataset_writer.h"
#include "data/manifest_dataset.h"
#include "data/sampler.h"
#include "data/token_scan.h"
#include "tests/common/testing.h"
#include "tests/data/data_test_util.h"

namespace engine {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Shards {
  std::string dir, manifest;
  std::vector<std::vector<int32_t>> docs;   // all documents, in manifest order
  std::vector<std::vector<TokenSpan>> spans;
  json m;
};

void write_json(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump(1);
}

// Three shards (the middle one empty of documents is not allowed by the writer, so: 5, 1 and 7
// documents) with spans, and their manifest as prepare_data.py writes it.
Shards make_shards(const std::string& name, int vocab = 300) {
  Shards s;
  s.dir = data_testing::data_test_dir(name);
  s.manifest = s.dir + "/c.manifest.json";
  s.m = {{"format", "engine-token-manifest"}, {"version", 1}, {"complete", true}, {"dtype", "uint16"},
         {"vocab_size", vocab}, {"loss_masking_spans", true}, {"tokenizer", {{"kind", "byte-level"}}},
         {"options", json::object()}, {"inputs", json::array()}};
  int64_t docs = 0, tokens = 0;
  const int counts[3] = {5, 1, 7};
  for (int k = 0; k < 3; ++k) {
    auto d = data_testing::random_documents(str_cat(name, k), counts[k], 1, 40, vocab);
    std::vector<std::vector<TokenSpan>> sp(d.size());
    for (size_t i = 0; i < d.size(); ++i)
      if (d[i].size() > 2 && i % 2 == 0) sp[i] = {{0, static_cast<int64_t>(d[i].size()) / 2}};
    const std::string prefix = str_cat(s.dir, "/c-", k);
    write_token_dataset(prefix, d, vocab, sp);
    int64_t t = 0;
    for (auto& x : d) t += static_cast<int64_t>(x.size());
    s.m["shards"].push_back({{"prefix", str_cat("c-", k)}, {"documents", d.size()}, {"tokens", t},
                             {"bin_bytes", fs::file_size(prefix + ".bin")},
                             {"idx_bytes", fs::file_size(prefix + ".idx")}, {"next", {k + 1, 0, 0, 0}}});
    docs += static_cast<int64_t>(d.size());
    tokens += t;
    s.docs.insert(s.docs.end(), d.begin(), d.end());
    s.spans.insert(s.spans.end(), sp.begin(), sp.end());
  }
  s.m["documents"] = docs;
  s.m["tokens"] = tokens;
  write_json(s.manifest, s.m);
  return s;
}

TEST_CASE("manifest: the shards read as one dataset, in order") {
  Shards s = make_shards("manifest_read");
  auto ds = open_token_dataset(s.manifest);
  auto& m = dynamic_cast<const ManifestDataset&>(*ds);
  CHECK(m.num_shards() == 3);
  CHECK(ds->parts().size() == 3);
  CHECK(ds->token_type() == TokenType::U16);
  CHECK(ds->has_loss_masking_spans());
  REQUIRE(ds->num_documents() == static_cast<int64_t>(s.docs.size()));
  int64_t tokens = 0;
  for (int64_t d = 0; d < ds->num_documents(); ++d) {
    INFO("document " << d);
    CHECK(ds->read(d) == s.docs[d]);
    CHECK(ds->document_size(d) == static_cast<int64_t>(s.docs[d].size()));
    CHECK(ds->loss_masking_spans(d) == s.spans[d]);
    tokens += ds->document_size(d);
  }
  CHECK(ds->num_tokens() == tokens);
  CHECK_THROWS_WITH_AS(ds->read(ds->num_documents()), doctest::Contains("out of range"), Error);
  // The whole-dataset scan and the token-id check (per shard, naming the shard's .bin).
  const TokenIdRange r = ds->scan_token_ids();
  CHECK(r.min >= 0);
  CHECK(r.max < 300);
  TokenScanOptions o;
  o.cache_dir = s.dir + "/cache";
  CHECK_NOTHROW(check_token_ids(*ds, 300, o));
  const TokenLocation at = ds->first_token_outside(1);  // the first token that is not 0
  CHECK(at.doc >= 0);
  CHECK_THROWS_WITH_AS(check_token_ids(*ds, r.max, o), doctest::Contains(".bin: document "), Error);
}

TEST_CASE("manifest: a sample source over it masks the spans") {
  Shards s = make_shards("manifest_sample");
  // Documents cut across samples, so every document and its span is seen (without cutting, only
  // the documents that fit a sample are, and with some seeds none of those had a masked label).
  Config c = data_testing::data_config({s.manifest}, 8, 300, /*truncate_documents=*/true);
  auto source = make_sample_source(c, Split::Train, 40);
  REQUIRE(source);
  CHECK(source->describe().find(s.manifest) != std::string::npos);
  int64_t masked = 0;
  for (int64_t i = 0; i < source->num_samples(); ++i) {
    Sample x = source->get(i);
    for (uint8_t v : x.loss_mask) masked += v == 0;
  }
  CHECK(masked > 0);
  CHECK_NOTHROW(source->check_token_ids());
}

TEST_CASE("manifest: what is refused, naming the file and the key") {
  struct Case {
    const char* what;
    std::function<void(Shards&)> edit;
    std::string expected;  // "%" is replaced by the test folder
  };
  const std::vector<Case> cases = {
      {"incomplete", [](Shards& s) { s.m["complete"] = false; }, "c.manifest.json: the preparation that writes it has not finished"},
      {"unknown key", [](Shards& s) { s.m["shard_order"] = "random"; }, "c.manifest.json: shard_order: unknown key"},
      {"unknown shard key", [](Shards& s) { s.m["shards"][1]["weight"] = 2; }, "c.manifest.json: shards[1].weight: unknown key"},
      {"format", [](Shards& s) { s.m["format"] = "other"; }, "c.manifest.json: format: expected \"engine-token-manifest\""},
      {"version", [](Shards& s) { s.m["version"] = 2; }, "c.manifest.json: version: unsupported version 2"},
      {"dtype", [](Shards& s) { s.m["dtype"] = "float32"; }, "c.manifest.json: dtype: expected \"uint16\" or \"int32\""},
      {"dtype vs vocab", [](Shards& s) { s.m["vocab_size"] = 70000; }, "c.manifest.json: dtype: \"uint16\" does not match vocab_size 70000"},
      {"no shards", [](Shards& s) { s.m["shards"] = json::array(); }, "c.manifest.json: shards: expected a non-empty list"},
      {"missing count", [](Shards& s) { s.m["shards"][0].erase("tokens"); }, "c.manifest.json: shards[0].tokens: missing"},
      {"negative", [](Shards& s) { s.m["shards"][0]["documents"] = -1; }, "shards[0].documents: expected a non-negative integer"},
      {"twice", [](Shards& s) { s.m["shards"][2]["prefix"] = "c-0"; }, "shards[2].prefix: \"c-0\" is listed twice"},
      {"missing file", [](Shards& s) { fs::remove(s.dir + "/c-1.idx"); }, "shards[1]: shard file %/c-1.idx is missing"},
      {"size", [](Shards& s) { std::ofstream(s.dir + "/c-2.bin", std::ios::app) << "xx"; },
       "%/c-2.bin: " },
      {"documents", [](Shards& s) { s.m["shards"][0]["documents"] = 4; s.m["documents"] = 12; },
       "%/c-0.idx: documents 5, but %/c.manifest.json records 4 (shards[0])"},
      {"tokens total", [](Shards& s) { s.m["tokens"] = 1; }, "c.manifest.json: tokens: 1, but the shards hold"},
      {"spans", [](Shards& s) { s.m["loss_masking_spans"] = false; }, "loss-masking spans present, but"},
      {"sha256", [](Shards& s) { s.m["shards"][0]["bin_sha256"] = "XYZ"; }, "shards[0].bin_sha256: expected 64 lowercase hex digits"},
  };
  for (const Case& c : cases) {
    SUBCASE(c.what) {
      std::string name = str_cat("manifest_bad_", c.what);
      std::replace(name.begin(), name.end(), ' ', '_');
      Shards s = make_shards(name);
      c.edit(s);
      write_json(s.manifest, s.m);
      std::string expected = c.expected;
      for (size_t at; (at = expected.find('%')) != std::string::npos;) expected.replace(at, 1, s.dir);
      CHECK_THROWS_WITH_AS(open_token_dataset(s.manifest), doctest::Contains(expected.c_str()), Error);
    }
  }
  SUBCASE("not JSON") {
    const std::string dir = data_testing::data_test_dir("manifest_bad_json");
    std::ofstream(dir + "/x.manifest.json") << "{\"format\": ";
    CHECK_THROWS_WITH_AS(open_token_dataset(dir + "/x.manifest.json"), doctest::Contains("x.manifest.json: not valid JSON"), Error);
    CHECK_THROWS_WITH_AS(open_token_dataset(dir + "/none.manifest.json"), doctest::Contains("cannot open"), Error);
  }
}

}  // namespace
}  // namespace engine
