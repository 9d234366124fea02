#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace engine {

double learning_rate(const OptimizerConfig& o, int step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps)
    return o.lr * static_cast<double>(step) / o.warmup_steps;
  if (o.decay == DecayKind::Constant) return o.lr;
  const int into = step - o.warmup_steps;
  if (o.decay_steps <= 0 || into >= o.decay_steps) return o.min_lr;
  const double frac = std::clamp(static_cast<double>(into) / o.decay_steps, 0.0, 1.0);
  const double shape = o.decay == DecayKind::Cosine ? 0.5 * (1.0 + std::cos(M_PI * frac)) : 1.0 - frac;
  return o.min_lr + (o.lr - o.min_lr) * shape;
}

}  // namespace engine
