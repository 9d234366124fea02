// The training loop of one process: global batch -> micro-batches (gradient accumulation) ->
// forward/backward -> grad-norm clipping -> AdamW -> logs and metrics, with periodic validation
// and a clean stop on SIGINT/SIGTERM after the current step.
// The loss of a step is the sum of per-token losses over the global batch divided by the number
// of loss tokens in it, so how the batch is cut into micro-batches does not change it.
#pragma once
#include <cstdio>
#include <memory>
#include <string>

#include "comm/comm.h"
#include "config/config.h"
#include "data/sampler.h"
#include "models/model.h"
#include "optim/adamw.h"

namespace engine {

struct StepResult {
  int step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  int64_t tokens = 0;      // input tokens in the global batch
  double seconds = 0;
};

// run.device: auto picks the GPU when this build has CUDA and a GPU is visible, else the CPU.
Device resolve_device(DeviceChoice choice);

class Trainer {
 public:
  // write_outputs = false keeps everything in memory (tests): no run directory, no metrics file.
  // dp: the data-parallel group (world() by default); each rank takes its part of every global
  // batch and gradients are summed over the group (optimizer sharding per distributed.zero_stage).
  explicit Trainer(const Config& config, bool write_outputs = true, Comm* dp = nullptr);
  ~Trainer();

  StepResult train_step();        // the next step
  double evaluate();              // mean validation loss over training.eval_steps batches
  int run();                      // the whole run; returns the process exit code
  int step() const { return step_; }
  Model& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  const std::string& run_dir() const { return run_dir_; }

  // Set by SIGINT/SIGTERM once install_signal_handlers() ran (the train program does so at
  // start): the loop stops after the current step.
  static void request_stop();
  static void install_signal_handlers();

 private:
  // Forward and (if with_grad) backward over samples [first, first + count) of `source`,
  // in micro-batches; returns the summed loss and adds the loss tokens to *loss_tokens.
  double run_batch(const SampleSource& source, int64_t first, int64_t count, bool with_grad,
                   int64_t* loss_tokens);
  void write_metrics(const std::string& json_line);

  Config config_;
  std::unique_ptr<Comm> device_comm_;  // NCCL over the world when training on GPUs with several ranks
  Comm& dp_;
  bool write_outputs_;
  Device device_;
  std::string run_dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<SampleSource> train_data_, valid_data_;
  FILE* metrics_ = nullptr;
  int step_ = 0;
  double train_seconds_ = 0;
};

}  // namespace engine
