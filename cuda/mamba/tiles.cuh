// Block-level building blocks of the chunked linear-mixer kernels (the Mamba-2 scan, ssd*.cu, and
// the Gated DeltaNet kernels, delta*.cu; .cu only): tensor-core products of tiles in shared
// memory, tile loads with zero padding, shared-memory carving, an ordered block sum. Blocks have
// kThreads threads (8 warps).
#pragma once
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "cuda/mamba/common.cuh"

namespace engine::cuda::tiles {

using mamba::bf;
namespace wmma = nvcuda::wmma;

constexpr int kThreads = 256;   // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kPadB = 8;        // bf16 row padding (16 bytes: wmma's ld multiple, fewer bank conflicts)
constexpr int kPadF = 4;        // f32 row padding

// C (M x N, f32, row-major, ldc; shared or global memory) = scale Cin + A (M x K) B (K x N), A
// and B bf16 in shared memory in the given wmma layouts (row_major: element (r, k) at r ld + k;
// col_major: at k ld + r); Cin is C unless given (same ldc). scale 0 starts from zeros (never
// reads Cin). The block's warps take the 16 x 16 output tiles in turn (the same warp the same
// tile in every call of one shape); callers synchronise around it.
template <int M, int N, int K, typename LA, typename LB>
__device__ __forceinline__ void tile_mma(const bf16_t* A, int lda, const bf16_t* B, int ldb, float* C, int ldc,
                                         float scale, const float* Cin = nullptr) {
  if (!Cin) Cin = C;
  constexpr bool a_row = std::is_same_v<LA, wmma::row_major>, b_row = std::is_same_v<LB, wmma::row_major>;
  const int warp = threadIdx.x / 32;
  for (int tile = warp; tile < (M / 16) * (N / 16); tile += kWarps) {
    const int tm = tile / (N / 16) * 16, tn = tile % (N / 16) * 16;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if (scale == 0.f) {
      wmma::fill_fragment(acc, 0.f);
    } else {
      wmma::load_matrix_sync(acc, Cin + tm * ldc + tn, ldc, wmma::mem_row_major);
      if (scale != 1.f)
        for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= scale;
    }
#pragma unroll 4
    for (int k = 0; k < K; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, LA> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, LB> fb;
      wmma::load_matrix_sync(fa, a_row ? A + tm * lda + k : A + k * lda + tm, lda);
      wmma::load_matrix_sync(fb, b_row ? B + k * ldb + tn : B + tn * ldb + k, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(C + tm * ldc + tn, acc, ldc, wmma::mem_row_major);
  }
}
using RowM = wmma::row_major;
using ColM = wmma::col_major;

// dst[r][c] (bf16, ld) for r < ROWS, c < COLS: src[(t0 + r) ld_src + col0 + c] times row_scale[r]
// (nullptr: 1) where r < rows and c < width, else 0. Each thread takes groups of 8 columns: one
// 16-byte load where the rows are 16-byte aligned (ld_src a multiple of 8) and the group lies
// inside width, else 8 scalar loads; all of a thread's loads are issued before its stores (the
// compiler could not move a load past a store that might alias it), so their latencies overlap.
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile(bf16_t* __restrict__ dst, int ld, const bf16_t* __restrict__ src,
                                          int64_t ld_src, int64_t t0, int64_t rows, int64_t col0, int width,
                                          const float* row_scale) {
  static_assert(COLS % 8 == 0, "tiles are whole groups of 8 columns");
  constexpr int kGroups = ROWS * COLS / 8, kPer = (kGroups + kThreads - 1) / kThreads;
  const bf16_t* base = src + t0 * ld_src + col0;
  const bool vec = ld_src % 8 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
  uint4 v[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int g = threadIdx.x + e * kThreads, r = g / (COLS / 8), c = g % (COLS / 8) * 8;
    v[e] = make_uint4(0, 0, 0, 0);
    if (g >= kGroups || r >= rows || c >= width) continue;
    const bf16_t* at = base + r * ld_src + c;
    if (vec && c + 8 <= width) {
      v[e] = __ldg(reinterpret_cast<const uint4*>(at));
    } else {
      bf16_t* w = reinterpret_cast<bf16_t*>(&v[e]);
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = c + j < width ? at[j] : __float2bfloat16(0.f);
    }
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int g = threadIdx.x + e * kThreads, r = g / (COLS / 8), c = g % (COLS / 8) * 8;
    if (g >= kGroups) continue;
    if (row_scale && r < rows) {
      bf16_t* w = reinterpret_cast<bf16_t*>(&v[e]);
      const float f = row_scale[r];
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = __float2bfloat16(bf(w[j]) * f);
    }
    *reinterpret_cast<uint4*>(dst + r * ld + c) = v[e];
  }
}

// 16 bytes global -> shared, asynchronous (cp.async; zero-fills the destination when !valid, src
// still a mapped address); the wait for all of this thread's copies.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

// load_tile without a row scale, asynchronous where every group is a whole aligned 16 bytes
// (ld_src and width multiples of 8, the rows 16-byte aligned): the copies are in flight until
// cp_async_wait_all() and a barrier, so the caller can work meanwhile. Otherwise it is load_tile
// (done on return).
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile_async(bf16_t* dst, int ld, const bf16_t* src, int64_t ld_src, int64_t t0,
                                                int64_t rows, int64_t col0, int width) {
  const bf16_t* base = src + t0 * ld_src + col0;
  if (ld_src % 8 != 0 || width % 8 != 0 || reinterpret_cast<uintptr_t>(base) % 16 != 0)
    return load_tile<ROWS, COLS>(dst, ld, src, ld_src, t0, rows, col0, width, nullptr);
  constexpr int kGroups = ROWS * COLS / 8;
#pragma unroll
  for (int e = 0; e < (kGroups + kThreads - 1) / kThreads; ++e) {
    const int g = threadIdx.x + e * kThreads, r = g / (COLS / 8), c = g % (COLS / 8) * 8;
    if (g >= kGroups) continue;
    const bool valid = r < rows && c < width;
    cp_async_16(dst + r * ld + c, valid ? base + r * ld_src + c : base, valid);
  }
}

// Shared-memory carving: `count` elements of T at the next 128-byte boundary.
struct Carve {
  unsigned char* p;
  template <typename T> __device__ __forceinline__ T* take(int64_t count) {
    T* out = reinterpret_cast<T*>(p);
    p += (count * static_cast<int64_t>(sizeof(T)) + 127) / 128 * 128;
    return out;
  }
};
constexpr size_t carve_bytes(size_t bytes) { return (bytes + 127) / 128 * 128; }

// The sum of v over the block, in the same order every call (every thread gets it; red holds
// kWarps floats; callers need no barrier before).
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += red[w];
  return s;
}

// Raises the kernel's dynamic shared memory limit to `bytes`.
template <typename Kernel> void allow_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace engine::cuda::tiles
