// Hugging Face export and import of multi-token prediction (hf_mtp.h): Fast-LLM's MTP Llama
// folder (config.json model_type "mtp_llama", prediction_heads = k + 1; tensors model.layers.*,
// model.mtp_heads.{j-1}.*, model.mtp_norms.{0..k}, no model.norm), the bitwise round trip, the
// config read back, model.init_from of such a folder, and the refusals (other families; a
// folder's prediction_heads below 2 or missing). transformers itself is checked by
// scripts/hf_check.py --family mtp_llama on the GPU machine.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tools.h"
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
std::vector<std::string> mtp(std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.num_layers=3", "model.prediction_heads=2"};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}
}  // namespace

TEST_CASE("hf: an MTP llama exports as Fast-LLM's mtp_llama and imports back bitwise") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    const Config c = tiny_run_config("llama", mtp({std::string("model.tie_embeddings=") + (tied ? "true" : "false")}));
    auto model = random_model(c.model, "mtp-export");
    const ParamStore& s = model->params();
    const std::string dir = scratch_dir("hf-mtp") + "/out";
    hf::export_hf(c.model, s.table(), store_fetch(s), dir);
    const auto j = nlohmann::json::parse(read_text(dir + "/config.json"));
    CHECK(j["architectures"][0] == "MTPLlamaForCausalLM");
    CHECK(j["model_type"] == "mtp_llama");
    CHECK(j["prediction_heads"] == 3);
    CHECK(j["num_hidden_layers"] == 3);
    CHECK(j["auto_map"]["AutoModelForCausalLM"] == "modeling_mtp_llama.MTPLlamaForCausalLM");
    ck::SafetensorsFile f(dir + "/model.safetensors");
    CHECK(f.find("model.norm.weight") == nullptr);
    CHECK(f.find("model.layers.3.input_layernorm.weight") == nullptr);
    CHECK((f.find("lm_head.weight") == nullptr) == tied);
    // Each tensor holds our parameter's values.
    const std::pair<const char*, const char*> names[] = {
        {"model.layers.2.self_attn.q_proj.weight", "layers.2.attn.wq"},
        {"model.mtp_norms.0.weight", "final_norm.weight"},
        {"model.mtp_heads.0.input_layernorm.weight", "mtp.1.norm1.weight"},
        {"model.mtp_heads.0.self_attn.o_proj.weight", "mtp.1.attn.wo"},
        {"model.mtp_heads.1.post_attention_layernorm.weight", "mtp.2.norm2.weight"},
        {"model.mtp_heads.1.mlp.down_proj.weight", "mtp.2.mlp.w_out"},
        {"model.mtp_norms.1.weight", "mtp.1.norm.weight"},
        {"model.mtp_norms.2.weight", "mtp.2.norm.weight"}};
    for (const auto& [hf_name, ours] : names) {
      CAPTURE(hf_name);
      const ck::StTensor* t = f.find(hf_name);
      REQUIRE(t != nullptr);
      const ParamSpec& p = s.table().get(ours);
      int64_t n = 1;
      for (int64_t d : t->shape) n *= d;
      REQUIRE(n == p.shape.numel());
      std::vector<float> v(static_cast<size_t>(n));
      f.read_f32(*t, 0, n, v.data());
      CHECK(std::memcmp(v.data(), s.weight(ours).data, v.size() * 4) == 0);
    }
    // Every tensor of the folder is one of ours, and back bitwise.
    hf::HfWeights back(dir, c.model);
    for (const ParamSpec& p : s.table().entries()) {
      std::vector<float> v(static_cast<size_t>(p.shape.numel()));
      back.fetch(p, 0, p.shape.numel(), v.data());
      INFO(p.name);
      CHECK(std::memcmp(v.data(), s.weight(p.name).data, v.size() * 4) == 0);
    }
    const ModelConfig m = hf::model_from_hf_config(dir + "/config.json");
    CHECK(m.family == ModelFamily::Llama);
    CHECK(m.prediction_heads == 2);
    CHECK(model_param_table(m).entries().size() == s.table().entries().size());
  }
}

TEST_CASE("hf: model.init_from an mtp_llama folder takes its heads and weights, and trains") {
  const Config src = tiny_run_config("llama", mtp());
  auto m = random_model(src.model, "mtp-init");
  const std::string dir = scratch_dir("hf-mtp-init") + "/model";
  hf::export_hf(src.model, m->params().table(), store_fetch(m->params()), dir);
  const std::string base = "[run]\ndevice = \"cpu\"\n[data]\ntrain = [\"" + learnable_dataset() +
                           "\"]\nsequence_length = 12\n[training]\nsteps = 2\n[model]\ninit_from = \"" + dir + "\"\n";
  Config c = parse_config(base, "init.toml");
  CHECK(c.model.prediction_heads == 2);
  CHECK(c.model.prediction_loss_weights == std::vector<double>{1.0, 1.0, 1.0});
  CHECK(parse_config(config_to_toml(c), "again.toml") == c);
  Trainer t(c, false);
  for (const ParamSpec& p : m->params().table().entries())
    CHECK(std::memcmp(t.model().params().weight(p.name).data, m->params().weight(p.name).data,
                      static_cast<size_t>(p.shape.numel()) * 4) == 0);
  const StepResult r = t.train_step();
  CHECK(std::isfinite(r.loss));
  REQUIRE(r.head_losses.size() == 2);
  CHECK(std::isfinite(r.head_losses[1]));
  // A set key that disagrees with the folder is an error naming it.
  check_mentions(error_of([&] { parse_config(base + "prediction_heads = 1\n", "init.toml"); }),
                 {"model.prediction_heads", "is 1", dir + "/config.json", "2"});
}

