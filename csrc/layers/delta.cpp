#include "layers/delta.h"

#include <cmath>

#include "layers/linear.h"
#include "parallel/tensor_parallel.h"

namespace engine::layers {

namespace {

// The in_proj and conv parts in their order along dim 0.
std::vector<std::string> in_names(const std::string& prefix) {
  return part_names(prefix, "in_proj_", {"q", "k", "v", "z", "b", "a"});
}
std::vector<std::string> conv_names(const std::string& prefix) { return part_names(prefix, "conv_", {"q", "k", "v"}); }

}  // namespace

DeltaNet::DeltaNet(const ParamStore& store, const std::string& prefix, const DeltaNetConfig& c)
    : hk_(c.key_heads / store.table().tp_size()),
      hv_(c.value_heads / store.table().tp_size()),
      dk_(c.key_dim),
      dv_(c.value_dim),
      eps_(static_cast<float>(c.norm_eps)) {
  w_in_ = adjacent_rows(store, in_names(prefix));
  conv_w_ = adjacent_rows(store, conv_names(prefix));
  dt_bias_ = Param(store, prefix + ".dt_bias");
  a_log_ = Param(store, prefix + ".A_log");
  norm_ = Param(store, prefix + ".norm");
  w_out_ = Param(store, prefix + ".out_proj");
}

void DeltaNet::declare(ParamTable& t, const std::string& prefix, const DeltaNetConfig& c) {
  const int64_t C = c.hidden, Hk = c.key_heads, Hv = c.value_heads, dk = c.key_dim, dv = c.value_dim, K = c.d_conv;
  ENSURE(C > 0 && Hk > 0 && Hv > 0 && dk > 0 && dv > 0 && K > 0 && Hv % Hk == 0, "gated deltanet ", prefix,
         ": hidden ", C, ", key heads ", Hk, ", value heads ", Hv, ", head dims ", dk, " / ", dv, ", d_conv ", K,
         " must be positive, the value heads a multiple of the key heads");
  const int tp = t.tp_size();
  ENSURE(Hk % tp == 0, "gated deltanet ", prefix, ": ", Hk, " key heads do not split over ", tp,
         " tensor-parallel ranks");
  const int64_t rows[] = {Hk * dk, Hk * dk, Hv * dv, Hv * dv, Hv, Hv};
  const auto in = in_names(prefix);
  for (size_t i = 0; i < in.size(); ++i)
    t.add({.name = in[i], .shape = {rows[i], C}, .split_dim = 0, .init_std = c.init_std, .adjacent = i > 0});
  const double conv_bound = 1.0 / std::sqrt(static_cast<double>(K));
  const auto conv = conv_names(prefix);
  for (size_t i = 0; i < conv.size(); ++i)
    t.add({.name = conv[i], .shape = {rows[i], K}, .split_dim = 0, .init = InitKind::Uniform, .init_std = conv_bound,
           .adjacent = i > 0});
  t.add({.name = prefix + ".dt_bias", .shape = {Hv}, .split_dim = 0, .init = InitKind::Ones, .weight_decay = false});
  t.add({.name = prefix + ".A_log", .shape = {Hv}, .split_dim = 0, .init = InitKind::LogColumnIndex,
         .weight_decay = false});
  t.add({.name = prefix + ".norm", .shape = {dv}, .init = InitKind::Ones, .weight_decay = false,
         .tp_partial_grad = true});
  t.add({.name = prefix + ".out_proj", .shape = {C, Hv * dv}, .split_dim = 1,
         .init_std = c.init_std / std::sqrt(static_cast<double>(std::max(c.num_layers, 1)))});
}

ops::DeltaArgs DeltaNet::delta_args(const DeltaNetSaved& s, const Tensor& conv, const SegmentInfo& seg) const {
  ops::DeltaArgs a;
  a.q = ops::ColumnBlock(conv, 0, qk_width());
  a.k = ops::ColumnBlock(conv, qk_width(), qk_width());
  a.v = ops::ColumnBlock(conv, 2 * qk_width(), v_width());
  a.b = ops::ColumnBlock(s.proj, conv_width() + v_width(), hv_);
  a.a = ops::ColumnBlock(s.proj, conv_width() + v_width() + hv_, hv_);
  a.A_log = a_log_.w();
  a.dt_bias = dt_bias_.w();
  a.cu_seqlens = seg.cu_seqlens;
  a.key_heads = hk_;
  return a;
}

void DeltaNet::normed(const DeltaNetSaved& s, const Tensor& out, const Tensor& rstd) const {
  ops::head_rmsnorm_gated_forward(s.o, z(s.proj), norm_.w(), eps_, out, rstd);
}

void DeltaNet::forward(const Env& env, const Tensor& xn, const Tensor& y, const SegmentInfo& seg,
                       DeltaNetSaved& s) const {
  ENSURE(!seg.kv, "Gated DeltaNet blocks cannot run on micro-sequences (the state would pass between chunks)");
  const int64_t T = full_rows(env, xn.size(0));
  s.proj = env.act_tensor({T, width()});
  column_gemm_forward(env, xn, [&](const Tensor& x, int64_t r0, int64_t r1) {
    linear_forward(env.column(), x, w_in_.w(), {}, s.proj->slice(r0, r1));
  });
  Owned conv = env.act_tensor({T, conv_width()});
  ops::causal_conv1d_forward(ops::ColumnBlock(s.proj, 0, conv_width()), conv_w_.w(), {}, seg.cu_seqlens, true, conv);
  s.o = env.act_tensor({T, v_width()});
  ops::gated_delta_forward(delta_args(s, conv, seg), s.o);
  conv = Owned{};
  s.rstd = env.stat_tensor({T, hv_});
  Owned yn = env.act_tensor({T, v_width()});
  normed(s, yn, s.rstd);
  row_linear_forward(env, yn, w_out_.w(), {}, y);
}

void DeltaNet::backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                        const DeltaNetSaved& s, const Tensor& dxn) const {
  const int64_t T = full_rows(env, xn.size(0));
  Owned dyn = env.act_tensor({T, v_width()});
  {
    Owned yn = env.act_tensor({T, v_width()}), rstd = env.stat_tensor({T, hv_});
    normed(s, yn, rstd);
    Owned dy_storage;
    const Tensor dy_full = row_output_backward(env, dy, dy_storage);
    linear_backward(env.row(), dy_full, yn, w_out_.w(), dyn, w_out_.g(), {});
  }
  ColumnInput in(env, xn);  // sequence parallel: gathered again (beside what follows)
  Owned dproj = env.act_tensor({T, width()}), dout = env.act_tensor({T, v_width()});
  ops::head_rmsnorm_gated_backward(dyn, s.o, z(s.proj), norm_.w(), s.rstd, dout, z(dproj), norm_.g());
  dyn = Owned{};
  Owned conv = env.act_tensor({T, conv_width()}), dconv = env.act_tensor({T, conv_width()});
  ops::causal_conv1d_forward(ops::ColumnBlock(s.proj, 0, conv_width()), conv_w_.w(), {}, seg.cu_seqlens, true, conv);
  ops::gated_delta_backward(
      delta_args(s, conv, seg), dout,
      {ops::ColumnBlock(dconv, 0, qk_width()), ops::ColumnBlock(dconv, qk_width(), qk_width()),
       ops::ColumnBlock(dconv, 2 * qk_width(), v_width()),
       ops::ColumnBlock(dproj, conv_width() + v_width() + hv_, hv_),  // da
       ops::ColumnBlock(dproj, conv_width() + v_width(), hv_),        // db
       a_log_.g(), dt_bias_.g()});
  dout = Owned{};
  conv = Owned{};
  ops::causal_conv1d_backward(dconv, ops::ColumnBlock(s.proj, 0, conv_width()), conv_w_.w(), {}, seg.cu_seqlens,
                              true, ops::ColumnBlock(dproj, 0, conv_width()), conv_w_.g(), {});
  dconv = Owned{};
  column_linear_backward(env, dproj, in, w_in_.w(), dxn, w_in_.g(), {});
}

}  // namespace engine::layers
