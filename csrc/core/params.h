// Parameters live in flat buffers laid out from a table:
//   weights   compute dtype (f32 on CPU, bf16 on GPU; f64 for gradient checks), what layers read
//   grads     f32 (f64 for an f64 model), accumulated (+=) by every backward
// The optimizer's f32 master weights and AdamW moments use the same flat offsets and live with
// the optimizer (optim/optimizer.h), sharded over data-parallel ranks under ZeRO.
// A parameter is a view at its offset. Entries declared `adjacent` follow the previous entry with
// no gap, so a layer can view them as one matrix (q, k, v -> one qkv GEMM; gate, up -> one GEMM);
// other entries start on a 64-element boundary. The buffers may be longer than the table
// (`capacity`), so they split evenly into data-parallel shards; the tail is zero.
// Init is layout independent: element i of parameter `name` (i counted in the full, unsharded
// tensor) is drawn from Philox keyed by (seed, name) at counter i.
// Tensor parallelism: a table built for tensor-parallel rank r of n holds, for each parameter
// declared with split_dim = d, the r-th of n equal blocks along dimension d (shape: the local
// block; full_shape: the declared tensor). Parameters with split_dim = -1 are replicated. Every
// rank's table has the same names in the same order with the same local shapes, so the flat
// layouts (and ZeRO shards) of all tensor-parallel ranks line up.
// Frozen parameters (ParamTable::set_frozen_rule; LoRA freezes every base parameter) are laid out
// in a second flat space of their own: `offset` is their place in the frozen weight buffer, which
// has no gradients, no optimizer state, no ZeRO sharding and is never released (a frozen weight
// has no master to rebuild it from). The flat buffers that gradients, buckets, ZeRO shards, AdamW
// and checkpoints cover are therefore the trainable parameters only.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/buffer.h"

namespace engine {

// Normal: init_std * N(0, 1). Uniform: U(-init_std, init_std). LogColumnIndex: log(1 + j), j the
// element's index along the last dimension of the full tensor (Mamba's A_log = log(n + 1)).
// InvSoftplusLogUniform: softplus^-1(dt), dt = max(exp(U(log init_low, log init_high)), init_floor)
// (Mamba's dt_proj bias, so that softplus(bias) starts log-uniform in [dt_min, dt_max]).
enum class InitKind { Normal, Ones, Zeros, Uniform, LogColumnIndex, InvSoftplusLogUniform };

struct ParamSpec {
  std::string name;         // e.g. "layers.3.attn.wq"; also the init RNG key
  Shape shape;              // declared: the full shape; after ParamTable::add, this rank's block
  int split_dim = -1;       // tensor-parallel split dimension (any dim); -1: replicated
  Shape full_shape = {};    // set by add: the full (unsharded) shape
  int64_t split_begin = 0;  // set by add: this rank's first index along split_dim
  InitKind init = InitKind::Normal;
  double init_std = 0.02;   // for InitKind::Normal and Uniform
  bool weight_decay = true; // false for norms and biases
  bool adjacent = false;    // placed right after the previous entry (no alignment gap)
  // Replicated (split_dim -1) but each tensor-parallel rank's gradient covers only its share
  // (per-head norms over this rank's heads): summed over the tp group with or without sequence
  // parallelism (parallel/data_parallel.h).
  bool tp_partial_grad = false;
  int64_t offset = 0;       // element offset in the flat buffers (set by ParamTable::add)
  double init_low = 0, init_high = 0, init_floor = 0;  // for InitKind::InvSoftplusLogUniform
  // Set by add from the table's frozen rule: no gradient, no update; `offset` is in the frozen
  // space (ParamStore::frozen_flat).
  bool frozen = false;
};

class ParamTable {
 public:
  // The table of tensor-parallel rank `tp_rank` of `tp_size` (1: the whole model).
  explicit ParamTable(int tp_rank = 0, int tp_size = 1);
  const ParamSpec& add(ParamSpec spec);
  // Parameters added afterwards whose name `frozen(name)` holds are frozen (see the top).
  void set_frozen_rule(std::function<bool(const std::string&)> frozen) { frozen_rule_ = std::move(frozen); }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  const ParamSpec& get(const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const std::vector<ParamSpec>& entries() const { return entries_; }
  int64_t total_elements() const { return total_; }   // trainable space, including alignment gaps
  int64_t frozen_elements() const { return frozen_total_; }  // frozen space, including gaps
  int64_t num_parameters() const;                     // sum of numel over entries (this rank's blocks)
  int64_t num_full_parameters() const;                // the same over the full (unsharded) tensors

 private:
  std::vector<ParamSpec> entries_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0, frozen_total_ = 0;
  int tp_rank_ = 0, tp_size_ = 1;
  std::function<bool(const std::string&)> frozen_rule_;
};

// Index in the full tensor of element `i` (row-major, local) of a parameter's block.
int64_t full_index(const ParamSpec& s, int64_t i);
// Local elements [lo, hi) of a parameter's block as runs contiguous in the full tensor:
// f(full_begin, count, local_begin) in increasing order (one run when split along dim 0; else
// one per index of the dimensions before the split one).
void for_each_full_run(const ParamSpec& s, int64_t lo, int64_t hi,
                       const std::function<void(int64_t, int64_t, int64_t)>& f);
// The inverse: full element g of a tensor of `full_shape` split along `split_dim` over tp_size
// ranks (-1: replicated) lies in rank `rank`'s block at local index `local`, followed there by
// `count` - 1 more elements g + 1, g + 2, ... (count <= hi - g: the run stops at hi or where the
// next full element belongs to another rank).
struct BlockRun {
  int rank;
  int64_t local, count;
};
BlockRun block_of_full(const Shape& full_shape, int split_dim, int tp_size, int64_t g, int64_t hi);

// Init values of flat elements [begin, end) into `out` (a host f32 or f64 tensor of end - begin
// elements); alignment gaps and the tail past the table are 0. Any range of any layout gets
// exactly the values of the single-rank model. `frozen`: the same over the frozen space.
void init_values(const ParamTable& table, uint64_t seed, int64_t begin, int64_t end, const Tensor& out,
                 bool frozen = false);

class ParamStore {
 public:
  // compute_dtype: F32 or F64 on CPU, BF16 (or F32) on CUDA. The flat buffers hold
  // max(capacity, table.total_elements()) elements, rounded up to a multiple of pad_multiple (so
  // that they split into equal, aligned ZeRO shards).
  ParamStore(const ParamTable& table, Device device, DType compute_dtype, int64_t capacity = 0,
             int64_t pad_multiple = 1);
  ParamStore(ParamStore&&) = default;
  ~ParamStore();  // orders the compute stream after any pending weights before freeing them

