// A language model as the trainer sees it: a parameter table laid out in flat buffers, and a
// forward/backward over one micro-batch with the activations kept in a Saved object the caller
// owns (one per micro-batch in flight). The gradient of the loss w.r.t. every parameter is
// accumulated (+=) into the store's gradient buffer, scaled by `grad_scale` (1 / loss tokens of
// the global batch), so summing micro-batches gives the global-batch gradient.
#pragma once
#include <functional>
#include <memory>

#include "comm/comm.h"
#include "config/config.h"
#include "core/params.h"
#include "models/micro_batch.h"
#include "models/tensor_stats.h"

namespace engine {

class Model {
 public:
  struct Saved {
    virtual ~Saved() = default;
  };
  virtual ~Model() = default;
  virtual ParamStore& params() = 0;
  virtual std::unique_ptr<Saved> new_saved() const = 0;
  // Returns the sum of per-token losses of the micro-batch. with_grad = false: evaluation
  // (no gradients, nothing kept).
  virtual double forward(const MicroBatch& mb, Saved& saved, bool with_grad, float grad_scale) = 0;
  // grads_ready(offset), when given, is called as backward proceeds: every parameter gradient at
  // flat offsets >= offset is complete for this micro-batch (backward runs from the last layer,
  // whose parameters sit last in the buffers, to the embedding at offset 0), so the data-parallel
  // reduction of that suffix can start while the rest of backward runs.
  using GradsReady = std::function<void(int64_t offset)>;
  virtual void backward(const MicroBatch& mb, Saved& saved, const GradsReady& grads_ready = {}) = 0;
  // The logits (T, V) of the micro-batch's tokens into `out` (f32, on the model's device): the
  // forward pass without the loss, for tools that compare against other implementations.
  virtual void logits(const MicroBatch& mb, const Tensor& out) = 0;

  // Pipeline stages (forward()/backward() above run every stage, all of which must be local).
  // A stage's Saved object lives from its forward to its backward (one per stage and
  // micro-batch in flight). forward_stage: `input` is the previous stage's output (undefined for
  // stage 0; the caller keeps it alive until the backward); returns the loss sum on the last
  // stage (plus, with gradients, the MoE auxiliary losses of the stage's blocks weighted by the
  // micro-batch's loss tokens, on any stage), and leaves the output in stage_output(). backward_stage: `grad_output` is the
  // gradient of that output (undefined for the last stage); the input's gradient is left in
  // stage_input_grad() (not for stage 0); grads_ready as in backward().
  virtual int num_stages() const = 0;
  virtual bool has_stage(int stage) const = 0;
  virtual double forward_stage(int stage, const MicroBatch& mb, Saved& saved, const Tensor& input, bool with_grad,
                               float grad_scale) = 0;
  virtual void backward_stage(int stage, const MicroBatch& mb, Saved& saved, const Tensor& grad_output,
                              const GradsReady& grads_ready = {}) = 0;
  virtual Tensor stage_output(const Saved& saved) const = 0;
  virtual Tensor stage_input_grad(const Saved& saved) const = 0;
  // The activation passed between stages: (tokens on this rank, hidden) in the compute dtype.
  virtual Shape stage_activation_shape(const MicroBatch& mb) const = 0;
  virtual DType activation_dtype() const = 0;

