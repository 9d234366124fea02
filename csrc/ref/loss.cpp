// CPU reference of ops/loss.h, in double.
// Cross-entropy per row t of logits (T, V), z = z_loss, eps = label_smoothing:
//   m = max_v x_v,  lse = m + log sum_v exp(x_v - m)        (stable for any logit magnitude)
//   losses(t) = lse - (1 - eps) x_label - eps sum_v x_v / V + z lse^2   (0 where mask(t) == 0)
//   with_grad: x_v <- grad_scale * ((1 + 2 z lse) exp(x_v - lse) - (1 - eps)[v == label] - eps / V)
// Labels are only checked (and only read) where the mask is set. Rows run in parallel.
// Vocabulary-parallel steps (contract in ops/loss.h), in double as well:
//   partial  per shard row: m = max_v x_v, s = sum_v exp(x_v - m), z = x_label if it is here,
//            (K = 4) sum_v x_v / vocab_total
//   combine  M = max_p m_p, S = sum_p s_p exp(m_p - M), lse = M + log S,
//            loss = lse - (1 - eps) sum_p z_p - eps sum_p mean_p + z lse^2
//   grad     x_v <- grad_scale * ((1 + 2 z lse) exp(x_v - lse) - (1 - eps)[v + B == label] - eps /
//   V)
// With one shard these are the very operations of the fused function, so they agree with it to
// the last bits of double rounding (the eps and z terms are added only when nonzero, so the
// plain loss keeps its exact form).
//
// Distillation (fused), per masked-in row, written from the definitions: log s_v = x_v / tau -
// lse(x / tau), log q_v = y_v / tau - lse(y / tau), D summed over v as defined (SoftCE, ForwardKL,
// ReverseKL), the label term on the untempered logits; gradient (s - q) / tau or
// s (log s - log q - D) / tau plus the label term's. The vocabulary-parallel steps use the shard
// statistics of ops/loss.h instead (maxima, sums of exponentials, the kind's weighted sum), so
// the tests that equate the two check the decomposition, not a copy of one formula.
// The shared preconditions ran before (ops/loss.cpp); the reference checks what is its own: the
// logits (and partials) in f32 or f64 (float_switch), and the labels' range at masked-in rows.
#include "ops/loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/common.h"

