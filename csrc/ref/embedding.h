// CPU reference of embedding lookups (f32 or f64 table; ids i32), same signatures and contract
// as ops/embedding.h (vocabulary shards included). Every id is checked before anything is
// written.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::ref {

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_begin = 0, int64_t vocab_total = 0);
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_begin = 0, int64_t vocab_total = 0);

}  // namespace engine::ref
