#include "layers/parallel.h"

#include "comm/mappings.h"
#include "layers/linear.h"
#include "ops/gemm.h"

namespace engine::layers {

namespace {
Shape with_rows(Shape s, int64_t rows) {
  s.d[0] = rows;
  return s;
}
}  // namespace

Tensor column_input_forward(const Env& env, const Tensor& x, Owned& storage) {
  if (env.tp_size() == 1) return x;
  if (!env.sp()) {
    tp::copy_to_tp_forward(*env.tp, x, x);
    return x;
  }
  storage = env.act_tensor(with_rows(x.shape, full_rows(env, x.size(0))));
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
  if (!env.sp() || !env.tp_overlap) {
    Owned storage;
    const Tensor x = column_input_forward(env, xn, storage);
    gemm(x, 0, x.size(0));
    return;
  }
  const int64_t n = xn.size(0), r0 = n * env.tp_rank(), T = full_rows(env, n);
  Owned storage = env.act_tensor(with_rows(xn.shape, T));
  std::function<void()> gathered = tp::gather_from_sp_forward_async(*env.tp, xn, storage);
  gemm(xn, r0, r0 + n);
  if (gathered) gathered();
  if (r0 > 0) gemm(storage->slice(0, r0), 0, r0);
  if (r0 + n < T) gemm(storage->slice(r0 + n, T), r0 + n, T);
}

ColumnInput::ColumnInput(const Env& env, const Tensor& xn) {
  if (!env.sp()) {
    x_ = xn;
    return;
  }
  storage_ = env.act_tensor(with_rows(xn.shape, full_rows(env, xn.size(0))));
  x_ = storage_;
  if (env.tp_overlap)
    pending_ = tp::gather_from_sp_forward_async(*env.tp, xn, x_);
  else
    tp::gather_from_sp_forward(*env.tp, xn, x_);
}

void column_linear_backward(const Env& env, const Tensor& dy, ColumnInput& in, const Tensor& weight,
                            const Tensor& dxn, const Tensor& dweight, const Tensor& dbias) {
  if (env.tp_size() == 1 || !env.tp_overlap) {
    Owned storage;
    const Tensor dx_full = env.sp() ? (storage = env.act_tensor(with_rows(dxn.shape, dy.size(0)))).t : dxn;
    linear_backward(dy, in.get(), weight, dx_full, dweight, dbias);
    column_input_backward(env, dx_full, dxn);
    return;
  }
  Owned storage;
  const Tensor dx_full = env.sp() ? (storage = env.act_tensor(with_rows(dxn.shape, dy.size(0)))).t : dxn;
  ops::matmul(dy.rows(), false, weight, false, dx_full.rows());  // dx = dy W
  const std::function<void()> reduced = env.sp() ? tp::gather_from_sp_backward_async(*env.tp, dx_full, dxn)
                                                 : tp::copy_to_tp_backward_async(*env.tp, dx_full, dxn);
  linear_backward(dy, in.get(), weight, Tensor{}, dweight, dbias);  // dW, db beside the reduction
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

Tensor row_output_backward(const Env& env, const Tensor& dy, Owned& storage) {
  if (env.tp_size() == 1) return dy;
  if (!env.sp()) {
    tp::reduce_from_tp_backward(*env.tp, dy, dy);
    return dy;
  }
  storage = env.act_tensor(with_rows(dy.shape, full_rows(env, dy.size(0))));
  tp::scatter_to_sp_backward(*env.tp, dy, storage);
  return storage;
}

}  // namespace engine::layers
