// Dispatch of ops/activation.h: CPU -> ref/activation, CUDA -> cuda/activation.
#include "ops/activation.h"

#include "ops/dispatch.h"
#include "ref/activation.h"

#ifdef ENGINE_CUDA
#include "cuda/activation/activation.cuh"
#endif

namespace engine::ops {

void gelu_forward(const Tensor& x, const Tensor& y) {
  if (device_of("gelu_forward", {{"x", x}, {"y", y}}) == Device::CPU)
    return ref::gelu_forward(x, y);
#ifdef ENGINE_CUDA
  return cuda::gelu_forward(x, y);
#endif
  no_cuda_build("gelu_forward");
}

void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  if (device_of("gelu_backward", {{"dy", dy}, {"x", x}, {"dx", dx}}) == Device::CPU)
    return ref::gelu_backward(dy, x, dx);
#ifdef ENGINE_CUDA
  return cuda::gelu_backward(dy, x, dx);
#endif
  no_cuda_build("gelu_backward");
}

void swiglu_forward(const Tensor& gate_up, const Tensor& y) {
  if (device_of("swiglu_forward", {{"gate_up", gate_up}, {"y", y}}) == Device::CPU)
    return ref::swiglu_forward(gate_up, y);
#ifdef ENGINE_CUDA
  return cuda::swiglu_forward(gate_up, y);
#endif
  no_cuda_build("swiglu_forward");
}

void swiglu_backward(const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up) {
  if (device_of("swiglu_backward", {{"dy", dy}, {"gate_up", gate_up}, {"dgate_up", dgate_up}}) ==
      Device::CPU)
    return ref::swiglu_backward(dy, gate_up, dgate_up);
#ifdef ENGINE_CUDA
  return cuda::swiglu_backward(dy, gate_up, dgate_up);
#endif
  no_cuda_build("swiglu_backward");
}

}  // namespace engine::ops
