// LoRA runs end to end on the CPU: the [lora] keys and their refusals, training moves only the
// adapters (frozen weights bitwise unchanged, no optimizer state for them, the memory estimate's
// optimizer state falls), exact resume with the base from model.init_from, the merged
// --export-hf equals the adapted model, and the PEFT adapter folder.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/hf.h"
#include "checkpoint/lora_export.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tools.h"
#include "layers/lora.h"
#include "models/memory_estimate.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"
#include "models/micro_batch.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kLora = {"lora.rank=4", "lora.alpha=8",
                                        "lora.targets=[\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]"};

Owned host_copy(const Tensor& t) {
  Owned h = empty(t.shape, t.dtype, Device::CPU);
  copy_tensor(h, t);
  return h;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.dtype == b.dtype && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

std::string runs_dir() { return (fs::path(learnable_dataset()).parent_path() / "lora-runs").string(); }

}  // namespace

TEST_CASE("lora config: keys, the effective config, and refusals naming the key") {
  const Config c = tiny_run_config("llama", kLora);
  CHECK(c.model.lora.rank == 4);
  CHECK(c.model.lora.alpha == 8);
  CHECK(c.model.lora.targets.size() == 7);
  const Config d = tiny_run_config("llama", {"lora.rank=2"});
  CHECK(d.model.lora.targets == std::vector<std::string>{"q", "v"});  // PEFT's default for Llama
  CHECK(config_to_toml(c).find("targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]") != std::string::npos);
  CHECK(parse_config(config_to_toml(c), "effective.toml").model.lora == c.model.lora);
  auto refused = [](const std::string& family, const std::vector<std::string>& o, const std::vector<std::string>& words) {
    const std::string e = error_of([&] { tiny_run_config(family, o); });
    INFO(e);
    for (const auto& w : words) CHECK(e.find(w) != std::string::npos);
  };
  refused("llama", {"lora.rank=4", "lora.targets=[\"q\", \"qkv\"]"}, {"lora.targets", "\"qkv\"", "\"gate\", \"up\", \"down\""});
  refused("llama", {"lora.rank=4", "lora.targets=[\"q\", \"q\"]"}, {"lora.targets", "twice"});
  refused("llama", {"lora.rank=4", "lora.targets=[]"}, {"lora.targets", "at least one"});
  refused("llama", {"lora.rank=4", "lora.targets=\"q\""}, {"lora.targets", "array of strings"});
  refused("llama", {"lora.rank=-1"}, {"lora.rank", ">= 0"});
  refused("llama", {"lora.rank=4", "lora.alpha=0"}, {"lora.alpha", "> 0"});
  refused("gpt2", {"lora.rank=4", "lora.targets=[\"up\"]"}, {"lora.targets", "SwiGLU"});
  refused("mixtral", {"lora.rank=4", "model.num_experts=4"}, {"lora.rank", "mixture-of-experts"});
  refused("llama", {"lora.rank=4", "lora.dropout=0.1"}, {"lora.dropout", "unknown key"});
}

TEST_CASE("lora training: only the adapters move, frozen weights stay bitwise, no optimizer state for them") {
  Trainer full(tiny_run_config("llama"), false);
  Trainer t(tiny_run_config("llama", kLora), false);
  const ParamStore& store = t.model().params();
  REQUIRE(store.table().frozen_elements() > 0);
  const Owned frozen0 = host_copy(store.frozen_flat()), master0 = host_copy(t.optimizer().master());
  // The frozen base equals the full model's init (same seed, keyed by name).
  for (const char* name : {"layers.1.attn.wq", "embed.tokens", "final_norm.weight"})
    CHECK(same_bits(store.weight(name), full.model().params().weight(name)));
  std::vector<double> losses;
  for (int i = 0; i < 20; ++i) losses.push_back(t.train_step().loss);
  CHECK(same_bits(store.frozen_flat(), frozen0));
  CHECK_FALSE(same_bits(t.optimizer().master(), master0));
  // The adapters alone learn (slowly on a random base of init_std 0.02): the last four steps'
  // mean loss below the first four's.
  const double head = (losses[0] + losses[1] + losses[2] + losses[3]) / 4;
  const double tail = (losses[16] + losses[17] + losses[18] + losses[19]) / 4;
  INFO("first four " << head << ", last four " << tail);
  CHECK(tail < head - 0.05);
  // Optimizer state and gradients cover the adapters only.
  const ParamTable& tab = store.table();
  int64_t lora = 0;
  for (const ParamSpec& s : tab.entries()) lora += s.frozen ? 0 : s.shape.numel();
  CHECK(store.grads_flat().numel() == store.capacity());
  CHECK(store.capacity() < lora + 64 * 29);  // the factors, their alignment gaps and the padding
  CHECK(t.optimizer().state_bytes() < full.optimizer().state_bytes() / 3);
  CHECK(t.optimizer().state_bytes() == size_t(8) * static_cast<size_t>(store.capacity()));  // two f32 moments (CPU: the master is the weights)
}

