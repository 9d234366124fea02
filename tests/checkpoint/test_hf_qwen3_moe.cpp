// Hugging Face Qwen3MoeForCausalLM (checkpoint/hf.h): qwen3's attention (q_norm, k_norm, head_dim
// apart from hidden_size / heads) with qwen2_moe's expert names and no shared expert; config.json
// both ways (Qwen3MoeConfig's defaults where keys are missing), init_from, and the refusals
// naming the key. The bitwise round trip is in test_hf.cpp's family list; transformers itself is
// scripts/hf_check.py's (GPU machine).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

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
namespace ck = engine::checkpoint;

namespace {

const std::vector<std::string> kQwen3Moe = {"model.num_experts=3", "model.experts_per_token=2",
                                            "model.moe_ffn_hidden_size=12", "model.head_dim=10",
                                            "model.moe_aux_loss_coef=0.04", "model.hybrid_layout=\"EA\""};

std::string export_model(const Config& c, const std::string& name) {
  return export_random_model(c.model, "hf-qwen3-moe", name);
}

}  // namespace

TEST_CASE("hf qwen3_moe: tensor names and shapes, config.json as transformers has them") {
  const Config x = tiny_run_config("qwen3_moe", kQwen3Moe);
  CHECK(block_layout(x.model) == "EA");
  CHECK(x.model.qk_norm);
  CHECK(x.model.moe_norm_topk_prob);
  CHECK(!x.model.qkv_bias);
  const std::string dir = export_model(x, "layout");
  ck::SafetensorsFile f(dir + "/model.safetensors");
  const int64_t C = x.model.hidden_size, F = x.model.ffn_hidden_size, Fe = 12, E = 3, D = 10;
  const int64_t H = x.model.num_heads;
  const std::string b = "model.layers.0.mlp.", d = "model.layers.1.mlp.";
  CHECK(f.at(b + "gate.weight").shape == std::vector<int64_t>{E, C});
  for (int j = 0; j < E; ++j) {
    const std::string e = b + "experts." + std::to_string(j) + ".";
    CHECK(f.at(e + "gate_proj.weight").shape == std::vector<int64_t>{Fe, C});
    CHECK(f.at(e + "up_proj.weight").shape == std::vector<int64_t>{Fe, C});
    CHECK(f.at(e + "down_proj.weight").shape == std::vector<int64_t>{C, Fe});
  }
  CHECK(f.find(b + "shared_expert.gate_proj.weight") == nullptr);
  CHECK(f.find(b + "shared_expert_gate.weight") == nullptr);
  CHECK(f.at(d + "gate_proj.weight").shape == std::vector<int64_t>{F, C});
  CHECK(f.find(d + "gate.weight") == nullptr);
  for (const char* l : {"model.layers.0.", "model.layers.1."}) {
    CHECK(f.at(std::string(l) + "self_attn.q_norm.weight").shape == std::vector<int64_t>{D});
    CHECK(f.at(std::string(l) + "self_attn.k_norm.weight").shape == std::vector<int64_t>{D});
    CHECK(f.at(std::string(l) + "self_attn.q_proj.weight").shape == std::vector<int64_t>{H * D, C});
    CHECK(f.find(std::string(l) + "self_attn.q_proj.bias") == nullptr);
  }
  // embedding, final norm, lm_head; per layer 2 norms, q k v o, q_norm, k_norm; sparse gate + 3 E,
  // dense 3.
  CHECK(f.tensors().size() == 3 + 2 * (2 + 4 + 2) + (1 + 3 * E) + 3);
  const auto j = nlohmann::json::parse(read_text(dir + "/config.json"));
  CHECK(j["architectures"][0] == "Qwen3MoeForCausalLM");
  CHECK(j["model_type"] == "qwen3_moe");
  CHECK(j["head_dim"] == D);
  CHECK(j["attention_bias"] == false);
  CHECK(j["intermediate_size"] == F);
  CHECK(j["moe_intermediate_size"] == Fe);
  CHECK(!j.contains("shared_expert_intermediate_size"));
  CHECK(!j.contains("qkv_bias"));
  CHECK(j["num_experts"] == 3);
  CHECK(j["num_experts_per_tok"] == 2);
  CHECK(j["norm_topk_prob"] == true);
  CHECK(j["decoder_sparse_step"] == 1);
  CHECK(j["mlp_only_layers"] == nlohmann::json::array({1}));
  CHECK(j["router_aux_loss_coef"].get<double>() == doctest::Approx(0.02));  // ours / top_k
  const ModelConfig back = hf::model_from_hf_config(dir + "/config.json");
  CHECK(back.family == ModelFamily::Qwen3Moe);
  CHECK(back.hybrid_layout == "EA");
  CHECK(back.qk_norm);
  CHECK(back.head_dim == D);
  CHECK(back.moe_ffn_hidden_size == Fe);
  CHECK(back.moe_shared_expert_ffn_size == 0);
  CHECK(back.moe_norm_topk_prob);
  CHECK(back.ffn_hidden_size == F);
}

