// The scaled FP8 matrix product on the GPU through cuBLASLt (ops/fp8.h):
//   c = beta * d + sa(i) * sb(j) * a(M, K) @ b(N, K)^T + bias,  a and b e4m3 / e5m2 bytes
// Row-major to cuBLASLt's column-major (as gemm.cu): c^T (N, M) = b (N, K) @ a^T (K, M), so
// cuBLASLt's A is our b with op T (its stored (K, N) column-major, K contiguous) and its B is
// our a with op N: the "TN" layout that FP8 products on Hopper require. Its A scale is our
// b_scale_inv, its B scale our a_scale_inv: scalars (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) or
// vectors of N and M (OUTER_VEC_32F, one per row of D and one per column). Accumulation in f32
// (CUBLAS_COMPUTE_32F, the precise mode: CUBLASLT_MATMUL_DESC_FAST_ACCUM off). The addend d is
// cuBLASLt's C (of D's type), the bias its BIAS epilogue (a vector along its rows, our columns).
// Where the heuristic has no algorithm with them (it has none for some scale modes), the product
// goes to a scratch matrix and one elementwise pass adds d and the bias into c.
// State: the process's handle and workspace (gemm.cuh), a plan per (sizes, formats, scale mode,
// c dtype, beta != 0, bias) made once by the heuristic.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/gemm/gemm.cuh"
#include "ops/fp8.h"

#define CUBLAS_CHECK(expr) \
  CUDA_CHECK_GEN((expr), #expr, CUBLAS_STATUS_SUCCESS, "cuBLAS", cublasLtGetStatusString)

namespace engine::cuda {
namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, ops::Fp8Format, ops::Fp8Format, bool, DType, bool, bool>;

struct Fp8Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, lt_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
};

cudaDataType_t fp8_type(ops::Fp8Format f) { return f == ops::Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

template <typename V>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

// Column-major (rows, cols) with leading dimension rows.
cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), rows));
  return l;
}

Fp8Plan make_plan(int64_t m, int64_t n, int64_t k, ops::Fp8Format fa, ops::Fp8Format fb, bool per_row, DType c_dtype,
                  const float* sa, const float* sb, const void* bias) {
  Fp8Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  const int32_t mode = per_row ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sb);  // its A is our b
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sa);
  const cudaDataType_t ct = c_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  if (bias) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(ct));
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  }
  p.lt_a = layout(fp8_type(fb), k, n);
  p.lt_b = layout(fp8_type(fa), k, m);
  p.lt_c = layout(ct, n, m);
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = ops::kGemmWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(cublaslt_handle()), p.desc,
                                                           p.lt_a, p.lt_b, p.lt_c, p.lt_c, pref, 1, &result, &count);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (st == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    p.algo = result.algo;
    p.found = true;
  }
  return p;
}

std::mutex g_mu;
std::map<Key, Fp8Plan> g_plans;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Fp8Plan& plan_for(const Key& key, const float* sa, const float* sb, const void* bias) {
  auto it = g_plans.find(key);
  if (it == g_plans.end()) {
    const auto [m, n, k, fa, fb, per_row, c_dtype, beta, with_bias] = key;
    it = g_plans.emplace(key, make_plan(m, n, k, fa, fb, per_row, c_dtype, sa, sb, with_bias ? bias : nullptr)).first;
  }
  return it->second;
}

// c(i, j) = p(i, j) + (d(i, j) where d) + (bias(j) where bias), in f32.
template <typename T>
__global__ void add_epilogue_kernel(const T* p, const T* d, const T* bias, T* c, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float v = to_float(p[i]);
    if (d) v += to_float(d[i]);
    if (bias) v += to_float(bias[i % cols]);
    c[i] = from_float<T>(v);
  }
}

void run(Fp8Plan& p, const Tensor& a, const Tensor& b, const float* sa, const float* sb, const void* bias, float beta,
         const void* c_in, void* d) {
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sb);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sa);
  if (bias) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.f;
  CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(cublaslt_handle()), p.desc, &alpha, b.data, p.lt_a, a.data,
                              p.lt_b, &beta, c_in, p.lt_c, d, p.lt_c, &p.algo, cublaslt_workspace(),
                              ops::kGemmWorkspaceBytes, stream()));
}

}  // namespace

void fp8_matmul(const Tensor& a, ops::Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                ops::Fp8Format b_format, const Tensor& b_scale_inv, const Tensor& c, const ops::Fp8MatmulOptions& o) {
  const char* op = "fp8_matmul";
  expect_cuda(a, op, "a");
  expect_cuda(b, op, "b");
  expect_cuda_float(c, op, "c");
  expect_cuda(a_scale_inv, op, "a_scale_inv");
  expect_cuda(b_scale_inv, op, "b_scale_inv");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  if (m == 0 || n == 0) return;
  ENSURE(k % 16 == 0 && n % 16 == 0, op, ": a ", a.shape.str(), ", b ", b.shape.str(),
         ": the GPU's FP8 product needs K and N multiples of 16");
  ENSURE(aligned16(a.data) && aligned16(b.data) && aligned16(c.data) && (!o.addend.data || aligned16(o.addend.data)) &&
             (!o.bias.data || aligned16(o.bias.data)),
         op, ": a, b, c, the addend and the bias must start at 16-byte aligned addresses");
  const bool per_row = a_scale_inv.size(0) != 1 || b_scale_inv.size(0) != 1;
  ENSURE(!per_row || (a_scale_inv.size(0) == m && b_scale_inv.size(0) == n), op,
         ": per-row scales need a_scale_inv (", m, ") and b_scale_inv (", n, ")");
  const auto* sa = static_cast<const float*>(a_scale_inv.data);
  const auto* sb = static_cast<const float*>(b_scale_inv.data);
  const void* bias = o.bias.data;
  const void* d = o.beta != 0.f ? (o.addend.data ? o.addend.data : c.data) : nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  Fp8Plan& full = plan_for({m, n, k, a_format, b_format, per_row, c.dtype, d != nullptr, bias != nullptr}, sa, sb, bias);
  if (full.found) {
    run(full, a, b, sa, sb, bias, o.beta, d ? d : c.data, c.data);
    return;
  }
  Fp8Plan& plain = plan_for({m, n, k, a_format, b_format, per_row, c.dtype, false, false}, sa, sb, nullptr);
  ENSURE(plain.found, op, ": cuBLASLt has no algorithm for ", ops::fp8_format_name(a_format), " (", m, ", ", k,
         ") x ", ops::fp8_format_name(b_format), " (", n, ", ", k, ")^T into ", dtype_name(c.dtype),
         per_row ? " with per-row scales" : " with per-tensor scales", " on this GPU (FP8 needs sm_89 or later)");
  if (!d && !bias) {
    run(plain, a, b, sa, sb, nullptr, 0.f, c.data, c.data);
    return;
  }
  // No algorithm takes the addend or the bias here: the product apart, then one pass adds them.
  Owned product = empty({m, n}, c.dtype, Device::CUDA);
  run(plain, a, b, sa, sb, nullptr, 0.f, product.t.data, product.t.data);
  float_switch(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    add_epilogue_kernel<T><<<stream_blocks(m * n, 256), 256, 0, stream()>>>(
        static_cast<const T*>(product.t.data), static_cast<const T*>(d), static_cast<const T*>(bias),
        static_cast<T*>(c.data), m, n);
  });
  check_launch("add_epilogue_kernel");
}

}  // namespace engine::cuda