TEST_CASE("lora memory estimate: gradients and optimizer state count the adapters only") {
  auto part = [](const MemoryEstimate& e, const std::string& name) {
    for (const MemoryPart& p : e.parts)
      if (p.name == name) return p.bytes;
    return -1.0;
  };
  for (int zero : {0, 3}) {
    CAPTURE(zero);
    const std::string z = "distributed.zero_stage=" + std::to_string(zero);
    RankPlacement p;
    p.dp = 2;
    const Config full = tiny_run_config("llama", {z}), lora = tiny_run_config("llama", plus(kLora, {z}));
    const MemoryEstimate a = estimate_memory(full, p), b = estimate_memory(lora, p);
    CHECK(part(b, "optimizer state") > 0);
    CHECK(part(b, "optimizer state") < part(a, "optimizer state") / 3);
    CHECK(part(b, "gradients") < part(a, "gradients") / 3);
    CHECK(part(b, "parameters") > part(a, "parameters"));  // the base plus the factors
    // The adapters' count: 2 layers x (4 x (in + out) per target).
    const double C = 24, F = 40, r = 4, H = 3 * 8;  // hidden 24, heads 3 of dim 8, ffn 40
    const double factors = 2 * r * ((C + H) * 3 + (H + C) + 2 * (C + F) + (F + C));
    CHECK(part(b, "gradients") == doctest::Approx(4 * factors));
  }
}

TEST_CASE("lora resume: the base from model.init_from, the adapters from the checkpoint; losses bitwise") {
  const Config plain = tiny_run_config("llama");
  const std::string base = export_random_model(plain.model, "lora-base", "llama");
  const std::vector<std::string> o = plus(kLora, {"model.init_from=\"" + base + "\"", "run.output_dir=\"" + runs_dir() + "\"",
                                                  "training.steps=6", "data.sequence_length=12"});
  Trainer ref(tiny_run_config("llama", plus(o, {"run.name=\"ref\""})), false);
  // The frozen weights are the folder's.
  auto folder = random_model(plain.model, "llama");
  CHECK(same_bits(ref.model().params().weight("layers.0.mlp.w_up"), folder->params().weight("layers.0.mlp.w_up")));
  std::vector<double> want;
  for (int i = 0; i < 6; ++i) want.push_back(ref.train_step().loss);

  std::unique_ptr<Trainer> resumed = resumed_after(tiny_run_config("llama", plus(o, {"run.name=\"stop\""})), 3);
  Trainer& second = *resumed;
  CHECK(second.step() == 3);
  CHECK(same_bits(second.model().params().frozen_flat(), ref.model().params().frozen_flat()));
  for (int i = 3; i < 6; ++i) {
    const double got = second.train_step().loss;
    INFO("step " << i + 1);
    CHECK(got == want[static_cast<size_t>(i)]);
  }
  CHECK(same_bits(second.optimizer().shard_state().master, ref.optimizer().shard_state().master));
  CHECK(same_bits(second.optimizer().shard_state().exp_avg_sq, ref.optimizer().shard_state().exp_avg_sq));
  // The checkpoint holds the adapters only.
  const checkpoint::Metadata m = checkpoint::read_metadata(second.resumed_from());
  for (const auto& p : m.params) CHECK(layers::is_lora_param(p.name));
}

