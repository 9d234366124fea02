// CPU reference GEMM (f32 or f64), same signatures as ops/gemm.h:
//   C = alpha * op(A) @ op(B) + beta * C (+ bias(j) on every row)
// Cache-blocked and OpenMP-parallel over row blocks of C, because CPU training runs on it.
// Deterministic: every C element is one sum over k = 0 .. K-1 in order, whatever the number of
// threads; beta == 0 never reads C (so an uninitialised or poisoned C is fine).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/gemm.h"

namespace engine::ref {

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            const ops::MatmulOptions& options = {});
void sum_rows(const Tensor& x, const Tensor& out, float beta);

// The raw kernel behind matmul, for other reference ops. Row-major, no leading dimensions:
// a is (M, K) or (K, M) with trans_a, b is (K, N) or (N, K) with trans_b, c is (M, N);
// bias is (N) or null.
template <typename T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, bool trans_a, const T* b, bool trans_b,
          T* c, T alpha, T beta, const T* bias);

}  // namespace engine::ref
