#include "layers/lm_head.h"

#include <algorithm>

#include "layers/embedding.h"
#include "layers/linear.h"
#include "parallel/tensor_parallel.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/loss.h"

namespace engine::layers {

namespace {
const char* weight_name(const ModelConfig& c) { return c.tie_embeddings ? Embedding::kTokens : "head.weight"; }
}  // namespace

LmHead::LmHead(const ParamStore& store, const ModelConfig& c, int cross_entropy_splits, const std::string& norm)
    : norm_(store, norm, c.norm, static_cast<float>(c.norm_eps), c.bias),
      weight_(store, weight_name(c)),
      vocab_begin_(store.table().get(weight_name(c)).split_begin),
      vocab_size_(c.vocab_size),
      splits_(std::max(1, cross_entropy_splits)), z_loss_(static_cast<float>(c.z_loss)),
      label_smoothing_(static_cast<float>(c.label_smoothing)) {}

void LmHead::declare(ParamTable& t, const ModelConfig& c) {
  Norm::declare(t, "final_norm", c.hidden_size, c.norm, c.bias);
  if (!c.tie_embeddings)
    t.add({.name = "head.weight", .shape = {c.vocab_size, c.hidden_size}, .split_dim = 0,
           .init_std = c.init_std});
}

void LmHead::loss(const Env& env, const Tensor& logits, const Tensor& labels, const Tensor& mask,
                  const Tensor& losses, bool with_grad, float grad_scale, int64_t columns) const {
  if (env.tp_size() == 1)
    return ops::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale, z_loss_, label_smoothing_,
                              columns);
  ENSURE(columns == 0 || columns == logits.size(1), "LmHead::loss: padded logits need the fused single-shard path");
  // Vocab-parallel: per-row (max, sum of exponentials, label logit, and with label smoothing
  // the mean logit's share) of this rank's columns, gathered from every rank and merged alike
  // on each, so all ranks hold the same losses.
  const int64_t n = logits.size(0), rows = label_smoothing_ > 0 ? 4 : 3;
  Owned stats = env.stat_tensor({rows, n});
  ops::cross_entropy_partial(logits, labels, mask, vocab_begin_, vocab_size_, stats);
  Owned all = env.stat_tensor({env.tp_size(), rows, n});
  env.tp->all_gather(stats->view({rows * n}), all->view({env.tp_size() * rows * n}));
  Owned lse = env.stat_tensor({n});
  ops::cross_entropy_combine(all, mask, lse, losses, z_loss_, label_smoothing_);
  if (with_grad)
    ops::cross_entropy_grad(logits, labels, mask, vocab_begin_, lse, grad_scale, z_loss_, label_smoothing_,
                            vocab_size_);
}

void LmHead::set_distillation(const DistillationConfig* d) {
  distill_ = d != nullptr;
  if (!d) return;
  distill_params_.kind = d->kind == DistillationKind::ForwardKL   ? ops::DistillKind::ForwardKL
                         : d->kind == DistillationKind::ReverseKL ? ops::DistillKind::ReverseKL
                                                                  : ops::DistillKind::SoftCE;
  distill_params_.temperature = static_cast<float>(d->temperature);
  distill_params_.distill_weight = static_cast<float>(d->weight);
  distill_params_.label_weight = static_cast<float>(d->label_weight);
  distill_params_.z_loss = z_loss_;
}

void LmHead::distill(const Env& env, const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                     const Tensor& mask, const Tensor& losses, bool with_grad, float grad_scale) const {
  if (env.tp_size() == 1)
    return ops::distillation_loss(logits, teacher, labels, mask, distill_params_, losses, {}, with_grad, grad_scale);
  // Vocab-parallel: every per-row statistic the loss and its gradient need, from every rank's
  // columns, merged alike on each rank; the gradient of the local logits stays local.
  const int64_t n = logits.size(0), k = ops::kDistillStats;
  Owned stats = env.stat_tensor({k, n});
  ops::distillation_partial(logits, teacher, labels, mask, vocab_begin_, vocab_size_, distill_params_, stats);
  Owned all = env.stat_tensor({env.tp_size(), k, n});
  env.tp->all_gather(stats->view({k * n}), all->view({env.tp_size() * k * n}));
  Owned row = env.stat_tensor({ops::kDistillRowStats, n});
  ops::distillation_combine(all, mask, distill_params_, row, losses, {});
  if (with_grad) ops::distillation_grad(logits, teacher, labels, mask, vocab_begin_, distill_params_, row, grad_scale);
}

