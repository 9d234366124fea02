// Data parallelism over a model's flat buffers (core/params.h), with ZeRO sharding, and the
// gradient sums over the other groups that a step needs before its update.
// Each dp rank owns one contiguous shard [rank * n / dp, (rank + 1) * n / dp) of the flat buffers
// (n = the store's capacity, a multiple of dp; stage 0: one "shard" = everything, on every rank);
// the optimizer (optim/adamw.h) keeps its state for that shard only. A step:
//   gradients: reduced in buckets, started from the last micro-batch's backward as suffixes
//              of the buffer complete (grads_ready), so they overlap the rest of backward on
//              GPUs: stage 0/1 all-reduce them; stage 2/3 reduce each piece of a bucket only
//              onto the rank whose shard holds it (in place in the gradient buffer: half the
//              traffic, no separate gradient shard). With tied copies under stage 2/3 every
//              bucket waits for reduce_gradients(), after the tied sum.
//   tied:      the pipeline ranks holding a copy of a tied parameter (the first and last
//              stage's embeddings) sum its gradient over their group, so the copies stay equal
//   tp:        (tensor parallelism) replicated parameters' gradients summed over the tp group
//              under sequence parallelism; the norm counts them once and the split ones on
//              every tp rank
//   norm:      sum of squares of the shard's gradient, summed over the shards and groups
//   weights:   after the update, stage 1/2 gather the updated weights at once; stage 3 keeps only
//              the shard between steps and gathers the full weights when the next step begins.
//              Either way in buckets broadcast from their owners on the comm stream, which the
//              store's views wait for as the next forward reaches them
//              (ParamStore::set_pending_weights)
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "core/params.h"

namespace engine {

// The model-parallel groups of a rank, for the parts of the update that cross them:
//   tp    tensor-parallel group (the store holds this rank's blocks): the gradient norm sums the
//         split parameters over tp and counts the replicated ones once; with sequence_parallel
//         the replicated parameters' gradients (norms, row-parallel biases, positions: computed
//         from token shards) are summed over tp before the update, and so are those declared
//         tp_partial_grad (per-head q/k norms: each rank's heads) in every layout
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

class DataParallel {
 public:
  // dp: the data-parallel group the gradients are summed over; bucket_elements: elements per
  // gradient reduction and weight gather bucket; groups: how the model is split besides dp.
  DataParallel(ParamStore& store, Comm& dp, int zero_stage, int64_t bucket_elements = int64_t{16} << 20,
               const ModelParallelGroups& groups = {});

  void begin_step();  // before the first forward of a step
  // During the last micro-batch's backward: gradients at offsets >= offset are complete; reduces
  // whole buckets of them as they fill (no-op for a single rank, and for stages 2/3 with tied
  // copies).
  void grads_ready(int64_t offset);
  // After the last backward: every reduction finished (the buckets the backward did not start,
  // the tied and tensor-parallel sums); the shard's summed gradient.
  Tensor reduce_gradients();
  // The squared L2 norm of the whole model's gradient from this rank's shard of it (every rank
  // gets the same value): the sums over the shards, tp and pp, each parameter counted once.
  double gradient_norm_squared(const Tensor& shard_grads) const;
  // After the update wrote the shard's compute weights (weights_changed), or skipped it: stage
  // 1/2 gather every updated shard to every rank, stage 3 releases the full weights until the
  // next step.
  void end_step(bool weights_changed);
  // The shard's compute weights were written (stage 3 at a step's start, a checkpoint load):
  // gather them to every rank (nothing when unsharded).
  void gather_weights();
  // The full buffer from every rank's shard of it (tests, checkpoints): mine is (shard) f32.
  Owned gather_full(const Tensor& mine) const;

  ParamStore& store() const { return store_; }
  Comm& comm() const { return dp_; }
  Comm* tp() const { return tp_; }  // nullptr without tensor parallelism
  Comm* pp() const { return pp_; }  // nullptr without pipeline parallelism
  int zero_stage() const { return stage_; }
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  bool sharded() const { return end_ - begin_ != store_.capacity(); }
  // Whether the compute weights are kept between steps only as this rank's shard (ZeRO-3).
  bool releases_weights() const { return stage_ == 3 && sharded(); }

 private:
  void reduce_range(int64_t begin, int64_t end);
  void reduce_tied();
  // f(piece begin, piece end, owner) for [begin, end) cut at the dp shards' boundaries.
  void for_each_owned_piece(int64_t begin, int64_t end,
                            const std::function<void(int64_t, int64_t, int)>& f) const;

  ParamStore& store_;
  Comm& dp_;
  Comm* tp_ = nullptr;         // size > 1 only
  std::vector<std::pair<int64_t, int64_t>> replicated_;  // shard-relative ranges of replicated parameters
  std::vector<std::pair<int64_t, int64_t>> tp_summed_;   // ... of those whose gradients are summed over tp
  Comm* pp_ = nullptr;         // size > 1 only
  Comm* tied_ = nullptr;       // size > 1 only
  bool count_tied_ = true;
  std::vector<std::pair<int64_t, int64_t>> tied_ranges_;  // shard-relative ranges of tied copies
  std::vector<std::pair<int64_t, int64_t>> tied_full_;    // their ranges in the full buffers
  int stage_;
  int64_t begin_ = 0, end_ = 0;
  int64_t bucket_ = 0;
  int64_t reduced_from_ = -1;  // gradients in [reduced_from_, capacity) are reduced; -1: none this step
};

}  // namespace engine