namespace engine::ref {

namespace {

// Checks labels (T) i32 in [0, vocab) where mask (T) u8 is set.
void check_labels(const Tensor& labels, const Tensor& mask, int64_t t, int64_t vocab,
                  const char* op) {
  const int32_t* lab = labels.ptr<int32_t>();
  const uint8_t* msk = mask.ptr<uint8_t>();
  for (int64_t r = 0; r < t; ++r)
    ENSURE(!msk[r] || (lab[r] >= 0 && lab[r] < vocab), op, ": labels[", r, "] = ", lab[r],
           " out of range [0, ", vocab, ") at a masked-in token (position ", r, ")");
}

// The loss of a row from its statistics (shared by the fused op and the combine step, so that
// one shard reproduces the fused bits): lse - (1 - eps) z - eps mean + zl lse^2.
double ce_row_loss(double lse, double z, double mean, double z_loss, double eps) {
  double l = eps != 0 ? lse - ((1 - eps) * z + eps * mean) : lse - z;
  if (z_loss != 0) l += z_loss * lse * lse;
  return l;
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale, float z_loss,
                   float label_smoothing, int64_t columns) {
  const char* op = "cross_entropy";
  const int64_t t = logits.size(0), ld = logits.size(1), v = columns > 0 ? columns : ld;
  check_labels(labels, mask, t, v, op);
  const int32_t* lab = labels.ptr<int32_t>();
  const uint8_t* msk = mask.ptr<uint8_t>();
  const double zl = z_loss, eps = label_smoothing;
  float_switch(logits.dtype, op, "logits", [&](auto tag) {
    using T = decltype(tag);
    T* x = logits.ptr<T>();
    T* loss = losses.ptr<T>();
#pragma omp parallel for schedule(static) if (t * v > (1 << 15))
    for (int64_t r = 0; r < t; ++r) {
      T* row = x + r * ld;
      if (!msk[r]) {
        loss[r] = T(0);
        if (with_grad) std::fill(row, row + v, T(0));
        continue;
      }
      double m = -INFINITY;
      for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(row[j]));
      double sum = 0, xsum = 0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
      if (eps != 0)
        for (int64_t j = 0; j < v; ++j) xsum += row[j];
      const double lse = m + std::log(sum);
      loss[r] =
          static_cast<T>(ce_row_loss(lse, row[lab[r]], xsum / static_cast<double>(v), zl, eps));
      if (with_grad) {
        const double a = 1 + 2 * zl * lse, c = 1 - eps, b = eps / static_cast<double>(v);
        for (int64_t j = 0; j < v; ++j) {
          const double p = a * std::exp(row[j] - lse) - (j == lab[r] ? c : 0.0) - b;
          row[j] = static_cast<T>(grad_scale * p);
        }
      }
    }
  });
}

void cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                           int64_t vocab_begin, int64_t vocab_total, const Tensor& stats) {
  const char* op = "cross_entropy_partial";
  const int64_t t = logits.size(0), v = logits.size(1);
  const int64_t k = stats.size(0);  // 3, or 4 with the mean logit
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
        for (int64_t i = 0; i < k; ++i) st[i * t + r] = T(0);
        continue;
      }
      const T* row = x + r * v;
      double m = -INFINITY;
      for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(row[j]));
      double sum = 0, xsum = 0;
      if (m != -INFINITY)  // else every term is 0 (an empty shard, or all -inf)
        for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
      const int64_t local = lab[r] - vocab_begin;
      st[r] = static_cast<T>(m);
      st[t + r] = static_cast<T>(sum);
      st[2 * t + r] = local >= 0 && local < v ? row[local] : T(0);
      if (k == 4) {
        for (int64_t j = 0; j < v; ++j) xsum += row[j];
        st[3 * t + r] = static_cast<T>(xsum / static_cast<double>(vocab_total));
      }
    }
  });
}

void cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                           const Tensor& losses, float z_loss, float label_smoothing) {
  const char* op = "cross_entropy_combine";
  const int64_t np = partials.size(0), k = partials.size(1), t = partials.size(2);
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
      for (int64_t p = 0; p < np; ++p) m = std::max(m, static_cast<double>(pp[p * k * t + r]));
      double sum = 0, z = 0, mean = 0;
      for (int64_t p = 0; p < np; ++p) {
        const double mp = pp[p * k * t + r];
        if (mp != -INFINITY) sum += pp[(p * k + 1) * t + r] * std::exp(mp - m);
        z += pp[(p * k + 2) * t + r];
        if (k == 4) mean += pp[(p * k + 3) * t + r];
      }
      const double l = m + std::log(sum);
      pl[r] = static_cast<T>(l);
      loss[r] = static_cast<T>(ce_row_loss(l, z, mean, z_loss, label_smoothing));
    }
  });
}

