#include "layers/embedding.h"

#include "ops/embedding.h"

namespace engine::layers {

Embedding::Embedding(const ParamStore& store, const ModelConfig& c) : tokens_(store, kTokens) {
  if (c.positions == PositionKind::Learned) positions_ = Param(store, kPositions);
}

void Embedding::declare(ParamTable& t, const ModelConfig& c) {
  t.add({.name = kTokens, .shape = {c.vocab_size, c.hidden_size}, .init_std = c.init_std});
  if (c.positions == PositionKind::Learned)
    t.add({.name = kPositions, .shape = {c.max_position_embeddings, c.hidden_size},
           .init_std = c.init_std});
}

void Embedding::forward(const Tensor& tokens, const Tensor& positions, const Tensor& x) const {
  ops::embedding_forward(tokens, tokens_.w(), x, false);
  if (positions_) ops::embedding_forward(positions, positions_.w(), x, true);
}

void Embedding::backward(const Tensor& tokens, const Tensor& positions, const Tensor& dx) const {
  ops::embedding_backward(tokens, dx, tokens_.g());
  if (positions_) ops::embedding_backward(positions, dx, positions_.g());
}

}  // namespace engine::layers
