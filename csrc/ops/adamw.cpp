// Dispatch of ops/adamw.h: CPU -> ref/adamw, CUDA -> cuda/optim/adamw.
#include "ops/adamw.h"

#include "ops/dispatch.h"
#include "ref/adamw.h"

#ifdef ENGINE_CUDA
#include "cuda/optim/adamw.cuh"
#endif

namespace engine::ops {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p, const Tensor& compute_copy) {
  if (device_of("adamw_step", {{"param", param},
                               {"grad", grad},
                               {"exp_avg", exp_avg},
                               {"exp_avg_sq", exp_avg_sq},
                               {"compute_copy", compute_copy}}) == Device::CPU)
    return ref::adamw_step(param, grad, exp_avg, exp_avg_sq, p, compute_copy);
#ifdef ENGINE_CUDA
  return cuda::adamw_step(param, grad, exp_avg, exp_avg_sq, p, compute_copy);
#endif
  no_cuda_build("adamw_step");
}

}  // namespace engine::ops
