// Learning-rate schedule: linear warmup from 0 to lr over warmup_steps, then decay to min_lr
// over decay_steps (cosine, linear or none), then min_lr. Steps count from 1 (the first update).
#pragma once
#include "config/config.h"

namespace engine {

double learning_rate(const OptimizerConfig& o, int step);

}  // namespace engine
