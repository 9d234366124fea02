// model.rope_scaling: the yarn attention factor's default (transformers' get_mscale(factor):
// 0.1 ln(factor) + 1, 1 when factor <= 1), the ranges the formulas need (ops/rope_params.h), and
// the keys each type uses: a key another type uses must keep its default, so that a value set for
// the wrong type is refused, not ignored (the effective config writes every key at its default).
#include <cmath>
#include <string>

#include "config/config.h"
#include "config/config_fields.h"
#include "core/check.h"

namespace engine {
namespace config_detail {

void check_rope_scaling(Config& c) {
  RopeScalingConfig& r = c.model.rope_scaling;
  const std::string prefix = "model.rope_scaling.";
  auto set = [&](const char* key) { return c.is_set(prefix + key); };
  auto where = [&](const char* key) { return c.where(prefix + key); };
  const std::string type = std::string("\"") + enum_name(r.type, names_of(kRopeScalingNames)) + "\"";
  using K = RopeScalingKind;

  if (r.type == K::Yarn && !set("attention_factor"))
    r.attention_factor = r.factor > 1 ? 0.1 * std::log(r.factor) + 1.0 : 1.0;

  // The keys and the types that use them; under any other type a key keeps its default.
  const RopeScalingConfig d;
  const bool llama3 = r.type == K::Llama3, yarn = r.type == K::Yarn;
  struct Use {
    const char* key;
    bool used;
    bool at_default;
    const char* types;
  };
  const Use uses[] = {
      {"factor", r.type != K::None, r.factor == d.factor, "\"linear\", \"llama3\" and \"yarn\""},
      {"low_freq_factor", llama3, r.low_freq_factor == d.low_freq_factor, "\"llama3\""},
      {"high_freq_factor", llama3, r.high_freq_factor == d.high_freq_factor, "\"llama3\""},
      {"original_max_position_embeddings", llama3 || yarn,
       r.original_max_position_embeddings == d.original_max_position_embeddings, "\"llama3\" and \"yarn\""},
      {"beta_fast", yarn, r.beta_fast == d.beta_fast, "\"yarn\""},
      {"beta_slow", yarn, r.beta_slow == d.beta_slow, "\"yarn\""},
      {"attention_factor", yarn, r.attention_factor == d.attention_factor, "\"yarn\""},
      {"truncate", yarn, r.truncate == d.truncate, "\"yarn\""},
  };
  for (const Use& u : uses)
    if (!u.used && !u.at_default)
      RAISE(where(u.key), "is used by type ", u.types, " only (model.rope_scaling.type is ", type,
            "): remove it or set the type");
  if (r.type == K::None) return;

  if (!has_block_kind(c.model, "AE"))
    RAISE(where("type"), type, " scales RoPE, and the model has no attention layers");
  if (c.model.positions != PositionKind::Rope)
    RAISE(where("type"), type, " needs model.positions = \"rope\"");
  if (!set("factor")) RAISE(where("factor"), "required with type = ", type);
  if (!(r.factor > 0)) RAISE(where("factor"), "must be > 0, got ", r.factor);
  if (llama3 || yarn) {
    if (!set("original_max_position_embeddings"))
      RAISE(where("original_max_position_embeddings"), "required with type = ", type,
            " (the context length the model was pretrained with)");
    if (r.original_max_position_embeddings <= 0)
      RAISE(where("original_max_position_embeddings"), "must be > 0, got ", r.original_max_position_embeddings);
  }
  if (llama3) {
    if (!(r.low_freq_factor > 0)) RAISE(where("low_freq_factor"), "must be > 0, got ", r.low_freq_factor);
    if (!(r.high_freq_factor > r.low_freq_factor))
      RAISE(where("high_freq_factor"), "must be > low_freq_factor (", r.low_freq_factor, "), got ",
            r.high_freq_factor);
  }
  if (yarn) {
    if (!(r.beta_fast > 0)) RAISE(where("beta_fast"), "must be > 0, got ", r.beta_fast);
    if (!(r.beta_slow > 0)) RAISE(where("beta_slow"), "must be > 0, got ", r.beta_slow);
    if (!(r.attention_factor > 0)) RAISE(where("attention_factor"), "must be > 0, got ", r.attention_factor);
  }
}

}  // namespace config_detail

ops::RopeParams rope_params(const ModelConfig& m) {
  const RopeScalingConfig& r = m.rope_scaling;
  ops::RopeParams p;
  p.theta = m.rope_theta;
  p.kind = r.type;
  p.factor = r.factor;
  p.low_freq_factor = r.low_freq_factor;
  p.high_freq_factor = r.high_freq_factor;
  p.original_max_position_embeddings = r.original_max_position_embeddings;
  p.beta_fast = r.beta_fast;
  p.beta_slow = r.beta_slow;
  p.truncate = r.truncate;
  p.attention_factor = r.attention_factor;
  return p;
}

}  // namespace engine
