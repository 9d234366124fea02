// Hugging Face tensors <-> parameters (hf.h): the name map, the exporter (config.json +
// safetensors, sharded above a size with an index) and the importer (HfWeights).
#include "checkpoint/hf.h"
#include "checkpoint/hf_mtp.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "models/model.h"

namespace engine::hf {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::string layer(int i) { return "layers." + std::to_string(i) + "."; }

// Rows and columns of a stacked parameter group (1-D parameters: columns = 1).
void stacked_shape(const ParamTable& t, const std::vector<std::string>& params, int64_t* rows, int64_t* cols) {
  *rows = 0;
  *cols = 1;
  for (const auto& n : params) {
    const ParamSpec& s = t.get(n);
    *rows += s.shape[0];
    *cols = s.shape.ndim == 2 ? s.shape[1] : 1;
  }
}

bool is_ignored_buffer(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

}  // namespace

std::vector<TensorMap> tensor_map(const ModelConfig& c) {
  architecture(c);  // representable?
  ParamTable t = model_param_table(c);
  std::vector<TensorMap> out;
  // Whole parameters, rows stacked; `shape` overrides the HF shape (same element count).
  auto add = [&](std::string hf, std::vector<std::string> params, bool transpose = false,
                 std::vector<int64_t> shape = {}) {
    int64_t rows = 0, cols = 1;
    stacked_shape(t, params, &rows, &cols);
    const bool matrix = t.get(params[0]).shape.ndim == 2;
    if (shape.empty())
      shape = !matrix ? std::vector<int64_t>{rows} : transpose ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
    out.push_back({std::move(hf), std::move(params), transpose, std::move(shape)});
  };
  // Block `index` of a parameter whose dim 0 counts blocks (an expert of an (E, ...) tensor).
  auto add_block = [&](std::string hf, const std::string& param, int64_t index) {
    const ParamSpec& s = t.get(param);
    std::vector<int64_t> shape;
    for (int d = 1; d < s.shape.ndim; ++d) shape.push_back(s.shape[d]);
    const int64_t n = s.shape.numel() / s.shape[0];
    out.push_back({std::move(hf), {param}, false, std::move(shape), index * n, n});
  };
  if (c.family == ModelFamily::GPT2) {
    const std::string p = "transformer.";
    add(p + "wte.weight", {"embed.tokens"});
    add(p + "wpe.weight", {"embed.positions"});
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string h = p + "h." + std::to_string(i) + ".", l = layer(i);
      add(h + "ln_1.weight", {l + "norm1.weight"});
      add(h + "ln_1.bias", {l + "norm1.bias"});
      add(h + "attn.c_attn.weight", {l + "attn.wq", l + "attn.wk", l + "attn.wv"}, true);
      add(h + "attn.c_attn.bias", {l + "attn.bq", l + "attn.bk", l + "attn.bv"});
      add(h + "attn.c_proj.weight", {l + "attn.wo"}, true);
      add(h + "attn.c_proj.bias", {l + "attn.bo"});
      add(h + "ln_2.weight", {l + "norm2.weight"});
      add(h + "ln_2.bias", {l + "norm2.bias"});
      add(h + "mlp.c_fc.weight", {l + "mlp.w_in"}, true);
      add(h + "mlp.c_fc.bias", {l + "mlp.b_in"});
      add(h + "mlp.c_proj.weight", {l + "mlp.w_out"}, true);
      add(h + "mlp.c_proj.bias", {l + "mlp.b_out"});
    }
    add(p + "ln_f.weight", {"final_norm.weight"});
    add(p + "ln_f.bias", {"final_norm.bias"});
  } else if (c.family == ModelFamily::Mamba) {
    const std::string p = "backbone.";
    add(p + "embeddings.weight", {"embed.tokens"});
    const int64_t Di = int64_t{c.mamba_expand} * c.hidden_size;
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string h = p + "layers." + std::to_string(i) + ".", l = layer(i), x = h + "mixer.", m = l + "mamba.";
      add(h + "norm.weight", {l + "norm1.weight"});
      add(x + "in_proj.weight", {m + "in_proj_x", m + "in_proj_z"});
      if (c.mamba_proj_bias) add(x + "in_proj.bias", {m + "in_proj_x_bias", m + "in_proj_z_bias"});
      add(x + "conv1d.weight", {m + "conv_weight"}, false, {Di, 1, c.mamba_d_conv});
      if (c.mamba_conv_bias) add(x + "conv1d.bias", {m + "conv_bias"});
      add(x + "x_proj.weight", {m + "x_proj"});
      add(x + "dt_proj.weight", {m + "dt_proj"});
      add(x + "dt_proj.bias", {m + "dt_bias"});
      add(x + "A_log", {m + "A_log"});
      add(x + "D", {m + "D"});
      add(x + "out_proj.weight", {m + "out_proj"});
      if (c.mamba_proj_bias) add(x + "out_proj.bias", {m + "out_proj_bias"});
    }
    add(p + "norm_f.weight", {"final_norm.weight"});
  } else if (c.family == ModelFamily::Mamba2) {
    const std::string p = "backbone.";
    add(p + "embeddings.weight", {"embed.tokens"});
    const int64_t conv_dim = int64_t{c.mamba_expand} * c.hidden_size + 2 * int64_t{c.mamba_n_groups} * c.mamba_d_state;
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string h = p + "layers." + std::to_string(i) + ".", l = layer(i), x = h + "mixer.", m = l + "mamba2.";
      auto parts = [&](const char* stem, std::initializer_list<const char*> names, const char* suffix) {
        std::vector<std::string> out;
        for (const char* n : names) out.push_back(m + stem + n + suffix);
        return out;
      };
      add(h + "norm.weight", {l + "norm1.weight"});
      add(x + "in_proj.weight", parts("in_proj_", {"z", "x", "B", "C", "dt"}, ""));
      if (c.mamba_proj_bias) add(x + "in_proj.bias", parts("in_proj_", {"z", "x", "B", "C", "dt"}, "_bias"));
      add(x + "conv1d.weight", parts("conv_", {"x", "B", "C"}, ""), false, {conv_dim, 1, c.mamba_d_conv});
      if (c.mamba_conv_bias) add(x + "conv1d.bias", parts("conv_", {"x", "B", "C"}, "_bias"));
      add(x + "dt_bias", {m + "dt_bias"});
      add(x + "A_log", {m + "A_log"});
      add(x + "D", {m + "D"});
      add(x + "norm.weight", {m + "norm"});
      add(x + "out_proj.weight", {m + "out_proj"});
      if (c.mamba_proj_bias) add(x + "out_proj.bias", {m + "out_proj_bias"});
    }
    add(p + "norm_f.weight", {"final_norm.weight"});
  } else {
    const bool moe = c.family == ModelFamily::Mixtral;
    add("model.embed_tokens.weight", {"embed.tokens"});
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string h = "model.layers." + std::to_string(i) + ".", l = layer(i);
      add(h + "input_layernorm.weight", {l + "norm1.weight"});
      for (const char* x : {"q", "k", "v", "o"}) {
        add(h + "self_attn." + x + "_proj.weight", {l + "attn.w" + x});
        const bool biased = std::string(x) == "o" ? c.bias : (c.bias || c.qkv_bias);
        if (biased) add(h + "self_attn." + x + "_proj.bias", {l + "attn.b" + x});
      }
      if (c.qk_norm) {
        add(h + "self_attn.q_norm.weight", {l + "attn.q_norm"});
        add(h + "self_attn.k_norm.weight", {l + "attn.k_norm"});
      }
      add(h + "post_attention_layernorm.weight", {l + "norm2.weight"});
      const bool qwen_moe = c.family == ModelFamily::Qwen2Moe || c.family == ModelFamily::Qwen3Moe;
      if (qwen_moe && block_letter(c, i) == 'E') {
        const std::string b = h + "mlp.";
        add(b + "gate.weight", {l + "moe.router"});
        for (int j = 0; j < c.num_experts; ++j) {
          const std::string e = b + "experts." + std::to_string(j) + ".";
          add_block(e + "gate_proj.weight", l + "moe.w_gate", j);
          add_block(e + "up_proj.weight", l + "moe.w_up", j);
          add_block(e + "down_proj.weight", l + "moe.w_out", j);
        }
        if (c.moe_shared_expert_ffn_size > 0) {  // qwen2_moe (qwen3_moe refuses one, hf_config.cpp)
          add(b + "shared_expert.gate_proj.weight", {l + "moe.shared.w_gate"});
          add(b + "shared_expert.up_proj.weight", {l + "moe.shared.w_up"});
          add(b + "shared_expert.down_proj.weight", {l + "moe.shared.w_out"});
          add(b + "shared_expert_gate.weight", {l + "moe.shared_gate"});
        }
        continue;
      }
      if (moe) {
        const std::string b = h + "block_sparse_moe.";
        add(b + "gate.weight", {l + "moe.router"});
        for (int j = 0; j < c.num_experts; ++j) {
          const std::string e = b + "experts." + std::to_string(j) + ".";
          add_block(e + "w1.weight", l + "moe.w_gate", j);
          add_block(e + "w2.weight", l + "moe.w_out", j);
          add_block(e + "w3.weight", l + "moe.w_up", j);
        }
        continue;
      }
      add(h + "mlp.gate_proj.weight", {l + "mlp.w_gate"});
      add(h + "mlp.up_proj.weight", {l + "mlp.w_up"});
      add(h + "mlp.down_proj.weight", {l + "mlp.w_out"});
      if (c.bias) {
        add(h + "mlp.gate_proj.bias", {l + "mlp.b_gate"});
        add(h + "mlp.up_proj.bias", {l + "mlp.b_up"});
        add(h + "mlp.down_proj.bias", {l + "mlp.b_out"});
      }
    }
    add("model.norm.weight", {"final_norm.weight"});
    if (c.prediction_heads > 0) mtp_tensor_map(c, out);  // Fast-LLM's MTP Llama (hf_mtp.h)
  }
  if (!c.tie_embeddings) add("lm_head.weight", {"head.weight"});
  // Every parameter appears exactly once: in one whole entry, or in parts that tile it; and each
  // HF shape holds the elements it maps.
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> parts;  // param -> [begin, end)
  std::set<std::string> whole;
  for (const TensorMap& m : out) {
    int64_t n = 1, mapped = 0;
    for (int64_t d : m.hf_shape) n *= d;
    if (m.part_count > 0) {
      ENSURE(m.params.size() == 1 && !m.transpose, m.hf_name, ": a part maps one parameter, untransposed");
      parts[m.params[0]].push_back({m.part_begin, m.part_begin + m.part_count});
      mapped = m.part_count;
    } else {
      for (const auto& p : m.params) {
        ENSURE(whole.insert(p).second, "parameter ", p, " mapped twice");
        mapped += t.get(p).shape.numel();
      }
    }
    ENSURE(n == mapped, m.hf_name, ": Hugging Face shape of ", n, " elements for ", mapped, " mapped");
  }
  for (auto& [p, ranges] : parts) {
    ENSURE(!whole.count(p), "parameter ", p, " mapped twice (whole and in parts)");
    std::sort(ranges.begin(), ranges.end());
    int64_t at = 0;
    for (const auto& [b, e] : ranges) {
      ENSURE(b == at, "parameter ", p, ": its parts do not tile it (a part starts at ", b, ", expected ", at, ")");
      at = e;
    }
    ENSURE(at == t.get(p).shape.numel(), "parameter ", p, ": its parts cover ", at, " of ", t.get(p).shape.numel(),
           " elements");
  }
  const size_t covered = whole.size() + parts.size();
  ENSURE(covered == t.entries().size(), "the Hugging Face map covers ", covered, " of ", t.entries().size(),
         " parameters");
  return out;
}

