// Hugging Face export and import for every family (mixtral and mamba included; hybrid refused):
// export then import gives the parameters back bitwise; the file layout pins the names and shapes
// (GPT-2's transposed Conv1D weights, Mixtral's per-expert tensors, Mamba's conv1d (Di, 1, K));
// config.json maps both ways; init_from fills [model] and starts from the folder's weights;
// representability and import errors name the key, the file and the tensor. transformers itself
// is checked by scripts/hf_check.py on the GPU machine (logits of the export against ours).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

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

struct Family {
  const char* name;
  const char* family;
  std::vector<std::string> overrides;
};

// Non-default choices everywhere they map to a config.json key.
const std::vector<Family>& families() {
  static const std::vector<Family> f = {
      {"gpt2 (tied)", "gpt2", {"model.norm_eps=1e-4", "model.max_position_embeddings=29"}},
      {"gpt2 untied", "gpt2", {"model.tie_embeddings=false"}},
      {"llama gqa", "llama", {"model.num_kv_heads=1", "model.rope_theta=500.0", "model.norm_eps=3e-6"}},
      {"llama biases, tied", "llama", {"model.bias=true", "model.tie_embeddings=true", "model.head_dim=10"}},
      {"mistral window", "mistral", {"model.sliding_window=7", "model.num_kv_heads=1"}},
      {"qwen2 window", "qwen2", {"model.sliding_window=5", "model.rope_theta=1e6"}},
      {"qwen2", "qwen2", {"model.sliding_window=0"}},
      {"qwen3 head_dim 16 x 3 heads != hidden 24, tied", "qwen3", {"model.head_dim=16", "model.tie_embeddings=true"}},
      {"qwen3 window, gqa", "qwen3", {"model.sliding_window=5", "model.num_kv_heads=1", "model.rope_theta=5e5"}},
      {"mixtral aux, jitter, window, tied", "mixtral",
       {"model.num_experts=3", "model.experts_per_token=2", "model.moe_aux_loss_coef=0.02", "model.moe_jitter=0.1",
        "model.sliding_window=6", "model.tie_embeddings=true", "model.num_kv_heads=1"}},
      {"mixtral", "mixtral", {"model.num_experts=3", "model.experts_per_token=2", "model.rope_theta=5e4"}},
      {"qwen2_moe", "qwen2_moe", {"model.num_experts=3", "model.experts_per_token=2", "model.moe_ffn_hidden_size=12",
                                  "model.moe_shared_expert_ffn_size=16", "model.hybrid_layout=\"AE\""}},
      {"qwen3_moe", "qwen3_moe", {"model.num_experts=3", "model.experts_per_token=2", "model.moe_ffn_hidden_size=12",
                                  "model.head_dim=10", "model.hybrid_layout=\"EA\""}},
      {"mamba (tied)", "mamba", {"model.mamba_d_state=4", "model.mamba_d_conv=3", "model.norm_eps=1e-4"}},
      {"mamba untied, biases", "mamba",
       {"model.tie_embeddings=false", "model.mamba_proj_bias=true", "model.mamba_conv_bias=false",
        "model.mamba_expand=3", "model.mamba_dt_rank=5", "model.mamba_d_state=3"}},
      {"mamba2 groups, clamp", "mamba2",
       {"model.mamba_head_dim=8", "model.mamba_n_groups=2", "model.mamba_d_state=5", "model.mamba_d_conv=3",
        "model.mamba_dt_limit_min=0.01", "model.mamba_dt_limit_max=2.5"}},
      {"mamba2 tied, biases, no conv bias", "mamba2",
       {"model.mamba_head_dim=12", "model.mamba_d_state=4", "model.tie_embeddings=true", "model.mamba_proj_bias=true",
        "model.mamba_conv_bias=false"}},
  };
  return f;
}

Config family_config(const Family& f) { return tiny_run_config(f.family, f.overrides); }

}  // namespace

