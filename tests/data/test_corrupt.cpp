// Corrupt token datasets: every case must throw an engine::Error naming the file and the byte
// offset or field, never crash or read out of bounds. The matrix is data: one row per
// corruption of a valid file, plus truncation at every 7th byte of small files.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "data/dataset_writer.h"
#include "data/token_dataset.h"
#include "tests/common/testing.h"
#include "tests/data/data_test_util.h"

namespace engine {
namespace {

using Bytes = std::vector<unsigned char>;

template <typename T>
void poke(Bytes& b, size_t offset, T v) {
  REQUIRE(offset + sizeof(T) <= b.size());
  std::memcpy(b.data() + offset, &v, sizeof(T));
}

// The .idx v2 written below: 4 documents of sizes {3, 0, 5, 2} as uint16, spans.
// Layout: magic 0, version 9, has_spans 17, dtype 18, N 19, doc_idx length 27, sizes 35,
// pointers 51, span counts 83, spans 99 (3 spans: 24 bytes), doc_idx 123, end 163.
constexpr size_t kSizes = 35, kPointers = 51, kCounts = 83, kSpans = 99, kDocIdx = 123;

struct IdxCase {
  const char* name;
  std::function<void(Bytes& idx, Bytes& bin)> corrupt;
  const char* file;  // "idx" or "bin": the file the error must name
  const char* what;  // "at offset <n>: <message>" (or a field) the error must contain
};

TEST_CASE("corrupt .bin/.idx files are rejected with the file, offset and what was expected") {
  const IdxCase cases[] = {
      {"bad magic", [](Bytes& i, Bytes&) { i[3] = 'X'; }, "idx", "at offset 0: bad magic"},
      {"version 0", [](Bytes& i, Bytes&) { poke<uint64_t>(i, 9, 0); }, "idx", "at offset 9: unsupported version 0"},
      {"version 4", [](Bytes& i, Bytes&) { poke<uint64_t>(i, 9, 4); }, "idx", "at offset 9: unsupported version 4"},
      {"span flag 2", [](Bytes& i, Bytes&) { i[17] = 2; }, "idx", "at offset 17: has_loss_masking_spans must be 0 or 1"},
      {"dtype unknown", [](Bytes& i, Bytes&) { i[18] = 9; }, "idx", "at offset 18: unknown dtype code 9"},
      {"dtype zero", [](Bytes& i, Bytes&) { i[18] = 0; }, "idx", "at offset 18: unknown dtype code 0"},
      {"dtype float32", [](Bytes& i, Bytes&) { i[18] = 6; }, "idx", "at offset 18: dtype code 6 (float32) is not a token type"},
      {"dtype float64", [](Bytes& i, Bytes&) { i[18] = 7; }, "idx", "at offset 18: dtype code 7 (float64)"},
      {"huge count", [](Bytes& i, Bytes&) { poke<uint64_t>(i, 19, ~uint64_t{0}); }, "idx", "at offset 19: document count"},
      {"count too big", [](Bytes& i, Bytes&) { poke<uint64_t>(i, 19, 14); }, "idx", "at offset 19: document count 14 does not fit"},
      {"count too small", [](Bytes& i, Bytes&) { poke<uint64_t>(i, 19, 3); }, "idx", "at offset 27: doc_idx length 5: expected 1 to N + 1 = 4"},
      {"doc_idx length 0", [](Bytes& i, Bytes&) { poke<uint64_t>(i, 27, 0); }, "idx", "at offset 27: doc_idx length 0"},
      {"negative size", [](Bytes& i, Bytes&) { poke<int32_t>(i, kSizes + 4, -1); }, "idx", "at offset 39: size of document 1 is negative"},
      {"size too big", [](Bytes& i, Bytes&) { poke<int32_t>(i, kSizes + 12, 3); }, "idx", "at offset 75: pointer out of range: document 3 occupies bytes [16, 22)"},
      {"size too small", [](Bytes& i, Bytes&) { poke<int32_t>(i, kSizes + 12, 1); }, "bin", "at offset 18: size mismatch"},
      {"negative pointer", [](Bytes& i, Bytes&) { poke<int64_t>(i, kPointers, -2); }, "idx", "at offset 51: pointer of document 0 is negative"},
      {"pointer not monotone", [](Bytes& i, Bytes&) { poke<int64_t>(i, kPointers + 16, 4); }, "idx", "at offset 67: pointer of document 2 (4) is below the end of the previous document (6)"},
      {"pointer out of range", [](Bytes& i, Bytes&) { poke<int64_t>(i, kPointers + 24, 1000); }, "idx", "at offset 75: pointer out of range"},
      {"huge pointer", [](Bytes& i, Bytes&) { poke<int64_t>(i, kPointers + 24, INT64_MAX); }, "idx", "at offset 75: pointer out of range"},
      {"bin too short", [](Bytes&, Bytes& b) { b.pop_back(); }, "idx", "at offset 75: pointer out of range"},
      {"bin too long", [](Bytes&, Bytes& b) { b.push_back(0); }, "bin", "at offset 20: size mismatch"},
      {"negative span count", [](Bytes& i, Bytes&) { poke<int32_t>(i, kCounts, -1); }, "idx", "at offset 83: span count of document 0 is negative"},
      {"span counts too big", [](Bytes& i, Bytes&) { poke<int32_t>(i, kCounts + 8, 1000); }, "idx", "at offset 91: span counts up to document 2"},
      {"span count int max", [](Bytes& i, Bytes&) { poke<int32_t>(i, kCounts + 12, INT32_MAX); }, "idx", "at offset 95: span counts up to document 3"},
      {"span past document", [](Bytes& i, Bytes&) { poke<int32_t>(i, kSpans + 4, 3); }, "idx", "at offset 99: loss-masking span [0, 3] (inclusive) of document 0 is outside the document's 3 tokens"},
      {"span negative begin", [](Bytes& i, Bytes&) { poke<int32_t>(i, kSpans + 8, -1); }, "idx", "at offset 107: loss-masking span [-1, "},
      {"span reversed", [](Bytes& i, Bytes&) { poke<int32_t>(i, kSpans + 16, 2); poke<int32_t>(i, kSpans + 20, 0); }, "idx", "at offset 115: loss-masking span [2, 0]"},
      {"doc_idx not from 0", [](Bytes& i, Bytes&) { poke<int64_t>(i, kDocIdx, 1); }, "idx", "at offset 123: doc_idx[0] = 1 is inconsistent"},
      {"doc_idx decreasing", [](Bytes& i, Bytes&) { poke<int64_t>(i, kDocIdx + 16, 0); }, "idx", "at offset 139: doc_idx[2] = 0 is inconsistent"},
      {"doc_idx past N", [](Bytes& i, Bytes&) { poke<int64_t>(i, kDocIdx + 32, 5); }, "idx", "at offset 155: doc_idx[4] = 5 is inconsistent"},
      {"doc_idx short of N", [](Bytes& i, Bytes&) { poke<int64_t>(i, kDocIdx + 32, 3); }, "idx", "at offset 155: doc_idx ends at 3: expected N = 4"},
      {"trailing bytes", [](Bytes& i, Bytes&) { i.push_back(0); }, "idx", "at offset 163: unexpected trailing bytes"},
      {"empty idx", [](Bytes& i, Bytes&) { i.clear(); }, "idx", "at offset 0: truncated"},
  };
  std::string dir = data_testing::data_test_dir("corrupt_idx");
  std::string good = dir + "/good";
  write_token_dataset(good, {{1, 2, 3}, {}, {4, 5, 6, 7, 8}, {9, 10}}, 100,
                      {{{0, 1}}, {}, {{0, 5}, {2, 2}}, {{1, 2}}});
  const Bytes idx = data_testing::read_bytes(good + ".idx"), bin = data_testing::read_bytes(good + ".bin");
  REQUIRE(idx.size() == 163);
  REQUIRE(open_token_dataset(good)->num_tokens() == 10);
  // A loop, not SUBCASEs: doctest re-runs the whole test case (and its setup) per SUBCASE.
  for (const IdxCase& c : cases) {
    CAPTURE(c.name);
    Bytes i = idx, b = bin;
    c.corrupt(i, b);
    std::string prefix = dir + "/case";
    data_testing::write_bytes(prefix + ".idx", i);
    data_testing::write_bytes(prefix + ".bin", b);
    std::string expected = str_cat(prefix, ".", c.file, ": ", c.what);
    CHECK_THROWS_WITH_AS(open_token_dataset(prefix), doctest::Contains(expected.c_str()), Error);
  }
}

TEST_CASE("a missing .bin or .idx names the file") {
  std::string dir = data_testing::data_test_dir("missing");
  write_token_dataset(dir + "/d", {{1, 2}}, 100);
  std::filesystem::remove(dir + "/d.bin");
  CHECK_THROWS_WITH_AS(open_token_dataset(dir + "/d"), doctest::Contains(str_cat("cannot open ", dir, "/d.bin").c_str()), Error);
  CHECK_THROWS_WITH_AS(open_token_dataset(dir + "/nothing.fast_llm_dataset"),
                       doctest::Contains("nothing.fast_llm_dataset: No such file"), Error);
}

TEST_CASE("truncated .idx and .fast_llm_dataset files: an error at every 7th byte, never a crash") {
  std::string dir = data_testing::data_test_dir("truncated");
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {4}, {5, 6, 7, 8}};
  const std::vector<std::vector<TokenSpan>> spans = {{{0, 2}}, {}, {{1, 3}, {3, 4}}};
  for (std::string name : {"t", "t.fast_llm_dataset"}) {
    std::string good = dir + "/" + name;
    write_token_dataset(good, docs, 300, spans);
    std::string file = name == "t" ? good + ".idx" : good;
    const Bytes full = data_testing::read_bytes(file);
    const std::string keep = file + ".good";
    std::filesystem::rename(file, keep);
    int cases = 0;
    for (size_t cut = 0; cut < full.size(); cut += 7) {
      CAPTURE(cut);
      data_testing::write_bytes(file, Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut)));
      CHECK_THROWS_WITH_AS(open_token_dataset(good), doctest::Contains((file + ": at offset").c_str()), Error);
      ++cases;
    }
    CHECK(cases >= 10);
    std::filesystem::rename(keep, file);
    CHECK(open_token_dataset(good)->num_tokens() == 8);
  }
}

