#include "checkpoint/lora_export.h"

#include <filesystem>
#include <map>
#include <memory>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "core/log.h"
#include "layers/lora.h"

namespace engine::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

ModelConfig lora_base_config(const ModelConfig& c) {
  ModelConfig b = c;
  b.lora = {};
  return b;
}

namespace {

// "layers.3.attn.wq" -> its LoRA target, or nullptr.
const layers::LoraTarget* target_of(const ModelConfig& c, const std::string& name) {
  for (const layers::LoraTarget& t : layers::lora_targets()) {
    const std::string tail = std::string(".") + t.module + "." + t.weight;
    if (name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0 &&
        name.rfind("layers.", 0) == 0 && layers::lora_targets_weight(c, t.weight))
      return &t;
  }
  return nullptr;
}

std::vector<float> read_all(const Fetch& fetch, const ParamSpec& p) {
  std::vector<float> v(static_cast<size_t>(p.shape.numel()));
  fetch(p, 0, p.shape.numel(), v.data());
  return v;
}

}  // namespace

Fetch merged_fetch(const ModelConfig& c, const ParamTable& lora_table, const Fetch& fetch) {
  ENSURE(lora_table.tp_size() == 1, "merged_fetch takes a one-rank table");
  const auto table = std::make_shared<ParamTable>(lora_table);
  const double scale = c.lora.alpha / c.lora.rank;
  return [c, table, fetch, scale](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
    const ParamSpec& own = table->get(p.name);
    fetch(own, lo, hi, out);
    if (!target_of(c, p.name)) return;
    // W (out, in) += s B A: element e = (i, j) gets s sum_k B[i, k] A[k, j], summed in double.
    const ParamSpec& a = table->get(p.name + ".lora_a");
    const ParamSpec& b = table->get(p.name + ".lora_b");
    const std::vector<float> A = read_all(fetch, a), B = read_all(fetch, b);
    const int64_t r = a.shape[0], in = a.shape[1];
    for (int64_t e = lo; e < hi; ++e) {
      const int64_t i = e / in, j = e % in;
      double s = 0;
      for (int64_t k = 0; k < r; ++k)
        s += static_cast<double>(B[static_cast<size_t>(i * r + k)]) * A[static_cast<size_t>(k * in + j)];
      out[e - lo] = static_cast<float>(out[e - lo] + scale * s);
    }
  };
}

void export_peft(const ModelConfig& c, const ParamTable& lora_table, const Fetch& fetch, const std::string& out_dir) {
  ENSURE(c.lora.rank > 0, "--export-peft needs a LoRA run (lora.rank > 0)");
  ENSURE(c.family != ModelFamily::GPT2, "--export-peft: PEFT's names are written for the Llama-style families "
         "(model.family ", family_name(c.family), ")");
  json modules = json::array();
  for (const layers::LoraTarget& t : layers::lora_targets())
    if (layers::lora_targets_weight(c, t.weight)) modules.push_back(t.hf);
  const json config = {{"peft_type", "LORA"},
                       {"task_type", "CAUSAL_LM"},
                       {"r", c.lora.rank},
                       {"lora_alpha", c.lora.alpha},
                       {"lora_dropout", 0.0},
                       {"target_modules", modules},
                       {"bias", "none"},
                       {"fan_in_fan_out", false},
                       {"inference_mode", true},
                       {"base_model_name_or_path", c.init_from}};
  SafetensorsWriter w;
  w.set_metadata({{"format", "pt"}});
  int64_t tensors = 0;
  for (const ParamSpec& p : lora_table.entries()) {
    if (!layers::is_lora_param(p.name)) continue;
    // layers.{i}.attn.wq.lora_a -> base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight
    const std::string weight = p.name.substr(0, p.name.size() - 7);
    const layers::LoraTarget* t = target_of(c, weight);
    ENSURE(t, "LoRA parameter ", p.name, " of no target");
    const size_t dot = weight.find('.', 7);  // after "layers.{i}"
    const std::string layer = weight.substr(0, dot);
    const std::string module = std::string(t->module) == "attn" ? "self_attn" : "mlp";
    const std::string factor = p.name.back() == 'a' ? "lora_A" : "lora_B";
    const std::string name = "base_model.model.model." + layer + "." + module + "." + t->hf + "." + factor + ".weight";
    w.add(name, "F32", {p.shape[0], p.shape[1]}, [&fetch, &p](OutFile& f) {
      const std::vector<float> v = read_all(fetch, p);
      f.write(v.data(), v.size() * 4);
    });
    ++tensors;
  }
  const fs::path out = fs::path(out_dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && (fs::is_empty(out, ec) || fs::exists(out / "adapter_config.json", ec))))
    RAISE("--export-peft: ", out.string(), " exists and is not an adapter folder (no adapter_config.json): not "
          "overwriting it");
  const std::string tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  remove_tree(tmp);
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path(), ec);
  if (!fs::create_directory(tmp, ec) || ec) RAISE("--export-peft: cannot create ", tmp, ": ", ec.message());
  try {
    write_file((fs::path(tmp) / "adapter_config.json").string(), config.dump(2) + "\n");
    w.write((fs::path(tmp) / "adapter_model.safetensors").string());
    fsync_dir(tmp);
    if (fs::exists(out, ec)) remove_tree(out.string());
    rename_path(tmp, out.string());
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
  log_info("exported the LoRA adapter (r ", c.lora.rank, ", ", tensors, " tensors) to ", out.string());
}

}  // namespace engine::checkpoint
