// Hugging Face Mamba2ForCausalLM (hf.h, hf_mamba.h): the mixer's tensors (in_proj [z | x | B | C |
// dt], conv1d over [x | B | C], dt_bias, A_log, D, the gated norm) laid out as transformers'
// Mamba2Mixer has them, config.json's keys both ways (time_step_limit with Infinity, as Python
// writes it), the refusals of what the engine cannot represent, and model.init_from filling the
// Mamba-2 keys. The round trip is in test_hf.cpp; transformers itself is checked by
// scripts/hf_check.py on the GPU machine.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/hf.h"
#include "checkpoint/hf_mamba.h"
#include "checkpoint/safetensors.h"
#include "models/model.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"
#include "tests/train/train_fixture.h"

using namespace engine;
using namespace engine::testing;
namespace ck = engine::checkpoint;

namespace {

// hidden 24, Di 48: 6 heads of 8 in 2 groups of 5 states, kernel 3.
const std::vector<std::string> kKeys = {"model.mamba_head_dim=8", "model.mamba_n_groups=2", "model.mamba_d_state=5",
                                        "model.mamba_d_conv=3"};

Config export_mamba2(const std::string& dir, std::unique_ptr<Model>& m, std::vector<std::string> more = {}) {
  std::vector<std::string> o = kKeys;
  o.insert(o.end(), more.begin(), more.end());
  const Config c = tiny_run_config("mamba2", o);
  m = random_model(c.model, "mamba2-export");
  hf::export_hf(c.model, m->params().table(), store_fetch(m->params()), dir);
  return c;
}

}  // namespace

TEST_CASE("hf: mamba2's in_proj stacks z, x, B, C, dt and conv1d x, B, C, as Mamba2Mixer splits them") {
  const std::string dir = scratch_dir("hf-mamba2") + "/out";
  std::unique_ptr<Model> m;
  const Config c = export_mamba2(dir, m);
  CHECK_FALSE(c.model.tie_embeddings);  // Mamba2Config's default
  ck::SafetensorsFile f(dir + "/model.safetensors");
  const int64_t C = 24, Di = 48, GN = 10, H = 6;
  const ck::StTensor& in = f.at("backbone.layers.1.mixer.in_proj.weight");
  REQUIRE(in.shape == std::vector<int64_t>{2 * Di + 2 * GN + H, C});
  std::vector<float> v(static_cast<size_t>(in.shape[0] * C));
  f.read_f32(in, 0, static_cast<int64_t>(v.size()), v.data());
  int64_t row = 0;
  for (const auto& [part, rows] : {std::pair{"z", Di}, {"x", Di}, {"B", GN}, {"C", GN}, {"dt", H}}) {
    INFO(part);
    CHECK(std::memcmp(v.data() + row * C, m->params().weight(std::string("layers.1.mamba2.in_proj_") + part).data,
                      static_cast<size_t>(rows * C) * 4) == 0);
    row += rows;
  }
  CHECK(f.at("backbone.layers.0.mixer.conv1d.weight").shape == std::vector<int64_t>{Di + 2 * GN, 1, 3});
  CHECK(f.at("backbone.layers.0.mixer.conv1d.bias").shape == std::vector<int64_t>{Di + 2 * GN});
  for (const char* n : {"dt_bias", "A_log", "D"}) CHECK(f.at(std::string("backbone.layers.0.mixer.") + n).shape == std::vector<int64_t>{H});
  CHECK(f.at("backbone.layers.0.mixer.norm.weight").shape == std::vector<int64_t>{Di});
  CHECK(f.at("backbone.layers.0.mixer.out_proj.weight").shape == std::vector<int64_t>{C, Di});
  CHECK(f.find("backbone.layers.0.mixer.out_proj.bias") == nullptr);
  CHECK(f.at("lm_head.weight").shape == std::vector<int64_t>{37, C});
  const std::string text = read_text(dir + "/config.json");
  CHECK(text.find("Infinity") != std::string::npos);  // no upper clamp, as Python writes float("inf")
  const auto j = nlohmann::json::parse(hf::json_nonfinite_as_strings(text));
  CHECK(j["architectures"][0] == "Mamba2ForCausalLM");
  CHECK(j["model_type"] == "mamba2");
  CHECK(j["num_heads"] == H);
  CHECK(j["head_dim"] == 8);
  CHECK(j["n_groups"] == 2);
  CHECK(j["state_size"] == 5);
  CHECK(j["rms_norm"] == true);
  CHECK(j["time_step_limit"][1] == "Infinity");
}

TEST_CASE("hf: mamba2 export refuses the per-group gated norm with several groups (transformers has none)") {
  const Config c = tiny_run_config("mamba2", plus(kKeys, {"model.mamba_norm_per_group=true"}));
  check_mentions(error_of([&] { hf::hf_config_json(c.model, "F32"); }), {"model.mamba_norm_per_group", "whole inner width"});
  const Config one = tiny_run_config("mamba2", plus(kKeys, {"model.mamba_norm_per_group=true", "model.mamba_n_groups=1"}));
  CHECK_NOTHROW(hf::hf_config_json(one.model, "F32"));  // one group: the same norm
}

