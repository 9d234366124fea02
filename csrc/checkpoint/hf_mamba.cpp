#include "checkpoint/hf_mamba.h"

#include <cmath>

#include "core/check.h"

namespace engine::hf {

namespace {

using json = nlohmann::ordered_json;

constexpr const char* kNonFinite[] = {"-Infinity", "Infinity", "NaN"};

bool has(const json& j, const char* k) { return j.contains(k) && !j[k].is_null(); }

int64_t integer(const json& j, const std::string& path, const char* k, int64_t def, bool required = false) {
  if (!has(j, k)) {
    if (required) RAISE(path, ": ", k, ": required, missing");
    return def;
  }
  if (!j[k].is_number_integer()) RAISE(path, ": ", k, ": expected an integer, got ", j[k].dump());
  const int64_t v = j[k].get<int64_t>();
  if (v <= 0 || v > INT32_MAX) RAISE(path, ": ", k, ": must be in [1, 2^31), got ", v);
  return v;
}

bool boolean(const json& j, const std::string& path, const char* k, bool def) {
  if (!has(j, k)) return def;
  if (!j[k].is_boolean()) RAISE(path, ": ", k, ": expected true or false, got ", j[k].dump());
  return j[k].get<bool>();
}

double number(const json& j, const std::string& path, const char* k, double def) {
  if (!has(j, k)) return def;
  if (!j[k].is_number()) RAISE(path, ": ", k, ": expected a number, got ", j[k].dump());
  return j[k].get<double>();
}

std::string string(const json& j, const std::string& path, const char* k, const std::string& def) {
  if (!has(j, k)) return def;
  if (!j[k].is_string()) RAISE(path, ": ", k, ": expected a string, got ", j[k].dump());
  return j[k].get<std::string>();
}

// hidden_act: silu only (both mixers' activation).
void need_silu(const json& j, const std::string& path) {
  const std::string act = string(j, path, "hidden_act", "silu");
  if (act != "silu") RAISE(path, ": hidden_act \"", act, "\" is not supported (silu)");
}

// The keys of a model without attention as the config validation leaves them (unused), and the
// residual norms.
void no_attention(const json& j, const std::string& path, ModelConfig& c, bool tied_default) {
  c.norm = NormKind::RMSNorm;
  c.norm_eps = number(j, path, "layer_norm_epsilon", 1e-5);
  c.tie_embeddings = boolean(j, path, "tie_word_embeddings", tied_default);
  c.num_heads = 1;
  c.num_kv_heads = 1;
  c.head_dim = c.hidden_size;
  c.ffn_hidden_size = static_cast<int>(256 * ((8 * int64_t{c.hidden_size} / 3 + 255) / 256));
  c.activation = ActivationKind::SwiGLU;
  c.positions = PositionKind::Rope;
}

// An element of time_step_limit: a number, the string "Infinity" (json_nonfinite_as_strings) or
// {"__float__": "Infinity"} (how transformers 5's save_pretrained writes a non-finite float).
double limit_value(const json& v, const std::string& path) {
  if (v.is_number()) return v.get<double>();
  if (v == "Infinity" || (v.is_object() && v.size() == 1 && v.contains("__float__") && v["__float__"] == "Infinity"))
    return INFINITY;
  RAISE(path, ": time_step_limit: expected [min, max] numbers (max may be Infinity), got element ", v.dump());
}

}  // namespace

std::string json_nonfinite_as_strings(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size();) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < text.size()) out += text[++i];
      else if (ch == '"') in_string = false;
      ++i;
      continue;
    }
    if (ch == '"') {
      in_string = true;
      out += ch;
      ++i;
      continue;
    }
    bool replaced = false;
    for (const char* token : kNonFinite) {
      const std::string t(token);
      if (text.compare(i, t.size(), t) == 0) {
        out += "\"" + t + "\"";
        i += t.size();
        replaced = true;
        break;
      }
    }
    if (!replaced) out += text[i++];
  }
  return out;
}

std::string json_nonfinite_as_tokens(const std::string& text) {
  std::string out = text;
  for (const char* token : kNonFinite) {
    const std::string quoted = "\"" + std::string(token) + "\"";
    for (size_t at = out.find(quoted); at != std::string::npos; at = out.find(quoted, at))
      out.replace(at, quoted.size(), token);
  }
  return out;
}

void mamba_config_to_hf(const ModelConfig& c, json& j) {
  j["hidden_size"] = c.hidden_size;
  j["state_size"] = c.mamba_d_state;
  j["num_hidden_layers"] = c.num_layers;
  j["conv_kernel"] = c.mamba_d_conv;
  j["expand"] = c.mamba_expand;
  j["intermediate_size"] = int64_t{c.mamba_expand} * c.hidden_size;
  j["time_step_rank"] = c.mamba_dt_rank > 0 ? c.mamba_dt_rank : (c.hidden_size + 15) / 16;
  j["use_conv_bias"] = c.mamba_conv_bias;
  j["use_bias"] = c.mamba_proj_bias;
  j["hidden_act"] = "silu";
  j["layer_norm_epsilon"] = c.norm_eps;
  j["residual_in_fp32"] = true;
  j["rescale_prenorm_residual"] = false;
  // The dt init (ours: layers/mamba.h MambaConfig's defaults), as MambaConfig's defaults.
  j["time_step_scale"] = 1.0;
  j["time_step_min"] = 0.001;
  j["time_step_max"] = 0.1;
  j["time_step_init_scheme"] = "random";
  j["time_step_floor"] = 1e-4;
  j["use_mambapy"] = false;
  j["pad_token_id"] = nullptr;
}

