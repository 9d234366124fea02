// The loss ops (ops/loss.h): the preconditions both backends share, and the dispatch. The CPU
// reference (csrc/ref/loss.cpp) and the CUDA kernels (cuda/loss/) check only what is theirs: the
// dtypes of the logits (and of the partials) they take, size limits, alignment, and the labels'
// range at masked-in rows (the reference reads them; the kernels flag them and raise after).
#include "ops/loss.h"

#include <cmath>

namespace engine::ops {

const char* distill_kind_name(DistillKind kind) {
  switch (kind) {
    case DistillKind::SoftCE:
      return "soft_ce";
    case DistillKind::ForwardKL:
      return "forward_kl";
    case DistillKind::ReverseKL:
      return "reverse_kl";
  }
  return "?";
}

namespace {

// The stat dtype (stats, lse, row statistics, losses): f64 for f64 logits, else f32.
DType stat_dtype(const Tensor& logits) {
  return logits.dtype == DType::F64 ? DType::F64 : DType::F32;
}

bool undefined(const Tensor& t) { return t.data == nullptr && t.ndim() == 0; }

void check_loss_coefficients(float z_loss, float label_smoothing, const char* op) {
  ENSURE(std::isfinite(z_loss), op, ": z_loss = ", z_loss, " is not finite");
  ENSURE(label_smoothing >= 0.f && label_smoothing <= 1.f, op,
         ": label_smoothing = ", label_smoothing, " outside [0, 1]");
}

void check_distill_params(const DistillParams& p, const char* op) {
  ENSURE(p.kind == DistillKind::SoftCE || p.kind == DistillKind::ForwardKL ||
             p.kind == DistillKind::ReverseKL,
         op, ": unknown distillation kind ", static_cast<int>(p.kind));
  ENSURE(std::isfinite(p.temperature) && p.temperature > 0.f, op, ": temperature = ", p.temperature,
         ", expected a finite value > 0");
  ENSURE(std::isfinite(p.label_weight) && std::isfinite(p.distill_weight), op,
         ": weights must be finite, got label_weight = ", p.label_weight,
         ", distill_weight = ", p.distill_weight);
  ENSURE(std::isfinite(p.z_loss), op, ": z_loss = ", p.z_loss, " is not finite");
}

// logits 2-D; dims names them in the message: "(T, V)" or, for a shard, "(T, Vl)".
void check_logits(const Tensor& logits, const char* dims, const char* op) {
  expect_defined(logits, op, "logits");
  ENSURE(logits.ndim() == 2, op, ": logits must be 2-D ", dims, ", got shape ",
         logits.shape.str());
}

// A shard's columns [vocab_begin, vocab_begin + v) inside a vocabulary of vocab_total.
void check_shard(int64_t vocab_begin, int64_t v, int64_t vocab_total, const char* op) {
  ENSURE(vocab_total > 0 && vocab_begin >= 0 && vocab_begin + v <= vocab_total, op,
         ": logits hold columns [", vocab_begin, ", ", vocab_begin + v,
         "), not a shard of a vocabulary of ", vocab_total);
}

// logits and teacher: 2-D, the same dtype and shape.
void check_pair(const Tensor& logits, const Tensor& teacher, const char* dims, const char* op) {
  check_logits(logits, dims, op);
  expect(teacher, logits.dtype, logits.shape, op, "teacher");
}

// With a label term the labels must be given, (T) i32; without one they are never read.
void check_distill_labels(const Tensor& labels, const DistillParams& p, int64_t t,
                          const char* op) {
  if (p.label_weight == 0) return;
  ENSURE(!undefined(labels), op, ": labels are undefined, but label_weight = ", p.label_weight,
         " needs them");
  expect(labels, DType::I32, {t}, op, "labels");
}

// The optional output: undefined, or (T) in dtype.
void check_optional(const Tensor& t, DType dtype, int64_t rows, const char* op, const char* name) {
  if (!undefined(t)) expect(t, dtype, {rows}, op, name);
}

void check_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                         const Tensor& losses, bool with_grad, float grad_scale, float z_loss,
                         float label_smoothing, int64_t columns) {
  const char* op = "cross_entropy";
  check_logits(logits, "(T, V)", op);
  check_loss_coefficients(z_loss, label_smoothing, op);
  ENSURE(columns >= 0 && columns <= logits.size(1), op, ": columns = ", columns,
         " outside [0, ", logits.size(1), "] (the logits' width)");
  const int64_t t = logits.size(0), v = columns > 0 ? columns : logits.size(1);
  ENSURE(v > 0, op, ": logits has shape ", logits.shape.str(), ", the vocabulary is empty");
  expect(labels, DType::I32, {t}, op, "labels");
  expect(mask, DType::U8, {t}, op, "mask");
  expect(losses, stat_dtype(logits), {t}, op, "losses");
}

void check_cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                                 int64_t vocab_begin, int64_t vocab_total, const Tensor& stats) {
  const char* op = "cross_entropy_partial";
  check_logits(logits, "(T, Vl)", op);
  const int64_t t = logits.size(0), v = logits.size(1);
  check_shard(vocab_begin, v, vocab_total, op);
  expect(labels, DType::I32, {t}, op, "labels");
  expect(mask, DType::U8, {t}, op, "mask");
  const int64_t k = stats.ndim() == 2 && stats.size(0) == 4 ? 4 : 3;
  expect(stats, stat_dtype(logits), {k, t}, op, "stats");
}