TEST_CASE("hf: export then import gives the parameters back bitwise, for every family and sharded or not") {
  for (const Family& f : families()) {
    CAPTURE(f.name);
    const Config c = family_config(f);
    auto model = random_model(c.model, f.name);
    const ParamStore& s = model->params();
    for (uint64_t shard : {uint64_t{5} << 30, uint64_t{4000}}) {
      CAPTURE(shard);
      const std::string dir = scratch_dir("hf-roundtrip") + "/out";
      hf::export_hf(c.model, s.table(), store_fetch(s), dir, {"F32", shard});
      const bool sharded = shard < 5000;
      CHECK(fs::exists(dir + "/model.safetensors.index.json") == sharded);
      CHECK(fs::exists(dir + "/model.safetensors") == !sharded);
      int files = 0;
      for (const auto& e : fs::directory_iterator(dir)) files += e.path().filename().string().rfind("model-0000", 0) == 0;
      CHECK((files > 1) == sharded);
      hf::HfWeights back(dir, c.model);
      for (const ParamSpec& p : s.table().entries()) {
        std::vector<float> v(static_cast<size_t>(p.shape.numel()));
        back.fetch(p, 0, p.shape.numel(), v.data());
        INFO(p.name);
        CHECK(std::memcmp(v.data(), s.weight(p.name).data, v.size() * 4) == 0);
        // Any element range (tensor-parallel shards ask for row blocks; Mixtral's experts are parts).
        std::vector<float> w(v.size(), -1.f);
        for (int64_t lo = 0; lo < p.shape.numel(); lo += 37)
          back.fetch(p, lo, std::min(lo + 37, p.shape.numel()), w.data() + lo);
        CHECK(std::memcmp(w.data(), v.data(), v.size() * 4) == 0);
      }
      // config.json describes the same model.
      const ModelConfig m = hf::model_from_hf_config(dir + "/config.json");
      const ParamTable mt = model_param_table(m);
      REQUIRE(mt.entries().size() == s.table().entries().size());
      for (size_t i = 0; i < mt.entries().size(); ++i) {
        CHECK(mt.entries()[i].name == s.table().entries()[i].name);
        CHECK(mt.entries()[i].shape == s.table().entries()[i].shape);
      }
      CHECK(m.family == c.model.family);
      CHECK(m.vocab_size == c.model.vocab_size);
      CHECK(m.hidden_size == c.model.hidden_size);
      CHECK(m.num_layers == c.model.num_layers);
      CHECK(m.norm == c.model.norm);
      CHECK(m.norm_eps == c.model.norm_eps);
      CHECK(m.bias == c.model.bias);
      CHECK(m.tie_embeddings == c.model.tie_embeddings);
      CHECK(block_layout(m) == block_layout(c.model));
      if (has_block_kind(c.model, "AE")) {  // attention (Mamba has none: its attention keys are moot)
        CHECK(m.num_heads == c.model.num_heads);
        CHECK(m.num_kv_heads == c.model.num_kv_heads);
        CHECK(m.head_dim == c.model.head_dim);
        CHECK(m.ffn_hidden_size == c.model.ffn_hidden_size);
        CHECK(m.activation == c.model.activation);
        CHECK(m.positions == c.model.positions);
        CHECK(m.sliding_window == c.model.sliding_window);
        CHECK(m.qkv_bias == c.model.qkv_bias);
        CHECK(m.qk_norm == c.model.qk_norm);
        if (c.model.positions == PositionKind::Rope) CHECK(m.rope_theta == c.model.rope_theta);
      }
      CHECK(m.num_experts == c.model.num_experts);
      CHECK(m.experts_per_token == c.model.experts_per_token);
      CHECK(m.moe_aux_loss_coef == doctest::Approx(c.model.moe_aux_loss_coef).epsilon(1e-12));
      CHECK(m.moe_jitter == c.model.moe_jitter);
      CHECK(m.moe_z_loss_coef == 0);
      if (c.model.family == ModelFamily::Mamba) {
        CHECK(m.mamba_d_state == c.model.mamba_d_state);
        CHECK(m.mamba_d_conv == c.model.mamba_d_conv);
        CHECK(m.mamba_expand == c.model.mamba_expand);
        CHECK(m.mamba_dt_rank == c.model.mamba_dt_rank);
        CHECK(m.mamba_conv_bias == c.model.mamba_conv_bias);
        CHECK(m.mamba_proj_bias == c.model.mamba_proj_bias);
      }
      if (c.model.family == ModelFamily::Mamba2) {
        for (auto [a, b] : {std::pair{m.mamba_d_state, c.model.mamba_d_state}, {m.mamba_d_conv, c.model.mamba_d_conv},
                            {m.mamba_expand, c.model.mamba_expand}, {m.mamba_head_dim, c.model.mamba_head_dim},
                            {m.mamba_n_groups, c.model.mamba_n_groups}})
          CHECK(a == b);
        CHECK((m.mamba_conv_bias == c.model.mamba_conv_bias && m.mamba_proj_bias == c.model.mamba_proj_bias));
        CHECK((m.mamba_dt_limit_min == c.model.mamba_dt_limit_min && m.mamba_dt_limit_max == c.model.mamba_dt_limit_max));
      }
      if (c.model.positions == PositionKind::Learned)
        CHECK(m.max_position_embeddings == c.model.max_position_embeddings);
    }
  }
}

