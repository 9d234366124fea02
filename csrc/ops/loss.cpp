// Dispatch of ops/loss.h: CPU -> ref/loss, CUDA -> cuda/loss/cross_entropy (fused),
// cuda/loss/cross_entropy_vocab_parallel (partial, combine, grad), cuda/loss/distillation (fused)
// and cuda/loss/distillation_vocab_parallel (partial, combine, grad). Also the argument checks
// both backends share.
#include "ops/loss.h"

#include <cmath>

#include "ops/dispatch.h"
#include "ref/loss.h"

#ifdef ENGINE_CUDA
#include "cuda/loss/cross_entropy.cuh"
#include "cuda/loss/cross_entropy_vocab_parallel.cuh"
#include "cuda/loss/distillation.cuh"
#include "cuda/loss/distillation_vocab_parallel.cuh"
#endif

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

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale, float z_loss,
                   float label_smoothing, int64_t columns) {
  if (device_of("cross_entropy",
                {{"logits", logits}, {"labels", labels}, {"mask", mask}, {"losses", losses}}) ==
      Device::CPU)
    return ref::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale, z_loss,
                              label_smoothing, columns);
#ifdef ENGINE_CUDA
  return cuda::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale,
                             cuda::CrossEntropyChoice{}, z_loss, label_smoothing, columns);
#endif
  no_cuda_build("cross_entropy");
}

void cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                           int64_t vocab_begin, int64_t vocab_total, const Tensor& stats) {
  if (device_of("cross_entropy_partial",
                {{"logits", logits}, {"labels", labels}, {"mask", mask}, {"stats", stats}}) ==
      Device::CPU)
    return ref::cross_entropy_partial(logits, labels, mask, vocab_begin, vocab_total, stats);
#ifdef ENGINE_CUDA
  return cuda::cross_entropy_partial(logits, labels, mask, vocab_begin, vocab_total, stats);
#endif
  no_cuda_build("cross_entropy_partial");
}

void cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                           const Tensor& losses, float z_loss, float label_smoothing) {
  if (device_of("cross_entropy_combine",
                {{"partials", partials}, {"mask", mask}, {"lse", lse}, {"losses", losses}}) ==
      Device::CPU)
    return ref::cross_entropy_combine(partials, mask, lse, losses, z_loss, label_smoothing);
#ifdef ENGINE_CUDA
  return cuda::cross_entropy_combine(partials, mask, lse, losses, z_loss, label_smoothing);
#endif
  no_cuda_build("cross_entropy_combine");
}

void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale, float z_loss,
                        float label_smoothing, int64_t vocab_total) {
  if (device_of("cross_entropy_grad",
                {{"logits", logits}, {"labels", labels}, {"mask", mask}, {"lse", lse}}) ==
      Device::CPU)
    return ref::cross_entropy_grad(logits, labels, mask, vocab_begin, lse, grad_scale, z_loss,
                                   label_smoothing, vocab_total);
#ifdef ENGINE_CUDA
  return cuda::cross_entropy_grad(logits, labels, mask, vocab_begin, lse, grad_scale, z_loss,
                                  label_smoothing, vocab_total);
#endif
  no_cuda_build("cross_entropy_grad");
}

void distillation_loss(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, const DistillParams& p, const Tensor& losses,
                       const Tensor& distill_losses, bool with_grad, float grad_scale) {
  if (device_of("distillation_loss", {{"logits", logits},
                                      {"teacher", teacher},
                                      {"labels", labels},
                                      {"mask", mask},
                                      {"losses", losses},
                                      {"distill_losses", distill_losses}}) == Device::CPU)
    return ref::distillation_loss(logits, teacher, labels, mask, p, losses, distill_losses,
                                  with_grad, grad_scale);
#ifdef ENGINE_CUDA
  return cuda::distillation_loss(logits, teacher, labels, mask, p, losses, distill_losses,
                                 with_grad, grad_scale);
#endif
  no_cuda_build("distillation_loss");
}

void distillation_partial(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                          const Tensor& mask, int64_t vocab_begin, int64_t vocab_total,
                          const DistillParams& p, const Tensor& stats) {
  if (device_of("distillation_partial", {{"logits", logits},
                                         {"teacher", teacher},
                                         {"labels", labels},
                                         {"mask", mask},
                                         {"stats", stats}}) == Device::CPU)
    return ref::distillation_partial(logits, teacher, labels, mask, vocab_begin, vocab_total, p,
                                     stats);
#ifdef ENGINE_CUDA
  return cuda::distillation_partial(logits, teacher, labels, mask, vocab_begin, vocab_total, p,
                                    stats);
#endif
  no_cuda_build("distillation_partial");
}

void distillation_combine(const Tensor& partials, const Tensor& mask, const DistillParams& p,
                          const Tensor& row_stats, const Tensor& losses,
                          const Tensor& distill_losses) {
  if (device_of("distillation_combine", {{"partials", partials},
                                         {"mask", mask},
                                         {"row_stats", row_stats},
                                         {"losses", losses},
                                         {"distill_losses", distill_losses}}) == Device::CPU)
    return ref::distillation_combine(partials, mask, p, row_stats, losses, distill_losses);
#ifdef ENGINE_CUDA
  return cuda::distillation_combine(partials, mask, p, row_stats, losses, distill_losses);
#endif
  no_cuda_build("distillation_combine");
}

void distillation_grad(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, int64_t vocab_begin, const DistillParams& p,
                       const Tensor& row_stats, float grad_scale) {
  if (device_of("distillation_grad", {{"logits", logits},
                                      {"teacher", teacher},
                                      {"labels", labels},
                                      {"mask", mask},
                                      {"row_stats", row_stats}}) == Device::CPU)
    return ref::distillation_grad(logits, teacher, labels, mask, vocab_begin, p, row_stats,
                                  grad_scale);
#ifdef ENGINE_CUDA
  return cuda::distillation_grad(logits, teacher, labels, mask, vocab_begin, p, row_stats,
                                 grad_scale);
#endif
  no_cuda_build("distillation_grad");
}

}  // namespace engine::ops
