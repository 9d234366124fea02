#include "models/transformer.h"

#include "layers/linear.h"
#include "ops/elementwise.h"

namespace engine {

struct Transformer::TSaved : Model::Saved {
  Owned x0;                               // embedding output (T, C)
  std::vector<layers::BlockSaved> blocks;
  layers::HeadSaved head;
};

void Transformer::declare(ParamTable& t, const ModelConfig& c) {
  layers::Embedding::declare(t, c);
  for (int i = 0; i < c.num_layers; ++i) layers::Block::declare(t, i, c);
  layers::LmHead::declare(t, c);
}

static ParamTable table_of(const ModelConfig& c, int tp_rank, int tp_size) {
  ParamTable t(tp_rank, tp_size);
  Transformer::declare(t, c);
  return t;
}

static int tp_rank(const ModelLayout& l) { return l.tp ? l.tp->rank() : 0; }
static int tp_size(const ModelLayout& l) { return l.tp ? l.tp->size() : 1; }

Transformer::Transformer(const ModelConfig& c, Device device, DType compute_dtype, int64_t capacity,
                         const ModelLayout& layout)
    : config_(c), store_(table_of(c, tp_rank(layout), tp_size(layout)), device, compute_dtype, capacity),
      env_{device, compute_dtype, layout.tp, layout.sequence_parallel},
      embedding_(store_, c), head_(store_, c, layout.cross_entropy_splits) {
  for (int i = 0; i < c.num_layers; ++i) {
    blocks_.emplace_back(store_, i, c);
    block_offsets_.push_back(store_.table().get("layers." + std::to_string(i) + ".norm1.weight").offset);
  }
}

int64_t Transformer::local_tokens(const MicroBatch& mb) const {
  if (!env_.sp()) return mb.num_tokens;
  ENSURE(mb.num_tokens % env_.tp_size() == 0, "sequence parallelism: a micro-batch of ", mb.num_tokens,
         " tokens does not split over ", env_.tp_size(), " tensor-parallel ranks");
  return mb.num_tokens / env_.tp_size();
}

std::unique_ptr<Model::Saved> Transformer::new_saved() const { return std::make_unique<TSaved>(); }

double Transformer::forward(const MicroBatch& mb, Saved& saved, bool with_grad, float grad_scale) {
  auto& s = static_cast<TSaved&>(saved);
  const layers::SegmentInfo seg = mb.segments();
  s.x0 = env_.act_tensor({local_tokens(mb), config_.hidden_size});
  embedding_.forward(env_, mb.tokens, mb.positions, s.x0);
  s.blocks.clear();
  s.blocks.resize(blocks_.size());
  const Tensor* x = &s.x0.t;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    blocks_[i].forward(env_, *x, seg, s.blocks[i]);
    // Without gradients only the current block's output is needed: drop the rest at once.
    if (!with_grad && i > 0) s.blocks[i - 1] = layers::BlockSaved{};
    x = &s.blocks[i].y.t;
  }
  const double loss = head_.forward(env_, *x, mb.labels, mb.loss_mask, with_grad, grad_scale, s.head);
  if (!with_grad) s = TSaved{};
  return loss;
}

void Transformer::backward(const MicroBatch& mb, Saved& saved, const GradsReady& grads_ready) {
  auto& s = static_cast<TSaved&>(saved);
  ENSURE(s.head.dx.t.data || mb.num_tokens == 0, "backward without a forward with gradients");
  const layers::SegmentInfo seg = mb.segments();
  Owned dy = std::move(s.head.dx);
  for (size_t i = blocks_.size(); i-- > 0;) {
    const Tensor& x = i == 0 ? s.x0.t : s.blocks[i - 1].y.t;
    Owned dx = env_.act_tensor(x.shape);
    blocks_[i].backward(env_, dy, x, seg, s.blocks[i], dx);
    s.blocks[i] = layers::BlockSaved{};  // free this block's activations as soon as possible
    dy = std::move(dx);
    // Block i and everything after it (later blocks, final norm, untied head) are complete.
    if (grads_ready) grads_ready(block_offsets_[i]);
  }
  embedding_.backward(env_, mb.tokens, mb.positions, dy);
  if (grads_ready) grads_ready(0);
  s = TSaved{};
}

void Transformer::logits(const MicroBatch& mb, const Tensor& out) {
  const int64_t T = mb.num_tokens, V = config_.vocab_size;
  expect_shape(out, {T, V}, "logits");
  ENSURE(out.dtype == DType::F32 && out.device == env_.device, "logits: an f32 tensor on the model's device");
  ENSURE(env_.tp_size() == 1, "logits of a tensor-parallel model: run it on one rank");
  const layers::SegmentInfo seg = mb.segments();
  Owned x = env_.act_tensor({T, config_.hidden_size});
  embedding_.forward(env_, mb.tokens, mb.positions, x);
  for (const layers::Block& b : blocks_) {
    layers::BlockSaved s;
    b.forward(env_, x, seg, s);
    x = std::move(s.y);
  }
  // The head's norm and projection as LmHead::forward applies them, without the loss.
  const layers::Norm norm(store_, "final_norm", config_.norm, static_cast<float>(config_.norm_eps), config_.bias);
  Owned xn = env_.act_tensor({T, config_.hidden_size});
  layers::NormSaved ns;
  norm.forward(env_, x, xn, ns);
  const Tensor w = store_.weight(config_.tie_embeddings ? layers::Embedding::kTokens : "head.weight");
  if (env_.act == DType::F32) {
    layers::linear_forward(xn, w, {}, out);
  } else {
    Owned y = env_.act_tensor({T, V});
    layers::linear_forward(xn, w, {}, y);
    ops::cast(y, out);
  }
}

ParamTable model_param_table(const ModelConfig& c, int tp_rank, int tp_size) {
  return table_of(c, tp_rank, tp_size);
}

std::unique_ptr<Model> make_model(const ModelConfig& c, Device device, DType compute_dtype,
                                  int64_t capacity, const ModelLayout& layout) {
  switch (c.family) {
    case ModelFamily::GPT2:
    case ModelFamily::Llama:
    case ModelFamily::Mistral:
    case ModelFamily::Qwen2:
      return std::make_unique<Transformer>(c, device, compute_dtype, capacity, layout);
  }
  RAISE("unknown model family");
}

}  // namespace engine