void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale, float z_loss,
                        float label_smoothing, int64_t vocab_total) {
  const char* op = "cross_entropy_grad";
  const int64_t t = logits.size(0), v = logits.size(1);
  const int32_t* lab = labels.ptr<int32_t>();
  const uint8_t* msk = mask.ptr<uint8_t>();
  const double zl = z_loss, eps = label_smoothing;
  const double b = eps != 0 ? eps / static_cast<double>(vocab_total) : 0.0, c = 1 - eps;
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
      const double l = pl[r], a = 1 + 2 * zl * l;
      const int64_t local = lab[r] - vocab_begin;
      for (int64_t j = 0; j < v; ++j) {
        const double p = a * std::exp(row[j] - l) - (j == local ? c : 0.0) - b;
        row[j] = static_cast<T>(grad_scale * p);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Distillation.

namespace {

bool uses_labels(const ops::DistillParams& p) { return p.label_weight != 0; }

// The optional output distill_losses was given (checked: ops/loss.cpp).
bool given(const Tensor& t) { return !(t.data == nullptr && t.ndim() == 0); }

}  // namespace

void distillation_loss(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, const ops::DistillParams& p, const Tensor& losses,
                       const Tensor& distill_losses, bool with_grad, float grad_scale) {
  const char* op = "distillation_loss";
  const int64_t t = logits.size(0), v = logits.size(1);
  const bool lab_on = uses_labels(p);
  if (lab_on) check_labels(labels, mask, t, v, op);
  const bool want_d = given(distill_losses);
  const int32_t* lab = lab_on ? labels.ptr<int32_t>() : nullptr;
  const uint8_t* msk = mask.ptr<uint8_t>();
  const double tau = p.temperature, wl = p.label_weight, wd = p.distill_weight, zl = p.z_loss;
  float_switch(logits.dtype, op, "logits", [&](auto tag) {
    using T = decltype(tag);
    T* x = logits.ptr<T>();
    const T* y = teacher.ptr<T>();
    T* loss = losses.ptr<T>();
    T* dloss = want_d ? distill_losses.ptr<T>() : nullptr;
#pragma omp parallel for schedule(static) if (t * v > (1 << 14))
    for (int64_t r = 0; r < t; ++r) {
      T* row = x + r * v;
      const T* yrow = y + r * v;
      if (!msk[r]) {
        loss[r] = T(0);
        if (dloss) dloss[r] = T(0);
        if (with_grad) std::fill(row, row + v, T(0));
        continue;
      }
      // log s and log q, the row's log-softmaxes at temperature tau.
      std::vector<double> ls(static_cast<size_t>(v)), lq(static_cast<size_t>(v));
      double ms = -INFINITY, mq = -INFINITY;
      for (int64_t j = 0; j < v; ++j) {
        ls[j] = row[j] / tau;
        lq[j] = yrow[j] / tau;
        ms = std::max(ms, ls[j]);
        mq = std::max(mq, lq[j]);
      }
      double ss = 0, sq = 0;
      for (int64_t j = 0; j < v; ++j) {
        ss += std::exp(ls[j] - ms);
        sq += std::exp(lq[j] - mq);
      }
      const double lse_s = ms + std::log(ss), lse_q = mq + std::log(sq);
      for (int64_t j = 0; j < v; ++j) {
        ls[j] -= lse_s;
        lq[j] -= lse_q;
      }
      double d = 0;
      for (int64_t j = 0; j < v; ++j) {
        switch (p.kind) {
          case ops::DistillKind::SoftCE:
            d -= std::exp(lq[j]) * ls[j];
            break;
          case ops::DistillKind::ForwardKL:
            d += std::exp(lq[j]) * (lq[j] - ls[j]);
            break;
          case ops::DistillKind::ReverseKL:
            d += std::exp(ls[j]) * (ls[j] - lq[j]);
            break;
        }
      }
      // The label term on the untempered logits.
      double lse = 0, c = 0;
      if (lab_on) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(row[j]));
        for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
        lse = m + std::log(sum);
        c = lse - row[lab[r]] + zl * lse * lse;
      }
      loss[r] = static_cast<T>(lab_on ? wl * c + wd * d : wd * d);
      if (dloss) dloss[r] = static_cast<T>(d);
      if (!with_grad) continue;
      const double a = 1 + 2 * zl * lse;
      for (int64_t j = 0; j < v; ++j) {
        const double s = std::exp(ls[j]);
        const double gd = p.kind == ops::DistillKind::ReverseKL ? s * (ls[j] - lq[j] - d) / tau
                                                                : (s - std::exp(lq[j])) / tau;
        double g = wd * gd;
        if (lab_on) g += wl * (a * std::exp(row[j] - lse) - (j == lab[r] ? 1.0 : 0.0));
        row[j] = static_cast<T>(grad_scale * g);
      }
    }
  });
}

