#include "comm/mappings.h"

#include "core/buffer.h"

namespace engine::tp {

namespace {
void same_or_copy(const Tensor& from, const Tensor& to) {
  if (from.data != to.data) copy_tensor(to, from);
}
int64_t row_elems(const Tensor& t) { return t.size(0) ? t.numel() / t.size(0) : 0; }
void expect_rows(Comm& tp, const Tensor& local, const Tensor& full, const char* op) {
  ENSURE(full.size(0) == local.size(0) * tp.size() && row_elems(full) == row_elems(local), op, ": ",
         full.shape.str(), " must hold ", tp.size(), " row blocks of ", local.shape.str());
}
}  // namespace

void copy_to_tp_forward(Comm&, const Tensor& x, const Tensor& y) { same_or_copy(x, y); }
void copy_to_tp_backward(Comm& tp, const Tensor& dy, const Tensor& dx) {
  same_or_copy(dy, dx);
  tp.all_reduce(dx);
}

std::function<void()> copy_to_tp_backward_async(Comm& tp, const Tensor& dy, const Tensor& dx) {
  same_or_copy(dy, dx);
  tp.all_reduce_async(dx);
  return tp.fence();
}

void reduce_from_tp_forward(Comm& tp, const Tensor& x, const Tensor& y) {
  same_or_copy(x, y);
  tp.all_reduce(y);
}
void reduce_from_tp_backward(Comm&, const Tensor& dy, const Tensor& dx) { same_or_copy(dy, dx); }

void gather_from_sp_forward(Comm& tp, const Tensor& x, const Tensor& y) {
  expect_rows(tp, x, y, "gather_from_sp_forward");
  tp.all_gather(x, y);
}
void gather_from_sp_backward(Comm& tp, const Tensor& dy, const Tensor& dx) {
  expect_rows(tp, dx, dy, "gather_from_sp_backward");
  tp.reduce_scatter(dy, dx);
}

std::function<void()> gather_from_sp_forward_async(Comm& tp, const Tensor& x, const Tensor& y) {
  expect_rows(tp, x, y, "gather_from_sp_forward_async");
  tp.all_gather_async(x, y);
  return tp.fence();
}
std::function<void()> gather_from_sp_backward_async(Comm& tp, const Tensor& dy, const Tensor& dx) {
  expect_rows(tp, dx, dy, "gather_from_sp_backward_async");
  tp.reduce_scatter_async(dy, dx);
  return tp.fence();
}

void scatter_to_sp_forward(Comm& tp, const Tensor& x, const Tensor& y) {
  expect_rows(tp, y, x, "scatter_to_sp_forward");
  tp.reduce_scatter(x, y);
}
void scatter_to_sp_backward(Comm& tp, const Tensor& dy, const Tensor& dx) {
  expect_rows(tp, dy, dx, "scatter_to_sp_backward");
  tp.all_gather(dy, dx);
}

void split_to_sp_forward(Comm& tp, const Tensor& x, const Tensor& y) {
  expect_rows(tp, y, x, "split_to_sp_forward");
  copy_tensor(y, x.slice(y.size(0) * tp.rank(), y.size(0) * (tp.rank() + 1)));
}
void split_to_sp_backward(Comm& tp, const Tensor& dy, const Tensor& dx) {
  expect_rows(tp, dy, dx, "split_to_sp_backward");
  tp.all_gather(dy, dx);
}

}  // namespace engine::tp
