#include "layers/mlp.h"

#include <cmath>

#include "layers/linear.h"
#include "ops/activation.h"

namespace engine::layers {

Mlp::Mlp(const ParamStore& store, const std::string& prefix, const ModelConfig& c)
    : act_(c.activation), ffn_(c.ffn_hidden_size) {
  if (act_ == ActivationKind::SwiGLU)
    w_in_ = adjacent_rows(store, {prefix + ".w_gate", prefix + ".w_up"});
  else
    w_in_ = Param(store, prefix + ".w_in");
  w_out_ = Param(store, prefix + ".w_out");
  if (c.bias) {
    b_in_ = act_ == ActivationKind::SwiGLU ? adjacent_rows(store, {prefix + ".b_gate", prefix + ".b_up"})
                                           : Param(store, prefix + ".b_in");
    b_out_ = Param(store, prefix + ".b_out");
  }
}

void Mlp::declare(ParamTable& t, const std::string& prefix, const ModelConfig& c) {
  const int64_t C = c.hidden_size, F = c.ffn_hidden_size;
  const double out_std = c.init_std / std::sqrt(2.0 * c.num_layers);
  const bool glu = c.activation == ActivationKind::SwiGLU;
  if (glu) {
    t.add({.name = prefix + ".w_gate", .shape = {F, C}, .init_std = c.init_std});
    t.add({.name = prefix + ".w_up", .shape = {F, C}, .init_std = c.init_std, .adjacent = true});
  } else {
    t.add({.name = prefix + ".w_in", .shape = {F, C}, .init_std = c.init_std});
  }
  t.add({.name = prefix + ".w_out", .shape = {C, F}, .init_std = out_std});
  if (c.bias) {
    if (glu) {
      t.add({.name = prefix + ".b_gate", .shape = {F}, .init = InitKind::Zeros, .weight_decay = false});
      t.add({.name = prefix + ".b_up", .shape = {F}, .init = InitKind::Zeros, .weight_decay = false, .adjacent = true});
    } else {
      t.add({.name = prefix + ".b_in", .shape = {F}, .init = InitKind::Zeros, .weight_decay = false});
    }
    t.add({.name = prefix + ".b_out", .shape = {C}, .init = InitKind::Zeros, .weight_decay = false});
  }
}

void Mlp::forward(const Env& env, const Tensor& xn, const Tensor& y, MlpSaved& s) const {
  const int64_t T = xn.size(0);
  const bool glu = act_ == ActivationKind::SwiGLU;
  s.h = env.act_tensor({T, glu ? 2 * ffn_ : ffn_});
  s.a = env.act_tensor({T, ffn_});
  linear_forward(xn, w_in_.w(), b_in_.w(), s.h);
  if (glu)
    ops::swiglu_forward(s.h, s.a);
  else
    ops::gelu_forward(s.h, s.a);
  linear_forward(s.a, w_out_.w(), b_out_.w(), y);
}

void Mlp::backward(const Env& env, const Tensor& dy, const Tensor& xn, const MlpSaved& s,
                   const Tensor& dxn) const {
  Owned da = env.act_tensor(s.a->shape);
  linear_backward(dy, s.a, w_out_.w(), da, w_out_.g(), b_out_.g());
  Owned dh = env.act_tensor(s.h->shape);
  if (act_ == ActivationKind::SwiGLU)
    ops::swiglu_backward(da, s.h, dh);
  else
    ops::gelu_backward(da, s.h, dh);
  linear_backward(dh, xn, w_in_.w(), dxn, w_in_.g(), b_in_.g());
}

}  // namespace engine::layers
