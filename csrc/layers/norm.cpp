#include "layers/norm.h"

#include "ops/norm.h"

namespace engine::layers {

Norm::Norm(const ParamStore& store, const std::string& prefix, NormKind kind, float eps, bool bias)
    : kind_(kind), eps_(eps), weight_(store, prefix + ".weight") {
  if (kind == NormKind::LayerNorm && bias) bias_ = Param(store, prefix + ".bias");
}

void Norm::declare(ParamTable& t, const std::string& prefix, int64_t hidden, NormKind kind, bool bias) {
  t.add({.name = prefix + ".weight", .shape = {hidden}, .init = InitKind::Ones, .weight_decay = false});
  if (kind == NormKind::LayerNorm && bias)
    t.add({.name = prefix + ".bias", .shape = {hidden}, .init = InitKind::Zeros, .weight_decay = false});
}

void Norm::forward(const Env& env, const Tensor& x, const Tensor& y, NormSaved& s, const Tensor& amax) const {
  const int64_t T = x.rows().size(0);
  s.rstd = env.stat_tensor({T});
  if (kind_ == NormKind::LayerNorm) {
    s.mean = env.stat_tensor({T});
    ops::layernorm_forward(x.rows(), weight_.w(), bias_.w(), eps_, y.rows(), s.mean, s.rstd, amax);
  } else {
    ops::rmsnorm_forward(x.rows(), weight_.w(), eps_, y.rows(), s.rstd, amax);
  }
}

namespace {
// The norm ops always write their weight (and bias) gradients: a frozen parameter's go to a
// scratch of its length, dropped after the call.
Tensor grad_or_scratch(const Param& p, const Tensor& like, Owned& scratch) {
  if (!p || !p.frozen) return p.g();
  scratch = zeros(p.shape, like.dtype == DType::F64 ? DType::F64 : DType::F32, like.device);
  return scratch;
}
}  // namespace

void Norm::backward(const Tensor& dy, const Tensor& x, const NormSaved& s, const Tensor& dx) const {
  Owned sw, sb;
  if (kind_ == NormKind::LayerNorm)
    ops::layernorm_backward(dy.rows(), x.rows(), weight_.w(), s.mean, s.rstd, dx.rows(), grad_or_scratch(weight_, dy, sw), grad_or_scratch(bias_, dy, sb));
  else
    ops::rmsnorm_backward(dy.rows(), x.rows(), weight_.w(), s.rstd, dx.rows(), grad_or_scratch(weight_, dy, sw));
}

void Norm::forward_residual(const Env& env, const Tensor& x, const Tensor& residual,
                            const Tensor& sum, const Tensor& y, NormSaved& s, const Tensor& amax) const {
  const int64_t T = x.rows().size(0);
  s.rstd = env.stat_tensor({T});
  if (kind_ == NormKind::LayerNorm) {
    s.mean = env.stat_tensor({T});
    ops::layernorm_residual_forward(x.rows(), residual.rows(), weight_.w(), bias_.w(), eps_,
                                    sum.rows(), y.rows(), s.mean, s.rstd, amax);
  } else {
    ops::rmsnorm_residual_forward(x.rows(), residual.rows(), weight_.w(), eps_, sum.rows(),
                                  y.rows(), s.rstd, amax);
  }
}

void Norm::backward_residual(const Tensor& dy, const Tensor& x, const NormSaved& s,
                             const Tensor& dresidual, const Tensor& dx,
                             const Tensor& dx_colsum) const {
  Owned sw, sb;
  if (kind_ == NormKind::LayerNorm)
    ops::layernorm_residual_backward(dy.rows(), x.rows(), weight_.w(), s.mean, s.rstd,
                                     dresidual.rows(), dx.rows(), grad_or_scratch(weight_, dy, sw), grad_or_scratch(bias_, dy, sb),
                                     dx_colsum);
  else
    ops::rmsnorm_residual_backward(dy.rows(), x.rows(), weight_.w(), s.rstd, dresidual.rows(),
                                   dx.rows(), grad_or_scratch(weight_, dy, sw), dx_colsum);
}

}  // namespace engine::layers
