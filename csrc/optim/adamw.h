// AdamW on this rank's shard of a model's flat buffers. The shard, and every gradient sum and
// weight gather around the update, belong to the data-parallel owner (parallel/data_parallel.h);
// this class keeps the shard's f32 master weights and both moments and runs the update:
//   norm:      the whole model's gradient norm (DataParallel::gradient_norm_squared); clip scale
//   update:    AdamW (ops/adamw.h) on the shard in one call, the weight decay by runs of
//              parameters (none for norms and biases); the compute-dtype weights of the shard
//              are written in the same pass, then handed to the data-parallel owner to gather
// Master weights alias the shard of the compute weights when those are f32 (CPU) and resident.
// With bf16 compute weights that stay resident (ZeRO stage < 3) the master is split
// (ops/split_master.h): the shard's bf16 weights are its high halves and a u16 buffer its low
// halves, exact f32 values in 2 bytes a parameter beside the weights instead of 4. Under ZeRO 3
// the weights are released between steps, so the master is a whole f32 shard.
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "core/params.h"
#include "ops/adamw.h"
#include "parallel/data_parallel.h"

namespace engine {

struct StepStats {
  double grad_norm = 0;  // before clipping
  double clip_scale = 1;
  double lr = 0;
  bool skipped = false;  // no update: the gradient norm was not finite, or the caller asked
};

class AdamW {
 public:
  // seed: the init seed (master weights of a shard are generated directly in f32, never
  // rounded through the compute dtype).
  AdamW(const OptimizerConfig& config, DataParallel& parallel, uint64_t seed);

  void begin_step();  // before the first forward of a step (stage 3: the weights from the master)
  // After the last backward: reduce, clip, update; step counts from 1. The update is skipped
  // (weights, master and moments unchanged) when the gradient norm, which every rank computes
  // alike, is NaN or infinite, or when skip_update is set (a non-finite loss).
  StepStats step(int step, bool skip_update = false);

  DataParallel& parallel() const { return parallel_; }
  const ParamStore& store() const { return parallel_.store(); }
  Comm& comm() const { return parallel_.comm(); }
  Comm* tp() const { return parallel_.tp(); }
  Comm* pp() const { return parallel_.pp(); }
  int zero_stage() const { return parallel_.zero_stage(); }
  int64_t shard_begin() const { return parallel_.shard_begin(); }
  int64_t shard_end() const { return parallel_.shard_end(); }
  const Tensor& exp_avg() const { return m_.t; }      // (shard)
  const Tensor& exp_avg_sq() const { return v_.t; }   // (shard)
  // (shard) f32. A split master is joined into a scratch f32 shard (kept until the next step or
  // weights_from_master(): writes to it, as a checkpoint load makes, take effect there).
  Tensor master() const;
  // The full f32 master weights of every rank, gathered (tests, checkpoints).
  Owned gather_master() { return parallel_.gather_full(master()); }

  // Checkpoint export/import. The shard's state as f32 views on the store's device: a
  // checkpoint writer reads them, a loader overwrites them (master: the shard's master weights,
  // aliasing the compute weights on CPU) and then calls weights_from_master(), which rewrites
  // the compute weights from the master (rounded to the compute dtype by the same cast a step
  // uses) and gathers them over the group (ZeRO-3: left to the next begin_step()). The compute
  // weights are therefore never saved: they are a function of the master weights.
  struct ShardState {
    Tensor master, exp_avg, exp_avg_sq;  // (shard_end - shard_begin) f32 each
  };
  ShardState shard_state() const { return {master(), m_.t, v_.t}; }
  void weights_from_master();
  // Bytes this rank keeps between steps for the optimizer (master, moments).
  size_t state_bytes() const;

 private:
  void write_and_gather_weights();

  OptimizerConfig config_;
  DataParallel& parallel_;
  ParamStore& store_;
  bool master_aliased_ = false;
  bool master_split_ = false;  // master_ holds the low halves (u16), the weights the high
  Owned master_, m_, v_;
  mutable Owned joined_;       // a split master joined to f32 (master(), shard_state())
  void split_into_weights(const Tensor& master_f32);  // a split master from f32 values
  // The weight decay by runs of the shard (ends shard-relative; a run starts where the one before
  // it ends), as ops::adamw_step takes it.
  std::vector<ops::DecayRun> decay_runs_;
};

// Global L2 norm of a gradient buffer (f64 accumulation) on one rank.
double grad_norm(const Tensor& grads);

}  // namespace engine
