#include "parallel/tensor_parallel.h"

#include "comm/mappings.h"
#include "layers/linear.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"

namespace engine::layers {

namespace {
Shape with_rows(Shape s, int64_t rows) {
  s.d[0] = rows;
  return s;
}
// A tensor shaped like `t` with the full rows of the parallel region (t: this rank's rows).
Owned full_rows_tensor(const Env& env, const Tensor& t) {
  return env.act_tensor(with_rows(t.shape, full_rows(env, t.size(0))));
}
}  // namespace

Tensor column_input_forward(const Env& env, const Tensor& x, Owned& storage) {
  if (env.tp_size() == 1) return x;
  if (!env.sp()) {
    tp::copy_to_tp_forward(*env.tp, x, x);
    return x;
  }
  storage = full_rows_tensor(env, x);
  tp::gather_from_sp_forward(*env.tp, x, storage);
  return storage;
}

void column_input_backward(const Env& env, const Tensor& dx_full, const Tensor& dx) {
  if (env.tp_size() == 1) {
    if (dx_full.data != dx.data) copy_tensor(dx, dx_full);
    return;
  }
  if (env.sp())
    tp::gather_from_sp_backward(*env.tp, dx_full, dx);
  else
    tp::copy_to_tp_backward(*env.tp, dx_full, dx);
}

void column_gemm_forward(const Env& env, const Tensor& xn, const RowGemm& gemm) {
  // (Per-tensor FP8 scales span every row: the product waits for the whole gathered input.)
  if (!env.sp() || !env.tp_overlap || env.fp8 == Fp8Recipe::Tensorwise) {
    Owned storage;
    const Tensor x = column_input_forward(env, xn, storage);
    gemm(x, 0, x.size(0));
    return;
  }
  const int64_t n = xn.size(0), r0 = n * env.tp_rank(), T = full_rows(env, n);
  Owned storage = full_rows_tensor(env, xn);
  const std::function<void()> gathered = tp::gather_from_sp_forward_async(*env.tp, xn, storage);
  gemm(xn, r0, r0 + n);
  if (gathered) gathered();
  if (r0 > 0) gemm(storage->slice(0, r0), 0, r0);
  if (r0 + n < T) gemm(storage->slice(r0 + n, T), r0 + n, T);
}

ColumnInput::ColumnInput(const Env& env, const Tensor& xn) : env_(&env), xn_(xn) {
  if (!env.sp()) {
    x_ = xn;
  } else if (env.tp_overlap) {
    storage_ = full_rows_tensor(env, xn);
    x_ = storage_;
    pending_ = tp::gather_from_sp_forward_async(*env.tp, xn, x_);
  }
}

const Tensor& ColumnInput::get() {
  if (!x_.data) x_ = column_input_forward(*env_, xn_, storage_);  // without overlap: gathered here
  wait();
  return x_;
}

void column_linear_backward(const Env& env, const Tensor& dy, ColumnInput& in, const Tensor& weight,
                            const Tensor& dxn, const Tensor& dweight, const Tensor& dbias,
                            const LowRankBackward& low_rank, const LinearAmaxes* saved, Fp8Amax* dy_amax) {
  Owned storage;
  const Tensor dx_full = env.sp() ? (storage = full_rows_tensor(env, dxn)).t : dxn;
  if (env.tp_size() == 1 || !env.tp_overlap) {
    linear_backward(env.column(), dy, dweight.data || dbias.data ? in.get() : Tensor{}, weight, dx_full, dweight, dbias,
                    saved, dy_amax);
    if (low_rank) low_rank(in.get(), dx_full);
    column_input_backward(env, dx_full, dxn);
    return;
  }
  // (dy's amax, where FP8 shares one, kept for the second call: dy_amax or this.)
  Fp8Amax own;
  Fp8Amax* dya = dy_amax ? dy_amax : &own;
  linear_backward(env.column(), dy, Tensor{}, weight, dx_full, Tensor{}, Tensor{}, saved, dya);  // dx = dy W
  // (LoRA's terms need the gathered input: under sequence parallelism they wait for it here.)
  if (low_rank) low_rank(in.get(), dx_full);
  const std::function<void()> reduced = env.sp() ? tp::gather_from_sp_backward_async(*env.tp, dx_full, dxn)
                                                 : tp::copy_to_tp_backward_async(*env.tp, dx_full, dxn);
  if (dweight.data || dbias.data)
    linear_backward(env.column(), dy, in.get(), weight, Tensor{}, dweight, dbias, saved, dya);  // dW, db beside the reduction
  if (reduced) reduced();
}

void row_output_forward(const Env& env, const Tensor& partial, const Tensor& y) {
  if (env.tp_size() == 1) {
    if (partial.data != y.data) copy_tensor(y, partial);
    return;
  }
  if (env.sp())
    tp::scatter_to_sp_forward(*env.tp, partial, y);
  else
    tp::reduce_from_tp_forward(*env.tp, partial, y);
}

void row_linear_bias_backward(const Tensor& dy, const Param& bias) {
  if (bias && !bias.frozen) ops::sum_rows(dy.rows(), bias.g(), 1.f);
}

void row_linear_forward(const Env& env, const Tensor& x, const Tensor& weight, const Param& bias, const Tensor& y,
                        const Tensor& residual, const std::function<void(const Tensor&)>& low_rank,
                        LinearAmaxes* saved) {
  const Tensor b = bias && bias.store->table().tp_rank() == 0 ? bias.w() : Tensor{};
  if (env.sp()) {
    Owned partial = env.act_tensor({x.size(0), y.size(1)});
    linear_forward(env.row(), x, weight, b, partial, {}, saved);
    if (low_rank) low_rank(partial);
    row_output_forward(env, partial, y);
  } else if (residual.data && env.tp_size() == 1) {  // no reduction: the residual in the epilogue
    linear_forward(env.row(), x, weight, b, y, residual, saved);
    if (low_rank) low_rank(y);
    return;
  } else {
    linear_forward(env.row(), x, weight, b, y, {}, saved);
    if (low_rank) low_rank(y);
    row_output_forward(env, y, y);
  }
  if (residual.data) ops::add(y, residual, y);
}

Tensor row_output_backward(const Env& env, const Tensor& dy, Owned& storage) {
  if (env.tp_size() == 1) return dy;
  if (!env.sp()) {
    tp::reduce_from_tp_backward(*env.tp, dy, dy);
    return dy;
  }
  storage = full_rows_tensor(env, dy);
  tp::scatter_to_sp_backward(*env.tp, dy, storage);
  return storage;
}

}  // namespace engine::layers
