// Runs a batch of micro-batches through this rank's pipeline stages (parallel/schedule.h) and
// moves activations and their gradients between ranks. Sends are non-blocking (a rank never
// waits for a peer to take its data) from copies kept until the batch ends; receives block.
// On a device backend each direction between two neighbouring ranks has its own communicator
// (NCCL matches a communicator's messages in order on one stream, so a send queued before a
// receive in the other direction could otherwise wait on each other); on MPI the messages carry
// tags naming (direction, stage, micro-batch).
#pragma once
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "models/model.h"
#include "parallel/schedule.h"

namespace engine {

class Pipeline {
 public:
  // pp: the pipeline group (nullptr: every stage is on this rank).
  Pipeline(Model& model, Comm* pp, ScheduleKind kind);
  ~Pipeline();

  // Forward (and with_grad backward) of every micro-batch (with micro-sequences: every chunk of
  // every micro-batch, in order, all with the same `chunks`); returns the loss sum of the micro-
  // batches on this rank (the last stage's rank, plus MoE auxiliary losses of this rank's
  // stages; see Model::forward_stage). grads_ready (see Model) is called
  // during the last backward of each of this rank's stages.
  double run(const std::vector<MicroBatch>& micro_batches, bool with_grad, float grad_scale,
             const Model::GradsReady& grads_ready = {});

  const PipelineLayout& layout() const { return layout_; }

 private:
  void send(const Tensor& t, int to_stage, bool backward, int tag);
  void recv(const Tensor& t, int from_stage, bool backward, int tag);

  Model& model_;
  Comm* pp_;
  ScheduleKind kind_;
  PipelineLayout layout_;
  int rank_ = 0;
  // Device backends: fwd_[i] carries rank i -> i + 1 (mod P), bwd_[i] rank i + 1 -> i.
  std::vector<std::unique_ptr<Comm>> fwd_, bwd_;
  std::vector<Owned> pending_;  // copies being sent
};

}  // namespace engine
