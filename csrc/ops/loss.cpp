// Dispatch of ops/loss.h: CPU -> ref/loss, CUDA -> cuda/loss/cross_entropy (fused) and
// cuda/loss/cross_entropy_vocab_parallel (partial, combine, grad).
#include "ops/loss.h"

#include "ops/dispatch.h"
#include "ref/loss.h"

#ifdef ENGINE_CUDA
#include "cuda/loss/cross_entropy.cuh"
#include "cuda/loss/cross_entropy_vocab_parallel.cuh"
#endif

namespace engine::ops {

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale) {
  if (device_of("cross_entropy",
                {{"logits", logits}, {"labels", labels}, {"mask", mask}, {"losses", losses}}) ==
      Device::CPU)
    return ref::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale);
#ifdef ENGINE_CUDA
  return cuda::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale);
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
                           const Tensor& losses) {
  if (device_of("cross_entropy_combine",
                {{"partials", partials}, {"mask", mask}, {"lse", lse}, {"losses", losses}}) ==
      Device::CPU)
    return ref::cross_entropy_combine(partials, mask, lse, losses);
#ifdef ENGINE_CUDA
  return cuda::cross_entropy_combine(partials, mask, lse, losses);
#endif
  no_cuda_build("cross_entropy_combine");
}

void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale) {
  if (device_of("cross_entropy_grad",
                {{"logits", logits}, {"labels", labels}, {"mask", mask}, {"lse", lse}}) ==
      Device::CPU)
    return ref::cross_entropy_grad(logits, labels, mask, vocab_begin, lse, grad_scale);
#ifdef ENGINE_CUDA
  return cuda::cross_entropy_grad(logits, labels, mask, vocab_begin, lse, grad_scale);
#endif
  no_cuda_build("cross_entropy_grad");
}

}  // namespace engine::ops
