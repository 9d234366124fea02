// Image patches in a .fast_llm_dataset (Fast-LLM's "patch" section, data/fast_llm_dataset.h):
// a file built here from a text dataset plus a patch section reads back each document's
// pixels, token indices, grid positions and images; a patch outside its document, a negative
// position, images that do not hold the document's patches, or counts that disagree with the
// section's size are errors naming the file and offset or field; and a sample source over such a
// dataset is refused (images are not carried into samples yet).
#include <doctest/doctest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "data/dataset_writer.h"
#include "data/sampler.h"
#include "data/token_dataset.h"
#include "tests/common/testing.h"
#include "tests/data/data_test_util.h"

namespace engine {
namespace {

using Bytes = std::vector<unsigned char>;
using nlohmann::json;

void put_i32(Bytes& b, int32_t v) {
  const auto* p = reinterpret_cast<const unsigned char*>(&v);
  b.insert(b.end(), p, p + 4);
}

// Documents {1,2,3} {4} {5,6,7,8}: document 0 has one image of 2 patches (tokens 0, 1; grid
// (0,0), (0,1)), document 1 none, document 2 two images of 1 and 2 patches (tokens 0, 2, 3).
// Patches of shape (3, 2, 2): 12 bytes, patch q's bytes all q + 1. `edit` changes the section's
// arrays or the config before the file is written.
struct PatchFile {
  std::vector<int32_t> token_map{0, 1, 0, 2, 3}, positions{0, 0, 0, 1, 0, 0, 0, 0, 0, 1};
  std::vector<int32_t> patch_cumsum{0, 2, 2, 5}, group_lengths{2, 1, 2}, group_cumsum{0, 1, 1, 3};
};

std::string write_patch_file(const std::string& dir, const std::string& name, const PatchFile& pf,
                             const std::function<void(json&)>& edit_config = {}) {
  const std::string text = dir + "/" + name + ".text.fast_llm_dataset";
  write_token_dataset(text, {{1, 2, 3}, {4}, {5, 6, 7, 8}}, 300, {});
  const Bytes full = data_testing::read_bytes(text);
  uint64_t config_offset = 0;
  for (int i = 0; i < 8; ++i) config_offset = config_offset << 8 | full[25 + static_cast<size_t>(i)];
  json cfg = json::parse(std::string(full.begin() + static_cast<std::ptrdiff_t>(config_offset) + 4, full.end()));
  const uint64_t lm_end = cfg["end"].get<uint64_t>() - 6;  // where "lm end" starts
  Bytes section;
  const std::string begin = "patch begin", end = "patch end";
  section.insert(section.end(), begin.begin(), begin.end());
  const int P = static_cast<int>(pf.token_map.size());
  for (int q = 0; q < P; ++q) section.insert(section.end(), 12, static_cast<unsigned char>(q + 1));
  for (int32_t v : pf.token_map) put_i32(section, v);
  for (int32_t v : pf.positions) put_i32(section, v);
  for (int32_t v : pf.patch_cumsum) put_i32(section, v);
  for (int32_t v : pf.group_lengths) put_i32(section, v);
  for (int32_t v : pf.group_cumsum) put_i32(section, v);
  section.insert(section.end(), end.begin(), end.end());
  Bytes b(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(lm_end));
  b.insert(b.end(), section.begin(), section.end());
  const std::string lm = "lm end";
  b.insert(b.end(), lm.begin(), lm.end());
  cfg["end"] = b.size();
  cfg["image_patches"] = {{"type", "patch"},
                          {"begin", lm_end},
                          {"end", lm_end + section.size()},
                          {"num_documents", 3},
                          {"num_patches", P},
                          {"num_patch_groups", pf.group_lengths.size()},
                          {"patch_shape", {3, 2, 2}},
                          {"data_type", "uint8"}};
  if (edit_config) edit_config(cfg);
  const uint64_t offset = b.size();
  for (int i = 7; i >= 0; --i) b[25 + static_cast<size_t>(7 - i)] = static_cast<unsigned char>(offset >> (8 * i));
  const std::string js = cfg.dump();
  for (int k = 3; k >= 0; --k) b.push_back(static_cast<unsigned char>(js.size() >> (8 * k)));
  b.insert(b.end(), js.begin(), js.end());
  const std::string path = dir + "/" + name + ".fast_llm_dataset";
  data_testing::write_bytes(path, b);
  return path;
}

}  // namespace

TEST_CASE("image patches in a .fast_llm_dataset: each document's pixels, tokens, positions and images") {
  const std::string dir = data_testing::data_test_dir("image_patches");
  auto ds = open_token_dataset(write_patch_file(dir, "good", {}));
  REQUIRE(ds->has_image_patches());
  CHECK(ds->patch_shape() == std::vector<int64_t>{3, 2, 2});
  CHECK(ds->num_tokens() == 8);
  const DocumentPatches d0 = ds->image_patches(0), d1 = ds->image_patches(1), d2 = ds->image_patches(2);
  CHECK(d0.count == 2);
  CHECK(d0.token_index == std::vector<int32_t>{0, 1});
  CHECK(d0.positions == std::vector<int32_t>{0, 0, 0, 1});
  CHECK(d0.image_lengths == std::vector<int32_t>{2});
  CHECK(d0.pixels[0] == 1);
  CHECK(d0.pixels[23] == 2);  // patch 1's last byte
  CHECK(d1.count == 0);
  CHECK(d1.image_lengths.empty());
  CHECK(d2.count == 3);
  CHECK(d2.token_index == std::vector<int32_t>{0, 2, 3});
  CHECK(d2.image_lengths == std::vector<int32_t>{1, 2});
  CHECK(d2.pixels[0] == 3);
  CHECK_THROWS_WITH_AS(ds->image_patches(3), doctest::Contains("document 3 out of range"), Error);
  // A text-only dataset has none.
  const std::string text = dir + "/good.text.fast_llm_dataset";
  CHECK_FALSE(open_token_dataset(text)->has_image_patches());
  CHECK(open_token_dataset(text)->image_patches(0).count == 0);
}

TEST_CASE("image patches in a .fast_llm_dataset: bad sections are refused, naming the file and offset or field") {
  const std::string dir = data_testing::data_test_dir("image_patches_bad");
  struct Case {
    const char* name;
    std::function<void(PatchFile&)> edit;
    std::function<void(json&)> config;
    const char* what;
  };
  const Case cases[] = {
      {"token outside its document", [](PatchFile& p) { p.token_map[1] = 3; }, {}, "image patch 1 of document 0 names token 3, outside the document's 3 tokens"},
      {"negative position", [](PatchFile& p) { p.positions[3] = -1; }, {}, "image patch 1 has a negative position"},
      {"images do not hold the patches", [](PatchFile& p) { p.group_lengths = {2, 1, 1}; }, {}, "document 2's images hold 2 patches, its patch count is 3"},
      {"an empty image", [](PatchFile& p) { p.group_lengths = {2, 0, 3}; }, {}, "image 1 has 0 patches"},
      {"patch counts decreasing", [](PatchFile& p) { p.patch_cumsum = {0, 2, 1, 5}; }, {}, "patch_count_cumsum[2] = 1: expected a non-decreasing"},
      {"num_patches disagrees", [](PatchFile&) {}, [](json& j) { j["image_patches"]["num_patches"] = 4; }, "config field \"image_patches\": section"},
      {"documents disagree", [](PatchFile&) {}, [](json& j) { j["image_patches"]["num_documents"] = 2; }, "config field \"image_patches.num_documents\": expected 3"},
      {"patch shape", [](PatchFile&) {}, [](json& j) { j["image_patches"]["patch_shape"] = {3}; }, "config field \"image_patches.patch_shape\": expected an array of 2 to 4 sizes"},
      {"zero patch size", [](PatchFile&) {}, [](json& j) { j["image_patches"]["patch_shape"] = {3, 0, 2}; }, "config field \"image_patches.patch_shape\": expected sizes in [1, 65536]"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    PatchFile pf;
    c.edit(pf);
    const std::string path = write_patch_file(dir, "case", pf, c.config);
    const std::string named = path + ": ";
    CHECK_THROWS_WITH_AS(open_token_dataset(path), doctest::Contains(named.c_str()), Error);
    CHECK_THROWS_WITH_AS(open_token_dataset(path), doctest::Contains(c.what), Error);
  }
}

TEST_CASE("image patches in a .fast_llm_dataset: a sample source over one is refused, naming the dataset") {
  const std::string dir = data_testing::data_test_dir("image_patches_train");
  const std::string path = write_patch_file(dir, "train", {});
  Config c = data_testing::data_config({path}, 4, 300);
  CHECK_THROWS_WITH_AS(make_sample_source(c, Split::Train, 4), doctest::Contains("holds image patches"), Error);
  CHECK_THROWS_WITH_AS(make_sample_source(c, Split::Train, 4), doctest::Contains("data.train[0]: "), Error);
}

}  // namespace engine
