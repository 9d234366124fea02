// Final norm, output projection to the vocabulary and cross-entropy, run forward and backward
// in one call: the logits (T, V) exist only inside forward(), where the loss gradient is
// written over them in place and immediately projected back, so what is kept for the backward pass is
// the (T, C) input gradient, never the logits.
//   xn = norm(x);  logits = xn W^T  (W = the token embedding when tied);  losses = CE(logits)
// Gradients: W's accumulate (+=) during forward (with_grad); HeadSaved::dx is the gradient
// w.r.t. x that the blocks' backward starts from.
#pragma once
#include "config/config.h"
#include "layers/common.h"
#include "layers/norm.h"

namespace engine::layers {

struct HeadSaved {
  Owned dx;  // (T, C), the gradient of the loss w.r.t. the head's input
};


class LmHead {
 public:
  LmHead() = default;
  LmHead(const ParamStore& store, const ModelConfig& c);
  static void declare(ParamTable& t, const ModelConfig& c);

  // grad_scale multiplies the loss gradient (1 / loss tokens of the global batch).
  // Returns the sum of the per-token losses over the loss mask.
  double forward(const Env& env, const Tensor& x, const Tensor& labels, const Tensor& mask,
                   bool with_grad, float grad_scale, HeadSaved& s) const;

 private:
  Norm norm_;
  Param weight_;
};

}  // namespace engine::layers
