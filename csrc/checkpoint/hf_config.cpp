// config.json <-> ModelConfig for the Hugging Face families (hf.h). Keys as the transformers
// configuration classes name them (GPT2Config, LlamaConfig, MistralConfig, Qwen2Config,
// Qwen3Config, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig, MambaConfig and Mamba2Config: hf_mamba.h); RoPE's base and scaling are written both as
// rope_theta and rope_scaling (transformers 4.x) and rope_parameters (5.x), and read from either (hf_rope.h).
#include <cmath>
#include <filesystem>
#include <tuple>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "checkpoint/hf.h"
#include "checkpoint/hf_mamba.h"
#include "checkpoint/hf_mtp.h"
#include "checkpoint/hf_rope.h"
#include "core/check.h"

namespace engine::hf {

namespace {

using json = nlohmann::ordered_json;

const char* norm_name(NormKind n) { return n == NormKind::LayerNorm ? "layernorm" : "rmsnorm"; }
const char* act_name(ActivationKind a) { return a == ActivationKind::GELU ? "gelu" : "swiglu"; }
const char* pos_name(PositionKind p) { return p == PositionKind::Learned ? "learned" : "rope"; }

// An export precondition on one key.
void need(bool ok, const char* family, const char* key, const std::string& value, const std::string& why) {
  if (!ok) RAISE("Hugging Face ", family, " export: model.", key, " = ", value, " is not supported: ", why);
}

// The Qwen MoE configs have neither a router z-loss nor router jitter: export needs both 0.
void need_plain_router(const ModelConfig& c, const char* family, const char* hf_class) {
  need(c.moe_z_loss_coef == 0, family, "moe_z_loss_coef", str_cat(c.moe_z_loss_coef),
       str_cat(hf_class, " has no router z-loss (set it to 0 to export)"));
  need(c.moe_jitter == 0, family, "moe_jitter", str_cat(c.moe_jitter),
       str_cat(hf_class, " has no router jitter (set it to 0 to export)"));
}

// Typed reads of config.json with errors naming the file and key.
struct Reader {
  const json& j;
  const std::string& path;
  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t integer(const char* k, int64_t def, bool required = false) const {
    if (!has(k)) {
      if (required) RAISE(path, ": ", k, ": required, missing");
      return def;
    }
    if (!j[k].is_number_integer()) RAISE(path, ": ", k, ": expected an integer, got ", j[k].dump());
    return j[k].get<int64_t>();
  }
  double number(const char* k, double def) const {
    if (!has(k)) return def;
    if (!j[k].is_number()) RAISE(path, ": ", k, ": expected a number, got ", j[k].dump());
    return j[k].get<double>();
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) RAISE(path, ": ", k, ": expected true or false, got ", j[k].dump());
    return j[k].get<bool>();
  }
  std::string string(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j[k].is_string()) RAISE(path, ": ", k, ": expected a string, got ", j[k].dump());
    return j[k].get<std::string>();
  }
};

std::string show_int(int v) { return std::to_string(v); }

int to_int(int64_t v, const std::string& path, const char* key) {
  if (v < 0 || v > INT32_MAX) RAISE(path, ": ", key, ": out of range: ", v);
  return static_cast<int>(v);
}

// Qwen2MoeConfig's and Qwen3MoeConfig's mixture-of-experts keys (Qwen3-MoE has no shared
// expert); every A/E layout is decoder_sparse_step 1 with the A layers as mlp_only_layers.
void write_qwen_moe(const ModelConfig& c, json& j) {
  const bool qwen2 = c.family == ModelFamily::Qwen2Moe;
  if (qwen2) j["qkv_bias"] = c.qkv_bias;
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["moe_intermediate_size"] = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : c.ffn_hidden_size;
  if (qwen2) j["shared_expert_intermediate_size"] = c.moe_shared_expert_ffn_size;
  j["norm_topk_prob"] = c.moe_norm_topk_prob;
  j["decoder_sparse_step"] = 1;
  std::vector<int> dense;
  for (int i = 0; i < c.num_layers; ++i)
    if (block_letter(c, i) == 'A') dense.push_back(i);
  j["mlp_only_layers"] = dense;
  // HF's load-balancing loss is top_k times ours at the same coefficient (layers/moe.h).
  j["router_aux_loss_coef"] = c.moe_aux_loss_coef / c.experts_per_token;
  j["output_router_logits"] = c.moe_aux_loss_coef > 0;
}

