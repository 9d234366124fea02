// Final norm, output projection to the vocabulary and cross-entropy, run forward and backward
// in one call: the logits exist only inside forward(), where the loss gradient is written over
// them in place and immediately projected back, so what is kept for the backward pass is the
// (T, C) input gradient, never the logits.
//   xn = norm(x);  logits = xn W^T  (W = the token embedding when tied);  losses = CE(logits)
// with model.z_loss (+ z lse^2 per token) and model.label_smoothing (ops/loss.h has the formulas).
// The tokens run in distributed.cross_entropy_splits consecutive chunks (GEMM, loss, gradient,
// backward GEMM per chunk), so at most T / splits rows of logits exist at a time.
// Tensor parallelism: W is vocab-parallel (rank r holds rows [r V/tp, (r+1) V/tp), like the
// embedding); each rank computes its columns of the logits and the vocab-parallel loss combines
// the per-row statistics of all ranks (ops::cross_entropy_partial / _combine / _grad): every
// rank gets the same losses, and the gradient of its logits stays local. The input of W is a
// column-parallel input (parallel/tensor_parallel.h): all-gathered under sequence parallelism.
// Gradients: W's accumulate (+=) during forward (with_grad); HeadSaved::dx is the gradient
// w.r.t. x that the blocks' backward starts from.
#pragma once
#include "config/config.h"
#include "layers/common.h"
#include "layers/norm.h"
#include "ops/loss.h"

namespace engine::layers {

struct HeadSaved {
  Owned dx;  // x's shape: the gradient of the loss w.r.t. the head's input
};

class LmHead {
 public:
  LmHead() = default;
  // norm: the prefix of the final norm's parameters ("final_norm"; an extra head of multi-token
  // prediction has its own, "mtp.{j}.norm", and shares the output projection).
  LmHead(const ParamStore& store, const ModelConfig& c, int cross_entropy_splits = 1,
         const std::string& norm = "final_norm");
  static void declare(ParamTable& t, const ModelConfig& c);

  // x: (T, C), or this rank's token shard under sequence parallelism; labels, mask: (T).
  // grad_scale multiplies the loss gradient (1 / loss tokens of the global batch).
  // Returns the sum of the per-token losses over the loss mask.
  // teacher (distillation, set_distillation): the teacher's logits (T, V / tp) in the compute
  // dtype; the loss is then distillation.label_weight x the cross-entropy (with z-loss) +
  // distillation.weight x the distillation term (ops::distillation_loss).
  double forward(const Env& env, const Tensor& x, const Tensor& labels, const Tensor& mask,
                 bool with_grad, float grad_scale, HeadSaved& s, const Tensor& teacher = {}) const;
  // logits (T, V / tp) of x in the compute dtype, no loss (a teacher's forward).
  void logits(const Env& env, const Tensor& x, const Tensor& out) const;
  int64_t local_vocab() const { return weight_.shape[0]; }
  void set_distillation(const DistillationConfig* d);

 private:
  // The distillation loss of one chunk (rows, V / tp) against the teacher's, gradient in place.
  void distill(const Env& env, const Tensor& logits, const Tensor& teacher, const Tensor& labels,
               const Tensor& mask, const Tensor& losses, bool with_grad, float grad_scale) const;

  // Losses of one chunk of logits (rows, V / tp), and with_grad their gradient in place.
  // columns > 0: logits are padded rows of which the first `columns` are the vocabulary
  // (single shard only).
  void loss(const Env& env, const Tensor& logits, const Tensor& labels, const Tensor& mask,
            const Tensor& losses, bool with_grad, float grad_scale, int64_t columns = 0) const;

  Norm norm_;
  Param weight_;
  int64_t vocab_begin_ = 0, vocab_size_ = 0;
  int splits_ = 1;
  float z_loss_ = 0, label_smoothing_ = 0;
  bool distill_ = false;
  ops::DistillParams distill_params_;
};

}  // namespace engine::layers