TEST_CASE("hf: tensor names and layouts as transformers has them (GPT-2 Conv1D transposed, q/k/v not permuted)") {
  const Config g = tiny_run_config("gpt2");
  auto gm = random_model(g.model, "layout-gpt2");
  const std::string gdir = scratch_dir("hf-layout") + "/gpt2";
  hf::export_hf(g.model, gm->params().table(), store_fetch(gm->params()), gdir);
  ck::SafetensorsFile gf(gdir + "/model.safetensors");
  CHECK(gf.metadata().at("format") == "pt");
  CHECK(gf.find("lm_head.weight") == nullptr);  // tied
  const int64_t C = g.model.hidden_size, F = g.model.ffn_hidden_size;
  const ck::StTensor& qkv = gf.at("transformer.h.1.attn.c_attn.weight");
  REQUIRE(qkv.shape == std::vector<int64_t>{C, 3 * C});
  std::vector<float> v(static_cast<size_t>(qkv.numel));
  gf.read_f32(qkv, 0, qkv.numel, v.data());
  const ParamStore& s = gm->params();
  const char* parts[] = {"layers.1.attn.wq", "layers.1.attn.wk", "layers.1.attn.wv"};
  for (int part = 0; part < 3; ++part) {
    const Tensor w = s.weight(parts[part]);  // (out C, in C)
    for (int64_t o = 0; o < C; o += 5)
      for (int64_t i = 0; i < C; i += 3) CHECK(v[static_cast<size_t>(i * 3 * C + part * C + o)] == get(w, o * C + i));
  }
  const ck::StTensor& fc = gf.at("transformer.h.0.mlp.c_fc.weight");  // (in C, out F)
  CHECK(fc.shape == std::vector<int64_t>{C, F});
  std::vector<float> fcv(static_cast<size_t>(fc.numel));
  gf.read_f32(fc, 0, fc.numel, fcv.data());
  CHECK(fcv[static_cast<size_t>(2 * F + 7)] == get(s.weight("layers.0.mlp.w_in"), 7 * C + 2));
  CHECK(gf.at("transformer.wpe.weight").shape == std::vector<int64_t>{g.model.max_position_embeddings, C});

  const Config q = tiny_run_config("qwen2", {"model.num_kv_heads=1"});
  auto qm = random_model(q.model, "layout-qwen2");
  const std::string qdir = scratch_dir("hf-layout") + "/qwen2";
  hf::export_hf(q.model, qm->params().table(), store_fetch(qm->params()), qdir, {"BF16", uint64_t{1} << 30});
  ck::SafetensorsFile qf(qdir + "/model.safetensors");
  const ck::StTensor& k = qf.at("model.layers.1.self_attn.k_proj.weight");
  CHECK(k.dtype == "BF16");
  CHECK(k.shape == std::vector<int64_t>{q.model.head_dim, C});
  std::vector<float> kv(static_cast<size_t>(k.numel));
  qf.read_f32(k, 0, k.numel, kv.data());
  const Tensor wk = qm->params().weight("layers.1.attn.wk");
  for (int64_t i = 0; i < k.numel; ++i) CHECK(kv[static_cast<size_t>(i)] == static_cast<float>(bf16(static_cast<float>(get(wk, i)))));
  CHECK(qf.find("model.layers.0.self_attn.q_proj.bias") != nullptr);
  CHECK(qf.find("model.layers.0.self_attn.o_proj.bias") == nullptr);
  CHECK(qf.find("lm_head.weight") != nullptr);
  const auto j = nlohmann::json::parse(read_text(qdir + "/config.json"));
  CHECK(j["architectures"][0] == "Qwen2ForCausalLM");
  CHECK(j["dtype"] == "bfloat16");
  CHECK(j["rope_parameters"]["rope_theta"] == q.model.rope_theta);
  CHECK(j["rope_theta"] == q.model.rope_theta);
  CHECK(j["num_key_value_heads"] == 1);
  CHECK(j["tie_word_embeddings"] == false);
}

