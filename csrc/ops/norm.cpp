// Dispatch of ops/norm.h: CPU -> ref/norm, CUDA -> cuda/norm.
#include "ops/norm.h"

#include "ops/dispatch.h"
#include "ref/norm.h"

#ifdef ENGINE_CUDA
#include "cuda/norm/norm.cuh"
#endif

namespace engine::ops {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (device_of("layernorm_forward", {{"x", x},
                                      {"weight", weight},
                                      {"bias", bias},
                                      {"y", y},
                                      {"mean", mean},
                                      {"rstd", rstd}}) == Device::CPU)
    return ref::layernorm_forward(x, weight, bias, eps, y, mean, rstd);
#ifdef ENGINE_CUDA
  return cuda::layernorm_forward(x, weight, bias, eps, y, mean, rstd);
#endif
  no_cuda_build("layernorm_forward");
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                        const Tensor& dbias) {
  if (device_of("layernorm_backward", {{"dy", dy},
                                       {"x", x},
                                       {"weight", weight},
                                       {"mean", mean},
                                       {"rstd", rstd},
                                       {"dx", dx},
                                       {"dweight", dweight},
                                       {"dbias", dbias}}) == Device::CPU)
    return ref::layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias);
#ifdef ENGINE_CUDA
  return cuda::layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias);
#endif
  no_cuda_build("layernorm_backward");
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                     const Tensor& rstd) {
  if (device_of("rmsnorm_forward", {{"x", x}, {"weight", weight}, {"y", y}, {"rstd", rstd}}) ==
      Device::CPU)
    return ref::rmsnorm_forward(x, weight, eps, y, rstd);
#ifdef ENGINE_CUDA
  return cuda::rmsnorm_forward(x, weight, eps, y, rstd);
#endif
  no_cuda_build("rmsnorm_forward");
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight) {
  if (device_of("rmsnorm_backward", {{"dy", dy},
                                     {"x", x},
                                     {"weight", weight},
                                     {"rstd", rstd},
                                     {"dx", dx},
                                     {"dweight", dweight}}) == Device::CPU)
    return ref::rmsnorm_backward(dy, x, weight, rstd, dx, dweight);
#ifdef ENGINE_CUDA
  return cuda::rmsnorm_backward(dy, x, weight, rstd, dx, dweight);
#endif
  no_cuda_build("rmsnorm_backward");
}

}  // namespace engine::ops
