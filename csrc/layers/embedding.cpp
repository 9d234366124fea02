#include "layers/embedding.h"

#include "layers/parallel.h"
#include "ops/embedding.h"

namespace engine::layers {

Embedding::Embedding(const ParamStore& store, const ModelConfig& c)
    : tokens_(store, kTokens), vocab_begin_(store.table().get(kTokens).split_begin), vocab_size_(c.vocab_size) {
  if (c.positions == PositionKind::Learned) positions_ = Param(store, kPositions);
}

void Embedding::declare(ParamTable& t, const ModelConfig& c) {
  t.add({.name = kTokens, .shape = {c.vocab_size, c.hidden_size}, .split_dim = 0, .init_std = c.init_std});
  if (c.positions == PositionKind::Learned)
    t.add({.name = kPositions, .shape = {c.max_position_embeddings, c.hidden_size},
           .init_std = c.init_std});
}

namespace {
// This rank's rows of a (T) tensor under sequence parallelism, else all of it.
Tensor local_rows(const Env& env, const Tensor& t, int64_t rows) {
  return env.sp() ? t.slice(rows * env.tp_rank(), rows * (env.tp_rank() + 1)) : t;
}
}  // namespace

void Embedding::forward(const Env& env, const Tensor& tokens, const Tensor& positions, const Tensor& x) const {
  if (env.tp_size() == 1) {
    ops::embedding_forward(tokens, tokens_.w(), x, false);
  } else {
    Owned partial = env.sp() ? env.act_tensor({tokens.size(0), x.size(1)}) : Owned{};
    const Tensor p = env.sp() ? partial.t : x;
    ops::embedding_forward(tokens, tokens_.w(), p, false, vocab_begin_, vocab_size_);
    row_output_forward(env, p, x);
  }
  if (positions_) ops::embedding_forward(local_rows(env, positions, x.size(0)), positions_.w(), x, true);
}

void Embedding::backward(const Env& env, const Tensor& tokens, const Tensor& positions, const Tensor& dx) const {
  if (positions_) ops::embedding_backward(local_rows(env, positions, dx.size(0)), dx, positions_.g());
  if (env.tp_size() == 1) return ops::embedding_backward(tokens, dx, tokens_.g());
  Owned storage;
  const Tensor dx_full = row_output_backward(env, dx, storage);
  ops::embedding_backward(tokens, dx_full, tokens_.g(), vocab_begin_, vocab_size_);
}

}  // namespace engine::layers
