// Hugging Face Qwen2MoeForCausalLM (checkpoint/hf.h): the tensor names and shapes of sparse and
// dense layers (routed experts, the shared expert and its gate, llama's MLP names on the A
// layers), config.json both ways (moe_intermediate_size, shared_expert_intermediate_size,
// norm_topk_prob, the layer kinds as mlp_only_layers, decoder_sparse_step and mlp_only_layers
// read back as a layout), init_from, and the refusals naming the key. The bitwise round trip is
// in test_hf.cpp's family list; transformers itself is scripts/hf_check.py's (GPU machine).
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
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;
namespace ck = engine::checkpoint;

namespace {

const std::vector<std::string> kQwen2Moe = {"model.num_experts=3", "model.experts_per_token=2",
                                            "model.moe_ffn_hidden_size=12", "model.moe_shared_expert_ffn_size=16",
                                            "model.moe_aux_loss_coef=0.04", "model.hybrid_layout=\"AE\""};

std::string export_model(const Config& c, const std::string& name) {
  return export_random_model(c.model, "hf-qwen2-moe", name);
}

}  // namespace

TEST_CASE("hf qwen2_moe: tensor names and shapes, config.json as transformers has them") {
  const Config x = tiny_run_config("qwen2_moe", kQwen2Moe);
  CHECK(block_layout(x.model) == "AE");
  CHECK(x.model.qkv_bias);
  CHECK(!x.model.moe_norm_topk_prob);
  CHECK(x.model.norm_eps == 1e-6);
  const std::string dir = export_model(x, "layout");
  ck::SafetensorsFile f(dir + "/model.safetensors");
  const int64_t C = x.model.hidden_size, F = x.model.ffn_hidden_size, Fe = 12, Fs = 16, E = 3;
  const std::string d = "model.layers.0.mlp.", b = "model.layers.1.mlp.";
  CHECK(f.at(d + "gate_proj.weight").shape == std::vector<int64_t>{F, C});
  CHECK(f.at(d + "down_proj.weight").shape == std::vector<int64_t>{C, F});
  CHECK(f.find(d + "gate.weight") == nullptr);
  CHECK(f.at(b + "gate.weight").shape == std::vector<int64_t>{E, C});
  for (int j = 0; j < E; ++j) {
    const std::string e = b + "experts." + std::to_string(j) + ".";
    CHECK(f.at(e + "gate_proj.weight").shape == std::vector<int64_t>{Fe, C});
    CHECK(f.at(e + "up_proj.weight").shape == std::vector<int64_t>{Fe, C});
    CHECK(f.at(e + "down_proj.weight").shape == std::vector<int64_t>{C, Fe});
  }
  CHECK(f.at(b + "shared_expert.gate_proj.weight").shape == std::vector<int64_t>{Fs, C});
  CHECK(f.at(b + "shared_expert.up_proj.weight").shape == std::vector<int64_t>{Fs, C});
  CHECK(f.at(b + "shared_expert.down_proj.weight").shape == std::vector<int64_t>{C, Fs});
  CHECK(f.at(b + "shared_expert_gate.weight").shape == std::vector<int64_t>{1, C});
  CHECK(f.find(b + "gate_proj.weight") == nullptr);
  CHECK(f.find("model.layers.0.self_attn.q_proj.bias") != nullptr);
  CHECK(f.find("model.layers.0.self_attn.o_proj.bias") == nullptr);
  // embedding, final norm, lm_head; per layer 2 norms, q k v o + 3 biases; dense 3, sparse
  // gate + 3 E + 3 shared + shared gate.
  CHECK(f.tensors().size() == 3 + 2 * (2 + 7) + 3 + (1 + 3 * E + 4));
  const auto j = nlohmann::json::parse(read_text(dir + "/config.json"));
  CHECK(j["architectures"][0] == "Qwen2MoeForCausalLM");
  CHECK(j["model_type"] == "qwen2_moe");
  CHECK(j["intermediate_size"] == F);
  CHECK(j["moe_intermediate_size"] == Fe);
  CHECK(j["shared_expert_intermediate_size"] == Fs);
  CHECK(j["num_experts"] == 3);
  CHECK(j["num_experts_per_tok"] == 2);
  CHECK(j["norm_topk_prob"] == false);
  CHECK(j["decoder_sparse_step"] == 1);
  CHECK(j["mlp_only_layers"] == nlohmann::json::array({0}));
  CHECK(j["router_aux_loss_coef"].get<double>() == doctest::Approx(0.02));  // ours / top_k
  CHECK(j["output_router_logits"] == true);
  CHECK(j["qkv_bias"] == true);
  CHECK(j["rms_norm_eps"] == 1e-6);
  const ModelConfig back = hf::model_from_hf_config(dir + "/config.json");
  CHECK(back.family == ModelFamily::Qwen2Moe);
  CHECK(back.hybrid_layout == "AE");
  CHECK(back.moe_ffn_hidden_size == Fe);
  CHECK(back.moe_shared_expert_ffn_size == Fs);
  CHECK(back.moe_norm_topk_prob == false);
  CHECK(back.ffn_hidden_size == F);
}

