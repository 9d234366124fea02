// Embedding: out(t) = table(ids(t) - vocab_begin) (or +=), and its backward
// dtable(ids(t) - vocab_begin) += dout(t), over the ids the table's shard holds.
// The backward runs in parallel over column chunks; within a chunk tokens are added in order,
// so rows hit by duplicate ids are summed in token order whatever the thread count.
#include "ref/embedding.h"

#include <algorithm>

#include "ref/common.h"

namespace engine::ref {
namespace {

constexpr int64_t kCols = 256;

// The vocabulary size of a table of `rows` rows holding ids [begin, begin + rows); checks that
// the shard lies inside it (total = 0: unsharded, begin must be 0).
int64_t vocab_of(int64_t rows, int64_t begin, int64_t total, const char* op, const char* name) {
  if (total == 0) {
    ENSURE(begin == 0, op, ": vocab_begin = ", begin,
           " but vocab_total = 0 (unsharded: the table is the whole vocabulary)");
    return rows;
  }
  ENSURE(total > 0 && begin >= 0 && begin + rows <= total, op, ": ", name, " rows hold ids [",
         begin, ", ", begin + rows, "), not a shard of a vocabulary of ", total, " ids");
  return total;
}

// ids (T) i32 in [0, vocab); other (T, C). Returns T.
int64_t check_ids(const Tensor& ids, int64_t vocab, const char* op) {
  expect_cpu(ids, op, "ids");
  expect_dtype(ids, DType::I32, op, "ids");
  expect_ndim(ids, 1, op, "ids");
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < ids.size(0); ++t)
    ENSURE(id[t] >= 0 && id[t] < vocab, op, ": ids[", t, "] = ", id[t],
           " out of range [0, ", vocab, ") (token position ", t, ")");
  return ids.size(0);
}

// The checks of a lookup, in this order: the table (or its gradient) a 2-D CPU tensor holding
// vocabulary rows [vocab_begin, vocab_begin + rows) of vocab_total; the ids; `rows_out` the
// (T, C) tensor of per-token rows in the table's dtype. Returns {rows, C, T}.
struct Lookup {
  int64_t rows, c, t;
};
Lookup check_lookup(const char* op, const Tensor& ids, const Tensor& table, const char* table_name,
                    const Tensor& rows_out, const char* rows_name, int64_t vocab_begin, int64_t vocab_total) {
  expect_cpu(table, op, table_name);
  expect_ndim(table, 2, op, table_name);
  const int64_t rows = table.size(0), c = table.size(1);
  const int64_t vocab = vocab_of(rows, vocab_begin, vocab_total, op, table_name);
  const int64_t t = check_ids(ids, vocab, op);
  expect(rows_out, table.dtype, {t, c}, op, rows_name);
  return {rows, c, t};
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_begin, int64_t vocab_total) {
  const char* op = "embedding_forward";
  const Lookup l = check_lookup(op, ids, table, "table", out, "out", vocab_begin, vocab_total);
  const int64_t rows = l.rows, c = l.c, t = l.t;
  float_switch(table.dtype, op, "table", [&](auto tag) {
    using T = decltype(tag);
    const int32_t* id = ids.ptr<int32_t>();
    const T* tab = table.ptr<T>();
    T* po = out.ptr<T>();
#pragma omp parallel for schedule(static) if (t * c > (1 << 15))
    for (int64_t r = 0; r < t; ++r) {
      const int64_t local = id[r] - vocab_begin;
      T* dst = po + r * c;
      if (local < 0 || local >= rows) {  // another shard's id
        if (!accumulate) std::fill(dst, dst + c, T(0));
        continue;
      }
      const T* src = tab + local * c;
      for (int64_t j = 0; j < c; ++j) dst[j] = accumulate ? dst[j] + src[j] : src[j];
    }
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_begin, int64_t vocab_total) {
  const char* op = "embedding_backward";
  const Lookup l = check_lookup(op, ids, dtable, "dtable", dout, "dout", vocab_begin, vocab_total);
  const int64_t rows = l.rows, c = l.c, t = l.t;
  float_switch(dtable.dtype, op, "dtable", [&](auto tag) {
    using T = decltype(tag);
    const int32_t* id = ids.ptr<int32_t>();
    const T* pd = dout.ptr<T>();
    T* tab = dtable.ptr<T>();
#pragma omp parallel for schedule(static) if (t * c > (1 << 15))
    for (int64_t j0 = 0; j0 < c; j0 += kCols) {
      const int64_t n = std::min(kCols, c - j0);
      for (int64_t r = 0; r < t; ++r) {
        const int64_t local = id[r] - vocab_begin;
        if (local < 0 || local >= rows) continue;  // another shard's id
        T* dst = tab + local * c + j0;
        const T* src = pd + r * c + j0;
        for (int64_t j = 0; j < n; ++j) dst[j] += src[j];
      }
    }
  });
}

}  // namespace engine::ref
