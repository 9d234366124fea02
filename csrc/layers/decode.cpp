// One-token decode paths of the layers (text generation, train/generate.h): Attention, Mamba and
// Block each take one new token (1, C) and a cache of what the sequence's earlier tokens left,
// and compute what their forward computes for the last row of the whole sequence:
//   Attention: qkv of the token (the forward's GEMM), RoPE at its position, k and v appended to
//     the cache, the query against every cached key within the window (ops::attention_decode),
//     the output projection.
//   Mamba: in_proj, one conv step (ops::causal_conv1d_step on the cached inputs), x_proj and
//     dt_proj as in forward, one scan step (ops::selective_scan_step on the cached state), out_proj.
//   Block: the norms, residuals and the MLP / mixture of experts of forward on one row.
// No tensor parallelism (one rank holds every weight); nothing is kept for a backward.
#include <cmath>

#include "layers/attention.h"
#include "layers/block.h"
#include "layers/linear.h"
#include "layers/mamba.h"
#include "ops/decode.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/qk_norm.h"
#include "ops/rope.h"
#include "parallel/tensor_parallel.h"

namespace engine::layers {

namespace {
void expect_one_rank(const Env& env, const char* layer) {
  ENSURE(env.tp_size() == 1, layer, " decode runs on one rank (tensor parallelism splits its weights)");
}
}  // namespace

AttentionCache Attention::new_cache(const Env& env, int64_t capacity) const {
  ENSURE(capacity >= 1, "attention cache of ", capacity, " positions");
  AttentionCache c;
  c.kv = env.act_tensor({capacity, 2 * kv_heads_, head_dim_});
  return c;
}

void Attention::decode(const Env& env, const Tensor& xn, const Tensor& position, AttentionCache& cache,
                       const Tensor& y) const {
  expect_one_rank(env, "attention");
  ENSURE(xn.ndim() == 2 && xn.size(0) == 1, "attention decode: one token (1, C), got ", xn.shape.str());
  ENSURE(cache.kv.t.data && cache.len < cache.kv->size(0), "attention decode: the cache of ",
         cache.kv.t.data ? cache.kv->size(0) : 0, " positions is full");
  const int NH = heads_ + 2 * kv_heads_;
  const int64_t width = int64_t{2} * kv_heads_ * head_dim_;
  Owned qkv = env.act_tensor({1, NH, head_dim_});
  linear_forward(env.column(), xn, wqkv_.w(), bqkv_.w(), qkv->view({1, int64_t{NH} * head_dim_}));
  lora_qkv_forward(xn, qkv->view({1, int64_t{NH} * head_dim_}));
  if (qk_norm_) {
    Owned in = env.act_tensor({1, heads_ + kv_heads_, head_dim_}), rstd = env.stat_tensor({1, heads_ + kv_heads_});
    ops::qk_norm_forward(qkv, qk_norm_.w(), heads_, norm_eps_, in, rstd);
  }
  if (rope_) ops::rope_forward(qkv, position, heads_ + kv_heads_, rope_params_);
  const int64_t L = cache.len + 1;
  ops::copy_columns(qkv->view({1, int64_t{NH} * head_dim_}), int64_t{heads_} * head_dim_,
                    cache.kv->slice(cache.len, L).view({1, width}), 0, width, false);
  cache.len = L;
  Owned out = env.act_tensor({1, heads_, head_dim_});
  ops::DecodeAttentionParams p;
  p.qkv = qkv;
  p.cache = cache.kv->slice(0, L);
  p.out = out;
  p.num_heads = heads_;
  p.num_kv_heads = kv_heads_;
  p.head_dim = head_dim_;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(head_dim_));
  p.window = window_;
  ops::attention_decode(p);
  const Tensor o = out->view({1, int64_t{heads_} * head_dim_});
  row_linear_forward(env, o, wo_.w(), bo_, y, {}, lora_out(o));
}

MambaCache Mamba::new_cache(const Env& env) const {
  MambaCache c;
  const int64_t k = conv_w_.w().size(1);
  c.conv = zeros({k - 1, di_}, env.act, env.device);
  c.ssm = zeros({di_, n_}, env.stat(), env.device);
  return c;
}

void Mamba::decode(const Env& env, const Tensor& xn, MambaCache& cache, const Tensor& y) const {
  expect_one_rank(env, "mamba");
  ENSURE(xn.ndim() == 2 && xn.size(0) == 1, "mamba decode: one token (1, C), got ", xn.shape.str());
  Owned xz = env.act_tensor({1, 2 * di_});
  linear_forward(env.column(), xn, w_in_.w(), b_in_.w(), xz);
  Owned xc = env.act_tensor({1, di_});
  ops::causal_conv1d_step(ops::ColumnBlock(xz, 0, di_), cache.conv, conv_w_.w(), conv_b_.w(), true, xc);
  Owned xproj = env.act_tensor({xproj_numel(1)});
  const Tensor wx = x_proj_.w();
  ops::matmul(xc, false, wx.slice(0, r_), true, dt_low(xproj, 1), {});
  ops::matmul(xc, false, wx.slice(r_, r_ + 2 * n_), true, bc(xproj, 1), {});
  Owned dt = env.act_tensor({1, di_});
  ops::matmul(dt_low(xproj, 1), false, dt_proj_.w(), true, dt, {});
  const Tensor bcv = bc(xproj, 1);
  ops::ScanArgs a;
  a.x = xc;
  a.dt = dt;
  a.A_log = a_log_.w();
  a.B = ops::ColumnBlock(bcv, 0, n_);
  a.C = ops::ColumnBlock(bcv, n_, n_);
  a.D = d_.w();
  a.dt_bias = dt_bias_.w();
  a.z = ops::ColumnBlock(xz, di_, di_);
  Owned ys = env.act_tensor({1, di_});
  ops::selective_scan_step(a, cache.ssm, ys);
  row_linear_forward(env, ys, w_out_.w(), b_out_, y);
}

