// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): small valid inputs
// made by the engine's own writers plus slightly broken variants. Built by `make fuzz` as
// build-fuzz/make_seeds; run as `build-fuzz/make_seeds tests/fuzz/corpus` (the checked-in seeds
// came from it, plus configs/tiny-*.toml in config/ and the regress_* inputs of fixed findings;
// the fuzz runs keep their own corpus under build-fuzz/corpus/).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/hf.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "data/dataset_writer.h"

namespace fs = std::filesystem;
using Bytes = std::string;

static Bytes slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}
static void put(const fs::path& dir, const std::string& name, const Bytes& b) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
}
static Bytes u16le(size_t n) { return Bytes{static_cast<char>(n & 0xff), static_cast<char>(n >> 8)}; }

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <corpus dir>\n");
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("engine-seeds-" + std::to_string(getpid()));
  fs::create_directories(tmp);
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {4, 5, 6, 7, 8}, {9}};
  const std::vector<std::vector<engine::TokenSpan>> spans = {{{0, 1}}, {{1, 3}, {4, 5}}, {}};

  // .bin/.idx: u16 length of the .bin, the .bin, the .idx (fuzz_memmap_dataset's layout).
  {
    const fs::path d = out / "memmap_dataset";
    auto pair = [&](const std::string& prefix) {
      const Bytes bin = slurp(prefix + ".bin");
      return std::make_pair(bin, slurp(prefix + ".idx"));
    };
    auto seed = [&](const std::string& name, const Bytes& bin, const Bytes& idx) {
      put(d, name, u16le(bin.size()) + bin + idx);
    };
    engine::write_token_dataset((tmp / "v1").string(), docs, 100);
    engine::write_token_dataset((tmp / "v1i32").string(), docs, 70000);
    engine::write_token_dataset((tmp / "v2").string(), docs, 100, spans);
    auto [b1, i1] = pair((tmp / "v1").string());
    auto [b32, i32] = pair((tmp / "v1i32").string());
    auto [b2, i2] = pair((tmp / "v2").string());
    seed("v1_u16", b1, i1);
    seed("v1_i32", b32, i32);
    seed("v2_spans", b2, i2);
    // Version 3: the v2 index with has_preference_spans (0, and 1 with N chosen/rejected pairs).
    Bytes i3 = i2;
    i3[9] = 3;
    i3.insert(18, 1, '\0');  // after has_loss_masking_spans (offset 17)
    seed("v3_nopref", b2, i3);
    Bytes i3p = i3;
    i3p[18] = 1;
    const size_t doc_idx_bytes = (docs.size() + 1) * 8;
    i3p.insert(i3p.size() - doc_idx_bytes, Bytes(docs.size() * 16, '\0'));
    seed("v3_pref", b2, i3p);
    // Broken: truncated index, bad version, a .bin one token short, a span past its document.
    seed("bad_truncated", b1, i1.substr(0, i1.size() - 5));
    Bytes bv = i1;
    bv[9] = 4;
    seed("bad_version", b1, bv);
    seed("bad_bin_short", b1.substr(0, b1.size() - 2), i1);
    Bytes bs = i2;
    bs[bs.size() - doc_idx_bytes - 4] = 40;
    seed("bad_span", b2, bs);
  }
  // .fast_llm_dataset: with and without spans, truncated, a flipped byte in the header.
  {
    const fs::path d = out / "fast_llm_dataset";
    engine::write_token_dataset((tmp / "a.fast_llm_dataset").string(), docs, 100);
    engine::write_token_dataset((tmp / "b.fast_llm_dataset").string(), docs, 70000, spans);
    const Bytes a = slurp((tmp / "a.fast_llm_dataset").string());
    const Bytes b = slurp((tmp / "b.fast_llm_dataset").string());
    put(d, "plain_u16", a);
    put(d, "spans_i32", b);
    put(d, "bad_truncated", b.substr(0, b.size() * 2 / 3));
    Bytes f = a;
    f[30] = static_cast<char>(f[30] ^ 0x40);
    put(d, "bad_header_byte", f);
  }
  // safetensors: F32 + BF16 + metadata, F64 + F16, broken header size, bad offsets.
  {
    const fs::path d = out / "safetensors";
    auto write = [&](const std::string& name, const std::vector<std::pair<std::string, std::vector<int64_t>>>& ts,
                     const std::vector<std::string>& dtypes, bool meta) {
      engine::checkpoint::SafetensorsWriter w;
      for (size_t i = 0; i < ts.size(); ++i) {
        const size_t bytes = engine::checkpoint::safetensors_dtype_size(dtypes[i]) *
                             static_cast<size_t>(ts[i].second.empty() ? 1 : [&] {
                               int64_t n = 1;
                               for (int64_t x : ts[i].second) n *= x;
                               return n;
                             }());
        w.add(ts[i].first, dtypes[i], ts[i].second, [bytes](engine::checkpoint::OutFile& o) {
          std::vector<unsigned char> v(bytes);
          for (size_t k = 0; k < bytes; ++k) v[k] = static_cast<unsigned char>(0x3c + k % 7);
          o.write(v.data(), v.size());
        });
      }
      if (meta) w.set_metadata({{"format", "pt"}});
      const std::string p = (tmp / name).string();
      w.write(p);
      return slurp(p);
    };
    const Bytes a = write("a.st", {{"w", {2, 3}}, {"b", {3}}}, {"F32", "BF16"}, true);
    const Bytes b = write("b.st", {{"x", {2}}, {"y", {1, 2}}, {"s", {}}}, {"F64", "F16", "I32"}, false);
    put(d, "f32_bf16_meta", a);
    put(d, "f64_f16_scalar", b);
    Bytes h = a;
    h[0] = static_cast<char>(h[0] + 1);
    put(d, "bad_header_size", h);
    Bytes o = a;
    const size_t at = o.find("\"data_offsets\":[0,");
    if (at != std::string::npos) o[at + 16] = '8';
    put(d, "bad_offsets", o);
    put(d, "bad_truncated", a.substr(0, a.size() - 3));
  }
  // model.safetensors.index.json of the tiny Llama of fuzz_hf_index.
  {
    const fs::path d = out / "hf_index";
    engine::ModelConfig c;  // fuzz_hf_index's tiny Llama
    c.vocab_size = 8;
    c.hidden_size = 4;
    c.num_layers = 1;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 2;
    c.ffn_hidden_size = 6;
    c.max_position_embeddings = 4;
    std::string map;
    for (const auto& m : engine::hf::tensor_map(c))
      map += (map.empty() ? "" : ",\n") + std::string("    \"") + m.hf_name + "\": \"model-00001-of-00001.safetensors\"";
    put(d, "valid", "{\n  \"metadata\": {\"total_size\": 1},\n  \"weight_map\": {\n" + map + "\n  }\n}\n");
    put(d, "bad_missing_tensor", "{\"weight_map\": {\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}\n");
    put(d, "bad_dir_name", "{\"weight_map\": {\"a\": \"..\", \"b\": \"\"}}\n");
    put(d, "bad_not_string", "{\"weight_map\": {\"a\": 3}}\n");
    // config.json of the same model, for fuzz_hf_config.
    const fs::path h = out / "hf_config";
    put(h, "llama", engine::hf::hf_config_json(c, "F32"));
    engine::ModelConfig g = c;
    g.family = engine::ModelFamily::GPT2;
    g.norm = engine::NormKind::LayerNorm;
    g.activation = engine::ActivationKind::GELU;
    g.positions = engine::PositionKind::Learned;
    g.max_position_embeddings = 16;
    g.num_kv_heads = g.num_heads;
    g.head_dim = g.hidden_size / g.num_heads;
    g.bias = true;
    g.tie_embeddings = true;
    try {
      put(h, "gpt2", engine::hf::hf_config_json(g, "BF16"));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpt2 config.json: %s\n", e.what());
    }
    // The mixture-of-experts and Mamba families' config.json.
    engine::ModelConfig x = c;
    x.family = engine::ModelFamily::Mixtral;
    x.num_experts = 4;
    x.experts_per_token = 2;
    x.moe_aux_loss_coef = 0.02;
    engine::ModelConfig b = c;
    b.family = engine::ModelFamily::Mamba;
    b.tie_embeddings = true;
    b.mamba_dt_rank = 1;
    for (const auto& [name, cfg] : {std::pair<const char*, engine::ModelConfig>{"mixtral", x}, {"mamba", b}}) {
      try {
        put(h, name, engine::hf::hf_config_json(cfg, "BF16"));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s config.json: %s\n", name, e.what());
      }
    }
    put(h, "bad_type", "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": \"4\"}\n");
  }
  // Checkpoint metadata.json (versions 3, 2 and 1; fuzz_metadata fixes the checksum line).
  {
    const fs::path d = out / "metadata";
    engine::checkpoint::Metadata m;
    m.state = {12, 96, 3072, 1.5};
    m.config_toml = "[model]\nfamily = \"llama\"\n";
    m.params = {{"embedding.weight", {8, 4}, 0, 0, 0}, {"layers.0.attn.wq", {4, 4}, 32, 0, 0},
                {"final_norm.weight", {4}, 0, -1, 1}};
    m.table_elements = {48, 4};
    m.layout.world_size = 4;
    m.layout.data_parallel = 1;
    m.layout.tensor_parallel = 2;
    m.layout.pipeline_parallel = 2;
    m.layout.zero_stage = 1;
    m.layout.capacity = {48, 8};
    m.layout.compute_dtype = "f32";
    m.layout.device = "cpu";
    m.files = {{"rank_0.safetensors", 1000, 0x1234}, {"rank_1.safetensors", 200, 0xabcdef}};
    m.shards = {{"rank_0.safetensors", 0, 0, 0, 0, 48}, {"rank_0.safetensors", 0, 0, 1, 0, 48},
                {"rank_1.safetensors", 1, 1, 0, 0, 8}, {"rank_1.safetensors", 1, 1, 1, 0, 8}};
    const Bytes v3 = engine::checkpoint::Metadata::parse(m.serialize(), "seed").serialize();
    put(d, "v3", v3);
    engine::checkpoint::Metadata one;
    one.state = {1, 8, 64, 0.1};
    one.params = {{"w", {3, 2}, 0, -1, 0}};
    one.table_elements = {6};
    one.layout.capacity = {8};
    one.layout.compute_dtype = "bf16";
    one.layout.device = "cuda";
    one.files = {{"rank_0.safetensors", 10, 1}};
    one.shards = {{"rank_0.safetensors", 0, 0, 0, 0, 8}};
    Bytes v2 = one.serialize();
    const auto replace = [](Bytes s, const std::string& a, const std::string& b) {
      const size_t at = s.find(a);
      if (at != std::string::npos) s.replace(at, a.size(), b);
      return s;
    };
    // Versions 1 and 2 hold single numbers where version 3 has per-pp-rank lists.
    Bytes old = replace(replace(v2, "\"capacity\": [\n   8\n  ]", "\"capacity\": 8"), "\"table_elements\": [\n  6\n ]",
                        "\"table_elements\": 6");
    put(d, "v2", replace(replace(old, "\"version\": 3", "\"version\": 2"), "\"pipeline_parallel\": 1,", ""));
    put(d, "v1", replace(old, "\"version\": 3", "\"version\": 1"));
    put(d, "bad_tiling", replace(v3, "\"end\": 48", "\"end\": 40"));
  }
  // metrics.jsonl: the resumed step as the first byte, then the file (fuzz_metrics's layout).
  {
    const fs::path d = out / "metrics";
    const Bytes lines = "{\"step\": 1, \"loss\": 5.5, \"lr\": 0.001}\n{\"step\": 2, \"loss\": 5.25}\n"
                        "{\"step\": 2, \"valid_loss\": 5.4}\n{\"step\": 3, \"loss\": 5.0}\n";
    put(d, "whole", Bytes(1, '\x03') + lines);
    put(d, "later_steps", Bytes(1, '\x01') + lines);
    put(d, "torn_last", Bytes(1, '\x03') + lines + "{\"step\": 4, \"lo");
    put(d, "damaged_middle", Bytes(1, '\x09') + "{\"step\": 1}\nnot json\n[1, 2]\n{\"step\": \"2\"}\n\n{\"step\": 3}\n");
  }
  // token-id cache entries; "@FILES@" stands for the harness dataset's key (fuzz_token_cache).
  {
    const fs::path d = out / "token_cache";
    put(d, "entry", "{\"version\":1,\"files\":@FILES@,\"min\":1,\"max\":300}\n");
    put(d, "narrow_range", "{\"version\":1,\"files\":@FILES@,\"min\":0,\"max\":10}\n");
    put(d, "stale_key", "{\"version\":1,\"files\":[{\"path\":\"/x\",\"size\":1}],\"min\":1,\"max\":300}\n");
    put(d, "wrong_types", "{\"version\":\"1\",\"files\":@FILES@,\"min\":1.5,\"max\":null}\n");
  }
  // Manifest: u16 length + s.bin, u16 length + s.idx, then m.manifest.json naming the shard "s"
  // (fuzz_manifest's layout).
  {
    const fs::path d = out / "manifest";
    engine::write_token_dataset((tmp / "s").string(), docs, 100, spans);
    const Bytes bin = slurp((tmp / "s.bin").string()), idx = slurp((tmp / "s.idx").string());
    const auto manifest = [&](const std::string& shard_extra, const std::string& top_extra) {
      return "{\"format\": \"engine-token-manifest\", \"version\": 1, \"complete\": true, \"dtype\": "
             "\"uint16\", \"vocab_size\": 100, \"loss_masking_spans\": true, \"documents\": 3, \"tokens\": 9," +
             top_extra + " \"shards\": [{\"prefix\": \"s\", \"documents\": 3, \"tokens\": 9, \"bin_bytes\": " +
             std::to_string(bin.size()) + ", \"idx_bytes\": " + std::to_string(idx.size()) + shard_extra + "}]}";
    };
    const Bytes files = u16le(bin.size()) + bin + u16le(idx.size()) + idx;
    put(d, "valid", files + manifest("", ""));
    put(d, "valid_hashes", files + manifest(", \"bin_sha256\": \"" + std::string(64, 'a') + "\", \"next\": [1, 0, 0, 0]",
                                            " \"tokenizer\": {\"kind\": \"byte-level\"}, \"inputs\": [],"));
    put(d, "bad_incomplete", files + manifest("", " \"complete\": false,"));
    put(d, "bad_size", files + manifest(", \"bin_bytes\": 1", ""));
    put(d, "bad_bin_short", u16le(bin.size() - 2) + bin.substr(0, bin.size() - 2) + u16le(idx.size()) + idx +
                                manifest("", ""));
  }
  fs::remove_all(tmp);
  return 0;
}
