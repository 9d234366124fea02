// GEMM on the GPU through cuBLASLt, row-major (ops/gemm.h, cuda/gemm/gemm.cuh):
//   c = epilogue(alpha * op(A) @ op(B) + beta * c_in),  c_in = c unless GemmParams::c_in is set
//   (MatmulOptions::addend: cuBLASLt's C input apart from its output D); epilogue: + bias(j), then
//   GELU (tanh form),
//   or bias gradients dbias_a(i) = sum_k op(A)(i, k), dbias_b(j) = sum_k op(B)(k, j).
// Row-major to cuBLASLt's column-major: a row-major (r, c) matrix is a column-major (c, r) one
// with the same leading dimension, so C^T (N, M) = op(B)^T (N, K) @ op(A)^T (K, M): cuBLASLt's A
// is our B (op T when trans_b), its B is our A (op T when trans_a), its D is our C seen as
// (N rows, M columns, ld N). Hence cuBLASLt's "rows of D" are our columns: its bias (one per row
// of D) is our per-column bias, BGRADA (reduce its A over k, one per row of D) is our dbias_b and
// BGRADB (its B, one per column of D) is our dbias_a.
// Types: A, B bf16; C and D (same dtype and layout) bf16 or f32; CUBLAS_COMPUTE_32F with f32 alpha and beta; the bias or
// bias-gradient vector bf16 or f32 (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE); GELU's saved input in
// C's dtype with leading dimension N (cuBLASLt wants it divisible by 8).
// State: one cublasLt handle and one 32 MiB workspace, created on first use and kept for the
// process; a plan (descriptors + the heuristic's best algorithm) per key (sizes, transposes, C
// dtype, epilogue, vector dtype, pointer alignments), so each shape queries the heuristic once.
// Pointer alignments are passed to the heuristic (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*), so
// slices at any element offset and odd leading dimensions work.
// Fallback: when cuBLASLt has no algorithm for an epilogue (or fuse_epilogue is false) the plain
// GEMM runs and separate kernels add the bias / apply GELU (epilogue_kernel) or reduce the bias
// gradient (cuda/gemm/sum_rows.cu); K = 0 needs no GEMM (c = beta c + bias).
// Checks: matmul's shapes and epilogue combinations ran before (ops/gemm.cpp), so matmul checks
// only the dtypes the GPU takes; gemm(), called directly, checks everything.
#include "cuda/gemm/gemm.cuh"

#include <cublasLt.h>

#include <map>
#include <mutex>

#include "cuda/activation/gelu.cuh"
#include "cuda/common/launch.cuh"
#include "ops/activation.h"

#define CUBLAS_CHECK(expr) \
  CUDA_CHECK_GEN((expr), #expr, CUBLAS_STATUS_SUCCESS, "cuBLAS", cublasLtGetStatusString)

namespace engine::cuda {
namespace {

constexpr size_t kWorkspaceBytes = ops::kGemmWorkspaceBytes;
constexpr int kThreads = 256;

// ---- cuBLASLt state and plans --------------------------------------------------------------

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// Created on first use, never destroyed (destruction at exit can outlive the CUDA context).
Lt& lt() {
  static Lt s = [] {
    Lt l;
    CUBLAS_CHECK(cublasLtCreate(&l.handle));
    l.workspace = device::alloc(kWorkspaceBytes);
    return l;
  }();
  return s;
}

}  // namespace

void* cublaslt_handle() { return lt().handle; }
void* cublaslt_workspace() { return lt().workspace; }

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two dividing the address, capped at 256 (cuBLASLt's default assumption).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), 256));
}

struct PlanKey {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  DType c_dtype = DType::F32;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int32_t vec_dtype = -1;  // cudaDataType_t of the bias / bias-gradient vector; -1: none
  bool aux = false;        // GELU input saved (leading dimension n)
  uint32_t align_a = 256, align_b = 256, align_c = 256, align_vec = 256, align_aux = 256;
  auto operator<=>(const PlanKey&) const = default;
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  // cuBLASLt's A (our B), its B (our A), and C = D (our C).
  cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, lt_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // of the heuristic query
};

template <typename V>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <typename V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

// A row-major (rows, cols) matrix as cuBLASLt's column-major (cols, rows) with ld = cols.
cublasLtMatrixLayout_t row_major_layout(DType t, int64_t rows, int64_t cols) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(t), static_cast<uint64_t>(cols),
                                          static_cast<uint64_t>(rows), cols));
  return l;
}