TEST_CASE("hf: MTP export refuses other families; import refuses a missing or single prediction_heads") {
  for (const char* family : {"qwen3", "mistral", "mamba"}) {
    CAPTURE(family);
    const Config c = tiny_run_config(family, mtp());
    auto model = random_model(c.model, "mtp-refuse");
    const std::string dir = scratch_dir("hf-mtp-refuse") + "/out";
    check_mentions(error_of([&] { hf::export_hf(c.model, model->params().table(), store_fetch(model->params()), dir); }),
                   {"model.prediction_heads", "MTP Llama", family});
  }
  // A llama-only check still applies through the MTP export (a window is not Llama's).
  const Config windowed = tiny_run_config("llama", mtp({"model.sliding_window=4"}));
  check_mentions(error_of([&] { hf::architecture(windowed.model); }), {"sliding_window"});
  const Config c = tiny_run_config("llama", mtp());
  auto model = random_model(c.model, "mtp-keys");
  const std::string dir = scratch_dir("hf-mtp-keys") + "/out";
  hf::export_hf(c.model, model->params().table(), store_fetch(model->params()), dir);
  const std::string path = dir + "/config.json";
  const auto j0 = nlohmann::json::parse(read_text(path));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = j0;
    edit(j);
    write_text(path, j.dump());
    return error_of([&] { hf::model_from_hf_config(path); });
  };
  check_mentions(with([](nlohmann::json& j) { j.erase("prediction_heads"); }), {path, "prediction_heads"});
  check_mentions(with([](nlohmann::json& j) { j["prediction_heads"] = 1; }), {path, "prediction_heads", "got 1"});
  check_mentions(with([](nlohmann::json& j) { j["prediction_heads"] = "3"; }), {path, "prediction_heads"});
  // Tensors of a folder with fewer heads than config.json says are missing, by name.
  write_text(path, j0.dump());
  ModelConfig more = c.model;
  more.prediction_heads = 3;
  check_mentions(error_of([&] { hf::HfWeights w(dir, more); }), {"model.mtp_heads.2.", "missing"});
}

TEST_CASE("--dump-logits of an MTP model writes every head's logits (what hf_check.py compares)") {
  const Config src = tiny_run_config("llama", mtp());
  auto m = random_model(src.model, "mtp-dump");
  const std::string dir = scratch_dir("hf-mtp-dump");
  hf::export_hf(src.model, m->params().table(), store_fetch(m->params()), dir + "/model");
  Config c = parse_config("[run]\ndevice = \"cpu\"\nname = \"mtp-dump\"\noutput_dir = \"" + dir +
                              "/runs\"\n[data]\ntrain = [\"" + learnable_dataset() +
                              "\"]\nsequence_length = 12\n[training]\nsteps = 2\n[model]\ninit_from = \"" + dir +
                              "/model\"\n",
                          "dump.toml");
  write_text(dir + "/tokens.txt", "3 1 4 1 5 9 2\n6 5 3\n");
  ck::dump_logits(c, Device::CPU, dir + "/tokens.txt", dir + "/logits.safetensors");
  ck::SafetensorsFile f(dir + "/logits.safetensors");
  const std::vector<std::vector<int32_t>> seqs = {{3, 1, 4, 1, 5, 9, 2}, {6, 5, 3}};
  const int64_t V = src.model.vocab_size;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sample s;
    s.tokens = seqs[i];
    s.tokens.push_back(0);
    s.loss_mask.assign(seqs[i].size(), 1);
    s.doc_lengths = {static_cast<int32_t>(seqs[i].size())};
    const int64_t T = static_cast<int64_t>(seqs[i].size());
    MicroBatch mb = make_micro_batch({&s}, static_cast<int>(T), false, Device::CPU);
    for (int head = 0; head <= 2; ++head) {
      CAPTURE(head);
      const std::string name = (head == 0 ? std::string("logits.") : "logits_head" + std::to_string(head) + ".") +
                               std::to_string(i);
      const ck::StTensor* t = f.find(name);
      REQUIRE(t != nullptr);
      REQUIRE(t->shape == std::vector<int64_t>{T, V});
      std::vector<float> got(static_cast<size_t>(T * V));
      f.read_f32(*t, 0, T * V, got.data());
      Owned want = empty({T, V}, DType::F32, Device::CPU);
      m->prediction_logits(mb, head, want);
      CHECK(std::memcmp(got.data(), want->data, got.size() * 4) == 0);
    }
  }
  CHECK(f.find("logits_head3.0") == nullptr);
}
