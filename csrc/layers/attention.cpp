#include "layers/attention.h"

#include <cmath>
#include <utility>

#include "layers/linear.h"
#include "parallel/tensor_parallel.h"
#include "ops/gemm.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/qk_norm.h"
#include "ops/rope.h"

namespace engine::layers {

Attention::Attention(const ParamStore& store, const std::string& prefix, const ModelConfig& c)
    : heads_(c.num_heads / store.table().tp_size()), kv_heads_(c.num_kv_heads / store.table().tp_size()),
      head_dim_(c.head_dim),
      window_(c.sliding_window), causal_(c.causal), rope_(c.positions == PositionKind::Rope),
      backend_(c.attention_backend == AttentionBackendKind::Cudnn ? ops::AttentionBackend::Cudnn
                                                                   : ops::AttentionBackend::Flash),
      rope_params_(rope_params(c)), norm_eps_(static_cast<float>(c.norm_eps)) {
  wqkv_ = adjacent_rows(store, {prefix + ".wq", prefix + ".wk", prefix + ".wv"});
  wo_ = Param(store, prefix + ".wo");
  if (c.bias || c.qkv_bias) bqkv_ = adjacent_rows(store, {prefix + ".bq", prefix + ".bk", prefix + ".bv"});
  if (c.bias) bo_ = Param(store, prefix + ".bo");
  if (c.qk_norm) {
    qk_norm_ = adjacent_rows(store, {prefix + ".q_norm", prefix + ".k_norm"});
    qk_norm_.shape = {2, c.head_dim};
  }
  lora_q_ = Lora(store, prefix + ".wq", c);
  lora_k_ = Lora(store, prefix + ".wk", c);
  lora_v_ = Lora(store, prefix + ".wv", c);
  lora_o_ = Lora(store, prefix + ".wo", c);
}

void Attention::declare(ParamTable& t, const std::string& prefix, const ModelConfig& c) {
  const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_heads, Hkv = c.num_kv_heads;
  const double out_std = c.init_std / std::sqrt(2.0 * c.num_layers);
  // Column-parallel q, k, v (whole heads per tensor-parallel rank), row-parallel output.
  t.add({.name = prefix + ".wq", .shape = {H * D, C}, .split_dim = 0, .init_std = c.init_std});
  t.add({.name = prefix + ".wk", .shape = {Hkv * D, C}, .split_dim = 0, .init_std = c.init_std, .adjacent = true});
  t.add({.name = prefix + ".wv", .shape = {Hkv * D, C}, .split_dim = 0, .init_std = c.init_std, .adjacent = true});
  t.add({.name = prefix + ".wo", .shape = {C, H * D}, .split_dim = 1, .init_std = out_std});
  if (c.bias || c.qkv_bias) {  // qkv_bias alone: Qwen2's biases on q, k, v but not o
    t.add({.name = prefix + ".bq", .shape = {H * D}, .split_dim = 0, .init = InitKind::Zeros, .weight_decay = false});
    t.add({.name = prefix + ".bk", .shape = {Hkv * D}, .split_dim = 0, .init = InitKind::Zeros, .weight_decay = false, .adjacent = true});
    t.add({.name = prefix + ".bv", .shape = {Hkv * D}, .split_dim = 0, .init = InitKind::Zeros, .weight_decay = false, .adjacent = true});
  }
  if (c.bias) t.add({.name = prefix + ".bo", .shape = {C}, .init = InitKind::Zeros, .weight_decay = false});
  if (c.qk_norm) {  // replicated over tp: every rank's heads use them
    t.add({.name = prefix + ".q_norm", .shape = {D}, .init = InitKind::Ones, .weight_decay = false,
           .tp_partial_grad = true});
    t.add({.name = prefix + ".k_norm", .shape = {D}, .init = InitKind::Ones, .weight_decay = false, .adjacent = true,
           .tp_partial_grad = true});
  }
  // LoRA factors after the base weights (q, k, v stay adjacent for their fused GEMM).
  const std::pair<const char*, Shape> targets[] = {
      {"wq", {H * D, C}}, {"wk", {Hkv * D, C}}, {"wv", {Hkv * D, C}}, {"wo", {C, H * D}}};
  for (const auto& [w, shape] : targets)
    if (lora_targets_weight(c, w))
      Lora::declare(t, prefix + "." + w, shape[0], shape[1], std::string(w) == "wo", c);
}

void Attention::lora_qkv_forward(const Tensor& x, const Tensor& qkv) const {
  const int64_t qd = int64_t{heads_} * head_dim_, kd = int64_t{kv_heads_} * head_dim_;
  if (lora_q_) lora_q_.forward(x, qkv, 0);
  if (lora_k_) lora_k_.forward(x, qkv, qd);
  if (lora_v_) lora_v_.forward(x, qkv, qd + kd);
}

std::function<void(const Tensor&)> Attention::lora_out(const Tensor& o) const {
  if (!lora_o_) return nullptr;
  return [this, o](const Tensor& partial) { lora_o_.forward(o, partial); };
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
  p.causal = causal_;
  p.window = window_;
  p.backend = backend_;
  if (seg.kv) {  // micro-sequences: keys and values of this chunk and the earlier ones
    const KvChunks::Layer& l = seg.kv->layers.at(this);
    const int64_t end = seg.row_begin + s.qkv->size(0);
    p.kv = l.kv->slice(seg.key_begin, end);
    p.cu_seqlens_k = seg.cu_seqlens_k;
    p.max_seqlen_k = seg.max_seqlen_k;
  }
  return p;
}

void Attention::forward(const Env& env, const Tensor& xn, const SegmentInfo& seg, const Tensor& y,
                        AttentionSaved& s, Fp8Amax xn_amax) const {
  const int64_t T = full_rows(env, xn.size(0));
  const int NH = heads_ + 2 * kv_heads_;
  s.qkv = env.act_tensor({T, NH, head_dim_});
  s.out = env.act_tensor({T, heads_, head_dim_});
  s.lse = env.stat_tensor({T, heads_});
  s.qkv_amax = {};  // (no amax of an earlier micro-batch's tensors)
  s.qkv_amax.x = std::move(xn_amax);
  s.out_amax = {};
  const Tensor qkv = s.qkv->view({T, int64_t{NH} * head_dim_});
  column_gemm_forward(env, xn, [&](const Tensor& x, int64_t r0, int64_t r1) {
    linear_forward(env.column(), x, wqkv_.w(), bqkv_.w(), qkv.slice(r0, r1), {}, &s.qkv_amax);
    lora_qkv_forward(x, qkv.slice(r0, r1));
  });
  if (qk_norm_) {
    s.qk_in = env.act_tensor({T, heads_ + kv_heads_, head_dim_});
    s.qk_rstd = env.stat_tensor({T, heads_ + kv_heads_});
    ops::qk_norm_forward(s.qkv, qk_norm_.w(), heads_, norm_eps_, s.qk_in, s.qk_rstd);
  }
  if (rope_) ops::rope_forward(s.qkv, seg.positions, heads_ + kv_heads_, rope_params_);
  if (seg.kv) {  // this chunk's keys and values join the micro-batch's
    KvChunks::Layer& l = seg.kv->layers[this];
    const int64_t width = int64_t{2} * kv_heads_ * head_dim_;
    if (!l.kv.t.data) l.kv = env.act_tensor({seg.kv->rows, 2 * kv_heads_, head_dim_});
    ENSURE(seg.row_begin + T <= seg.kv->rows, "micro-sequence rows [", seg.row_begin, ", ", seg.row_begin + T,
           ") past the micro-batch's ", seg.kv->rows);
    ops::copy_columns(s.qkv->view({T, int64_t{NH} * head_dim_}), int64_t{heads_} * head_dim_,
                      l.kv->slice(seg.row_begin, seg.row_begin + T).view({T, width}), 0, width, false);
  }
  ops::attention_forward(op_params(seg, s));
  if (seg.kv && seg.kv_release) seg.kv->layers.erase(this);
  const Tensor o = s.out->view({T, int64_t{heads_} * head_dim_});
  row_linear_forward(env, o, wo_.w(), bo_, y, {}, lora_out(o), &s.out_amax);
}

void Attention::backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                         const AttentionSaved& s, const Tensor& dxn) const {
  row_linear_bias_backward(dy, bo_);
  backward_except_out_bias(env, dy, xn, seg, s, dxn);
}

