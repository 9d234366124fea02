// model.rope_scaling: the [model.rope_scaling] table, the same keys dotted under [model] and as
// overrides, yarn's attention_factor default, the round trip through config_to_toml, the ops'
// parameters (rope_params), and each error naming its key.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/check.h"

using namespace engine;

namespace {

// Lines: 1 [model] 2 vocab_size .. 5 num_heads, then model_extra, [data] .., [training], steps,
// then tail (a [model.rope_scaling] table may follow [training]).
std::string doc(const std::string& model_extra = "", const std::string& tail = "") {
  return "[model]\nvocab_size = 256\nhidden_size = 64\nnum_layers = 2\nnum_heads = 4\n" + model_extra +
         "[data]\ntrain = [\"data/a\"]\nsequence_length = 32\n[training]\nsteps = 10\n" + tail;
}

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, "t.toml", overrides);
}

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("config: model.rope_scaling as a table, as dotted keys and as overrides") {
  SUBCASE("none by default") {
    const Config c = parse(doc());
    CHECK(c.model.rope_scaling == RopeScalingConfig{});
    const ops::RopeParams p = rope_params(c.model);
    CHECK(p.kind == RopeScalingKind::None);
    CHECK(p.theta == 10000.0);
  }
  SUBCASE("llama3 table") {
    const Config c = parse(doc("rope_theta = 500000.0\n",
                               "[model.rope_scaling]\ntype = \"llama3\"\nfactor = 8.0\nlow_freq_factor = 1.0\n"
                               "high_freq_factor = 4.0\noriginal_max_position_embeddings = 8192\n"));
    const RopeScalingConfig& r = c.model.rope_scaling;
    CHECK(r.type == RopeScalingKind::Llama3);
    CHECK(r.factor == 8.0);
    CHECK(r.high_freq_factor == 4.0);
    CHECK(r.original_max_position_embeddings == 8192);
    CHECK(c.origin.at("model.rope_scaling.factor") == "t.toml:14");
    const ops::RopeParams p = rope_params(c.model);
    CHECK(p.kind == RopeScalingKind::Llama3);
    CHECK(p.theta == 500000.0);
    CHECK(p.factor == 8.0);
    CHECK(p.original_max_position_embeddings == 8192.0);
  }
  SUBCASE("yarn as dotted keys: attention_factor defaults to 0.1 ln(factor) + 1") {
    const Config c = parse(doc("rope_scaling.type = \"yarn\"\nrope_scaling.factor = 4\n"
                               "rope_scaling.original_max_position_embeddings = 32\nrope_scaling.beta_fast = 16\n"));
    const RopeScalingConfig& r = c.model.rope_scaling;
    CHECK(r.type == RopeScalingKind::Yarn);
    CHECK(r.beta_fast == 16.0);
    CHECK(r.beta_slow == 1.0);
    CHECK(r.truncate);
    CHECK(r.attention_factor == doctest::Approx(0.1 * std::log(4.0) + 1.0).epsilon(1e-15));
    CHECK(rope_params(c.model).attention_factor == r.attention_factor);
    const Config set = parse(doc("", "[model.rope_scaling]\ntype = \"yarn\"\nfactor = 4\n"
                                     "original_max_position_embeddings = 32\nattention_factor = 1.5\ntruncate = false\n"));
    CHECK(set.model.rope_scaling.attention_factor == 1.5);
    CHECK_FALSE(set.model.rope_scaling.truncate);
    // factor <= 1: the default is 1, as transformers' get_mscale.
    CHECK(parse(doc("", "[model.rope_scaling]\ntype = \"yarn\"\nfactor = 1\noriginal_max_position_embeddings = 32\n"))
              .model.rope_scaling.attention_factor == 1.0);
  }
  SUBCASE("overrides") {
    const Config c = parse(doc(), {"model.rope_scaling.type=linear", "model.rope_scaling.factor=2"});
    CHECK(c.model.rope_scaling.type == RopeScalingKind::Linear);
    CHECK(c.model.rope_scaling.factor == 2.0);
    CHECK(c.origin.at("model.rope_scaling.factor") == "<command line>");
  }
}

TEST_CASE("config: model.rope_scaling round-trips through config_to_toml for every type") {
  const std::vector<std::string> tables = {
      "",
      "[model.rope_scaling]\ntype = \"linear\"\nfactor = 2.5\n",
      "[model.rope_scaling]\ntype = \"llama3\"\nfactor = 8\nlow_freq_factor = 2\nhigh_freq_factor = 5\n"
      "original_max_position_embeddings = 64\n",
      "[model.rope_scaling]\ntype = \"yarn\"\nfactor = 4\noriginal_max_position_embeddings = 64\n"
      "beta_fast = 8\nbeta_slow = 0.5\ntruncate = false\n",
  };
  for (const std::string& t : tables) {
    CAPTURE(t);
    const Config c = parse(doc("", t));
    const std::string text = config_to_toml(c);
    INFO(text);
    CHECK(text.find("rope_scaling.type = ") != std::string::npos);
    const Config back = parse(text);
    CHECK(back == c);
    CHECK(config_to_toml(back) == text);
  }
}

