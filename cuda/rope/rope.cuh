// CUDA launchers of rotary position embedding (contract: csrc/ops/rope.h; kernels: rope.cu).
// x / dx (T, NH, D) bf16 or f32, rotated in place; positions (T) i32. Angles in double as the CPU
// reference computes them, cos and sin by a double reduction and polynomials (rounded to f32,
// they equal the reference's rounded values); the rotation itself in f32. D even, D <= 2048.
#pragma once
#include "core/tensor.h"

namespace engine::cuda {

void rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads, float theta);
void rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads, float theta);

}  // namespace engine::cuda