namespace {

// The values of one mapped tensor in Hugging Face's layout, as f32.
std::vector<float> gather(const ParamTable& t, const TensorMap& m, const checkpoint::Fetch& fetch) {
  if (m.part_count > 0) {
    std::vector<float> part(static_cast<size_t>(m.part_count));
    fetch(t.get(m.params[0]), m.part_begin, m.part_begin + m.part_count, part.data());
    return part;
  }
  int64_t rows = 0, cols = 1;
  stacked_shape(t, m.params, &rows, &cols);
  std::vector<float> ours(static_cast<size_t>(rows * cols));
  int64_t at = 0;
  for (const auto& n : m.params) {
    const ParamSpec& s = t.get(n);
    fetch(s, 0, s.shape.numel(), ours.data() + at);
    at += s.shape.numel();
  }
  if (!m.transpose) return ours;
  std::vector<float> tr(ours.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) tr[static_cast<size_t>(c * rows + r)] = ours[static_cast<size_t>(r * cols + c)];
  return tr;
}

}  // namespace

void export_hf(const ModelConfig& c, const ParamTable& table, const checkpoint::Fetch& fetch,
               const std::string& out_dir, const ExportOptions& o) {
  ENSURE(o.dtype == "F32" || o.dtype == "BF16", "export dtype must be F32 or BF16, got ", o.dtype);
  const std::vector<TensorMap> maps = tensor_map(c);
  const std::string config_text = hf_config_json(c, o.dtype);
  const size_t esize = o.dtype == "F32" ? 4 : 2;

  // Shards: tensors in order, a new file when the next tensor would overflow a non-empty one.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  int64_t parameters = 0;
  for (size_t i = 0; i < maps.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : maps[i].hf_shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * esize;
    if (!shards.back().empty() && in_shard + bytes > o.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
    parameters += n;
  }
  const size_t count = shards.size();
  auto file_name = [&](size_t k) {
    if (count == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, count);
    return std::string(buf);
  };

  const fs::path out = fs::path(out_dir).lexically_normal();
  const std::string tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  if (fs::exists(out, ec)) {
    const bool empty = fs::is_directory(out, ec) && fs::is_empty(out, ec);
    if (!empty && !fs::exists(out / "config.json", ec))
      RAISE("export: ", out.string(), " exists and is not a Hugging Face folder (no config.json): not overwriting it");
  }
  checkpoint::remove_tree(tmp);
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path(), ec);
  if (!fs::create_directory(tmp, ec) || ec) RAISE("export: cannot create ", tmp, ": ", ec.message());
  try {
    checkpoint::write_file((fs::path(tmp) / "config.json").string(), config_text);
    json weight_map = json::object();
    for (size_t k = 0; k < count; ++k) {
      checkpoint::SafetensorsWriter w;
      w.set_metadata({{"format", "pt"}});
      for (size_t i : shards[k]) {
        const TensorMap& m = maps[i];
        weight_map[m.hf_name] = file_name(k);
        w.add(m.hf_name, o.dtype, m.hf_shape, [&table, &m, &fetch, &o](checkpoint::OutFile& f) {
          const std::vector<float> v = gather(table, m, fetch);
          std::vector<unsigned char> bytes;
          checkpoint::encode_f32(v.data(), static_cast<int64_t>(v.size()), o.dtype, &bytes);
          f.write(bytes.data(), bytes.size());
        });
      }
      w.write((fs::path(tmp) / file_name(k)).string());
    }
    if (count > 1) {
      json index = {{"metadata", {{"total_size", total}, {"total_parameters", parameters}}},
                    {"weight_map", weight_map}};
      checkpoint::write_file((fs::path(tmp) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    }
    checkpoint::fsync_dir(tmp);
    std::string aside;
    if (fs::exists(out, ec)) {
      aside = out.string() + ".old-" + std::to_string(::getpid());
      checkpoint::rename_path(out.string(), aside);
    }
    checkpoint::rename_path(tmp, out.string());
    if (!aside.empty()) checkpoint::remove_tree(aside);
    checkpoint::fsync_dir(out.parent_path().empty() ? "." : out.parent_path().string());
  } catch (...) {
    checkpoint::remove_tree(tmp);
    throw;
  }
  log_info("exported ", architecture(c), " (", parameters, " parameters, ", o.dtype, ") to ", out.string(), " in ",
           count, " file(s)");
}

struct HfWeights::Impl {
  ModelConfig config;
  ParamTable table;
  std::vector<TensorMap> maps;
  std::map<std::string, std::vector<size_t>> maps_of_param;  // parameter -> indices in maps (parts: in order)
  std::vector<std::unique_ptr<checkpoint::SafetensorsFile>> files;
  std::map<std::string, std::pair<size_t, const checkpoint::StTensor*>> tensors;  // hf name -> (file, tensor)
  std::string cached;                                                             // transposed tensor in cache
  std::vector<float> cache;
};

HfWeights::HfWeights(const std::string& dir, const ModelConfig& c) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = c;
  s.config.lora = {};  // the folder holds the base model (LoRA's factors are not in it)
  s.table = model_param_table(s.config);
  s.maps = tensor_map(s.config);
  for (size_t i = 0; i < s.maps.size(); ++i)
    for (const auto& p : s.maps[i].params) s.maps_of_param[p].push_back(i);
  const fs::path d(dir);
  std::error_code ec;
  std::vector<std::string> names;
  if (fs::exists(d / "model.safetensors.index.json", ec)) {
    const std::string path = (d / "model.safetensors.index.json").string();
    json index;
    try {
      index = json::parse(checkpoint::read_small_file(path, uint64_t{256} << 20));
    } catch (const json::exception& e) {
      RAISE(path, ": not valid JSON: ", e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      RAISE(path, ": no weight_map object");
    std::set<std::string> files;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) RAISE(path, ": weight_map[\"", it.key(), "\"] is not a file name");
      const std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos) RAISE(path, ": weight_map[\"", it.key(), "\"]: ", f, " is not a plain file name");
      files.insert(f);
    }
    names.assign(files.begin(), files.end());
  } else if (fs::exists(d / "model.safetensors", ec)) {
    names.push_back("model.safetensors");
  } else {
    RAISE(dir, ": no model.safetensors or model.safetensors.index.json");
  }
  // GPT-2 saved from GPT2Model has no "transformer." prefix: accept both.
  const bool gpt2 = c.family == ModelFamily::GPT2;
  for (const auto& n : names) {
    s.files.push_back(std::make_unique<checkpoint::SafetensorsFile>((d / n).string()));
    const auto& f = *s.files.back();
    for (const checkpoint::StTensor& t : f.tensors()) {
      std::string name = t.name;
      if (gpt2 && name.rfind("transformer.", 0) != 0 && name != "lm_head.weight") name = "transformer." + name;
      if (!s.tensors.emplace(name, std::make_pair(s.files.size() - 1, &t)).second)
        RAISE(f.path(), ": tensor '", t.name, "' is also in another file of ", dir);
    }
  }
  std::set<std::string> expected;
  for (const TensorMap& m : s.maps) {
    expected.insert(m.hf_name);
    auto it = s.tensors.find(m.hf_name);
    if (it == s.tensors.end())
      RAISE(dir, ": tensor '", m.hf_name, "' is missing (expected by config.json's ", family_name(c.family), " model)");
    const auto& [fi, t] = it->second;
    if (t->shape != m.hf_shape) {
      std::string got, want;
      for (int64_t x : t->shape) got += (got.empty() ? "" : ", ") + std::to_string(x);
      for (int64_t x : m.hf_shape) want += (want.empty() ? "" : ", ") + std::to_string(x);
      RAISE(s.files[fi]->path(), ": tensor '", t->name, "' has shape (", got, "), the config needs (", want, ")");
    }
    if (t->dtype != "F32" && t->dtype != "BF16" && t->dtype != "F16" && t->dtype != "F64")
      RAISE(s.files[fi]->path(), ": tensor '", t->name, "' has dtype ", t->dtype, " (F32, BF16, F16 or F64 expected)");
  }
  for (const auto& [name, where] : s.tensors) {
    if (expected.count(name) || is_ignored_buffer(name)) continue;
    if (name == "lm_head.weight" && c.tie_embeddings) continue;  // a tied copy some writers keep
    RAISE(s.files[where.first]->path(), ": unexpected tensor '", where.second->name, "' for a ",
          family_name(c.family), " model with this config.json");
  }
}

