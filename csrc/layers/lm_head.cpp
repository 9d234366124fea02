#include "layers/lm_head.h"

#include "layers/embedding.h"
#include "layers/linear.h"
#include "ops/elementwise.h"
#include "ops/loss.h"

namespace engine::layers {

LmHead::LmHead(const ParamStore& store, const ModelConfig& c)
    : norm_(store, "final_norm", c.norm, static_cast<float>(c.norm_eps), c.bias),
      weight_(store, c.tie_embeddings ? Embedding::kTokens : "head.weight") {}

void LmHead::declare(ParamTable& t, const ModelConfig& c) {
  Norm::declare(t, "final_norm", c.hidden_size, c.norm, c.bias);
  if (!c.tie_embeddings)
    t.add({.name = "head.weight", .shape = {c.vocab_size, c.hidden_size}, .init_std = c.init_std});
}

double LmHead::forward(const Env& env, const Tensor& x, const Tensor& labels, const Tensor& mask,
                         bool with_grad, float grad_scale, HeadSaved& s) const {
  const int64_t T = x.size(0), C = x.size(1), V = weight_.w().size(0);
  Owned xn = env.act_tensor({T, C});
  NormSaved ns;
  norm_.forward(env, x, xn, ns);
  Owned logits = env.act_tensor({T, V});
  linear_forward(xn, weight_.w(), {}, logits);
  Owned losses = env.stat_tensor({T});
  ops::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale);
  const double loss_sum = ops::sum(losses);
  if (with_grad) {
    Owned dxn = env.act_tensor({T, C});
    linear_backward(logits, xn, weight_.w(), dxn, weight_.g(), {});
    s.dx = env.act_tensor({T, C});
    norm_.backward(dxn, x, ns, s.dx);
  }
  return loss_sum;
}

}  // namespace engine::layers
