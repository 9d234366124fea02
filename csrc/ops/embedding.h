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
// learned-position table is an ordinary unsharded table (vocab_begin = vocab_total = 0).
// check: how an id outside [0, vocab_total) is reported. kRaise: the call raises naming the token
// position and the id (on the GPU that reads a flag back from the device: the host waits for the
// kernels). kTrusted: the caller has checked the ids on the host (the model's callers: the data
// sampler checks every token against model.vocab_size, positions are below sequence_length <=
// max_position_embeddings by configuration), so the GPU reads nothing back and the host runs on;
// a bad id still never reads or writes outside the table (a zero row forward, or out untouched
// with accumulate; nothing added backward) but is not reported. The CPU reference checks either
// way (it costs nothing there).
// Dtypes: out of the table's dtype; CPU: table f32 or f64, dout of dtable's dtype; GPU: table
// bf16 or f32, dout bf16 or f32 with dtable f32 (summed in f32).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ops {

enum class IdCheck { kRaise, kTrusted };

}  // namespace engine::ops

#define ENGINE_EMBEDDING_OPS(OP)                                                            \
  OP(void, embedding_forward,                                                               \
     (const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,           \
      int64_t vocab_begin, int64_t vocab_total, ops::IdCheck check),                         \
     (ids, table, out, accumulate, vocab_begin, vocab_total, check))                         \
  OP(void, embedding_backward,                                                              \
     (const Tensor& ids, const Tensor& dout, const Tensor& dtable, int64_t vocab_begin,     \
      int64_t vocab_total, ops::IdCheck check),                                             \
     (ids, dout, dtable, vocab_begin, vocab_total, check))

ENGINE_DECLARE_OPS(ENGINE_EMBEDDING_OPS)
