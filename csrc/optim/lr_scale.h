// optimizer.lr_scale (config.h LrScale): per-parameter learning-rate scales by glob patterns over
// parameter names (`*` matches any run of characters, dots included; every other character
// itself). The last matching entry wins; a parameter no entry matches keeps scale 1. AdamW
// applies a parameter's scale to its learning rate (ops::DecayRun::lr_scale), so scale 0 leaves
// the weight unchanged (its moments still advance).
#pragma once
#include <string>

#include "config/config.h"
#include "core/params.h"

namespace engine {

bool glob_match(const std::string& pattern, const std::string& name);
// The scale of parameter `name` (1 when no entry matches).
double lr_scale_of(const OptimizerConfig& o, const std::string& name);
// Every pattern must match a trainable parameter of `full` (the whole model's table): an error
// naming optimizer.lr_scale and the pattern otherwise.
void check_lr_scale_patterns(const Config& c, const ParamTable& full);

}  // namespace engine
