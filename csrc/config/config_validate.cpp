// The config's semantics after parsing: family presets, defaults and derived values, and range
// and consistency checks (the key schema and its suggestions: config_schema.cpp). No TOML here:
// the parser (config.cpp) records in Config::origin which keys were set, and everything below
// reads that to tell "set by the user" from "take the default".
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "checkpoint/hf.h"
#include "config/config.h"
#include "config/config_fields.h"
#include "core/check.h"
#include "ops/mamba.h"
#include "ops/moe.h"

namespace engine {

std::string Config::where(const std::string& key) const {
  auto it = origin.find(key);
  // A key that was not set is reported at its table's header ([model.rope_scaling], else
  // [model]), when the file has one.
  for (size_t dot = key.rfind('.'); it == origin.end() && dot != std::string::npos && dot > 0;
       dot = key.rfind('.', dot - 1))
    it = origin.find(key.substr(0, dot));
  std::string loc = it != origin.end() ? it->second : (source.empty() ? "<config>" : source);
  return loc + ": " + key + ": ";
}

std::set<int> parse_step_list(const std::string& text) {
  std::set<int> steps;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    int a = 0, b = 0;
    char extra = 0;
    const int n = std::sscanf(item.c_str(), "%d-%d%c", &a, &b, &extra);
    if (n == 1 && item.find('-') == std::string::npos) b = a;
    if (!(n == 1 || n == 2) || a < 1 || b < a || b - a > 1000000)
      RAISE("expected step numbers >= 1 or ranges a-b separated by commas (e.g. \"1,5,10-12\"), got \"", text,
            "\" (at \"", item, "\")");
    for (int s = a; s <= b; ++s) steps.insert(s);
    at = comma + 1;
  }
  return steps;
}

bool Config::operator==(const Config& o) const {
  return run == o.run && model == o.model && data == o.data && batch == o.batch &&
         optimizer == o.optimizer && training == o.training && distributed == o.distributed &&
         distillation == o.distillation;
}

const char* family_name(ModelFamily f) {
  return config_detail::enum_name(f, config_detail::names_of(config_detail::kFamilyNames));
}

namespace config_detail {
namespace {

// The checks, each reporting at the key it names.
struct Checker {
  Config& c;

  bool set(const char* key) const { return c.origin.count(key) != 0; }

  // A required size: must be set and > 0.
  void required_positive(const char* key, int v) const {
    if (!set(key)) RAISE(c.where(key), "required, not set");
    if (v <= 0) RAISE(c.where(key), "must be > 0, got ", v);
  }
  void positive(const char* key, double v) const {
    if (!(v > 0)) RAISE(c.where(key), "must be > 0, got ", v);
  }
  void non_negative(const char* key, double v) const {
    if (v < 0) RAISE(c.where(key), "must be >= 0, got ", v);
  }
  void at_least(const char* key, int v, int lo) const {
    if (v < lo) RAISE(c.where(key), "must be >= ", lo, ", got ", v);
  }
  void unit_interval(const char* key, double v) const {  // [0, 1)
    if (!(v >= 0 && v < 1)) RAISE(c.where(key), "must be in [0, 1), got ", v);
  }
  void non_empty(const char* key, const std::string& v) const {
    if (v.empty()) RAISE(c.where(key), "must not be empty");
  }
  // Stores a default computed in 64 bits, checking that it fits an int.
  int fits(const char* key, int64_t v, const char* what) const {
    if (v > INT_MAX) RAISE(c.where(key), what, " = ", v, " overflows a 32-bit int");
    return static_cast<int>(v);
  }

  void run() const {
    non_empty("run.name", c.run.name);
    non_empty("run.output_dir", c.run.output_dir);
    at_least("run.log_every", c.run.log_every, 1);
    at_least("run.debug_level", c.run.debug_level, 0);
    try {
      parse_step_list(c.run.debug_steps);
    } catch (const std::exception& e) {
      RAISE(c.where("run.debug_steps"), e.what());
    }
  }

