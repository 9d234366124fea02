// CUDA launchers of embedding lookups (contract: csrc/ops/embedding.h; kernels: embedding.cu).
//   forward:  ids (T) i32, table (R, C) bf16 or f32, out (T, C) same dtype as table; = or +=
//   backward: ids (T) i32, dout (T, C) bf16 or f32, dtable (R, C) f32 accumulated (+=),
//             deterministic (rows of one id summed in token order, the same bits every run)
// The table holds ids [vocab_begin, vocab_begin + R) of a vocabulary of vocab_total ids (0: R,
// unsharded); ids of other shards give zero rows (forward =), leave out untouched (+=) and add
// nothing (backward). With raise_bad_ids an id outside [0, vocab_total) raises engine::Error
// naming the token position and the id; the check reads a flag back from the device, so both
// launchers wait for their kernels. Without it (ids checked by the caller) nothing is read back
// and a bad id is skipped as another shard's id is (ops::IdCheck::kTrusted).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::cuda {

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_begin = 0, int64_t vocab_total = 0, bool raise_bad_ids = true);
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_begin = 0, int64_t vocab_total = 0, bool raise_bad_ids = true);

}  // namespace engine::cuda