TEST_CASE("hf: mixtral and mamba tensor names, shapes and config.json as transformers has them") {
  SUBCASE("mixtral: per-expert w1 / w3 (F, C) and w2 (C, F), the router as gate") {
    const Config x = tiny_run_config("mixtral", {"model.num_experts=3", "model.experts_per_token=2",
                                                 "model.moe_aux_loss_coef=0.03", "model.moe_jitter=0.05"});
    auto xm = random_model(x.model, "layout-mixtral");
    const ParamStore& s = xm->params();
    const std::string dir = scratch_dir("hf-layout") + "/mixtral";
    hf::export_hf(x.model, s.table(), store_fetch(s), dir);
    ck::SafetensorsFile f(dir + "/model.safetensors");
    const int64_t C = x.model.hidden_size, F = x.model.ffn_hidden_size, E = 3;
    const std::string b = "model.layers.1.block_sparse_moe.";
    CHECK(f.at(b + "gate.weight").shape == std::vector<int64_t>{E, C});
    for (int j = 0; j < E; ++j) {
      const std::string e = b + "experts." + std::to_string(j) + ".";
      CHECK(f.at(e + "w1.weight").shape == std::vector<int64_t>{F, C});
      CHECK(f.at(e + "w3.weight").shape == std::vector<int64_t>{F, C});
      CHECK(f.at(e + "w2.weight").shape == std::vector<int64_t>{C, F});
    }
    CHECK(f.find(b + "experts.3.w1.weight") == nullptr);
    CHECK(f.find("model.layers.0.mlp.gate_proj.weight") == nullptr);
    CHECK(f.at("model.layers.0.self_attn.q_proj.weight").shape == std::vector<int64_t>{x.model.num_heads * x.model.head_dim, C});
    CHECK(f.at("model.layers.0.post_attention_layernorm.weight").shape == std::vector<int64_t>{C});
    CHECK(f.find("lm_head.weight") != nullptr);
    // 1 embedding + per layer (2 norms, q k v o, gate, 3 per expert) + final norm + lm_head.
    CHECK(f.tensors().size() == 1 + 2 * (2 + 4 + 1 + 3 * E) + 2);
    // Expert 1's w2 (C, F) is w_out[1] (C, F) as it is; w3 (F, C) is w_up[1].
    std::vector<float> w2(static_cast<size_t>(C * F)), w3(static_cast<size_t>(F * C));
    f.read_f32(f.at(b + "experts.1.w2.weight"), 0, C * F, w2.data());
    f.read_f32(f.at(b + "experts.1.w3.weight"), 0, F * C, w3.data());
    const Tensor w_out = s.weight("layers.1.moe.w_out"), w_up = s.weight("layers.1.moe.w_up");
    for (int64_t r = 0; r < C; r += 5)
      for (int64_t col = 0; col < F; col += 7)
        CHECK(w2[static_cast<size_t>(r * F + col)] == get(w_out, (1 * C + r) * F + col));
    for (int64_t r = 0; r < F; r += 7)
      for (int64_t col = 0; col < C; col += 5)
        CHECK(w3[static_cast<size_t>(r * C + col)] == get(w_up, (1 * F + r) * C + col));
    const auto j = nlohmann::json::parse(read_text(dir + "/config.json"));
    CHECK(j["architectures"][0] == "MixtralForCausalLM");
    CHECK(j["model_type"] == "mixtral");
    CHECK(j["num_local_experts"] == 3);
    CHECK(j["num_experts_per_tok"] == 2);
    CHECK(j["router_aux_loss_coef"].get<double>() == doctest::Approx(0.015));  // ours / top_k
    CHECK(j["output_router_logits"] == true);
    CHECK(j["router_jitter_noise"] == 0.05);
    CHECK(j["sliding_window"].is_null());
    CHECK(j["intermediate_size"] == F);
    CHECK(j["rope_theta"] == 1e6);
    CHECK(j["tie_word_embeddings"] == false);
  }
  SUBCASE("mamba: backbone names, in_proj = [x; z], conv1d (Di, 1, K)") {
    const Config m = tiny_run_config("mamba", {"model.mamba_d_state=4", "model.mamba_d_conv=3"});
    auto mm = random_model(m.model, "layout-mamba");
    const ParamStore& s = mm->params();
    const std::string dir = scratch_dir("hf-layout") + "/mamba";
    hf::export_hf(m.model, s.table(), store_fetch(s), dir, {"BF16", uint64_t{1} << 30});
    ck::SafetensorsFile f(dir + "/model.safetensors");
    const int64_t C = m.model.hidden_size, Di = 2 * C, N = 4, K = 3, R = (C + 15) / 16, V = m.model.vocab_size;
    const std::string x = "backbone.layers.1.mixer.";
    using S = std::vector<int64_t>;
    CHECK(f.at("backbone.embeddings.weight").shape == S{V, C});
    CHECK(f.at("backbone.layers.1.norm.weight").shape == S{C});
    CHECK(f.at(x + "in_proj.weight").shape == S{2 * Di, C});
    CHECK(f.at(x + "conv1d.weight").shape == S{Di, 1, K});
    CHECK(f.at(x + "conv1d.bias").shape == S{Di});
    CHECK(f.at(x + "x_proj.weight").shape == S{R + 2 * N, Di});
    CHECK(f.at(x + "dt_proj.weight").shape == S{Di, R});
    CHECK(f.at(x + "dt_proj.bias").shape == S{Di});
    CHECK(f.at(x + "A_log").shape == S{Di, N});
    CHECK(f.at(x + "D").shape == S{Di});
    CHECK(f.at(x + "out_proj.weight").shape == S{C, Di});
    CHECK(f.at("backbone.norm_f.weight").shape == S{C});
    CHECK(f.find(x + "in_proj.bias") == nullptr);
    CHECK(f.find(x + "out_proj.bias") == nullptr);
    CHECK(f.find("lm_head.weight") == nullptr);  // tied
    CHECK(f.tensors().size() == 2 + 2 * 10);
    CHECK(f.at(x + "A_log").dtype == "BF16");
    // in_proj rows Di.. are in_proj_z; conv1d holds conv_weight's elements in order.
    std::vector<float> in(static_cast<size_t>(2 * Di * C)), conv(static_cast<size_t>(Di * K));
    f.read_f32(f.at(x + "in_proj.weight"), 0, 2 * Di * C, in.data());
    f.read_f32(f.at(x + "conv1d.weight"), 0, Di * K, conv.data());
    const Tensor z = s.weight("layers.1.mamba.in_proj_z"), cw = s.weight("layers.1.mamba.conv_weight");
    auto bf = [](double v) { return static_cast<float>(bf16(static_cast<float>(v))); };
    for (int64_t i = 0; i < Di * C; i += 11) CHECK(in[static_cast<size_t>(Di * C + i)] == bf(get(z, i)));
    for (int64_t i = 0; i < Di * K; ++i) CHECK(conv[static_cast<size_t>(i)] == bf(get(cw, i)));
    const auto j = nlohmann::json::parse(read_text(dir + "/config.json"));
    CHECK(j["architectures"][0] == "MambaForCausalLM");
    CHECK(j["model_type"] == "mamba");
    CHECK(j["hidden_size"] == C);
    CHECK(j["intermediate_size"] == Di);
    CHECK(j["state_size"] == N);
    CHECK(j["conv_kernel"] == K);
    CHECK(j["expand"] == 2);
    CHECK(j["time_step_rank"] == R);
    CHECK(j["use_conv_bias"] == true);
    CHECK(j["use_bias"] == false);
    CHECK(j["layer_norm_epsilon"] == m.model.norm_eps);
    CHECK(j["residual_in_fp32"] == true);
    CHECK(j["rescale_prenorm_residual"] == false);
    CHECK(j["tie_word_embeddings"] == true);
    CHECK(j["dtype"] == "bfloat16");
    CHECK(!j.contains("num_attention_heads"));
    CHECK(!j.contains("rope_theta"));
  }
}

