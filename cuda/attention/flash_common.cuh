// Shared pieces of the flash-attention kernels (.cu only): the kernel-side parameter block, the
// PTX wrappers (cp.async, ldmatrix, mma.sync m16n8k16 bf16 -> f32), the swizzled tile
// loader and the warp-level GEMM over shared tiles; the head-dim switch for the launcher; and
// the declarations of the per-head-dim runners (one .cu per instantiation).
// Index math lives in flash_layout.h (also tested on the CPU).
// FLASH_EMULATE (tests/kernels/attention/flash_emu.h only): the same kernel source compiled
// by g++ and run on the CPU by an emulator that supplies the CUDA built-ins and the wrappers.
#pragma once
#ifndef FLASH_EMULATE
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/attention/flash_layout.h"
#include "cuda/common/fast_math.cuh"

namespace engine::cuda::flash {

using bf16 = __nv_bfloat16;

// Everything a kernel reads; pointers are device memory. T query rows, Tk key rows, S sequences.
// Sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) (Lq of them) and key rows
// [cu_seqlens_k[s], cu_seqlens_k[s+1]) (Lk >= Lq); query i is at key position i + Lk - Lq.
// Without separate keys (ops::AttentionParams::kv unset) k points at the k heads of qkv and
// cu_seqlens_k == cu_seqlens_q (Lk = Lq). Either way a key row holds the Hkv k heads and then
// the Hkv v heads, so v = k + Hkv D and dv = dk + Hkv D (no pointers of their own).
// At most 128 bytes: a larger by-value kernel parameter is not promoted to registers by the
// compiler (NVVM), which then neither specialises the loops on causal / window nor keeps the
// D = 128 backward within 255 registers without spills (as its code size and spills show).
struct Params {
  const bf16* q;                // q head 0 of query row 0, row stride q_row   (T rows)
  const bf16* k;                // k head 0 of key row 0, row stride kv_row    (Tk rows)
  bf16* out;                    // (T, H, D)
  float* lse;                   // (T, H) natural-log log-sum-exp of scale * q.k
  const int32_t* cu_seqlens_q;  // (S + 1) query row offsets
  const int32_t* cu_seqlens_k;  // (S + 1) key row offsets
  const bf16* dout;             // (T, H, D)                                 backward only
  bf16* dq;                     // like q (the q heads of dqkv): written by the fallback
                                // (the mma path converts dq_accum in the launcher) backward
  bf16* dk;                     // like k, row stride kv_row                 backward only
  float* dq_accum;              // (H, T, D) f32, zeroed, layout dq_accum_index (flash_layout.h):
                                //                         backward, mma path only
  float* dsum;                  // (T, H) f32 rowsum(dout * out), backward only
  int q_row;                    // elements per query row of qkv / dqkv: (H + 2*Hkv) * D
  int kv_row;                   // elements per key row: q_row, or 2*Hkv*D with separate keys
  int num_heads, num_kv_heads, head_dim;  // H, Hkv, D
  float scale;                  // softmax scale (exponentials use ex2: scale * log2(e))
  int window;                   // 0 = unlimited
  int num_tokens;               // T                                         backward
  int bwd_section;              // launch order: pairs per section (bwd_block, flash_layout.h),
                                // >= 1, set by run_flash_bwd                backward, mma path
  bool causal;
};
static_assert(sizeof(Params) <= 128, "kernel parameters past 128 bytes slow the kernels down");

// What the runners size their grids from (host only; the kernels use gridDim).
struct Grid {
  int num_seqs;      // S (grid z)
  int max_seqlen_q;  // >= every Lq
  int max_seqlen_k;  // >= every Lk
};

constexpr int kFallbackMaxHeadDim = 256;  // largest head dim of the f32 fallback kernels

// ---- PTX wrappers -------------------------------------------------------------------------
#ifndef FLASH_EMULATE

#define FLASH_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#define FLASH_UNROLL _Pragma("unroll")

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; zero-fills the destination when !valid (src must
// still be a mapped address).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one 16 x 8 x 16 tile, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Bulk asynchronous reduction (the copy engine, sm_90): adds `bytes` (a multiple of 16) of f32
// from shared memory at src into global memory at dst (both 16-byte aligned), each element
// atomically (relaxed, gpu scope), rounded to nearest, like red.global.add.f32. Tracked per
// thread in bulk groups: the shared source may be written again once bulk_wait_read() has
// returned in the issuing thread (and a barrier orders that before the other threads' writes);
// bulk_wait() also waits for the global writes. Shared memory written with ordinary stores must
// be made visible to the copy engine (the async proxy) with fence_proxy_async() in each writing
// thread before the barrier that precedes the issue.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
      "r"(src), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int kPending = 0>  // this thread's bulk groups that may still be reading
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Two f32 to shared memory (8-byte aligned), as one st.shared.v2.f32.
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b));
}

