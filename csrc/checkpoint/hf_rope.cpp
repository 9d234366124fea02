// config.json's RoPE keys (hf_rope.h). The scaling dict's keys per rope_type are those
// transformers' _compute_*_parameters read; any other key is refused (mscale and mscale_all_dim,
// DeepSeek's attention scale terms, included), as are rope types without an engine formula.
// yarn's attention_factor is written out on export (and computed on import when missing, as
// transformers does: 0.1 ln(factor) + 1), so that every transformers version reads one value.
#include "checkpoint/hf_rope.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <set>

#include "core/check.h"

namespace engine::hf {
namespace {

using json = nlohmann::ordered_json;
using K = RopeScalingKind;

struct RopeDict {
  RopeScalingConfig scaling;
  std::optional<double> theta;  // its rope_theta (5.x)
};

const char* hf_type_name(K k) {
  switch (k) {
    case K::None: return "default";
    case K::Linear: return "linear";
    case K::Llama3: return "llama3";
    case K::Yarn: return "yarn";
  }
  return "default";
}

// One scaling dict: config.json's `name` (rope_scaling or rope_parameters).
RopeDict read_dict(const json& r, const std::string& path, const char* name, int64_t max_position_embeddings) {
  const std::string at = path + ": " + name;
  if (!r.is_object()) RAISE(at, ": expected an object, got ", r.dump());
  auto has = [&](const char* k) { return r.contains(k) && !r[k].is_null(); };
  auto number = [&](const char* k) {
    if (!r[k].is_number()) RAISE(at, ".", k, ": expected a number, got ", r[k].dump());
    const double v = r[k].get<double>();
    if (!std::isfinite(v)) RAISE(at, ".", k, ": must be finite, got ", r[k].dump());
    return v;
  };
  auto positive = [&](const char* k, double v) {
    if (!(v > 0)) RAISE(at, ".", k, ": must be > 0, got ", v);
  };

  std::string type = "default";
  for (const char* k : {"type", "rope_type"}) {  // rope_type is the current name, type the legacy one
    if (!has(k)) continue;
    if (!r[k].is_string()) RAISE(at, ".", k, ": expected a string, got ", r[k].dump());
    if (has("type") && has("rope_type") && r["type"] != r["rope_type"])
      RAISE(at, ": rope_type ", r["rope_type"].dump(), " and type ", r["type"].dump(), " disagree");
    type = r[k].get<std::string>();
  }
  RopeDict d;
  RopeScalingConfig& s = d.scaling;
  std::set<std::string> keys = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type == "default") {
    s.type = K::None;
  } else if (type == "linear") {
    s.type = K::Linear;
    keys.insert("factor");
  } else if (type == "llama3") {
    s.type = K::Llama3;
    keys.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (type == "yarn") {
    s.type = K::Yarn;
    keys.insert({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                 "truncate"});
  } else {
    RAISE(at, ".rope_type: \"", type, "\" is not supported (default, linear, llama3 or yarn)");
  }
  for (const auto& [k, v] : r.items()) {
    if (v.is_null() || keys.count(k)) continue;
    if (k == "mscale" || k == "mscale_all_dim")
      RAISE(at, ".", k, ": not supported (yarn's attention factor is taken from attention_factor or "
            "0.1 ln(factor) + 1)");
    RAISE(at, ".", k, ": not supported with rope_type \"", type, "\"");
  }
  if (has("rope_theta")) {
    d.theta = number("rope_theta");
    positive("rope_theta", *d.theta);
  }
  if (has("partial_rotary_factor") && number("partial_rotary_factor") != 1.0)
    RAISE(at, ".partial_rotary_factor: ", r["partial_rotary_factor"].dump(), " is not supported (only 1)");
  if (s.type == K::None) return d;

  auto required = [&](const char* k) {
    if (!has(k)) RAISE(at, ".", k, ": required with rope_type \"", type, "\"");
    return number(k);
  };
  s.factor = required("factor");
  positive("factor", s.factor);
  if (s.type == K::Linear) return d;
  auto context = [&](double v) {
    if (!(v > 0 && v <= INT32_MAX && v == std::floor(v)))
      RAISE(at, ".original_max_position_embeddings: expected a positive integer, got ", v);
    return static_cast<int>(v);
  };
  if (s.type == K::Llama3) {
    s.low_freq_factor = required("low_freq_factor");
    s.high_freq_factor = required("high_freq_factor");
    s.original_max_position_embeddings = context(required("original_max_position_embeddings"));
    positive("low_freq_factor", s.low_freq_factor);
    if (!(s.high_freq_factor > s.low_freq_factor))
      RAISE(at, ".high_freq_factor: must be > low_freq_factor (", s.low_freq_factor, "), got ", s.high_freq_factor);
    return d;
  }
  // yarn: transformers takes max_position_embeddings when original_max_position_embeddings is
  // missing, and beta_fast / beta_slow 32 / 1.
  s.original_max_position_embeddings = context(has("original_max_position_embeddings")
                                                   ? number("original_max_position_embeddings")
                                                   : static_cast<double>(max_position_embeddings));
  if (has("beta_fast")) s.beta_fast = number("beta_fast");
  if (has("beta_slow")) s.beta_slow = number("beta_slow");
  positive("beta_fast", s.beta_fast);
  positive("beta_slow", s.beta_slow);
  s.attention_factor = has("attention_factor") ? number("attention_factor")
                       : s.factor > 1          ? 0.1 * std::log(s.factor) + 1.0
                                               : 1.0;
  positive("attention_factor", s.attention_factor);
  if (has("truncate")) {
    if (!r["truncate"].is_boolean()) RAISE(at, ".truncate: expected true or false, got ", r["truncate"].dump());
    s.truncate = r["truncate"].get<bool>();
  }
  return d;
}

}  // namespace

HfRope rope_from_hf(const json& j, const std::string& path, double theta, int64_t max_position_embeddings) {
  HfRope out;
  out.theta = theta;
  if (j.contains("rope_theta") && !j["rope_theta"].is_null()) {
    if (!j["rope_theta"].is_number()) RAISE(path, ": rope_theta: expected a number, got ", j["rope_theta"].dump());
    out.theta = j["rope_theta"].get<double>();
  }
  std::optional<RopeDict> dicts[2];
  const char* names[2] = {"rope_parameters", "rope_scaling"};
  for (int i = 0; i < 2; ++i)
    if (j.contains(names[i]) && !j[names[i]].is_null())
      dicts[i] = read_dict(j[names[i]], path, names[i], max_position_embeddings);
  if (dicts[0] && dicts[1] && !(dicts[0]->scaling == dicts[1]->scaling))
    RAISE(path, ": rope_parameters (rope_type \"", hf_type_name(dicts[0]->scaling.type), "\") and rope_scaling "
          "(rope_type \"", hf_type_name(dicts[1]->scaling.type), "\") describe different scalings");
  for (int i = 1; i >= 0; --i) {  // rope_parameters' rope_theta wins
    if (!dicts[i]) continue;
    out.scaling = dicts[i]->scaling;
    if (dicts[i]->theta) out.theta = *dicts[i]->theta;
  }
  return out;
}

void rope_to_hf(json& j, const ModelConfig& c) {
  const RopeScalingConfig& s = c.rope_scaling;
  json scaling = {{"rope_type", hf_type_name(s.type)}};
  if (s.type != K::None) scaling["factor"] = s.factor;
  if (s.type == K::Llama3) {
    scaling["low_freq_factor"] = s.low_freq_factor;
    scaling["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.type == K::Llama3 || s.type == K::Yarn)
    scaling["original_max_position_embeddings"] = s.original_max_position_embeddings;
  if (s.type == K::Yarn) {
    scaling["beta_fast"] = s.beta_fast;
    scaling["beta_slow"] = s.beta_slow;
    scaling["attention_factor"] = s.attention_factor;
    scaling["truncate"] = s.truncate;
  }
  j["rope_theta"] = c.rope_theta;
  json params = {{"rope_type", hf_type_name(s.type)}, {"rope_theta", c.rope_theta}};
  for (const auto& [k, v] : scaling.items())
    if (k != "rope_type") params[k] = v;
  j["rope_parameters"] = params;
  if (s.type != K::None) j["rope_scaling"] = scaling;
}

}  // namespace engine::hf
