// Cross-entropy per row t of logits (T, V), in double:
//   m = max_v x_v,  lse = m + log sum_v exp(x_v - m)        (stable for any logit magnitude)
//   losses(t) = lse - x_label                               (0 where mask(t) == 0)
//   with_grad: x_v <- grad_scale * (exp(x_v - lse) - [v == label])   (zero row where masked)
// Labels are only checked (and only read) where the mask is set. Rows run in parallel.
// Vocabulary-parallel steps (contract in ops/loss.h), in double as well:
//   partial  per shard row: m = max_v x_v, s = sum_v exp(x_v - m), z = x_label if it is here
//   combine  M = max_p m_p, S = sum_p s_p exp(m_p - M), lse = M + log S, loss = lse - sum_p z_p
//   grad     x_v <- grad_scale * (exp(x_v - lse) - [v + vocab_begin == label])
// With one shard these are the very operations of the fused function, so they agree with it to
// the last bits of double rounding.
#include "ref/loss.h"

#include <algorithm>
#include <cmath>

#include "ref/common.h"

namespace engine::ref {

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale) {
  const char* op = "cross_entropy";
  expect_cpu(logits, op, "logits");
  expect_ndim(logits, 2, op, "logits");
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(v > 0, op, ": logits has shape ", logits.shape.str(), ", the vocabulary is empty");
  expect(labels, DType::I32, {t}, op, "labels");
  expect(mask, DType::U8, {t}, op, "mask");
  expect(losses, logits.dtype, {t}, op, "losses");
  const int32_t* lab = labels.ptr<int32_t>();
  const uint8_t* msk = mask.ptr<uint8_t>();
  for (int64_t r = 0; r < t; ++r)
    ENSURE(!msk[r] || (lab[r] >= 0 && lab[r] < v), op, ": labels[", r, "] = ", lab[r],
           " out of range [0, ", v, ") at a masked-in token (position ", r, ")");
  float_switch(logits.dtype, op, "logits", [&](auto tag) {
    using T = decltype(tag);
    T* x = logits.ptr<T>();
    T* loss = losses.ptr<T>();
#pragma omp parallel for schedule(static) if (t * v > (1 << 15))
    for (int64_t r = 0; r < t; ++r) {
      T* row = x + r * v;
      if (!msk[r]) {
        loss[r] = T(0);
        if (with_grad) std::fill(row, row + v, T(0));
        continue;
      }
      double m = -INFINITY;
      for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(row[j]));
      double sum = 0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
      const double lse = m + std::log(sum);
      loss[r] = static_cast<T>(lse - row[lab[r]]);
      if (with_grad) {
        for (int64_t j = 0; j < v; ++j) {
          const double p = std::exp(row[j] - lse) - (j == lab[r] ? 1.0 : 0.0);
          row[j] = static_cast<T>(grad_scale * p);
        }
      }
    }
  });
}

namespace {

// Checks labels (T) i32 in [0, vocab) where mask (T) u8 is set.
void check_labels(const Tensor& labels, const Tensor& mask, int64_t t, int64_t vocab,
                  const char* op) {
  expect(labels, DType::I32, {t}, op, "labels");
  expect(mask, DType::U8, {t}, op, "mask");
  const int32_t* lab = labels.ptr<int32_t>();
  const uint8_t* msk = mask.ptr<uint8_t>();
  for (int64_t r = 0; r < t; ++r)
    ENSURE(!msk[r] || (lab[r] >= 0 && lab[r] < vocab), op, ": labels[", r, "] = ", lab[r],
           " out of range [0, ", vocab, ") at a masked-in token (position ", r, ")");
}

}  // namespace

void cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                           int64_t vocab_begin, int64_t vocab_total, const Tensor& stats) {
  const char* op = "cross_entropy_partial";
  expect_cpu(logits, op, "logits");
  expect_ndim(logits, 2, op, "logits");
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(vocab_total > 0 && vocab_begin >= 0 && vocab_begin + v <= vocab_total, op,
         ": logits hold columns [", vocab_begin, ", ", vocab_begin + v,
         "), not a shard of a vocabulary of ", vocab_total);
  expect(stats, logits.dtype, {3, t}, op, "stats");
  check_labels(labels, mask, t, vocab_total, op);
  const int32_t* lab = labels.ptr<int32_t>();
  const uint8_t* msk = mask.ptr<uint8_t>();
  float_switch(logits.dtype, op, "logits", [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits.ptr<T>();
    T* st = stats.ptr<T>();
#pragma omp parallel for schedule(static) if (t * v > (1 << 15))
    for (int64_t r = 0; r < t; ++r) {
      if (!msk[r]) {
        st[r] = st[t + r] = st[2 * t + r] = T(0);
        continue;
      }
      const T* row = x + r * v;
      double m = -INFINITY;
      for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(row[j]));
      double sum = 0;
      if (m != -INFINITY)  // else every term is 0 (an empty shard, or all -inf)
        for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
      const int64_t local = lab[r] - vocab_begin;
      st[r] = static_cast<T>(m);
      st[t + r] = static_cast<T>(sum);
      st[2 * t + r] = local >= 0 && local < v ? row[local] : T(0);
    }
  });
}

void cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                           const Tensor& losses) {
  const char* op = "cross_entropy_combine";
  expect_cpu(partials, op, "partials");
  ENSURE(partials.ndim() == 3 && partials.size(1) == 3, op,
         ": partials must be (P, 3, T), got shape ", partials.shape.str());
  const int64_t np = partials.size(0), t = partials.size(2);
  ENSURE(np > 0, op, ": partials hold no shard (P = 0)");
  expect(mask, DType::U8, {t}, op, "mask");
  expect(lse, partials.dtype, {t}, op, "lse");
  expect(losses, partials.dtype, {t}, op, "losses");
  const uint8_t* msk = mask.ptr<uint8_t>();
  float_switch(partials.dtype, op, "partials", [&](auto tag) {
    using T = decltype(tag);
    const T* pp = partials.ptr<T>();
    T* pl = lse.ptr<T>();
    T* loss = losses.ptr<T>();
    for (int64_t r = 0; r < t; ++r) {
      if (!msk[r]) {
        pl[r] = loss[r] = T(0);
        continue;
      }
      double m = -INFINITY;
      for (int64_t p = 0; p < np; ++p) m = std::max(m, static_cast<double>(pp[p * 3 * t + r]));
      double sum = 0, z = 0;
      for (int64_t p = 0; p < np; ++p) {
        const double mp = pp[p * 3 * t + r];
        if (mp != -INFINITY) sum += pp[(p * 3 + 1) * t + r] * std::exp(mp - m);
        z += pp[(p * 3 + 2) * t + r];
      }
      const double l = m + std::log(sum);
      pl[r] = static_cast<T>(l);
      loss[r] = static_cast<T>(l - z);
    }
  });
}

void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale) {
  const char* op = "cross_entropy_grad";
  expect_cpu(logits, op, "logits");
  expect_ndim(logits, 2, op, "logits");
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(vocab_begin >= 0, op, ": vocab_begin = ", vocab_begin, " is negative");
  expect(labels, DType::I32, {t}, op, "labels");
  expect(mask, DType::U8, {t}, op, "mask");
  expect(lse, logits.dtype, {t}, op, "lse");
  const int32_t* lab = labels.ptr<int32_t>();
  const uint8_t* msk = mask.ptr<uint8_t>();
  float_switch(logits.dtype, op, "logits", [&](auto tag) {
    using T = decltype(tag);
    T* x = logits.ptr<T>();
    const T* pl = lse.ptr<T>();
#pragma omp parallel for schedule(static) if (t * v > (1 << 15))
    for (int64_t r = 0; r < t; ++r) {
      T* row = x + r * v;
      if (!msk[r]) {
        std::fill(row, row + v, T(0));
        continue;
      }
      const double l = pl[r];
      const int64_t local = lab[r] - vocab_begin;
      for (int64_t j = 0; j < v; ++j) {
        const double p = std::exp(row[j] - l) - (j == local ? 1.0 : 0.0);
        row[j] = static_cast<T>(grad_scale * p);
      }
    }
  });
}

}  // namespace engine::ref
