#include "layers/block.h"

#include <string>
#include <utility>

#include "ops/elementwise.h"
#include "ops/gemm.h"

namespace engine::layers {

static std::string prefix(int i) { return "layers." + std::to_string(i); }

BlockKind block_kind(const ModelConfig& c, int layer) {
  const char letter = block_letter(c, layer);
  ENSURE(letter != 0, "layer ", layer, " is not in the model's layout (", c.num_layers, " layers)");
  switch (letter) {
    case 'E': return BlockKind::Experts;
    case 'M': return BlockKind::Mamba;
    case 'S': return BlockKind::Mamba2;
    case 'G': return BlockKind::DeltaNet;
    default: return BlockKind::Attention;
  }
}

MoeConfig moe_config(const ModelConfig& c) {
  MoeConfig m;
  m.hidden_size = c.hidden_size;
  m.ffn_hidden_size = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : c.ffn_hidden_size;
  m.num_experts = c.num_experts;
  m.top_k = c.experts_per_token;
  m.norm_topk_prob = c.moe_norm_topk_prob;
  m.shared_ffn_size = c.moe_shared_expert_ffn_size;
  m.aux_loss_coef = static_cast<float>(c.moe_aux_loss_coef);
  m.z_loss_coef = static_cast<float>(c.moe_z_loss_coef);
  m.jitter = static_cast<float>(c.moe_jitter);
  m.init_std = c.init_std;
  m.num_layers = c.num_layers;
  return m;
}

MambaConfig mamba_config(const ModelConfig& c) {
  MambaConfig m;
  m.hidden = c.hidden_size;
  m.d_inner = int64_t{c.mamba_expand} * c.hidden_size;
  m.d_state = c.mamba_d_state;
  m.d_conv = c.mamba_d_conv;
  m.dt_rank = c.mamba_dt_rank;
  m.conv_bias = c.mamba_conv_bias;
  m.proj_bias = c.mamba_proj_bias;
  m.init_std = c.init_std;
  m.num_layers = c.num_layers;
  return m;
}

Mamba2Config mamba2_config(const ModelConfig& c) {
  Mamba2Config m;
  m.hidden = c.hidden_size;
  m.d_inner = int64_t{c.mamba_expand} * c.hidden_size;
  m.head_dim = c.mamba_head_dim;
  m.n_groups = c.mamba_n_groups;
  m.d_state = c.mamba_d_state;
  m.d_conv = c.mamba_d_conv;
  m.conv_bias = c.mamba_conv_bias;
  m.proj_bias = c.mamba_proj_bias;
  m.norm_eps = c.norm_eps;
  m.dt_limit_min = c.mamba_dt_limit_min;
  m.dt_limit_max = c.mamba_dt_limit_max;
  m.norm_per_group = c.mamba_norm_per_group;
  m.init_std = c.init_std;
  m.num_layers = c.num_layers;
  return m;
}

DeltaNetConfig deltanet_config(const ModelConfig& c) {
  DeltaNetConfig m;
  m.hidden = c.hidden_size;
  m.key_heads = c.gdn_num_key_heads;
  m.value_heads = c.gdn_num_value_heads;
  m.key_dim = c.gdn_key_head_dim;
  m.value_dim = c.gdn_value_head_dim;
  m.d_conv = c.gdn_conv_kernel;
  m.norm_eps = c.norm_eps;
  m.init_std = c.init_std;
  m.num_layers = c.num_layers;
  return m;
}

Block::Block(const ParamStore& store, int i, const ModelConfig& c) : Block(store, prefix(i), block_kind(c, i), c) {}

void Block::declare(ParamTable& t, int i, const ModelConfig& c) { declare(t, prefix(i), block_kind(c, i), c); }

Block::Block(const ParamStore& store, const std::string& p, BlockKind kind, const ModelConfig& c)
    : kind_(kind), norm1_(store, p + ".norm1", c.norm, static_cast<float>(c.norm_eps), c.bias) {
  if (kind_ == BlockKind::Mamba) {
    mamba_ = Mamba(store, p + ".mamba", mamba_config(c));
    return;
  }
  if (kind_ == BlockKind::Mamba2) {
    mamba2_ = Mamba2(store, p + ".mamba2", mamba2_config(c));
    return;
  }
  norm2_ = Norm(store, p + ".norm2", c.norm, static_cast<float>(c.norm_eps), c.bias);
  if (kind_ == BlockKind::DeltaNet)
    gdn_ = DeltaNet(store, p + ".gdn", deltanet_config(c));
  else
    attn_ = Attention(store, p + ".attn", c);
  if (kind_ == BlockKind::Experts)
    moe_ = Moe(store, p + ".moe", moe_config(c));
  else
    mlp_ = Mlp(store, p + ".mlp", c);
}

void Block::declare(ParamTable& t, const std::string& p, BlockKind kind, const ModelConfig& c) {
  Norm::declare(t, p + ".norm1", c.hidden_size, c.norm, c.bias);
  if (kind == BlockKind::Mamba) return Mamba::declare(t, p + ".mamba", mamba_config(c));
  if (kind == BlockKind::Mamba2) return Mamba2::declare(t, p + ".mamba2", mamba2_config(c));
  if (kind == BlockKind::DeltaNet)
    DeltaNet::declare(t, p + ".gdn", deltanet_config(c));
  else
    Attention::declare(t, p + ".attn", c);
  Norm::declare(t, p + ".norm2", c.hidden_size, c.norm, c.bias);
  if (kind == BlockKind::Experts)
    Moe::declare(t, p + ".moe", moe_config(c));
  else
    Mlp::declare(t, p + ".mlp", c);
}

void Block::forward(const Env& env, const Tensor& x, const SegmentInfo& seg, BlockSaved& s,
                    uint64_t jitter_seed) const {
  const Shape shape = x.shape;
  // Per-tensor FP8: the norms write their outputs' amaxes for the q/k/v and MLP input linears.
  // (Not under sequence parallelism: there a rank's norm sees its token shard only.)
  const bool norm_amax = env.fp8 == Fp8Recipe::Tensorwise && !env.sp();
  const bool attention = kind_ == BlockKind::Attention || kind_ == BlockKind::Experts;
  Fp8Amax a1 = norm_amax && attention ? Fp8Amax::on(env.device) : Fp8Amax{};
  s.xn1 = env.act_tensor(shape);
  norm1_.forward(env, x, s.xn1, s.norm1, a1.t);
  if (kind_ == BlockKind::Mamba) {
    s.y = env.act_tensor(shape);
    mamba_.forward(env, s.xn1, s.y, seg, s.mamba);
    ops::add(s.y, x, s.y);  // y = x + mamba
    return;
  }
  if (kind_ == BlockKind::Mamba2) {
    s.y = env.act_tensor(shape);
    mamba2_.forward(env, s.xn1, s.y, seg, s.mamba2);
    ops::add(s.y, x, s.y);  // y = x + mamba2
    return;
  }
  s.h = env.act_tensor(shape);
  if (kind_ == BlockKind::DeltaNet)
    gdn_.forward(env, s.xn1, s.h, seg, s.gdn);
  else
    attn_.forward(env, s.xn1, seg, s.h, s.attn, std::move(a1));
  Fp8Amax a2 = norm_amax && kind_ != BlockKind::Experts ? Fp8Amax::on(env.device) : Fp8Amax{};
  s.xn2 = env.act_tensor(shape);
  norm2_.forward_residual(env, s.h, x, s.h, s.xn2, s.norm2, a2.t);  // h = attn + x in place; norm2(h)
  s.y = env.act_tensor(shape);
  if (kind_ == BlockKind::Experts) {
    moe_.forward(env, s.xn2, s.y, s.moe, jitter_seed);
    ops::add(s.y, s.h, s.y);  // y = h + moe
  } else {
    mlp_.forward(env, s.xn2, s.y, s.mlp, s.h, std::move(a2));  // y = h + mlp
  }
}

void Block::backward(const Env& env, const Tensor& dy, const Tensor& x, const SegmentInfo& seg,
                     const BlockSaved& s, const Tensor& dx, float aux_grad_scale,
                     const Tensor& dx_colsum) const {
  if (const Tensor g = out_bias_grad(); g.data) ops::sum_rows(dy.rows(), g, 1.f);
  backward_except_out_bias(env, dy, x, seg, s, dx, aux_grad_scale, dx_colsum);
}

void Block::backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& x,
                                     const SegmentInfo& seg, const BlockSaved& s,
                                     const Tensor& dx, float aux_grad_scale,
                                     const Tensor& dx_colsum) const {
  const Shape shape = x.shape;
  Owned dxn = env.act_tensor(shape);
  if (kind_ == BlockKind::Mamba) {
    mamba_.backward_except_out_bias(env, dy, s.xn1, seg, s.mamba, dxn);
    // residual: dx = dy + d(mamba branch)
    norm1_.backward_residual(dxn, x, s.norm1, dy, dx, dx_colsum);
    return;
  }
  if (kind_ == BlockKind::Mamba2) {
    mamba2_.backward_except_out_bias(env, dy, s.xn1, seg, s.mamba2, dxn);
    norm1_.backward_residual(dxn, x, s.norm1, dy, dx, dx_colsum);  // residual: dx = dy + d(mamba2 branch)
    return;
  }
  if (kind_ == BlockKind::Experts)
    moe_.backward(env, dy, s.xn2, s.moe, dxn, aux_grad_scale);
  else
    mlp_.backward_except_out_bias(env, dy, s.xn2, s.mlp, dxn);
  Owned dh = env.act_tensor(shape);
  // residual: dh = dy + d(norm2 branch), summed into the attention's output bias gradient
  if (kind_ == BlockKind::DeltaNet) {
    norm2_.backward_residual(dxn, s.h, s.norm2, dy, dh);
    gdn_.backward(env, dh, s.xn1, seg, s.gdn, dxn);
  } else {
    norm2_.backward_residual(dxn, s.h, s.norm2, dy, dh, attn_.out_bias_grad());
    attn_.backward_except_out_bias(env, dh, s.xn1, seg, s.attn, dxn);
  }
  norm1_.backward_residual(dxn, x, s.norm1, dh, dx, dx_colsum);  // residual: dx = dh + d(norm1 branch)
}

Tensor Block::out_bias_grad() const {
  if (kind_ == BlockKind::Mamba) return mamba_.out_bias_grad();
  if (kind_ == BlockKind::Mamba2) return mamba2_.out_bias_grad();
  return kind_ == BlockKind::Attention || kind_ == BlockKind::DeltaNet ? mlp_.out_bias_grad() : Tensor{};
}

double Block::aux_loss(const BlockSaved& s) const {
  return kind_ == BlockKind::Experts ? Moe::aux_loss(s.moe) : 0.0;
}

}  // namespace engine::layers
