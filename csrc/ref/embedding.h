// CPU reference of embedding lookups (f32 or f64 table; ids i32), same signatures as
// ops/embedding.h. Every id is checked before anything is written.
#pragma once
#include "core/tensor.h"

namespace engine::ref {

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate);
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable);

}  // namespace engine::ref
