#include "layers/vision.h"

#include "layers/linear.h"
#include "ops/activation.h"

namespace engine::layers {

ModelConfig vision_block_config(const VisionConfig& v) {
  ModelConfig c;
  c.family = ModelFamily::Llama;
  c.hidden_size = v.width;
  c.num_layers = v.layers;
  c.num_heads = v.heads;
  c.num_kv_heads = v.heads;
  c.head_dim = v.heads > 0 ? v.width / v.heads : 0;
  c.ffn_hidden_size = v.ffn;
  c.norm = NormKind::RMSNorm;
  c.norm_eps = v.norm_eps;
  c.activation = ActivationKind::SwiGLU;
  c.positions = PositionKind::Rope;
  c.rope_theta = v.rope_theta;
  c.init_std = v.init_std;
  c.causal = false;
  return c;
}

namespace {

std::string layer_prefix(const std::string& prefix, int i) { return prefix + ".layers." + std::to_string(i); }

}  // namespace

VisionEncoder::VisionEncoder(const ParamStore& store, const std::string& prefix, const VisionConfig& v)
    : v_(v),
      patch_(store, prefix + ".patch_conv"),
      w1_(store, prefix + ".projector.w1"),
      w2_(store, prefix + ".projector.w2"),
      ln_pre_(store, prefix + ".ln_pre", NormKind::RMSNorm, static_cast<float>(v.norm_eps), false) {
  if (v.projector_bias) {
    b1_ = Param(store, prefix + ".projector.b1");
    b2_ = Param(store, prefix + ".projector.b2");
  }
  const ModelConfig c = vision_block_config(v);
  for (int i = 0; i < v.layers; ++i) blocks_.emplace_back(store, layer_prefix(prefix, i), BlockKind::Attention, c);
}

void VisionEncoder::declare(ParamTable& t, const std::string& prefix, const VisionConfig& v) {
  const int64_t in = int64_t{v.channels} * v.patch_size * v.patch_size;
  ENSURE(v.channels > 0 && v.patch_size > 0 && v.width > 0 && v.layers >= 0 && v.heads > 0 && v.ffn > 0 &&
             v.text_width > 0 && v.width % v.heads == 0 && (v.width / v.heads) % 4 == 0,
         "vision encoder ", prefix, ": channels ", v.channels, ", patch_size ", v.patch_size, ", width ", v.width,
         ", heads ", v.heads, ", ffn ", v.ffn, ", text_width ", v.text_width,
         " must be positive, the width whole heads whose dim is a multiple of 4 (the 2-D RoPE's quarters)");
  t.add({.name = prefix + ".patch_conv", .shape = {v.width, in}, .init_std = v.init_std});
  Norm::declare(t, prefix + ".ln_pre", v.width, NormKind::RMSNorm, false);
  const ModelConfig c = vision_block_config(v);
  for (int i = 0; i < v.layers; ++i) Block::declare(t, layer_prefix(prefix, i), BlockKind::Attention, c);
  t.add({.name = prefix + ".projector.w1", .shape = {v.text_width, v.width}, .init_std = v.init_std});
  if (v.projector_bias)
    t.add({.name = prefix + ".projector.b1", .shape = {v.text_width}, .init = InitKind::Zeros, .weight_decay = false});
  t.add({.name = prefix + ".projector.w2", .shape = {v.text_width, v.text_width}, .init_std = v.init_std});
  if (v.projector_bias)
    t.add({.name = prefix + ".projector.b2", .shape = {v.text_width}, .init = InitKind::Zeros, .weight_decay = false});
}

void VisionEncoder::forward(const Env& env, const Tensor& patches, const SegmentInfo& images, VisionSaved& s,
                            const Tensor& features) const {
  const int64_t n = patches.size(0);
  const LinearPrecision one{};  // replicated: every rank runs the whole product
  s.x0 = env.act_tensor({n, v_.width});
  linear_forward(one, patches, patch_.w(), {}, s.x0);
  s.xn = env.act_tensor({n, v_.width});
  ln_pre_.forward(env, s.x0, s.xn, s.ln);
  s.blocks.clear();
  s.blocks.resize(blocks_.size());
  Tensor x = s.xn;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    blocks_[i].forward(env, x, images, s.blocks[i]);
    x = s.blocks[i].y;
  }
  s.h = env.act_tensor({n, v_.text_width});
  linear_forward(one, x, w1_.w(), b1_ ? b1_.w() : Tensor{}, s.h);
  s.a = env.act_tensor({n, v_.text_width});
  ops::gelu_erf_forward(s.h, s.a);
  linear_forward(one, s.a, w2_.w(), b2_ ? b2_.w() : Tensor{}, features);
}

void VisionEncoder::backward(const Env& env, const Tensor& dfeatures, const Tensor& patches,
                             const SegmentInfo& images, const VisionSaved& s) const {
  const int64_t n = patches.size(0);
  const LinearPrecision one{};
  const Tensor x = blocks_.empty() ? Tensor(s.xn) : Tensor(s.blocks.back().y);
  Owned da = env.act_tensor({n, v_.text_width}), dh = env.act_tensor({n, v_.text_width});
  linear_backward(one, dfeatures, s.a, w2_.w(), da, w2_.g(), b2_ ? b2_.g() : Tensor{});
  ops::gelu_erf_backward(da, s.h, dh);
  Owned dx = env.act_tensor({n, v_.width}), dprev = env.act_tensor({n, v_.width});
  linear_backward(one, dh, x, w1_.w(), dx, w1_.g(), b1_ ? b1_.g() : Tensor{});
  for (size_t i = blocks_.size(); i-- > 0;) {
    const Tensor in = i == 0 ? Tensor(s.xn) : Tensor(s.blocks[i - 1].y);
    blocks_[i].backward(env, dx, in, images, s.blocks[i], dprev);
    std::swap(dx, dprev);
  }
  Owned dx0 = env.act_tensor({n, v_.width});
  ln_pre_.backward(dx, s.x0, s.ln, dx0);
  linear_backward(one, dx0, patches, patch_.w(), {}, patch_.g(), {});
}

}  // namespace engine::layers
