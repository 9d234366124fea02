// Dispatch of ops/loss.h: CPU -> ref/loss, CUDA -> cuda/loss/cross_entropy.
#include "ops/loss.h"

#include "ops/dispatch.h"
#include "ref/loss.h"

#ifdef ENGINE_CUDA
#include "cuda/loss/cross_entropy.cuh"
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

}  // namespace engine::ops
