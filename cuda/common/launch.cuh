// Helpers for kernel files (.cu only): the launchers' argument checks, the compute stream as a
// cudaStream_t, a post-launch check, ceil-division, grid sizes (one wave of a grid-stride loop, a
// persistent grid), programmatic dependent launches, the device bf16 type with f32 conversions
// and the bf16 / f32 dtype switch.
// Every launcher runs on stream() and calls check_launch("name") after its launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "core/tensor.h"
#include "cuda/common/arch.h"
#include "cuda/common/check.cuh"
#include "cuda/common/device.cuh"

namespace engine::cuda {

using bf16_t = __nv_bfloat16;

// Launcher argument checks; a failure names the op and the argument ("op: name ...").
// t on the GPU, with memory behind it unless it is empty.
inline void expect_cuda(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.device == Device::CUDA, op, ": ", name, " is on ", device_name(t.device),
         ", expected cuda");
  ENSURE(t.data != nullptr || t.numel() == 0, op, ": ", name, " is undefined");
}
// ... in bf16 or f32.
inline void expect_cuda_float(const Tensor& t, const char* op, const char* name) {
  expect_cuda(t, op, name);
  ENSURE(t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
         dtype_name(t.dtype), ", expected bf16 or f32");
}
// ... of `dtype` and shape `s`.
inline void expect_cuda(const Tensor& t, DType dtype, const Shape& s, const char* op,
                        const char* name) {
  expect_cuda(t, op, name);
  ENSURE(t.dtype == dtype, op, ": ", name, " is ", dtype_name(t.dtype), ", expected ",
         dtype_name(dtype));
  ENSURE(t.shape == s, op, ": ", name, " has shape ", t.shape.str(), ", expected ", s.str());
}

inline cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

inline void check_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) RAISE(kernel, ": launch failed: ", cudaGetErrorString(err));
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Multiprocessors of the current device (queried once per device).
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < kMaxDevices && cached[dev].load(std::memory_order_relaxed) > 0) return cached[dev];
  int n = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev < kMaxDevices) cached[dev] = n;
  return n;
}

// Blocks of `threads` for a grid-stride loop over `items` work items: one full wave (2048
// threads per multiprocessor), fewer when there is less work, at least one.
inline unsigned stream_blocks(int64_t items, int threads) {
  const int64_t want = std::max<int64_t>(1, ceil_div(items, threads));
  return static_cast<unsigned>(std::min<int64_t>(want, int64_t{sm_count()} * (2048 / threads)));
}

// Persistent grid for a kernel whose blocks stride over `rows`: as many blocks as are resident
// on the device at once (at least one per multiprocessor), at most one per row.
template <typename Kernel>
int persistent_grid(Kernel kernel, int threads, size_t smem_bytes, int64_t rows) {
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  const int64_t resident = static_cast<int64_t>(std::max(per_sm, 1)) * sm_count();
  return static_cast<int>(std::min(rows, resident));
}

// The fewest of `blocks` blocks that take `rows` rows (or rounds of rows) in as many rounds as
// all of them would: every block then has the same number of rows, within one. A grid-stride
// loop on the full grid leaves its last round to part of the blocks when rows is not a multiple
// of it. Measured (one H200, docs/PERF.md): the warp-per-row norm backward at T = 32768, C = 768
// (15.5 rows a warp on the full grid) gains 0.5-1 point of copy bandwidth; the block-per-row
// norm kernels and the embedding forward lost 0.3-2 points with it (fewer multiprocessors busy
// for the whole kernel costs more there than a short last round), so they keep the full grid.
inline int64_t balanced_blocks(int64_t rows, int64_t blocks) {
  if (rows <= 0 || blocks <= 0) return std::max<int64_t>(blocks, 1);
  return ceil_div(rows, ceil_div(rows, blocks));
}

// Programmatic dependent launch (compute capability 9 and later with code for sm_90 or later:
// arch::current().pdl; elsewhere an ordinary launch, also where the driver runs an older
// architecture's PTX on a Hopper GPU, whose kernels have no griddepcontrol.wait compiled in):
// a kernel launched by launch_dependent may have its blocks resident before the kernel ahead of
// it on the stream has finished, so its launch latency is hidden. It must call
// wait_for_previous_kernel() before it reads anything an earlier kernel wrote or writes anything
// an earlier kernel may still read (a buffer reused from the caching allocator): that waits for
// the kernel ahead (and so every earlier one) to have finished and its writes to be visible, and
// lets the next dependent launch at once. Outside such a launch it is a no-op.
// The memory-bound kernels (norms, RoPE, activations, element-wise maps and casts, sum_rows
// but its narrow path, the embedding, AdamW, attention's dsum and dq_convert) are launched this
// way and call wait_for_previous_kernel() first, before any global access, so they keep stream
// order (tests/kernels/test_stream_order.cpp); each block then lets the next kernel launch,
// which happens once all of this kernel's blocks have started: the next grid's launch and block
// placement overlap this one's last wave instead of following its end: more of the copy
// bandwidth back to back (`./bench memory_bound`; figures: docs/PERF.md).
// After a kernel that never lets its dependents launch early (cuBLASLt's), the launch happens
// at its end as before.
static __device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream()>>>(args...) as a programmatic dependent of the kernel
// ahead.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      Args&&... args) {
  static const bool dependent_launch = arch::current().pdl;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream();
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = dependent_launch ? 1 : 0;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// f(bf16_t{}) for a bf16 tensor, else f(float{}) (the launcher has checked for bf16 or f32).
template <typename F>
void float_switch(DType dtype, F&& f) {
  if (dtype == DType::BF16)
    f(bf16_t{});
  else
    f(float{});
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

}  // namespace engine::cuda
