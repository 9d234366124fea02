// Dispatch of ops/elementwise.h: CPU -> ref/elementwise, CUDA -> cuda/elementwise.
#include "ops/elementwise.h"

#include "ops/dispatch.h"
#include "ref/elementwise.h"

#ifdef ENGINE_CUDA
#include "cuda/elementwise/elementwise.cuh"
#endif

namespace engine::ops {

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (device_of("add", {{"a", a}, {"b", b}, {"out", out}}) == Device::CPU)
    return ref::add(a, b, out);
#ifdef ENGINE_CUDA
  return cuda::add(a, b, out);
#endif
  no_cuda_build("add");
}

void add_inplace(const Tensor& acc, const Tensor& x) {
  if (device_of("add_inplace", {{"acc", acc}, {"x", x}}) == Device::CPU)
    return ref::add_inplace(acc, x);
#ifdef ENGINE_CUDA
  return cuda::add_inplace(acc, x);
#endif
  no_cuda_build("add_inplace");
}

void scale_inplace(const Tensor& x, double s) {
  if (device_of("scale_inplace", {{"x", x}}) == Device::CPU) return ref::scale_inplace(x, s);
#ifdef ENGINE_CUDA
  return cuda::scale_inplace(x, s);
#endif
  no_cuda_build("scale_inplace");
}

void cast(const Tensor& src, const Tensor& dst) {
  if (device_of("cast", {{"src", src}, {"dst", dst}}) == Device::CPU) return ref::cast(src, dst);
#ifdef ENGINE_CUDA
  return cuda::cast(src, dst);
#endif
  no_cuda_build("cast");
}

double sum(const Tensor& x) {
  if (device_of("sum", {{"x", x}}) == Device::CPU) return ref::sum(x);
#ifdef ENGINE_CUDA
  return cuda::sum(x);
#endif
  no_cuda_build("sum");
}

double sum_squares(const Tensor& x) {
  if (device_of("sum_squares", {{"x", x}}) == Device::CPU) return ref::sum_squares(x);
#ifdef ENGINE_CUDA
  return cuda::sum_squares(x);
#endif
  no_cuda_build("sum_squares");
}

int64_t count_nonfinite(const Tensor& x) {
  if (device_of("count_nonfinite", {{"x", x}}) == Device::CPU) return ref::count_nonfinite(x);
#ifdef ENGINE_CUDA
  return cuda::count_nonfinite(x);
#endif
  no_cuda_build("count_nonfinite");
}

void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,
                  bool accumulate) {
  if (device_of("copy_columns", {{"src", src}, {"dst", dst}}) == Device::CPU)
    return ref::copy_columns(src, src_col, dst, dst_col, width, accumulate);
#ifdef ENGINE_CUDA
  return cuda::copy_columns(src, src_col, dst, dst_col, width, accumulate);
#endif
  no_cuda_build("copy_columns");
}

}  // namespace engine::ops
