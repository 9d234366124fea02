// The linear-time mixers' keys. model.family = "mamba2" and the S letter of model.hybrid_layout:
// the preset (d_state 128, untied), the Mamba-2 keys and their checks (head_dim dividing expand x hidden_size, n_groups
// dividing the heads, the delta clamp, tensor parallelism over groups), keys a model without S
// blocks refuses, the round trip through config_to_toml, and each error naming its key.
// The G letter (Gated DeltaNet + MLP): its defaults and the checks of its keys.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "core/check.h"

using namespace engine;

namespace {

// Lines: 1 [model] 2 family 3 vocab_size .. 6 num_layers, then model_extra, [data] .., [training].
std::string doc(const std::string& model_extra = "", const std::string& family = "mamba2", int layers = 2) {
  return "[model]\nfamily = \"" + family + "\"\nvocab_size = 256\nhidden_size = 64\nnum_layers = " +
         std::to_string(layers) + "\n" + model_extra +
         "[data]\ntrain = [\"data/a\"]\nsequence_length = 32\n[training]\nsteps = 10\n";
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

bool mentions(const std::string& message, const std::vector<std::string>& pieces) {
  for (const std::string& p : pieces)
    if (message.find(p) == std::string::npos) return false;
  return true;
}

}  // namespace

TEST_CASE("config: family mamba2 presets Mamba2Config's defaults and round-trips") {
  const Config c = parse(doc());
  CHECK(c.model.mamba_d_state == 128);
  CHECK(c.model.mamba_head_dim == 64);
  CHECK(c.model.mamba_n_groups == 1);
  CHECK_FALSE(c.model.tie_embeddings);
  CHECK(block_layout(c.model) == "SS");
  CHECK(parse(config_to_toml(c)) == c);
  const Config h = parse(doc("hybrid_layout = \"SAS\"\nnum_heads = 4\nmamba_head_dim = 32\nmamba_n_groups = 2\n"
                             "mamba_d_state = 16\nmamba_dt_limit_min = 0.001\nmamba_dt_limit_max = 0.5\n",
                             "hybrid", 3));
  CHECK(block_layout(h.model) == "SAS");
  CHECK(h.model.mamba_d_state == 16);  // set: no preset
  CHECK(h.model.mamba_dt_limit_max == 0.5);
  CHECK(parse(config_to_toml(h)) == h);
}

TEST_CASE("config: the Mamba-2 keys are checked, naming the key") {
  struct Case {
    const char* what;
    std::string text;
    std::vector<std::string> overrides;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"head_dim not dividing the inner width", doc("mamba_head_dim = 48\n"), {},
       {"t.toml:6: model.mamba_head_dim", "must divide", "128", "48"}},
      {"n_groups not dividing the heads", doc("mamba_n_groups = 3\n"), {}, {"model.mamba_n_groups", "2", "3"}},
      {"clamp upside down", doc("mamba_dt_limit_min = 0.5\nmamba_dt_limit_max = 0.1\n"), {},
       {"model.mamba_dt_limit_max", "0.5"}},
      {"negative clamp", doc("mamba_dt_limit_min = -1.0\n"), {}, {"model.mamba_dt_limit_min"}},
      {"conv kernel above the CUDA kernel's", doc("mamba_d_conv = 5\n"), {}, {"model.mamba_d_conv", "at most 4"}},
      {"Mamba-2 keys without S blocks", doc("num_heads = 4\nmamba_head_dim = 32\n", "llama"), {},
       {"model.mamba_head_dim", "no Mamba-2 (S) blocks"}},
      {"dt_rank without M blocks", doc("mamba_dt_rank = 3\n"), {}, {"model.mamba_dt_rank", "no Mamba (M) blocks"}},
      {"per-group norm without S blocks", doc("num_heads = 4\nmamba_norm_per_group = true\n", "llama"), {},
       {"model.mamba_norm_per_group", "no Mamba-2 (S) blocks"}},

      {"groups not split by tensor parallelism", doc("mamba_head_dim = 32\n"), {"distributed.tensor_parallel=2"},
       {"distributed.tensor_parallel", "model.mamba_n_groups"}},
      {"micro-sequences", doc(), {"batch.micro_sequence_length=16"}, {"batch.micro_sequence_length", "Mamba-2"}},
      {"a letter the hybrid layout does not take", doc("hybrid_layout = \"SX\"\n", "hybrid"), {},
       {"model.hybrid_layout", "S (Mamba-2)"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string e = error_of(c.text, c.overrides);
    INFO(e);
    CHECK(mentions(e, c.expect));
  }
  // d_state above Mamba's 16 is fine for S blocks, refused for M ones.
  CHECK_NOTHROW(parse(doc("mamba_d_state = 64\n")));
  CHECK(mentions(error_of(doc("hybrid_layout = \"SM\"\nmamba_d_state = 64\n", "hybrid")),
                 {"model.mamba_d_state", "at most 16", "Mamba (M)"}));
}

TEST_CASE("config: the G letter (Gated DeltaNet + MLP) takes Qwen3-Next's defaults and checks its keys") {
  const Config c = parse(doc("hybrid_layout = \"GA\"\nnum_heads = 4\n", "hybrid"));
  CHECK(block_layout(c.model) == "GA");
  CHECK(c.model.gdn_num_key_heads == 16);
  CHECK(c.model.gdn_num_value_heads == 32);
  CHECK(c.model.gdn_key_head_dim == 128);
  CHECK(c.model.gdn_value_head_dim == 128);
  CHECK(c.model.gdn_conv_kernel == 4);
  CHECK(parse(config_to_toml(c)) == c);
  const std::string g = "hybrid_layout = \"GA\"\nnum_heads = 4\n";
  struct Case {
    const char* what;
    std::string text;
    std::vector<std::string> overrides;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"value heads not a multiple", doc(g + "gdn_num_key_heads = 3\ngdn_num_value_heads = 4\n", "hybrid"), {},
       {"model.gdn_num_value_heads", "multiple", "3"}},
      {"zero key dim", doc(g + "gdn_key_head_dim = 0\n", "hybrid"), {}, {"model.gdn_key_head_dim"}},
      {"conv kernel above the CUDA kernel's", doc(g + "gdn_conv_kernel = 6\n", "hybrid"), {},
       {"model.gdn_conv_kernel", "at most 4"}},
      {"keys without G blocks", doc("gdn_num_key_heads = 2\n"), {}, {"model.gdn_num_key_heads", "no Gated DeltaNet (G)"}},
      {"key heads not split by tensor parallelism", doc(g + "gdn_num_key_heads = 3\ngdn_num_value_heads = 6\n", "hybrid"),
       {"distributed.tensor_parallel=2"}, {"distributed.tensor_parallel", "model.gdn_num_key_heads"}},
      {"micro-sequences", doc(g, "hybrid"), {"batch.micro_sequence_length=16"},
       {"batch.micro_sequence_length", "Gated DeltaNet"}},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    const std::string e = error_of(k.text, k.overrides);
    INFO(e);
    CHECK(mentions(e, k.expect));
  }
}