HfWeights::~HfWeights() = default;

void HfWeights::fetch(const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
  read(p, lo, hi, out);
  for (int64_t e = lo; e < hi; ++e) {
    if (std::isfinite(out[e - lo])) continue;
    // The tensor that holds element e: the parameter's own, or the part (expert) covering e.
    const Impl& s = *impl_;
    const std::vector<size_t>& in = s.maps_of_param.at(p.name);
    const TensorMap* m = &s.maps[in[0]];
    for (size_t i : in)
      if (s.maps[i].part_count > 0 && e >= s.maps[i].part_begin && e < s.maps[i].part_begin + s.maps[i].part_count)
        m = &s.maps[i];
    const auto& [fi, t] = s.tensors.at(m->hf_name);
    checkpoint::require_finite(out + (e - lo), 1, e, p.name, str_cat(s.files[fi]->path(), ": tensor '", t->name, "'"));
  }
}

void HfWeights::read(const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
  Impl& s = *impl_;
  const std::vector<size_t>& in = s.maps_of_param.at(p.name);
  if (s.maps[in[0]].part_count > 0) {  // parts of the parameter: read where they overlap [lo, hi)
    for (size_t i : in) {
      const TensorMap& m = s.maps[i];
      const int64_t b = std::max(lo, m.part_begin), e = std::min(hi, m.part_begin + m.part_count);
      if (b >= e) continue;
      const auto& [fi, t] = s.tensors.at(m.hf_name);
      s.files[fi]->read_f32(*t, b - m.part_begin, e - m.part_begin, out + (b - lo));
    }
    return;
  }
  const TensorMap& m = s.maps[in[0]];
  const auto& [fi, t] = s.tensors.at(m.hf_name);
  const checkpoint::SafetensorsFile& f = *s.files[fi];
  // Where the parameter's rows start in the stacked tensor.
  int64_t row0 = 0, cols = 1, rows = 0;
  for (const auto& n : m.params) {
    if (n == p.name) break;
    row0 += s.table.get(n).shape[0];
  }
  stacked_shape(s.table, m.params, &rows, &cols);
  if (!m.transpose) {
    f.read_f32(*t, row0 * cols + lo, row0 * cols + hi, out);
    return;
  }
  if (s.cached != m.hf_name) {  // HF (cols, rows): read once, serve every parameter of it
    s.cache.resize(static_cast<size_t>(t->numel));
    f.read_f32(*t, 0, t->numel, s.cache.data());
    s.cached = m.hf_name;
  }
  for (int64_t e = lo; e < hi; ++e) {
    const int64_t r = row0 + e / cols, col = e % cols;  // our element (r, col) = HF (col, r)
    out[e - lo] = s.cache[static_cast<size_t>(col * rows + r)];
  }
}

}  // namespace engine::hf
