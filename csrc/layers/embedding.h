// Input embedding: x = E[tokens] (+ P[positions] with learned positions).
// Backward accumulates (+=) into the table gradients; there is no input gradient.
// Tensor parallelism: the token table is vocab-parallel (rank r holds rows [r V/tp, (r+1) V/tp));
// each rank looks up the tokens in its rows (zero rows for the others) and the partial results
// are summed as a row-parallel output (parallel/tensor_parallel.h); the position table is replicated.
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

  // tokens, positions: (T) of the micro-batch; x, dx: (T, C), or this rank's token shard
  // (T / tp, C) under sequence parallelism.
  void forward(const Env& env, const Tensor& tokens, const Tensor& positions, const Tensor& x) const;
  void backward(const Env& env, const Tensor& tokens, const Tensor& positions, const Tensor& dx) const;

 private:
  Param tokens_, positions_;
  int64_t vocab_begin_ = 0, vocab_size_ = 0;  // this rank's rows of the token table, of vocab_size_
};

}  // namespace engine::layers