// threadIdx.x, read afresh: a volatile asm is never hoisted out of a loop, so values derived
// from it inside the loop are recomputed there (a few integer ops) instead of being kept in
// registers across it, where they could only be spilled.
__device__ __forceinline__ int thread_x() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

#endif  // FLASH_EMULATE

// Two floats as a bf16x2 register (lo in the low half: the lower k / column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, sizeof r);
  return r;
}

// ---- Tiles and warp GEMMs ---------------------------------------------------------------------

// Copies rows [0, kRows) x kCols of a global matrix (row stride `stride` elements) into a
// swizzled shared tile with cp.async; rows >= rows_valid are zero-filled (row 0 must be valid).
// A thread always copies the same chunk column, kRows / kStep rows apart (kStep a multiple of
// 8, so the swizzle is the same for all its rows): one running pointer, constant smem steps.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile_async(uint32_t s_tile, const bf16* g, int64_t stride,
                                                int rows_valid, int tid) {
  constexpr int kChunks = kCols / 8;
  constexpr int kStep = kThreads / kChunks;  // rows between one thread's chunks
  static_assert(kThreads % kChunks == 0 && kStep % 8 == 0 && kRows % kStep == 0,
                "tile chunks must split evenly over threads");
  const int r0 = tid / kChunks, c = tid % kChunks;
  const uint32_t dst = s_tile + swizzle<kCols>(r0, c);
  const bf16* src = g + r0 * stride + c * 8;
  const int64_t step = kStep * stride;
  FLASH_UNROLL
  for (int it = 0; it < kRows / kStep; ++it) {
    const bool valid = r0 + it * kStep < rows_valid;
    cp_async_16(dst + it * kStep * kCols * 2, valid ? src : g, valid);
    src += step;
  }
}

