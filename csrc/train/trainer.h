// The training loop of one process: global batch -> micro-batches (gradient accumulation) ->
// forward/backward -> grad-norm clipping -> AdamW -> logs and metrics, with periodic validation,
// checkpoints (checkpoint/checkpoint.h) every training.checkpoint_every steps, at the end and on
// a stop, and a clean stop on SIGINT/SIGTERM after the current step (agreed by all ranks).
// Resume (training.resume) restores the optimizer state, the step and the data position
// (samples consumed: sample i of the training split is a pure function of config, seed and i),
// so the losses after a resume equal those of the run that never stopped, bitwise on the CPU.
// model.init_from starts from a Hugging Face folder's weights instead of the random init.
// Before anything else the ranks check that they run the same config on the same data
// (train/agreement.h); a difference ends every rank with an error naming it.
// The loss of a step is the sum of per-token losses over the global batch divided by the number
// of loss tokens in it, so how the batch is cut into micro-batches does not change it.
#pragma once
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "comm/comm.h"
#include "config/config.h"
#include "data/sampler.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "train/plan.h"

namespace engine {

namespace checkpoint {
class OutFile;
}
struct TextCodec;

struct StepResult {
  int step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  int64_t tokens = 0;      // input tokens in the global batch
  bool skipped = false;    // non-finite loss or gradients: no update was made
  // Multi-token prediction: extra head j's mean loss at j - 1 (loss is head 0's).
  std::vector<double> head_losses;
  double seconds = 0;
};

class Trainer {
 public:
  // write_outputs = false keeps everything in memory (tests): no run directory, no metrics file
  // (checkpoints still go under checkpoint_root() when asked for), and no run directory check.
  // group: every rank of the run (world() by default, NCCL over it on GPUs), split into the
  // data- and tensor-parallel groups of parallel/mesh.h. Each data-parallel rank takes its part
  // of every global batch and gradients are summed over the dp group (optimizer sharding per
  // distributed.zero_stage); the ranks of a tensor-parallel group share one part.
  explicit Trainer(const Config& config, bool write_outputs = true, Comm* group = nullptr);
  ~Trainer();

  StepResult train_step();        // the next step
  double evaluate();              // mean validation loss over training.eval_steps batches
  // Multi-token prediction: the last evaluate()'s mean loss of extra head j at j - 1.
  const std::vector<double>& valid_head_losses() const { return valid_head_losses_; }
  int run();                      // the whole run; returns the process exit code
  int step() const { return step_; }
  int64_t consumed_samples() const { return consumed_; }
  // Writes a checkpoint of the current state under checkpoint_root() (collective over the
  // data-parallel group); returns its folder.
  std::string save_checkpoint();
  const std::string& checkpoint_root() const { return checkpoint_root_; }
  const std::string& resumed_from() const { return resumed_from_; }  // "" when not resumed
  Model& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  const Mesh& mesh() const { return *mesh_; }
  // The merged tensor statistics of the last debug step (run.debug_level >= 2), else nullptr.
  const StatsRecorder* debug_stats() const { return stats_.get(); }
  const std::string& run_dir() const { return run_dir_; }

  // Set by SIGINT/SIGTERM once install_signal_handlers() ran (the train program does so at
  // start): the loop stops after the current step. A second SIGINT/SIGTERM (half a second or
  // more after the first: sooner it is the same one delivered twice, as timeout(1) does), at any
  // point from the install on (setup included), ends the process at once, exit code 128 + signal.
  static void request_stop();
  static void install_signal_handlers();

 private:
  // Forward and (if with_grad) backward over samples [first, first + count) of `source`,
  // in micro-batches; returns the summed loss and adds the loss tokens to *loss_tokens. With
  // multi-token prediction, extra head j's summed loss and loss tokens are added to
  // (*head_sums)[j - 1] and (*head_tokens)[j - 1] (both sized model.prediction_heads).
  double run_batch(const SampleSource& source, int64_t first, int64_t count, bool with_grad,
                   int64_t* loss_tokens, std::vector<double>* head_sums, std::vector<int64_t>* head_tokens);
  // Multi-token prediction: each extra head's mean loss (`none` where it had no loss tokens),
  // and " | head 1 L1 | head 2 L2 ..." for the log line ("" without extra heads).
  static std::vector<double> head_means(const std::vector<double>& sums, const std::vector<int64_t>& tokens,
                                        double none);
  static std::string head_loss_text(const std::vector<double>& losses);
  void write_metrics(const std::string& json_line);
  void resume_or_init();
  // A fresh run (training.resume = "none", run.overwrite unset) refuses a run directory that
  // holds an earlier run's metrics, statistics or checkpoints.
  void check_run_dir() const;
  // Before the first step: every token id below model.vocab_size (a scan, cached per file), and
  // the epochs the run makes over each training dataset (a warning over 1, an error over
  // data.max_epochs).
  void check_data() const;
  void init_teacher(const ModelLayout& student, DType compute);
  void open_metrics();
  // fsyncs metrics.jsonl and checks that the log reached stdout/stderr; raises naming the file.
  void sync_outputs();
  bool stop_requested();  // any rank got SIGINT/SIGTERM (collective when several ranks)
  void write_stats(int step);
  void print_sample(int step);  // training.sample_every: rank 0 prints a greedy sample (train/generate.h)   // merges the step's tensor statistics; rank 0 appends them to debug_stats.jsonl

  Config config_;
  RunPlan plan_;  // device, dtypes, communicators, model layout (train/plan.h)
  Mesh* mesh_;    // plan_.mesh
  Comm& dp_;
  bool write_outputs_;
  Device device_;
  std::string run_dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> teacher_;  // distillation: forward only, on the last stage's ranks
  std::unique_ptr<StatsRecorder> stats_;  // run.debug_level >= 2
  std::set<int> debug_steps_;
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<DataParallel> parallel_;  // gradient sums and weight gathers (ZeRO)
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<SampleSource> train_data_, valid_data_;
  std::unique_ptr<checkpoint::OutFile> metrics_;  // metrics.jsonl (rank 0 with write_outputs)
  std::unique_ptr<TextCodec> sample_codec_;       // training.sample_every: rank 0's text codec
  int step_ = 0;
  int64_t consumed_ = 0;     // training samples used so far (the data position)
  std::vector<double> valid_head_losses_;  // multi-token prediction: the last evaluate()'s
  int64_t tokens_seen_ = 0;
  double train_seconds_ = 0;
  std::string checkpoint_root_, resumed_from_;
  int last_checkpoint_step_ = -1;
};

}  // namespace engine