TEST_CASE("config: model.rope_scaling errors name the key") {
  struct Case {
    const char* name;
    std::string text;
    std::vector<std::string> overrides;
    std::string prefix;  // the message starts with this
    std::string detail;  // and contains this
  };
  const std::string rs = "[model.rope_scaling]\n";  // line 11 of doc("", tail)
  const std::vector<Case> cases = {
      {"dynamic", doc("", rs + "type = \"dynamic\"\nfactor = 2\n"), {}, "t.toml:12: model.rope_scaling.type: ",
       "unknown value \"dynamic\", expected \"none\", \"linear\", \"llama3\" or \"yarn\""},
      {"longrope override", doc(), {"model.rope_scaling.type=longrope"},
       "<command line>: model.rope_scaling.type: ", "unknown value \"longrope\""},
      {"unknown key in the table", doc("", rs + "type = \"yarn\"\nmscale = 1.0\n"), {},
       "t.toml:13: model.rope_scaling.mscale: ", "unknown key"},
      {"unknown dotted key", doc("rope_scaling.mscale_all_dim = 1\n"), {}, "t.toml:6: model.rope_scaling.mscale_all_dim: ",
       "unknown key"},
      {"rope_scaling not a table", doc("rope_scaling = \"yarn\"\n"), {}, "t.toml:6: model.rope_scaling: ", "unknown key"},
      {"factor missing", doc("", rs + "type = \"linear\"\n"), {}, "t.toml:11: model.rope_scaling.factor: ",
       "required with type = \"linear\""},
      {"factor not a number", doc("", rs + "type = \"linear\"\nfactor = \"8\"\n"), {},
       "t.toml:13: model.rope_scaling.factor: ", "expected a number"},
      {"factor 0", doc("", rs + "type = \"linear\"\nfactor = 0\n"), {}, "t.toml:13: model.rope_scaling.factor: ",
       "must be > 0"},
      {"llama3 without the context", doc("", rs + "type = \"llama3\"\nfactor = 8\n"), {},
       "t.toml:11: model.rope_scaling.original_max_position_embeddings: ", "required with type = \"llama3\""},
      {"llama3 high <= low",
       doc("", rs + "type = \"llama3\"\nfactor = 8\noriginal_max_position_embeddings = 64\nlow_freq_factor = 4\n"),
       {}, "t.toml:11: model.rope_scaling.high_freq_factor: ", "must be > low_freq_factor (4)"},
      {"yarn context 0", doc("", rs + "type = \"yarn\"\nfactor = 4\noriginal_max_position_embeddings = 0\n"), {},
       "t.toml:14: model.rope_scaling.original_max_position_embeddings: ", "must be > 0"},
      {"yarn beta_slow", doc("", rs + "type = \"yarn\"\nfactor = 4\noriginal_max_position_embeddings = 8\n"
                                      "beta_slow = -1\n"),
       {}, "t.toml:15: model.rope_scaling.beta_slow: ", "must be > 0"},
      {"yarn attention_factor", doc("", rs + "type = \"yarn\"\nfactor = 4\noriginal_max_position_embeddings = 8\n"
                                             "attention_factor = 0\n"),
       {}, "t.toml:15: model.rope_scaling.attention_factor: ", "must be > 0"},
      {"a llama3 key under yarn",
       doc("", rs + "type = \"yarn\"\nfactor = 4\noriginal_max_position_embeddings = 8\nlow_freq_factor = 2\n"), {},
       "t.toml:15: model.rope_scaling.low_freq_factor: ", "is used by type \"llama3\" only"},
      {"a yarn key under none", doc("", rs + "beta_fast = 8\n"), {}, "t.toml:12: model.rope_scaling.beta_fast: ",
       "is used by type \"yarn\" only (model.rope_scaling.type is \"none\")"},
      {"factor without a type", doc(), {"model.rope_scaling.factor=8"}, "<command line>: model.rope_scaling.factor: ",
       "is used by type \"linear\", \"llama3\" and \"yarn\" only"},
      {"learned positions", doc("family = \"gpt2\"\n", rs + "type = \"linear\"\nfactor = 2\n"), {},
       "t.toml:13: model.rope_scaling.type: ", "needs model.positions = \"rope\""},
      {"no attention", doc("family = \"mamba\"\n", rs + "type = \"linear\"\nfactor = 2\n"), {},
       "t.toml:13: model.rope_scaling.type: ", "the model has no attention layers"},
  };
  for (const Case& k : cases) {
    SUBCASE(k.name) {
      const std::string msg = error_of(k.text, k.overrides);
      INFO(msg);
      CHECK(msg.rfind(k.prefix, 0) == 0);
      CHECK(msg.find(k.detail) != std::string::npos);
    }
  }
}
