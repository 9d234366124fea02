// Tensor-parallel communication as named conjugate pairs (Megatron's mappings): each forward
// op and the op its backward must run are declared side by side, so a layer never leaves the
// gradient of a collective implicit. All act on the tensor-parallel group `tp`; tensors are
// (rows, ...) with rows = tokens, split along dim 0 for sequence parallelism (row blocks in
// rank order). Every pair is an adjoint pair: sum over ranks of <F(x), y> = sum of <x, B(y)>.
//
//   forward                       backward (of the gradient)
//   copy_to_tp      identity      all-reduce              (input of a column-parallel linear)
//   reduce_from_tp  all-reduce    identity                (output of a row-parallel linear)
//   gather_from_sp  all-gather    reduce-scatter          (sequence parallel: before column-parallel)
//   scatter_to_sp   reduce-scatter all-gather             (sequence parallel: after row-parallel)
//   split_to_sp     keep own rows all-gather              (enter sequence parallelism)
//
// `in` and `out` may be the same tensor for the identity and all-reduce directions.
//
// The *_async forms start the same collective on the group's stream and return what orders later
// compute after it (comm.h's fence; empty on host backends, where it is already done). Call it
// before the output is read and before any of the tensors is freed or reused.
#pragma once
#include <functional>

#include "comm/comm.h"

namespace engine::tp {

void copy_to_tp_forward(Comm& tp, const Tensor& x, const Tensor& y);
void copy_to_tp_backward(Comm& tp, const Tensor& dy, const Tensor& dx);
std::function<void()> copy_to_tp_backward_async(Comm& tp, const Tensor& dy, const Tensor& dx);

void reduce_from_tp_forward(Comm& tp, const Tensor& x, const Tensor& y);
void reduce_from_tp_backward(Comm& tp, const Tensor& dy, const Tensor& dx);

// x (rows, ...) -> y (tp.size() * rows, ...)
void gather_from_sp_forward(Comm& tp, const Tensor& x, const Tensor& y);
void gather_from_sp_backward(Comm& tp, const Tensor& dy, const Tensor& dx);
std::function<void()> gather_from_sp_forward_async(Comm& tp, const Tensor& x, const Tensor& y);
std::function<void()> gather_from_sp_backward_async(Comm& tp, const Tensor& dy, const Tensor& dx);

// x (tp.size() * rows, ...) -> y (rows, ...): this rank's row block of the sum over ranks
void scatter_to_sp_forward(Comm& tp, const Tensor& x, const Tensor& y);
void scatter_to_sp_backward(Comm& tp, const Tensor& dy, const Tensor& dx);

// x (tp.size() * rows, ...) replicated -> y (rows, ...): this rank's row block, no communication
void split_to_sp_forward(Comm& tp, const Tensor& x, const Tensor& y);
void split_to_sp_backward(Comm& tp, const Tensor& dy, const Tensor& dx);

}  // namespace engine::tp
