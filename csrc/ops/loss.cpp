// Dispatch of ops/loss.h: CPU -> ref/loss, CUDA -> cuda/loss once it exists.
#include "ops/loss.h"

#include "ops/dispatch.h"
#include "ref/loss.h"

namespace engine::ops {

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale) {
  if (device_of("cross_entropy",
                {{"logits", logits}, {"labels", labels}, {"mask", mask}, {"losses", losses}}) ==
      Device::CPU)
    return ref::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale);
#ifdef ENGINE_CUDA
  no_cuda_kernel("cross_entropy");
#endif
  no_cuda_build("cross_entropy");
}

}  // namespace engine::ops
