// CUDA launchers of the causal depthwise conv1d of Mamba (contract: csrc/ops/mamba.h; kernels:
// conv1d.cu). x, y, dy, dx: bf16 column blocks (T, Di) of row-major tensors, any alignment;
// weight (Di, K), bias (Di) bf16; dweight, dbias f32, accumulated (+=) by a deterministic
// two-pass reduction. K <= 4.
#pragma once
#include "ops/mamba.h"

namespace engine::cuda {

void causal_conv1d_forward(const ops::ColumnBlock& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& cu_seqlens, bool silu, const ops::ColumnBlock& y);
void causal_conv1d_backward(const ops::ColumnBlock& dy, const ops::ColumnBlock& x,
                            const Tensor& weight, const Tensor& bias, const Tensor& cu_seqlens,
                            bool silu, const ops::ColumnBlock& dx, const Tensor& dweight,
                            const Tensor& dbias);

}  // namespace engine::cuda