void distillation_partial(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                          const Tensor& mask, int64_t vocab_begin, int64_t vocab_total,
                          const ops::DistillParams& p, const Tensor& stats) {
  const char* op = "distillation_partial";
  const int64_t t = logits.size(0), v = logits.size(1);
  const bool lab_on = uses_labels(p);
  if (lab_on) check_labels(labels, mask, t, vocab_total, op);
  const int32_t* lab = lab_on ? labels.ptr<int32_t>() : nullptr;
  const uint8_t* msk = mask.ptr<uint8_t>();
  const double tau = p.temperature;
  float_switch(logits.dtype, op, "logits", [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits.ptr<T>();
    const T* y = teacher.ptr<T>();
    T* st = stats.ptr<T>();
#pragma omp parallel for schedule(static) if (t * v > (1 << 14))
    for (int64_t r = 0; r < t; ++r) {
      double out[ops::kDistillStats] = {0, 0, 0, 0, 0, 0, 0};
      if (msk[r] && v == 0) {
        out[0] = out[4] = -INFINITY;
      } else if (msk[r]) {
        const T* row = x + r * v;
        const T* yrow = y + r * v;
        double mx = -INFINITY, my = -INFINITY;
        for (int64_t j = 0; j < v; ++j) {
          mx = std::max(mx, static_cast<double>(row[j]));
          my = std::max(my, static_cast<double>(yrow[j]));
        }
        double sx = 0, ss = 0, sq = 0, w = 0;
        for (int64_t j = 0; j < v; ++j) {
          const double dx = row[j] - mx, dy = yrow[j] - my;
          const double es = std::exp(dx / tau), eq = std::exp(dy / tau);
          if (lab_on) sx += std::exp(dx);
          ss += es;
          sq += eq;
          switch (p.kind) {
            case ops::DistillKind::SoftCE:
              w += eq * dx / tau;
              break;
            case ops::DistillKind::ForwardKL:
              w += eq * (dy - dx) / tau;
              break;
            case ops::DistillKind::ReverseKL:
              w += es * (dx - dy) / tau;
              break;
          }
        }
        const int64_t local = lab_on ? lab[r] - vocab_begin : -1;
        out[0] = mx;
        out[1] = sx;
        out[2] = local >= 0 && local < v ? static_cast<double>(row[local]) : 0.0;
        out[3] = ss;
        out[4] = my;
        out[5] = sq;
        out[6] = w;
      }
      for (int64_t i = 0; i < ops::kDistillStats; ++i) st[i * t + r] = static_cast<T>(out[i]);
    }
  });
}

