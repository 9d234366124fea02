// AdamW over a model's flat buffers, with ZeRO sharding over the data-parallel group.
// Each dp rank owns one contiguous shard [rank * n / dp, (rank + 1) * n / dp) of the flat buffers
// (n = the store's capacity, a multiple of dp) and keeps for it the f32 master weights and both
// moments (stage 0: one "shard" = everything, on every rank). A step:
//   gradients: reduced in buckets, started from the last micro-batch's backward as suffixes
//              of the buffer complete (grads_ready), so they overlap the rest of backward on
//              GPUs: stage 0/1 all-reduce them; stage 2/3 reduce each piece of a bucket only
//              onto the rank whose shard holds it (in place in the gradient buffer: half the
//              traffic, no separate gradient shard). With tied copies under stage 2/3 every
//              bucket waits for step(), after the tied sum.
//   tp:        (tensor parallelism) replicated parameters' gradients summed over the tp group
//              under sequence parallelism; the norm counts them once and the split ones on
//              every tp rank
//   norm:      sum of squares of the shard's gradient, summed over the shards; clip scale
//   update:    AdamW (ops/adamw.h) on the shard in one call, the weight decay by runs of
//              parameters (none for norms and biases); the compute-dtype weights of the shard
//              are written in the same pass
//   weights:   stage 1/2 gather the updated weights at once; stage 3 keeps only the shard
//              between steps and gathers the full weights in begin_step(). Either way in buckets
//              broadcast from their owners on the comm stream, which the store's views wait for
//              as the next forward reaches them (ParamStore::set_pending_weights)
// Master weights alias the shard of the compute weights when those are f32 (CPU) and resident.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "core/params.h"
#include "ops/adamw.h"

namespace engine {

struct StepStats {
  double grad_norm = 0;  // before clipping
  double clip_scale = 1;
  double lr = 0;
  bool skipped = false;  // no update: the gradient norm was not finite, or the caller asked
};

// The model-parallel groups of a rank, for the parts of the update that cross them:
//   tp    tensor-parallel group (the store holds this rank's blocks): the gradient norm sums the
//         split parameters over tp and counts the replicated ones once; with sequence_parallel
//         the replicated parameters' gradients (norms, row-parallel biases, positions: computed
//         from token shards) are summed over tp before the update
//   pp    pipeline group (the store holds this rank's stages): the gradient norm sums over it
//   tied  the pipeline ranks holding a copy of tied parameters (the first and last stage's for
//         tied embeddings): their gradients are summed over it, so the copies stay equal, and
//         the norm counts them on the rank with count_tied only
struct ModelParallelGroups {
  Comm* tp = nullptr;
  bool sequence_parallel = false;
  Comm* pp = nullptr;
  Comm* tied = nullptr;
  std::vector<std::string> tied_params;
  bool count_tied = true;
};

class AdamW {
 public:
  // dp: the data-parallel group the gradients are summed over. seed: the init seed (master
  // weights of a shard are generated directly in f32, never rounded through the compute dtype).
  // bucket_elements: elements per gradient reduction and weight gather bucket.
  // groups: how the model is split besides dp (ModelParallelGroups).
  AdamW(ParamStore& store, const OptimizerConfig& config, Comm& dp, int zero_stage, uint64_t seed,
        int64_t bucket_elements = int64_t{16} << 20, const ModelParallelGroups& groups = {});

  void begin_step();         // before the first forward of a step (stage 3: gather the weights)
  // During the last micro-batch's backward: gradients at offsets >= offset are complete; reduces
  // whole buckets of them as they fill (no-op for a single rank, and for stages 2/3 with tied
  // copies).
  void grads_ready(int64_t offset);
  // After the last backward: reduce, clip, update; step counts from 1. The update is skipped
  // (weights, master and moments unchanged) when the gradient norm, which every rank computes
  // alike, is NaN or infinite, or when skip_update is set (a non-finite loss).
  StepStats step(int step, bool skip_update = false);

  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  const Tensor& exp_avg() const { return m_.t; }      // (shard)
  const Tensor& exp_avg_sq() const { return v_.t; }   // (shard)
  Tensor master() const;                              // (shard) f32
  // The full f32 master weights of every rank, gathered (tests, checkpoints).
  Owned gather_master();

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
  int zero_stage() const { return stage_; }
  Comm& comm() const { return dp_; }
  Comm* tp() const { return tp_; }  // nullptr without tensor parallelism
  Comm* pp() const { return pp_; }  // nullptr without pipeline parallelism
  const ParamStore& store() const { return store_; }
  // Bytes this rank keeps between steps for the optimizer (master, moments).
  size_t state_bytes() const;

 private:
  void write_and_gather_weights();
  void gather_weights();  // the shards of every rank to every rank, asynchronously (bucket_ elements)
  void reduce_range(int64_t begin, int64_t end);
  // f(piece begin, piece end, owner) for [begin, end) cut at the dp shards' boundaries.
  void for_each_owned_piece(int64_t begin, int64_t end,
                            const std::function<void(int64_t, int64_t, int)>& f) const;

  ParamStore& store_;
  OptimizerConfig config_;
  Comm& dp_;
  Comm* tp_ = nullptr;         // size > 1 only
  bool reduce_replicated_ = false;
  std::vector<std::pair<int64_t, int64_t>> replicated_;  // shard-relative ranges of replicated parameters
  Comm* pp_ = nullptr;         // size > 1 only
  Comm* tied_ = nullptr;       // size > 1 only
  bool count_tied_ = true;
  std::vector<std::pair<int64_t, int64_t>> tied_ranges_;  // shard-relative ranges of tied copies
  std::vector<std::pair<int64_t, int64_t>> tied_full_;    // their ranges in the full buffers
  void reduce_tied();
  int stage_;
  int64_t begin_ = 0, end_ = 0;
  int64_t bucket_ = 0;
  int64_t reduced_from_ = -1;  // gradients in [reduced_from_, capacity) are reduced; -1: none this step
  bool master_aliased_ = false;
  Owned master_, m_, v_;
  // The weight decay by runs of the shard (ends shard-relative; a run starts where the one before
  // it ends), as ops::adamw_step takes it.
  std::vector<ops::DecayRun> decay_runs_;
};

// Global L2 norm of a gradient buffer (f64 accumulation) on one rank.
double grad_norm(const Tensor& grads);

}  // namespace engine
