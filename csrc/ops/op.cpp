// The out-of-line parts of ops/op.h: the run log's kernel line, parameter names for messages
// and the shared checks.
#include "ops/op.h"

#include <string>

#ifdef ENGINE_CUDA
#include "cuda/common/arch.h"
#endif

namespace engine::ops {

std::string kernel_choices(Device device) {
#ifdef ENGINE_CUDA
  if (device == Device::CUDA) return cuda::arch::kernels_line();
#endif
  return device == Device::CPU ? "kernels: the CPU reference (csrc/ref)"
                               : "kernels: none (this build has no CUDA support)";
}

std::string parameter_name(std::string_view names, int i) {
  if (!names.empty() && names.front() == '(') names.remove_prefix(1);
  if (!names.empty() && names.back() == ')') names.remove_suffix(1);
  for (; i > 0; --i) {
    const size_t comma = names.find(',');
    if (comma == std::string_view::npos) return "argument " + std::to_string(i);
    names.remove_prefix(comma + 1);
  }
  names = names.substr(0, names.find(','));
  while (!names.empty() && names.front() == ' ') names.remove_prefix(1);
  while (!names.empty() && names.back() == ' ') names.remove_suffix(1);
  return std::string(names);
}

void expect_defined(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.data != nullptr || t.numel() == 0, op, ": ", name, " is undefined");
}

void expect_dtype(const Tensor& t, DType dtype, const char* op, const char* name) {
  ENSURE(t.dtype == dtype, op, ": ", name, " is ", dtype_name(t.dtype), ", expected ",
         dtype_name(dtype));
}

void expect_shape(const Tensor& t, const Shape& s, const char* op, const char* name) {
  ENSURE(t.shape == s, op, ": ", name, " has shape ", t.shape.str(), ", expected ", s.str());
}

void expect_ndim(const Tensor& t, int ndim, const char* op, const char* name) {
  ENSURE(t.ndim() == ndim, op, ": ", name, " must be ", ndim, "-D, got shape ", t.shape.str());
}

void expect(const Tensor& t, DType dtype, const Shape& s, const char* op, const char* name) {
  expect_defined(t, op, name);
  expect_dtype(t, dtype, op, name);
  expect_shape(t, s, op, name);
}

void no_cuda_build(const char* op) { RAISE(op, ": tensors are on cuda but this build has no CUDA"); }

}  // namespace engine::ops
