// Rotary position embedding, "rotate half" pairing as Hugging Face Llama does: within each head,
// dimension i pairs with i + D/2 (i < D/2), rotated by angle pos * theta^(-2i/D):
//   (a, b) -> (a cos - b sin, b cos + a sin)
// x is (T, NH, D) and only its first `rotated_heads` heads are rotated (the q and k heads of a
// packed qkv tensor; v heads are left alone). positions (T) i32 restart at document starts.
// Backward applies the inverse rotation to the gradient, in place. D even, theta > 0.
// CPU: f32 or f64, angles and their sines and cosines in double. GPU: bf16 or f32, D <= 2048;
// angles in double as the CPU computes them, cos and sin by a double reduction and polynomials
// (rounded to f32, they equal the CPU's rounded values); the rotation itself in f32.
#pragma once
#include "core/tensor.h"
#include "ops/op.h"

#define ENGINE_ROPE_OPS(OP)                                                                \
  OP(void, rope_forward,                                                                   \
     (const Tensor& x, const Tensor& positions, int rotated_heads, float theta),           \
     (x, positions, rotated_heads, theta))                                                 \
  OP(void, rope_backward,                                                                  \
     (const Tensor& dx, const Tensor& positions, int rotated_heads, float theta),          \
     (dx, positions, rotated_heads, theta))

ENGINE_DECLARE_OPS(ENGINE_ROPE_OPS)
