// Dispatch of ops/rope.h: CPU -> ref/rope, CUDA -> cuda/rope.
#include "ops/rope.h"

#include "ops/dispatch.h"
#include "ref/rope.h"

#ifdef ENGINE_CUDA
#include "cuda/rope/rope.cuh"
#endif

namespace engine::ops {

void rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads, float theta) {
  if (device_of("rope_forward", {{"x", x}, {"positions", positions}}) == Device::CPU)
    return ref::rope_forward(x, positions, rotated_heads, theta);
#ifdef ENGINE_CUDA
  return cuda::rope_forward(x, positions, rotated_heads, theta);
#endif
  no_cuda_build("rope_forward");
}

void rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads, float theta) {
  if (device_of("rope_backward", {{"dx", dx}, {"positions", positions}}) == Device::CPU)
    return ref::rope_backward(dx, positions, rotated_heads, theta);
#ifdef ENGINE_CUDA
  return cuda::rope_backward(dx, positions, rotated_heads, theta);
#endif
  no_cuda_build("rope_backward");
}

}  // namespace engine::ops