TEST_CASE("randomly corrupted files: an error or a valid dataset, never a crash") {
  std::string dir = data_testing::data_test_dir("fuzz");
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {4}, {}, {5, 6, 7, 8, 9}};
  const std::vector<std::vector<TokenSpan>> spans = {{{0, 2}}, {}, {}, {{1, 3}, {3, 5}}};
  PhiloxKey key = testing::test_key("fuzz");
  uint64_t c = 0;
  for (std::string name : {"f", "f.fast_llm_dataset"}) {
    std::string path = dir + "/" + name;
    write_token_dataset(path, docs, 300, spans);
    std::string file = name == "f" ? path + ".idx" : path;
    const Bytes good = data_testing::read_bytes(file);
    int opened = 0, rejected = 0;
    for (int trial = 0; trial < 300; ++trial) {
      Bytes b = good;
      const uint64_t flips = 1 + philox_below(key, c++, 3);
      for (uint64_t k = 0; k < flips; ++k) {
        const uint64_t at = philox_below(key, c++, b.size());
        b[at] = static_cast<unsigned char>(philox_below(key, c++, 256));
      }
      data_testing::write_bytes(file, b);
      try {
        auto ds = open_token_dataset(path);
        for (int64_t d = 0; d < ds->num_documents(); ++d) {
          std::vector<int32_t> t = ds->read(d);
          for (const TokenSpan& s : ds->loss_masking_spans(d))
            CHECK((s.begin >= 0 && s.begin < s.end && s.end <= static_cast<int64_t>(t.size())));
        }
        ++opened;
      } catch (const Error&) {
        ++rejected;
      }
    }
    MESSAGE(name << ": " << opened << " opened, " << rejected << " rejected");
    CHECK(rejected > 0);
  }
}

