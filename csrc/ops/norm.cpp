// Dispatch of ops/norm.h (plain and residual forms): CPU -> ref/norm, CUDA -> cuda/norm.
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

void layernorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, float eps, const Tensor& sum, const Tensor& y,
                                const Tensor& mean, const Tensor& rstd) {
  if (device_of("layernorm_residual_forward", {{"x", x},
                                               {"residual", residual},
                                               {"weight", weight},
                                               {"bias", bias},
                                               {"sum", sum},
                                               {"y", y},
                                               {"mean", mean},
                                               {"rstd", rstd}}) == Device::CPU)
    return ref::layernorm_residual_forward(x, residual, weight, bias, eps, sum, y, mean, rstd);
#ifdef ENGINE_CUDA
  return cuda::layernorm_residual_forward(x, residual, weight, bias, eps, sum, y, mean, rstd);
#endif
  no_cuda_build("layernorm_residual_forward");
}

void layernorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                                 const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dx_colsum) {
  if (device_of("layernorm_residual_backward", {{"dy", dy},
                                                {"x", x},
                                                {"weight", weight},
                                                {"mean", mean},
                                                {"rstd", rstd},
                                                {"dresidual", dresidual},
                                                {"dx", dx},
                                                {"dweight", dweight},
                                                {"dbias", dbias},
                                                {"dx_colsum", dx_colsum}}) == Device::CPU)
    return ref::layernorm_residual_backward(dy, x, weight, mean, rstd, dresidual, dx, dweight,
                                            dbias, dx_colsum);
#ifdef ENGINE_CUDA
  return cuda::layernorm_residual_backward(dy, x, weight, mean, rstd, dresidual, dx, dweight,
                                           dbias, dx_colsum);
#endif
  no_cuda_build("layernorm_residual_backward");
}

void rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              float eps, const Tensor& sum, const Tensor& y, const Tensor& rstd) {
  if (device_of("rmsnorm_residual_forward", {{"x", x},
                                             {"residual", residual},
                                             {"weight", weight},
                                             {"sum", sum},
                                             {"y", y},
                                             {"rstd", rstd}}) == Device::CPU)
    return ref::rmsnorm_residual_forward(x, residual, weight, eps, sum, y, rstd);
#ifdef ENGINE_CUDA
  return cuda::rmsnorm_residual_forward(x, residual, weight, eps, sum, y, rstd);
#endif
  no_cuda_build("rmsnorm_residual_forward");
}

void rmsnorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& rstd, const Tensor& dresidual, const Tensor& dx,
                               const Tensor& dweight, const Tensor& dx_colsum) {
  if (device_of("rmsnorm_residual_backward", {{"dy", dy},
                                              {"x", x},
                                              {"weight", weight},
                                              {"rstd", rstd},
                                              {"dresidual", dresidual},
                                              {"dx", dx},
                                              {"dweight", dweight},
                                              {"dx_colsum", dx_colsum}}) == Device::CPU)
    return ref::rmsnorm_residual_backward(dy, x, weight, rstd, dresidual, dx, dweight, dx_colsum);
#ifdef ENGINE_CUDA
  return cuda::rmsnorm_residual_backward(dy, x, weight, rstd, dresidual, dx, dweight, dx_colsum);
#endif
  no_cuda_build("rmsnorm_residual_backward");
}

}  // namespace engine::ops