  const ParamTable& table() const { return table_; }
  Device device() const { return device_; }
  DType compute_dtype() const { return compute_dtype_; }
  DType grad_dtype() const { return compute_dtype_ == DType::F64 ? DType::F64 : DType::F32; }
  int64_t capacity() const { return capacity_; }

  Tensor weight(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  // Views at a flat offset. Layers hold offsets and make views on use: a view is valid until the
  // weights are released, and waits for the pending ranges (below) that exist when it is made.
  Tensor weight_at(int64_t offset, Shape s) const;
  Tensor grad_at(int64_t offset, Shape s) const;
  // A frozen parameter's weight (offset in the frozen space); always resident.
  Tensor frozen_weight_at(int64_t offset, Shape s) const;
  Tensor frozen_flat() const;  // the whole frozen weight buffer (frozen_elements() elements)
  // Whole flat buffers (capacity elements), for the optimizer and collectives.
  Tensor weights_flat() const;
  Tensor grads_flat() const;

  // Fills every weight from the init rule (ops::cast from f32 values when the dtype differs).
  void init(uint64_t seed);
  void zero_grads();

  // ZeRO stage 3 keeps the full weights only while a step runs.
  bool has_weights() const { return weights_.data() != nullptr; }
  void release_weights();  // after waiting for any pending weights
  void allocate_weights();

  // Weights still arriving (ZeRO: other ranks' shards, gathered on a communication stream while
  // the compute goes on): ranges of the flat buffer from each `begin` to the next one's (the last
  // to the end), begins increasing, each with the call that orders compute issued after it after
  // that range's arrival. Every view (weight, weight_at, weights_flat) first waits for the pending
  // ranges that begin below its end, so a forward in buffer order starts on the first ranges
  // while the later ones still arrive. Replaces (after waiting for) any earlier pending ranges.
  struct PendingWeights {
    int64_t begin;
    std::function<void()> wait;
  };
  void set_pending_weights(std::vector<PendingWeights> ranges);
  void wait_weights(int64_t end) const;  // waits for the pending ranges that begin below `end`
  size_t pending_weight_ranges() const { return pending_.size(); }

 private:
  ParamTable table_;
  Device device_;
  DType compute_dtype_;
  int64_t capacity_;
  Buffer weights_, grads_, frozen_;
  mutable std::deque<PendingWeights> pending_;  // views are const; waiting for a range retires it
};

}  // namespace engine
