// CUDA launcher of ops/adamw.h (host declaration only; kernel in adamw.cu).
// param, grad, exp_avg, exp_avg_sq: f32 on the GPU, one element count (shapes may differ);
// compute_copy: bf16, f32 or undefined. One launch per call (per 200 decay runs); the result
// equals the CPU reference bit for bit (IEEE operations in the reference's order, no fused
// multiply-adds).
#pragma once
#include "core/tensor.h"
#include "ops/adamw.h"

namespace engine::cuda {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const ops::AdamWParams& p,
                const Tensor& compute_copy = {});

}  // namespace engine::cuda