TEST_CASE("hf: logits() is the forward without the loss: its cross-entropy equals forward's loss") {
  for (ModelFamily family : {ModelFamily::GPT2, ModelFamily::Mistral, ModelFamily::Qwen2}) {
    CAPTURE(family_name(family));
    ModelConfig c = tiny_model(family);
    c.qkv_bias = family == ModelFamily::Qwen2;
    auto m = random_model(c, std::string("logits-") + family_name(family));
    Sample s = make_sample({5, 7}, c.vocab_size, "logits-sample");
    MicroBatch mb = make_micro_batch({&s}, 12, false, Device::CPU);
    Owned logits = empty({12, c.vocab_size}, DType::F32, Device::CPU);
    m->logits(mb, logits);
    double want = 0;
    for (int64_t t = 0; t < 12; ++t) {
      if (!s.loss_mask[static_cast<size_t>(t)]) continue;
      double mx = -1e30, sum = 0;
      for (int v = 0; v < c.vocab_size; ++v) mx = std::max(mx, get(logits, t * c.vocab_size + v));
      for (int v = 0; v < c.vocab_size; ++v) sum += std::exp(get(logits, t * c.vocab_size + v) - mx);
      want += mx + std::log(sum) - get(logits, t * c.vocab_size + s.tokens[static_cast<size_t>(t + 1)]);
    }
    auto saved = m->new_saved();
    const double got = m->forward(mb, *saved, false, 1.f);
    CHECK(got == doctest::Approx(want).epsilon(1e-5));
  }
}

TEST_CASE("hf: model.init_from fills [model] from config.json, checks the set keys, starts from the folder's weights") {
  const Config src = tiny_run_config("mistral", {"model.sliding_window=6", "model.num_kv_heads=1"});
  auto m = random_model(src.model, "init-from");
  const std::string dir = scratch_dir("hf-init") + "/model";
  hf::export_hf(src.model, m->params().table(), store_fetch(m->params()), dir);
  const std::string data = learnable_dataset();
  const std::string base = "[run]\ndevice = \"cpu\"\n[data]\ntrain = [\"" + data +
                           "\"]\nsequence_length = 12\n[training]\nsteps = 2\n[model]\ninit_from = \"" + dir + "\"\n";
  SUBCASE("unset keys are filled, the family included") {
    Config c = parse_config(base, "init.toml");
    CHECK(c.model.family == ModelFamily::Mistral);
    CHECK(c.model.hidden_size == src.model.hidden_size);
    CHECK(c.model.num_kv_heads == 1);
    CHECK(c.model.sliding_window == 6);
    CHECK(c.model.ffn_hidden_size == src.model.ffn_hidden_size);
    CHECK(c.origin.at("model.hidden_size") == dir + "/config.json");
    // The effective config reloads (its keys now agree with the folder).
    CHECK(parse_config(config_to_toml(c), "again.toml") == c);
    Trainer t(c, false);
    for (const ParamSpec& p : m->params().table().entries())
      CHECK(std::memcmp(t.model().params().weight(p.name).data, m->params().weight(p.name).data,
                        static_cast<size_t>(p.shape.numel()) * 4) == 0);
    CHECK(std::isfinite(t.train_step().loss));
  }
  SUBCASE("a set key that disagrees is an error naming it and the file") {
    check_mentions(error_of([&] { parse_config(base + "hidden_size = 32\n", "init.toml"); }),
                   {"init.toml:10", "model.hidden_size", "is 32", dir + "/config.json", "24"});
    check_mentions(error_of([&] { parse_config(base + "family = \"llama\"\n", "init.toml"); }),
                   {"model.family", "llama", "mistral"});
  }
  SUBCASE("not a Hugging Face folder") {
    check_mentions(error_of([&] { parse_config(base, "init.toml", {"model.init_from=/nonexistent/x"}); }),
                   {"model.init_from", "/nonexistent/x", "config.json"});
  }
}

