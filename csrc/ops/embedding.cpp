// The embedding ops (ops/embedding.h): the preconditions both backends share, and the dispatch.
// The backends check the dtypes they take, the ids' values (the CPU before it writes anything,
// the GPU through a flag read back after its kernels) and their size limits.
#include "ops/embedding.h"

namespace engine::ops {
namespace {

// The checks of a lookup, in this order: the table (or its gradient, named table_name) a 2-D
// tensor holding vocabulary rows [vocab_begin, vocab_begin + rows) of vocab_total (0: unsharded,
// vocab_begin must be 0); ids (T) i32. Returns the shape (T, C) of the per-token rows.
Shape check_lookup(const char* op, const Tensor& ids, const Tensor& table, const char* table_name,
                   int64_t vocab_begin, int64_t vocab_total) {
  expect_defined(table, op, table_name);
  expect_ndim(table, 2, op, table_name);
  const int64_t rows = table.size(0), c = table.size(1);
  if (vocab_total == 0)
    ENSURE(vocab_begin == 0, op, ": vocab_begin = ", vocab_begin,
           " but vocab_total = 0 (unsharded: the table is the whole vocabulary)");
  else
    ENSURE(vocab_total > 0 && vocab_begin >= 0 && vocab_begin + rows <= vocab_total, op, ": ",
           table_name, " rows hold ids [", vocab_begin, ", ", vocab_begin + rows,
           "), not a shard of a vocabulary of ", vocab_total, " ids");
  expect_defined(ids, op, "ids");
  expect_dtype(ids, DType::I32, op, "ids");
  expect_ndim(ids, 1, op, "ids");
  return {ids.size(0), c};
}

void check_embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out,
                             bool accumulate, int64_t vocab_begin, int64_t vocab_total,
                             IdCheck check) {
  const char* op = "embedding_forward";
  expect(out, table.dtype, check_lookup(op, ids, table, "table", vocab_begin, vocab_total), op,
         "out");
}

void check_embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                              int64_t vocab_begin, int64_t vocab_total, IdCheck check) {
  const char* op = "embedding_backward";
  const Shape rows = check_lookup(op, ids, dtable, "dtable", vocab_begin, vocab_total);
  expect_defined(dout, op, "dout");
  expect_shape(dout, rows, op, "dout");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_EMBEDDING_OPS)

}  // namespace engine::ops
