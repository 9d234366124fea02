// Bulk copies from global to shared memory completing on mbarriers (cp.async.bulk, sm_90), as
// the loss kernels that hold a row slice in shared memory use them (cross_entropy.cu's and
// distillation.cu's Cluster paths): initialise the barriers (one thread), fence them, arm each
// with the bytes it expects, issue the copies, and wait on a barrier's phase before reading.
// Copies need 16-byte aligned addresses and sizes. Also: pushes of 16 bytes into another block
// of the cluster's shared memory (st.async) completing on its mbarrier. Included by .cu files
// only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace engine::cuda::ce {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
// Makes the initialised barriers visible to the async proxy (the bulk copies) and the cluster.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}

// mbar_wait with acquire at cluster scope: for data other blocks of the cluster wrote into this
// block's shared memory (st_async) before completing on the barrier.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}

// ---------------------------------------------------------------------------------------------
// Distributed shared memory of a thread-block cluster, without a GPU-scope fence: a block pushes
// data into other blocks' shared memory (st_async), each store completing bytes on an mbarrier
// of the receiving block, which waits on it (mbar_wait_cluster). The receiving barrier must be
// initialised (fence_mbar_init) before any block pushes: a cluster barrier phase with a relaxed
// arrive after the initialisation and a wait before the first push.

// The address of `p` (this block's shared memory) in the shared memory of block `rank`.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, uint32_t rank) {
  uint32_t a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
  return a;
}
// 16 bytes to cluster shared address `dst`, completing 16 bytes on the mbarrier at cluster
// shared address `bar` (in the same block as dst).
__device__ __forceinline__ void st_async(uint32_t dst, uint4 v, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::
          "r"(dst),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
      : "memory");
}
// One phase of the cluster barrier, every thread of every block arriving: relaxed (no fence:
// orders nothing but what mbarriers and fence_mbar_init already order) and its wait (acquire).
// Not .aligned: callers need not keep their warps converged.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait;" ::: "memory");
}

}  // namespace engine::cuda::ce
