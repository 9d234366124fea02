#include "layers/mlp.h"

#include <cmath>
#include <utility>

#include "layers/linear.h"
#include "parallel/tensor_parallel.h"
#include "ops/gemm.h"
#include "ops/activation.h"
#include "ops/elementwise.h"

namespace engine::layers {

Mlp::Mlp(const ParamStore& store, const std::string& prefix, const ModelConfig& c)
    : act_(c.activation), ffn_(c.ffn_hidden_size / store.table().tp_size()) {
  if (act_ == ActivationKind::SwiGLU)
    w_in_ = adjacent_rows(store, {prefix + ".w_gate", prefix + ".w_up"});
  else
    w_in_ = Param(store, prefix + ".w_in");
  w_out_ = Param(store, prefix + ".w_out");
  if (c.bias) {
    b_in_ = act_ == ActivationKind::SwiGLU ? adjacent_rows(store, {prefix + ".b_gate", prefix + ".b_up"})
                                           : Param(store, prefix + ".b_in");
    b_out_ = Param(store, prefix + ".b_out");
  }
  if (act_ == ActivationKind::SwiGLU) {
    lora_gate_ = Lora(store, prefix + ".w_gate", c);
    lora_up_ = Lora(store, prefix + ".w_up", c);
    lora_down_ = Lora(store, prefix + ".w_out", c);
  }
}

void Mlp::declare(ParamTable& t, const std::string& prefix, const ModelConfig& c) {
  const int64_t C = c.hidden_size, F = c.ffn_hidden_size;
  const double out_std = c.init_std / std::sqrt(2.0 * c.num_layers);
  const bool glu = c.activation == ActivationKind::SwiGLU;
  if (glu) {
    t.add({.name = prefix + ".w_gate", .shape = {F, C}, .split_dim = 0, .init_std = c.init_std});
    t.add({.name = prefix + ".w_up", .shape = {F, C}, .split_dim = 0, .init_std = c.init_std, .adjacent = true});
  } else {
    t.add({.name = prefix + ".w_in", .shape = {F, C}, .split_dim = 0, .init_std = c.init_std});
  }
  t.add({.name = prefix + ".w_out", .shape = {C, F}, .split_dim = 1, .init_std = out_std});
  if (c.bias) {
    if (glu) {
      t.add({.name = prefix + ".b_gate", .shape = {F}, .split_dim = 0, .init = InitKind::Zeros, .weight_decay = false});
      t.add({.name = prefix + ".b_up", .shape = {F}, .split_dim = 0, .init = InitKind::Zeros, .weight_decay = false, .adjacent = true});
    } else {
      t.add({.name = prefix + ".b_in", .shape = {F}, .split_dim = 0, .init = InitKind::Zeros, .weight_decay = false});
    }
    t.add({.name = prefix + ".b_out", .shape = {C}, .init = InitKind::Zeros, .weight_decay = false});
  }
  if (glu) {  // LoRA factors after the base weights (gate and up stay adjacent)
    if (lora_targets_weight(c, "w_gate")) Lora::declare(t, prefix + ".w_gate", F, C, false, c);
    if (lora_targets_weight(c, "w_up")) Lora::declare(t, prefix + ".w_up", F, C, false, c);
    if (lora_targets_weight(c, "w_out")) Lora::declare(t, prefix + ".w_out", C, F, true, c);
  }
}

void Mlp::forward(const Env& env, const Tensor& xn, const Tensor& y, MlpSaved& s,
                  const Tensor& residual, Fp8Amax xn_amax) const {
  ENSURE(!residual.data || residual.data != y.data, "Mlp::forward: the residual must not be y");
  const int64_t T = full_rows(env, xn.size(0));
  const bool glu = act_ == ActivationKind::SwiGLU;
  s.h = env.act_tensor({T, glu ? 2 * ffn_ : ffn_});
  s.a = env.act_tensor({T, ffn_});
  s.in = {};  // (no amax of an earlier micro-batch's tensors)
  s.in.x = std::move(xn_amax);
  s.out = {};
  column_gemm_forward(env, xn, [&](const Tensor& x, int64_t r0, int64_t r1) {
    if (glu) {
      linear_forward(env.column(), x, w_in_.w(), b_in_.w(), s.h->slice(r0, r1), {}, &s.in);
      if (lora_gate_) lora_gate_.forward(x, s.h->slice(r0, r1), 0);
      if (lora_up_) lora_up_.forward(x, s.h->slice(r0, r1), ffn_);
      return;
    }
    if (env.fp8 != Fp8Recipe::Off) {  // (the FP8 product has no GELU epilogue)
      linear_forward(env.column(), x, w_in_.w(), b_in_.w(), s.h->slice(r0, r1), {}, &s.in);
      ops::gelu_forward(s.h->slice(r0, r1), s.a->slice(r0, r1));
      return;
    }
    // h = x W_in^T + b_in and a = gelu(h) from one GEMM (the GELU in its epilogue)
    ops::MatmulOptions o;
    o.bias = b_in_.w();
    o.gelu = true;
    o.gelu_input = s.h->slice(r0, r1);
    ops::matmul(x.rows(), false, w_in_.w(), true, s.a->slice(r0, r1), o);
  });
  // Per-tensor FP8: the SwiGLU hands the output linear its input's amax.
  const bool fused_amax = env.fp8 == Fp8Recipe::Tensorwise;
  if (glu) {
    if (fused_amax) s.out.x = Fp8Amax::on(env.device);
    ops::swiglu_forward(s.h, s.a, s.out.x.t);
  }
  std::function<void(const Tensor&)> low_rank;
  if (lora_down_) low_rank = [&](const Tensor& partial) { lora_down_.forward(s.a, partial); };
  row_linear_forward(env, s.a, w_out_.w(), b_out_, y, residual, low_rank, &s.out);
}

void Mlp::backward(const Env& env, const Tensor& dy, const Tensor& xn, const MlpSaved& s,
                   const Tensor& dxn) const {
  row_linear_bias_backward(dy, b_out_);
  backward_except_out_bias(env, dy, xn, s, dxn);
}

void Mlp::backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& xn,
                                   const MlpSaved& s, const Tensor& dxn) const {
  Owned dy_storage;
  const Tensor dy_full = row_output_backward(env, dy, dy_storage);
  ColumnInput in(env, xn);  // sequence parallel: gathered again (beside what follows)
  Owned dh = env.act_tensor(s.h->shape);
  const bool glu = act_ == ActivationKind::SwiGLU;
  // The GELU's derivative and b_in's gradient from the dx GEMM's epilogue, in bf16 only.
  const bool gelu_epilogue = !glu && env.fp8 == Fp8Recipe::Off;
  Fp8Amax dh_amax;  // per-tensor FP8: from the SwiGLU's backward, for the input linear's
  if (!gelu_epilogue) {
    Owned da = env.act_tensor(s.a->shape);
    linear_backward(env.row(), dy_full, s.a, w_out_.w(), da, w_out_.g(), {}, &s.out);
    if (lora_down_) lora_down_.backward(dy_full, s.a, da);
    if (glu) {
      if (env.fp8 == Fp8Recipe::Tensorwise) dh_amax = Fp8Amax::on(env.device);
      ops::swiglu_backward(da, s.h, dh, dh_amax.t);
    } else
      ops::gelu_backward(da, s.h, dh);
  } else {  // dW_out += dy^T a; dh = (dy W_out) * gelu'(h) and b_in's gradient from one GEMM
    if (!w_out_.frozen) ops::matmul(dy_full.rows(), true, s.a->rows(), false, w_out_.g(), {1.f, 1.f, {}});
    ops::MatmulOptions o;
    o.dgelu_input = s.h;
    Owned db;
    const bool db_in = b_in_ && !b_in_.frozen;
    if (db_in) o.dbias = (db = empty({ffn_}, b_in_.g().dtype, env.device)).t;
    ops::matmul(dy_full.rows(), false, w_out_.w(), false, dh, o);
    if (db_in) ops::add_inplace(b_in_.g(), db);
  }
  dy_storage = Owned{};
  LowRankBackward low_rank;
  if (lora_gate_ || lora_up_)
    low_rank = [&](const Tensor& x, const Tensor& dx_full) {
      if (lora_gate_) lora_gate_.backward(dh, x, dx_full, 0);
      if (lora_up_) lora_up_.backward(dh, x, dx_full, ffn_);
    };
  column_linear_backward(env, dh, in, w_in_.w(), dxn, w_in_.g(), gelu_epilogue ? Tensor{} : b_in_.g(), low_rank,
                         &s.in, &dh_amax);
}

}  // namespace engine::layers