void Attention::backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& xn,
                                         const SegmentInfo& seg, const AttentionSaved& s,
                                         const Tensor& dxn) const {
  const int64_t T = full_rows(env, xn.size(0));
  const int NH = heads_ + 2 * kv_heads_;
  Owned dy_storage;
  const Tensor dy_full = row_output_backward(env, dy, dy_storage);
  ColumnInput in(env, xn);  // sequence parallel: gathered again (beside what follows), not kept since the forward
  Owned dout = env.act_tensor({T, heads_, head_dim_});
  const Tensor o = s.out->view({T, int64_t{heads_} * head_dim_});
  linear_backward(env.row(), dy_full, o, wo_.w(), dout->view({T, int64_t{heads_} * head_dim_}), wo_.g(), {},
                  &s.out_amax);
  if (lora_o_) lora_o_.backward(dy_full, o, dout->view({T, int64_t{heads_} * head_dim_}));
  dy_storage = Owned{};
  Owned dqkv = env.act_tensor({T, NH, head_dim_});
  ops::AttentionBackwardParams b;
  b.fwd = op_params(seg, s);
  b.dout = dout;
  b.dqkv = dqkv;
  if (!seg.kv) {
    ops::attention_backward(b);
  } else {
    // Micro-sequences: the gradient of every key row this chunk saw joins the micro-batch's sum;
    // this chunk's own rows are then complete (later chunks ran their backward first).
    KvChunks::Layer& l = seg.kv->layers.at(this);
    const int64_t end = seg.row_begin + T, Tk = end - seg.key_begin;
    const int64_t width = int64_t{2} * kv_heads_ * head_dim_;
    Owned dkv = env.act_tensor({Tk, 2 * kv_heads_, head_dim_});
    b.dkv = dkv;
    ops::attention_backward(b);
    if (!l.dkv.t.data) l.dkv = zeros({seg.kv->rows, 2 * kv_heads_, head_dim_}, env.stat(), env.device);
    ops::copy_columns(dkv->view({Tk, width}), 0, l.dkv->slice(seg.key_begin, end).view({Tk, width}), 0, width,
                      true);
    dkv = Owned{};
    ops::copy_columns(l.dkv->slice(seg.row_begin, end).view({T, width}), 0,
                      dqkv->view({T, int64_t{NH} * head_dim_}), int64_t{heads_} * head_dim_, width, false);
    if (seg.row_begin == 0) seg.kv->layers.erase(this);  // the first chunk: the micro-batch is done
  }
  dout = Owned{};
  if (rope_) ops::rope_backward(dqkv, seg.positions, heads_ + kv_heads_, rope_params_);
  if (qk_norm_) {  // a frozen norm's weight gradient goes to a scratch (the op always writes one)
    const Owned scratch = qk_norm_.frozen ? zeros(qk_norm_.shape, env.stat(), env.device) : Owned{};
    ops::qk_norm_backward(dqkv, s.qk_in, qk_norm_.w(), heads_, s.qk_rstd, qk_norm_.frozen ? scratch.t : qk_norm_.g());
  }
  const Tensor dqkv2 = dqkv->view({T, int64_t{NH} * head_dim_});
  LowRankBackward low_rank;
  if (lora_q_ || lora_k_ || lora_v_)
    low_rank = [&](const Tensor& x, const Tensor& dx_full) {
      const int64_t qd = int64_t{heads_} * head_dim_, kd = int64_t{kv_heads_} * head_dim_;
      if (lora_q_) lora_q_.backward(dqkv2, x, dx_full, 0);
      if (lora_k_) lora_k_.backward(dqkv2, x, dx_full, qd);
      if (lora_v_) lora_v_.backward(dqkv2, x, dx_full, qd + kd);
    };
  column_linear_backward(env, dqkv2, in, wqkv_.w(), dxn, wqkv_.g(), bqkv_.g(), low_rank, &s.qkv_amax);
}

}  // namespace engine::layers