void distillation_combine(const Tensor& partials, const Tensor& mask, const ops::DistillParams& p,
                          const Tensor& row_stats, const Tensor& losses,
                          const Tensor& distill_losses) {
  const char* op = "distillation_combine";
  const int64_t np = partials.size(0), k = ops::kDistillStats, t = partials.size(2);
  const bool want_d = given(distill_losses);
  const uint8_t* msk = mask.ptr<uint8_t>();
  const bool lab_on = uses_labels(p);
  const double tau = p.temperature, wl = p.label_weight, wd = p.distill_weight, zl = p.z_loss;
  float_switch(partials.dtype, op, "partials", [&](auto tag) {
    using T = decltype(tag);
    const T* pp = partials.ptr<T>();
    T* rs = row_stats.ptr<T>();
    T* loss = losses.ptr<T>();
    T* dloss = want_d ? distill_losses.ptr<T>() : nullptr;
    auto at = [&](int64_t q, int64_t i, int64_t r) -> double { return pp[(q * k + i) * t + r]; };
    for (int64_t r = 0; r < t; ++r) {
      double out[ops::kDistillRowStats] = {0, 0, 0, 0, 0, 0};
      double total = 0, d = 0;
      if (msk[r]) {
        double mx = -INFINITY, my = -INFINITY;
        for (int64_t q = 0; q < np; ++q) {
          mx = std::max(mx, at(q, 0, r));
          my = std::max(my, at(q, 4, r));
        }
        double sx = 0, ss = 0, sq = 0, w = 0, z = 0;
        for (int64_t q = 0; q < np; ++q) {
          z += at(q, 2, r);
          if (at(q, 0, r) == -INFINITY) continue;  // an empty shard
          const double dx = (at(q, 0, r) - mx) / tau, dy = (at(q, 4, r) - my) / tau;
          const double ex = std::exp(dx), ey = std::exp(dy);
          if (lab_on) sx += at(q, 1, r) * std::exp(at(q, 0, r) - mx);
          ss += at(q, 3, r) * ex;
          sq += at(q, 5, r) * ey;
          switch (p.kind) {
            case ops::DistillKind::SoftCE:
              w += ey * (at(q, 6, r) + dx * at(q, 5, r));
              break;
            case ops::DistillKind::ForwardKL:
              w += ey * (at(q, 6, r) + (dy - dx) * at(q, 5, r));
              break;
            case ops::DistillKind::ReverseKL:
              w += ex * (at(q, 6, r) + (dx - dy) * at(q, 3, r));
              break;
          }
        }
        const double lss = std::log(ss), lsq = std::log(sq);
        double c = 0;
        switch (p.kind) {
          case ops::DistillKind::SoftCE:
            d = lss - w / sq;
            break;
          case ops::DistillKind::ForwardKL:
            d = lss - lsq + w / sq;
            break;
          case ops::DistillKind::ReverseKL:
            c = w / ss;
            d = lsq - lss + c;
            break;
        }
        const double lsx = lab_on ? std::log(sx) : 0.0;
        total = wd * d;
        if (lab_on) {
          const double lse = mx + lsx;
          total = wl * ((mx - z) + lsx + zl * lse * lse) + total;
        }
        out[0] = mx;
        out[1] = lsx;
        out[2] = lss;
        out[3] = my;
        out[4] = lsq;
        out[5] = c;
      }
      for (int64_t i = 0; i < ops::kDistillRowStats; ++i) rs[i * t + r] = static_cast<T>(out[i]);
      loss[r] = static_cast<T>(total);
      if (dloss) dloss[r] = static_cast<T>(d);
    }
  });
}

void distillation_grad(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, int64_t vocab_begin, const ops::DistillParams& p,
                       const Tensor& row_stats, float grad_scale) {
  const char* op = "distillation_grad";
  const int64_t t = logits.size(0), v = logits.size(1);
  const bool lab_on = uses_labels(p);
  const int32_t* lab = lab_on ? labels.ptr<int32_t>() : nullptr;
  const uint8_t* msk = mask.ptr<uint8_t>();
  const double tau = p.temperature, wl = p.label_weight, wd = p.distill_weight, zl = p.z_loss;
  float_switch(logits.dtype, op, "logits", [&](auto tag) {
    using T = decltype(tag);
    T* x = logits.ptr<T>();
    const T* y = teacher.ptr<T>();
    const T* rs = row_stats.ptr<T>();
#pragma omp parallel for schedule(static) if (t * v > (1 << 15))
    for (int64_t r = 0; r < t; ++r) {
      T* row = x + r * v;
      const T* yrow = y + r * v;
      if (!msk[r]) {
        std::fill(row, row + v, T(0));
        continue;
      }
      const double mx = rs[r], lsx = rs[t + r], lss = rs[2 * t + r], my = rs[3 * t + r],
                   lsq = rs[4 * t + r], c = rs[5 * t + r];
      const double a = 1 + 2 * zl * (mx + lsx);
      const int64_t local = lab_on ? lab[r] - vocab_begin : -1;
      for (int64_t j = 0; j < v; ++j) {
        const double dx = row[j] - mx, dy = yrow[j] - my;
        const double s = std::exp(dx / tau - lss);
        const double gd = p.kind == ops::DistillKind::ReverseKL
                              ? s * ((dx - dy) / tau - c) / tau
                              : (s - std::exp(dy / tau - lsq)) / tau;
        double g = wd * gd;
        if (lab_on) g += wl * (a * std::exp(dx - lsx) - (j == local ? 1.0 : 0.0));
        row[j] = static_cast<T>(grad_scale * g);
      }
    }
  });
}

}  // namespace engine::ref
