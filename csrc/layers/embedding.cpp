#include "layers/embedding.h"

#include "parallel/tensor_parallel.h"
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
// The model's ids were checked on the host before they reach it: tokens by the data sampler
// against model.vocab_size (data/dataset_sampler.cpp), positions are below data.sequence_length
// <= model.max_position_embeddings (config_validate.cpp). So the lookups skip the GPU's
// read-back of its own id check, which would make the host wait for the device twice per
// embedding and step (ops/embedding.h, IdCheck).
constexpr ops::IdCheck kIds = ops::IdCheck::kTrusted;

// This rank's rows of a (T) tensor under sequence parallelism, else all of it.
Tensor local_rows(const Env& env, const Tensor& t, int64_t rows) {
  return env.sp() ? t.slice(rows * env.tp_rank(), rows * (env.tp_rank() + 1)) : t;
}
}  // namespace

void Embedding::forward(const Env& env, const Tensor& tokens, const Tensor& positions, const Tensor& x) const {
  if (env.tp_size() == 1) {
    ops::embedding_forward(tokens, tokens_.w(), x, false, 0, 0, kIds);
  } else {
    Owned partial = env.sp() ? env.act_tensor({tokens.size(0), x.size(1)}) : Owned{};
    const Tensor p = env.sp() ? partial.t : x;
    ops::embedding_forward(tokens, tokens_.w(), p, false, vocab_begin_, vocab_size_, kIds);
    row_output_forward(env, p, x);
  }
  if (positions_) ops::embedding_forward(local_rows(env, positions, x.size(0)), positions_.w(), x, true, 0, 0, kIds);
}

void Embedding::backward(const Env& env, const Tensor& tokens, const Tensor& positions, const Tensor& dx) const {
  if (tokens_.frozen && (!positions_ || positions_.frozen)) return;  // frozen (LoRA): nothing to add
  ENSURE(!tokens_.frozen && !positions_.frozen, "the token and position embeddings are frozen alike");
  if (positions_) ops::embedding_backward(local_rows(env, positions, dx.size(0)), dx, positions_.g(), 0, 0, kIds);
  if (env.tp_size() == 1) return ops::embedding_backward(tokens, dx, tokens_.g(), 0, 0, kIds);
  Owned storage;
  const Tensor dx_full = row_output_backward(env, dx, storage);
  ops::embedding_backward(tokens, dx_full, tokens_.g(), vocab_begin_, vocab_size_, kIds);
}

}  // namespace engine::layers
