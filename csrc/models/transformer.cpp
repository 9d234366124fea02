#include "models/transformer.h"

#include "core/log.h"
#include "core/trace.h"
#include "layers/linear.h"
#include "layers/lora.h"
#include "models/transformer_saved.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/moe.h"

namespace engine {

VisionConfig Transformer::vision_config(const ModelConfig& c) {
  VisionConfig v = c.vision;
  v.text_width = c.hidden_size;
  return v;
}

std::vector<Transformer::StagePlan> Transformer::stage_plan(int num_layers, int stages) {
  ENSURE(stages >= 1 && stages <= num_layers, stages, " pipeline stages for ", num_layers,
         " blocks: every stage needs one");
  std::vector<StagePlan> plan(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    StagePlan& p = plan[static_cast<size_t>(s)];
    p.first_block = static_cast<int>(int64_t{s} * num_layers / stages);
    p.end_block = static_cast<int>(int64_t{s + 1} * num_layers / stages);
    p.embedding = s == 0;
    p.head = s == stages - 1;
  }
  return plan;
}

void Transformer::declare(ParamTable& t, const ModelConfig& c, const ModelLayout& layout) {
  const std::vector<StagePlan> plan = stage_plan(c.num_layers, layout.stages());
  for (int s = 0; s < layout.stages(); ++s) {
    if (!layout.has_stage(s)) continue;
    const StagePlan& p = plan[static_cast<size_t>(s)];
    // (The vision encoder first: its backward runs last, after the embedding's.)
    if (p.embedding && c.vision.layers > 0) layers::VisionEncoder::declare(t, kVision, vision_config(c));
    if (p.embedding) layers::Embedding::declare(t, c);
    for (int i = p.first_block; i < p.end_block; ++i) layers::Block::declare(t, i, c);
    if (p.head) {
      if (c.tie_embeddings && !layout.has_stage(0))  // the head's copy of the tied table
        t.add({.name = layers::Embedding::kTokens, .shape = {c.vocab_size, c.hidden_size}, .split_dim = 0,
               .init_std = c.init_std});
      layers::LmHead::declare(t, c);
      const layers::BlockKind last = layers::block_kind(c, c.num_layers - 1);
      for (int j = 1; j <= c.prediction_heads; ++j) {
        const std::string m = "mtp." + std::to_string(j);
        layers::Block::declare(t, m, last, c);
        layers::Norm::declare(t, m + ".norm", c.hidden_size, c.norm, c.bias);
      }
    }
  }
}

ParamTable model_param_table(const ModelConfig& c, const ModelLayout& layout, int tp_rank, int tp_size) {
  ParamTable t(tp_rank, tp_size);
  layers::set_lora_freezing(t, c);  // LoRA: every base parameter frozen
  Transformer::declare(t, c, layout);
  return t;
}

ParamTable model_param_table(const ModelConfig& c, int tp_rank, int tp_size) {
  return model_param_table(c, ModelLayout{}, tp_rank, tp_size);
}

namespace {
// Where block i's gradients begin in the flat buffer: its first trainable parameter's offset (with
// LoRA the block's norm1 is frozen, core/params.h), or for a block with none the next trainable
// parameter's (what follows it is complete when its backward ends anyway).
int64_t block_grads_begin(const ParamTable& t, int i) {
  const std::string prefix = "layers." + std::to_string(i) + ".";
  bool in_block = false;
  for (const ParamSpec& s : t.entries()) {
    in_block = in_block || s.name.compare(0, prefix.size(), prefix) == 0;
    if (in_block && !s.frozen) return s.offset;
  }
  return t.total_elements();
}
}  // namespace

Transformer::Transformer(const ModelConfig& c, Device device, DType compute_dtype, int64_t capacity,
                         const ModelLayout& layout)
    : config_(c), layout_(layout), plan_(stage_plan(c.num_layers, layout.stages())),
      store_(model_param_table(c, layout, layout.tp_rank(), layout.tp_size()), device, compute_dtype, capacity,
             layout.pad_multiple),
      env_{device, compute_dtype, layout.tp, layout.sequence_parallel, layout.tp_overlap, layout.fp8} {
  blocks_.resize(static_cast<size_t>(c.num_layers));
  moe_aux_ = c.moe_aux_loss_coef > 0 || c.moe_z_loss_coef > 0;
  block_offsets_.assign(static_cast<size_t>(c.num_layers), -1);
  for (int s = 0; s < num_stages(); ++s) {
    if (!has_stage(s)) continue;
    const StagePlan& p = plan_[static_cast<size_t>(s)];
    if (p.embedding) embedding_ = layers::Embedding(store_, c);
    if (p.embedding && c.vision.layers > 0) {
      ENSURE(device == Device::CPU && layout.tp_size() == 1 && layout.pipeline_size == 1,
             "a vision encoder (model.vision) runs on the CPU, on one rank and one pipeline stage so far: this ",
             "model asks for ", device == Device::CPU ? "" : "a GPU, ", layout.tp_size(), " tensor-parallel and ",
             layout.pipeline_size, " pipeline rank(s)");
      vision_ = layers::VisionEncoder(store_, kVision, vision_config(c));
    }
    for (int i = p.first_block; i < p.end_block; ++i) {
      blocks_[static_cast<size_t>(i)] = layers::Block(store_, i, c);
      block_offsets_[static_cast<size_t>(i)] = block_grads_begin(store_.table(), i);
    }
    if (p.head) {
      head_ = std::make_unique<layers::LmHead>(store_, c, layout.cross_entropy_splits);
      const layers::BlockKind last = layers::block_kind(c, c.num_layers - 1);
      for (int j = 1; j <= c.prediction_heads; ++j) {
        const std::string m = "mtp." + std::to_string(j);
        mtp_blocks_.emplace_back(store_, m, last, c);
        mtp_heads_.push_back(std::make_unique<layers::LmHead>(store_, c, layout.cross_entropy_splits, m + ".norm"));
      }
      if (has_mtp()) mtp_offset_ = store_.table().get("mtp.1.norm1.weight").offset;
    }
  }
  mtp_loss_sums_.assign(static_cast<size_t>(c.prediction_heads), 0.0);
  head_weights_.assign(static_cast<size_t>(c.prediction_heads) + 1, 1.f);
  for (size_t j = 0; j < c.prediction_loss_weights.size() && j < head_weights_.size(); ++j)
    head_weights_[j] = static_cast<float>(c.prediction_loss_weights[j]);
  // Which attention kernels the blocks run (chosen from the device and the head dim).
  if (has_block_kind(c, "AE")) {  // attention and MoE blocks
    const int head_dim = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_heads;
    log_info("attention: ", device == Device::CUDA && c.attention_backend == AttentionBackendKind::Cudnn
                                ? "cudnn"
                                : ops::attention_kernel_name(device, head_dim), " kernels, head dim ", head_dim);
  }
}

int64_t Transformer::local_tokens(const MicroBatch& mb) const {
  if (!env_.sp()) return mb.num_tokens;
  ENSURE(mb.num_tokens % env_.tp_size() == 0, "sequence parallelism: a micro-batch of ", mb.num_tokens,
         " tokens does not split over ", env_.tp_size(), " tensor-parallel ranks");
  return mb.num_tokens / env_.tp_size();
}

Shape Transformer::stage_activation_shape(const MicroBatch& mb) const {
  return {local_tokens(mb), config_.hidden_size};
}

void Transformer::record(const std::string& name, const Tensor& x) const {
  // Without sequence parallelism every tp rank holds the same residual stream: count it once.
  if (stats_ && (env_.sp() || env_.tp_rank() == 0)) stats_->record(name, x);
}

std::unique_ptr<Model::Saved> Transformer::new_saved() const { return std::make_unique<TSaved>(); }

layers::SegmentInfo Transformer::image_segments(const MicroBatch& mb) {
  layers::SegmentInfo images;
  images.cu_seqlens = mb.image_cu;
  images.positions = mb.patch_positions;
  images.max_seqlen = mb.max_image_patches;
  return images;
}

void Transformer::embed(const MicroBatch& mb, const Tensor& x, layers::VisionSaved& vision) const {
  embedding_.forward(env_, mb.tokens, mb.positions, x);
  if (mb.num_patches() == 0) return;
  ENSURE(config_.vision.layers > 0, "the micro-batch has ", mb.num_patches(),
         " image patches but the model has no vision encoder (model.vision)");
  ENSURE(mb.chunks == 1, "images in a micro-batch cut into micro-sequences: not supported yet");
  ops::expect(mb.image_rows, DType::I32, {mb.num_patches(), 1}, "micro-batch", "image_rows");
  Owned features = env_.act_tensor({mb.num_patches(), config_.hidden_size});
  vision_.forward(env_, mb.patches, image_segments(mb), vision, features);
  ops::moe_permute(features, mb.image_rows, x);
}

double Transformer::forward_stage(int stage, const MicroBatch& mb, Saved& saved, const Tensor& input,
                                  bool with_grad, float grad_scale) {
  ENSURE(stage >= 0 && stage < num_stages() && has_stage(stage), "stage ", stage, " is not on this rank");
  auto& s = static_cast<TSaved&>(saved);
  const StagePlan& p = plan_[static_cast<size_t>(stage)];
  const layers::SegmentInfo seg = mb.segments(!with_grad);
  const Tensor* x;
  if (p.embedding) {
    s.x0 = env_.act_tensor(stage_activation_shape(mb));
    embed(mb, s.x0, s.vision);
    if (!with_grad) s.vision = layers::VisionSaved{};  // (no backward reads it)
    x = &s.x0.t;
    if (with_grad) record(StatsRecorder::forward_name(-1), *x);
  } else {
    expect_shape(input, stage_activation_shape(mb), "stage input");
    s.input = input;
    x = &s.input;
  }
  s.blocks.clear();
  s.blocks.resize(static_cast<size_t>(p.end_block - p.first_block));
  // Mixture-of-experts auxiliary losses join the training loss weighted by the micro-batch's
  // loss tokens: summed over the global batch and scaled by grad_scale (1 / its loss tokens)
  // they are the token-weighted mean of the micro-batches' auxiliary losses.
  s.aux_grad_scale = grad_scale * static_cast<float>(mb.loss_tokens);
  const uint64_t jitter_seed = s.jitter_seed = with_grad ? mb.jitter_seed : 0;
  double aux = 0;
  // Multi-token prediction: the extra heads run on block L-1's input, kept until they ran.
  const int64_t trunk_k = p.head && has_mtp() ? config_.num_layers - 1 - p.first_block : -1;
  for (int i = p.first_block; i < p.end_block; ++i) {
    const size_t k = static_cast<size_t>(i - p.first_block);
    const layers::Block& block = blocks_[static_cast<size_t>(i)];
    const TraceRange trace("block " + std::to_string(i) + " forward");
    block.forward(env_, *x, seg, s.blocks[k], jitter_seed);
    if (with_grad && moe_aux_ && block.kind() == layers::BlockKind::Experts) aux += block.aux_loss(s.blocks[k]);
    if (with_grad && layout_.recompute) {  // keep the output only (the next block's input)
      Owned y = std::move(s.blocks[k].y);
      s.blocks[k] = layers::BlockSaved{};
      s.blocks[k].y = std::move(y);
    }
    // Without gradients only the current block's output is needed: drop the rest at once.
    if (!with_grad && k > 0 && static_cast<int64_t>(k) != trunk_k) s.blocks[k - 1] = layers::BlockSaved{};
    if (!with_grad && k == 0 && trunk_k != 0) s.x0 = Owned{};
    x = &s.blocks[k].y.t;
    if (with_grad) record(StatsRecorder::forward_name(i), *x);
  }
  if (!p.head) return aux * static_cast<double>(mb.loss_tokens);
  Owned teacher;
  if (teacher_) {  // the teacher's logits of this micro-batch, just in time (one alive at a time)
    teacher = env_.act_tensor({mb.num_tokens, head_->local_vocab()});
    teacher_(mb, teacher);
  }
  const TraceRange trace("head and loss");
  const double loss =
      head_->forward(env_, *x, mb.labels, mb.loss_mask, with_grad, grad_scale * head_weights_[0], s.head, teacher);
  if (has_mtp()) aux += mtp_forward(mb, s, trunk_output(s, p), seg, with_grad);
  if (!with_grad) s.blocks.clear();
  return loss + aux * static_cast<double>(mb.loss_tokens);
}

Tensor Transformer::stage_output(const Saved& saved) const {
  const auto& s = static_cast<const TSaved&>(saved);
  ENSURE(!s.blocks.empty() && s.blocks.back().y.t.data, "stage output before its forward");
  return s.blocks.back().y;
}

Tensor Transformer::stage_input_grad(const Saved& saved) const {
  const auto& s = static_cast<const TSaved&>(saved);
  ENSURE(s.input_grad.t.data, "stage input gradient before its backward");
  return s.input_grad;
}

void Transformer::backward_stage(int stage, const MicroBatch& mb, Saved& saved, const Tensor& grad_output,
                                 const GradsReady& grads_ready) {
  ENSURE(stage >= 0 && stage < num_stages() && has_stage(stage), "stage ", stage, " is not on this rank");
  auto& s = static_cast<TSaved&>(saved);
  const StagePlan& p = plan_[static_cast<size_t>(stage)];
  ENSURE(s.blocks.size() == static_cast<size_t>(p.end_block - p.first_block) && (!p.head || s.head.dx.t.data ||
                                                                                 mb.num_tokens == 0),
         "backward of stage ", stage, " without a forward with gradients");
  const layers::SegmentInfo seg = mb.segments();
  Owned dy_owned = p.head ? std::move(s.head.dx) : Owned{};
  Tensor dy = p.head ? dy_owned.t : grad_output;
  if (!p.head) expect_shape(dy, stage_activation_shape(mb), "stage output gradient");
  if (p.head) record(StatsRecorder::kHeadGrad, dy);
  // Multi-token prediction: the extra blocks' backward first; their input gradients join block
  // L-1's (the trunk output feeds all of them), and each sums its dx into block L-2's output bias
  // gradient as block L-1's backward does, when block L-2 is on this stage.
  Owned trunk_grad;
  if (p.head && has_mtp()) {
    const int last = config_.num_layers - 1;
    const Tensor colsum = last > p.first_block ? blocks_[static_cast<size_t>(last - 1)].out_bias_grad() : Tensor{};
    trunk_grad = mtp_backward(s, trunk_output(s, p), seg, colsum);
    if (grads_ready) grads_ready(mtp_offset_);
  }
  for (int i = p.end_block; i-- > p.first_block;) {
    const size_t k = static_cast<size_t>(i - p.first_block);
    const Tensor& x = k == 0 ? (p.embedding ? s.x0.t : s.input) : s.blocks[k - 1].y.t;
    Owned dx = env_.act_tensor(x.shape);
    const layers::Block& block = blocks_[static_cast<size_t>(i)];
    // dx is the previous block's dy, so the previous block's output bias gradient (sum_t dy) is
    // this block's second output where that block is on this stage (layers/block.h). The stage's
    // last block sums its own; every other block's was summed by the block after it.
    const Tensor dx_colsum = k > 0 ? blocks_[static_cast<size_t>(i - 1)].out_bias_grad() : Tensor{};
    const bool dy_summed = i + 1 < p.end_block;
    const TraceRange trace("block " + std::to_string(i) + " backward");
    auto backward = [&](const layers::BlockSaved& saved_block) {
      if (dy_summed)
        block.backward_except_out_bias(env_, dy, x, seg, saved_block, dx, s.aux_grad_scale, dx_colsum);
      else
        block.backward(env_, dy, x, seg, saved_block, dx, s.aux_grad_scale, dx_colsum);
    };
    if (layout_.recompute) {  // the block's activations again, from its kept input
      layers::BlockSaved again;
      block.forward(env_, x, seg, again, s.jitter_seed);
      backward(again);
    } else {
      backward(s.blocks[k]);
    }
    s.blocks[k] = layers::BlockSaved{};  // free this block's activations as soon as possible
    if (trunk_grad.t.data && i == config_.num_layers - 1) {
      ops::add_inplace(dx, trunk_grad);
      trunk_grad = Owned{};
    }
    dy_owned = std::move(dx);
    dy = dy_owned.t;
    record(StatsRecorder::backward_name(i), dy);
    // Block i and every parameter after it on this rank are complete.
    if (grads_ready) grads_ready(block_offsets_[static_cast<size_t>(i)]);
  }
  if (p.embedding) {
    // The image rows' gradient goes to the vision encoder, not to the image tokens' embeddings.
    Owned dfeatures;
    if (mb.num_patches() > 0) {
      dfeatures = env_.act_tensor({mb.num_patches(), config_.hidden_size});
      ops::moe_unpermute(dy, mb.image_rows, {}, dfeatures);
      ops::moe_permute(zeros(dfeatures->shape, dy.dtype, env_.device), mb.image_rows, dy);
    }
    embedding_.backward(env_, mb.tokens, mb.positions, dy);
    if (dfeatures.t.data) vision_.backward(env_, dfeatures, mb.patches, image_segments(mb), s.vision);
    s.vision = layers::VisionSaved{};
    if (grads_ready) grads_ready(0);
  } else {
    s.input_grad = std::move(dy_owned);
  }
  s.blocks.clear();
  s.x0 = Owned{};
  s.input = Tensor{};
}

double Transformer::forward(const MicroBatch& mb, Saved& saved, bool with_grad, float grad_scale) {
  auto& s = static_cast<TSaved&>(saved);
  ENSURE(layout_.pipeline_size == 1, "Model::forward runs every stage: use the pipeline for pipeline_parallel > 1");
  s.stages.clear();
  double loss = 0;
  Tensor x;
  for (int st = 0; st < num_stages(); ++st) {
    s.stages.push_back(std::make_unique<TSaved>());
    loss += forward_stage(st, mb, *s.stages.back(), x, with_grad, grad_scale);
    if (st + 1 < num_stages()) x = stage_output(*s.stages.back());
    if (!with_grad && st > 0) s.stages[static_cast<size_t>(st - 1)].reset();
  }
  if (!with_grad) s.stages.clear();
  return loss;
}

void Transformer::backward(const MicroBatch& mb, Saved& saved, const GradsReady& grads_ready) {
  auto& s = static_cast<TSaved&>(saved);
  ENSURE(s.stages.size() == static_cast<size_t>(num_stages()), "backward without a forward with gradients");
  Tensor dy;
  for (int st = num_stages(); st-- > 0;) {
    backward_stage(st, mb, *s.stages[static_cast<size_t>(st)], dy, grads_ready);
    if (st + 1 < num_stages()) s.stages[static_cast<size_t>(st + 1)].reset();
    if (st > 0) dy = stage_input_grad(*s.stages[static_cast<size_t>(st)]);
  }
  s.stages.clear();
}

void Transformer::vocab_logits(const MicroBatch& mb, const Tensor& out) {
  ENSURE(layout_.pipeline_size == 1, "vocab_logits runs every stage on one pipeline rank");
  expect_shape(out, {mb.num_tokens, head_->local_vocab()}, "vocab logits");
  const layers::SegmentInfo seg = mb.segments(true);
  Owned x = env_.act_tensor(stage_activation_shape(mb));
  layers::VisionSaved vs;
  embed(mb, x, vs);
  for (const layers::Block& b : blocks_) {
    layers::BlockSaved s;
    b.forward(env_, x, seg, s);
    x = std::move(s.y);
  }
  head_->logits(env_, x, out);
}

void Transformer::set_teacher(Teacher teacher, const DistillationConfig& distillation) {
  ENSURE(!teacher || !has_mtp(), "model.prediction_heads: not combined with distillation");
  teacher_ = std::move(teacher);
  if (head_) head_->set_distillation(teacher_ ? &distillation : nullptr);
}

void Transformer::expect_whole_model(const char* what) const {
  ENSURE(env_.tp_size() == 1 && layout_.pipeline_size == 1, what, " of a parallel model: run it on one rank");
}

void Transformer::logits(const MicroBatch& mb, const Tensor& out) {
  const int64_t T = mb.num_tokens, V = config_.vocab_size;
  expect_shape(out, {T, V}, "logits");
  ENSURE(out.dtype == DType::F32 && out.device == env_.device, "logits: an f32 tensor on the model's device");
  expect_whole_model("logits");
  const layers::SegmentInfo seg = mb.segments(true);
  Owned x = env_.act_tensor({T, config_.hidden_size});
  layers::VisionSaved vs;
  embed(mb, x, vs);
  for (const layers::Block& b : blocks_) {
    layers::BlockSaved s;
    b.forward(env_, x, seg, s);
    x = std::move(s.y);
  }
  head_logits(x, out);
}

void Transformer::head_logits(const Tensor& x, const Tensor& out, const std::string& norm_prefix) const {
  const int64_t T = x.size(0), V = config_.vocab_size;
  const layers::Norm norm(store_, norm_prefix, config_.norm, static_cast<float>(config_.norm_eps), config_.bias);
  Owned xn = env_.act_tensor({T, config_.hidden_size});
  layers::NormSaved ns;
  norm.forward(env_, x, xn, ns);
  const Tensor w = store_.weight(config_.tie_embeddings ? layers::Embedding::kTokens : "head.weight");
  if (env_.act == DType::F32) {
    layers::linear_forward(layers::LinearPrecision{}, xn, w, {}, out);
  } else {
    Owned y = env_.act_tensor({T, V});
    layers::linear_forward(layers::LinearPrecision{}, xn, w, {}, y);
    ops::cast(y, out);
  }
}

std::unique_ptr<Model> make_model(const ModelConfig& c, Device device, DType compute_dtype,
                                  int64_t capacity, const ModelLayout& layout) {
  switch (c.family) {
    case ModelFamily::GPT2:
    case ModelFamily::Llama:
    case ModelFamily::Mistral:
    case ModelFamily::Qwen2:
    case ModelFamily::Qwen3:
    case ModelFamily::Mixtral:
    case ModelFamily::Mamba:
    case ModelFamily::Mamba2:
    case ModelFamily::Hybrid:
    case ModelFamily::Qwen2Moe:
    case ModelFamily::Qwen3Moe:
      return std::make_unique<Transformer>(c, device, compute_dtype, capacity, layout);
  }
  RAISE("unknown model family");
}

}  // namespace engine
