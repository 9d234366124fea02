// config.json's RoPE scaling (checkpoint/hf_rope.h): export writes rope_scaling (transformers
// 4.x) and rope_parameters (5.x) and import reads either back to the same model.rope_scaling, for
// each type; the spellings found in published configs (Llama 3.1's rope_scaling, Qwen's legacy
// "type": "yarn", 5.x rope_parameters with rope_theta inside) import; unsupported types and keys
// are refused naming them; model.init_from fills and checks model.rope_scaling.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/hf.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;
using json = nlohmann::json;

namespace {

using K = RopeScalingKind;

ModelConfig llama_with(const RopeScalingConfig& r) {
  ModelConfig c = tiny_model(ModelFamily::Llama);
  c.rope_theta = 500000.0;
  c.max_position_embeddings = 128;
  c.rope_scaling = r;
  return c;
}

RopeScalingConfig linear() {
  RopeScalingConfig r;
  r.type = K::Linear;
  r.factor = 2.5;
  return r;
}
RopeScalingConfig llama3() {
  RopeScalingConfig r;
  r.type = K::Llama3;
  r.factor = 8;
  r.low_freq_factor = 1;
  r.high_freq_factor = 4;
  r.original_max_position_embeddings = 32;
  return r;
}
RopeScalingConfig yarn() {
  RopeScalingConfig r;
  r.type = K::Yarn;
  r.factor = 4;
  r.original_max_position_embeddings = 32;
  r.beta_fast = 16;
  r.beta_slow = 2;
  r.attention_factor = 1.25;
  r.truncate = false;
  return r;
}

// config.json of a tiny llama, edited by `edit`, written to a scratch folder; its path.
std::string config_file(const std::string& name, const std::function<void(json&)>& edit) {
  json j = json::parse(hf::hf_config_json(tiny_model(ModelFamily::Llama), "F32"));
  j.erase("rope_parameters");
  j.erase("rope_theta");
  j["max_position_embeddings"] = 64;
  edit(j);
  const std::string path = scratch_dir("hf-rope-" + name) + "/config.json";
  write_text(path, j.dump(2));
  return path;
}

}  // namespace

TEST_CASE("hf rope: export then import gives model.rope_scaling back, in both spellings") {
  const std::vector<std::pair<const char*, RopeScalingConfig>> cases = {
      {"none", RopeScalingConfig{}}, {"linear", linear()}, {"llama3", llama3()}, {"yarn", yarn()}};
  for (const auto& [name, r] : cases) {
    SUBCASE(name) {
      const ModelConfig c = llama_with(r);
      const json j = json::parse(hf::hf_config_json(c, "F32"));
      CHECK(j["rope_theta"] == 500000.0);
      CHECK(j["rope_parameters"]["rope_theta"] == 500000.0);
      CHECK(j["rope_parameters"]["rope_type"] == (r.type == K::None ? "default" : name));
      if (r.type == K::None) {
        CHECK_FALSE(j.contains("rope_scaling"));
      } else {
        CHECK(j["rope_scaling"]["rope_type"] == name);
        CHECK(j["rope_scaling"]["factor"] == r.factor);
        CHECK_FALSE(j["rope_scaling"].contains("rope_theta"));
      }
      if (r.type == K::Llama3) {
        CHECK(j["rope_scaling"]["low_freq_factor"] == 1.0);
        CHECK(j["rope_scaling"]["high_freq_factor"] == 4.0);
        CHECK(j["rope_scaling"]["original_max_position_embeddings"] == 32);
      }
      if (r.type == K::Yarn) {
        CHECK(j["rope_parameters"]["attention_factor"] == 1.25);
        CHECK(j["rope_parameters"]["beta_fast"] == 16.0);
        CHECK(j["rope_parameters"]["truncate"] == false);
      }
      // Each spelling alone imports to the same config.
      for (const char* keep : {"both", "rope_scaling", "rope_parameters"}) {
        CAPTURE(keep);
        json k = j;
        if (std::string(keep) == "rope_scaling") k.erase("rope_parameters");
        if (std::string(keep) == "rope_parameters") {
          k.erase("rope_scaling");
          k.erase("rope_theta");
        }
        const std::string path = scratch_dir(std::string("hf-rope-rt-") + name + "-" + keep) + "/config.json";
        write_text(path, k.dump(2));
        const ModelConfig m = hf::model_from_hf_config(path);
        CHECK(m.rope_theta == 500000.0);
        CHECK(m.rope_scaling == r);
      }
    }
  }
}

