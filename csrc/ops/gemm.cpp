// Dispatch of ops/gemm.h: CPU -> ref/gemm, CUDA -> cuda/gemm (cuBLASLt, column sums).
#include "ops/gemm.h"

#include "ops/dispatch.h"
#include "ref/gemm.h"

#ifdef ENGINE_CUDA
#include "cuda/gemm/gemm.cuh"
#endif

namespace engine::ops {

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            const MatmulOptions& options) {
  if (device_of("matmul", {{"a", a}, {"b", b}, {"c", c}, {"bias", options.bias}}) == Device::CPU)
    return ref::matmul(a, trans_a, b, trans_b, c, options);
#ifdef ENGINE_CUDA
  return cuda::matmul(a, trans_a, b, trans_b, c, options);
#endif
  no_cuda_build("matmul");
}

void sum_rows(const Tensor& x, const Tensor& out, float beta) {
  if (device_of("sum_rows", {{"x", x}, {"out", out}}) == Device::CPU)
    return ref::sum_rows(x, out, beta);
#ifdef ENGINE_CUDA
  return cuda::sum_rows(x, out, beta);
#endif
  no_cuda_build("sum_rows");
}

}  // namespace engine::ops