// The heuristic reads the vector and aux pointers' values for their alignment (cublasLt.h), so
// they are set before the query; later calls overwrite them with their own pointers.
Plan make_plan(const PlanKey& key, const void* vec, const void* aux) {
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, key.epilogue);
  if (key.vec_dtype >= 0) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, key.vec_dtype);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vec);
  }
  if (key.aux) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.n);
  }
  p.lt_a = row_major_layout(DType::BF16, key.trans_b ? key.n : key.k, key.trans_b ? key.k : key.n);
  p.lt_b = row_major_layout(DType::BF16, key.trans_a ? key.k : key.m, key.trans_a ? key.m : key.k);
  p.lt_c = row_major_layout(key.c_dtype, key.m, key.n);

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes});
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // its A is our B
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  p.status = cublasLtMatmulAlgoGetHeuristic(lt().handle, p.desc, p.lt_a, p.lt_b, p.lt_c, p.lt_c,
                                            pref, 1, &result, &count);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (p.status == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    p.algo = result.algo;
    p.found = true;
  }
  return p;
}

std::mutex g_mu;                  // guards the plans, the descriptors' pointers and g_last
std::map<PlanKey, Plan> g_plans;  // kept for the process
GemmLastCall g_last;

Plan& plan_for(const PlanKey& key, const void* vec, const void* aux) {
  auto it = g_plans.find(key);
  if (it == g_plans.end()) it = g_plans.emplace(key, make_plan(key, vec, aux)).first;
  return it->second;
}

// C (the input scaled by beta) is c_in where given, else c itself (D, the output).
void run_plan(Plan& p, const GemmParams& g, const void* vec, const void* aux) {
  if (vec) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vec);
  if (aux) set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  const Lt& l = lt();
  const void* c_in = g.c_in.data ? g.c_in.data : g.c.data;
  CUBLAS_CHECK(cublasLtMatmul(l.handle, p.desc, &g.alpha, g.b.data, p.lt_a, g.a.data, p.lt_b,
                              &g.beta, c_in, p.lt_c, g.c.data, p.lt_c, &p.algo, l.workspace,
                              kWorkspaceBytes, stream()));
}

// ---- fallback epilogue ----------------------------------------------------------------------

// c(i, j) = gelu?(c_scale * c(i, j) + bias(j)), pre(i, j) = the value before the GELU.
// c is not read when c_scale == 0. Rows over blockIdx.y, columns over x (grid-stride both).
template <typename T, typename Bias>
__global__ void epilogue_kernel(T* c, int64_t m, int64_t n, float c_scale, const Bias* bias,
                                T* pre, bool gelu) {
  for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t idx = i * n + j;
      float v = c_scale != 0.f ? c_scale * to_float(c[idx]) : 0.f;
      if (bias) v += to_float(bias[j]);
      if (pre) pre[idx] = from_float<T>(v);
      if (gelu) v = gelu::forward<false>(v);
      c[idx] = from_float<T>(v);
    }
  }
}

template <typename T>
void launch_epilogue(const GemmParams& g, int64_t m, int64_t n, float c_scale) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(n, kThreads), 64)),
                  static_cast<unsigned>(std::min<int64_t>(m, 65535)));
  T* c = static_cast<T*>(g.c.data);
  T* pre = static_cast<T*>(g.gelu_input.data);
  if (g.bias.data && g.bias.dtype == DType::BF16)
    epilogue_kernel<T, bf16_t><<<grid, kThreads, 0, stream()>>>(
        c, m, n, c_scale, static_cast<const bf16_t*>(g.bias.data), pre, g.gelu);
  else
    epilogue_kernel<T, float><<<grid, kThreads, 0, stream()>>>(
        c, m, n, c_scale, static_cast<const float*>(g.bias.data), pre, g.gelu);
  check_launch("gemm epilogue_kernel");
}

// ---- argument checks ------------------------------------------------------------------------

