// What every layer needs besides its parameters: where activations live and in which dtype,
// and the float type of statistics saved for backward (f64 in an f64 model, else f32).
#pragma once
#include "comm/comm.h"
#include "core/buffer.h"
#include "core/params.h"

namespace engine::layers {

struct Env {
  Device device = Device::CPU;
  DType act = DType::F32;  // activations: f32 / f64 on CPU, bf16 on GPU
  Comm* tp = nullptr;      // the tensor-parallel group (nullptr: none)
  bool sequence_parallel = false;  // with tp: the residual stream holds this rank's rows only
  bool tp_overlap = true;  // with tp: collectives beside the GEMMs where the data allow (parallel/tensor_parallel.h)
  DType stat() const { return act == DType::F64 ? DType::F64 : DType::F32; }
  Owned act_tensor(Shape s) const { return empty(s, act, device); }
  Owned stat_tensor(Shape s) const { return empty(s, stat(), device); }
  int tp_size() const { return tp ? tp->size() : 1; }
  int tp_rank() const { return tp ? tp->rank() : 0; }
  bool sp() const { return sequence_parallel && tp_size() > 1; }
};

// A parameter (or adjacent parameters seen as one matrix) of a store: its weight and gradient
// views are made on use, so they stay valid when ZeRO-3 releases and re-gathers the weights.
// A frozen parameter (ParamSpec::frozen) has no gradient: g() is undefined, and every backward
// skips what only that gradient needs (its dW GEMM).
struct Param {
  const ParamStore* store = nullptr;
  int64_t offset = 0;
  Shape shape;
  bool frozen = false;
  Param() = default;
  Param(const ParamStore& s, const std::string& name)
      : store(&s), offset(s.table().get(name).offset), shape(s.table().get(name).shape),
        frozen(s.table().get(name).frozen) {}
  Tensor w() const {
    if (!store) return Tensor{};
    return frozen ? store->frozen_weight_at(offset, shape) : store->weight_at(offset, shape);
  }
  Tensor g() const { return store && !frozen ? store->grad_at(offset, shape) : Tensor{}; }
  explicit operator bool() const { return store != nullptr; }
};

// Weight and gradient views spanning adjacent parameters `first` .. `last` as one (rows, cols)
// matrix (q/k/v or gate/up stacked along dim 0); ParamTable placed them without gaps.
Param adjacent_rows(const ParamStore& store, const std::vector<std::string>& names);

}  // namespace engine::layers
