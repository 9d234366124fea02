// CUDA launchers of the row and column reductions beside the GEMM (host declarations only;
// kernels in sum_rows.cu): bias gradients of linear layers, and the bias-gradient fallback of
// cuda/gemm/gemm.cu.
//   sum_rows:    out(j) = beta * out(j) + sum_i x(i, j)    x (M, N), out (N)   (ops::sum_rows)
//   sum_columns: out(i) = beta * out(i) + sum_j x(i, j)    x (M, N), out (M)
// x bf16 or f32, out f32 or bf16; sums in f32 in a fixed order (deterministic, no float
// atomics); out is not read when beta == 0.
#pragma once
#include "core/tensor.h"

namespace engine::cuda {

void sum_rows(const Tensor& x, const Tensor& out, float beta);
void sum_columns(const Tensor& x, const Tensor& out, float beta);

}  // namespace engine::cuda