void mamba_config_from_hf(const json& j, const std::string& path, ModelConfig& c) {
  c.family = ModelFamily::Mamba;
  c.vocab_size = static_cast<int>(integer(j, path, "vocab_size", 0, true));
  c.hidden_size = static_cast<int>(integer(j, path, "hidden_size", 0, true));
  c.num_layers = static_cast<int>(integer(j, path, "num_hidden_layers", 0, true));
  c.mamba_d_state = static_cast<int>(integer(j, path, "state_size", 16));
  c.mamba_d_conv = static_cast<int>(integer(j, path, "conv_kernel", 4));
  c.mamba_expand = static_cast<int>(integer(j, path, "expand", 2));
  const int64_t inner = integer(j, path, "intermediate_size", int64_t{c.mamba_expand} * c.hidden_size);
  if (inner != int64_t{c.mamba_expand} * c.hidden_size)
    RAISE(path, ": intermediate_size ", inner, " is not expand x hidden_size (", c.mamba_expand, " x ",
          c.hidden_size, ")");
  if (j.contains("time_step_rank") && j["time_step_rank"] == "auto")
    c.mamba_dt_rank = (c.hidden_size + 15) / 16;  // MambaConfig's "auto": ceil(hidden_size / 16)
  else
    c.mamba_dt_rank = static_cast<int>(integer(j, path, "time_step_rank", (c.hidden_size + 15) / 16));
  c.mamba_conv_bias = boolean(j, path, "use_conv_bias", true);
  c.mamba_proj_bias = boolean(j, path, "use_bias", false);
  need_silu(j, path);
  no_attention(j, path, c, true);
}

void mamba2_config_to_hf(const ModelConfig& c, json& j) {
  const int64_t inner = int64_t{c.mamba_expand} * c.hidden_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["state_size"] = c.mamba_d_state;
  j["expand"] = c.mamba_expand;
  j["num_heads"] = inner / c.mamba_head_dim;
  j["head_dim"] = c.mamba_head_dim;
  j["n_groups"] = c.mamba_n_groups;
  j["conv_kernel"] = c.mamba_d_conv;
  j["use_conv_bias"] = c.mamba_conv_bias;
  j["use_bias"] = c.mamba_proj_bias;
  j["hidden_act"] = "silu";
  j["rms_norm"] = true;
  j["layer_norm_epsilon"] = c.norm_eps;
  j["residual_in_fp32"] = true;
  j["rescale_prenorm_residual"] = false;
  j["time_step_rank"] = (c.hidden_size + 15) / 16;  // Mamba2Config's "auto" (the mixer does not use it)
  // The dt init (layers/mamba2.h Mamba2Config's defaults), as Mamba2Config's defaults.
  j["time_step_min"] = 0.001;
  j["time_step_max"] = 0.1;
  j["time_step_floor"] = 1e-4;
  j["time_step_limit"] = {c.mamba_dt_limit_min, c.mamba_dt_limit_max > 0 ? json(c.mamba_dt_limit_max) : json("Infinity")};
  j["chunk_size"] = 256;
  j["pad_token_id"] = nullptr;
}

void mamba2_config_from_hf(const json& j, const std::string& path, ModelConfig& c) {
  c.family = ModelFamily::Mamba2;
  c.vocab_size = static_cast<int>(integer(j, path, "vocab_size", 0, true));
  c.hidden_size = static_cast<int>(integer(j, path, "hidden_size", 0, true));
  c.num_layers = static_cast<int>(integer(j, path, "num_hidden_layers", 0, true));
  c.mamba_d_state = static_cast<int>(integer(j, path, "state_size", 128));
  c.mamba_expand = static_cast<int>(integer(j, path, "expand", 2));
  c.mamba_d_conv = static_cast<int>(integer(j, path, "conv_kernel", 4));
  c.mamba_head_dim = static_cast<int>(integer(j, path, "head_dim", 64));
  c.mamba_n_groups = static_cast<int>(integer(j, path, "n_groups", 8));
  const int64_t inner = int64_t{c.mamba_expand} * c.hidden_size;
  const int64_t heads = integer(j, path, "num_heads", 128);
  if (heads * c.mamba_head_dim != inner)
    RAISE(path, ": num_heads (", heads, ") x head_dim (", c.mamba_head_dim, ") must be expand x hidden_size (",
          c.mamba_expand, " x ", c.hidden_size, " = ", inner, ")");
  if (heads % c.mamba_n_groups != 0)
    RAISE(path, ": n_groups (", c.mamba_n_groups, ") must divide num_heads (", heads, ")");
  c.mamba_conv_bias = boolean(j, path, "use_conv_bias", true);
  c.mamba_proj_bias = boolean(j, path, "use_bias", false);
  if (!boolean(j, path, "rms_norm", true))
    RAISE(path, ": rms_norm = false is not supported (the engine's Mamba-2 always has the gated RMSNorm)");
  if (boolean(j, path, "norm_before_gate", false))
    RAISE(path, ": norm_before_gate = true is not supported (Mamba2Mixer gates before the norm)");
  need_silu(j, path);
  if (has(j, "time_step_limit")) {
    const json& l = j["time_step_limit"];
    if (!l.is_array() || l.size() != 2)
      RAISE(path, ": time_step_limit: expected [min, max], got ", l.dump());
    const double lo = limit_value(l[0], path), hi = limit_value(l[1], path);
    if (!(lo >= 0 && std::isfinite(lo) && hi >= lo))
      RAISE(path, ": time_step_limit: [", lo, ", ", hi, "] is not a range of non-negative values");
    if (hi == 0) RAISE(path, ": time_step_limit: max 0 would clamp every step size to 0");
    c.mamba_dt_limit_min = lo;
    c.mamba_dt_limit_max = std::isinf(hi) ? 0.0 : hi;
  }
  no_attention(j, path, c, false);
}

}  // namespace engine::hf
