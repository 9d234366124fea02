#include "layers/mamba2.h"

#include <cmath>

#include "layers/linear.h"
#include "parallel/tensor_parallel.h"

namespace engine::layers {

namespace {

// The in_proj and conv parts in their order along dim 0.
std::vector<std::string> in_names(const std::string& prefix, const char* suffix) {
  return part_names(prefix, "in_proj_", {"z", "x", "B", "C", "dt"}, suffix);
}
std::vector<std::string> conv_names(const std::string& prefix, const char* suffix) {
  return part_names(prefix, "conv_", {"x", "B", "C"}, suffix);
}

}  // namespace

Mamba2::Mamba2(const ParamStore& store, const std::string& prefix, const Mamba2Config& c)
    : di_(c.d_inner / store.table().tp_size()),
      gn_(c.n_groups * c.d_state / store.table().tp_size()),
      h_(c.heads() / store.table().tp_size()),
      di_total_(c.d_inner),
      p_(c.head_dim),
      groups_(c.n_groups / store.table().tp_size()),
      chunk_(c.chunk_len),
      eps_(static_cast<float>(c.norm_eps)),
      norm_per_group_(c.norm_per_group),
      dt_lo_(c.dt_limit_min),
      dt_hi_(c.dt_limit_max) {
  w_in_ = adjacent_rows(store, in_names(prefix, ""));
  conv_w_ = adjacent_rows(store, conv_names(prefix, ""));
  if (c.conv_bias) conv_b_ = adjacent_rows(store, conv_names(prefix, "_bias"));
  if (c.proj_bias) {
    b_in_ = adjacent_rows(store, in_names(prefix, "_bias"));
    b_out_ = Param(store, prefix + ".out_proj_bias");
  }
  dt_bias_ = Param(store, prefix + ".dt_bias");
  a_log_ = Param(store, prefix + ".A_log");
  d_ = Param(store, prefix + ".D");
  norm_ = Param(store, prefix + ".norm");
  w_out_ = Param(store, prefix + ".out_proj");
}

void Mamba2::declare(ParamTable& t, const std::string& prefix, const Mamba2Config& c) {
  const int64_t C = c.hidden, Di = c.d_inner, P = c.head_dim, G = c.n_groups, N = c.d_state, K = c.d_conv;
  ENSURE(C > 0 && Di > 0 && P > 0 && G > 0 && N > 0 && K > 0 && c.chunk_len > 0 && Di % P == 0 &&
             (Di / P) % G == 0,
         "mamba2 ", prefix, ": hidden ", C, ", d_inner ", Di, ", head_dim ", P, ", n_groups ", G, ", d_state ", N,
         ", d_conv ", K, " must be positive, with head_dim dividing d_inner and n_groups dividing the heads");
  const int64_t H = Di / P, rows[] = {Di, Di, G * N, G * N, H};
  const int tp = t.tp_size();
  ENSURE(G % tp == 0, "mamba2 ", prefix, ": n_groups ", G, " is not divisible by the tensor-parallel size ", tp);
  const auto in = in_names(prefix, ""), in_bias = in_names(prefix, "_bias");
  for (size_t i = 0; i < in.size(); ++i)
    t.add({.name = in[i], .shape = {rows[i], C}, .split_dim = 0, .init_std = c.init_std, .adjacent = i > 0});
  if (c.proj_bias)
    for (size_t i = 0; i < in.size(); ++i)
      t.add({.name = in_bias[i], .shape = {rows[i]}, .split_dim = 0, .init = InitKind::Zeros, .weight_decay = false,
             .adjacent = i > 0});
  const double conv_bound = 1.0 / std::sqrt(static_cast<double>(K));
  const auto conv = conv_names(prefix, ""), conv_bias = conv_names(prefix, "_bias");
  for (size_t i = 0; i < conv.size(); ++i)
    t.add({.name = conv[i], .shape = {rows[i + 1], K}, .split_dim = 0, .init = InitKind::Uniform,
           .init_std = conv_bound, .adjacent = i > 0});
  if (c.conv_bias)
    for (size_t i = 0; i < conv.size(); ++i)
      t.add({.name = conv_bias[i], .shape = {rows[i + 1]}, .split_dim = 0, .init = InitKind::Zeros,
             .weight_decay = false, .adjacent = i > 0});
  t.add({.name = prefix + ".dt_bias", .shape = {H}, .split_dim = 0, .init = InitKind::InvSoftplusLogUniform,
         .weight_decay = false, .init_low = c.dt_min, .init_high = c.dt_max, .init_floor = c.dt_init_floor});
  t.add({.name = prefix + ".A_log", .shape = {H}, .split_dim = 0, .init = InitKind::LogColumnIndex,
         .weight_decay = false});
  t.add({.name = prefix + ".D", .shape = {H}, .split_dim = 0, .init = InitKind::Ones, .weight_decay = false});
  t.add({.name = prefix + ".norm", .shape = {Di}, .split_dim = 0, .init = InitKind::Ones, .weight_decay = false});
  t.add({.name = prefix + ".out_proj", .shape = {C, Di}, .split_dim = 1,
         .init_std = c.init_std / std::sqrt(static_cast<double>(std::max(c.num_layers, 1)))});
  if (c.proj_bias)
    t.add({.name = prefix + ".out_proj_bias", .shape = {C}, .init = InitKind::Zeros, .weight_decay = false});
}

ops::SsdArgs Mamba2::scan_args(const Mamba2Saved& s, const Tensor& xbc_out, const SegmentInfo& seg) const {
  ops::SsdArgs a;
  a.x = ops::ColumnBlock(xbc_out, 0, di_);
  a.B = ops::ColumnBlock(xbc_out, di_, gn_);
  a.C = ops::ColumnBlock(xbc_out, di_ + gn_, gn_);
  a.dt = dt(s.zxbcdt);
  a.A_log = a_log_.w();
  a.D = d_.w();
  a.dt_bias = dt_bias_.w();
  a.cu_seqlens = seg.cu_seqlens;
  a.head_dim = p_;
  a.groups = groups_;
  a.dt_min = dt_lo_;
  a.dt_max = dt_hi_;
  a.chunk_len = chunk_;
  return a;
}

void Mamba2::normed(const Mamba2Saved& s, const Tensor& out) const {
  const int64_t w = norm_width();
  for (int64_t j = 0; j < norm_parts(); ++j)
    ops::gated_rmsnorm_forward(part(s.y, j), part(s.zxbcdt, j), norm_.w().slice(j * w, (j + 1) * w),
                               stat_row(s.sumsq, j), norm_total(), eps_, part(out, j));
}

void Mamba2::forward(const Env& env, const Tensor& xn, const Tensor& y, const SegmentInfo& seg,
                     Mamba2Saved& s) const {
  ENSURE(!seg.kv, "Mamba-2 blocks cannot run on micro-sequences (the scan state would pass between chunks)");
  const int64_t T = full_rows(env, xn.size(0));
  s.zxbcdt = env.act_tensor({T, width()});
  column_gemm_forward(env, xn, [&](const Tensor& x, int64_t r0, int64_t r1) {
    linear_forward(env.column(), x, w_in_.w(), b_in_.w(), s.zxbcdt->slice(r0, r1));
  });
  Owned conv = env.act_tensor({T, di_ + 2 * gn_});
  ops::causal_conv1d_forward(xbc(s.zxbcdt), conv_w_.w(), conv_b_.w(), seg.cu_seqlens, true, conv);
  s.y = env.act_tensor({T, di_});
  s.states = env.stat_tensor({ops::scan_num_chunks(T, chunk_), h_, p_, gn_ / groups_});
  ops::ssd_scan_forward(scan_args(s, conv, seg), s.y, s.states);
  conv = Owned{};
  s.sumsq = env.stat_tensor({norm_parts(), T});
  for (int64_t j = 0; j < norm_parts(); ++j) ops::gated_rmsnorm_sumsq(part(s.y, j), part(s.zxbcdt, j), stat_row(s.sumsq, j));
  // The whole row's sum over the split channels (per group: the rank's groups are whole).
  if (env.tp_size() > 1 && !norm_per_group_) env.tp->all_reduce(s.sumsq);
  Owned yn = env.act_tensor({T, di_});
  normed(s, yn);
  row_linear_forward(env, yn, w_out_.w(), b_out_, y);
}

void Mamba2::backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                      const Mamba2Saved& s, const Tensor& dxn) const {
  row_linear_bias_backward(dy, b_out_);
  backward_except_out_bias(env, dy, xn, seg, s, dxn);
}

