#include "layers/attention.h"

#include <cmath>

#include "layers/linear.h"
#include "ops/attention.h"
#include "ops/rope.h"

namespace engine::layers {

Attention::Attention(const ParamStore& store, const std::string& prefix, const ModelConfig& c)
    : heads_(c.num_heads), kv_heads_(c.num_kv_heads), head_dim_(c.head_dim),
      window_(c.sliding_window), rope_(c.positions == PositionKind::Rope),
      theta_(static_cast<float>(c.rope_theta)) {
  wqkv_ = adjacent_rows(store, {prefix + ".wq", prefix + ".wk", prefix + ".wv"});
  wo_ = Param(store, prefix + ".wo");
  if (c.bias || c.qkv_bias) bqkv_ = adjacent_rows(store, {prefix + ".bq", prefix + ".bk", prefix + ".bv"});
  if (c.bias) bo_ = Param(store, prefix + ".bo");
}

void Attention::declare(ParamTable& t, const std::string& prefix, const ModelConfig& c) {
  const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_heads, Hkv = c.num_kv_heads;
  const double out_std = c.init_std / std::sqrt(2.0 * c.num_layers);
  t.add({.name = prefix + ".wq", .shape = {H * D, C}, .init_std = c.init_std});
  t.add({.name = prefix + ".wk", .shape = {Hkv * D, C}, .init_std = c.init_std, .adjacent = true});
  t.add({.name = prefix + ".wv", .shape = {Hkv * D, C}, .init_std = c.init_std, .adjacent = true});
  t.add({.name = prefix + ".wo", .shape = {C, H * D}, .init_std = out_std});
  if (c.bias || c.qkv_bias) {  // qkv_bias alone: Qwen2's biases on q, k, v but not o
    t.add({.name = prefix + ".bq", .shape = {H * D}, .init = InitKind::Zeros, .weight_decay = false});
    t.add({.name = prefix + ".bk", .shape = {Hkv * D}, .init = InitKind::Zeros, .weight_decay = false, .adjacent = true});
    t.add({.name = prefix + ".bv", .shape = {Hkv * D}, .init = InitKind::Zeros, .weight_decay = false, .adjacent = true});
  }
  if (c.bias) t.add({.name = prefix + ".bo", .shape = {C}, .init = InitKind::Zeros, .weight_decay = false});
}

ops::AttentionParams Attention::op_params(const SegmentInfo& seg, const AttentionSaved& s) const {
  ops::AttentionParams p;
  p.qkv = s.qkv;
  p.out = s.out;
  p.lse = s.lse;
  p.cu_seqlens = seg.cu_seqlens;
  p.max_seqlen = seg.max_seqlen;
  p.num_heads = heads_;
  p.num_kv_heads = kv_heads_;
  p.head_dim = head_dim_;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(head_dim_));
  p.causal = true;
  p.window = window_;
  return p;
}

void Attention::forward(const Env& env, const Tensor& xn, const SegmentInfo& seg, const Tensor& y,
                        AttentionSaved& s) const {
  const int64_t T = xn.size(0);
  const int NH = heads_ + 2 * kv_heads_;
  s.qkv = env.act_tensor({T, NH, head_dim_});
  s.out = env.act_tensor({T, heads_, head_dim_});
  s.lse = env.stat_tensor({T, heads_});
  linear_forward(xn, wqkv_.w(), bqkv_.w(), s.qkv->view({T, int64_t{NH} * head_dim_}));
  if (rope_) ops::rope_forward(s.qkv, seg.positions, heads_ + kv_heads_, theta_);
  ops::attention_forward(op_params(seg, s));
  linear_forward(s.out->view({T, int64_t{heads_} * head_dim_}), wo_.w(), bo_.w(), y);
}

void Attention::backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                         const AttentionSaved& s, const Tensor& dxn) const {
  const int64_t T = xn.size(0);
  const int NH = heads_ + 2 * kv_heads_;
  Owned dout = env.act_tensor({T, heads_, head_dim_});
  linear_backward(dy, s.out->view({T, int64_t{heads_} * head_dim_}), wo_.w(),
                  dout->view({T, int64_t{heads_} * head_dim_}), wo_.g(), bo_.g());
  Owned dqkv = env.act_tensor({T, NH, head_dim_});
  ops::AttentionBackwardParams b;
  b.fwd = op_params(seg, s);
  b.dout = dout;
  b.dqkv = dqkv;
  ops::attention_backward(b);
  if (rope_) ops::rope_backward(dqkv, seg.positions, heads_ + kv_heads_, theta_);
  linear_backward(dqkv->view({T, int64_t{NH} * head_dim_}), xn, wqkv_.w(), dxn, wqkv_.g(), bqkv_.g());
}

}  // namespace engine::layers