  // A path set in the file is relative to the file's folder (like data paths); one from the
  // command line to the working directory. Made absolute so the effective config reloads.
  void resolve_path(const char* key, std::string& path) const {
    namespace fs = std::filesystem;
    if (path.empty() || fs::path(path).is_absolute() || !set(key)) return;
    const auto it = c.origin.find(key);
    const bool cli = it->second == "<command line>";
    const fs::path base = cli ? fs::current_path() : fs::path(c.source).parent_path();
    if (base.empty()) return;  // parsed from text without a folder: left as given
    path = (fs::absolute(base) / path).lexically_normal().string();
  }

  void family_presets() const {
    ModelConfig& m = c.model;
    const bool gpt2 = m.family == ModelFamily::GPT2;
    if (!set("model.norm")) m.norm = gpt2 ? NormKind::LayerNorm : NormKind::RMSNorm;
    if (!set("model.activation"))
      m.activation = gpt2 ? ActivationKind::GELU : ActivationKind::SwiGLU;
    if (!set("model.positions")) m.positions = gpt2 ? PositionKind::Learned : PositionKind::Rope;
    if (!set("model.bias")) m.bias = gpt2;
    if (!set("model.tie_embeddings")) m.tie_embeddings = gpt2;
    const bool qwen2 = m.family == ModelFamily::Qwen2 || m.family == ModelFamily::Qwen2Moe;
    if (!set("model.qkv_bias")) m.qkv_bias = qwen2;
    const bool qwen3 = m.family == ModelFamily::Qwen3 || m.family == ModelFamily::Qwen3Moe;
    if (!set("model.qk_norm")) m.qk_norm = qwen3;
    if (!set("model.norm_eps")) m.norm_eps = qwen2 || qwen3 ? 1e-6 : 1e-5;
    if (!set("model.rope_theta") && qwen3) m.rope_theta = 1e6;
    if (!set("model.sliding_window") && m.family == ModelFamily::Mistral) m.sliding_window = 4096;
    if (!set("model.rope_theta") && m.family == ModelFamily::Mixtral) m.rope_theta = 1e6;
    if (!set("model.tie_embeddings") && m.family == ModelFamily::Mamba) m.tie_embeddings = true;
    if (!set("model.mamba_d_state") && m.family == ModelFamily::Mamba2) m.mamba_d_state = 128;
  }

