// The per-layer block kinds (config.h block_layout): one letter per layer, A attention + MLP,
// E attention + mixture of experts, M Mamba, S Mamba-2, G Gated DeltaNet + MLP; spelled by hybrid_layout where the family takes one,
// else the family's single kind.
#include <algorithm>
#include <cstring>
#include <string>

#include "config/config.h"

namespace engine {

bool takes_hybrid_layout(ModelFamily f) {
  return f == ModelFamily::Hybrid || f == ModelFamily::Qwen2Moe || f == ModelFamily::Qwen3Moe;
}

namespace {
char family_letter(ModelFamily f) {  // of every layer, for the families with one kind of block
  const bool moe = f == ModelFamily::Mixtral || f == ModelFamily::Qwen2Moe || f == ModelFamily::Qwen3Moe;
  return moe ? 'E' : f == ModelFamily::Mamba ? 'M' : f == ModelFamily::Mamba2 ? 'S' : 'A';
}
// The families whose layout hybrid_layout may spell: hybrid (A, E, M), and the mixture-of-experts
// families with dense layers among the sparse ones (A, E; Hugging Face's decoder_sparse_step and
// mlp_only_layers); empty there means every layer E.
bool spelled_layout(const ModelConfig& m) {
  return m.family == ModelFamily::Hybrid || (takes_hybrid_layout(m.family) && !m.hybrid_layout.empty());
}
}  // namespace

std::string block_layout(const ModelConfig& m) {
  if (spelled_layout(m)) return m.hybrid_layout;
  return std::string(static_cast<size_t>(std::max(0, m.num_layers)), family_letter(m.family));
}

char block_letter(const ModelConfig& m, int layer) {
  if (!spelled_layout(m)) return layer >= 0 && layer < m.num_layers ? family_letter(m.family) : 0;
  return layer >= 0 && static_cast<size_t>(layer) < m.hybrid_layout.size() ? m.hybrid_layout[static_cast<size_t>(layer)]
                                                                           : 0;
}

std::string layout_letters_error(const ModelConfig& m) {
  const bool hybrid = m.family == ModelFamily::Hybrid;
  for (size_t i = 0; i < m.hybrid_layout.size(); ++i)
    if (std::string(hybrid ? "AEMSG" : "AE").find(m.hybrid_layout[i]) == std::string::npos)
      return "letter " + std::to_string(i) + " is '" + m.hybrid_layout[i] + "'; " +
             (hybrid ? std::string("expected A (attention + MLP), E (attention + mixture of experts), M (Mamba), S (Mamba-2) or "
                                         "G (Gated DeltaNet + MLP)")
                     : std::string(family_name(m.family)) + " takes A (attention + MLP) or E (attention + mixture of experts)");
  return "";
}

bool has_block_kind(const ModelConfig& m, const char* letters) {
  if (spelled_layout(m)) return m.hybrid_layout.find_first_of(letters) != std::string::npos;
  return m.num_layers > 0 && std::strchr(letters, family_letter(m.family)) != nullptr;
}

}  // namespace engine
