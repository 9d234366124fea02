#include "layers/mamba.h"

#include <cmath>

#include "comm/mappings.h"
#include "layers/linear.h"
#include "parallel/tensor_parallel.h"
#include "ops/gemm.h"

namespace engine::layers {

namespace {

// Rows [begin, end) of a (rows, cols) weight or gradient view.
Tensor row_block(const Tensor& w, int64_t begin, int64_t end) { return w.slice(begin, end); }

// A (rows, cols) view `offset` elements into a flat buffer.
Tensor flat_view(const Tensor& flat, int64_t offset, int64_t rows, int64_t cols) {
  return Tensor(static_cast<char*>(flat.data) + offset * static_cast<int64_t>(dtype_size(flat.dtype)),
                flat.dtype, flat.device, {rows, cols});
}

}  // namespace

Mamba::Mamba(const ParamStore& store, const std::string& prefix, const MambaConfig& c)
    : di_(c.inner() / store.table().tp_size()), n_(c.d_state), r_(c.rank()), chunk_(c.chunk_len) {
  w_in_ = adjacent_rows(store, {prefix + ".in_proj_x", prefix + ".in_proj_z"});
  if (c.proj_bias) {
    b_in_ = adjacent_rows(store, {prefix + ".in_proj_x_bias", prefix + ".in_proj_z_bias"});
    b_out_ = Param(store, prefix + ".out_proj_bias");
  }
  conv_w_ = Param(store, prefix + ".conv_weight");
  if (c.conv_bias) conv_b_ = Param(store, prefix + ".conv_bias");
  x_proj_ = Param(store, prefix + ".x_proj");
  dt_proj_ = Param(store, prefix + ".dt_proj");
  dt_bias_ = Param(store, prefix + ".dt_bias");
  a_log_ = Param(store, prefix + ".A_log");
  d_ = Param(store, prefix + ".D");
  w_out_ = Param(store, prefix + ".out_proj");
}

void Mamba::declare(ParamTable& t, const std::string& prefix, const MambaConfig& c) {
  const int64_t C = c.hidden, Di = c.inner(), N = c.d_state, K = c.d_conv, R = c.rank();
  ENSURE(C > 0 && Di > 0 && N > 0 && K > 0 && R > 0 && c.chunk_len > 0, "mamba ", prefix,
         ": hidden ", C, ", d_inner ", Di, ", d_state ", N, ", d_conv ", K, ", dt_rank ", R,
         ", chunk_len ", c.chunk_len, " must all be positive");
  const double conv_bound = 1.0 / std::sqrt(static_cast<double>(K));
  t.add({.name = prefix + ".in_proj_x", .shape = {Di, C}, .split_dim = 0, .init_std = c.init_std});
  t.add({.name = prefix + ".in_proj_z", .shape = {Di, C}, .split_dim = 0, .init_std = c.init_std, .adjacent = true});
  if (c.proj_bias) {
    t.add({.name = prefix + ".in_proj_x_bias", .shape = {Di}, .split_dim = 0, .init = InitKind::Zeros, .weight_decay = false});
    t.add({.name = prefix + ".in_proj_z_bias", .shape = {Di}, .split_dim = 0, .init = InitKind::Zeros,
           .weight_decay = false, .adjacent = true});
  }
  t.add({.name = prefix + ".conv_weight", .shape = {Di, K}, .split_dim = 0, .init = InitKind::Uniform,
         .init_std = conv_bound});
  if (c.conv_bias)
    t.add({.name = prefix + ".conv_bias", .shape = {Di}, .split_dim = 0, .init = InitKind::Uniform,
           .init_std = conv_bound, .weight_decay = false});
  t.add({.name = prefix + ".x_proj", .shape = {R + 2 * N, Di}, .split_dim = 1, .init_std = c.init_std});
  t.add({.name = prefix + ".dt_proj", .shape = {Di, R}, .split_dim = 0, .init = InitKind::Uniform,
         .init_std = c.dt_scale / std::sqrt(static_cast<double>(R))});
  t.add({.name = prefix + ".dt_bias", .shape = {Di}, .split_dim = 0, .init = InitKind::InvSoftplusLogUniform,
         .weight_decay = false, .init_low = c.dt_min, .init_high = c.dt_max, .init_floor = c.dt_init_floor});
  t.add({.name = prefix + ".A_log", .shape = {Di, N}, .split_dim = 0, .init = InitKind::LogColumnIndex,
         .weight_decay = false});
  t.add({.name = prefix + ".D", .shape = {Di}, .split_dim = 0, .init = InitKind::Ones, .weight_decay = false});
  t.add({.name = prefix + ".out_proj", .shape = {C, Di}, .split_dim = 1,
         .init_std = c.init_std / std::sqrt(static_cast<double>(std::max(c.num_layers, 1)))});
  if (c.proj_bias)
    t.add({.name = prefix + ".out_proj_bias", .shape = {C}, .init = InitKind::Zeros, .weight_decay = false});
}

// B|C starts on a 64-element boundary of the buffer (aligned rows for the GEMMs writing it).
int64_t Mamba::bc_offset(int64_t tokens) const { return (tokens * r_ + 63) / 64 * 64; }
int64_t Mamba::xproj_numel(int64_t tokens) const { return bc_offset(tokens) + tokens * 2 * n_; }
Tensor Mamba::dt_low(const Tensor& xproj, int64_t tokens) const { return flat_view(xproj, 0, tokens, r_); }
Tensor Mamba::bc(const Tensor& xproj, int64_t tokens) const {
  return flat_view(xproj, bc_offset(tokens), tokens, 2 * n_);
}

ops::ScanArgs Mamba::scan_args(const MambaSaved& s, const Tensor& xc, const SegmentInfo& seg) const {
  const int64_t tokens = xc.size(0);
  const Tensor bcv = bc(s.xproj, tokens);
  ops::ScanArgs a;
  a.x = xc;
  a.dt = s.dt;
  a.A_log = a_log_.w();
  a.B = ops::ColumnBlock(bcv, 0, n_);
  a.C = ops::ColumnBlock(bcv, n_, n_);
  a.D = d_.w();
  a.dt_bias = dt_bias_.w();
  a.z = ops::ColumnBlock(s.xz, di_, di_);
  a.cu_seqlens = seg.cu_seqlens;
  a.chunk_len = chunk_;
  return a;
}

void Mamba::forward(const Env& env, const Tensor& xn, const Tensor& y, const SegmentInfo& seg,
                    MambaSaved& s) const {
  ENSURE(!seg.kv, "Mamba blocks cannot run on micro-sequences (the scan state would pass between chunks)");
  const int64_t T = full_rows(env, xn.size(0));
  s.xz = env.act_tensor({T, 2 * di_});
  column_gemm_forward(env, xn, [&](const Tensor& x, int64_t r0, int64_t r1) {
    linear_forward(env.column(), x, w_in_.w(), b_in_.w(), s.xz->slice(r0, r1));
  });
  Owned xc = env.act_tensor({T, di_});
  ops::causal_conv1d_forward(ops::ColumnBlock(s.xz, 0, di_), conv_w_.w(), conv_b_.w(), seg.cu_seqlens,
                             true, xc);
  // x_proj on its two row blocks: dt_low and B|C land in separate contiguous blocks of one buffer.
  s.xproj = env.act_tensor({xproj_numel(T)});
  const Tensor wx = x_proj_.w();
  ops::matmul(xc, false, row_block(wx, 0, r_), true, dt_low(s.xproj, T), {});
  ops::matmul(xc, false, row_block(wx, r_, r_ + 2 * n_), true, bc(s.xproj, T), {});
  if (env.tp_size() > 1) {  // row-parallel partial sums, then used by every rank's channels
    tp::reduce_from_tp_forward(*env.tp, s.xproj, s.xproj);
    tp::copy_to_tp_forward(*env.tp, s.xproj, s.xproj);
  }
  s.dt = env.act_tensor({T, di_});
  ops::matmul(dt_low(s.xproj, T), false, dt_proj_.w(), true, s.dt, {});
  s.y = env.act_tensor({T, di_});
  s.states = env.stat_tensor({ops::scan_num_chunks(T, chunk_), n_, di_});
  ops::selective_scan_forward(scan_args(s, xc, seg), s.y, s.states);
  xc = Owned{};
  row_linear_forward(env, s.y, w_out_.w(), b_out_, y);
}

void Mamba::backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                     const MambaSaved& s, const Tensor& dxn) const {
  row_linear_bias_backward(dy, b_out_);
  backward_except_out_bias(env, dy, xn, seg, s, dxn);
}

