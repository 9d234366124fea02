// Text generation on the Transformer (models/model.h DecodeCache, decode_step): the embedding of
// one token at its position, every block's decode path (layers/decode.cpp) with its own cache,
// then the final norm and the head as logits() applies them. The token and its position go to
// the device in one small upload per step; nothing else crosses to the host.
#include "core/log.h"
#include "models/transformer.h"

namespace engine {

namespace {
struct TransformerCache final : Model::DecodeCache {
  std::vector<layers::BlockCache> blocks;
  Owned ids;  // (2) i32 on the device: the token, then its position
};
}  // namespace

std::unique_ptr<Model::DecodeCache> Transformer::new_decode_cache(int64_t capacity) const {
  expect_whole_model("decoding");
  ENSURE(capacity >= 1, "a decode cache of ", capacity, " positions");
  ENSURE(config_.positions != PositionKind::Learned || capacity <= config_.max_position_embeddings,
         "a decode cache of ", capacity, " positions, more than max_position_embeddings (",
         config_.max_position_embeddings, ")");
  auto c = std::make_unique<TransformerCache>();
  c->capacity = capacity;
  c->blocks.reserve(blocks_.size());
  for (const layers::Block& b : blocks_) c->blocks.push_back(b.new_cache(env_, capacity));
  c->ids = empty({2}, DType::I32, env_.device);
  return c;
}

void Transformer::decode_step(DecodeCache& cache, int32_t token, const Tensor& logits) {
  auto& c = dynamic_cast<TransformerCache&>(cache);
  const int64_t C = config_.hidden_size, V = config_.vocab_size;
  ENSURE(c.position < c.capacity, "decode: the cache of ", c.capacity, " positions is full");
  ENSURE(token >= 0 && token < V, "decode: token ", token, " is not an id in [0, ", V, ")");
  expect_shape(logits, {1, V}, "decode logits");
  ENSURE(logits.dtype == DType::F32 && logits.device == env_.device, "decode: f32 logits on the model's device");
  const int32_t host[2] = {token, static_cast<int32_t>(c.position)};
  upload_bytes(c.ids.t.data, env_.device, host, sizeof(host));
  const Tensor tok = c.ids->slice(0, 1), pos = c.ids->slice(1, 2);
  Owned x = env_.act_tensor({1, C});
  embedding_.forward(env_, tok, pos, x);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Owned y = env_.act_tensor({1, C});
    blocks_[i].decode(env_, x, pos, c.blocks[i], y);
    x = std::move(y);
  }
  head_logits(x, logits);
  ++c.position;
}

}  // namespace engine
