// Matrix products for every linear layer. One entry point over both backends.
//   C = alpha * op(A) @ op(B) + beta * C  (+ bias(j) on every row when options.bias is set)
// A is (M, K), or (K, M) with trans_a; B is (K, N), or (N, K) with trans_b; C is (M, N). All
// tensors 2-D, contiguous, row-major (callers flatten with Tensor::rows()). beta = 1 accumulates
// (parameter gradients). CPU: f32 or f64, one dtype for all three (and the bias, dbias); every C
// element one sum over k in order, the same on any thread count; beta == 0 never reads C. CUDA:
// bf16 A and B with a bf16 or f32 C (f32 accumulation) through cuBLASLt, the bias and dbias bf16
// or f32.
// sum_rows: out(j) = beta * out(j) + sum_i x(i, j)   (bias gradients). x (M, N), out (N); CPU: x
// and out of one dtype, f32 or f64, summed in double; CUDA: x bf16 or f32, out f32 or bf16,
// summed in f32 in a fixed order. out is not read when beta == 0.
#pragma once
#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ops {

// The GPU's cuBLASLt workspace, allocated once per process on first use (the memory estimate,
// models/memory_estimate.h, counts it).
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

struct MatmulOptions {
  MatmulOptions() = default;
  MatmulOptions(float alpha_, float beta_, Tensor bias_ = {}) : alpha(alpha_), beta(beta_), bias(bias_) {}
  float alpha = 1.f;
  float beta = 0.f;
  Tensor bias;  // (N) or undefined; added once per row after the product
  // The MLP's GELU (tanh form, ops/activation.h) as epilogues, so that the GPU applies it while
  // the product is still in registers (cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD):
  //   gelu:        c = gelu(pre), pre = alpha op(a) op(b) + beta c + bias; gelu_input (c's
  //                shape and dtype, optional, not c) receives pre
  //   dgelu_input: c = (alpha op(a) op(b)) * gelu'(dgelu_input) (the forward's pre; beta == 0,
  //                no bias or gelu); dbias (N, optional) = column sums of that c, overwritten
  // The results equal the separate ops (matmul, gelu_forward / gelu_backward, sum_rows) up to
  // the rounding of the intermediate, which the GPU epilogue skips.
  bool gelu = false;
  Tensor gelu_input;
  Tensor dgelu_input;
  Tensor dbias;
  // Read in place of c where beta != 0 (c's shape and dtype; c itself, or not overlapping it):
  // c = alpha op(a) op(b) + beta addend + bias, the residual add of a layer's output in the
  // GEMM's epilogue (the GPU reads the addend while the product is in registers).
  Tensor addend;
};

template <typename F>
void visit_tensors(const MatmulOptions& o, const char*, F&& f) {
  f(o.bias, "bias");
  f(o.gelu_input, "gelu_input");
  f(o.dgelu_input, "dgelu_input");
  f(o.dbias, "dbias");
  f(o.addend, "addend");
}

}  // namespace engine::ops

// options: {} for the plain product.
#define ENGINE_GEMM_OPS(OP)                                                                  \
  OP(void, matmul,                                                                           \
     (const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,         \
      const ops::MatmulOptions& options),                                                    \
     (a, trans_a, b, trans_b, c, options))                                                   \
  OP(void, sum_rows, (const Tensor& x, const Tensor& out, float beta), (x, out, beta))

ENGINE_DECLARE_OPS(ENGINE_GEMM_OPS)
