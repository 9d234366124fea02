// Device dispatch shared by the op files (csrc/ops/*.cpp). Each op is
//   void op(args) {
//     if (device_of("op", {{"x", x}, ...}) == Device::CPU) return ref::op(args);
//   #ifdef ENGINE_CUDA
//     no_cuda_kernel("op");  // plugging a kernel in: return cuda::op(args);
//   #endif
//     no_cuda_build("op");
//   }
// device_of checks that all defined tensor arguments live on one device; shapes and dtypes are
// checked by the backend function (ref:: or the CUDA launcher), which owns its preconditions.
#pragma once
#include <initializer_list>

#include "core/check.h"
#include "core/tensor.h"

namespace engine::ops {

struct NamedTensor {
  const char* name;
  const Tensor& t;
};

// The device of the arguments; undefined (optional) tensors are skipped. CPU when none is set.
inline Device device_of(const char* op, std::initializer_list<NamedTensor> args) {
  const NamedTensor* first = nullptr;
  for (const NamedTensor& a : args) {
    if (a.t.data == nullptr && a.t.ndim() == 0) continue;  // undefined (optional); empty tensors count
    if (!first) {
      first = &a;
      continue;
    }
    ENSURE(a.t.device == first->t.device, op, ": ", a.name, " is on ", device_name(a.t.device),
           " but ", first->name, " is on ", device_name(first->t.device),
           " (all tensors of one op must share a device)");
  }
  return first ? first->t.device : Device::CPU;
}

// CUDA tensors reached an op whose kernel is not written yet.
[[noreturn]] inline void no_cuda_kernel(const char* op) { RAISE(op, ": no CUDA kernel yet"); }

// CUDA tensors reached an op in a build without CUDA.
[[noreturn]] inline void no_cuda_build(const char* op) {
  RAISE(op, ": tensors are on cuda but this build has no CUDA");
}

}  // namespace engine::ops
