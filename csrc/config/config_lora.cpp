// [lora] checks (config_detail::check_lora, after finish_config): the ranges, the target names,
// and the models LoRA supports; optimizer.lr_scale's entries (check_lr_scale).
#include <algorithm>
#include <cmath>

#include "config/config_fields.h"
#include "core/check.h"

namespace engine::config_detail {

namespace {
constexpr const char* kTargets[] = {"q", "k", "v", "o", "gate", "up", "down"};
}

void check_lora(Config& c) {
  const LoraConfig& l = c.model.lora;
  if (l.rank < 0) RAISE(c.where("lora.rank"), "must be >= 0 (0: off), got ", l.rank);
  if (l.rank == 0) return;
  if (!(l.alpha > 0)) RAISE(c.where("lora.alpha"), "must be > 0 (the scale is alpha / rank), got ", l.alpha);
  if (l.targets.empty()) RAISE(c.where("lora.targets"), "must name at least one module with lora.rank > 0");
  std::string allowed;
  for (const char* t : kTargets) allowed += std::string(allowed.empty() ? "" : ", ") + "\"" + t + "\"";
  const bool glu = c.model.activation == ActivationKind::SwiGLU;
  for (size_t i = 0; i < l.targets.size(); ++i) {
    const std::string& t = l.targets[i];
    if (std::find(std::begin(kTargets), std::end(kTargets), t) == std::end(kTargets))
      RAISE(c.where("lora.targets"), "unknown module \"", t, "\" (allowed: ", allowed, ")");
    if (std::find(l.targets.begin(), l.targets.begin() + static_cast<long>(i), t) != l.targets.begin() + static_cast<long>(i))
      RAISE(c.where("lora.targets"), "\"", t, "\" is named twice");
    if (!glu && (t == "gate" || t == "up" || t == "down"))
      RAISE(c.where("lora.targets"), "\"", t, "\" needs a SwiGLU MLP (model.activation \"swiglu\"); the GELU MLP's "
            "linears take no adapters");
  }
  const std::string layout = block_layout(c.model);
  if (layout.find_first_not_of('A') != std::string::npos)
    RAISE(c.where("lora.rank"), "LoRA supports attention + MLP blocks only; this model's layout \"", layout,
          "\" has mixture-of-experts (E), Mamba (M), Mamba-2 (S) or Gated DeltaNet (G) blocks");
  if (c.model.lora.rank > c.model.hidden_size)
    RAISE(c.where("lora.rank"), "must not exceed model.hidden_size (", c.model.hidden_size, "), got ", l.rank);
}

void check_lr_scale(Config& c) {
  const std::vector<LrScale>& v = c.optimizer.lr_scale;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = str_cat(c.where("optimizer.lr_scale"), "element ", i, ": ");
    if (v[i].pattern.empty()) RAISE(at, "pattern must not be empty");
    if (!std::isfinite(v[i].scale) || v[i].scale < 0)
      RAISE(at, "scale of \"", v[i].pattern, "\" must be a finite number >= 0, got ", v[i].scale);
  }
}

}  // namespace engine::config_detail