TEST_CASE("hf: export refuses a model its architecture cannot hold, naming the key") {
  struct Case {
    const char* family;
    std::vector<std::string> overrides;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"llama", {"model.sliding_window=4"}, {"model.sliding_window", "mistral"}},
      {"llama", {"model.qkv_bias=true"}, {"model.qkv_bias", "qwen2"}},
      {"gpt2", {"model.num_kv_heads=1"}, {"model.num_kv_heads"}},
      {"gpt2", {"model.head_dim=7"}, {"model.head_dim"}},
      {"gpt2", {"model.norm=\"rmsnorm\""}, {"model.norm", "layernorm"}},
      {"mistral", {"model.bias=true"}, {"model.bias"}},
      {"qwen2", {"model.bias=true"}, {"model.bias"}},
      {"llama", {"model.positions=\"learned\""}, {"model.positions", "rope"}},
      {"hybrid", {"model.num_layers=3", "model.hybrid_layout=\"MEA\"", "model.num_experts=3"}, {"model.family", "hybrid"}},
      {"mixtral", {"model.moe_z_loss_coef=0.01"}, {"model.moe_z_loss_coef", "z-loss", "not representable"}},
      {"mixtral", {"model.bias=true"}, {"model.bias", "Mixtral"}},
      {"mixtral", {"model.activation=\"gelu\""}, {"model.activation", "swiglu"}},
      {"mamba", {"model.norm=\"layernorm\""}, {"model.norm", "rmsnorm"}},
      {"mamba", {"model.norm=\"layernorm\"", "model.bias=true"}, {"model.norm"}},
      {"mamba", {"model.bias=true"}, {"model.bias", "norms"}},
  };
  for (const Case& k : cases) {
    CAPTURE(k.family);
    CAPTURE(k.overrides[0]);
    const Config c = tiny_run_config(k.family, k.overrides);
    check_mentions(error_of([&] { hf::hf_config_json(c.model, "F32"); }), k.expect);
    if (k.family == std::string("hybrid")) {  // and the weights: nothing written
      auto m = random_model(c.model, "hybrid-export");
      const std::string dir = scratch_dir("hf-refuse") + "/hybrid";
      check_mentions(error_of([&] { hf::export_hf(c.model, m->params().table(), store_fetch(m->params()), dir); }),
                     {"model.family", "hybrid"});
      CHECK(!fs::exists(dir));
    }
  }
}

