#include "layers/block.h"

#include <string>

#include "ops/elementwise.h"

namespace engine::layers {

static std::string prefix(int i) { return "layers." + std::to_string(i); }

Block::Block(const ParamStore& store, int i, const ModelConfig& c)
    : norm1_(store, prefix(i) + ".norm1", c.norm, static_cast<float>(c.norm_eps), c.bias),
      norm2_(store, prefix(i) + ".norm2", c.norm, static_cast<float>(c.norm_eps), c.bias),
      attn_(store, prefix(i) + ".attn", c),
      mlp_(store, prefix(i) + ".mlp", c) {}

void Block::declare(ParamTable& t, int i, const ModelConfig& c) {
  Norm::declare(t, prefix(i) + ".norm1", c.hidden_size, c.norm, c.bias);
  Attention::declare(t, prefix(i) + ".attn", c);
  Norm::declare(t, prefix(i) + ".norm2", c.hidden_size, c.norm, c.bias);
  Mlp::declare(t, prefix(i) + ".mlp", c);
}

void Block::forward(const Env& env, const Tensor& x, const SegmentInfo& seg, BlockSaved& s) const {
  const Shape shape = x.shape;
  s.xn1 = env.act_tensor(shape);
  norm1_.forward(env, x, s.xn1, s.norm1);
  s.h = env.act_tensor(shape);
  attn_.forward(env, s.xn1, seg, s.h, s.attn);
  ops::add(s.h, x, s.h);  // h = x + attn
  s.xn2 = env.act_tensor(shape);
  norm2_.forward(env, s.h, s.xn2, s.norm2);
  s.y = env.act_tensor(shape);
  mlp_.forward(env, s.xn2, s.y, s.mlp);
  ops::add(s.y, s.h, s.y);  // y = h + mlp
}

void Block::backward(const Env& env, const Tensor& dy, const Tensor& x, const SegmentInfo& seg,
                     const BlockSaved& s, const Tensor& dx) const {
  const Shape shape = x.shape;
  Owned dxn = env.act_tensor(shape);
  mlp_.backward(env, dy, s.xn2, s.mlp, dxn);
  Owned dh = env.act_tensor(shape);
  norm2_.backward(dxn, s.h, s.norm2, dh);
  ops::add_inplace(dh, dy);  // residual: dh = dy + d(norm2 branch)
  attn_.backward(env, dh, s.xn1, seg, s.attn, dxn);
  norm1_.backward(dxn, x, s.norm1, dx);
  ops::add_inplace(dx, dh);  // residual: dx = dh + d(norm1 branch)
}

}  // namespace engine::layers
