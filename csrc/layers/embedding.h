// Input embedding: x = E[tokens] (+ P[positions] with learned positions).
// Backward accumulates (+=) into the table gradients; there is no input gradient.
#pragma once
#include "config/config.h"
#include "layers/common.h"

namespace engine::layers {

class Embedding {
 public:
  Embedding() = default;
  Embedding(const ParamStore& store, const ModelConfig& c);
  static void declare(ParamTable& t, const ModelConfig& c);
  static constexpr const char* kTokens = "embed.tokens";
  static constexpr const char* kPositions = "embed.positions";

  void forward(const Tensor& tokens, const Tensor& positions, const Tensor& x) const;
  void backward(const Tensor& tokens, const Tensor& positions, const Tensor& dx) const;

 private:
  Param tokens_, positions_;
};

}  // namespace engine::layers