// Qwen2MoeConfig's or Qwen3MoeConfig's mixture-of-experts keys (the class's defaults where
// missing) into c.
void read_qwen_moe(const json& j, const std::string& path, ModelConfig& c) {
  Reader r{j, path};
  const bool qwen2 = c.family == ModelFamily::Qwen2Moe;
  if (qwen2) c.qkv_bias = r.boolean("qkv_bias", true);
  // transformers 5's Qwen3MoeConfig maps num_experts to num_local_experts and saves that name.
  const char* experts_key = !r.has("num_experts") && r.has("num_local_experts") ? "num_local_experts" : "num_experts";
  if (r.has("num_experts") && r.has("num_local_experts") && j["num_experts"] != j["num_local_experts"])
    RAISE(path, ": num_experts (", j["num_experts"].dump(), ") and num_local_experts (", j["num_local_experts"].dump(),
          ") disagree");
  c.num_experts = to_int(r.integer(experts_key, qwen2 ? 60 : 128), path, experts_key);
  if (c.num_experts <= 0)
    RAISE(path, ": num_experts: must be > 0 (without experts the model is ", qwen2 ? "qwen2" : "qwen3", "), got ",
          c.num_experts);
  c.experts_per_token = to_int(r.integer("num_experts_per_tok", qwen2 ? 4 : 8), path, "num_experts_per_tok");
  if (c.experts_per_token <= 0 || c.experts_per_token > c.num_experts)
    RAISE(path, ": num_experts_per_tok (", c.experts_per_token, ") must be in [1, num_experts (", c.num_experts, ")]");
  c.moe_ffn_hidden_size = to_int(r.integer("moe_intermediate_size", qwen2 ? 1408 : 768), path, "moe_intermediate_size");
  if (c.moe_ffn_hidden_size <= 0) RAISE(path, ": moe_intermediate_size: must be > 0, got ", c.moe_ffn_hidden_size);
  if (qwen2) {
    c.moe_shared_expert_ffn_size =
        to_int(r.integer("shared_expert_intermediate_size", 5632), path, "shared_expert_intermediate_size");
    if (c.moe_shared_expert_ffn_size <= 0)
      RAISE(path, ": shared_expert_intermediate_size: must be > 0 (an empty shared expert is not supported), got ",
            c.moe_shared_expert_ffn_size);
  } else if (r.has("shared_expert_intermediate_size") && !j["shared_expert_intermediate_size"].is_null() &&
             j["shared_expert_intermediate_size"] != 0) {
    RAISE(path, ": shared_expert_intermediate_size: Qwen3-MoE has no shared expert (use model_type qwen2_moe)");
  }
  c.moe_norm_topk_prob = r.boolean("norm_topk_prob", false);
  const int64_t step = r.integer("decoder_sparse_step", 1);
  if (step < 1) RAISE(path, ": decoder_sparse_step: must be >= 1, got ", step);
  std::vector<bool> dense(static_cast<size_t>(c.num_layers), false);
  if (r.has("mlp_only_layers")) {
    if (!j["mlp_only_layers"].is_array()) RAISE(path, ": mlp_only_layers: expected a list of layer indices, got ", j["mlp_only_layers"].dump());
    for (const auto& v : j["mlp_only_layers"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.num_layers)
        RAISE(path, ": mlp_only_layers: ", v.dump(), " is not a layer index in [0, ", c.num_layers, ")");
      dense[v.get<size_t>()] = true;
    }
  }
  std::string layout;
  for (int i = 0; i < c.num_layers; ++i) layout += !dense[static_cast<size_t>(i)] && (i + 1) % step == 0 ? 'E' : 'A';
  c.hybrid_layout = layout.find('A') == std::string::npos ? "" : layout;  // empty: every layer E
  const double aux = r.number("router_aux_loss_coef", 0.001);
  if (!(aux >= 0)) RAISE(path, ": router_aux_loss_coef: must be >= 0, got ", aux);
  c.moe_aux_loss_coef = r.boolean("output_router_logits", false) ? aux * c.experts_per_token : 0.0;
  c.moe_jitter = 0.0;
  c.moe_z_loss_coef = 0.0;
}

}  // namespace

