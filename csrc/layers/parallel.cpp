#include "layers/parallel.h"

#include "comm/mappings.h"

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
