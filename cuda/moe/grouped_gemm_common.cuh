// Device helpers shared by the grouped GEMM kernels (.cu only): mma.sync (grouped_gemm.cu) and
// wgmma (grouped_gemm_sm90*.cu). Expert row ranges, weight rows of stacked expert matrices,
// swizzled cp.async tile loads, the tile -> expert search; and the Hopper products' entry points.
#pragma once
#include <cstdint>

#include "cuda/attention/flash_common.cuh"
#include "ops/moe.h"

namespace engine::cuda::grouped {

using gbf16 = __nv_bfloat16;

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// A bf16 (or f32) matrix addressed by rows, made of stacks of `stack_rows` rows (0: one stack);
// row r is row first + r of the stacked whole.
template <typename T>
struct RowMatrix {
  T* p;
  int64_t ld;            // elements per row
  int64_t stack_rows;    // rows per stack; 0: a single stack
  int64_t stack_stride;  // elements between stacks
  int64_t first = 0;
  __device__ __forceinline__ T* row(int64_t r) const {
    r += first;
    if (stack_rows == 0) return p + r * ld;
    const int64_t s = r / stack_rows;
    return p + s * stack_stride + (r - s * stack_rows) * ld;
  }
  // The rows from r0 on; when the next `rows` of them lie in one stack, as a plain matrix (row
  // addresses without a division).
  __device__ __forceinline__ RowMatrix from(int64_t r0, int64_t rows) const {
    if (stack_rows != 0) {
      const int64_t a = first + r0, s = a / stack_rows;
      if (a - s * stack_rows + rows <= stack_rows) return {row(r0), ld, 0, 0, 0};
      return {p, ld, stack_rows, stack_stride, a};
    }
    return {p + (first + r0) * ld, ld, 0, 0, 0};
  }
};

// Expert e's weight matrix W_e (N, K) inside w (S, E, N/S, K).
template <typename T>
__device__ __forceinline__ RowMatrix<T> expert_weight(T* w, int e, int experts, int64_t n_per_stack,
                                                      int64_t k, int64_t stacks) {
  return {w + int64_t{e} * n_per_stack * k, k, stacks > 1 ? n_per_stack : 0,
          int64_t{experts} * n_per_stack * k};
}

// Rows [0, kRows) x columns [c0, c0 + kCols) of m -> swizzled shared tile (cp.async, 16 bytes
// per copy, kThreads threads). Tile rows >= rows_valid and columns >= cols are zero-filled (cols
// a multiple of 8). kCols = 64 gives exactly the 128-byte swizzle wgmma reads (row r at 128 r
// bytes, 16-byte chunk c at c ^ (r % 8)) when the tile starts on 1024 bytes. `m` is usually
// m.from(r0, kRows) of the whole operand.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile(uint32_t s_tile, const RowMatrix<const gbf16>& m,
                                          int64_t rows_valid, int64_t c0, int64_t cols, int tid) {
  constexpr int kChunks = kCols / 8;
  constexpr int kStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kStep == 0, "chunks split over threads");
  const int rr = tid / kChunks, c = tid % kChunks;
  const bool col_ok = c0 + c * 8 < cols;
#pragma unroll
  for (int it = 0; it < kRows / kStep; ++it) {
    const int r = rr + it * kStep;
    const bool valid = col_ok && r < rows_valid;
    const gbf16* src = valid ? m.row(r) + c0 + c * 8 : m.p;
    flash::cp_async_16(s_tile + flash::swizzle<kCols>(r, c), src, valid);
  }
}

// The expert owning the row tile starting at row0 (offsets_e a multiple of the tile height):
// the last expert starting at or before row0 (an empty expert shares its start with the next
// one, which then wins), and the rows of the tile that expert owns (<= 0: none, exit).
struct TileExpert {
  int e;
  int64_t rows_valid;
};
__device__ __forceinline__ TileExpert tile_expert(const int32_t* offsets, const int32_t* counts,
                                                  int experts, int64_t row0) {
  if (row0 >= offsets[experts]) return {0, 0};
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= row0) lo = mid;
    else hi = mid - 1;
  }
  return {lo, int64_t{offsets[lo]} + counts[lo] - row0};
}

// Triton's grouped raster: blocks walk row tiles in groups of group_m, the column tile outer
// within a group, so the blocks running together share A rows and B columns in L2.
__device__ __forceinline__ void raster(int block, int group_m, int tiles_m, int tiles_n, int& tm,
                                       int& tn) {
  const int per_group = group_m * tiles_n;
  const int group = block / per_group, in_group = block % per_group;
  const int first_m = group * group_m;
  const int group_size = min(tiles_m - first_m, group_m);
  tm = first_m + in_group % group_size;
  tn = in_group / group_size;
}

// The products on Hopper's wgmma (grouped_gemm_sm90_launch.cu), all arguments checked by the
// caller. Each returns false where it ran nothing: the caller then runs the mma.sync kernel.
struct ForwardArgs {
  const gbf16* x;          // (R, K); dgrad: dy (R, N)
  const gbf16* w;          // (S, E, N/S, K)
  gbf16* y;                // (R, N); dgrad: dx (R, K)
  const int32_t* offsets;  // (E + 1)
  const int32_t* counts;   // (E)
  int experts;
  int64_t rows, n, k, n_per_stack, stacks;  // n, k: W_e is (N, K)
};
// Whether the persistent TMA kernel is built for this device and can run: sm_90a code in the
// binary, a compute capability 9.0 GPU, the driver's cuTensorMapEncodeTiled.
bool tma_available();
// The forward: the TMA kernel where it takes the shapes (one weight stack or N/S % 64 == 0,
// K, N > 0, R, K, N inside int), else the cp.async wgmma kernel where that is built for the
// device; false when neither is.
bool forward_sm90(const ForwardArgs& a);
// The input gradient dx = dy W_e on the TMA kernel, W_e read MN-major (no transposed copy),
// under the forward's shape rule; false when not available or the shapes are not taken.
bool dgrad_sm90(const ForwardArgs& a);

// The weight gradient on the TMA kernel, dy and x read MN-major straight from the row buffers
// (no copies), every shape (R, K, N inside int). False when the kernel is not available.
struct WgradArgs {
  const gbf16* dy;         // (R, N)
  const gbf16* x;          // (R, K)
  float* dw;               // (S, E, N/S, K), +=
  const int32_t* offsets;  // (E + 1)
  const int32_t* counts;   // (E)
  int experts;
  int64_t rows, n, k, n_per_stack, stacks;
};
bool wgrad_sm90(const WgradArgs& a);

}  // namespace engine::cuda::grouped
