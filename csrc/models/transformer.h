// Decoder-only transformer: gpt2, llama, mistral and qwen2 are this one stack with different presets
// (config.cpp): embedding (+ learned positions) -> num_layers pre-norm blocks -> final norm ->
// LM head with cross-entropy. Units run in order forward and in reverse backward, each one a
// separate layer object, so a pipeline stage is a contiguous range of them.
// Under tensor parallelism (ModelLayout::tp) each rank holds its blocks of every split parameter
// (params.h) and the layers exchange activations over the group (layers/parallel.h); with
// sequence parallelism the residual stream between them is this rank's token shard.
#pragma once
#include <vector>

#include "layers/block.h"
#include "layers/embedding.h"
#include "layers/lm_head.h"
#include "models/model.h"

namespace engine {

class Transformer final : public Model {
 public:
  Transformer(const ModelConfig& c, Device device, DType compute_dtype, int64_t capacity = 0,
              const ModelLayout& layout = {});
  static void declare(ParamTable& t, const ModelConfig& c);

  ParamStore& params() override { return store_; }
  std::unique_ptr<Saved> new_saved() const override;
  double forward(const MicroBatch& mb, Saved& saved, bool with_grad, float grad_scale) override;
  void backward(const MicroBatch& mb, Saved& saved, const GradsReady& grads_ready = {}) override;
  void logits(const MicroBatch& mb, const Tensor& out) override;

 private:
  struct TSaved;
  int64_t local_tokens(const MicroBatch& mb) const;  // rows of the residual stream on this rank
  ModelConfig config_;
  ParamStore store_;
  layers::Env env_;
  layers::Embedding embedding_;
  std::vector<layers::Block> blocks_;
  layers::LmHead head_;
  std::vector<int64_t> block_offsets_;  // flat offset of each block's first parameter
};

}  // namespace engine