// The .fast_llm_dataset written below: 3 documents {1,2,3} {4} {5,6,7,8} as uint16, with spans
// [0,2) | - | [1,3) [3,4). Layout: header 0, config offset 25, "lm begin" 33, "token begin" 41,
// tokens 52, size_cumsum 68, "token end" 100, "range begin" 109, ranges 120, count_cumsum 144,
// "range end" 160, "lm end" 169, config length 175, JSON 179.
constexpr size_t kConfig = 175, kJson = 179;

struct FlCase {
  const char* name;
  // Edits the bytes before the config and/or the parsed config; a non-empty `raw` replaces the
  // JSON text.
  std::function<void(Bytes& body, nlohmann::json& j, std::string& raw)> corrupt;
  const char* what;
};

TEST_CASE("corrupt .fast_llm_dataset files are rejected with the file, offset and field") {
  using J = nlohmann::json;
  const FlCase cases[] = {
      {"bad magic", [](Bytes& b, J&, std::string&) { b[0] = 'F'; }, "at offset 0: bad magic"},
      {"config offset past the end", [](Bytes& b, J&, std::string&) { b[25] = 0x10; }, "at offset 25: config offset"},
      {"config offset in the header", [](Bytes& b, J&, std::string&) { b[32] = 5; }, "at offset 25: config offset 5 is outside"},
      {"bad JSON", [](Bytes&, J&, std::string& r) { r = "{\"type\": "; }, "at offset 179: bad JSON config"},
      {"JSON not an object", [](Bytes&, J&, std::string& r) { r = "[1, 2]"; }, "at offset 179: config field \"(root)\": expected an object"},
      {"wrong type", [](Bytes&, J& j, std::string&) { j["type"] = "image"; }, "config field \"type\": expected \"language_model\""},
      {"missing tokens", [](Bytes&, J& j, std::string&) { j.erase("tokens"); }, "config field \"tokens\": missing"},
      {"missing begin", [](Bytes&, J& j, std::string&) { j.erase("begin"); }, "config field \"begin\": missing"},
      {"num_tokens a string", [](Bytes&, J& j, std::string&) { j["tokens"]["num_tokens"] = "8"; }, "config field \"tokens.num_tokens\": expected a non-negative integer"},
      {"negative num_documents", [](Bytes&, J& j, std::string&) { j["tokens"]["num_documents"] = -3; }, "config field \"tokens.num_documents\": expected a non-negative integer"},
      {"huge num_tokens", [](Bytes&, J& j, std::string&) { j["tokens"]["num_tokens"] = ~uint64_t{0}; }, "config field \"tokens\": num_documents 3 / num_tokens"},
      {"float data_type", [](Bytes&, J& j, std::string&) { j["tokens"]["data_type"] = "float32"; }, "config field \"tokens.data_type\": unsupported token data_type \"float32\""},
      {"num_tokens mismatch", [](Bytes&, J& j, std::string&) { j["tokens"]["num_tokens"] = 9; }, "config field \"tokens\": section [41, 109) has 68 bytes, expected 70"},
      {"tokens past lm end", [](Bytes&, J& j, std::string&) { j["tokens"]["end"] = 170; }, "config field \"tokens\": section [41, 170) is outside [41, 169)"},
      {"lm end past config", [](Bytes&, J& j, std::string&) { j["end"] = 176; }, "config field \"begin/end\": lm section [33, 176)"},
      {"missing lm begin", [](Bytes& b, J&, std::string&) { b[34] = '!'; }, "at offset 33: missing marker \"lm begin\""},
      {"missing token begin", [](Bytes& b, J&, std::string&) { b[41] = 'X'; }, "at offset 41: missing marker \"token begin\""},
      {"missing token end", [](Bytes& b, J&, std::string&) { b[108] = 'X'; }, "at offset 100: missing marker \"token end\""},
      {"missing range end", [](Bytes& b, J&, std::string&) { b[160] = 'X'; }, "at offset 160: missing marker \"range end\""},
      {"missing lm end", [](Bytes& b, J&, std::string&) { b[174] = 'X'; }, "at offset 169: missing marker \"lm end\""},
      {"size_cumsum not from 0", [](Bytes& b, J&, std::string&) { poke<int64_t>(b, 68, 1); }, "at offset 68: size_cumsum[0] = 1"},
      {"size_cumsum decreasing", [](Bytes& b, J&, std::string&) { poke<int64_t>(b, 84, 2); }, "at offset 84: size_cumsum[2] = 2: expected a non-decreasing"},
      {"size_cumsum total", [](Bytes& b, J&, std::string&) { poke<int64_t>(b, 92, 7); }, "at offset 92: size_cumsum[3] = 7: expected the total 8"},
      {"span past document", [](Bytes& b, J&, std::string&) { poke<int32_t>(b, 124, 4); }, "at offset 120: loss-masking span [0, 4) of document 0 is outside the document's 3 tokens"},
      {"span reversed", [](Bytes& b, J&, std::string&) { poke<int32_t>(b, 128, 3); poke<int32_t>(b, 132, 2); }, "at offset 128: loss-masking span [3, 2) of document 2"},
      {"count_cumsum total", [](Bytes& b, J&, std::string&) { poke<int32_t>(b, 156, 2); }, "at offset 156: loss_masking_spans count_cumsum[3] = 2: expected the total 3"},
      {"span section documents", [](Bytes&, J& j, std::string&) { j["loss_masking_spans"]["num_documents"] = 2; }, "config field \"loss_masking_spans.num_documents\": expected 3"},
      {"span section type", [](Bytes&, J& j, std::string&) { j["loss_masking_spans"]["type"] = "ranges"; }, "config field \"loss_masking_spans.type\": expected \"range\" or \"none\""},
      {"span section count", [](Bytes&, J& j, std::string&) { j["loss_masking_spans"]["num_ranges"] = 1u << 30; }, "config field \"loss_masking_spans.num_ranges\""},
      {"image patches of another type", [](Bytes&, J& j, std::string&) { j["image_patches"] = {{"type", "image"}}; }, "config field \"image_patches.type\": expected \"patch\" or \"none\""},
      {"image patches of floats", [](Bytes&, J& j, std::string&) { j["image_patches"] = {{"type", "patch"}, {"num_documents", 3}, {"data_type", "float32"}}; }, "config field \"image_patches.data_type\": expected \"uint8\""},
      {"advantages", [](Bytes&, J& j, std::string&) { j["advantages"] = {{"type", "token_data"}}; }, "config field \"advantages.type\": a \"token_data\" section"},
      {"image patches not an object", [](Bytes&, J& j, std::string&) { j["image_patches"] = 3; }, "config field \"image_patches\": expected an object"},
      {"span section overlaps tokens", [](Bytes&, J& j, std::string&) { j["loss_masking_spans"]["begin"] = 100; }, "config field \"loss_masking_spans\": section [100, 169)"},
  };
  std::string dir = data_testing::data_test_dir("corrupt_fl");
  std::string good = dir + "/good.fast_llm_dataset";
  write_token_dataset(good, {{1, 2, 3}, {4}, {5, 6, 7, 8}}, 300, {{{0, 2}}, {}, {{1, 3}, {3, 4}}});
  const Bytes full = data_testing::read_bytes(good);
  REQUIRE(open_token_dataset(good)->num_tokens() == 8);
  REQUIRE(full.size() > kJson);
  REQUIRE(full[25 + 7] == kConfig);
  const Bytes body(full.begin(), full.begin() + kConfig);
  const J config = J::parse(std::string(full.begin() + kJson, full.end()));
  REQUIRE(config["loss_masking_spans"]["begin"] == 109);
  for (const FlCase& c : cases) {
    CAPTURE(c.name);
    Bytes b = body;
    J j = config;
    std::string raw;
    c.corrupt(b, j, raw);
    if (raw.empty()) raw = j.dump();
    for (int k = 3; k >= 0; --k) b.push_back(static_cast<unsigned char>(raw.size() >> (8 * k)));
    b.insert(b.end(), raw.begin(), raw.end());
    std::string path = dir + "/case.fast_llm_dataset";
    data_testing::write_bytes(path, b);
    // Config field errors are reported at the offset of the JSON text.
    std::string what = c.what;
    if (what.starts_with("config field")) what = str_cat("at offset ", kJson, ": ", what);
    std::string expected = str_cat(path, ": ", what);
    CHECK_THROWS_WITH_AS(open_token_dataset(path), doctest::Contains(expected.c_str()), Error);
  }
}

}  // namespace
}  // namespace engine
