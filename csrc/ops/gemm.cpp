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
  if (const Tensor& r = options.addend; r.data && r.data != c.data) {
    ENSURE(r.dtype == c.dtype && r.shape == c.shape, "matmul: addend is ", dtype_name(r.dtype), " ",
           r.shape.str(), ", expected c's ", dtype_name(c.dtype), " ", c.shape.str());
    const auto* rb = static_cast<const char*>(r.data);
    const auto* cb = static_cast<const char*>(c.data);
    ENSURE(rb + r.nbytes() <= cb || cb + c.nbytes() <= rb, "matmul: addend overlaps c without being c");
  }
  if (device_of("matmul", {{"a", a}, {"b", b}, {"c", c}, {"bias", options.bias}, {"addend", options.addend}}) ==
      Device::CPU)
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