TEST_CASE("hf: mamba2 config.json defaults, Infinity and refusals name the key") {
  const std::string dir = scratch_dir("hf-mamba2") + "/keys";
  std::unique_ptr<Model> m;
  export_mamba2(dir, m);
  const std::string path = dir + "/config.json";
  const std::string text0 = read_text(path);
  const auto j0 = nlohmann::json::parse(hf::json_nonfinite_as_strings(text0));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = j0;
    edit(j);
    write_text(path, hf::json_nonfinite_as_tokens(j.dump()));
  };
  SUBCASE("Python's Infinity parses, outside strings only") {
    const ModelConfig h = hf::model_from_hf_config(path);
    CHECK(h.mamba_dt_limit_max == 0);
    CHECK(hf::json_nonfinite_as_strings("{\"a\": \"Infinity x\", \"b\": [NaN, -Infinity]}") ==
          "{\"a\": \"Infinity x\", \"b\": [\"NaN\", \"-Infinity\"]}");
  }
  SUBCASE("Mamba2Config's defaults where keys are missing") {
    with([](nlohmann::json& j) { j.erase("n_groups"); });  // Mamba2Config's 8 groups do not divide 6 heads
    check_mentions(error_of([&] { hf::model_from_hf_config(path); }), {path, "n_groups (8)", "num_heads (6)"});
    with([](nlohmann::json& j) {
      for (const char* k : {"state_size", "conv_kernel", "time_step_limit", "use_conv_bias", "tie_word_embeddings"})
        j.erase(k);
      j["n_groups"] = 1;
    });
    const ModelConfig h = hf::model_from_hf_config(path);
    CHECK(h.mamba_d_state == 128);
    CHECK(h.mamba_d_conv == 4);
    CHECK(h.mamba_conv_bias);
    CHECK_FALSE(h.tie_embeddings);
    CHECK(h.mamba_dt_limit_min == 0);
    CHECK(h.mamba_dt_limit_max == 0);
  }
  SUBCASE("transformers 5 writes Infinity as {\"__float__\": \"Infinity\"}") {
    with([](nlohmann::json& j) { j["time_step_limit"] = {0.0, {{"__float__", "Infinity"}}}; });
    CHECK(hf::model_from_hf_config(path).mamba_dt_limit_max == 0);
    with([](nlohmann::json& j) { j["time_step_limit"] = {0.0, {{"__float__", "NaN"}}}; });
    check_mentions(error_of([&] { hf::model_from_hf_config(path); }), {path, "time_step_limit"});
  }
  SUBCASE("a finite time_step_limit is the clamp") {
    with([](nlohmann::json& j) { j["time_step_limit"] = {0.001, 0.5}; });
    const ModelConfig h = hf::model_from_hf_config(path);
    CHECK(h.mamba_dt_limit_min == 0.001);
    CHECK(h.mamba_dt_limit_max == 0.5);
  }
  SUBCASE("what the engine cannot represent is refused") {
    const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::vector<std::string>>> cases = {
        {[](nlohmann::json& j) { j["rms_norm"] = false; }, {"rms_norm"}},
        {[](nlohmann::json& j) { j["norm_before_gate"] = true; }, {"norm_before_gate"}},
        {[](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu"}},
        {[](nlohmann::json& j) { j["num_heads"] = 5; }, {"num_heads", "head_dim"}},
        {[](nlohmann::json& j) { j["n_groups"] = 4; }, {"n_groups", "num_heads"}},
        {[](nlohmann::json& j) { j["time_step_limit"] = {0.5, 0.1}; }, {"time_step_limit"}},
        {[](nlohmann::json& j) { j["time_step_limit"] = {0.0, 0.0}; }, {"time_step_limit", "0"}},
        {[](nlohmann::json& j) { j["time_step_limit"] = "NaN"; }, {"time_step_limit"}},
    };
    for (const auto& [edit, expect] : cases) {
      with(edit);
      CAPTURE(expect[0]);
      check_mentions(error_of([&] { hf::model_from_hf_config(path); }), {path, expect[0]});
    }
  }
  SUBCASE("model.init_from fills the Mamba-2 keys; a contradicting one is an error") {
    write_text(path, text0);
    const Config c = tiny_run_config("mamba2", {"model.init_from=\"" + dir + "\""});
    CHECK(c.model.mamba_head_dim == 8);
    CHECK(c.model.mamba_n_groups == 2);
    CHECK(c.model.mamba_d_state == 5);
    check_mentions(error_of([&] {
                     tiny_run_config("mamba2", {"model.mamba_n_groups=3", "model.init_from=\"" + dir + "\""});
                   }),
                   {"model.mamba_n_groups", "config.json"});
  }
}