  // The per-layer block kinds and the keys of the kinds present (after family_presets).
  void blocks() const {
    ModelConfig& m = c.model;
    if (m.family == ModelFamily::Hybrid || (takes_hybrid_layout(m.family) && !m.hybrid_layout.empty())) {
      if (!set("model.hybrid_layout"))
        RAISE(c.where("model.family"), "hybrid needs model.hybrid_layout (one letter per layer: A attention + MLP, "
                                       "E attention + mixture of experts, M Mamba, S Mamba-2, G Gated DeltaNet + MLP)");
      if (m.hybrid_layout.size() != static_cast<size_t>(m.num_layers))
        RAISE(c.where("model.hybrid_layout"), "has ", m.hybrid_layout.size(), " letters but model.num_layers is ",
              m.num_layers, " (one letter per layer)");
      if (const std::string e = layout_letters_error(m); !e.empty()) RAISE(c.where("model.hybrid_layout"), e);
    } else if (!m.hybrid_layout.empty()) {
      RAISE(c.where("model.hybrid_layout"), "only with model.family hybrid, qwen2_moe or qwen3_moe (",
            family_name(m.family), " has a fixed layout)");
    }
    const bool moe = has_block_kind(m, "E"), mamba = has_block_kind(m, "M"), mamba2 = has_block_kind(m, "S");
    const bool gdn = has_block_kind(m, "G");
    // Keys of a block kind the model lacks: the effective config writes their defaults, so only
    // other values are an error.
    const ModelConfig d;
    auto unused_keys = [&](std::initializer_list<std::pair<const char*, bool>> keys, const char* kind) {
      for (const auto& [key, changed] : keys)
        if (changed) RAISE(c.where(key), "set, but the model has no ", kind, " blocks");
    };
    if (moe) {
      if (m.family == ModelFamily::Qwen2Moe) {  // Qwen2MoeConfig's defaults
        if (!set("model.num_experts")) m.num_experts = 60;
        if (!set("model.experts_per_token")) m.experts_per_token = 4;
        if (!set("model.moe_norm_topk_prob")) m.moe_norm_topk_prob = false;
      } else if (m.family == ModelFamily::Qwen3Moe) {  // Qwen3MoeConfig's 128 experts, top 8
        if (!set("model.num_experts")) m.num_experts = 128;
        if (!set("model.experts_per_token")) m.experts_per_token = 8;
      } else if (!set("model.num_experts")) {
        m.num_experts = 8;
      }
      positive("model.num_experts", m.num_experts);
      positive("model.experts_per_token", m.experts_per_token);
      if (m.experts_per_token > m.num_experts)
        RAISE(c.where("model.experts_per_token"), "must be at most model.num_experts (", m.num_experts, "), got ",
              m.experts_per_token);
      // The routing kernels' limits.
      if (m.experts_per_token > ops::kMoeMaxTopK)
        RAISE(c.where("model.experts_per_token"), "must be at most ", ops::kMoeMaxTopK, ", got ", m.experts_per_token);
      if (m.num_experts > ops::kMoeMaxExperts)
        RAISE(c.where("model.num_experts"), "must be at most ", ops::kMoeMaxExperts, ", got ", m.num_experts);
      non_negative("model.moe_aux_loss_coef", m.moe_aux_loss_coef);
      non_negative("model.moe_z_loss_coef", m.moe_z_loss_coef);
      if (!(m.moe_jitter >= 0 && m.moe_jitter < 1))
        RAISE(c.where("model.moe_jitter"), "must be in [0, 1), got ", m.moe_jitter);
      if (set("model.moe_ffn_hidden_size")) positive("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size);
      non_negative("model.moe_shared_expert_ffn_size", m.moe_shared_expert_ffn_size);
    } else {
      unused_keys({{"model.num_experts", m.num_experts != d.num_experts},
                   {"model.experts_per_token", m.experts_per_token != d.experts_per_token},
                   {"model.moe_aux_loss_coef", m.moe_aux_loss_coef != d.moe_aux_loss_coef},
                   {"model.moe_z_loss_coef", m.moe_z_loss_coef != d.moe_z_loss_coef},
                   {"model.moe_jitter", m.moe_jitter != d.moe_jitter},
                   {"model.moe_ffn_hidden_size", m.moe_ffn_hidden_size != d.moe_ffn_hidden_size},
                   {"model.moe_shared_expert_ffn_size", m.moe_shared_expert_ffn_size != d.moe_shared_expert_ffn_size},
                   {"model.moe_norm_topk_prob", m.moe_norm_topk_prob != d.moe_norm_topk_prob}},
                  "mixture-of-experts (E)");
    }
    if (mamba || mamba2) {  // the keys both mixers take
      positive("model.mamba_d_state", m.mamba_d_state);
      positive("model.mamba_d_conv", m.mamba_d_conv);
      // The CUDA conv kernel keeps a channel's taps in registers.
      if (m.mamba_d_conv > ops::kMambaMaxConv)
        RAISE(c.where("model.mamba_d_conv"), "must be at most ", ops::kMambaMaxConv, ", got ", m.mamba_d_conv);
      positive("model.mamba_expand", m.mamba_expand);
    } else {
      unused_keys({{"model.mamba_d_state", m.mamba_d_state != d.mamba_d_state},
                   {"model.mamba_d_conv", m.mamba_d_conv != d.mamba_d_conv},
                   {"model.mamba_expand", m.mamba_expand != d.mamba_expand},
                   {"model.mamba_conv_bias", m.mamba_conv_bias != d.mamba_conv_bias},
                   {"model.mamba_proj_bias", m.mamba_proj_bias != d.mamba_proj_bias}},
                  "Mamba (M) or Mamba-2 (S)");
    }
    if (mamba) {
      // The CUDA scan keeps a channel's states in registers.
      if (m.mamba_d_state > ops::kMambaMaxState)
        RAISE(c.where("model.mamba_d_state"), "must be at most ", ops::kMambaMaxState, " with Mamba (M) blocks, got ",
              m.mamba_d_state);
      if (set("model.mamba_dt_rank")) positive("model.mamba_dt_rank", m.mamba_dt_rank);
      else m.mamba_dt_rank = static_cast<int>((int64_t{m.hidden_size} + 15) / 16);
    } else {
      unused_keys({{"model.mamba_dt_rank", m.mamba_dt_rank != d.mamba_dt_rank}}, "Mamba (M)");
    }
    if (mamba2) {
      positive("model.mamba_head_dim", m.mamba_head_dim);
      positive("model.mamba_n_groups", m.mamba_n_groups);
      const int64_t inner = int64_t{m.mamba_expand} * m.hidden_size;
      if (inner % m.mamba_head_dim != 0)
        RAISE(c.where("model.mamba_head_dim"), "must divide mamba_expand x hidden_size (", inner, "), got ",
              m.mamba_head_dim);
      const int64_t heads = inner / m.mamba_head_dim;
      if (heads % m.mamba_n_groups != 0)
        RAISE(c.where("model.mamba_n_groups"), "must divide the Mamba-2 heads (mamba_expand x hidden_size / "
              "mamba_head_dim = ", heads, "), got ", m.mamba_n_groups);
      non_negative("model.mamba_dt_limit_min", m.mamba_dt_limit_min);
      non_negative("model.mamba_dt_limit_max", m.mamba_dt_limit_max);
      if (m.mamba_dt_limit_max > 0 && m.mamba_dt_limit_max < m.mamba_dt_limit_min)
        RAISE(c.where("model.mamba_dt_limit_max"), "must be 0 (no limit) or at least mamba_dt_limit_min (",
              m.mamba_dt_limit_min, "), got ", m.mamba_dt_limit_max);
    } else {
      unused_keys({{"model.mamba_head_dim", m.mamba_head_dim != d.mamba_head_dim},
                   {"model.mamba_n_groups", m.mamba_n_groups != d.mamba_n_groups},
                   {"model.mamba_dt_limit_min", m.mamba_dt_limit_min != d.mamba_dt_limit_min},
                   {"model.mamba_dt_limit_max", m.mamba_dt_limit_max != d.mamba_dt_limit_max},
                   {"model.mamba_norm_per_group", m.mamba_norm_per_group != d.mamba_norm_per_group}},
                  "Mamba-2 (S)");
    }
    if (gdn) {
      positive("model.gdn_num_key_heads", m.gdn_num_key_heads);
      positive("model.gdn_num_value_heads", m.gdn_num_value_heads);
      positive("model.gdn_key_head_dim", m.gdn_key_head_dim);
      positive("model.gdn_value_head_dim", m.gdn_value_head_dim);
      positive("model.gdn_conv_kernel", m.gdn_conv_kernel);
      if (m.gdn_num_value_heads % m.gdn_num_key_heads != 0)
        RAISE(c.where("model.gdn_num_value_heads"), "must be a multiple of model.gdn_num_key_heads (",
              m.gdn_num_key_heads, "), got ", m.gdn_num_value_heads);
      if (m.gdn_conv_kernel > ops::kMambaMaxConv)  // the CUDA conv kernel keeps a channel's taps in registers
        RAISE(c.where("model.gdn_conv_kernel"), "must be at most ", ops::kMambaMaxConv, ", got ", m.gdn_conv_kernel);
    } else {
      unused_keys({{"model.gdn_num_key_heads", m.gdn_num_key_heads != d.gdn_num_key_heads},
                   {"model.gdn_num_value_heads", m.gdn_num_value_heads != d.gdn_num_value_heads},
                   {"model.gdn_key_head_dim", m.gdn_key_head_dim != d.gdn_key_head_dim},
                   {"model.gdn_value_head_dim", m.gdn_value_head_dim != d.gdn_value_head_dim},
                   {"model.gdn_conv_kernel", m.gdn_conv_kernel != d.gdn_conv_kernel}},
                  "Gated DeltaNet (G)");
    }
  }

  void model() const {
    ModelConfig& m = c.model;
    if (!m.init_from.empty()) {
      resolve_path("model.init_from", m.init_from);
      hf::apply_hf_config(c);  // fills the unset [model] keys from config.json, checks the set ones
    }
    non_negative("model.z_loss", m.z_loss);
    unit_interval("model.label_smoothing", m.label_smoothing);
    required_positive("model.vocab_size", m.vocab_size);
    required_positive("model.hidden_size", m.hidden_size);
    required_positive("model.num_layers", m.num_layers);
    family_presets();
    blocks();
    const bool attention = has_block_kind(m, "AE");
    if (!attention && !set("model.num_heads")) {  // no attention: the attention keys do not matter
      if (m.num_heads <= 0) m.num_heads = 1;      // (the effective config writes this 1 back)
      if (!set("model.head_dim")) m.head_dim = m.hidden_size;
    }
    if (attention) required_positive("model.num_heads", m.num_heads);
    if (m.qk_norm && !attention) RAISE(c.where("model.qk_norm"), "set, but the model has no attention blocks");
    positive("model.num_heads", m.num_heads);

    if (set("model.num_kv_heads")) {
      positive("model.num_kv_heads", m.num_kv_heads);
      if (m.num_heads % m.num_kv_heads != 0)
        RAISE(c.where("model.num_kv_heads"), "must divide num_heads (", m.num_heads, "), got ",
              m.num_kv_heads);
    } else {
      m.num_kv_heads = m.num_heads;
    }
    if (set("model.head_dim")) {
      positive("model.head_dim", m.head_dim);
    } else {
      if (m.hidden_size % m.num_heads != 0)
        RAISE(c.where("model.num_heads"), "must divide hidden_size (", m.hidden_size,
              ") unless model.head_dim is set, got ", m.num_heads);
      m.head_dim = m.hidden_size / m.num_heads;
    }
    if (attention && m.positions == PositionKind::Rope && m.head_dim % 2 != 0)
      RAISE(c.where("model.head_dim"), "must be even with rope positions, got ", m.head_dim,
            set("model.head_dim") ? "" : " (hidden_size / num_heads)");
    if (m.attention_backend == AttentionBackendKind::Cudnn) {
#ifndef ENGINE_CUDNN
      RAISE(c.where("model.attention_backend"),
            "\"cudnn\" needs cuDNN and this binary was built without cuDNN (the Makefile found no cudnn.h "
            "and libcudnn.so.9, or CUDNN=0): use \"flash\", or rebuild where cuDNN is installed");
#endif
      // cuDNN's fused attention engines take head dims that are multiples of 8, up to 256 (Hopper).
      if (attention && (m.head_dim % 8 != 0 || m.head_dim > 256))
        RAISE(c.where("model.attention_backend"), "\"cudnn\" needs head_dim a multiple of 8 and at most 256, got ",
              m.head_dim, " (use \"flash\")");
    }

    if (set("model.ffn_hidden_size")) {
      positive("model.ffn_hidden_size", m.ffn_hidden_size);
    } else if (m.activation == ActivationKind::GELU) {
      m.ffn_hidden_size = fits("model.ffn_hidden_size", 4 * int64_t{m.hidden_size},
                               "4 * hidden_size");
    } else {
      // Llama's rule: 2/3 of 4 * hidden, rounded up to a multiple of 256.
      constexpr int64_t kMultipleOf = 256;
      const int64_t h = 8 * int64_t{m.hidden_size} / 3;
      m.ffn_hidden_size = fits("model.ffn_hidden_size",
                               kMultipleOf * ((h + kMultipleOf - 1) / kMultipleOf),
                               "256 * ceil(8 * hidden_size / 3 / 256)");
    }
    if (has_block_kind(m, "E")) {  // the experts' sizes default to the dense MLP's
      if (!set("model.moe_ffn_hidden_size")) m.moe_ffn_hidden_size = m.ffn_hidden_size;
      if (!set("model.moe_shared_expert_ffn_size") && m.family == ModelFamily::Qwen2Moe)
        m.moe_shared_expert_ffn_size = m.ffn_hidden_size;
    }
    positive("model.norm_eps", m.norm_eps);
    positive("model.rope_theta", m.rope_theta);
    at_least("model.sliding_window", m.sliding_window, 0);
    positive("model.init_std", m.init_std);
  }

  // Needs data.sequence_length, so runs after data().
  void positions() const {
    ModelConfig& m = c.model;
    if (set("model.max_position_embeddings"))
      positive("model.max_position_embeddings", m.max_position_embeddings);
    else
      m.max_position_embeddings = c.data.sequence_length;
    if (m.positions == PositionKind::Learned && m.max_position_embeddings < c.data.sequence_length)
      RAISE(c.where("model.max_position_embeddings"), "must be >= data.sequence_length (",
            c.data.sequence_length, ") with learned positions, got ", m.max_position_embeddings);
  }

  void data() const {
    DataConfig& d = c.data;
    if (!set("data.train")) RAISE(c.where("data.train"), "required, not set");
    if (d.train.empty()) RAISE(c.where("data.train"), "must list at least one dataset");
    required_positive("data.sequence_length", d.sequence_length);
    unit_interval("data.valid_fraction", d.valid_fraction);
    at_least("data.max_epochs", d.max_epochs, 0);
    if (d.tokenizer == "bytes" && c.model.vocab_size < 257)
      RAISE(c.where("data.tokenizer"), "\"bytes\" needs model.vocab_size >= 257 (256 bytes and the end of "
            "document), got ", c.model.vocab_size);
    if (!d.tokenizer.empty() && d.tokenizer != "bytes" && d.tokenizer != "ids") {
      resolve_path("data.tokenizer", d.tokenizer);
      if (std::error_code ec; !std::filesystem::exists(d.tokenizer, ec))
        RAISE(c.where("data.tokenizer"), "\"bytes\", \"ids\" or a tokenizer.json or folder; ", d.tokenizer,
              " does not exist");
    }
  }

  void batch() const {
    BatchConfig& b = c.batch;
    positive("batch.micro_batch_size", b.micro_batch_size);
    positive("batch.global_batch_size", b.global_batch_size);
    if (b.global_batch_size % b.micro_batch_size != 0)
      RAISE(c.where("batch.global_batch_size"), "must be a multiple of micro_batch_size (",
            b.micro_batch_size, "), got ", b.global_batch_size);
    b.accumulation_steps = b.global_batch_size / b.micro_batch_size;  // data_parallel 1; launch sets it
  }

  void distributed() const {
    const int z = c.distributed.zero_stage;
    if (z < 0 || z > 3) RAISE(c.where("distributed.zero_stage"), "must be 0, 1, 2 or 3, got ", z);
    if (!(c.distributed.reduce_bucket_mb > 0))
      RAISE(c.where("distributed.reduce_bucket_mb"), "must be > 0, got ", c.distributed.reduce_bucket_mb);
    const DistributedConfig& d = c.distributed;
    at_least("distributed.cross_entropy_splits", d.cross_entropy_splits, 0);
    at_least("distributed.tensor_parallel", d.tensor_parallel, 1);
    const int tp = d.tensor_parallel;
    const ModelConfig& m = c.model;
    // Each tensor-parallel rank holds whole heads, an equal part of the MLP and of the vocabulary.
    // (Mamba blocks: the inner dimension, expand x hidden_size; Mamba-2: also the groups of B and C.)
    const bool attention = has_block_kind(m, "AE"), mamba = has_block_kind(m, "MS");
    const bool dense = has_block_kind(m, "AG"), moe = has_block_kind(m, "E");
    const std::pair<const char*, int64_t> split[] = {{"model.num_heads", attention ? m.num_heads : 0},
                                                     {"model.num_kv_heads", attention ? m.num_kv_heads : 0},
                                                     {"model.ffn_hidden_size", dense ? m.ffn_hidden_size : 0},
                                                     {set("model.moe_ffn_hidden_size") ? "model.moe_ffn_hidden_size"
                                                                                       : "model.ffn_hidden_size",
                                                      moe ? m.moe_ffn_hidden_size : 0},
                                                     {"model.moe_shared_expert_ffn_size",
                                                      moe ? m.moe_shared_expert_ffn_size : 0},
                                                     {"model.vocab_size", m.vocab_size},
                                                     {"model.mamba_expand x hidden_size",
                                                      mamba ? int64_t{m.mamba_expand} * m.hidden_size : 0},
                                                     {"model.mamba_n_groups",
                                                      has_block_kind(m, "S") ? m.mamba_n_groups : 0},
                                                     {"model.gdn_num_key_heads",
                                                      has_block_kind(m, "G") ? m.gdn_num_key_heads : 0}};
    for (const auto& [key, n] : split)
      if (n % tp != 0)
        RAISE(c.where("distributed.tensor_parallel"), "must divide ", key, " (", n, "), got ", tp,
              " (each tensor-parallel rank holds an equal part of it)");
    non_negative("distributed.timeout_s", d.timeout_s);
    at_least("distributed.pipeline_parallel", d.pipeline_parallel, 1);
    at_least("distributed.stages_per_rank", d.stages_per_rank, 1);
    const int64_t stages = int64_t{d.pipeline_parallel} * d.stages_per_rank;
    if (stages > m.num_layers)
      RAISE(c.where(set("distributed.stages_per_rank") ? "distributed.stages_per_rank" : "distributed.pipeline_parallel"),
            "pipeline_parallel x stages_per_rank = ", stages, " stages, more than model.num_layers (", m.num_layers,
            "): every stage needs at least one block");
    const int64_t tokens = int64_t{c.batch.micro_batch_size} * c.data.sequence_length;
    // A micro-batch's documents are addressed by 32-bit token offsets (cu_seqlens, the kernels' rows).
    if (tokens > INT_MAX)
      RAISE(c.where("batch.micro_batch_size"), "micro_batch_size ", c.batch.micro_batch_size, " x data.sequence_length ",
            c.data.sequence_length, " = ", tokens, " tokens per micro-batch, more than 32-bit token offsets address (",
            INT_MAX, ")");
    if (d.sequence_parallel && tp > 1 && tokens % tp != 0)
      RAISE(c.where("distributed.sequence_parallel"), "needs the tokens of a micro-batch (micro_batch_size ",
            c.batch.micro_batch_size, " x sequence_length ", c.data.sequence_length, " = ", tokens,
            ") to split evenly over tensor_parallel = ", tp);
    // Micro-sequences: chunks of whole sequences' tokens, each split evenly under sequence parallelism.
    const int msl = c.batch.micro_sequence_length;
    non_negative("batch.micro_sequence_length", msl);
    if (msl > 0 && c.data.sequence_length % msl != 0)
      RAISE(c.where("batch.micro_sequence_length"), "must divide data.sequence_length (", c.data.sequence_length,
            "), got ", msl);
    if (msl > 0 && has_block_kind(m, "MSG"))
      RAISE(c.where("batch.micro_sequence_length"), "is not supported with Mamba, Mamba-2 or Gated DeltaNet blocks (the state would have "
                                                   "to pass from chunk to chunk); use 0");
    if (msl > 0 && d.sequence_parallel && tp > 1 && msl % tp != 0)
      RAISE(c.where("batch.micro_sequence_length"), "must split evenly over tensor_parallel = ", tp,
            " under sequence parallelism, got ", msl);
  }

  void distillation() const {
    DistillationConfig& d = c.distillation;
    if (d.teacher.empty()) return;
    resolve_path("distillation.teacher", d.teacher);
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(fs::path(d.teacher) / "config.json", ec) && !fs::exists(fs::path(d.teacher) / "metadata.json", ec))
      RAISE(c.where("distillation.teacher"), d.teacher,
            ": neither a Hugging Face folder (config.json) nor a checkpoint folder (metadata.json)");
    positive("distillation.temperature", d.temperature);
    non_negative("distillation.weight", d.weight);
    non_negative("distillation.label_weight", d.label_weight);
    if (d.weight == 0 && d.label_weight == 0)
      RAISE(c.where("distillation.weight"), "and distillation.label_weight are both 0: nothing to train on");
    if (c.model.label_smoothing > 0)
      RAISE(c.where("model.label_smoothing"), "is not combined with distillation (the teacher's distribution is "
            "the soft target); set it to 0");
  }

