// Decoder-only stack: gpt2, llama, mistral, qwen2, qwen3, mixtral, mamba and hybrid are this one stack with
// different presets and block kinds (config.h block_layout, layers/block.h): embedding (+ learned positions) -> num_layers pre-norm blocks -> final norm ->
// LM head with cross-entropy. With model.prediction_heads = k (multi-token prediction, as
// Fast-LLM's MTP Llama) the blocks 0 .. L-2 are the trunk; the next-token head is block L-1, the
// final norm and the LM head; extra head j (1..k) is a block of block L-1's kind on the trunk's
// output ("mtp.{j}.*"), its own norm ("mtp.{j}.norm") and the shared output projection, trained on
// the token at t + 1 + j (models/prediction_targets.h). All heads live on the last stage; the
// loss is sum_j w_j * mean_j (model.prediction_loss_weights), each mean over the global batch's
// loss tokens of head j, and the trunk output's gradient sums block L-1's and every extra
// block's input gradients (models/mtp.cpp). Units run in order forward and in reverse backward, each one a
// separate layer object, so a pipeline stage is a contiguous range of them.
// A vision-language model (ModelConfig::vision) has a vision encoder and projector ("vision.*",
// layers/vision.h) on the first stage, declared before the embedding: its features (one a patch)
// replace the input embeddings of the token rows the micro-batch names (MicroBatch::image_rows),
// and their gradients flow back to the encoder, the image tokens' embedding rows getting none.
// It runs on the CPU, on one rank and one stage without micro-sequences so far (refused
// elsewhere, naming the setting).
// Under tensor parallelism (ModelLayout::tp) each rank holds its blocks of every split parameter
// (params.h) and the layers exchange activations over the group (parallel/tensor_parallel.h); with
// sequence parallelism the residual stream between them is this rank's token shard. Under
// pipeline parallelism each rank builds only the layers of its stages (StagePlan).
#pragma once
#include <vector>

#include "layers/block.h"
#include "layers/embedding.h"
#include "layers/lm_head.h"
#include "layers/vision.h"
#include "models/model.h"

namespace engine {

class Transformer final : public Model {
 public:
  Transformer(const ModelConfig& c, Device device, DType compute_dtype, int64_t capacity = 0,
              const ModelLayout& layout = {});

  // Declares the parameters of the stages `layout` gives this rank, in model order (embedding,
  // blocks, final norm and head). A rank holding the head but not the embedding of a model with
  // tied embeddings declares its own copy of embed.tokens (kept equal: its gradient is summed
  // with the embedding stage's: tied_parameters(), parallel/data_parallel.h).
  static void declare(ParamTable& t, const ModelConfig& c, const ModelLayout& layout = {});

  // Stage s holds blocks [first_block, end_block), plus the embedding (s = 0) and the head
  // (s = S - 1): the blocks split as evenly as possible.
  struct StagePlan {
    int first_block = 0, end_block = 0;
    bool embedding = false, head = false;
  };
  static std::vector<StagePlan> stage_plan(int num_layers, int stages);
  // The vision encoder's sizes, its projector writing the text model's width; its parameters'
  // prefix.
  static VisionConfig vision_config(const ModelConfig& c);
  static constexpr const char* kVision = "vision";

  ParamStore& params() override { return store_; }
  std::vector<std::string> tied_parameters() const override {
    return config_.tie_embeddings ? std::vector<std::string>{layers::Embedding::kTokens} : std::vector<std::string>{};
  }
  std::unique_ptr<Saved> new_saved() const override;
  double forward(const MicroBatch& mb, Saved& saved, bool with_grad, float grad_scale) override;
  void backward(const MicroBatch& mb, Saved& saved, const GradsReady& grads_ready = {}) override;
  void logits(const MicroBatch& mb, const Tensor& out) override;

