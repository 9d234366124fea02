// What every layer needs besides its parameters: where activations live and in which dtype,
// and the float type of statistics saved for backward (f64 in an f64 model, else f32).
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "core/buffer.h"
#include "core/params.h"

namespace engine::layers {

// The precision of one linear layer's products (layers/linear.h): the FP8 recipe and, for a
// tensor-parallel layer, the group and the dimension its operands are split along, so that every
// scale is the one the whole (unsplit) operand would have.
enum class TpSplit { None, Out, In };  // Out: column-parallel (W's rows), In: row-parallel (W's columns)
struct LinearPrecision {
  Fp8Recipe fp8 = Fp8Recipe::Off;
  Comm* tp = nullptr;  // the group whose amaxes are reduced (nullptr: one rank)
  TpSplit split = TpSplit::None;
};

struct Env {
  Device device = Device::CPU;
  DType act = DType::F32;  // activations: f32 / f64 on CPU, bf16 on GPU
  Comm* tp = nullptr;      // the tensor-parallel group (nullptr: none)
  bool sequence_parallel = false;  // with tp: the residual stream holds this rank's rows only
  bool tp_overlap = true;  // with tp: collectives beside the GEMMs where the data allow (parallel/tensor_parallel.h)
  Fp8Recipe fp8 = Fp8Recipe::Off;  // the blocks' linear layers' products (layers/linear.h); the LM head's stay off
  DType stat() const { return act == DType::F64 ? DType::F64 : DType::F32; }
  Owned act_tensor(Shape s) const { return empty(s, act, device); }
  Owned stat_tensor(Shape s) const { return empty(s, stat(), device); }
  int tp_size() const { return tp ? tp->size() : 1; }
  int tp_rank() const { return tp ? tp->rank() : 0; }
  bool sp() const { return sequence_parallel && tp_size() > 1; }
  // A column-parallel (output features split) and a row-parallel (input features split) linear.
  LinearPrecision column() const { return {fp8, tp_size() > 1 ? tp : nullptr, TpSplit::Out}; }
  LinearPrecision row() const { return {fp8, tp_size() > 1 ? tp : nullptr, TpSplit::In}; }
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
// "prefix.stem<part>suffix" for each part, in order (the names of adjacent parameters).
std::vector<std::string> part_names(const std::string& prefix, const char* stem, std::initializer_list<const char*> parts,
                                    const char* suffix = "");

}  // namespace engine::layers
