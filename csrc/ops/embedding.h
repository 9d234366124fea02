// Embedding lookups, optionally over one shard of a vocabulary-parallel table.
// ids (T) i32; table (rows, C); out (T, C). The table holds the ids
// [vocab_begin, vocab_begin + rows) of a vocabulary of vocab_total ids; vocab_total = 0 means
// rows (unsharded: the whole vocabulary, vocab_begin must then be 0). Every id must lie in
// [0, vocab_total): an id out of range is an error naming the token position.
//   forward:  out(t) = table(ids(t) - vocab_begin)   for ids in the shard, a zero row otherwise
//             (accumulate: out(t) += table(ids(t) - vocab_begin) for ids in the shard, the other
//             rows of out untouched)
//   backward: dtable(ids(t) - vocab_begin) += dout(t) for ids in the shard only (rows summed in
//             token order: deterministic)
// Summing the forward outputs of all shards (tensor parallelism: an all-reduce) gives the
// unsharded lookup; each shard's backward is that shard's rows of the unsharded gradient. The
// learned-position table is an ordinary unsharded table (default arguments).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::ops {

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_begin = 0, int64_t vocab_total = 0);
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_begin = 0, int64_t vocab_total = 0);

}  // namespace engine::ops