TEST_CASE("lora exports: the merged --export-hf gives the adapted model's logits; the PEFT folder's names, shapes, json") {
  const Config plain = tiny_run_config("llama");
  const std::string base = export_random_model(plain.model, "lora-export-base", "llama");
  const Config cfg = tiny_run_config("llama", plus(kLora, {"model.init_from=\"" + base + "\"", "run.name=\"export\"",
                                                           "run.output_dir=\"" + runs_dir() + "\"", "data.sequence_length=12"}));
  fs::remove_all(fs::path(runs_dir()) / "export");
  Trainer t(cfg, false);
  for (int i = 0; i < 4; ++i) t.train_step();  // B away from zero
  t.save_checkpoint();

  Sample s = make_sample({7, 5}, plain.model.vocab_size, "export");
  MicroBatch mb = make_micro_batch({&s}, 12, false, Device::CPU);
  Owned want = empty({mb.num_tokens, plain.model.vocab_size}, DType::F32, Device::CPU);
  t.model().logits(mb, want);

  const std::string merged = scratch_dir("lora-merged") + "/hf";
  checkpoint::export_hf_from_config(cfg, merged, {});
  CHECK_FALSE(fs::exists(merged + "/adapter_config.json"));
  const ModelConfig base_cfg = checkpoint::lora_base_config(cfg.model);
  auto m = make_model(base_cfg, Device::CPU, DType::F32);
  hf::HfWeights w(merged, base_cfg);  // a plain folder of the base model: no unexpected tensors
  checkpoint::fill_weights(m->params(), w.fetcher());
  Owned got = empty(want->shape, DType::F32, Device::CPU);
  m->logits(mb, got);
  CHECK_CLOSE(got, want, 1e-5);
  // The merge changed the adapted weights only.
  auto orig = random_model(plain.model, "llama");
  CHECK(same_bits(m->params().weight("final_norm.weight"), orig->params().weight("final_norm.weight")));
  CHECK(same_bits(m->params().weight("layers.0.mlp.w_up"), orig->params().weight("layers.0.mlp.w_up")) == false);
  CHECK_FALSE(same_bits(m->params().weight("layers.0.attn.wq"), orig->params().weight("layers.0.attn.wq")));

  const std::string peft = scratch_dir("lora-peft") + "/adapter";
  checkpoint::export_peft_from_config(cfg, peft);
  const nlohmann::json j = nlohmann::json::parse(read_text(peft + "/adapter_config.json"));
  CHECK(j["peft_type"] == "LORA");
  CHECK(j["task_type"] == "CAUSAL_LM");
  CHECK(j["r"] == 4);
  CHECK(j["lora_alpha"] == 8.0);
  CHECK(j["lora_dropout"] == 0.0);
  CHECK(j["bias"] == "none");
  CHECK(j["fan_in_fan_out"] == false);
  CHECK(j["base_model_name_or_path"] == base);
  CHECK(j["target_modules"] == nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  checkpoint::SafetensorsFile f(peft + "/adapter_model.safetensors");
  CHECK(f.tensors().size() == 2 * 7 * 2);
  const ParamStore& store = t.model().params();
  for (const checkpoint::StTensor& x : f.tensors()) {
    CAPTURE(x.name);
    CHECK(x.name.rfind("base_model.model.model.layers.", 0) == 0);
  }
  auto tensor = [&](const std::string& name) -> const checkpoint::StTensor& {
    for (const checkpoint::StTensor& x : f.tensors())
      if (x.name == name) return x;
    FAIL("no tensor " << name);
    return f.tensors()[0];
  };
  const std::pair<const char*, const char*> pairs[] = {
      {"base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", "layers.1.attn.wq.lora_a"},
      {"base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight", "layers.1.attn.wo.lora_b"},
      {"base_model.model.model.layers.0.mlp.down_proj.lora_A.weight", "layers.0.mlp.w_out.lora_a"},
      {"base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight", "layers.0.mlp.w_gate.lora_b"}};
  for (const auto& [hf_name, ours] : pairs) {
    CAPTURE(hf_name);
    const checkpoint::StTensor& x = tensor(hf_name);
    const Tensor wv = store.weight(ours);
    CHECK(x.shape == std::vector<int64_t>{wv.shape[0], wv.shape[1]});
    std::vector<float> v(static_cast<size_t>(x.numel));
    f.read_f32(x, 0, x.numel, v.data());
    CHECK(std::memcmp(v.data(), wv.data, v.size() * 4) == 0);
  }
  CHECK(tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").shape == std::vector<int64_t>{4, 24});
  CHECK(tensor("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight").shape == std::vector<int64_t>{40, 4});
  // Refused without LoRA.
  CHECK(error_of([&] { checkpoint::export_peft_from_config(plain, peft + "2"); }).find("lora.rank") != std::string::npos);
}
