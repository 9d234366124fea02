// Matrix products for every linear layer. One entry point over both backends.
//   C = alpha * op(A) @ op(B) + beta * C  (+ bias(j) on every row when options.bias is set)
// A is (M, K), or (K, M) with trans_a; B is (K, N), or (N, K) with trans_b; C is (M, N). All
// tensors 2-D, contiguous, row-major (callers flatten with Tensor::rows()), except that a and c
// may be padded buffers: options.a_cols > 0 makes the matrix A the first a_cols columns of a
// (a's width is then only its row stride), c_cols likewise for C (columns beyond are neither
// read nor written). On CUDA, rows that start 16 bytes apart let cuBLASLt use its fast kernels:
// an odd vocabulary's logits (T, V) are kept as (T, round_up(V, 8)). beta = 1 accumulates
// (parameter gradients). CPU: f32 or f64, one dtype for all three. CUDA: bf16 A and B with a
// bf16 or f32 C (f32 accumulation) through cuBLASLt.
#pragma once
#include "core/tensor.h"

namespace engine::ops {

struct MatmulOptions {
  float alpha = 1.f;
  float beta = 0.f;
  Tensor bias;  // (N) or undefined; added once per row after the product
  int64_t a_cols = 0;  // > 0: A is a's first a_cols columns (row stride a.size(1))
  int64_t c_cols = 0;  // > 0: C is c's first c_cols columns (row stride c.size(1))
};

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            const MatmulOptions& options = {});

// out(j) = beta * out(j) + sum_i x(i, j)   (bias gradients). x (M, N), out (N).
void sum_rows(const Tensor& x, const Tensor& out, float beta);

}  // namespace engine::ops