void Mamba2::backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& xn,
                                      const SegmentInfo& seg, const Mamba2Saved& s,
                                      const Tensor& dxn) const {
  const int64_t T = full_rows(env, xn.size(0));
  Owned dyn = env.act_tensor({T, di_});
  {
    Owned yn = env.act_tensor({T, di_});
    normed(s, yn);
    Owned dy_storage;
    const Tensor dy_full = row_output_backward(env, dy, dy_storage);
    linear_backward(env.row(), dy_full, yn, w_out_.w(), dyn, w_out_.g(), {});
  }
  ColumnInput in(env, xn);  // sequence parallel: gathered again (beside what follows)
  const int64_t nw = norm_width();
  Owned dot = env.stat_tensor({norm_parts(), T});
  for (int64_t j = 0; j < norm_parts(); ++j)
    ops::gated_rmsnorm_dot(part(dyn, j), part(s.y, j), part(s.zxbcdt, j), norm_.w().slice(j * nw, (j + 1) * nw),
                           stat_row(dot, j));
  if (env.tp_size() > 1 && !norm_per_group_) env.tp->all_reduce(dot);
  Owned dzxbcdt = env.act_tensor({T, width()}), dys = env.act_tensor({T, di_});
  for (int64_t j = 0; j < norm_parts(); ++j)
    ops::gated_rmsnorm_backward(part(dyn, j), part(s.y, j), part(s.zxbcdt, j), norm_.w().slice(j * nw, (j + 1) * nw),
                                stat_row(s.sumsq, j), stat_row(dot, j), norm_total(), eps_, part(dys, j),
                                part(dzxbcdt, j), norm_.g().slice(j * nw, (j + 1) * nw));
  dyn = Owned{};
  Owned conv = env.act_tensor({T, di_ + 2 * gn_}), dconv = env.act_tensor({T, di_ + 2 * gn_});
  ops::causal_conv1d_forward(xbc(s.zxbcdt), conv_w_.w(), conv_b_.w(), seg.cu_seqlens, true, conv);
  ops::ssd_scan_backward(scan_args(s, conv, seg), dys, s.states,
                         {ops::ColumnBlock(dconv, 0, di_), dt(dzxbcdt), ops::ColumnBlock(dconv, di_, gn_),
                          ops::ColumnBlock(dconv, di_ + gn_, gn_), a_log_.g(), d_.g(), dt_bias_.g()});
  dys = Owned{};
  conv = Owned{};
  ops::causal_conv1d_backward(dconv, xbc(s.zxbcdt), conv_w_.w(), conv_b_.w(), seg.cu_seqlens, true,
                              xbc(dzxbcdt), conv_w_.g(), conv_b_.g());
  dconv = Owned{};
  column_linear_backward(env, dzxbcdt, in, w_in_.w(), dxn, w_in_.g(), b_in_.g());
}

}  // namespace engine::layers
