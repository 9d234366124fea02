#include "optim/adamw.h"

#include <cmath>

#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "optim/schedule.h"

namespace engine {

AdamW::AdamW(ParamStore& store, const OptimizerConfig& config) : store_(store), config_(config) {
  const int64_t n = store.table().total_elements();
  m_ = zeros({n}, DType::F32, store.device());
  v_ = zeros({n}, DType::F32, store.device());
  for (const ParamSpec& s : store.table().entries()) {
    const int64_t b = s.offset, e = s.offset + s.shape.numel();
    if (!runs_.empty() && runs_.back().decay == s.weight_decay && runs_.back().end <= b)
      runs_.back().end = e;  // alignment gaps are zero everywhere: updating them is harmless
    else
      runs_.push_back({b, e, s.weight_decay});
  }
}

StepStats AdamW::step(int step) {
  StepStats st;
  st.lr = learning_rate(config_, step);
  st.grad_norm = grad_norm(store_.grads_flat());
  if (config_.grad_clip > 0 && st.grad_norm > config_.grad_clip)
    st.clip_scale = config_.grad_clip / (st.grad_norm + 1e-6);
  ops::AdamWParams p;
  p.lr = static_cast<float>(st.lr);
  p.beta1 = static_cast<float>(config_.beta1);
  p.beta2 = static_cast<float>(config_.beta2);
  p.eps = static_cast<float>(config_.eps);
  p.step = step;
  p.grad_scale = static_cast<float>(st.clip_scale);
  const bool copy = !store_.master_aliases_weights();
  for (const Run& r : runs_) {
    p.weight_decay = r.decay ? static_cast<float>(config_.weight_decay) : 0.f;
    ops::adamw_step(store_.master_flat().slice(r.begin, r.end), store_.grads_flat().slice(r.begin, r.end),
                    m_->slice(r.begin, r.end), v_->slice(r.begin, r.end), p,
                    copy ? store_.weights_flat().slice(r.begin, r.end) : Tensor{});
  }
  return st;
}

double grad_norm(const Tensor& grads) { return std::sqrt(ops::sum_squares(grads)); }

}  // namespace engine