TEST_CASE("hf rope: published spellings import") {
  SUBCASE("Llama 3.1 rope_scaling") {
    const ModelConfig m = hf::model_from_hf_config(config_file("llama31", [](json& j) {
      j["rope_theta"] = 500000.0;
      j["rope_scaling"] = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};
    }));
    CHECK(m.rope_theta == 500000.0);
    CHECK(m.rope_scaling.type == K::Llama3);
    CHECK(m.rope_scaling.factor == 8.0);
    CHECK(m.rope_scaling.original_max_position_embeddings == 8192);
  }
  SUBCASE("legacy type yarn without attention_factor: 0.1 ln(factor) + 1") {
    const ModelConfig m = hf::model_from_hf_config(config_file("qwen-yarn", [](json& j) {
      j["rope_scaling"] = {{"factor", 4.0}, {"original_max_position_embeddings", 32768}, {"type", "yarn"}};
    }));
    CHECK(m.rope_scaling.type == K::Yarn);
    CHECK(m.rope_scaling.original_max_position_embeddings == 32768);
    CHECK(m.rope_scaling.attention_factor == doctest::Approx(0.1 * std::log(4.0) + 1).epsilon(1e-15));
    CHECK(m.rope_scaling.beta_fast == 32.0);
    CHECK(m.rope_scaling.beta_slow == 1.0);
    CHECK(m.rope_scaling.truncate);
  }
  SUBCASE("yarn without original_max_position_embeddings takes max_position_embeddings") {
    const ModelConfig m = hf::model_from_hf_config(config_file("yarn-nomax", [](json& j) {
      j["max_position_embeddings"] = 4096;
      j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 2.0},
                              {"attention_factor", nullptr}, {"beta_fast", nullptr}};
    }));
    CHECK(m.rope_theta == 1e6);
    CHECK(m.rope_scaling.original_max_position_embeddings == 4096);
    CHECK(m.rope_scaling.beta_fast == 32.0);
  }
  SUBCASE("default rope_type with rope_theta inside") {
    const ModelConfig m = hf::model_from_hf_config(config_file("default", [](json& j) {
      j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
    }));
    CHECK(m.rope_theta == 1234.0);
    CHECK(m.rope_scaling == RopeScalingConfig{});
  }
}

TEST_CASE("hf rope: unsupported scalings and keys are refused, naming them") {
  struct Case {
    const char* name;
    json rope_scaling;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {"dynamic", {{"rope_type", "dynamic"}, {"factor", 2.0}}, {"rope_scaling.rope_type", "\"dynamic\"", "not supported"}},
      {"longrope", {{"type", "longrope"}, {"short_factor", {1.0}}}, {"rope_type", "\"longrope\""}},
      {"mscale", {{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0}}, {"rope_scaling.mscale", "not supported"}},
      {"mscale_all_dim", {{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale_all_dim", 0.7}}, {"mscale_all_dim"}},
      {"a llama3 key with linear", {{"rope_type", "linear"}, {"factor", 4.0}, {"low_freq_factor", 1.0}},
       {"rope_scaling.low_freq_factor", "not supported with rope_type \"linear\""}},
      {"factor missing", {{"rope_type", "linear"}}, {"rope_scaling.factor", "required"}},
      {"llama3 context missing", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}},
       {"rope_scaling.original_max_position_embeddings", "required"}},
      {"llama3 high <= low",
       {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 4.0},
        {"original_max_position_embeddings", 64}},
       {"rope_scaling.high_freq_factor", "must be > low_freq_factor"}},
      {"factor 0", {{"rope_type", "linear"}, {"factor", 0.0}}, {"rope_scaling.factor", "must be > 0"}},
      {"factor a string", {{"rope_type", "linear"}, {"factor", "2"}}, {"rope_scaling.factor", "expected a number"}},
      {"context not an integer", {{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 10.5}},
       {"original_max_position_embeddings", "positive integer"}},
      {"truncate a number", {{"rope_type", "yarn"}, {"factor", 2.0}, {"truncate", 1}}, {"rope_scaling.truncate"}},
      {"type and rope_type disagree", {{"rope_type", "yarn"}, {"type", "linear"}, {"factor", 2.0}}, {"disagree"}},
      {"partial rotary", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}, {"partial_rotary_factor"}},
      {"not an object", "yarn", {"rope_scaling", "expected an object"}},
  };
  for (const Case& k : cases) {
    SUBCASE(k.name) {
      const std::string path = config_file("bad", [&](json& j) { j["rope_scaling"] = k.rope_scaling; });
      std::vector<std::string> mentions = k.mentions;
      mentions.push_back(path);
      check_mentions(error_of([&] { hf::model_from_hf_config(path); }), mentions);
    }
  }
  SUBCASE("rope_parameters and rope_scaling disagree") {
    const std::string path = config_file("disagree", [](json& j) {
      j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}};
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
    });
    check_mentions(error_of([&] { hf::model_from_hf_config(path); }),
                   {path, "rope_parameters", "rope_scaling", "different scalings"});
  }
}

TEST_CASE("hf rope: model.init_from fills model.rope_scaling and checks the set keys") {
  const std::string path = config_file("init", [](json& j) {
    j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}, {"factor", 4.0},
                            {"original_max_position_embeddings", 16}, {"beta_fast", 8.0}};
  });
  const std::string dir = path.substr(0, path.size() - std::string("/config.json").size());
  const std::string base = "[data]\ntrain = [\"data/a\"]\nsequence_length = 12\n[training]\nsteps = 2\n[model]\n"
                           "init_from = \"" + dir + "\"\n";
  const Config c = parse_config(base, "init.toml");
  CHECK(c.model.rope_scaling.type == K::Yarn);
  CHECK(c.model.rope_scaling.beta_fast == 8.0);
  CHECK(c.model.rope_scaling.original_max_position_embeddings == 16);
  CHECK(c.model.rope_scaling.attention_factor == doctest::Approx(0.1 * std::log(4.0) + 1).epsilon(1e-15));
  CHECK(c.origin.at("model.rope_scaling.factor") == path);
  CHECK(parse_config(config_to_toml(c), "again.toml") == c);
  check_mentions(error_of([&] { parse_config(base + "rope_scaling.factor = 8.0\n", "init.toml"); }),
                 {"init.toml:8", "model.rope_scaling.factor", "is 8", path, "4"});
  check_mentions(error_of([&] { parse_config(base + "rope_scaling.type = \"llama3\"\n", "init.toml"); }),
                 {"model.rope_scaling.type", "llama3", "yarn"});
}