// acc[MI][NI] (16 x 8 tiles) += A (16 MI x K) * B (K x 8 NI), both read from swizzled shared
// tiles with ldmatrix: A from a_tile (kACols per row) at warp offset m0, B from b_tile at n0,
// in the ways named by kAOp / kBOp (flash_layout.h). K is the full reduction depth.
template <int MI, int NI, int K, Operand kAOp, int kACols, Operand kBOp, int kBCols>
__device__ __forceinline__ void warp_gemm(float (&acc)[MI][NI][4], uint32_t a_tile, int m0,
                                          uint32_t b_tile, int n0, int lane) {
  static_assert(NI % 2 == 0 && K % 16 == 0, "n8 tiles come in pairs, K in steps of 16");
  static_assert(kAOp == Operand::kA || kAOp == Operand::kATrans, "A operand");
  static_assert(kBOp == Operand::kB || kBOp == Operand::kBTrans, "B operand");
  const uint32_t a_off = lane_offset<kAOp, kACols>(m0, lane);
  const uint32_t b_off = lane_offset<kBOp, kBCols>(n0, lane);
  FLASH_UNROLL
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t a[MI][4];
    FLASH_UNROLL
    for (int mi = 0; mi < MI; ++mi) {
      const uint32_t addr = a_tile + operand_offset<kAOp, kACols>(a_off, mi, kk);
      if constexpr (kAOp == Operand::kA)
        ldmatrix_x4(a[mi], addr);
      else
        ldmatrix_x4_trans(a[mi], addr);
    }
    FLASH_UNROLL
    for (int nj = 0; nj < NI / 2; ++nj) {
      uint32_t b[4];
      const uint32_t addr = b_tile + operand_offset<kBOp, kBCols>(b_off, nj, kk);
      if constexpr (kBOp == Operand::kB)
        ldmatrix_x4(b, addr);
      else
        ldmatrix_x4_trans(b, addr);
      FLASH_UNROLL
      for (int mi = 0; mi < MI; ++mi) {
        mma_bf16(acc[mi][2 * nj], a[mi], b[0], b[1]);
        mma_bf16(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

template <int MI, int NI>
__device__ __forceinline__ void zero(float (&acc)[MI][NI][4]) {
  FLASH_UNROLL
  for (int i = 0; i < MI; ++i)
    FLASH_UNROLL
    for (int j = 0; j < NI; ++j)
      FLASH_UNROLL
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// ---- Runners (one explicit instantiation per .cu) and the head-dim switch -------------------

#ifndef FLASH_EMULATE
template <int kD> void run_flash_fwd(const Params& p, const Grid& g, cudaStream_t stream);
template <int kD> void run_flash_bwd(const Params& p, const Grid& g, cudaStream_t stream);
extern template void run_flash_fwd<64>(const Params&, const Grid&, cudaStream_t);
extern template void run_flash_fwd<128>(const Params&, const Grid&, cudaStream_t);
extern template void run_flash_bwd<64>(const Params&, const Grid&, cudaStream_t);
extern template void run_flash_bwd<128>(const Params&, const Grid&, cudaStream_t);

// Simple fp32 kernels for every other head dim (flash_fallback.cu).
void run_fallback_fwd(const Params& p, const Grid& g, cudaStream_t stream);
void run_fallback_bwd(const Params& p, const Grid& g, cudaStream_t stream);  // needs p.dsum

// The Hopper forward (flash_sm90.cu: wgmma, TMA, warp specialisation), sm_90a builds on
// compute capability 9.0 devices only. available: the kernel of this head dim (64, 128) runs
// here; eligible: available, and the call has no separate keys (k is qkv's, cu_seqlens_k is
// cu_seqlens_q) and a 16-byte aligned qkv (out needs no alignment: 4-byte stores).
bool flash_fwd_sm90_available(int head_dim);
bool flash_fwd_sm90_eligible(const Params& p, const Grid& g);
void run_flash_fwd_sm90(const Params& p, const Grid& g, cudaStream_t stream);
// The SM count, the size of the sm90 kernels' persistent grids (one block per SM taking work
// items, q tiles forward and key tiles backward, from a counter).
int sm90_sm_count();
// The Hopper backward (flash_bwd_sm90.cu), the same conditions (and a 16-byte aligned dout);
// replaces run_flash_bwd<D> between flash.cu's dsum and dq_convert kernels.
bool flash_bwd_sm90_available(int head_dim);
bool flash_bwd_sm90_eligible(const Params& p, const Grid& g);
void run_flash_bwd_sm90(const Params& p, const Grid& g, cudaStream_t stream);

// True for the head dims with an mma.sync kernel.
constexpr bool has_mma_path(int d) { return d == 64 || d == 128; }

// Calls f(std::integral_constant<int, D>{}) for an mma head dim (has_mma_path(d) must hold).
template <typename F>
void head_dim_switch(int d, F&& f) {
  if (d == 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}
#endif  // FLASH_EMULATE

}  // namespace engine::cuda::flash
