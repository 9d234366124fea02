// Multi-token prediction in the Transformer (models/transformer.h): the extra heads' forward and
// backward on the last stage, their loss sums, and their logits for tools.
#include "core/trace.h"
#include "models/transformer.h"
#include "models/transformer_saved.h"
#include "ops/elementwise.h"

namespace engine {

const Tensor& Transformer::trunk_output(const TSaved& s, const StagePlan& p) const {
  const int64_t k = config_.num_layers - 1 - p.first_block;
  ENSURE(p.head && k >= 0 && k < static_cast<int64_t>(s.blocks.size()), "the trunk output of a stage without "
         "block ", config_.num_layers - 1);
  if (k > 0) return s.blocks[static_cast<size_t>(k - 1)].y.t;
  return p.embedding ? s.x0.t : s.input;
}

double Transformer::mtp_forward(const MicroBatch& mb, TSaved& s, const Tensor& xt, const layers::SegmentInfo& seg,
                                bool with_grad) {
  const size_t k = mtp_blocks_.size();
  ENSURE(mb.mtp_labels.size() == k && mb.mtp_mask.size() == k,
         "multi-token prediction: a micro-batch with the targets of ", mb.mtp_labels.size(), " extra heads for ", k,
         " (make_micro_batch's prediction_heads)");
  ENSURE(!with_grad || mb.mtp_grad_scale.size() == k, "multi-token prediction: the micro-batch has ",
         mb.mtp_grad_scale.size(), " extra heads' gradient scales for ", k, " (MicroBatch::mtp_grad_scale)");
  s.mtp.clear();
  s.mtp.resize(k);
  s.mtp_head.clear();
  s.mtp_head.resize(k);
  double aux = 0;
  for (size_t j = 0; j < k; ++j) {
    const TraceRange trace("prediction head " + std::to_string(j + 1));
    const layers::Block& block = mtp_blocks_[j];
    block.forward(env_, xt, seg, s.mtp[j], s.jitter_seed);
    if (with_grad && moe_aux_ && block.kind() == layers::BlockKind::Experts) aux += block.aux_loss(s.mtp[j]);
    const float scale = with_grad ? mb.mtp_grad_scale[j] * head_weights_[j + 1] : 0.f;
    mtp_loss_sums_[j] +=
        mtp_heads_[j]->forward(env_, s.mtp[j].y, mb.mtp_labels[j], mb.mtp_mask[j], with_grad, scale, s.mtp_head[j]);
    // The head's backward ran inside its forward: the block's output is no longer needed, and
    // without gradients (or with recomputation) neither is anything else of the block.
    if (!with_grad || layout_.recompute) s.mtp[j] = layers::BlockSaved{};
  }
  if (!with_grad) {
    s.mtp.clear();
    s.mtp_head.clear();
  }
  return aux;
}

Owned Transformer::mtp_backward(TSaved& s, const Tensor& xt, const layers::SegmentInfo& seg,
                                const Tensor& dx_colsum) {
  const size_t k = mtp_blocks_.size();
  ENSURE(s.mtp.size() == k && s.mtp_head.size() == k, "multi-token prediction: backward without a forward with "
         "gradients");
  Owned sum;
  for (size_t j = k; j-- > 0;) {
    const TraceRange trace("prediction head " + std::to_string(j + 1) + " backward");
    const layers::Block& block = mtp_blocks_[j];
    Owned dy = std::move(s.mtp_head[j].dx);
    Owned dx = env_.act_tensor(xt.shape);
    if (layout_.recompute) {  // the block's activations again, from the trunk output
      layers::BlockSaved again;
      block.forward(env_, xt, seg, again, s.jitter_seed);
      block.backward(env_, dy, xt, seg, again, dx, s.aux_grad_scale, dx_colsum);
    } else {
      block.backward(env_, dy, xt, seg, s.mtp[j], dx, s.aux_grad_scale, dx_colsum);
    }
    s.mtp[j] = layers::BlockSaved{};
    if (!sum.t.data)
      sum = std::move(dx);
    else
      ops::add_inplace(sum, dx);
  }
  s.mtp.clear();
  s.mtp_head.clear();
  return sum;
}

std::vector<double> Transformer::take_prediction_losses() {
  std::vector<double> out = mtp_loss_sums_;
  std::fill(mtp_loss_sums_.begin(), mtp_loss_sums_.end(), 0.0);
  return out;
}

void Transformer::prediction_logits(const MicroBatch& mb, int head, const Tensor& out) {
  ENSURE(head >= 0 && head <= config_.prediction_heads, "prediction head ", head, " of a model with ",
         config_.prediction_heads, " extra heads (model.prediction_heads)");
  if (head == 0) return logits(mb, out);
  const int64_t T = mb.num_tokens;
  expect_shape(out, {T, config_.vocab_size}, "logits");
  ENSURE(out.dtype == DType::F32 && out.device == env_.device, "logits: an f32 tensor on the model's device");
  expect_whole_model("logits");
  const layers::SegmentInfo seg = mb.segments(true);
  Owned x = env_.act_tensor({T, config_.hidden_size});
  embedding_.forward(env_, mb.tokens, mb.positions, x);
  for (int i = 0; i + 1 < config_.num_layers; ++i) {  // the trunk
    layers::BlockSaved s;
    blocks_[static_cast<size_t>(i)].forward(env_, x, seg, s);
    x = std::move(s.y);
  }
  layers::BlockSaved s;
  mtp_blocks_[static_cast<size_t>(head - 1)].forward(env_, x, seg, s);
  head_logits(s.y, out, "mtp." + std::to_string(head) + ".norm");
}

}  // namespace engine
