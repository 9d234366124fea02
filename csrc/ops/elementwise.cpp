// Dispatch of ops/elementwise.h: CPU -> ref/elementwise, CUDA -> cuda/elementwise once it exists.
#include "ops/elementwise.h"

#include "ops/dispatch.h"
#include "ref/elementwise.h"

namespace engine::ops {

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (device_of("add", {{"a", a}, {"b", b}, {"out", out}}) == Device::CPU)
    return ref::add(a, b, out);
#ifdef ENGINE_CUDA
  no_cuda_kernel("add");
#endif
  no_cuda_build("add");
}

void add_inplace(const Tensor& acc, const Tensor& x) {
  if (device_of("add_inplace", {{"acc", acc}, {"x", x}}) == Device::CPU)
    return ref::add_inplace(acc, x);
#ifdef ENGINE_CUDA
  no_cuda_kernel("add_inplace");
#endif
  no_cuda_build("add_inplace");
}

void scale_inplace(const Tensor& x, double s) {
  if (device_of("scale_inplace", {{"x", x}}) == Device::CPU) return ref::scale_inplace(x, s);
#ifdef ENGINE_CUDA
  no_cuda_kernel("scale_inplace");
#endif
  no_cuda_build("scale_inplace");
}

void cast(const Tensor& src, const Tensor& dst) {
  if (device_of("cast", {{"src", src}, {"dst", dst}}) == Device::CPU) return ref::cast(src, dst);
#ifdef ENGINE_CUDA
  no_cuda_kernel("cast");
#endif
  no_cuda_build("cast");
}

double sum(const Tensor& x) {
  if (device_of("sum", {{"x", x}}) == Device::CPU) return ref::sum(x);
#ifdef ENGINE_CUDA
  no_cuda_kernel("sum");
#endif
  no_cuda_build("sum");
}

double sum_squares(const Tensor& x) {
  if (device_of("sum_squares", {{"x", x}}) == Device::CPU) return ref::sum_squares(x);
#ifdef ENGINE_CUDA
  no_cuda_kernel("sum_squares");
#endif
  no_cuda_build("sum_squares");
}

int64_t count_nonfinite(const Tensor& x) {
  if (device_of("count_nonfinite", {{"x", x}}) == Device::CPU) return ref::count_nonfinite(x);
#ifdef ENGINE_CUDA
  no_cuda_kernel("count_nonfinite");
#endif
  no_cuda_build("count_nonfinite");
}

}  // namespace engine::ops
