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
//
// The row-parallel output bias is replicated: only the first tensor-parallel rank adds it
// (row_linear_forward), and every rank sums its gradient over its rows (row_linear_bias_backward).
// The layers (Attention, Mlp, Mamba, Moe, Embedding, LmHead) call these inside their forward and
// backward; this file needs only their environment and linears (layers/common.h, layers/linear.h).
//
// Overlap (Env::tp_overlap, distributed.tp_overlap): a column-parallel layer's collectives run on
// the tensor-parallel group's stream beside its GEMMs wherever the data allow:
//   forward, tp + sp   the GEMM of this rank's own rows runs while the other ranks' rows arrive
//   backward, tp + sp  the input's all-gather (for the weight gradient) runs beside the compute
//                      before it (started when the sublayer's backward begins), and the input
//                      gradient's reduce-scatter beside the weight-gradient GEMM
//   backward, tp       the input gradient's all-reduce beside the weight-gradient GEMM
// What stays in line: the row-parallel output's all-reduce (reduce-scatter with sp) in the
// forward and, with sp, the all-gather of its gradient in the backward (every GEMM after them
// needs all of their rows).
#pragma once
#include <functional>

#include "layers/common.h"
#include "layers/linear.h"

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

// A column-parallel GEMM's forward from xn (this rank's rows): `gemm(x, r0, r1)` computes the
// output rows [r0, r1) of the full rows from x, those rows of the input. Called once with all
// rows, or under sequence parallelism first for this rank's own rows (from xn, while the other
// ranks' rows are gathered; overlap) and then for the rest; once with all rows under per-tensor FP8.
using RowGemm = std::function<void(const Tensor& x, int64_t r0, int64_t r1)>;
void column_gemm_forward(const Env& env, const Tensor& xn, const RowGemm& gemm);

// A column-parallel layer's input (full rows) for its backward: xn itself, or under sequence
// parallelism the all-gather of the token shards. With overlap the gather starts when this is
// made, so that it runs beside the compute queued until get(); without, get() gathers in line.
// Destroying it waits for a gather still pending, so its storage is never handed out again
// before the bytes have landed.
class ColumnInput {
 public:
  ColumnInput(const Env& env, const Tensor& xn);
  ~ColumnInput() { wait(); }
  ColumnInput(const ColumnInput&) = delete;
  ColumnInput& operator=(const ColumnInput&) = delete;
  const Tensor& get();  // x, complete for the compute queued after the call

 private:
  void wait() {
    if (pending_) pending_();
    pending_ = nullptr;
  }
  const Env* env_;
  Tensor xn_;
  Owned storage_;
  Tensor x_;  // empty until gathered (sequence parallel without overlap)
  std::function<void()> pending_;
};

// The backward of a column-parallel linear y = x W^T (+ b) with x = in.get() and dy of full rows:
// dW += dy^T x, db += the column sums of dy (when given), and dxn (xn's rows) = the sum over the
// tp ranks of dy W, whose reduction runs beside the weight-gradient GEMM (overlap). dxn is
// complete for the compute queued after the call. A frozen weight's dweight is undefined (no
// GEMM). `low_rank(x, dx_full)` (LoRA, layers/lora.h) adds its terms to the partial input
// gradient before the reduction and accumulates its own parameter gradients.
// saved and dy_amax: the FP8 amaxes linear_backward takes (layers/linear.h), shared by its two
// calls where the reduction splits it.
using LowRankBackward = std::function<void(const Tensor& x, const Tensor& dx_full)>;
void column_linear_backward(const Env& env, const Tensor& dy, ColumnInput& in, const Tensor& weight,
                            const Tensor& dxn, const Tensor& dweight, const Tensor& dbias,
                            const LowRankBackward& low_rank = {}, const LinearAmaxes* saved = nullptr,
                            Fp8Amax* dy_amax = nullptr);

// y (x's local rows) = the sum over ranks of the partial outputs (full rows); `partial` may be
// `y` itself without sequence parallelism (reduced in place).
void row_output_forward(const Env& env, const Tensor& partial, const Tensor& y);
// A row-parallel linear's forward: y = (x W^T summed over the tensor-parallel group) + bias
// (+ residual), y holding this rank's rows (reduce-scattered under sequence parallelism). The
// bias is replicated, so only the first tensor-parallel rank adds it to its partial sum; without
// tensor parallelism the residual joins in the GEMM's epilogue, else after the reduction.
// `low_rank(partial)` (LoRA) adds its term to this rank's partial output before the reduction.
// saved: linear_forward's FP8 amaxes (layers/linear.h).
void row_linear_forward(const Env& env, const Tensor& x, const Tensor& weight, const Param& bias, const Tensor& y,
                        const Tensor& residual = {}, const std::function<void(const Tensor&)>& low_rank = {},
                        LinearAmaxes* saved = nullptr);
// A row-parallel linear's output bias gradient: += sum_t dy over this rank's rows. Complete
// without sequence parallelism (dy is replicated); with it a partial sum over the token shards,
// reduced with the other replicated parameters' gradients (parallel/data_parallel.h). Nothing
// without a bias.
void row_linear_bias_backward(const Tensor& dy, const Param& bias);
// The gradient of the partial outputs (full rows) from dy: dy itself, or its all-gather.
Tensor row_output_backward(const Env& env, const Tensor& dy, Owned& storage);

}  // namespace engine::layers
