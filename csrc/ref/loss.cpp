// Cross-entropy per row t of logits (T, V), in double:
//   m = max_v x_v,  lse = m + log sum_v exp(x_v - m)        (stable for any logit magnitude)
//   losses(t) = lse - x_label                               (0 where mask(t) == 0)
//   with_grad: x_v <- grad_scale * (exp(x_v - lse) - [v == label])   (zero row where masked)
// Labels are only checked (and only read) where the mask is set. Rows run in parallel.
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

}  // namespace engine::ref
