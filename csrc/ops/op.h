// One declaration per op. An op family's header (ops/norm.h, ops/loss.h, ...) lists its ops once,
// one entry each:
//
//   OP(return type, name, (typed parameters), (parameter names))
//
// for example
//
//   #define ENGINE_NORM_OPS(OP)
//     OP(void, rmsnorm_forward,
//        (const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd),
//        (x, weight, eps, y, rstd))
//     ... (one entry per op, each line of the macro ending in a backslash)
//   ENGINE_DECLARE_OPS(ENGINE_NORM_OPS)
//
// ENGINE_DECLARE_OPS declares each entry as engine::ops::name (what layers call), as
// engine::ref::name (the CPU reference defines it, csrc/ref/) and, in a CUDA build, as
// engine::cuda::name (the CUDA implementation defines it, cuda/). Parameter types of the family
// are spelt ops::Type so that the entry reads the same in all three namespaces.
//
// The family's op file (csrc/ops/norm.cpp) defines one `void check_name(typed parameters)` per
// op: the preconditions both backends share (shapes, scalar ranges, aliasing). The backends check
// only what is theirs (the dtypes they take, alignment, size limits of a kernel). The op file then
// writes ENGINE_DEFINE_OPS(ENGINE_NORM_OPS), which defines every ops::name as
//   1. the tensors among the arguments (and inside parameter structs, see visit_tensors) share
//      one device, else an error naming two of them;
//   2. check_name(arguments);
//   3. ref::name on the CPU; cuda::name on a GPU; a build without CUDA refuses GPU tensors.
#pragma once
#include <string>
#include <string_view>

#include "core/check.h"
#include "core/tensor.h"

namespace engine::ops {

// Calls f(tensor, name) for each tensor an argument holds. A Tensor holds itself; a parameter
// struct that holds tensors has its own overload beside it (ops/attention.h); anything else holds
// none. `name` is the parameter's name; struct overloads name their members instead.
template <typename F>
void visit_tensors(const Tensor& t, const char* name, F&& f) {
  f(t, name);
}
template <typename T, typename F>
void visit_tensors(const T&, const char*, F&&) {}

// For the run log, once the device is selected: the kernels the ops' Auto choices take on
// `device`, one line ("kernels: ..."). CUDA: from the device's compute capability and the code
// this binary has for it (cuda/common/arch.h: the Hopper kernels need sm_90a code on a compute
// capability 9.0 GPU; elsewhere the portable ones run); CPU: the reference.
std::string kernel_choices(Device device);

// The name at position i of a stringified parameter list "(a, b, c)".
std::string parameter_name(std::string_view names, int i);

// The device of an op's tensor arguments (undefined, optional tensors skipped; CPU when none is
// set); names is the parameter list as written, "(x, weight, eps)", for the message.
template <typename... Args>
Device op_device(const char* op, std::string_view names, const Args&... args) {
  const Tensor* first = nullptr;
  std::string first_name;
  int index = 0;
  auto check_one = [&](const auto& arg) {
    std::string param;  // filled on the error path only
    visit_tensors(arg, nullptr, [&](const Tensor& t, const char* member) {
      if (t.data == nullptr && t.ndim() == 0) return;  // undefined (optional); empty tensors count
      const std::string name = member ? std::string(member) : parameter_name(names, index);
      if (!first) {
        first = &t;
        first_name = name;
        return;
      }
      ENSURE(t.device == first->device, op, ": ", name, " is on ", device_name(t.device), " but ",
             first_name, " is on ", device_name(first->device),
             " (all tensors of one op must share a device)");
    });
    ++index;
  };
  (check_one(args), ...);
  return first ? first->device : Device::CPU;
}

// Shared precondition checks (check_ functions); a failure names the op and the argument.
void expect_defined(const Tensor& t, const char* op, const char* name);  // memory unless empty
void expect_dtype(const Tensor& t, DType dtype, const char* op, const char* name);
void expect_shape(const Tensor& t, const Shape& s, const char* op, const char* name);
void expect_ndim(const Tensor& t, int ndim, const char* op, const char* name);
// Defined, of this dtype and shape (the common case of one line per argument).
void expect(const Tensor& t, DType dtype, const Shape& s, const char* op, const char* name);

// CUDA tensors reached an op in a build without CUDA.
[[noreturn]] void no_cuda_build(const char* op);

}  // namespace engine::ops

#define ENGINE_OP_UNPAREN_(...) __VA_ARGS__
#define ENGINE_OP_DECLARE_(R, name, params, args) R name params;

#ifdef ENGINE_CUDA
#define ENGINE_OP_CUDA_DECLARATIONS_(LIST) \
  namespace engine::cuda {                 \
  LIST(ENGINE_OP_DECLARE_)                 \
  }
#define ENGINE_OP_CUDA_CALL_(name, args) return ::engine::cuda::name args;
#else
#define ENGINE_OP_CUDA_DECLARATIONS_(LIST)
#define ENGINE_OP_CUDA_CALL_(name, args)
#endif

#define ENGINE_DECLARE_OPS(LIST) \
  namespace engine::ops {        \
  LIST(ENGINE_OP_DECLARE_)       \
  }                              \
  namespace engine::ref {        \
  LIST(ENGINE_OP_DECLARE_)       \
  }                              \
  ENGINE_OP_CUDA_DECLARATIONS_(LIST)

#define ENGINE_OP_DEFINE_(R, name, params, args)                                   \
  R name params {                                                                  \
    const ::engine::Device device_ = op_device(#name, #args, ENGINE_OP_UNPAREN_ args); \
    check_##name args;                                                             \
    if (device_ == ::engine::Device::CPU) return ::engine::ref::name args;         \
    ENGINE_OP_CUDA_CALL_(name, args)                                               \
    no_cuda_build(#name);                                                          \
  }

// Written once in the family's op file, inside namespace engine::ops, after its check_ functions.
#define ENGINE_DEFINE_OPS(LIST) LIST(ENGINE_OP_DEFINE_)
