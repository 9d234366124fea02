// Hugging Face export and import for every family: export then import gives the parameters back
// bitwise; the file layout pins the names and GPT-2's transposed Conv1D weights; config.json maps
// both ways; init_from fills [model] and starts from the folder's weights; representability and
// import errors name the key, the file and the tensor. transformers itself is checked by
// scripts/hf_check.py on the GPU machine (logits of the export against ours).
#include <doctest/doctest.h>

#include <cmath>
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
  };
  return f;
}

Config family_config(const Family& f) { return tiny_run_config(f.family, f.overrides); }

// A model of `c` with generic weights (norm weights and biases not 1 and 0).
std::unique_ptr<Model> random_model(const ModelConfig& c, const std::string& name) {
  auto m = make_model(c, Device::CPU, DType::F32);
  randomize_weights(m->params(), name, 0.2);
  return m;
}

ck::Fetch store_fetch(const ParamStore& s) {
  return [&s](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
    std::memcpy(out, s.weight(p.name).ptr<float>() + lo, static_cast<size_t>(hi - lo) * 4);
  };
}

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
      }
      // config.json describes the same model.
      const ModelConfig m = hf::model_from_hf_config(dir + "/config.json");
      CHECK(m.family == c.model.family);
      CHECK(m.vocab_size == c.model.vocab_size);
      CHECK(m.hidden_size == c.model.hidden_size);
      CHECK(m.num_layers == c.model.num_layers);
      CHECK(m.num_heads == c.model.num_heads);
      CHECK(m.num_kv_heads == c.model.num_kv_heads);
      CHECK(m.head_dim == c.model.head_dim);
      CHECK(m.ffn_hidden_size == c.model.ffn_hidden_size);
      CHECK(m.norm == c.model.norm);
      CHECK(m.norm_eps == c.model.norm_eps);
      CHECK(m.activation == c.model.activation);
      CHECK(m.positions == c.model.positions);
      CHECK(m.sliding_window == c.model.sliding_window);
      CHECK(m.bias == c.model.bias);
      CHECK(m.qkv_bias == c.model.qkv_bias);
      CHECK(m.tie_embeddings == c.model.tie_embeddings);
      if (c.model.positions == PositionKind::Rope) CHECK(m.rope_theta == c.model.rope_theta);
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
  };
  for (const Case& k : cases) {
    CAPTURE(k.family);
    CAPTURE(k.overrides[0]);
    const Config c = tiny_run_config(k.family, k.overrides);
    check_mentions(error_of([&] { hf::hf_config_json(c.model, "F32"); }), k.expect);
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
    j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1e4}};
    write_text(dir + "/config.json", j.dump());
    check_mentions(error_of([&] { hf::model_from_hf_config(dir + "/config.json"); }),
                   {dir + "/config.json", "rope_type", "linear"});
    j["rope_parameters"] = nullptr;
    j["hidden_act"] = "gelu";
    write_text(dir + "/config.json", j.dump());
    check_mentions(error_of([&] { hf::model_from_hf_config(dir + "/config.json"); }), {"hidden_act", "gelu"});
  }
}
