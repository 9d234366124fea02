// Per-head RMSNorm of queries and keys before RoPE (Qwen3, OLMo-2), in place on a packed qkv
// tensor x (T, NH, D): heads [0, q_heads) are q heads normalised with weight row 0, heads
// [q_heads, q_heads + k_heads) are k heads normalised with weight row 1; the rest (v) untouched.
// For each such row r of D elements:
//   rstd = 1 / sqrt(mean_d(r^2) + eps),   r <- r * rstd * w
// Forward saves the rows it normalises, as they were, in `input` (T, q_heads + k_heads, D) and
// their rstd in `rstd` (T, q_heads + k_heads); k_heads = rstd.size(1) - q_heads.
// Backward, in place on dx (T, NH, D): on entry the gradient of the normalised rows, on exit that
// of the rows before the norm (the v heads are not touched), with xhat = input * rstd, g = dy * w:
//   dx = rstd * (g - xhat * mean_d(g * xhat))             (written, =)
//   dweight[0 or 1] += sum over rows of its heads of dy * xhat   (accumulated, +=)
// weight (2, D) has the dtype of x; rstd and dweight (2, D) are f64 for an f64 x, else f32.
// CPU: f32 or f64, every sum in double. GPU: bf16 or f32, sums in f32, D <= 1024; the weight
// gradients deterministic (no atomics).
#pragma once
#include "core/tensor.h"
#include "ops/op.h"

#define ENGINE_QK_NORM_OPS(OP)                                                                  \
  OP(void, qk_norm_forward,                                                                     \
     (const Tensor& x, const Tensor& weight, int q_heads, float eps, const Tensor& input,       \
      const Tensor& rstd),                                                                      \
     (x, weight, q_heads, eps, input, rstd))                                                    \
  OP(void, qk_norm_backward,                                                                    \
     (const Tensor& dx, const Tensor& input, const Tensor& weight, int q_heads,                 \
      const Tensor& rstd, const Tensor& dweight),                                               \
     (dx, input, weight, q_heads, rstd, dweight))

ENGINE_DECLARE_OPS(ENGINE_QK_NORM_OPS)
