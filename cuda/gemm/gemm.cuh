// What the CUDA GEMM area offers beyond its ops entries (cuda::matmul and cuda::sum_rows are
// declared by ops/gemm.h): the richer cuBLASLt launcher gemm() for fused layers, tests and the
// bench, its last-call counters, and the row sums beside sum_rows (host declarations only;
// implementations in gemm.cu and sum_rows.cu).
//   gemm: c = epilogue(alpha * op(A) @ op(B) + beta * c)
// Row-major, contiguous, 2-D: A (M, K) or (K, M) with trans_a; B (K, N) or (N, K) with trans_b;
// C (M, N). A and B bf16; C bf16 or f32; f32 accumulation (CUBLAS_COMPUTE_32F); beta = 1 into an
// f32 C accumulates (parameter gradients). Any sizes, leading dimensions and pointer alignments.
// gemm() checks all its arguments itself (it is not dispatched through ops::).
#pragma once
#include "core/tensor.h"
#include "ops/gemm.h"

namespace engine::cuda {

struct GemmParams {
  Tensor a;              // (M, K), or (K, M) with trans_a; bf16
  bool trans_a = false;
  Tensor b;              // (K, N), or (N, K) with trans_b; bf16
  bool trans_b = false;
  Tensor c;              // (M, N) bf16 or f32: the output, and an input when beta != 0
  Tensor c_in;           // (M, N), c's dtype, or undefined: read in place of c when beta != 0
  float alpha = 1.f;
  float beta = 0.f;      // c is not read when beta == 0
  Tensor bias;           // (N) bf16 or f32, or undefined: added to every row before the GELU
  bool gelu = false;     // c = gelu(pre), pre = alpha op(A) op(B) + beta c + bias (tanh form)
  Tensor gelu_input;     // (M, N), c's dtype, or undefined: receives pre (needs gelu; not c)
  // Bias gradients (overwritten, never accumulated; need alpha == 1, no bias and no gelu; at
  // most one of the two):
  Tensor dbias_a;        // (M) f32 or bf16: dbias_a(i) = sum_k op(A)(i, k)
  Tensor dbias_b;        // (N) f32 or bf16: dbias_b(j) = sum_k op(B)(k, j)
  // GELU backward (needs beta == 0, no bias, gelu or dbias_a / dbias_b): c = (alpha op(A)
  // op(B)) * gelu'(dgelu_input), dgelu_input (M, N) in c's dtype, not c: the forward's pre;
  // dbias_out (N) f32 or bf16, optional: column sums of that c (overwritten).
  Tensor dgelu_input;
  Tensor dbias_out;
  // false: never ask cuBLASLt for a fused epilogue; the plain GEMM and the separate kernels
  // run instead (the path also taken when cuBLASLt has no algorithm for the epilogue). Tests.
  bool fuse_epilogue = true;
};

void gemm(const GemmParams& p);

// The process's cuBLASLt handle (a cublasLtHandle_t) and its workspace of
// ops::kGemmWorkspaceBytes, created on first use; gemm() and the FP8 product (gemm_fp8.cu) share
// them on the compute stream.
void* cublaslt_handle();
void* cublaslt_workspace();

// Counters of the last gemm() call, for tests: whether cuBLASLt ran the epilogue itself.
struct GemmLastCall {
  bool fused_epilogue = false;   // bias / GELU / bias gradient done inside cuBLASLt
  bool fallback_kernels = false; // separate epilogue or reduction kernels ran
};
GemmLastCall gemm_last_call();

// out(i) = beta * out(i) + sum_j x(i, j): x (M, N) bf16 or f32 on the GPU, out (M) f32 or bf16,
// summed in f32 in a fixed order (deterministic); out is not read when beta == 0. The row sums
// beside ops::sum_rows' column sums (the bias-gradient fallback of gemm()).
void sum_columns(const Tensor& x, const Tensor& out, float beta);

}  // namespace engine::cuda
