// The tensor-parallel boundaries of a layer (Megatron style), built from the conjugate pairs of
// comm/mappings.h so that each forward collective and its backward sit in one place:
//
//   column-parallel input   (T, C) each rank multiplies by its block of output features
//     tp:       copy_to_tp      forward identity,   backward all-reduce of the input gradient
//     tp + sp:  gather_from_sp  forward all-gather of the token shards, backward reduce-scatter
//   row-parallel output     each rank's partial sum over its block of input features
//     tp:       reduce_from_tp  forward all-reduce,  backward identity
//     tp + sp:  scatter_to_sp   forward reduce-scatter into token shards, backward all-gather
//
// With no tensor parallelism every function is the identity and moves no bytes.
#pragma once
#include "layers/common.h"

namespace engine::layers {

// The rows (tokens) a layer's parallel region works on, from the rows of its input shard.
inline int64_t full_rows(const Env& env, int64_t local_rows) {
  return env.sp() ? local_rows * env.tp_size() : local_rows;
}

// The input of a column-parallel GEMM: `x` itself, or under sequence parallelism the all-gather
// of the token shards (kept in `storage`).
Tensor column_input_forward(const Env& env, const Tensor& x, Owned& storage);
// dx_full (full rows): the partial input gradient of this rank's columns; dx (x's rows) gets the
// sum over ranks (in place when they are the same tensor, without sequence parallelism).
void column_input_backward(const Env& env, const Tensor& dx_full, const Tensor& dx);

// y (x's local rows) = the sum over ranks of the partial outputs (full rows); `partial` may be
// `y` itself without sequence parallelism (reduced in place).
void row_output_forward(const Env& env, const Tensor& partial, const Tensor& y);
// The gradient of the partial outputs (full rows) from dy: dy itself, or its all-gather.
Tensor row_output_backward(const Env& env, const Tensor& dy, Owned& storage);

}  // namespace engine::layers
