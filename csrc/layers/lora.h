// LoRA (low-rank adaptation, Hu et al. 2021, as PEFT implements it) of a linear y = x W^T:
//   y = x W^T + s (x A^T) B^T,   s = lora.alpha / lora.rank,   A (r, in), B (out, r)
// B starts at zero (the adapted model equals the base at step 0); A is Kaiming-uniform as PEFT's
// nn.init.kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)), drawn by the layout
// independent init keyed by name (core/params.h). With LoRA on, every other parameter is frozen
// (ParamSpec::frozen: no gradient, no optimizer state), as PEFT's default.
// Gradients (dy the output gradient of this target's columns, x the linear's input):
//   dz = s dy B (T, r);  dx += dz A;  dA += dz^T x;  dB += dy^T (s x A^T)
// x A^T is recomputed in backward rather than kept from the forward (one T x in x r GEMM).
// Tensor parallelism, W's split decides A's and B's:
//   column-parallel W (split on out): A replicated, B split on out. Each rank's dA covers its
//     output rows only, so dA is summed over tp (ParamSpec::tp_partial_grad); dx is the partial
//     input gradient that the column-parallel input's backward sums anyway.
//   row-parallel W (split on in): A split on in, B replicated. Each rank adds s (x_l A_l^T) B^T to
//     its partial output before the row-parallel reduction sums it with x_l W_l^T; dB is then a
//     partial sum over tp (tp_partial_grad), dA and dx_l are the rank's own.
// Sequence parallelism changes nothing here: x and dy are the full rows the base GEMMs see, and
// the replicated A or B is summed over tp like every replicated parameter.
// Targets (lora.targets): q, k, v, o (attention), gate, up, down (SwiGLU MLP). Names:
//   <weight>.lora_a, <weight>.lora_b, e.g. layers.3.attn.wq.lora_a.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "layers/common.h"

namespace engine::layers {

// The lora.targets names and the weights they adapt, in declaration order.
struct LoraTarget {
  const char* name;    // "q"
  const char* module;  // "attn" or "mlp"
  const char* weight;  // "wq"
  const char* hf;      // "q_proj" (PEFT's target_modules)
  bool row_parallel;   // W split on in (o, down)
};
const std::vector<LoraTarget>& lora_targets();
bool lora_targets_weight(const ModelConfig& c, const std::string& weight);  // e.g. "wq" targeted?
bool is_lora_param(const std::string& name);
// With lora.rank > 0 every parameter declared afterwards that is not a LoRA factor is frozen.
void set_lora_freezing(ParamTable& t, const ModelConfig& c);

class Lora {
 public:
  Lora() = default;
  // The adapter of `weight` (prefix.weight, full shape (out, in)) when lora.targets names it.
  Lora(const ParamStore& store, const std::string& weight, const ModelConfig& c);
  static void declare(ParamTable& t, const std::string& weight, int64_t out, int64_t in, bool row_parallel,
                      const ModelConfig& c);
  explicit operator bool() const { return static_cast<bool>(a_); }

  // y[:, col : col + out] += s (x A^T) B^T  (y (T, N) with N >= col + out; x (T, in))
  void forward(const Tensor& x, const Tensor& y, int64_t col = 0) const;
  // dy: (T, N), this target's columns from col; x: the forward's input. dx (x's shape) += dz A
  // where given; dA, dB accumulate.
  void backward(const Tensor& dy, const Tensor& x, const Tensor& dx, int64_t col = 0) const;

 private:
  Param a_, b_;
  float scale_ = 1.f;
  int64_t out_ = 0;  // this rank's output features (B's rows)
};

}  // namespace engine::layers