TEST_CASE("hf: import errors name the folder, the file and the tensor") {
  const Config llama = tiny_run_config("llama");
  auto m = random_model(llama.model, "import-errors");
  const std::string dir = scratch_dir("hf-import") + "/llama";
  hf::export_hf(llama.model, m->params().table(), store_fetch(m->params()), dir, {"F32", 6000});
  SUBCASE("a tensor the config needs is missing") {
    ModelConfig c = llama.model;
    c.bias = true;
    check_mentions(error_of([&] { hf::HfWeights w(dir, c); }), {dir, "model.layers.0.self_attn.q_proj.bias", "missing"});
  }
  SUBCASE("a tensor has another shape") {
    ModelConfig c = llama.model;
    c.ffn_hidden_size = 44;
    check_mentions(error_of([&] { hf::HfWeights w(dir, c); }),
                   {".safetensors", "model.layers.0.mlp.gate_proj.weight", "(40, 24)", "(44, 24)"});
  }
  SUBCASE("an unexpected tensor") {
    const Config q = tiny_run_config("qwen2");
    auto qm = random_model(q.model, "import-qwen2");
    const std::string qdir = scratch_dir("hf-import") + "/qwen2";
    hf::export_hf(q.model, qm->params().table(), store_fetch(qm->params()), qdir);
    ModelConfig as_llama = q.model;
    as_llama.family = ModelFamily::Llama;
    as_llama.qkv_bias = false;
    check_mentions(error_of([&] { hf::HfWeights w(qdir, as_llama); }),
                   {"model.safetensors", "unexpected tensor", "_proj.bias"});
  }
  SUBCASE("the index names a file that is not there") {
    fs::remove(dir + "/model-00002-of-" + [&] {
      for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("model-00001-of-", 0) == 0) return n.substr(15);
      }
      return std::string("?");
    }());
    check_mentions(error_of([&] { hf::HfWeights w(dir, llama.model); }), {"model-00002-of-"});
  }
  SUBCASE("unsupported config.json settings") {
    auto j = nlohmann::json::parse(read_text(dir + "/config.json"));
    j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 1e4}};
    write_text(dir + "/config.json", j.dump());
    check_mentions(error_of([&] { hf::model_from_hf_config(dir + "/config.json"); }),
                   {dir + "/config.json", "rope_type", "dynamic"});
    j["rope_parameters"] = nullptr;
    j["hidden_act"] = "gelu";
    write_text(dir + "/config.json", j.dump());
    check_mentions(error_of([&] { hf::model_from_hf_config(dir + "/config.json"); }), {"hidden_act", "gelu"});
  }
}

namespace {

// Rewrites a safetensors file through `edit(name, shape) -> keep?` (F32; shapes may be changed).
void rewrite_safetensors(const std::string& path,
                         const std::function<bool(const std::string&, std::vector<int64_t>&)>& edit) {
  std::vector<std::pair<std::string, std::vector<float>>> kept;
  std::vector<std::vector<int64_t>> shapes;
  {
    ck::SafetensorsFile f(path);
    for (const ck::StTensor& t : f.tensors()) {
      std::vector<int64_t> shape = t.shape;
      if (!edit(t.name, shape)) continue;
      std::vector<float> v(static_cast<size_t>(t.numel));
      f.read_f32(t, 0, t.numel, v.data());
      kept.emplace_back(t.name, std::move(v));
      shapes.push_back(shape);
    }
  }
  ck::SafetensorsWriter w;
  for (size_t i = 0; i < kept.size(); ++i) {
    const std::vector<float>* v = &kept[i].second;
    w.add(kept[i].first, "F32", shapes[i], [v](ck::OutFile& out) { out.write(v->data(), v->size() * 4); });
  }
  fs::remove(path + ".new");
  w.write(path + ".new");
  fs::rename(path + ".new", path);
}

}  // namespace

TEST_CASE("hf: a malformed mixtral or mamba folder is an error naming the tensor or the key") {
  const Config x = tiny_run_config("mixtral", {"model.num_experts=3", "model.experts_per_token=2"});
  auto xm = random_model(x.model, "malformed-mixtral");
  const std::string dir = scratch_dir("hf-malformed") + "/mixtral";
  hf::export_hf(x.model, xm->params().table(), store_fetch(xm->params()), dir);
  const std::string st = dir + "/model.safetensors";
  SUBCASE("an expert's tensor is missing") {
    rewrite_safetensors(st, [](const std::string& n, std::vector<int64_t>&) {
      return n != "model.layers.1.block_sparse_moe.experts.2.w3.weight";
    });
    check_mentions(error_of([&] { hf::HfWeights w(dir, x.model); }),
                   {dir, "model.layers.1.block_sparse_moe.experts.2.w3.weight", "missing", "mixtral"});
  }
  SUBCASE("an expert's w2 stored (F, C)") {
    const int64_t C = x.model.hidden_size, F = x.model.ffn_hidden_size;
    rewrite_safetensors(st, [&](const std::string& n, std::vector<int64_t>& shape) {
      if (n == "model.layers.0.block_sparse_moe.experts.1.w2.weight") shape = {F, C};
      return true;
    });
    check_mentions(error_of([&] { hf::HfWeights w(dir, x.model); }),
                   {"model.safetensors", "experts.1.w2.weight", "(40, 24)", "(24, 40)"});
  }
  SUBCASE("an expert more than num_local_experts") {
    ModelConfig two = x.model;
    two.num_experts = 2;
    check_mentions(error_of([&] { hf::HfWeights w(dir, two); }), {"gate.weight", "(3, 24)", "(2, 24)"});
    auto j = nlohmann::json::parse(read_text(dir + "/config.json"));
    j["num_experts_per_tok"] = 4;
    write_text(dir + "/config.json", j.dump());
    check_mentions(error_of([&] { hf::model_from_hf_config(dir + "/config.json"); }),
                   {dir + "/config.json", "num_experts_per_tok", "num_local_experts"});
  }
  SUBCASE("mamba config.json: time_step_rank \"auto\", intermediate_size, hidden_act") {
    const Config m = tiny_run_config("mamba", {"model.hidden_size=48"});
    auto mm = random_model(m.model, "malformed-mamba");
    const std::string mdir = scratch_dir("hf-malformed") + "/mamba";
    hf::export_hf(m.model, mm->params().table(), store_fetch(mm->params()), mdir);
    const std::string path = mdir + "/config.json";
    auto j = nlohmann::json::parse(read_text(path));
    j["time_step_rank"] = "auto";
    write_text(path, j.dump());
    CHECK(hf::model_from_hf_config(path).mamba_dt_rank == 3);  // ceil(48 / 16)
    j["intermediate_size"] = 100;
    write_text(path, j.dump());
    check_mentions(error_of([&] { hf::model_from_hf_config(path); }), {path, "intermediate_size", "100", "expand"});
    j["intermediate_size"] = 96;
    j["hidden_act"] = "gelu";
    write_text(path, j.dump());
    check_mentions(error_of([&] { hf::model_from_hf_config(path); }), {path, "hidden_act", "gelu"});
    // A tensor of the mixer missing.
    rewrite_safetensors(mdir + "/model.safetensors",
                        [](const std::string& n, std::vector<int64_t>&) { return n != "backbone.layers.1.mixer.A_log"; });
    check_mentions(error_of([&] { hf::HfWeights w(mdir, m.model); }), {"backbone.layers.1.mixer.A_log", "missing"});
  }
}

