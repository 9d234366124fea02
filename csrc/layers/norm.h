// LayerNorm or RMSNorm over the hidden dimension (ops/norm.h has the formulas).
// Saved: the statistics (mean for LayerNorm, rstd). The input x is kept by the caller.
// Gradients: dx written (=); weight and bias gradients accumulated (+=).
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

  void forward(const Env& env, const Tensor& x, const Tensor& y, NormSaved& s) const;
  void backward(const Tensor& dy, const Tensor& x, const NormSaved& s, const Tensor& dx) const;

 private:
  NormKind kind_ = NormKind::RMSNorm;
  float eps_ = 1e-5f;
  Param weight_, bias_;
};

}  // namespace engine::layers