  void training() const {
    TrainingConfig& t = c.training;
    required_positive("training.steps", t.steps);
    at_least("training.max_bad_steps", t.max_bad_steps, 0);
    at_least("training.eval_every", t.eval_every, 0);
    at_least("training.eval_steps", t.eval_steps, 1);
    at_least("training.checkpoint_every", t.checkpoint_every, 0);
    at_least("training.keep_checkpoints", t.keep_checkpoints, 0);
    non_empty("training.resume", t.resume);
    if (t.resume != "none" && t.resume != "auto") resolve_path("training.resume", t.resume);
    at_least("training.sample_every", t.sample_every, 0);
    at_least("training.sample_tokens", t.sample_tokens, 1);
    const DistributedConfig& dist = c.distributed;
    if (t.sample_every > 0 && t.sample_prompt.empty())
      RAISE(c.where("training.sample_prompt"), "must be set with training.sample_every (the samples' prompt)");
    if (t.sample_every > 0 && (dist.tensor_parallel > 1 || dist.pipeline_parallel > 1 || dist.zero_stage == 3))
      RAISE(c.where("training.sample_every"), "needs every weight on rank 0: not with tensor_parallel, "
            "pipeline_parallel > 1 or zero_stage 3 (use --generate on a checkpoint)");
    if (t.eval_every > 0 && c.data.valid.empty() && c.data.valid_fraction == 0)
      RAISE(c.where("training.eval_every"),
            "validation needs data: set data.valid or data.valid_fraction > 0");
  }