TEST_CASE("hf: model.init_from a mixtral or mamba folder fills [model] (experts, mamba keys), checks the set keys") {
  struct Case {
    const char* family;
    std::vector<std::string> overrides;
    std::string disagree;               // a set key that contradicts the folder
    std::vector<std::string> mentions;  // its error
  };
  const std::vector<Case> cases = {
      {"mixtral", {"model.num_experts=3", "model.experts_per_token=2", "model.moe_aux_loss_coef=0.04"},
       "num_experts = 4\n", {"model.num_experts", "is 4", "gives 3"}},
      {"mamba", {"model.mamba_d_state=3", "model.mamba_expand=1", "model.mamba_conv_bias=false", "model.num_layers=3"},
       "mamba_d_state = 8\n", {"model.mamba_d_state", "is 8", "gives 3"}},
  };
  for (const Case& k : cases) {
    CAPTURE(k.family);
    const Config src = tiny_run_config(k.family, k.overrides);
    auto m = random_model(src.model, std::string("init-from-") + k.family);
    const std::string dir = scratch_dir("hf-init-new") + "/" + k.family;
    hf::export_hf(src.model, m->params().table(), store_fetch(m->params()), dir);
    const std::string base = "[run]\ndevice = \"cpu\"\n[data]\ntrain = [\"" + learnable_dataset() +
                             "\"]\nsequence_length = 12\n[training]\nsteps = 2\n[model]\ninit_from = \"" + dir + "\"\n";
    Config c = parse_config(base, "init.toml");
    CHECK(c.model.family == src.model.family);
    CHECK(c.model.num_layers == src.model.num_layers);
    CHECK(c.model.num_experts == src.model.num_experts);
    CHECK(c.model.experts_per_token == src.model.experts_per_token);
    CHECK(c.model.moe_aux_loss_coef == doctest::Approx(src.model.moe_aux_loss_coef).epsilon(1e-12));
    CHECK(c.model.mamba_d_state == src.model.mamba_d_state);
    CHECK(c.model.mamba_expand == src.model.mamba_expand);
    CHECK(c.model.mamba_dt_rank == src.model.mamba_dt_rank);
    CHECK(c.model.mamba_conv_bias == src.model.mamba_conv_bias);
    CHECK(c.model.tie_embeddings == src.model.tie_embeddings);
    CHECK(block_layout(c.model) == block_layout(src.model));
    CHECK(parse_config(config_to_toml(c), "again.toml") == c);
    {
      Trainer t(c, false);
      for (const ParamSpec& p : m->params().table().entries())
        CHECK(std::memcmp(t.model().params().weight(p.name).data, m->params().weight(p.name).data,
                          static_cast<size_t>(p.shape.numel()) * 4) == 0);
      CHECK(std::isfinite(t.train_step().loss));
    }
    check_mentions(error_of([&] { parse_config(base + k.disagree, "init.toml"); }), k.mentions);
    // Training coefficients may differ from the folder's.
    if (k.family == std::string("mixtral")) {
      const Config d = parse_config(base + "moe_aux_loss_coef = 0.5\nmoe_z_loss_coef = 0.001\n", "init.toml");
      CHECK(d.model.moe_aux_loss_coef == 0.5);
      CHECK(d.model.moe_z_loss_coef == 0.001);
      CHECK(d.model.num_experts == 3);
    }
  }
}
