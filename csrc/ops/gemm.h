// Matrix products for every linear layer. One entry point over both backends.
//   C = alpha * op(A) @ op(B) + beta * C  (+ bias(j) on every row when options.bias is set)
// A is (M, K), or (K, M) with trans_a; B is (K, N), or (N, K) with trans_b; C is (M, N). All
// tensors 2-D, contiguous, row-major (callers flatten with Tensor::rows()). beta = 1 accumulates
// (parameter gradients). CPU: f32 or f64, one dtype for all three. CUDA: bf16 A and B with a
// bf16 or f32 C (f32 accumulation) through cuBLASLt.
#pragma once
#include "core/tensor.h"

namespace engine::ops {

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

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            const MatmulOptions& options = {});

// out(j) = beta * out(j) + sum_i x(i, j)   (bias gradients). x (M, N), out (N).
void sum_rows(const Tensor& x, const Tensor& out, float beta);

}  // namespace engine::ops
