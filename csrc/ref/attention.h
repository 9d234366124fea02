// CPU reference of varlen grouped-query attention (f32 or f64; lse in the dtype of qkv), same
// signatures as ops/attention.h. Exact softmax (max-subtracted) in double, one (sequence, head)
// at a time; backward recomputes the probabilities from lse and sums dk, dv over the q heads of
// each kv group in head order, so results do not depend on the thread count.
#pragma once
#include "ops/attention.h"

namespace engine::ref {

void attention_forward(const ops::AttentionParams& p);
void attention_backward(const ops::AttentionBackwardParams& p);

}  // namespace engine::ref