void check_cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                                 const Tensor& losses, float z_loss, float label_smoothing) {
  const char* op = "cross_entropy_combine";
  expect_defined(partials, op, "partials");
  check_loss_coefficients(z_loss, label_smoothing, op);
  ENSURE(partials.ndim() == 3 && (partials.size(1) == 3 || partials.size(1) == 4), op,
         ": partials must be (P, 3, T) or (P, 4, T), got shape ", partials.shape.str());
  const int64_t np = partials.size(0), k = partials.size(1), t = partials.size(2);
  ENSURE(np > 0, op, ": partials hold no shard (P = 0)");
  ENSURE(label_smoothing == 0 || k == 4, op, ": label smoothing needs (P, 4, T) partials (the ",
         "mean logit), got shape ", partials.shape.str());
  expect(mask, DType::U8, {t}, op, "mask");
  expect(lse, partials.dtype, {t}, op, "lse");
  expect(losses, partials.dtype, {t}, op, "losses");
}

void check_cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                              int64_t vocab_begin, const Tensor& lse, float grad_scale,
                              float z_loss, float label_smoothing, int64_t vocab_total) {
  const char* op = "cross_entropy_grad";
  check_logits(logits, "(T, Vl)", op);
  check_loss_coefficients(z_loss, label_smoothing, op);
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(vocab_begin >= 0, op, ": vocab_begin = ", vocab_begin, " is negative");
  ENSURE(label_smoothing == 0 || vocab_total >= vocab_begin + v, op,
         ": label smoothing needs the vocabulary size, got vocab_total = ", vocab_total,
         " for columns [", vocab_begin, ", ", vocab_begin + v, ")");
  expect(labels, DType::I32, {t}, op, "labels");
  expect(mask, DType::U8, {t}, op, "mask");
  expect(lse, stat_dtype(logits), {t}, op, "lse");
}

void check_distillation_loss(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                             const Tensor& mask, const DistillParams& p, const Tensor& losses,
                             const Tensor& distill_losses, bool with_grad, float grad_scale) {
  const char* op = "distillation_loss";
  check_pair(logits, teacher, "(T, V)", op);
  check_distill_params(p, op);
  const int64_t t = logits.size(0), v = logits.size(1);
  ENSURE(v > 0, op, ": logits has shape ", logits.shape.str(), ", the vocabulary is empty");
  check_distill_labels(labels, p, t, op);
  expect(mask, DType::U8, {t}, op, "mask");
  expect(losses, stat_dtype(logits), {t}, op, "losses");
  check_optional(distill_losses, stat_dtype(logits), t, op, "distill_losses");
}

void check_distillation_partial(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                                const Tensor& mask, int64_t vocab_begin, int64_t vocab_total,
                                const DistillParams& p, const Tensor& stats) {
  const char* op = "distillation_partial";
  check_pair(logits, teacher, "(T, Vl)", op);
  check_distill_params(p, op);
  const int64_t t = logits.size(0), v = logits.size(1);
  check_shard(vocab_begin, v, vocab_total, op);
  expect(stats, stat_dtype(logits), {kDistillStats, t}, op, "stats");
  check_distill_labels(labels, p, t, op);
  expect(mask, DType::U8, {t}, op, "mask");
}

void check_distillation_combine(const Tensor& partials, const Tensor& mask,
                                const DistillParams& p, const Tensor& row_stats,
                                const Tensor& losses, const Tensor& distill_losses) {
  const char* op = "distillation_combine";
  expect_defined(partials, op, "partials");
  check_distill_params(p, op);
  ENSURE(partials.ndim() == 3 && partials.size(1) == kDistillStats, op, ": partials must be (P, ",
         kDistillStats, ", T), got shape ", partials.shape.str());
  const int64_t np = partials.size(0), t = partials.size(2);
  ENSURE(np > 0, op, ": partials hold no shard (P = 0)");
  expect(mask, DType::U8, {t}, op, "mask");
  expect(row_stats, partials.dtype, {kDistillRowStats, t}, op, "row_stats");
  expect(losses, partials.dtype, {t}, op, "losses");
  check_optional(distill_losses, partials.dtype, t, op, "distill_losses");
}

void check_distillation_grad(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                             const Tensor& mask, int64_t vocab_begin, const DistillParams& p,
                             const Tensor& row_stats, float grad_scale) {
  const char* op = "distillation_grad";
  check_pair(logits, teacher, "(T, Vl)", op);
  check_distill_params(p, op);
  const int64_t t = logits.size(0);
  ENSURE(vocab_begin >= 0, op, ": vocab_begin = ", vocab_begin, " is negative");
  check_distill_labels(labels, p, t, op);
  expect(mask, DType::U8, {t}, op, "mask");
  expect(row_stats, stat_dtype(logits), {kDistillRowStats, t}, op, "row_stats");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_LOSS_OPS)

}  // namespace engine::ops