  void optimizer() const {
    OptimizerConfig& o = c.optimizer;
    non_negative("optimizer.lr", o.lr);
    non_negative("optimizer.min_lr", o.min_lr);
    if (o.min_lr > o.lr)
      RAISE(c.where("optimizer.min_lr"), "must be <= lr (", o.lr, "), got ", o.min_lr);
    at_least("optimizer.warmup_steps", o.warmup_steps, 0);
    if (o.warmup_steps > c.training.steps)
      RAISE(c.where("optimizer.warmup_steps"), "must be <= training.steps (", c.training.steps,
            "), got ", o.warmup_steps);
    if (set("optimizer.decay_steps"))
      at_least("optimizer.decay_steps", o.decay_steps, 0);
    else
      o.decay_steps = c.training.steps - o.warmup_steps;
    non_negative("optimizer.weight_decay", o.weight_decay);
    unit_interval("optimizer.beta1", o.beta1);
    unit_interval("optimizer.beta2", o.beta2);
    positive("optimizer.eps", o.eps);
    non_negative("optimizer.grad_clip", o.grad_clip);
  }
};

}  // namespace

void finish_config(Config& c) {
  Checker k{c};
  k.run();
  k.model();
  k.data();
  k.positions();
  check_rope_scaling(c);
  k.batch();
  k.training();
  k.distributed();
  k.distillation();
  k.optimizer();
  check_prediction_heads(c);
  check_fp8(c);
}

}  // namespace config_detail

