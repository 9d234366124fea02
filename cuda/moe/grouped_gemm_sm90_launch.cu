// The Hopper grouped GEMMs' host side (the persistent TMA kernel and its launch:
// grouped_gemm_sm90.cu; the cp.async forward kernel: grouped_gemm_sm90_cp_async.cu): the TMA
// kernel's tensor maps (128-byte swizzle, operands read MN-major by the backward products through
// the same maps), its shape rules, its units, and the entry points grouped_gemm.cu calls
// (grouped_gemm_common.cuh).
#include "core/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/sm90.cuh"
#include "cuda/moe/grouped_gemm_common.cuh"
#include "cuda/moe/grouped_gemm_sm90.cuh"

namespace engine::cuda::grouped {
namespace {

using namespace wgmma_detail;

// cuTensorMapEncodeTiled from the driver (no link against libcuda); nullptr where absent.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() { return sm90::tensor_map_encoder(); }

// A tensor map (bf16 unless `type`) in the 128-byte swizzle: dims and box innermost first,
// strides in bytes.
CUtensorMap tensor_map(const void* p, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                       const cuuint32_t* box,
                       CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16) {
  CUtensorMap m;
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&m, type, static_cast<cuuint32_t>(rank),
                                 const_cast<void*>(p), dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ENSURE(r == CUDA_SUCCESS, "grouped linear: cuTensorMapEncodeTiled failed (", static_cast<int>(r), ")");
  return m;
}

// (rows, cols) row-major bf16 as the 2-D map (cols, rows), box (64, box_rows).
CUtensorMap matrix_map(const void* p, int64_t rows, int64_t cols, cuuint32_t box_rows) {
  const cuuint64_t d[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t st[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t b[2] = {kBK, box_rows};
  return tensor_map(p, 2, d, st, b);
}

// w (S, E, N/S, K) as the 3-D map (K, N/S, S E), box (64, 64, 1).
CUtensorMap weight_map(const void* w, int64_t k, int64_t n_per_stack, int64_t stacks, int experts) {
  const cuuint64_t d[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(n_per_stack),
                           static_cast<cuuint64_t>(stacks * experts)};
  const cuuint64_t st[2] = {static_cast<cuuint64_t>(k) * 2, static_cast<cuuint64_t>(n_per_stack * k) * 2};
  const cuuint32_t b[3] = {kBK, kBox, 1};
  return tensor_map(w, 3, d, st, b);
}

// dW (S, E, N/S, K) f32 as the 3-D map (K, N/S, S E), box (32, 64, 1): 128-byte rows in the
// 128-byte swizzle, the weight gradient's TMA epilogue.
CUtensorMap dw_map(float* dw, int64_t k, int64_t n_per_stack, int64_t stacks, int experts) {
  const cuuint64_t d[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(n_per_stack),
                           static_cast<cuuint64_t>(stacks * experts)};
  const cuuint64_t st[2] = {static_cast<cuuint64_t>(k) * 4, static_cast<cuuint64_t>(n_per_stack * k) * 4};
  const cuuint32_t b[3] = {32, kBox, 1};
  return tensor_map(dw, 3, d, st, b, CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The TMA kernel takes the forward / dgrad's shapes: one weight stack or N/S % 64 == 0 (each
// 64-row weight box in one stack), K, N > 0, and R, K, N inside int.
bool tma_eligible(const ForwardArgs& a) {
  return tma_available() && (a.stacks == 1 || a.n_per_stack % kBox == 0) && a.rows <= INT32_MAX &&
         a.k > 0 && a.k <= INT32_MAX && a.n > 0 && a.n <= INT32_MAX;
}

// Tiles and units of a forward / dgrad launch: R rows, `out_cols` output columns.
TmaParams rows_params(const ForwardArgs& a, void* out, int64_t out_cols, int64_t red) {
  TmaParams p{};
  p.offsets = a.offsets;
  p.counts = a.counts;
  p.out = out;
  p.experts = a.experts;
  p.out_cols = out_cols;
  p.red = red;
  p.m_rows = a.rows;
  p.n_per_stack = a.n_per_stack;
  p.stacks = a.stacks;
  const int64_t tiles_m = ceil_div(a.rows, kBM), tiles_n = ceil_div(out_cols, kBN);
  const int64_t pairs = ceil_div(tiles_m, 2);
  ENSURE(pairs * tiles_n < INT32_MAX, "grouped linear: ", a.rows, " rows x ", out_cols,
         " columns: too many tiles");
  p.tiles_m = static_cast<int>(tiles_m);
  p.tiles_n = static_cast<int>(tiles_n);
  p.pairs_m = static_cast<int>(pairs);
  p.units = static_cast<int>(pairs * tiles_n);
  return p;
}

}  // namespace

bool tma_available() {
  static const bool ok = [] {
    if (!cp_async_available() || encode_fn() == nullptr) return false;
    tma_allow_smem();
    return true;
  }();
  return ok;
}

bool forward_sm90(const ForwardArgs& a) {
  if (tma_eligible(a)) {
    if (a.rows == 0) return true;
    const CUtensorMap mx = matrix_map(a.x, a.rows, a.k, kBM);
    const CUtensorMap mw = weight_map(a.w, a.k, a.n_per_stack, a.stacks, a.experts);
    launch_tma(kFwd, mx, mw, mx, false, rows_params(a, a.y, a.n, a.k));
    return true;
  }
  if (!cp_async_available()) return false;
  const int64_t tiles_m = ceil_div(a.rows, kBM), tiles_n = ceil_div(a.n, kBN);
  if (tiles_m > 0 && tiles_n > 0) cp_async_forward(a, tiles_m, tiles_n);
  return true;
}

bool dgrad_sm90(const ForwardArgs& a) {
  if (!tma_eligible(a)) return false;
  if (a.rows == 0) return true;
  const CUtensorMap mdy = matrix_map(a.x, a.rows, a.n, kBM);
  const CUtensorMap mw = weight_map(a.w, a.k, a.n_per_stack, a.stacks, a.experts);
  launch_tma(kDgrad, mdy, mw, mdy, false, rows_params(a, a.y, a.k, a.n));
  return true;
}

bool wgrad_sm90(const WgradArgs& a) {
  if (!tma_available() || a.rows > INT32_MAX || a.k > INT32_MAX || a.n > INT32_MAX) return false;
  if (a.rows == 0 || a.k == 0 || a.n == 0 || a.experts == 0) return true;
  TmaParams p{};
  p.offsets = a.offsets;
  p.counts = a.counts;
  p.out = a.dw;
  p.experts = a.experts;
  p.out_cols = a.k;
  p.red = 0;
  p.m_rows = a.n;
  p.n_per_stack = a.n_per_stack;
  p.stacks = a.stacks;
  const int64_t tiles_m = ceil_div(a.n, kBM), tiles_n = ceil_div(a.k, kBN), pairs = ceil_div(tiles_m, 2);
  ENSURE(a.experts * pairs * tiles_n < INT32_MAX, "grouped linear: too many weight-gradient tiles");
  p.tiles_m = static_cast<int>(tiles_m);
  p.tiles_n = static_cast<int>(tiles_n);
  p.pairs_m = static_cast<int>(pairs);
  p.units = static_cast<int>(a.experts * pairs * tiles_n);
  const CUtensorMap mdy = matrix_map(a.dy, a.rows, a.n, kBox), mx = matrix_map(a.x, a.rows, a.k, kBox);
  // The TMA reduction where each warpgroup's 64 rows of dW lie in one stack.
  const bool epi = aligned16(a.dw) && (a.stacks == 1 || a.n_per_stack % kBox == 0);
  const CUtensorMap mdw = epi ? dw_map(a.dw, a.k, a.n_per_stack, a.stacks, a.experts) : mdy;
  launch_tma(kWgrad, mdy, mx, mdw, epi, p);
  return true;
}

}  // namespace engine::cuda::grouped
