// Embedding lookups. ids (T) i32 in [0, V); table (V, C); out (T, C).
//   forward:  out(t) = table(ids(t))            (accumulate: out(t) += table(ids(t)))
//   backward: dtable(ids(t)) += dout(t)         (rows summed in token order: deterministic)
// An id out of range is an error naming the token position.
#pragma once
#include "core/tensor.h"

namespace engine::ops {

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate);
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable);

}  // namespace engine::ops