TEST_CASE("hf qwen3_moe: Qwen3MoeConfig's defaults where keys are missing; a shared expert is refused") {
  const std::string base = R"({"model_type": "qwen3_moe", "vocab_size": 37, "hidden_size": 24, "num_hidden_layers": 4,
      "num_attention_heads": 2, "intermediate_size": 40)";
  auto read = [&](const std::string& more) {
    const std::string dir = scratch_dir("hf-qwen3-moe-read");
    write_text(dir + "/config.json", base + more + "}");
    return hf::model_from_hf_config(dir + "/config.json");
  };
  const ModelConfig m = read("");
  CHECK(m.family == ModelFamily::Qwen3Moe);
  CHECK(m.hybrid_layout == "");  // every layer sparse
  CHECK(m.num_experts == 128);
  CHECK(m.experts_per_token == 8);
  CHECK(m.moe_ffn_hidden_size == 768);
  CHECK(!m.moe_norm_topk_prob);  // the class's default (the released models set it true)
  CHECK(m.head_dim == 12);  // no head_dim field in Qwen3MoeConfig: hidden_size / heads
  CHECK(m.qk_norm);
  CHECK(read(R"(, "num_local_experts": 16)").num_experts == 16);  // transformers 5's saved name
  check_mentions(error_of([&] { read(R"(, "num_local_experts": 6, "num_experts": 5)"); }),
                 {"num_experts", "num_local_experts", "disagree"});
  CHECK(read(R"(, "decoder_sparse_step": 2, "mlp_only_layers": [3])").hybrid_layout == "AEAA");
  check_mentions(error_of([&] { read(R"(, "shared_expert_intermediate_size": 16)"); }),
                 {"shared_expert_intermediate_size", "qwen2_moe"});
  check_mentions(error_of([&] { read(R"(, "attention_bias": true)"); }), {"attention_bias"});
  check_mentions(error_of([&] { read(R"(, "num_experts_per_tok": 200)"); }), {"num_experts_per_tok"});
}

TEST_CASE("hf qwen3_moe: export refuses what Qwen3MoeForCausalLM cannot hold, naming the key") {
  for (const std::string& o : {std::string("model.moe_shared_expert_ffn_size=8"), std::string("model.qk_norm=false"),
                               std::string("model.moe_z_loss_coef=0.01"), std::string("model.moe_jitter=0.1"),
                               std::string("model.qkv_bias=true")}) {
    CAPTURE(o);
    std::vector<std::string> over = kQwen3Moe;
    over.push_back(o);
    const Config c = tiny_run_config("qwen3_moe", over);
    check_mentions(error_of([&] { hf::hf_config_json(c.model, "F32"); }), {o.substr(0, o.find('='))});
  }
}

TEST_CASE("hf qwen3_moe: model.init_from fills the family, layout and expert sizes; the model trains") {
  const Config src = tiny_run_config("qwen3_moe", kQwen3Moe);
  const std::string dir = export_model(src, "init");
  const std::string base = "[run]\ndevice = \"cpu\"\n[data]\ntrain = [\"" + learnable_dataset() +
                           "\"]\nsequence_length = 12\n[training]\nsteps = 2\n[model]\ninit_from = \"" + dir + "\"\n";
  const Config c = parse_config(base, "init.toml");
  CHECK(c.model.family == ModelFamily::Qwen3Moe);
  CHECK(c.model.hybrid_layout == "EA");
  CHECK(c.model.moe_ffn_hidden_size == 12);
  CHECK(c.model.head_dim == 10);
  CHECK(c.model.moe_norm_topk_prob);
  CHECK(parse_config(config_to_toml(c), "again.toml") == c);
  Trainer t(c, false);
  CHECK(std::isfinite(t.train_step().loss));
  // Every layer sparse (the released models: mlp_only_layers [], decoder_sparse_step 1): the
  // folder's empty layout means all E, and the effective config loads back.
  std::vector<std::string> sparse(kQwen3Moe.begin(), kQwen3Moe.end() - 1);
  const std::string all_e = export_model(tiny_run_config("qwen3_moe", sparse), "all-sparse");
  const Config e = parse_config(base.substr(0, base.find("init_from")) + "init_from = \"" + all_e + "\"\n", "init.toml");
  CHECK(e.model.hybrid_layout == "");
  CHECK(block_layout(e.model) == std::string(static_cast<size_t>(e.model.num_layers), 'E'));
  CHECK(parse_config(config_to_toml(e), "again.toml") == e);
  const Config d = tiny_run_config("qwen3_moe", sparse);
  CHECK(parse_config(config_to_toml(d), "again.toml") == d);
}
