// CUDA launchers of embedding lookups (contract: csrc/ops/embedding.h; kernels: embedding.cu).
//   forward:  ids (T) i32, table (V, C) bf16 or f32, out (T, C) same dtype as table; = or +=
//   backward: ids (T) i32, dout (T, C) bf16 or f32, dtable (V, C) f32 accumulated (+=),
//             deterministic (rows of one id summed in token order, the same bits every run)
// An id outside [0, V) raises engine::Error naming the token position and the id; the check
// reads a flag back from the device, so both launchers wait for their kernels.
#pragma once
#include "core/tensor.h"

namespace engine::cuda {

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate);
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable);

}  // namespace engine::cuda