// The dtypes the GPU GEMM takes: a and b bf16, c bf16 or f32, the bias and bias-gradient vectors
// bf16 or f32 (the GELU inputs and c_in are of c's dtype, checked with their shapes).
void check_dtypes(const GemmParams& g, const char* op) {
  ENSURE(g.a.dtype == DType::BF16 && g.b.dtype == DType::BF16, op, ": a is ",
         dtype_name(g.a.dtype), ", b is ", dtype_name(g.b.dtype), "; the GPU GEMM takes bf16 inputs");
  ENSURE(g.c.dtype == DType::BF16 || g.c.dtype == DType::F32, op, ": c is ",
         dtype_name(g.c.dtype), ", expected bf16 or f32");
  auto vector = [&](const Tensor& t, const char* name) {
    ENSURE(!t.data || t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
           dtype_name(t.dtype), ", expected bf16 or f32");
  };
  vector(g.bias, "bias");
  vector(g.dbias_a, "dbias_a");
  vector(g.dbias_b, "dbias_b");
  vector(g.dbias_out, "dbias_out");
}

void expect_vector(const Tensor& t, int64_t len, const char* op, const char* name) {
  expect_cuda(t, op, name);
  ENSURE(t.shape == Shape{len}, op, ": ", name, " has shape ", t.shape.str(), ", expected (",
         len, ")");
}

// gemm()'s other preconditions (for matmul, ops/gemm.cpp checks them before the dispatch): the
// tensors on the GPU, the shapes, the epilogues that go together.
void check_gemm(const GemmParams& g, const char* op) {
  expect_cuda(g.a, op, "a");
  expect_cuda(g.b, op, "b");
  expect_cuda(g.c, op, "c");
  ENSURE(g.a.ndim() == 2 && g.b.ndim() == 2 && g.c.ndim() == 2, op, ": a, b and c must be 2-D, got ",
         g.a.shape.str(), ", ", g.b.shape.str(), ", ", g.c.shape.str());
  const int64_t m = g.trans_a ? g.a.size(1) : g.a.size(0), k = g.trans_a ? g.a.size(0) : g.a.size(1);
  const int64_t kb = g.trans_b ? g.b.size(1) : g.b.size(0), n = g.trans_b ? g.b.size(0) : g.b.size(1);
  ENSURE(k == kb, op, ": inner dimensions differ: op(a) is (", m, ", ", k, "), op(b) is (", kb,
         ", ", n, ") [trans_a=", g.trans_a, ", trans_b=", g.trans_b, "]");
  ENSURE(g.c.shape == Shape({m, n}), op, ": c has shape ", g.c.shape.str(), ", expected (", m,
         ", ", n, ")");
  const bool bias = g.bias.data != nullptr, aux = g.gelu_input.data != nullptr;
  const bool dbias_a = g.dbias_a.data != nullptr, dbias_b = g.dbias_b.data != nullptr;
  if (bias) expect_vector(g.bias, n, op, "bias");
  if (aux) {
    expect_cuda(g.gelu_input, op, "gelu_input");
    ENSURE(g.gelu, op, ": gelu_input is set but gelu is false");
    ENSURE(g.gelu_input.dtype == g.c.dtype && g.gelu_input.shape == g.c.shape, op,
           ": gelu_input is ", dtype_name(g.gelu_input.dtype), " ", g.gelu_input.shape.str(),
           ", expected c's ", dtype_name(g.c.dtype), " ", g.c.shape.str());
    ENSURE(g.gelu_input.data != g.c.data, op, ": gelu_input must not alias c");
  }
  if (dbias_a) expect_vector(g.dbias_a, m, op, "dbias_a");
  if (dbias_b) expect_vector(g.dbias_b, n, op, "dbias_b");
  if (dbias_a || dbias_b) {
    ENSURE(!(dbias_a && dbias_b), op, ": at most one of dbias_a and dbias_b");
    ENSURE(!bias && !g.gelu, op, ": a bias gradient cannot be combined with bias or gelu");
    ENSURE(g.alpha == 1.f, op, ": a bias gradient needs alpha == 1 (got ", g.alpha, ")");
  }
  const bool dgelu = g.dgelu_input.data != nullptr;
  if (dgelu) {
    expect_cuda(g.dgelu_input, op, "dgelu_input");
    ENSURE(g.dgelu_input.dtype == g.c.dtype && g.dgelu_input.shape == g.c.shape, op, ": dgelu_input is ",
           dtype_name(g.dgelu_input.dtype), " ", g.dgelu_input.shape.str(), ", expected c's ",
           dtype_name(g.c.dtype), " ", g.c.shape.str());
    ENSURE(g.dgelu_input.data != g.c.data, op, ": dgelu_input must not alias c");
    ENSURE(!bias && !g.gelu && !aux && !dbias_a && !dbias_b, op,
           ": dgelu_input cannot be combined with bias, gelu or dbias_a / dbias_b");
    ENSURE(g.beta == 0.f, op, ": dgelu_input needs beta == 0 (got ", g.beta, ")");
  }
  if (g.dbias_out.data) {
    ENSURE(dgelu, op, ": dbias_out is the bias gradient of the GELU backward: it needs dgelu_input");
    expect_vector(g.dbias_out, n, op, "dbias_out");
  }
  // c_in is read only where it is not c and beta != 0.
  if (g.c_in.data && g.c_in.data != g.c.data && g.beta != 0.f) {
    expect_cuda(g.c_in, op, "c_in");
    ENSURE(g.c_in.dtype == g.c.dtype && g.c_in.shape == g.c.shape, op, ": c_in is ", dtype_name(g.c_in.dtype),
           " ", g.c_in.shape.str(), ", expected c's ", dtype_name(g.c.dtype), " ", g.c.shape.str());
  }
}

