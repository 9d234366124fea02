// Rotary position embedding, "rotate half" pairing as Hugging Face Llama does: within each head,
// dimension i pairs with i + D/2 (i < D/2), rotated by angle pos * theta^(-2i/D):
//   (a, b) -> (a cos - b sin, b cos + a sin)
// x is (T, NH, D) and only its first `rotated_heads` heads are rotated (the q and k heads of a
// packed qkv tensor; v heads are left alone). positions (T) i32 restart at document starts.
// Backward applies the inverse rotation to the gradient, in place.
#pragma once
#include "core/tensor.h"

namespace engine::ops {

void rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads, float theta);
void rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads, float theta);

}  // namespace engine::ops
