#include "parallel/data_parallel.h"

#include <algorithm>

#include "ops/elementwise.h"

namespace engine {

DataParallel::DataParallel(ParamStore& store, Comm& dp, int zero_stage, int64_t bucket_elements,
                           const ModelParallelGroups& g)
    : store_(store), dp_(dp), tp_(g.tp && g.tp->size() > 1 ? g.tp : nullptr),
      pp_(g.pp && g.pp->size() > 1 ? g.pp : nullptr),
      tied_(g.tied && g.tied->size() > 1 ? g.tied : nullptr), count_tied_(g.count_tied), stage_(zero_stage),
      bucket_(std::max<int64_t>(1, bucket_elements)) {
  ENSURE(store.table().tp_size() == (tp_ ? tp_->size() : 1), "a parameter table for ", store.table().tp_size(),
         " tensor-parallel ranks with a group of ", tp_ ? tp_->size() : 1);
  ENSURE(!tied_ || !g.tied_params.empty(), "a tied group without tied parameters");
  ENSURE(stage_ >= 0 && stage_ <= 3, "ZeRO stage ", stage_);
  const int64_t n = store.capacity();
  ENSURE(n % dp.size() == 0, "parameter buffer of ", n, " elements does not split over ", dp.size(), " ranks");
  const bool shard = stage_ >= 1 && dp.size() > 1;
  begin_ = shard ? n / dp.size() * dp.rank() : 0;
  end_ = shard ? begin_ + n / dp.size() : n;
  auto tied = [&](const ParamSpec& s) {
    return tied_ && std::find(g.tied_params.begin(), g.tied_params.end(), s.name) != g.tied_params.end();
  };
  // Frozen parameters (core/params.h) are outside the flat buffers: no gradient to reduce.
  for (const ParamSpec& s : store.table().entries())
    if (tied(s) && !s.frozen) tied_full_.emplace_back(s.offset, s.offset + s.shape.numel());
  for (const ParamSpec& s : store.table().entries()) {
    if (s.frozen) continue;
    const int64_t b = std::max(s.offset, begin_), e = std::min(s.offset + s.shape.numel(), end_);
    if (b >= e) continue;
    if (tied(s)) tied_ranges_.emplace_back(b - begin_, e - begin_);
    // Runs of replicated parameters (across zero alignment gaps): all of them, and those whose
    // gradients are summed over tp (all under sequence parallelism, else the partial ones).
    auto add_run = [&](std::vector<std::pair<int64_t, int64_t>>& runs) {
      if (!runs.empty() && b - begin_ - runs.back().second < 64)
        runs.back().second = e - begin_;
      else
        runs.emplace_back(b - begin_, e - begin_);
    };
    if (tp_ && s.split_dim < 0) add_run(replicated_);
    if (tp_ && s.split_dim < 0 && (g.sequence_parallel || s.tp_partial_grad)) add_run(tp_summed_);
  }
}

void DataParallel::reduce_tied() {
  for (const auto& [b, e] : tied_full_) tied_->all_reduce(store_.grads_flat().slice(b, e));
}

void DataParallel::begin_step() { reduced_from_ = -1; }

void DataParallel::grads_ready(int64_t offset) {
  // Stage 2/3 with tied copies: their sum over the tied group must come before the reduction to
  // the owners (the two ranks' shards do not line up), so every bucket waits for reduce_gradients().
  if (dp_.size() == 1 || (stage_ >= 2 && tied_)) return;
  const int64_t end = reduced_from_ < 0 ? store_.capacity() : reduced_from_;
  // Whole buckets as soon as they are complete; the rest when the buffer is complete (offset 0).
  if (end - offset >= bucket_ || (offset == 0 && end > 0)) reduce_range(offset, end);
}

void DataParallel::for_each_owned_piece(int64_t begin, int64_t end,
                                        const std::function<void(int64_t, int64_t, int)>& f) const {
  const int64_t shard = end_ - begin_;  // shards are contiguous and of equal length
  for (int64_t b = begin; b < end;) {
    const int64_t owner = b / shard, e = std::min(end, (owner + 1) * shard);
    f(b, e, static_cast<int>(owner));
    b = e;
  }
}

void DataParallel::reduce_range(int64_t begin, int64_t end) {
  const Tensor grads = store_.grads_flat();
  if (stage_ < 2) {
    dp_.all_reduce_async(grads.slice(begin, end));
  } else {
    // Each piece summed only on its owner: half an all-reduce's traffic, and nothing outside the
    // shard is needed.
    for_each_owned_piece(begin, end,
                         [&](int64_t b, int64_t e, int owner) { dp_.reduce_async(grads.slice(b, e), owner); });
  }
  reduced_from_ = begin;
}

Tensor DataParallel::reduce_gradients() {
  Tensor grads;
  // Tied copies are summed on the full buffers, where every holder has all of them (the dp
  // shards of two pipeline ranks' buffers need not line up): before the reductions onto the
  // owners (stage 2/3), or after the all-reduce (stage 0/1: a sum over dp and one over the tied
  // group commute).
  if (dp_.size() == 1) {
    reduce_tied();
    grads = store_.grads_flat();
  } else {
    if (stage_ >= 2) reduce_tied();  // before the reduction to the owners (no bucket started)
    // Buckets the backward did not start (all of them when no grads_ready came) go now.
    if (reduced_from_ != 0) reduce_range(0, reduced_from_ < 0 ? store_.capacity() : reduced_from_);
    dp_.wait_async();
    if (stage_ < 2) reduce_tied();
    grads = store_.grads_flat().slice(begin_, end_);
  }
  // Model-parallel gradient sums (after the dp reduction: sums over different groups commute).
  for (const auto& [b, e] : tp_summed_) tp_->all_reduce(grads.slice(b, e));
  return grads;
}

double DataParallel::gradient_norm_squared(const Tensor& grads) const {
  double sq = ops::sum_squares(grads);
  // Split parameters count on every tp rank, replicated ones on the first only; tied copies on
  // one pipeline rank.
  if (tp_ && tp_->rank() != 0)
    for (const auto& [b, e] : replicated_) sq -= ops::sum_squares(grads.slice(b, e));
  if (!count_tied_)
    for (const auto& [b, e] : tied_ranges_) sq -= ops::sum_squares(grads.slice(b, e));
  sq = std::max(sq, 0.0);  // (rounding of the subtractions; NaN stays NaN)
  if (tp_) sq = tp_->all_reduce_sum(sq);
  if (pp_) sq = pp_->all_reduce_sum(sq);
  if (sharded()) sq = dp_.all_reduce_sum(sq);
  return sq;
}

void DataParallel::end_step(bool weights_changed) {
  if (!sharded()) return;
  if (stage_ == 3)
    store_.release_weights();  // gathered again when the next step begins
  else if (weights_changed)
    gather_weights();
}

void DataParallel::gather_weights() {
  if (!sharded()) return;
  // Bucket by bucket in buffer order, each piece broadcast from the rank whose shard holds it (an
  // all-gather's traffic). The store's views wait for a bucket only when something reads it, so
  // the forward after this starts on the first buckets while the later ones still arrive.
  const Tensor w = store_.weights_flat();
  const int64_t n = store_.capacity();
  std::vector<ParamStore::PendingWeights> pending;
  for (int64_t b = 0; b < n; b += bucket_) {
    for_each_owned_piece(b, std::min(n, b + bucket_),
                         [&](int64_t p, int64_t q, int owner) { dp_.broadcast_async(w.slice(p, q), owner); });
    if (std::function<void()> wait = dp_.fence()) pending.push_back({b, std::move(wait)});
  }
  store_.set_pending_weights(std::move(pending));
}

Owned DataParallel::gather_full(const Tensor& mine) const {
  Owned full = empty({store_.capacity()}, DType::F32, store_.device());
  if (!sharded()) {
    copy_tensor(full, mine);
  } else {
    copy_tensor(full->slice(begin_, end_), mine);
    dp_.all_gather(full->slice(begin_, end_), full);
  }
  return full;
}

}  // namespace engine