std::string architecture(const ModelConfig& c) {
  if (c.prediction_heads > 0) return mtp_architecture(c);
  const bool qkv_only = c.qkv_bias && !c.bias;
  if (c.family != ModelFamily::Qwen3 && c.family != ModelFamily::Qwen3Moe)
    need(!c.qk_norm, family_name(c.family), "qk_norm", "true",
         "of the Hugging Face architectures only Qwen3 and Qwen3-MoE normalise q and k heads (use family = \"qwen3\")");
  switch (c.family) {
    case ModelFamily::GPT2: {
      const char* f = "gpt2";
      need(c.norm == NormKind::LayerNorm, f, "norm", norm_name(c.norm), "GPT-2 uses layernorm");
      need(c.activation == ActivationKind::GELU, f, "activation", act_name(c.activation), "GPT-2 uses gelu (tanh)");
      need(c.positions == PositionKind::Learned, f, "positions", pos_name(c.positions), "GPT-2 learns positions");
      need(c.bias, f, "bias", "false", "GPT-2 has biases in every linear and norm");
      need(c.num_kv_heads == c.num_heads, f, "num_kv_heads", std::to_string(c.num_kv_heads),
           "GPT-2 has no grouped-query attention");
      need(int64_t{c.head_dim} * c.num_heads == c.hidden_size, f, "head_dim", std::to_string(c.head_dim),
           "GPT-2 needs head_dim x num_heads = hidden_size");
      need(c.sliding_window == 0, f, "sliding_window", std::to_string(c.sliding_window), "GPT-2 has no window");
      return "GPT2LMHeadModel";
    }
    case ModelFamily::Llama:
    case ModelFamily::Mistral:
    case ModelFamily::Qwen2:
    case ModelFamily::Qwen3:
    case ModelFamily::Mixtral:
    case ModelFamily::Qwen2Moe:
    case ModelFamily::Qwen3Moe: {
      const char* f = family_name(c.family);
      need(c.norm == NormKind::RMSNorm, f, "norm", norm_name(c.norm), "this family uses rmsnorm");
      need(c.activation == ActivationKind::SwiGLU, f, "activation", act_name(c.activation), "this family uses swiglu");
      need(c.positions == PositionKind::Rope, f, "positions", pos_name(c.positions), "this family uses rope");
      if (c.family == ModelFamily::Llama) {
        need(c.sliding_window == 0, f, "sliding_window", std::to_string(c.sliding_window),
             "LlamaForCausalLM has no sliding window (use family = \"mistral\")");
        need(!qkv_only, f, "qkv_bias", "true", "Llama's attention_bias also biases o_proj (use family = \"qwen2\")");
        return "LlamaForCausalLM";
      }
      if (c.family == ModelFamily::Mixtral) {
        need(c.moe_shared_expert_ffn_size == 0, f, "moe_shared_expert_ffn_size", show_int(c.moe_shared_expert_ffn_size),
             "Mixtral has no shared expert (use family = \"qwen2_moe\")");
        need(c.moe_norm_topk_prob, f, "moe_norm_topk_prob", "false", "Mixtral always renormalises the top-k weights");
      }
      if (c.family == ModelFamily::Qwen2Moe) {
        need(!c.bias, f, "bias", "true", "Qwen2-MoE has biases on q, k and v only (qkv_bias)");
        need(c.qkv_bias, f, "qkv_bias", "false", "Qwen2MoeAttention has biases on q, k and v");
        need(c.moe_shared_expert_ffn_size > 0, f, "moe_shared_expert_ffn_size", "0",
             "Qwen2MoeSparseMoeBlock always has a shared expert");
        need(int64_t{c.head_dim} * c.num_heads == c.hidden_size, f, "head_dim", show_int(c.head_dim),
             "Qwen2MoeAttention needs head_dim x num_heads = hidden_size");
        need_plain_router(c, f, "Qwen2MoeConfig");
        return "Qwen2MoeForCausalLM";
      }
      if (c.family == ModelFamily::Mistral || c.family == ModelFamily::Mixtral) {
        need(!c.bias && !c.qkv_bias, f, c.bias ? "bias" : "qkv_bias", "true",
             c.family == ModelFamily::Mistral ? "Mistral has no biases" : "Mixtral has no biases");
        return c.family == ModelFamily::Mistral ? "MistralForCausalLM" : "MixtralForCausalLM";
      }
      if (c.family == ModelFamily::Qwen3 || c.family == ModelFamily::Qwen3Moe) {
        need(!c.bias && !c.qkv_bias, f, c.bias ? "bias" : "qkv_bias", "true",
             "Qwen3's attention_bias biases q, k, v and o but not the MLP, which the engine does not represent");
        need(c.qk_norm, f, "qk_norm", "false", "Qwen3 always normalises q and k heads");
        if (c.family == ModelFamily::Qwen3) return "Qwen3ForCausalLM";
        need(c.moe_shared_expert_ffn_size == 0, f, "moe_shared_expert_ffn_size", show_int(c.moe_shared_expert_ffn_size),
             "Qwen3-MoE has no shared expert (use family = \"qwen2_moe\")");
        need_plain_router(c, f, "Qwen3MoeConfig");
        return "Qwen3MoeForCausalLM";
      }
      need(!c.bias, f, "bias", "true", "Qwen2 has biases on q, k and v only (qkv_bias)");
      need(c.qkv_bias, f, "qkv_bias", "false", "Qwen2 always has biases on q, k and v");
      return "Qwen2ForCausalLM";
    }
    case ModelFamily::Mamba: {
      const char* f = "mamba";
      need(c.norm == NormKind::RMSNorm, f, "norm", norm_name(c.norm), "HF Mamba uses rmsnorm");
      need(!c.bias, f, "bias", "true", "HF Mamba's norms have no bias (use_bias is model.mamba_proj_bias)");
      need(c.positions == PositionKind::Rope, f, "positions", pos_name(c.positions),
           "HF Mamba has no position embeddings");
      return "MambaForCausalLM";
    }
    case ModelFamily::Mamba2:
      need(c.norm == NormKind::RMSNorm, "mamba2", "norm", norm_name(c.norm), "HF Mamba-2 uses rmsnorm");
      need(!c.bias, "mamba2", "bias", "true", "HF Mamba-2's norms have no bias (use_bias is model.mamba_proj_bias)");
      need(!c.mamba_norm_per_group || c.mamba_n_groups == 1, "mamba2", "mamba_norm_per_group", "true",
           "transformers' Mamba2Mixer normalises the whole inner width, and Mamba2Config has no key for groups");
      return "Mamba2ForCausalLM";
    case ModelFamily::Hybrid:
      need(false, "hybrid", "family", "hybrid",
           "no Hugging Face architecture mixes attention, experts and Mamba blocks per layer "
           "(export a mixtral or mamba model instead)");
  }
  RAISE("unknown model family");
}

