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
};

// How a model's layers are split and run (distributed.*): the tensor-parallel group (nullptr or
// one rank: none), sequence parallelism, and the token chunks of the LM head's loss.
struct ModelLayout {
  Comm* tp = nullptr;
  bool sequence_parallel = false;
  int cross_entropy_splits = 1;
};

// The parameter table of a model family (no memory), for tensor-parallel rank tp_rank of tp_size.
ParamTable model_param_table(const ModelConfig& c, int tp_rank = 0, int tp_size = 1);
// Builds the model of config.model.family with parameters on `device` in `compute_dtype`
// (zero: call params().init(seed)); `capacity` pads the flat buffers (even ZeRO shards).
std::unique_ptr<Model> make_model(const ModelConfig& c, Device device, DType compute_dtype,
                                  int64_t capacity = 0, const ModelLayout& layout = {});

}  // namespace engine
