// What every layer needs besides its parameters: where activations live and in which dtype,
// and the float type of statistics saved for backward (f64 in an f64 model, else f32).
#pragma once
#include "core/buffer.h"
#include "core/params.h"

namespace engine::layers {

struct Env {
  Device device = Device::CPU;
  DType act = DType::F32;  // activations: f32 / f64 on CPU, bf16 on GPU
  DType stat() const { return act == DType::F64 ? DType::F64 : DType::F32; }
  Owned act_tensor(Shape s) const { return empty(s, act, device); }
  Owned stat_tensor(Shape s) const { return empty(s, stat(), device); }
};

// A parameter's weight and gradient views, resolved once from the store by name.
struct Param {
  Tensor w, g;
  Param() = default;
  Param(const ParamStore& store, const std::string& name)
      : w(store.weight(name)), g(store.grad(name)) {}
  explicit operator bool() const { return w.data != nullptr; }
};

// Weight and gradient views spanning adjacent parameters `first` .. `last` as one (rows, cols)
// matrix (q/k/v or gate/up stacked along dim 0); ParamTable placed them without gaps.
Param adjacent_rows(const ParamStore& store, const std::vector<std::string>& names);

}  // namespace engine::layers