std::string hf_config_json(const ModelConfig& c, const std::string& dtype) {
  const std::string arch = architecture(c);
  json j;
  j["architectures"] = {arch};
  j["model_type"] = family_name(c.family);
  j["vocab_size"] = c.vocab_size;
  const bool gpt2 = c.family == ModelFamily::GPT2;
  if (c.family == ModelFamily::Mamba) {
    mamba_config_to_hf(c, j);
  } else if (c.family == ModelFamily::Mamba2) {
    mamba2_config_to_hf(c, j);
  } else if (gpt2) {
    j["n_positions"] = c.max_position_embeddings;
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.num_layers;
    j["n_head"] = c.num_heads;
    j["n_inner"] = c.ffn_hidden_size;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = c.norm_eps;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
  } else {
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.family == ModelFamily::Mixtral && c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size
                                                                                         : c.ffn_hidden_size;
    j["num_hidden_layers"] = c.num_layers;
    j["num_attention_heads"] = c.num_heads;
    j["num_key_value_heads"] = c.num_kv_heads;
    if ((c.family != ModelFamily::Qwen2 && c.family != ModelFamily::Qwen2Moe) ||
        int64_t{c.head_dim} * c.num_heads != c.hidden_size)
      j["head_dim"] = c.head_dim;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["rms_norm_eps"] = c.norm_eps;
    rope_to_hf(j, c);
    j["attention_dropout"] = 0.0;
    if (c.family == ModelFamily::Llama) {
      j["attention_bias"] = c.bias;
      j["mlp_bias"] = c.bias;
      j["pretraining_tp"] = 1;
    } else if (c.family == ModelFamily::Mistral) {
      j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    } else if (c.family == ModelFamily::Mixtral) {
      const char* f = "mixtral";
      need(c.moe_z_loss_coef == 0, f, "moe_z_loss_coef", str_cat(c.moe_z_loss_coef),
           "MixtralConfig has no router z-loss, so it is not representable (set it to 0 to export)");
      j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      j["num_local_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.experts_per_token;
      // HF's load-balancing loss is top_k times ours at the same coefficient (layers/moe.h).
      j["router_aux_loss_coef"] = c.moe_aux_loss_coef / c.experts_per_token;
      j["output_router_logits"] = c.moe_aux_loss_coef > 0;
      j["router_jitter_noise"] = c.moe_jitter;
    } else {  // qwen2, qwen3, qwen2_moe, qwen3_moe
      if (c.family == ModelFamily::Qwen3 || c.family == ModelFamily::Qwen3Moe) j["attention_bias"] = false;
      const bool window = c.sliding_window > 0;
      j["use_sliding_window"] = window;
      j["sliding_window"] = window ? json(c.sliding_window) : json(nullptr);
      j["max_window_layers"] = window ? 0 : c.num_layers;
      j["layer_types"] = std::vector<std::string>(static_cast<size_t>(c.num_layers),
                                                  window ? "sliding_attention" : "full_attention");
      if (c.family == ModelFamily::Qwen2Moe || c.family == ModelFamily::Qwen3Moe) write_qwen_moe(c, j);
    }
  }
  j["initializer_range"] = c.init_std;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  j["use_cache"] = true;
  j["dtype"] = dtype == "BF16" ? "bfloat16" : "float32";
  if (c.prediction_heads > 0) mtp_config_to_hf(c, j);
  return (c.family == ModelFamily::Mamba2 ? json_nonfinite_as_tokens(j.dump(2)) : j.dump(2)) + "\n";
}

ModelConfig model_from_hf_config(const std::string& path) {
  json j;
  try {
    j = json::parse(json_nonfinite_as_strings(checkpoint::read_small_file(path, uint64_t{64} << 20)));
  } catch (const json::exception& e) {
    RAISE(path, ": not valid JSON: ", e.what());
  }
  if (!j.is_object()) RAISE(path, ": not a JSON object");
  Reader r{j, path};
  std::string type = r.string("model_type", "");
  const bool mtp = type == kMtpModelType;  // Fast-LLM's MTP Llama: llama's keys + prediction_heads
  if (mtp) type = "llama";
  ModelConfig c;
  if (type == "gpt2") {
    c.family = ModelFamily::GPT2;
    c.vocab_size = to_int(r.integer("vocab_size", 50257), path, "vocab_size");
    c.hidden_size = to_int(r.integer("n_embd", 768), path, "n_embd");
    c.num_layers = to_int(r.integer("n_layer", 12), path, "n_layer");
    c.num_heads = to_int(r.integer("n_head", 12), path, "n_head");
    if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0)
      RAISE(path, ": n_head (", c.num_heads, ") must divide n_embd (", c.hidden_size, ")");
    c.num_kv_heads = c.num_heads;
    c.head_dim = c.hidden_size / c.num_heads;
    c.ffn_hidden_size = to_int(r.integer("n_inner", 4 * int64_t{c.hidden_size}), path, "n_inner");
    c.norm = NormKind::LayerNorm;
    c.norm_eps = r.number("layer_norm_epsilon", 1e-5);
    c.activation = ActivationKind::GELU;
    const std::string act = r.string("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      RAISE(path, ": activation_function \"", act, "\" is not supported (gelu_new: GELU with tanh)");
    if (r.boolean("scale_attn_by_inverse_layer_idx", false))
      RAISE(path, ": scale_attn_by_inverse_layer_idx = true is not supported");
    if (!r.boolean("scale_attn_weights", true)) RAISE(path, ": scale_attn_weights = false is not supported");
    if (r.boolean("add_cross_attention", false)) RAISE(path, ": add_cross_attention = true is not supported");
    c.positions = PositionKind::Learned;
    c.max_position_embeddings = to_int(r.integer("n_positions", 1024), path, "n_positions");
    c.bias = true;
    c.tie_embeddings = r.boolean("tie_word_embeddings", true);
  } else if (type == "mamba") {
    mamba_config_from_hf(j, path, c);
  } else if (type == "mamba2") {
    mamba2_config_from_hf(j, path, c);
  } else if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3" || type == "mixtral" ||
             type == "qwen2_moe" || type == "qwen3_moe") {
    c.family = type == "llama"       ? ModelFamily::Llama
               : type == "mistral"   ? ModelFamily::Mistral
               : type == "qwen2"     ? ModelFamily::Qwen2
               : type == "qwen3"     ? ModelFamily::Qwen3
               : type == "qwen2_moe" ? ModelFamily::Qwen2Moe
               : type == "qwen3_moe" ? ModelFamily::Qwen3Moe
                                     : ModelFamily::Mixtral;
    const bool qwen3 = c.family == ModelFamily::Qwen3 || c.family == ModelFamily::Qwen3Moe;
    c.vocab_size = to_int(r.integer("vocab_size", 0, true), path, "vocab_size");
    c.hidden_size = to_int(r.integer("hidden_size", 0, true), path, "hidden_size");
    c.num_layers = to_int(r.integer("num_hidden_layers", 0, true), path, "num_hidden_layers");
    c.num_heads = to_int(r.integer("num_attention_heads", 0, true), path, "num_attention_heads");
    c.num_kv_heads = to_int(r.integer("num_key_value_heads", c.num_heads), path, "num_key_value_heads");
    if (c.num_heads <= 0) RAISE(path, ": num_attention_heads must be > 0");
    // Qwen3Config's head_dim defaults to 128; the others' (Qwen3MoeConfig has no head_dim field:
    // its attention takes hidden_size / num_attention_heads) to hidden_size / num_attention_heads.
    const bool head_dim_128 = c.family == ModelFamily::Qwen3;
    c.head_dim = to_int(r.integer("head_dim", head_dim_128 ? 128 : c.hidden_size / c.num_heads), path, "head_dim");
    if (c.head_dim <= 0) RAISE(path, ": head_dim: must be > 0, got ", c.head_dim);
    c.ffn_hidden_size = to_int(r.integer("intermediate_size", 0, true), path, "intermediate_size");
    const std::string act = r.string("hidden_act", "silu");
    if (act != "silu") RAISE(path, ": hidden_act \"", act, "\" is not supported (silu: SwiGLU)");
    c.norm = NormKind::RMSNorm;
    c.norm_eps = r.number("rms_norm_eps", 1e-6);
    c.activation = ActivationKind::SwiGLU;
    c.positions = PositionKind::Rope;
    c.max_position_embeddings = to_int(r.integer("max_position_embeddings", 2048), path, "max_position_embeddings");
    const HfRope rope = rope_from_hf(j, path, c.family == ModelFamily::Mixtral ? 1e6 : 10000.0,  // the classes' defaults
                                     c.max_position_embeddings);
    c.rope_theta = rope.theta;
    c.rope_scaling = rope.scaling;
    c.tie_embeddings = r.boolean("tie_word_embeddings", false);
    if (c.family == ModelFamily::Llama) {
      const bool ab = r.boolean("attention_bias", false), mb = r.boolean("mlp_bias", false);
      if (ab != mb) RAISE(path, ": attention_bias = ", ab, " with mlp_bias = ", mb, " is not supported (both or neither)");
      c.bias = ab;
    } else if (c.family == ModelFamily::Mistral || c.family == ModelFamily::Mixtral) {
      c.sliding_window = to_int(r.integer("sliding_window", 0), path, "sliding_window");
    } else {  // qwen2, qwen3, qwen2_moe, qwen3_moe
      if (qwen3) {
        if (r.boolean("attention_bias", false))
          RAISE(path, ": attention_bias = true is not supported (biases on q, k, v and o without MLP biases)");
        c.qk_norm = true;
      } else {
        c.qkv_bias = true;
      }
      const int64_t window = r.boolean("use_sliding_window", false) ? r.integer("sliding_window", 0) : 0;
      int sliding = 0, full = 0;
      if (j.contains("layer_types") && j["layer_types"].is_array()) {
        for (const auto& t : j["layer_types"]) (t == "sliding_attention" ? sliding : full)++;
      } else if (window > 0) {
        // A layer index: in [0, 2^31) like the sizes (a very negative value overflowed below).
        const int from = to_int(r.integer("max_window_layers", 28), path, "max_window_layers");
        sliding = std::max(0, c.num_layers - from);
        full = c.num_layers - sliding;
      }
      if (sliding > 0 && full > 0)
        RAISE(path, ": sliding window on ", sliding, " of ", c.num_layers,
              " layers is not supported (all layers or none)");
      c.sliding_window = sliding > 0 ? to_int(window, path, "sliding_window") : 0;
      if (sliding > 0 && c.sliding_window <= 0) RAISE(path, ": sliding_window must be > 0 with sliding layers");
    }
  } else {
    RAISE(path, ": model_type \"", type, "\" is not supported (gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, mamba, mamba2, mtp_llama)");
  }
  if (c.family == ModelFamily::Qwen2Moe || c.family == ModelFamily::Qwen3Moe) read_qwen_moe(j, path, c);
  if (c.family == ModelFamily::Mixtral) {
    c.num_experts = to_int(r.integer("num_local_experts", 8), path, "num_local_experts");
    c.experts_per_token = to_int(r.integer("num_experts_per_tok", 2), path, "num_experts_per_tok");
    if (c.num_experts <= 0 || c.experts_per_token <= 0 || c.experts_per_token > c.num_experts)
      RAISE(path, ": num_experts_per_tok (", c.experts_per_token, ") must be in [1, num_local_experts (",
            c.num_experts, ")]");
    // Counted only with output_router_logits (as HF's training does); HF's coefficient is ours / top_k.
    const double aux = r.number("router_aux_loss_coef", 0.001);
    if (!(aux >= 0)) RAISE(path, ": router_aux_loss_coef: must be >= 0, got ", aux);
    c.moe_aux_loss_coef = r.boolean("output_router_logits", false) ? aux * c.experts_per_token : 0.0;
    c.moe_jitter = r.number("router_jitter_noise", 0.0);
    if (!(c.moe_jitter >= 0 && c.moe_jitter < 1))
      RAISE(path, ": router_jitter_noise: must be in [0, 1), got ", c.moe_jitter);
    c.moe_z_loss_coef = 0.0;
    c.moe_ffn_hidden_size = c.ffn_hidden_size;  // intermediate_size is one expert's
  }
  c.init_std = r.number("initializer_range", 0.02);
  if (mtp) mtp_config_from_hf(j, path, c);
  return c;
}