  int num_stages() const override { return static_cast<int>(plan_.size()); }
  bool has_stage(int stage) const override { return layout_.has_stage(stage); }
  double forward_stage(int stage, const MicroBatch& mb, Saved& saved, const Tensor& input, bool with_grad,
                       float grad_scale) override;
  void backward_stage(int stage, const MicroBatch& mb, Saved& saved, const Tensor& grad_output,
                      const GradsReady& grads_ready = {}) override;
  Tensor stage_output(const Saved& saved) const override;
  Tensor stage_input_grad(const Saved& saved) const override;
  Shape stage_activation_shape(const MicroBatch& mb) const override;
  DType activation_dtype() const override { return env_.act; }
  void vocab_logits(const MicroBatch& mb, const Tensor& out) override;
  void set_teacher(Teacher teacher, const DistillationConfig& distillation) override;
  void set_stats(StatsRecorder* stats) override { stats_ = stats; }
  std::unique_ptr<DecodeCache> new_decode_cache(int64_t capacity) const override;  // models/decode.cpp
  void decode_step(DecodeCache& cache, int32_t token, const Tensor& logits) override;
  std::vector<double> take_prediction_losses() override;                       // models/mtp.cpp
  void prediction_logits(const MicroBatch& mb, int head, const Tensor& out) override;  // models/mtp.cpp

 private:
  struct TSaved;
  int64_t local_tokens(const MicroBatch& mb) const;  // rows of the residual stream on this rank
  // x = the input embeddings of mb's tokens, each image patch's feature in its image row (the
  // encoder's activations kept in `vision` for the backward).
  void embed(const MicroBatch& mb, const Tensor& x, layers::VisionSaved& vision) const;
  static layers::SegmentInfo image_segments(const MicroBatch& mb);  // the images as segments
  ModelConfig config_;
  ModelLayout layout_;
  std::vector<StagePlan> plan_;
  ParamStore store_;
  layers::Env env_;
  layers::Embedding embedding_;           // when this rank holds stage 0
  layers::VisionEncoder vision_;          // stage 0 of a vision-language model
  std::vector<layers::Block> blocks_;     // all num_layers; only this rank's are built
  std::unique_ptr<layers::LmHead> head_;  // when this rank holds the last stage
  std::vector<int64_t> block_offsets_;    // flat offset of each of this rank's blocks' first parameter
  // Multi-token prediction (last stage): extra head j's block and head at j - 1, the loss weights
  // w_0 .. w_k, each extra head's loss sum since take_prediction_losses(), and the flat offset of
  // the first extra head's first parameter (its gradients and all after it complete together).
  std::vector<layers::Block> mtp_blocks_;
  std::vector<std::unique_ptr<layers::LmHead>> mtp_heads_;
  std::vector<float> head_weights_;
  std::vector<double> mtp_loss_sums_;
  int64_t mtp_offset_ = -1;
  bool has_mtp() const { return config_.prediction_heads > 0; }
  // The input of block L-1 in a last stage's Saved (the trunk's output).
  const Tensor& trunk_output(const TSaved& s, const StagePlan& p) const;
  // Forward of every extra head on the trunk output xt: block, loss and the head's backward;
  // adds each head's loss sum to mtp_loss_sums_ and returns the MoE auxiliary losses of the blocks.
  double mtp_forward(const MicroBatch& mb, TSaved& s, const Tensor& xt, const layers::SegmentInfo& seg,
                     bool with_grad);
  // Backward of every extra block: returns the sum of their input gradients (the trunk output's
  // share from the extra heads); each also adds sum_t dx to dx_colsum (when given).
  Owned mtp_backward(TSaved& s, const Tensor& xt, const layers::SegmentInfo& seg, const Tensor& dx_colsum);
  bool moe_aux_ = false;                  // MoE auxiliary losses on (their values cost a host sync)
  Teacher teacher_;
  StatsRecorder* stats_ = nullptr;
  void record(const std::string& name, const Tensor& x) const;
  // The final norm and the LM head's projection of the last block's output x (T, C) into
  // logits (T, V) f32, as LmHead::forward applies them without the loss.
  void head_logits(const Tensor& x, const Tensor& out, const std::string& norm = "final_norm") const;
  void expect_whole_model(const char* what) const;
};

}  // namespace engine
