// AdamW over a model's flat buffers. Weight decay applies to parameters whose spec asks for it
// (matrices and embeddings), never to norms and biases; the flat buffer is split into maximal
// runs of equal decay so the update is a handful of calls, not one per tensor. Global grad-norm
// clipping is folded into the update as a gradient scale. Moments are f32 buffers laid out like
// the parameters (ZeRO later shards exactly these ranges).
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "core/params.h"

namespace engine {

struct StepStats {
  double grad_norm = 0;  // before clipping
  double clip_scale = 1;
  double lr = 0;
};

class AdamW {
 public:
  AdamW(ParamStore& store, const OptimizerConfig& config);
  // One update from the gradients in the store (step counts from 1). Returns the statistics.
  StepStats step(int step);
  const Tensor& exp_avg() const { return m_.t; }
  const Tensor& exp_avg_sq() const { return v_.t; }

 private:
  struct Run {
    int64_t begin = 0, end = 0;
    bool decay = true;
  };
  ParamStore& store_;
  OptimizerConfig config_;
  Owned m_, v_;
  std::vector<Run> runs_;
};

// Global L2 norm of a gradient buffer (f64 accumulation).
double grad_norm(const Tensor& grads);

}  // namespace engine