void LmHead::logits(const Env& env, const Tensor& x, const Tensor& out) const {
  Owned xn = env.act_tensor(x.shape);
  NormSaved ns;
  norm_.forward(env, x, xn, ns);
  Owned gathered;
  linear_forward(LinearPrecision{}, column_input_forward(env, xn, gathered), weight_.w(), {}, out);
}

double LmHead::forward(const Env& env, const Tensor& x, const Tensor& labels, const Tensor& mask,
                       bool with_grad, float grad_scale, HeadSaved& s, const Tensor& teacher) const {
  ENSURE(!distill_ || teacher.data, "distillation without the teacher's logits");
  const int64_t C = x.size(1), V = weight_.w().size(0);
  Owned xn = env.act_tensor(x.shape);
  NormSaved ns;
  norm_.forward(env, x, xn, ns);
  Owned gathered;
  const Tensor xin = column_input_forward(env, xn, gathered);
  const int64_t T = xin.size(0);
  Owned dxin = with_grad ? env.act_tensor({T, C}) : Owned{};
  Owned losses = env.stat_tensor({T});
  // A vocabulary that is not a multiple of 8 makes the contiguous dimension of the head's three
  // GEMMs odd, which sends cuBLASLt to slow unvectorised kernels (GPT-2's 50257: they took 62 of
  // 113 ms per step on an H200). On CUDA the single-shard head (the cross-entropy reads padded
  // rows) therefore multiplies by a copy of the weight padded with zero rows to Vp = round_up(V,
  // 128): logits (T, Vp) whose extra columns are 0 and never read by the loss, dx = dlogits Wp
  // (the zero rows add nothing), and dWp summed over the chunks into a scratch whose first V
  // rows are added to the gradient once. The copies move ~3 x Vp x C elements, against the GEMMs' T x Vp x C products.
  // A multiple of 128 rather than of 8 gives cuBLASLt whole tiles: GPT-2's head (50304 against
  // 50264 columns) ran its forward GEMM in 3.47 ms against 3.58 and the step 1% faster.
  const bool pad = xin.device == Device::CUDA && !distill_ && env.tp_size() == 1 && V % 8 != 0;
  const int64_t width = pad ? (V + 127) / 128 * 128 : V;
  Owned wp, dwp;
  if (pad) {
    wp = empty({width, C}, weight_.w().dtype, env.device);
    copy_tensor(wp->slice(0, V), weight_.w());
    zero_tensor(wp->slice(V, width));
    if (with_grad && !weight_.frozen) dwp = zeros({width, C}, weight_.g().dtype, env.device);
  }
  const Tensor w = pad ? wp.t : weight_.w();
  const int64_t chunk = std::max<int64_t>(1, (T + splits_ - 1) / splits_);
  for (int64_t a = 0; a < T; a += chunk) {
    const int64_t b = std::min(T, a + chunk);
    Owned logits = env.act_tensor({b - a, width});
    linear_forward(LinearPrecision{}, xin.slice(a, b), w, {}, logits);
    if (distill_)
      distill(env, logits, teacher.slice(a, b), labels.slice(a, b), mask.slice(a, b), losses->slice(a, b), with_grad,
              grad_scale);
    else
      loss(env, logits, labels.slice(a, b), mask.slice(a, b), losses->slice(a, b), with_grad, grad_scale,
           pad ? V : 0);
    if (!with_grad) continue;
    if (pad) {
      ops::matmul(logits, false, w, false, dxin->slice(a, b), {});          // dx = dlogits Wp
      if (!weight_.frozen) ops::matmul(logits, true, xin.slice(a, b), false, dwp, {1.f, 1.f});  // dWp += dlogits^T x
    } else {
      linear_backward(LinearPrecision{}, logits, xin.slice(a, b), w, dxin->slice(a, b), weight_.g(), {});
    }
  }
  if (pad && with_grad && !weight_.frozen) ops::add_inplace(weight_.g(), dwp->slice(0, V));  // the chunks' sum, once
  const double loss_sum = ops::sum(losses);
  if (with_grad) {
    gathered = Owned{};
    Owned dxn = env.sp() ? env.act_tensor(x.shape) : Owned{};
    const Tensor d = env.sp() ? dxn.t : dxin.t;
    column_input_backward(env, dxin, d);
    s.dx = env.act_tensor(x.shape);
    norm_.backward(d, x, ns, s.dx);
  }
  return loss_sum;
}

}  // namespace engine::layers
