// Index math of the flash-attention kernels, shared by the device code and a CPU test
// (tests/kernels/attention/test_flash_layout.cpp) that emulates ldmatrix and mma.sync on it.
// Plain C++ (no CUDA types), so g++ can include it.
//
// Shared tiles: row-major, kCols bf16 per row (kCols a multiple of 64, so a row is a multiple of
// 128 bytes), stored in 16-byte chunks with the chunk index XOR-swizzled by the row:
//   byte(row, chunk) = row * 2 * kCols + 16 * (chunk ^ (row & 7))
// The 8 row addresses of one ldmatrix 8x8 matrix (rows r..r+7 at one logical chunk, r % 8 == 0)
// then land in 8 different 16-byte bank groups: no bank conflicts, for cp.async writes either.
//
// Warp operands of mma.sync.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16 x 16): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16 x 8):  b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16 x 8):  c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..2t+1]
// One ldmatrix.x4 loads a whole A fragment, or the B fragments of two adjacent n8 tiles; lanes
// 8q..8q+7 give the 8 row addresses of matrix q, which becomes register q. The four ways a
// tile can feed an operand (element (m, k) of A, (k, n) of B):
//   kA:      A[m][k] = tile[m0 + m][k]      ldmatrix        (Q, dO, dS as they are stored)
//   kATrans: A[m][k] = tile[k][m0 + m]      ldmatrix.trans  (P^T, dS^T)
//   kB:      B[k][n] = tile[n0 + n][k]      ldmatrix        (K, V in S = Q K^T, dP = dO V^T)
//   kBTrans: B[k][n] = tile[k][n0 + n]      ldmatrix.trans  (V in P V, dO, Q, K in dV, dK, dQ)
// lane_offset() is the byte offset a lane passes for the first fragment (mi or nj = 0, k step
// kk = 0); operand_offset() steps it: along the chunk axis by XOR (the per-lane part, the step
// and the tile offset occupy disjoint bits of the chunk index, see the precondition), along the
// row axis by adding whole rows, which leaves the swizzle (row & 7) unchanged.
// Precondition: the warp's tile offset m0 (n0) is a multiple of its extent (16 * MI or 8 * NI,
// MI and NI powers of two) and k offsets are 0, which every warp layout in the kernels meets.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FLASH_HD __host__ __device__ __forceinline__
#else
#define FLASH_HD inline
#endif