namespace {

std::string show(int v) { return std::to_string(v); }
std::string show(double v) { return str_cat(v); }
std::string show(bool v) { return v ? "true" : "false"; }
std::string show(ModelFamily v) { return family_name(v); }
std::string show(NormKind v) { return norm_name(v); }
std::string show(ActivationKind v) { return act_name(v); }
std::string show(PositionKind v) { return pos_name(v); }
std::string show(RopeScalingKind v) {
  switch (v) {
    case RopeScalingKind::None: return "none";
    case RopeScalingKind::Linear: return "linear";
    case RopeScalingKind::Llama3: return "llama3";
    case RopeScalingKind::Yarn: return "yarn";
  }
  return "?";
}
std::string show(const std::string& v) { return "\"" + v + "\""; }

}  // namespace

void apply_hf_config(Config& c) {
  const std::string path = (std::filesystem::path(c.model.init_from) / "config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    RAISE(c.where("model.init_from"), c.model.init_from, " is not a Hugging Face folder: no config.json");
  const ModelConfig h = model_from_hf_config(path);
  ModelConfig& m = c.model;
  // A key set in [model] must agree with config.json; an unset one takes its value.
  auto take = [&](const char* key, auto& ours, const auto& theirs, bool check = true) {
    const std::string k = std::string("model.") + key;
    if (c.is_set(k)) {
      if (check && !(ours == theirs))
        RAISE(c.where(k), "is ", show(ours), " but ", path, " gives ", show(theirs),
              " (leave it unset to take the folder's value)");
      return;
    }
    ours = theirs;
    c.origin[k] = path;
  };
  take("family", m.family, h.family);
  take("vocab_size", m.vocab_size, h.vocab_size);
  take("hidden_size", m.hidden_size, h.hidden_size);
  take("num_layers", m.num_layers, h.num_layers);
  take("norm", m.norm, h.norm);
  take("norm_eps", m.norm_eps, h.norm_eps);
  take("bias", m.bias, h.bias);
  take("tie_embeddings", m.tie_embeddings, h.tie_embeddings);
  take("init_std", m.init_std, h.init_std, false);
  take("prediction_heads", m.prediction_heads, h.prediction_heads);
  if (h.family == ModelFamily::Qwen2Moe || h.family == ModelFamily::Qwen3Moe) take("hybrid_layout", m.hybrid_layout, h.hybrid_layout);
  const std::string layout = block_layout(h);
  if (layout.find_first_of("AE") != std::string::npos) {  // attention (Mamba: these keys do not matter)
    take("num_heads", m.num_heads, h.num_heads);
    take("num_kv_heads", m.num_kv_heads, h.num_kv_heads);
    take("head_dim", m.head_dim, h.head_dim);
    take("ffn_hidden_size", m.ffn_hidden_size, h.ffn_hidden_size);
    take("activation", m.activation, h.activation);
    take("positions", m.positions, h.positions);
    // The table size matters for learned positions only.
    take("max_position_embeddings", m.max_position_embeddings, h.max_position_embeddings,
         h.positions == PositionKind::Learned);
    if (h.positions == PositionKind::Rope) {
      take("rope_theta", m.rope_theta, h.rope_theta);
      RopeScalingConfig& r = m.rope_scaling;
      const RopeScalingConfig& hr = h.rope_scaling;
      take("rope_scaling.type", r.type, hr.type);
      take("rope_scaling.factor", r.factor, hr.factor);
      take("rope_scaling.low_freq_factor", r.low_freq_factor, hr.low_freq_factor);
      take("rope_scaling.high_freq_factor", r.high_freq_factor, hr.high_freq_factor);
      take("rope_scaling.original_max_position_embeddings", r.original_max_position_embeddings,
           hr.original_max_position_embeddings);
      take("rope_scaling.beta_fast", r.beta_fast, hr.beta_fast);
      take("rope_scaling.beta_slow", r.beta_slow, hr.beta_slow);
      take("rope_scaling.attention_factor", r.attention_factor, hr.attention_factor);
      take("rope_scaling.truncate", r.truncate, hr.truncate);
    }
    take("sliding_window", m.sliding_window, h.sliding_window);
    take("qkv_bias", m.qkv_bias, h.qkv_bias);
    take("qk_norm", m.qk_norm, h.qk_norm);
  }
  if (layout.find('E') != std::string::npos) {
    take("num_experts", m.num_experts, h.num_experts);
    take("experts_per_token", m.experts_per_token, h.experts_per_token);
    take("moe_ffn_hidden_size", m.moe_ffn_hidden_size, h.moe_ffn_hidden_size);
    take("moe_shared_expert_ffn_size", m.moe_shared_expert_ffn_size, h.moe_shared_expert_ffn_size);
    take("moe_norm_topk_prob", m.moe_norm_topk_prob, h.moe_norm_topk_prob);
    // Training-only coefficients: the folder's fill unset keys, set ones may differ.
    take("moe_aux_loss_coef", m.moe_aux_loss_coef, h.moe_aux_loss_coef, false);
    take("moe_z_loss_coef", m.moe_z_loss_coef, h.moe_z_loss_coef, false);
    take("moe_jitter", m.moe_jitter, h.moe_jitter, false);
  }
  if (layout.find('M') != std::string::npos) {
    take("mamba_d_state", m.mamba_d_state, h.mamba_d_state);
    take("mamba_d_conv", m.mamba_d_conv, h.mamba_d_conv);
    take("mamba_expand", m.mamba_expand, h.mamba_expand);
    take("mamba_dt_rank", m.mamba_dt_rank, h.mamba_dt_rank);
    take("mamba_conv_bias", m.mamba_conv_bias, h.mamba_conv_bias);
    take("mamba_proj_bias", m.mamba_proj_bias, h.mamba_proj_bias);
  }
  if (layout.find('S') != std::string::npos) {
    for (auto [key, ours, theirs] : {std::tuple{"mamba_d_state", &m.mamba_d_state, h.mamba_d_state},
                                     {"mamba_d_conv", &m.mamba_d_conv, h.mamba_d_conv},
                                     {"mamba_expand", &m.mamba_expand, h.mamba_expand},
                                     {"mamba_head_dim", &m.mamba_head_dim, h.mamba_head_dim},
                                     {"mamba_n_groups", &m.mamba_n_groups, h.mamba_n_groups}})
      take(key, *ours, theirs);
    take("mamba_conv_bias", m.mamba_conv_bias, h.mamba_conv_bias);
    take("mamba_proj_bias", m.mamba_proj_bias, h.mamba_proj_bias);
    take("mamba_dt_limit_min", m.mamba_dt_limit_min, h.mamba_dt_limit_min);
    take("mamba_dt_limit_max", m.mamba_dt_limit_max, h.mamba_dt_limit_max);
  }
}

}  // namespace engine::hf
