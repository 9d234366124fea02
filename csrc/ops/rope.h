// Rotary position embedding, "rotate half" pairing as Hugging Face Llama does: within each head,
// dimension i pairs with i + D/2 (i < D/2), rotated by angle pos * inv_freq(i) and scaled by m:
//   (a, b) -> m (a cos - b sin), m (b cos + a sin)
// inv_freq(i) = theta^(-2i/D) with the scaling of rope.kind (none, linear, llama3, yarn) and m
// (1, yarn: attention_factor) as ops/rope_params.h defines them, for both backends.
// x is (T, NH, D) and only its first `rotated_heads` heads are rotated (the q and k heads of a
// packed qkv tensor; v heads are left alone). positions (T) i32 restart at document starts.
// positions (T, 2) i32 are 2-D (an image patch's row and column, Pixtral's vision encoder): the
// first D/4 pairs turn with the row, the others with the column (ops::rope_2d_inv_freq); D a
// multiple of 4, no frequency scaling (kind none); the CPU reference only so far.
// Backward applies the transposed map (the inverse rotation, times m) to the gradient, in place.
// D even; theta, factor, attention_factor > 0; the kind's other fields as RopeParams says.
// CPU: f32 or f64, angles and their sines and cosines in double. GPU: bf16 or f32, D <= 2048;
// inverse frequencies and angles in double as the CPU computes them, cos and sin by a double
// reduction and polynomials, times m in double (rounded to f32, they equal the CPU's rounded
// values); the rotation itself in f32.
#pragma once
#include "core/tensor.h"
#include "ops/op.h"
#include "ops/rope_params.h"

#define ENGINE_ROPE_OPS(OP)                                                                   \
  OP(void, rope_forward,                                                                      \
     (const Tensor& x, const Tensor& positions, int rotated_heads, const ops::RopeParams& rope), \
     (x, positions, rotated_heads, rope))                                                     \
  OP(void, rope_backward,                                                                     \
     (const Tensor& dx, const Tensor& positions, int rotated_heads,                           \
      const ops::RopeParams& rope),                                                           \
     (dx, positions, rotated_heads, rope))

ENGINE_DECLARE_OPS(ENGINE_ROPE_OPS)
