// Inputs the fuzz targets (tests/fuzz, scripts/fuzz.sh) or their review turned up, each of which
// crashed, hung or was misread before its fix; every one must now be a clean engine::Error naming
// the file and the field. The same inputs are in tests/fuzz/corpus/<target>/regress_*.
#include <doctest/doctest.h>

#include <string>

#include "checkpoint/hf.h"
#include "checkpoint/metadata.h"
#include "checkpoint/xxhash.h"
#include "core/check.h"
#include "tests/checkpoint/ckpt_test_util.h"

using namespace engine;
using namespace engine::checkpoint;
using namespace engine::testing;

namespace {

// A small version-2 metadata.json (one rank); `edit` replaces the first `from` by `to`, then the
// checksum line is rewritten so that the parser gets past it.
std::string metadata_v2(const std::string& from = "", const std::string& to = "") {
  std::string body = R"({
 "format": "engine-checkpoint",
 "version": 2,
 "step": 1,
 "trainer": {"consumed_samples": 8, "tokens_seen": 64, "train_seconds": 0.1},
 "layout": {"world_size": 1, "data_parallel": 1, "tensor_parallel": 1, "zero_stage": 0, "capacity": 8,
            "compute_dtype": "bf16", "device": "cuda"},
 "tensors": ["master", "exp_avg", "exp_avg_sq"],
 "table_elements": 6,
 "params": [{"name": "w", "shape": [3, 2], "split_dim": -1, "offset": 0}],
 "shards": [{"file": "rank_0.safetensors", "rank": 0, "tp_rank": 0, "begin": 0, "end": 8}],
 "files": [{"name": "rank_0.safetensors", "bytes": 10, "xxh64": "0000000000000001"}],
 "config": "",
)";
  if (!from.empty()) {
    const size_t at = body.find(from);
    REQUIRE(at != std::string::npos);
    body.replace(at, from.size(), to);
  }
  return body + " \"metadata_xxh64\": \"" + hex64(xxh64(body.data(), body.size())) + "\"\n}\n";
}

}  // namespace

TEST_CASE("fuzz regressions: metadata.json sizes and counts that overflowed or hung are errors") {
  CHECK(Metadata::parse(metadata_v2(), "m.json").version == 2);  // the base input is valid
  // A shape whose element count overflows int64 (was signed overflow in Param::numel).
  CHECK_THROWS_WITH_AS(Metadata::parse(metadata_v2("[3, 2]", "[4294967296, 4294967296]"), "m.json"),
                       doctest::Contains("m.json: field 'params[0].shape': [4294967296,4294967296] has more than 2^62 elements"),
                       Error);
  // An offset near INT64_MAX (was signed overflow in offset + block size).
  CHECK_THROWS_WITH_AS(Metadata::parse(metadata_v2("\"offset\": 0", "\"offset\": 9223372036854775807"), "m.json"),
                       doctest::Contains("m.json: field 'params[0]': w at offset 9223372036854775807 with 6 "
                                         "elements runs past table_elements 6"),
                       Error);
  // tensor_parallel = 2^31 - 1 with capacity 0 and no shards: the tiling check looped over every
  // tp rank (minutes); now it walks the shards and accepts at once (capacity 0 needs none).
  const std::string huge_tp = metadata_v2("\"tensor_parallel\": 1", "\"tensor_parallel\": 2147483647");
  std::string empty = huge_tp;
  for (auto [from, to] : {std::pair<std::string, std::string>{"\"capacity\": 8", "\"capacity\": 0"},
                          {"\"table_elements\": 6", "\"table_elements\": 0"},
                          {R"("params": [{"name": "w", "shape": [3, 2], "split_dim": -1, "offset": 0}])", R"("params": [])"},
                          {R"("shards": [{"file": "rank_0.safetensors", "rank": 0, "tp_rank": 0, "begin": 0, "end": 8}])",
                           R"("shards": [])"}}) {
    const size_t at = empty.find(from);
    REQUIRE(at != std::string::npos);
    empty.replace(at, from.size(), to);
  }
  empty = empty.substr(0, empty.rfind(" \"metadata_xxh64\""));
  empty += " \"metadata_xxh64\": \"" + hex64(xxh64(empty.data(), empty.size())) + "\"\n}\n";
  const Metadata m = Metadata::parse(empty, "m.json");
  CHECK(m.layout.tensor_parallel == 2147483647);
  CHECK(m.shards.empty());
  // The same with capacity 8: tp rank 1 has no shard.
  CHECK_THROWS_WITH_AS(Metadata::parse(huge_tp, "m.json"),
                       doctest::Contains("m.json: field 'shards': cover [0, 0) for tp_rank 1, the layout's capacity is 8"),
                       Error);
  // A version past int's range was narrowed first: 2^32 + 2 read as version 2.
  CHECK_THROWS_WITH_AS(Metadata::parse(metadata_v2("\"version\": 2", "\"version\": 4294967298"), "m.json"),
                       doctest::Contains("m.json: field 'version': format version 4294967298 is not supported"), Error);
}

TEST_CASE("fuzz regressions: config.json max_window_layers far below 0 is an error, not an overflow") {
  const std::string dir = scratch_dir("fuzz_hf_config");
  const std::string path = dir + "/config.json";
  auto qwen2 = [&](const std::string& max_window_layers) {
    write_text(path, R"({"model_type": "qwen2", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 6,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
 "use_sliding_window": true, "sliding_window": 4, "max_window_layers": )" + max_window_layers + "}\n");
    return hf::model_from_hf_config(path);
  };
  CHECK(qwen2("0").sliding_window == 4);  // every layer slides
  CHECK(qwen2("1").sliding_window == 0);  // none does
  // 1 - INT64_MIN was signed overflow.
  check_mentions(error_of([&] { qwen2("-9223372036854775808"); }),
                 {path, "max_window_layers: out of range: -9223372036854775808"});
  check_mentions(error_of([&] { qwen2("-1"); }), {path, "max_window_layers: out of range: -1"});
}
