// Feed-forward block.
//   gelu:   h = xn W_in^T + b_in;            a = gelu(h);            y = a W_out^T + b_out
//   swiglu: h = xn [W_gate; W_up]^T (one GEMM over the adjacent weights, h = [gate | up]);
//           a = silu(gate) * up;             y = a W_out^T
// Saved: h and a. xn is kept by the caller. dxn written (=); parameter gradients (+=).
// Tensor parallelism: W_in (gate and up each) column-parallel, W_out row-parallel, so each rank
// holds ffn_hidden_size / tp features (parallel/tensor_parallel.h; sequence parallel as in Attention).
#pragma once
#include "config/config.h"
#include "layers/common.h"
#include "layers/linear.h"
#include "layers/lora.h"

namespace engine::layers {

struct MlpSaved {
  Owned h;  // (T, F) gelu, (T, 2F) swiglu
  Owned a;  // (T, F)
  LinearAmaxes in, out;  // FP8: the input and output linears' amaxes (layers/linear.h)
};

class Mlp {
 public:
  Mlp() = default;
  Mlp(const ParamStore& store, const std::string& prefix, const ModelConfig& c);
  static void declare(ParamTable& t, const std::string& prefix, const ModelConfig& c);

  // y = mlp(xn), or with a residual (x's shape, may not be y) y = residual + mlp(xn): inside the
  // output GEMM's epilogue where the output needs no tensor-parallel reduction, else added after.
  // xn_amax: xn's FP8 amax where the kernel that wrote xn computed it (layers/linear.h).
  void forward(const Env& env, const Tensor& xn, const Tensor& y, MlpSaved& s,
               const Tensor& residual = {}, Fp8Amax xn_amax = {}) const;
  // The gradients of the input and of every parameter (the layer on its own).
  void backward(const Env& env, const Tensor& dy, const Tensor& xn, const MlpSaved& s,
                const Tensor& dxn) const;
  // The same but for the output bias, whose gradient (sum_t dy, out_bias_grad()) the caller adds:
  // Block sums it in the norm backward that wrote dy (ops/norm.h dx_colsum; layers/block.h).
  void backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& xn,
                                const MlpSaved& s, const Tensor& dxn) const;
  // The output bias's gradient (undefined without one): sum_t dy over this rank's rows.
  Tensor out_bias_grad() const { return b_out_ ? b_out_.g() : Tensor{}; }

 private:
  ActivationKind act_ = ActivationKind::SwiGLU;
  int64_t ffn_ = 0;  // this tensor-parallel rank's part of ffn_hidden_size
  Param w_in_, b_in_, w_out_, b_out_;
  Lora lora_gate_, lora_up_, lora_down_;  // SwiGLU, where lora.targets names them
};

}  // namespace engine::layers