Mamba2Cache Mamba2::new_cache(const Env& env) const {
  Mamba2Cache c;
  const int64_t k = conv_w_.w().size(1);
  c.conv = zeros({k - 1, di_ + 2 * gn_}, env.act, env.device);
  c.ssm = zeros({h_, p_, gn_ / groups_}, env.stat(), env.device);
  return c;
}

void Mamba2::decode(const Env& env, const Tensor& xn, Mamba2Cache& cache, const Tensor& y) const {
  expect_one_rank(env, "mamba2");
  ENSURE(xn.ndim() == 2 && xn.size(0) == 1, "mamba2 decode: one token (1, C), got ", xn.shape.str());
  Mamba2Saved s;  // this token's: the in_proj output, y, the norm's sums
  s.zxbcdt = env.act_tensor({1, width()});
  linear_forward(env.column(), xn, w_in_.w(), b_in_.w(), s.zxbcdt);
  Owned conv = env.act_tensor({1, di_ + 2 * gn_});
  ops::causal_conv1d_step(xbc(s.zxbcdt), cache.conv, conv_w_.w(), conv_b_.w(), true, conv);
  ops::SsdArgs a = scan_args(s, conv, SegmentInfo{});
  s.y = env.act_tensor({1, di_});
  ops::ssd_scan_step(a, cache.ssm, s.y);
  s.sumsq = env.stat_tensor({norm_parts(), 1});
  for (int64_t j = 0; j < norm_parts(); ++j) ops::gated_rmsnorm_sumsq(part(s.y, j), part(s.zxbcdt, j), stat_row(s.sumsq, j));
  Owned yn = env.act_tensor({1, di_});
  normed(s, yn);
  row_linear_forward(env, yn, w_out_.w(), b_out_, y);
}

DeltaNetCache DeltaNet::new_cache(const Env& env) const {
  DeltaNetCache c;
  const int64_t k = conv_w_.w().size(1);
  c.conv = zeros({k - 1, conv_width()}, env.act, env.device);
  c.state = zeros({hv_, dk_, dv_}, env.stat(), env.device);
  return c;
}

void DeltaNet::decode(const Env& env, const Tensor& xn, DeltaNetCache& cache, const Tensor& y) const {
  expect_one_rank(env, "gated deltanet");
  ENSURE(xn.ndim() == 2 && xn.size(0) == 1, "gated deltanet decode: one token (1, C), got ", xn.shape.str());
  DeltaNetSaved s;  // this token's: the in_proj output, o, rstd
  s.proj = env.act_tensor({1, width()});
  linear_forward(env.column(), xn, w_in_.w(), {}, s.proj);
  Owned conv = env.act_tensor({1, conv_width()});
  ops::causal_conv1d_step(ops::ColumnBlock(s.proj, 0, conv_width()), cache.conv, conv_w_.w(), {}, true, conv);
  s.o = env.act_tensor({1, v_width()});
  ops::gated_delta_step(delta_args(s, conv, SegmentInfo{}), cache.state, s.o);
  s.rstd = env.stat_tensor({1, hv_});
  Owned yn = env.act_tensor({1, v_width()});
  normed(s, yn, s.rstd);
  row_linear_forward(env, yn, w_out_.w(), {}, y);
}

BlockCache Block::new_cache(const Env& env, int64_t capacity) const {
  BlockCache c;
  if (kind_ == BlockKind::Mamba)
    c.mamba = mamba_.new_cache(env);
  else if (kind_ == BlockKind::Mamba2)
    c.mamba2 = mamba2_.new_cache(env);
  else if (kind_ == BlockKind::DeltaNet)
    c.gdn = gdn_.new_cache(env);
  else
    c.attn = attn_.new_cache(env, capacity);
  return c;
}

void Block::decode(const Env& env, const Tensor& x, const Tensor& position, BlockCache& cache,
                   const Tensor& y) const {
  const Shape shape = x.shape;
  NormSaved ns1, ns2;
  Owned xn1 = env.act_tensor(shape);
  norm1_.forward(env, x, xn1, ns1);
  if (kind_ == BlockKind::Mamba) {
    mamba_.decode(env, xn1, cache.mamba, y);
    ops::add(y, x, y);  // y = x + mamba
    return;
  }
  if (kind_ == BlockKind::Mamba2) {
    mamba2_.decode(env, xn1, cache.mamba2, y);
    ops::add(y, x, y);  // y = x + mamba2
    return;
  }
  Owned h = env.act_tensor(shape);
  if (kind_ == BlockKind::DeltaNet)
    gdn_.decode(env, xn1, cache.gdn, h);
  else
    attn_.decode(env, xn1, position, cache.attn, h);
  Owned xn2 = env.act_tensor(shape);
  norm2_.forward_residual(env, h, x, h, xn2, ns2);  // h = attn + x; norm2(h)
  if (kind_ == BlockKind::Experts) {
    MoeSaved ms;
    moe_.forward(env, xn2, y, ms, 0);
    ops::add(y, h, y);  // y = h + moe
  } else {
    MlpSaved ms;
    mlp_.forward(env, xn2, y, ms, h);  // y = h + mlp
  }
}

}  // namespace engine::layers