// The GEMM and its epilogue, the arguments checked.
void run_gemm(const GemmParams& params, const char* op) {
  GemmParams g = params;
  const int64_t m = g.trans_a ? g.a.size(1) : g.a.size(0), k = g.trans_a ? g.a.size(0) : g.a.size(1);
  const int64_t n = g.trans_b ? g.b.size(0) : g.b.size(1);
  const bool bias = g.bias.data != nullptr, aux = g.gelu_input.data != nullptr;
  const bool dbias_a = g.dbias_a.data != nullptr, dbias_b = g.dbias_b.data != nullptr;
  const bool dgelu = g.dgelu_input.data != nullptr, dbias_out = g.dbias_out.data != nullptr;
  const bool degenerate = m == 0 || n == 0 || k == 0;
  // c_in: dropped where it is c or unread (beta 0); copied into c where no GEMM runs (the
  // epilogue kernel reads c); else cuBLASLt's C.
  if (g.c_in.data && (g.c_in.data == g.c.data || g.beta == 0.f)) g.c_in = Tensor{};
  if (g.c_in.data && degenerate) {
    if (m > 0 && n > 0)
      CUDA_CHECK(cudaMemcpyAsync(g.c.data, g.c_in.data, g.c.nbytes(), cudaMemcpyDeviceToDevice, stream()));
    g.c_in = Tensor{};
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_last = {};
  const bool epilogue = bias || g.gelu || dbias_a || dbias_b || dgelu;
  const Tensor& aux_t = dgelu ? g.dgelu_input : g.gelu_input;  // cuBLASLt's auxiliary matrix
  if (!degenerate) {
    PlanKey key;
    key.m = m, key.n = n, key.k = k;
    key.trans_a = g.trans_a, key.trans_b = g.trans_b;
    key.c_dtype = g.c.dtype;
    key.align_a = alignment(g.a.data), key.align_b = alignment(g.b.data);
    key.align_c = std::min(alignment(g.c.data), g.c_in.data ? alignment(g.c_in.data) : 256u);
    // GELU's saved input needs a leading dimension divisible by 8 (cublasLt.h).
    if (epilogue && g.fuse_epilogue && !((aux || dgelu) && n % 8 != 0)) {
      PlanKey fused = key;
      const Tensor& vec = dbias_a ? g.dbias_a : dbias_b ? g.dbias_b : dgelu ? g.dbias_out : g.bias;
      if (dgelu) fused.epilogue = dbias_out ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
      else if (dbias_a) fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
      else if (dbias_b) fused.epilogue = CUBLASLT_EPILOGUE_BGRADA;
      else if (g.gelu && aux) fused.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      else if (g.gelu) fused.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
      else fused.epilogue = CUBLASLT_EPILOGUE_BIAS;
      if (vec.data) {
        fused.vec_dtype = static_cast<int32_t>(cuda_type(vec.dtype));
        fused.align_vec = alignment(vec.data);
      }
      fused.aux = aux || dgelu;
      if (fused.aux) fused.align_aux = alignment(aux_t.data);
      Plan& plan = plan_for(fused, vec.data, aux_t.data);
      if (plan.found) {
        run_plan(plan, g, vec.data, aux_t.data);
        g_last.fused_epilogue = true;
        return;
      }
      if (dgelu && dbias_out) {  // no DGELU_BGRAD algorithm: DGELU alone, the bias gradient after it
        PlanKey d = fused;
        d.epilogue = CUBLASLT_EPILOGUE_DGELU;
        d.vec_dtype = -1;
        d.align_vec = 256;
        Plan& dplan = plan_for(d, nullptr, aux_t.data);
        if (dplan.found) {
          run_plan(dplan, g, nullptr, aux_t.data);
          g_last.fused_epilogue = true;
          g_last.fallback_kernels = true;
          sum_rows(g.c, g.dbias_out, 0.f);
          return;
        }
      }
    }
    Plan& plan = plan_for(key, nullptr, nullptr);
    ENSURE(plan.found, op, ": cuBLASLt has no algorithm for (", m, " x ", k, ") @ (", k, " x ",
           n, "), trans_a=", g.trans_a, ", trans_b=", g.trans_b, ", c ", dtype_name(g.c.dtype),
           ", alignments a/b/c ", key.align_a, "/", key.align_b, "/", key.align_c,
           " bytes (heuristic status: ", cublasLtGetStatusString(plan.status), ")");
    run_plan(plan, g, nullptr, nullptr);
    if (!epilogue) return;
  }
  // Separate kernels: after the GEMM (c holds alpha AB + beta c), or instead of it (K = 0, or an
  // empty C: c = beta c + bias).
  g_last.fallback_kernels = true;
  if (m > 0 && n > 0 && (degenerate || bias || g.gelu)) {
    const float c_scale = degenerate ? g.beta : 1.f;
    if (g.c.dtype == DType::BF16) launch_epilogue<bf16_t>(g, m, n, c_scale);
    else launch_epilogue<float>(g, m, n, c_scale);
  }
  if (dgelu && m > 0 && n > 0) {  // c = c * gelu'(pre) in place, then its column sums
    gelu_backward(g.c, g.dgelu_input, g.c);
    if (dbias_out) sum_rows(g.c, g.dbias_out, 0.f);
  } else if (dbias_out && n > 0) {
    sum_rows(g.c, g.dbias_out, 0.f);  // no rows: zeros
  }
  // op(A)(i, k) summed over k: column sums of A stored (K, M), row sums of A stored (M, K).
  if (dbias_a) {
    if (g.trans_a) sum_rows(g.a, g.dbias_a, 0.f);
    else sum_columns(g.a, g.dbias_a, 0.f);
  }
  // op(B)(k, j) summed over k: column sums of B stored (K, N), row sums of B stored (N, K).
  if (dbias_b) {
    if (g.trans_b) sum_columns(g.b, g.dbias_b, 0.f);
    else sum_rows(g.b, g.dbias_b, 0.f);
  }
}

}  // namespace

void gemm(const GemmParams& p) {
  check_gemm(p, "gemm");
  check_dtypes(p, "gemm");
  run_gemm(p, "gemm");
}

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            const ops::MatmulOptions& options) {
  GemmParams p;
  p.a = a;
  p.trans_a = trans_a;
  p.b = b;
  p.trans_b = trans_b;
  p.c = c;
  p.alpha = options.alpha;
  p.beta = options.beta;
  p.bias = options.bias;
  p.gelu = options.gelu;
  p.gelu_input = options.gelu_input;
  p.dgelu_input = options.dgelu_input;
  p.dbias_out = options.dbias;
  p.c_in = options.addend;
  check_dtypes(p, "matmul");  // the rest ran before (ops/gemm.cpp)
  run_gemm(p, "matmul");
}

GemmLastCall gemm_last_call() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_last;
}

}  // namespace engine::cuda