TEST_CASE("hf qwen2_moe: decoder_sparse_step and mlp_only_layers read as a layout; bad values name the key") {
  const std::string dir = scratch_dir("hf-qwen2-moe-json");
  const std::string base = R"({"model_type": "qwen2_moe", "vocab_size": 37, "hidden_size": 24, "num_hidden_layers": 6,
    "num_attention_heads": 3, "intermediate_size": 40, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 8, "shared_expert_intermediate_size": 16)";
  auto read = [&](const std::string& more) {
    write_text(dir + "/config.json", base + more + "}");
    return hf::model_from_hf_config(dir + "/config.json");
  };
  CHECK(read("").hybrid_layout == "");  // Qwen2MoeConfig's defaults: every layer sparse
  CHECK(block_layout(read("")) == "EEEEEE");
  CHECK(read(R"(, "decoder_sparse_step": 2)").hybrid_layout == "AEAEAE");
  CHECK(read(R"(, "decoder_sparse_step": 3, "mlp_only_layers": [5])").hybrid_layout == "AAEAAA");
  CHECK(read(R"(, "mlp_only_layers": [0, 1])").hybrid_layout == "AAEEEE");
  CHECK(read(R"(, "norm_topk_prob": true)").moe_norm_topk_prob);
  CHECK(read("").moe_aux_loss_coef == 0);  // counted only with output_router_logits
  const struct {
    const char* more;
    std::vector<std::string> mentions;
  } bad[] = {{R"(, "decoder_sparse_step": 0)", {"decoder_sparse_step", ">= 1"}},
             {R"(, "mlp_only_layers": [6])", {"mlp_only_layers", "6"}},
             {R"(, "mlp_only_layers": 1)", {"mlp_only_layers", "list"}},
             {R"(, "num_experts": 0)", {"num_experts", "> 0"}},
             {R"(, "shared_expert_intermediate_size": 0)", {"shared_expert_intermediate_size"}},
             {R"(, "num_experts_per_tok": 5)", {"num_experts_per_tok"}}};
  for (const auto& k : bad) {
    CAPTURE(k.more);
    // The base object has the key already for some: a later duplicate wins in nlohmann's parse.
    check_mentions(error_of([&] { read(k.more); }), k.mentions);
  }
}

TEST_CASE("hf qwen2_moe: export refuses what Qwen2MoeForCausalLM cannot hold, naming the key") {
  const struct {
    std::vector<std::string> overrides;
    std::vector<std::string> mentions;
  } cases[] = {{{"model.moe_shared_expert_ffn_size=0"}, {"model.moe_shared_expert_ffn_size", "shared expert"}},
               {{"model.moe_z_loss_coef=0.01"}, {"model.moe_z_loss_coef"}},
               {{"model.moe_jitter=0.1"}, {"model.moe_jitter"}},
               {{"model.bias=true"}, {"model.bias"}},
               {{"model.qkv_bias=false"}, {"model.qkv_bias"}}};
  for (const auto& k : cases) {
    CAPTURE(k.overrides[0]);
    std::vector<std::string> o = kQwen2Moe;
    o.insert(o.end(), k.overrides.begin(), k.overrides.end());
    const Config c = tiny_run_config("qwen2_moe", o);
    check_mentions(error_of([&] { hf::hf_config_json(c.model, "F32"); }), k.mentions);
  }
  // Mixtral has neither a shared expert nor unnormalised weights.
  check_mentions(error_of([&] {
                   hf::hf_config_json(tiny_run_config("mixtral", {"model.num_experts=3", "model.moe_shared_expert_ffn_size=8"}).model, "F32");
                 }),
                 {"model.moe_shared_expert_ffn_size", "qwen2_moe"});
  check_mentions(error_of([&] {
                   hf::hf_config_json(tiny_run_config("mixtral", {"model.num_experts=3", "model.moe_norm_topk_prob=false"}).model, "F32");
                 }),
                 {"model.moe_norm_topk_prob"});
}

TEST_CASE("hf qwen2_moe: model.init_from fills the layout and the expert sizes, checks the set keys") {
  const Config src = tiny_run_config("qwen2_moe", kQwen2Moe);
  const std::string dir = export_model(src, "init");
  const std::string base = "[run]\ndevice = \"cpu\"\n[data]\ntrain = [\"" + learnable_dataset() +
                           "\"]\nsequence_length = 12\n[training]\nsteps = 2\n[model]\ninit_from = \"" + dir + "\"\n";
  const Config c = parse_config(base, "init.toml");
  CHECK(c.model.family == ModelFamily::Qwen2Moe);
  CHECK(c.model.hybrid_layout == "AE");
  CHECK(c.model.moe_ffn_hidden_size == 12);
  CHECK(c.model.moe_shared_expert_ffn_size == 16);
  CHECK(!c.model.moe_norm_topk_prob);
  CHECK(c.model.num_experts == 3);
  CHECK(parse_config(config_to_toml(c), "again.toml") == c);
  check_mentions(error_of([&] { parse_config(base + "hybrid_layout = \"EE\"\n", "init.toml"); }),
                 {"model.hybrid_layout", "\"EE\"", "\"AE\""});
  check_mentions(error_of([&] { parse_config(base + "moe_ffn_hidden_size = 8\n", "init.toml"); }),
                 {"model.moe_ffn_hidden_size", "is 8", "gives 12"});
  Trainer t(c, false);
  CHECK(std::isfinite(t.train_step().loss));
}
