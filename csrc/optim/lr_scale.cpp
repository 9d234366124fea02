#include "optim/lr_scale.h"

#include <vector>

#include "core/check.h"

namespace engine {

bool glob_match(const std::string& pattern, const std::string& name) {
  // Greedy with backtracking to the last '*': linear in practice, O(|p| |n|) at worst.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

double lr_scale_of(const OptimizerConfig& o, const std::string& name) {
  double s = 1.0;
  for (const LrScale& e : o.lr_scale)
    if (glob_match(e.pattern, name)) s = e.scale;
  return s;
}

void check_lr_scale_patterns(const Config& c, const ParamTable& full) {
  const std::vector<LrScale>& v = c.optimizer.lr_scale;
  for (size_t i = 0; i < v.size(); ++i) {
    bool trainable = false, frozen = false;
    for (const ParamSpec& s : full.entries())
      if (glob_match(v[i].pattern, s.name)) (s.frozen ? frozen : trainable) = true;
    if (!trainable)
      RAISE(c.where("optimizer.lr_scale"), "element ", i, ": pattern \"", v[i].pattern, "\" matches no ",
            frozen ? "trainable parameter (only frozen ones: lora.rank > 0 freezes the base)" : "parameter",
            " (names as in docs/ARCHITECTURE.md, e.g. layers.0.attn.wq; `*` matches any run of characters)");
  }
}

}  // namespace engine
