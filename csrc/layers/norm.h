// LayerNorm or RMSNorm over the hidden dimension (ops/norm.h has the formulas).
// Saved: the statistics (mean for LayerNorm, rstd). The input x is kept by the caller.
// Gradients: dx written (=); weight and bias gradients accumulated (+=).
// Residual forms (pre-norm residual stream, ops/norm.h *_residual_*): forward_residual normalises
// sum = x + residual and writes sum (the caller keeps it as the norm's input for backward);
// backward_residual writes dx = (the norm's input gradient) + dresidual. As the separate
// ops::add / add_inplace and the plain forms (bitwise on the CPU; within f32 rounding on the GPU). sum may alias x or residual (y not sum); dx may
// alias dresidual.
#pragma once
#include "config/config.h"
#include "layers/common.h"

namespace engine::layers {

struct NormSaved {
  Owned mean, rstd;  // (T)
};

class Norm {
 public:
  Norm() = default;
  Norm(const ParamStore& store, const std::string& prefix, NormKind kind, float eps, bool bias);
  // Declares prefix.weight (ones) and, for LayerNorm with bias, prefix.bias (zeros).
  static void declare(ParamTable& t, const std::string& prefix, int64_t hidden, NormKind kind, bool bias);

  // amax (optional, one f32): y's FP8 amax, written with y (ops/norm.h).
  void forward(const Env& env, const Tensor& x, const Tensor& y, NormSaved& s, const Tensor& amax = {}) const;
  void backward(const Tensor& dy, const Tensor& x, const NormSaved& s, const Tensor& dx) const;
  void forward_residual(const Env& env, const Tensor& x, const Tensor& residual, const Tensor& sum,
                        const Tensor& y, NormSaved& s, const Tensor& amax = {}) const;
  // dx_colsum (C), optional: += sum_t dx(t) as well (ops/norm.h).
  void backward_residual(const Tensor& dy, const Tensor& x, const NormSaved& s,
                         const Tensor& dresidual, const Tensor& dx,
                         const Tensor& dx_colsum = {}) const;

 private:
  NormKind kind_ = NormKind::RMSNorm;
  float eps_ = 1e-5f;
  Param weight_, bias_;
};

}  // namespace engine::layers