void Mamba::backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& xn,
                                     const SegmentInfo& seg, const MambaSaved& s,
                                     const Tensor& dxn) const {
  const int64_t T = full_rows(env, xn.size(0));
  Owned dys = env.act_tensor({T, di_});
  {
    Owned dy_storage;
    const Tensor dy_full = row_output_backward(env, dy, dy_storage);
    linear_backward(env.row(), dy_full, s.y, w_out_.w(), dys, w_out_.g(), {});
  }
  ColumnInput in(env, xn);  // sequence parallel: gathered again (beside what follows)
  Owned xc = env.act_tensor({T, di_});
  ops::causal_conv1d_forward(ops::ColumnBlock(s.xz, 0, di_), conv_w_.w(), conv_b_.w(), seg.cu_seqlens,
                             true, xc);

  Owned dxz = env.act_tensor({T, 2 * di_}), dxc = env.act_tensor({T, di_}), ddt = env.act_tensor({T, di_});
  Owned dxproj = env.act_tensor({xproj_numel(T)});
  const Tensor ddt_low = dt_low(dxproj, T), dbc = bc(dxproj, T);
  ops::selective_scan_backward(scan_args(s, xc, seg), dys, s.states,
                               {dxc, ddt, ops::ColumnBlock(dbc, 0, n_), ops::ColumnBlock(dbc, n_, n_),
                                ops::ColumnBlock(dxz, di_, di_), a_log_.g(), d_.g(), dt_bias_.g()});
  dys = Owned{};
  const ops::MatmulOptions accumulate{1.f, 1.f, {}};
  ops::matmul(ddt, false, dt_proj_.w(), false, ddt_low, {});                         // d dt_low
  ops::matmul(ddt, true, dt_low(s.xproj, T), false, dt_proj_.g(), accumulate);      // dW_dt +=
  ddt = Owned{};
  if (env.tp_size() > 1) {  // every rank's channels contributed to d[dt_low | B | C]
    tp::copy_to_tp_backward(*env.tp, dxproj, dxproj);
    tp::reduce_from_tp_backward(*env.tp, dxproj, dxproj);
  }
  const Tensor wx = x_proj_.w(), gx = x_proj_.g();
  ops::matmul(ddt_low, false, row_block(wx, 0, r_), false, dxc, accumulate);           // dxc +=
  ops::matmul(dbc, false, row_block(wx, r_, r_ + 2 * n_), false, dxc, accumulate);
  ops::matmul(ddt_low, true, xc, false, row_block(gx, 0, r_), accumulate);             // dW_x +=
  ops::matmul(dbc, true, xc, false, row_block(gx, r_, r_ + 2 * n_), accumulate);
  xc = Owned{};
  dxproj = Owned{};
  ops::causal_conv1d_backward(dxc, ops::ColumnBlock(s.xz, 0, di_), conv_w_.w(), conv_b_.w(), seg.cu_seqlens,
                              true, ops::ColumnBlock(dxz, 0, di_), conv_w_.g(), conv_b_.g());
  dxc = Owned{};
  column_linear_backward(env, dxz, in, w_in_.w(), dxn, w_in_.g(), b_in_.g());
}

}  // namespace engine::layers
