#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "ops/split_master.h"
#include "optim/lr_scale.h"
#include "optim/schedule.h"

namespace engine {
namespace {

Owned host_copy(const Tensor& t) {
  Owned h = empty(t.shape, t.dtype, Device::CPU);
  copy_tensor(h, t);
  return h;
}

}  // namespace

AdamW::AdamW(const OptimizerConfig& config, DataParallel& parallel, uint64_t seed)
    : config_(config), parallel_(parallel), store_(parallel.store()) {
  const int64_t begin = parallel.shard_begin(), end = parallel.shard_end(), len = end - begin;
  const Device dev = store_.device();
  master_aliased_ = store_.compute_dtype() == DType::F32 && parallel.zero_stage() < 3;
  master_split_ = store_.compute_dtype() == DType::BF16 && !parallel.releases_weights();
  if (!master_aliased_) {
    Owned host = empty({len}, DType::F32, Device::CPU);
    init_values(store_.table(), seed, begin, end, host);
    if (master_split_) {
      // The shard's weights become the master's high halves (rounded as ops/split_master.h
      // says), so every rank's copy of them is gathered from the owner.
      master_ = empty({len}, DType::U16, dev);
      split_into_weights(host);
      parallel.gather_weights();
    } else {
      master_ = empty({len}, DType::F32, dev);
      copy_tensor(master_, host);
    }
  }
  m_ = zeros({len}, DType::F32, dev);
  v_ = zeros({len}, DType::F32, dev);
  if (parallel.releases_weights()) store_.release_weights();

  // Maximal runs of equal weight decay and learning-rate scale (optim/lr_scale.h) within the
  // shard, each from the end of the one before (the first from 0) to its last parameter's end:
  // the alignment gaps before a parameter take its run's decay and scale. Gaps are zero in every buffer (weights, gradients, master, moments), and a
  // zero element stays zero under any decay (eps > 0), so updating them is harmless; the tail
  // past the last parameter is left out.
  for (const ParamSpec& s : store_.table().entries()) {
    if (s.frozen) continue;  // outside the flat buffers (core/params.h)
    const int64_t e = std::min(s.offset + s.shape.numel(), end);
    if (std::max(s.offset, begin) >= e) continue;
    const float decay = s.weight_decay ? static_cast<float>(config.weight_decay) : 0.f;
    const auto scale = static_cast<float>(lr_scale_of(config, s.name));
    if (!decay_runs_.empty() && decay_runs_.back().weight_decay == decay && decay_runs_.back().lr_scale == scale)
      decay_runs_.back().end = e - begin;
    else
      decay_runs_.push_back({e - begin, decay, scale});
  }
}

Tensor AdamW::master() const {
  if (master_aliased_) return store_.weights_flat().slice(shard_begin(), shard_end());
  if (!master_split_) return master_.t;
  if (!joined_.t.data) {  // joined on the host: checkpoints and tests, not steps
    const int64_t len = shard_end() - shard_begin();
    Owned hi = host_copy(store_.weights_flat().slice(shard_begin(), shard_end()));
    Owned lo = host_copy(master_);
    Owned host = empty({len}, DType::F32, Device::CPU);
    const bf16* h = hi.ptr<bf16>();
    const uint16_t* l = lo.ptr<uint16_t>();
    uint32_t* out = static_cast<uint32_t*>(host.t.data);
#pragma omp parallel for schedule(static) if (len > (1 << 16))
    for (int64_t i = 0; i < len; ++i) out[i] = split_master_join(h[i].bits, l[i]);
    joined_ = empty({len}, DType::F32, store_.device());
    copy_tensor(joined_, host);
  }
  return joined_.t;
}

void AdamW::split_into_weights(const Tensor& master_f32) {
  const int64_t len = shard_end() - shard_begin();
  Owned host = host_copy(master_f32);
  Owned hi = empty({len}, DType::BF16, Device::CPU), lo = empty({len}, DType::U16, Device::CPU);
  const uint32_t* in = static_cast<const uint32_t*>(host.t.data);
  bf16* h = hi.ptr<bf16>();
  uint16_t* l = lo.ptr<uint16_t>();
#pragma omp parallel for schedule(static) if (len > (1 << 16))
  for (int64_t i = 0; i < len; ++i) {
    h[i].bits = split_master_hi(in[i]);
    l[i] = split_master_lo(in[i], h[i].bits);
  }
  copy_tensor(store_.weights_flat().slice(shard_begin(), shard_end()), hi);
  copy_tensor(master_, lo);
}

void AdamW::begin_step() {
  parallel_.begin_step();
  if (store_.has_weights()) return;
  store_.allocate_weights();  // stage 3: the shard's weights from the master, then gather
  write_and_gather_weights();
}

void AdamW::write_and_gather_weights() {
  const Tensor shard = store_.weights_flat().slice(shard_begin(), shard_end());
  if (master_split_) {
    // The weights are the master's high halves already, unless it was joined (and perhaps
    // overwritten by a load): then split it again.
    if (joined_.t.data) split_into_weights(joined_);
    joined_ = Owned{};
  } else if (!master_aliased_) {
    ops::cast(master_, shard);
  }
  parallel_.gather_weights();
}

StepStats AdamW::step(int step, bool skip_update) {
  StepStats st;
  st.lr = learning_rate(config_, step);
  joined_ = Owned{};  // a joined split master (a checkpoint's, a test's) is stale after the update
  const Tensor grads = parallel_.reduce_gradients();
  st.grad_norm = std::sqrt(parallel_.gradient_norm_squared(grads));
  if (skip_update || !std::isfinite(st.grad_norm)) {
    st.skipped = true;
    parallel_.end_step(false);  // unchanged (stage 3: gathered again next step)
    return st;
  }
  if (config_.grad_clip > 0 && st.grad_norm > config_.grad_clip)
    st.clip_scale = config_.grad_clip / (st.grad_norm + 1e-6);

  ops::AdamWParams p;
  p.lr = static_cast<float>(st.lr);
  p.beta1 = static_cast<float>(config_.beta1);
  p.beta2 = static_cast<float>(config_.beta2);
  p.eps = static_cast<float>(config_.eps);
  p.step = step;
  p.grad_scale = static_cast<float>(st.clip_scale);
  const Tensor master_shard = master_split_ ? master_.t : master();
  const Tensor weights = store_.weights_flat().slice(shard_begin(), shard_end());
  // One call over the shard (one launch on the GPU), the decay by runs.
  p.decay_runs = decay_runs_;
  if (!decay_runs_.empty()) {
    const int64_t n = decay_runs_.back().end;
    ops::adamw_step(master_shard.slice(0, n), grads.slice(0, n), m_->slice(0, n), v_->slice(0, n), p,
                    master_aliased_ ? Tensor{} : weights.slice(0, n));  // split: the high halves
  }
  parallel_.end_step(true);
  return st;
}

void AdamW::weights_from_master() {
  if (!store_.has_weights()) return;  // ZeRO-3 between steps: begin_step() gathers from the master
  write_and_gather_weights();
}

size_t AdamW::state_bytes() const {
  size_t b = m_.buf.bytes() + v_.buf.bytes();
  b += master_aliased_ ? 0 : master_.buf.bytes();  // split: the u16 low halves
  return b;
}

double grad_norm(const Tensor& grads) { return std::sqrt(ops::sum_squares(grads)); }

}  // namespace engine
