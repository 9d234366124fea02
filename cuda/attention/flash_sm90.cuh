// The wgmma instructions of the Hopper attention kernels (flash_sm90.cu, flash_bwd_sm90.cu), .cu
// only, sm_90a device code only (ENGINE_SM90A): m64nNk16, bf16 inputs, f32 accumulators in the
// wgmma fragment layout (thread t of the warpgroup, warp w = t / 32, lane l: rows 16 w + l / 4
// and + 8, columns 8 j + 2 (l % 4) and + 1 of every n8 block j, at d[4 j + 0, 1] and
// d[4 j + 2, 3]). A register A operand (k16 slice of 64 rows) is 4 bf16x2 registers in the same
// layout as the accumulators of the n8 blocks 2 kk and 2 kk + 1 of a product whose columns are
// the k dimension: a0 = rows l / 4, k 2 (l % 4) .. + 1; a1 = row + 8; a2, a3 = the same at k + 8.
// Shared operands are descriptors (cuda/common/sm90.cuh, 128-byte swizzle).
#pragma once
#include <cstdint>

#include "core/check.h"
#include "cuda/attention/flash_common.cuh"
#include "cuda/common/sm90.cuh"
#include "cuda/common/wgmma.cuh"

namespace engine::cuda::flash {

#ifdef ENGINE_SM90A

// The register A operands of kSteps k16 slices for this warp's 16 rows [r0, r0 + 16) of a tile
// in the kernels' layout (column blocks of 64 at c * tile_rows * 128 bytes, 128-byte rows, 16-byte
// chunks swizzled by the row), by ldmatrix: lanes 0-15 address rows r0 .. r0 + 15 at the slice's
// first 8 columns, lanes 16-31 the same rows at the next 8, giving a[kk] = {rows + 0 / + 8} x
// {columns + 0 / + 8} as the wgmma A fragment.
template <int kSteps>
__device__ __forceinline__ void ldmatrix_a(uint32_t (&a)[kSteps][4], uint32_t tile, int tile_rows, int r0,
                                           int lane) {
  const int r = r0 + (lane & 15);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const int chunk = 2 * (kk & 3) + (lane >> 4);
    ldmatrix_x4(a[kk], tile + (kk >> 2) * tile_rows * 128 + r * 128 + ((chunk ^ (r & 7)) << 4));
  }
}

// Stores one accumulator row of kBlocks n8 blocks (bf16) as 8-byte writes: pair(j) is this
// lane's packed pair of block j (columns 8 j + 2 (lane % 4) and + 1). Lanes 2 i and 2 i + 1 of a
// quad hold adjacent pairs; one exchange gives the even lane the pair after its own in block
// 2 jj and the odd lane the pair before its own in block 2 jj + 1. Every lane of the warp must
// call it (the exchange); `store` (uniform within a quad: one row) predicates the writes only.
template <int kBlocks, typename T, typename Pair>
__device__ __forceinline__ void store_row_pairs(T* row, bool store, int lane, Pair pair) {
  static_assert(kBlocks % 2 == 0, "pairs of n8 blocks");
  const bool odd = lane & 1;
#pragma unroll
  for (int jj = 0; jj < kBlocks / 2; ++jj) {
    const uint32_t mine0 = pair(2 * jj), mine1 = pair(2 * jj + 1);
    const uint32_t theirs = __shfl_xor_sync(0xffffffffu, odd ? mine0 : mine1, 1);
    const int col = odd ? 16 * jj + 8 + 2 * (lane & 3) - 2 : 16 * jj + 2 * (lane & 3);
    if (store) *reinterpret_cast<uint2*>(row + col) = odd ? make_uint2(theirs, mine1) : make_uint2(mine0, theirs);
  }
}

using sm90::wgmma_m64n128k16_ss;
using sm90::wgmma_m64n128k16_rs;
using sm90::wgmma_m64n64k16_rs;
using sm90::wgmma_m64n64k16_ss;
using sm90::wgmma_m64n64k16_ss_tt;
using sm90::wgmma_m64n32k16_ss_tt;

#endif  // ENGINE_SM90A

// Host: a bf16 matrix of `rows` rows of `row_elems` elements (a multiple of 64; 16-byte aligned
// base) as the 3-D tensor map (64 elements, row_elems / 64 column blocks, rows) the kernels load
// from, box (64, 1, box_rows), 128-byte swizzle, rows past the end zero-filled: one box is
// box_rows rows x 64 columns (one column block of one head), 128 bytes per row.
inline CUtensorMap column_block_map(const void* base, int64_t row_elems, int64_t rows,
                                    int box_rows, const char* op) {
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(row_elems / 64),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(row_elems) * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = sm90::tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box,
      elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ENSURE(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (", static_cast<int>(r), ")");
  return map;
}

}  // namespace engine::cuda::flash
