// Hopper (sm_90a) primitives shared by the wgmma kernels (.cu only): the warpgroup MMA fences and
// group waits, shared-memory matrix descriptors for the 128-byte swizzle, mbarriers, and TMA bulk
// tensor loads (cp.async.bulk.tensor) completing on an mbarrier; on the host, the driver's
// cuTensorMapEncodeTiled (through the runtime's entry-point query: no link against libcuda);
// thread block clusters: rank, cluster barrier, remote mbarrier arrivals, TMA multicast.
// Users: cuda/moe/grouped_gemm_sm90.cu, cuda/attention/flash_sm90.cu.
//
// The device functions exist only where the sm_90a features are compiled in (ENGINE_SM90A, set
// by the capability layer, cuda/common/arch.cuh, in the device pass for compute_90a); kernels
// guard their bodies with it, so the same source still builds for other architectures (the
// kernels are then empty and the launchers' availability checks, arch::current().wgmma, refuse
// them).
//
// The 128-byte swizzle (TMA CU_TENSOR_MAP_SWIZZLE_128B, wgmma swizzle mode 1): a tile of rows of
// 64 bf16 (128 bytes), row r at 128 r bytes, its 16-byte chunk c stored at chunk c ^ (r % 8);
// tiles start on 1024 bytes (the pattern repeats every 8 rows). Descriptors:
//   K-major operand (the reduction dimension along the 128-byte rows): 8-row groups 1024 bytes
//     apart (stride byte offset); a k16 step moves the start address by 32 bytes.
//   MN-major operand (rows run along the reduction dimension, the 64 elements of a row along M or
//     N): 8-row groups (8 steps of k) 1024 bytes apart (stride byte offset); the next 64 columns
//     of M or N at `lbo` bytes (leading byte offset); a k16 step moves the start by 2048 bytes.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/arch.cuh"

namespace engine::cuda::sm90 {

// Whether a warp-specialised block of `threads` threads (warpgroups of 128) can run its
// warpgroups at these register counts after setmaxnreg (`regs_per_128`: the sum over the
// warpgroups). setmaxnreg only moves registers between the block's warpgroups: the block keeps
// what it was launched with, 65536 / threads a thread rounded down to the allocation unit of 8
// (384 threads: 168, 64512 in all), and an inc that asks for more than the others gave up waits
// for ever (a hang, not an error: 24 + 2 x 240 raised to 32 + 2 x 240 = 65536 hangs).
constexpr bool setmaxnreg_fits(int threads, int regs_per_128) {
  return 128 * regs_per_128 <= threads * (65536 / threads / 8 * 8);
}

#ifdef ENGINE_SM90A
// Shared-memory matrix descriptor, 128-byte swizzle, 1024 bytes between 8-row groups; lbo: bytes
// between 64-column blocks of an MN-major operand (unused by K-major ones: pass 16).
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr, uint32_t lbo) {
  uint64_t d = (addr & 0x3FFFF) >> 4;
  d |= uint64_t{(lbo & 0x3FFFF) >> 4} << 16;  // leading byte offset
  d |= uint64_t{1024 >> 4} << 32;             // stride byte offset
  d |= uint64_t{1} << 62;                     // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N of this warpgroup's committed wgmma groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads / writes of registers an asynchronous wgmma writes
// (accumulators) or reads (A fragments) across the wgmma_wait that retires it: after the wait,
// these registers are "redefined" here.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Moves registers between the warpgroups of a warp-specialised block (all threads of a warpgroup
// execute it): the block is compiled for its thread count's share, a producer gives up
// registers (dec) and the consumers take them (inc); N a multiple of 8 in [24, 256].
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Barrier `id` (1 .. 15; 0 is __syncthreads) over `threads` threads (a multiple of 32) of the
// block.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- mbarriers ----------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// After the inits, before the barrier that publishes them (one thread).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the barrier's phase `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- TMA: a box of a tensor map -> shared memory, completing its bytes on the mbarrier --------
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// ---- Clusters (thread block clusters of CTAs sharing distributed shared memory) ---------------
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster (exited threads aside) arrives, then waits: release /
// acquire at cluster scope (e.g. mbarrier inits published to the peers, or no CTA leaving while a
// peer may still write into its shared memory).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The shared::cluster address of the variable at shared::cta address `addr` in CTA `rank`.
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// One arrival on an mbarrier of any CTA of the cluster (a mapa_shared address). Default
// semantics (release, CTA scope) as CUTLASS's cluster barrier uses for the consumer -> producer
// "stage free" signal: the stage's readers are wgmma, already retired by wgmma_wait; the
// .release.cluster form would add a GPU-wide memory barrier to every arrival.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// TMA multicast: the box lands at the same shared-memory offset `dst` in every CTA of `mask`
// (bit r: cluster rank r) and completes its bytes on the mbarrier at offset `bar` of each.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int c0,
                                                      int c1, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map, int c0,
                                                      int c1, int c2, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}
#endif  // ENGINE_SM90A

// ---- Host --------------------------------------------------------------------------------------
// cuTensorMapEncodeTiled from the driver; nullptr where absent.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A compute capability 9.0 device that runs this binary's sm_90a code (arch.h: a build without
// it, or its PTX compiled by the driver for an H200, leaves the wgmma kernels empty), and whose
// `kernel` the runtime can load.
inline bool sm90_kernel_runs(const void* kernel) {
  if (!arch::current().wgmma) return false;
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace engine::cuda::sm90