int micro_batches_per_rank(const Config& c, int dp) {
  const BatchConfig& b = c.batch;
  const DistributedConfig& d = c.distributed;
  const int64_t per_step = int64_t{b.micro_batch_size} * dp;  // (ints: the product fits 64 bits)
  if (b.global_batch_size % per_step != 0)
    RAISE(c.where("batch.global_batch_size"), "must be a multiple of micro_batch_size (", b.micro_batch_size,
          ") x data_parallel (", dp, " ranks) = ", per_step, ", got ", b.global_batch_size);
  const int m = static_cast<int>(b.global_batch_size / per_step);
  if (d.pipeline_schedule == ScheduleKind::OneFOneB && d.stages_per_rank > 1 && m % d.pipeline_parallel != 0)
    RAISE(c.where("distributed.pipeline_schedule"), "\"1f1b\" with stages_per_rank = ", d.stages_per_rank,
          " (interleaved) takes the micro-batches in groups of pipeline_parallel (", d.pipeline_parallel, "), got ", m,
          " per data-parallel rank (global_batch_size ", b.global_batch_size, " / (micro_batch_size ",
          b.micro_batch_size, " x data_parallel ", dp, "))");
  // The pipeline schedule numbers its units (micro-batch x micro-sequence) and, between pipeline
  // ranks, tags each message by (direction, stage, unit) in an int.
  const int msl = b.micro_sequence_length;
  const int64_t chunks = msl > 0 ? int64_t{b.micro_batch_size} * c.data.sequence_length / msl : 1;
  const int64_t units = m * chunks, stages = int64_t{d.pipeline_parallel} * d.stages_per_rank;
  const int64_t tags = d.pipeline_parallel > 1 ? 2 * stages * units : units;
  if (tags > INT_MAX)
    RAISE(c.where(msl > 0 ? "batch.micro_sequence_length" : "batch.global_batch_size"), "a step of ", m,
          " micro-batches per data-parallel rank", msl > 0 ? str_cat(" of ", chunks, " micro-sequences each") : "",
          d.pipeline_parallel > 1 ? str_cat(" over ", stages, " pipeline stages") : "", " has more schedule steps (",
          tags, ") than the pipeline can number (", INT_MAX, ")");
  return m;
}

}  // namespace engine
