// Embedding: out(t) = table(ids(t) - vocab_begin) (or +=), and its backward
// dtable(ids(t) - vocab_begin) += dout(t), over the ids the table's shard holds.
// The backward runs in parallel over column chunks; within a chunk tokens are added in order,
// so rows hit by duplicate ids are summed in token order whatever the thread count.
// The shared checks ran before (ops/embedding.cpp); the reference checks every id before it
// writes anything (whatever the IdCheck) and takes an f32 or f64 table.
#include "ops/embedding.h"

#include <algorithm>

#include "ref/common.h"

namespace engine::ref {
namespace {

constexpr int64_t kCols = 256;

// ids (T) i32 (checked) in [0, vocab), vocab = vocab_total, or the table's rows when 0.
void check_ids(const Tensor& ids, int64_t rows, int64_t vocab_total, const char* op) {
  const int64_t vocab = vocab_total == 0 ? rows : vocab_total;
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < ids.size(0); ++t)
    ENSURE(id[t] >= 0 && id[t] < vocab, op, ": ids[", t, "] = ", id[t],
           " out of range [0, ", vocab, ") (token position ", t, ")");
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_begin, int64_t vocab_total, ops::IdCheck check) {
  const char* op = "embedding_forward";
  const int64_t rows = table.size(0), c = table.size(1), t = ids.size(0);
  check_ids(ids, rows, vocab_total, op);
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
                        int64_t vocab_begin, int64_t vocab_total, ops::IdCheck check) {
  const char* op = "embedding_backward";
  const int64_t rows = dtable.size(0), c = dtable.size(1), t = ids.size(0);
  check_ids(ids, rows, vocab_total, op);
  expect_dtype(dout, dtable.dtype, op, "dout");
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