namespace engine::cuda::flash {

template <int kCols>
FLASH_HD constexpr uint32_t swizzle(int row, int chunk) {
  static_assert(kCols % 64 == 0, "swizzled tiles need rows of a multiple of 64 bf16");
  return static_cast<uint32_t>(row * 2 * kCols + 16 * (chunk ^ (row & 7)));
}

// Byte offset of element (row, col) (col need not be chunk-aligned): for fragment stores.
template <int kCols>
FLASH_HD constexpr uint32_t swizzle_elem(int row, int col) {
  return swizzle<kCols>(row, col >> 3) + 2 * (col & 7);
}

enum class Operand { kA, kATrans, kB, kBTrans };

// Byte offset lane `lane` passes to ldmatrix.x4 for the first fragment; `base` is m0 (A) or n0 (B).
template <Operand kOp, int kCols>
FLASH_HD constexpr uint32_t lane_offset(int base, int lane) {
  // Matrices in register order, kA: (m 0-7, k 0-7) (m 8-15, k 0-7) (m 0-7, k 8-15) (m 8-15, k 8-15)
  if constexpr (kOp == Operand::kA)
    return swizzle<kCols>(base + (lane & 15), lane >> 4);
  else if constexpr (kOp == Operand::kATrans)  // tile rows k, cols m; same matrix order as kA
    return swizzle<kCols>((lane & 7) + ((lane >> 4) << 3), (base >> 3) + ((lane >> 3) & 1));
  // kB: (n 0-7, k 0-7) (n 0-7, k 8-15) (n 8-15, k 0-7) (n 8-15, k 8-15)
  else if constexpr (kOp == Operand::kB)
    return swizzle<kCols>(base + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  else  // kBTrans: tile rows k, cols n; same matrix order as kB
    return swizzle<kCols>(lane & 15, (base >> 3) + (lane >> 4));
}

// Offset of fragment `i` (mi for A, the n8 pair nj for B) at k step `kk` (16 deep).
template <Operand kOp, int kCols>
FLASH_HD constexpr uint32_t operand_offset(uint32_t lane_off, int i, int kk) {
  constexpr uint32_t kRow16 = 16 * 2 * kCols;  // bytes of 16 rows
  if constexpr (kOp == Operand::kA || kOp == Operand::kB)
    return (lane_off ^ static_cast<uint32_t>(kk << 5)) + i * kRow16;  // k moves 2 chunks
  else
    return (lane_off ^ static_cast<uint32_t>(i << 5)) + kk * kRow16;  // m / n moves 2 chunks
}

// Row and column, within a warp's 16 x 8 C tile, of accumulator element e (0..3) of lane `lane`.
FLASH_HD constexpr int frag_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
FLASH_HD constexpr int frag_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }

// The f32 dQ accumulator of the backward: head-major (H, T, D), so that the rows of one q tile
// of one head are contiguous in memory (the kernel adds a whole tile with one bulk reduction
// from shared memory, staged in the same layout), and within a row the 16-byte chunks (4 f32)
// swizzled by the token: chunk d / 4 at position (d / 4) ^ dq_swizzle(t), which moves 32-byte
// chunk pairs by t mod 4. The kernel's fragment stores into the staging tile (8 bytes per lane,
// rows t .. t + 3 in each half-warp, 32 bytes per row at one chunk pair) then hit four
// different 32-byte bank groups per half-warp: free of bank conflicts. D a multiple of 32.
// Element (h, t, d) of the accumulator of T tokens is at (h T + t) D + dq_row_offset(t, d).
FLASH_HD constexpr int dq_swizzle(int64_t t) { return static_cast<int>(t & 3) << 1; }
FLASH_HD constexpr int dq_row_offset(int64_t t, int d) {
  return 4 * ((d >> 2) ^ dq_swizzle(t)) + (d & 3);
}
FLASH_HD constexpr int64_t dq_accum_index(int h, int64_t t, int d, int64_t T, int D) {
  return (h * T + t) * D + dq_row_offset(t, d);
}

// Backward launch order. The blocks (key tile n, pair) of the grid, pair = seq * Hkv + kv, run
// roughly in the order of their linear block index; they are handed out in sections of
// `section` pairs (the last section may be shorter), key tile outermost inside a section, so
// that the long causal key tiles (n = 0 first) of all pairs of a section start before the
// short ones (less tail at the end of the grid), while the q / dO / dQ rows that the blocks
// running at one time share stay within a few pairs (L2). The last `tail` sections (the short
// one included) form one: its longest key tiles then start with that much more work left to
// run beside them, where a small last section would leave its longest tile running alone at
// the end. A bijection of [0, n_tiles * pairs).
struct BwdBlock {
  int n_block;
  int64_t pair;
};
FLASH_HD constexpr BwdBlock bwd_block(int64_t linear, int n_tiles, int64_t pairs, int section,
                                      int tail = 1) {
  const int64_t per_section = static_cast<int64_t>(section) * n_tiles;
  const int64_t sections = (pairs + section - 1) / section;
  const int64_t regular = sections > tail ? sections - tail : 0;  // sections of `section` pairs
  int64_t sec = linear / per_section;
  if (sec > regular) sec = regular;
  const int64_t l = linear - sec * per_section;
  const int64_t first = sec * section;
  const int64_t size = sec < regular ? section : pairs - first;
  return {static_cast<int>(l / size), first + l % size};
}

}  // namespace engine::cuda::flash