  // Knowledge distillation. vocab_logits: this rank's vocabulary columns of the logits,
  // (T, V / tp) in the compute dtype, forward only (every stage local: a teacher). With a
  // teacher set, the last stage fills such a tensor for each micro-batch right before its loss
  // and trains against it as distillation says.
  using Teacher = std::function<void(const MicroBatch& mb, const Tensor& logits)>;
  virtual void vocab_logits(const MicroBatch& mb, const Tensor& out) = 0;
  virtual void set_teacher(Teacher teacher, const DistillationConfig& distillation) = 0;
  // Debugging: while set, forward and backward add their residual-stream tensors to `stats`
  // (models/tensor_stats.h), each element once over the tensor-parallel group.
  virtual void set_stats(StatsRecorder* stats) = 0;
  // Text generation (train/generate.h): one sequence decoded a token at a time. A DecodeCache
  // holds every layer's state for up to `capacity` positions (attention keys and values, Mamba
  // conv inputs and scan state); decode_step runs the next token (position = the tokens decoded
  // so far) through every layer, moves the cache on by it and writes its next-token logits
  // (1, V) f32 on the model's device into `logits`: the row the full forward's logits() gives for
  // that position. The weights are read only. One rank holding every stage and the whole tensors.
  struct DecodeCache {
    virtual ~DecodeCache() = default;
    int64_t position = 0;  // tokens decoded so far
    int64_t capacity = 0;
  };
  virtual std::unique_ptr<DecodeCache> new_decode_cache(int64_t capacity) const = 0;
  virtual void decode_step(DecodeCache& cache, int32_t token, const Tensor& logits) = 0;

  // Multi-token prediction (model.prediction_heads = k): the summed losses of extra heads 1..k
  // (k entries) over the forwards since the last call, on this rank (zero where it holds no last
  // stage); forward() returns head 0's. prediction_logits: head `head`'s logits (T, V) f32, as
  // logits() gives head 0's (head 0 is logits() itself).
  virtual std::vector<double> take_prediction_losses() = 0;
  virtual void prediction_logits(const MicroBatch& mb, int head, const Tensor& out) = 0;

  // Parameters of which the model holds a copy on more than one pipeline stage (the embedding
  // table tied to the LM head): the holders' gradients are summed so the copies stay equal.
  virtual std::vector<std::string> tied_parameters() const = 0;
};

// How a model's layers are split and run (distributed.*): the tensor-parallel group (nullptr or
// one rank: none), sequence parallelism, and the token chunks of the LM head's loss.
// Pipeline: the layers split into pipeline_size x stages_per_rank stages (parallel/schedule.h),
// of which this rank holds stages pipeline_rank, pipeline_rank + pipeline_size, ...
struct ModelLayout {
  Comm* tp = nullptr;
  bool sequence_parallel = false;
  int cross_entropy_splits = 1;
  int pipeline_rank = 0, pipeline_size = 1, stages_per_rank = 1;
  // Activation recomputation: forward keeps only each block's output; backward runs the block's
  // forward again before its backward (memory of one block's activations for one more forward).
  bool recompute = false;
  bool tp_overlap = true;  // layers::Env::tp_overlap
  Fp8Recipe fp8 = Fp8Recipe::Off;  // layers::Env::fp8 (training.fp8)
  // The flat parameter buffers' length is a multiple of this (equal, aligned data-parallel shards).
  int64_t pad_multiple = 1;
  int tp_rank() const { return tp ? tp->rank() : 0; }
  int tp_size() const { return tp ? tp->size() : 1; }
  int stages() const { return pipeline_size * stages_per_rank; }
  bool has_stage(int s) const { return s % pipeline_size == pipeline_rank; }
};

// The parameter table of a model family (no memory), for tensor-parallel rank tp_rank of tp_size.
ParamTable model_param_table(const ModelConfig& c, int tp_rank = 0, int tp_size = 1);
// The table of the rank `layout` describes (its stages, its tensor-parallel blocks); tp_rank and
// tp_size are given apart from layout.tp so that tables can be built without a group.
ParamTable model_param_table(const ModelConfig& c, const ModelLayout& layout, int tp_rank, int tp_size);
// Builds the model of config.model.family with parameters on `device` in `compute_dtype`
// (zero: call params().init(seed)); `capacity` pads the flat buffers (even ZeRO shards).
std::unique_ptr<Model> make_model(const ModelConfig& c, Device device, DType compute_dtype,
                                  int64_t capacity = 0, const ModelLayout& layout = {});

}  // namespace engine
