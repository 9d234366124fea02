// Hugging Face Qwen3ForCausalLM (hf.h): the q_norm / k_norm tensors (head_dim each) beside
// llama's names, config.json's keys (head_dim, attention_bias, the sliding-window keys) both
// ways, the refusals of what the engine cannot represent, and model.init_from filling qk_norm.
// The round trip of every family (qwen3 included) is in test_hf.cpp; transformers itself is
// checked by scripts/hf_check.py on the GPU machine.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "models/model.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"
#include "tests/train/train_fixture.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;
namespace ck = engine::checkpoint;

namespace {

// A qwen3 model (head_dim 16 x 3 heads != hidden 24) with generic weights, exported to `dir`.
Config export_qwen3(const std::string& dir, std::unique_ptr<Model>& m, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.head_dim=16", "model.num_kv_heads=1"};
  o.insert(o.end(), more.begin(), more.end());
  const Config c = tiny_run_config("qwen3", o);
  m = make_model(c.model, Device::CPU, DType::F32);
  randomize_weights(m->params(), "qwen3-export", 0.2);
  const ParamStore& s = m->params();
  hf::export_hf(c.model, s.table(), [&s](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
    std::memcpy(out, s.weight(p.name).ptr<float>() + lo, static_cast<size_t>(hi - lo) * 4);
  }, dir);
  return c;
}

}  // namespace

TEST_CASE("hf: qwen3 has q_norm and k_norm of head_dim, and config.json says qwen3") {
  const std::string dir = scratch_dir("hf-qwen3") + "/out";
  std::unique_ptr<Model> m;
  const Config c = export_qwen3(dir, m);
  CHECK(c.model.qk_norm);
  CHECK(c.model.rope_theta == 1e6);
  CHECK(c.model.norm_eps == 1e-6);
  ck::SafetensorsFile f(dir + "/model.safetensors");
  for (const char* n : {"q_norm", "k_norm"}) {
    const ck::StTensor& t = f.at(std::string("model.layers.1.self_attn.") + n + ".weight");
    REQUIRE(t.shape == std::vector<int64_t>{16});
    std::vector<float> v(16);
    f.read_f32(t, 0, 16, v.data());
    CHECK(std::memcmp(v.data(), m->params().weight(std::string("layers.1.attn.") + n).data, 64) == 0);
  }
  CHECK(f.at("model.layers.0.self_attn.q_proj.weight").shape == std::vector<int64_t>{3 * 16, 24});
  CHECK(f.at("model.layers.0.self_attn.o_proj.weight").shape == std::vector<int64_t>{24, 3 * 16});
  CHECK(f.find("model.layers.0.self_attn.q_proj.bias") == nullptr);
  const auto j = nlohmann::json::parse(read_text(dir + "/config.json"));
  CHECK(j["architectures"][0] == "Qwen3ForCausalLM");
  CHECK(j["model_type"] == "qwen3");
  CHECK(j["head_dim"] == 16);
  CHECK(j["attention_bias"] == false);
  CHECK(j["use_sliding_window"] == false);
  CHECK(j["rms_norm_eps"] == 1e-6);
}

TEST_CASE("hf: qwen3 config.json defaults and refusals name the key") {
  const std::string dir = scratch_dir("hf-qwen3") + "/keys";
  std::unique_ptr<Model> m;
  export_qwen3(dir, m);
  const std::string path = dir + "/config.json";
  const auto j0 = nlohmann::json::parse(read_text(path));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = j0;
    edit(j);
    write_text(path, j.dump());
  };
  SUBCASE("head_dim defaults to 128 (Qwen3Config), rope_theta to 10000") {
    with([](nlohmann::json& j) {
      j.erase("head_dim");
      j.erase("rope_theta");
      j.erase("rope_parameters");
    });
    const ModelConfig h = hf::model_from_hf_config(path);
    CHECK(h.head_dim == 128);
    CHECK(h.rope_theta == 10000.0);
    CHECK(h.qk_norm);
    CHECK_FALSE(h.qkv_bias);
  }
  SUBCASE("attention_bias = true is refused") {
    with([](nlohmann::json& j) { j["attention_bias"] = true; });
    check_mentions(error_of([&] { hf::model_from_hf_config(path); }), {path, "attention_bias"});
  }
  SUBCASE("a sliding window on some layers only is refused, on all layers taken") {
    with([](nlohmann::json& j) {
      j.erase("layer_types");
      j["use_sliding_window"] = true;
      j["sliding_window"] = 5;
      j["max_window_layers"] = 1;
    });
    check_mentions(error_of([&] { hf::model_from_hf_config(path); }), {path, "sliding window on 1 of 2"});
    with([](nlohmann::json& j) {
      j.erase("layer_types");
      j["use_sliding_window"] = true;
      j["sliding_window"] = 5;
      j["max_window_layers"] = 0;
    });
    CHECK(hf::model_from_hf_config(path).sliding_window == 5);
  }
  SUBCASE("model.init_from fills qk_norm and head_dim; a contradicting qk_norm is an error") {
    write_text(path, j0.dump());
    const Config c = tiny_run_config("qwen3", {"model.init_from=\"" + dir + "\""});
    CHECK(c.model.qk_norm);
    CHECK(c.model.head_dim == 16);
    check_mentions(error_of([&] {
                     tiny_run_config("qwen3", {"model.qk_norm=false", "model.init_from=\"" + dir + "\""});
                   }),
                   {"model.qk_norm", "config.json"});
  }
}

TEST_CASE("hf: export refuses qk_norm outside qwen3 and qwen3 without it or with biases") {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"model.family=\"llama\"", "model.qk_norm=true"}, {"model.qk_norm", "qwen3"}},
      {{"model.family=\"qwen2\"", "model.qk_norm=true"}, {"model.qk_norm", "qwen3"}},
      {{"model.qk_norm=false"}, {"model.qk_norm", "Qwen3"}},
      {{"model.qkv_bias=true"}, {"model.qkv_bias", "attention_bias"}},
      {{"model.bias=true"}, {"model.bias"}},
  };
  for (const auto& [overrides, expect] : cases) {
    CAPTURE(overrides[0]);
    const Config c = tiny_run_config("qwen3", overrides);
    check_mentions(error_of([&] { hf::hf_config_json(c.model, "F32"); }), expect);
  }
}
