// Shared by the layer norm kernels (norm.cu: forward; norm_backward.cu: backward; the contract
// and the kernels' design are in norm.cu's header): the block-size limits, the warp and block
// sums, the kernels' parameters, the row loads, and on the host the row plan (packs per thread,
// block size) and the checks of x. nvcc only.
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"

namespace engine::cuda::norm_detail {

constexpr int kMaxVecThreads = 512;      // block size cap of the 16-byte variant
constexpr int kMaxScalarThreads = 1024;  // block size cap of the scalar variant
constexpr int kMaxVecElems = 16;         // elements per thread and row, 16-byte variant
constexpr int kScalarIters = 8;          // elements per thread and row, scalar variant

// Butterfly sum over the warp: every lane ends with the same bits (a + b == b + a).
template <int M>
__device__ __forceinline__ void warp_sum(float (&v)[M]) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] += __shfl_xor_sync(0xffffffffu, v[m], o);
}

// Sum of v over `threads` threads (a multiple of 32; thread i of them), the same bits in every
// thread; sync() is their barrier. smem holds 2 x (32 M) floats used in turn (phase), so one
// barrier per call suffices: a half is written again two calls later, only after every warp
// passed the barrier of the call in between, hence after it read that half.
template <int M, typename Sync>
__device__ __forceinline__ void threads_sum(float (&v)[M], float* smem, int& phase, int i,
                                            int threads, Sync sync) {
  warp_sum(v);
  float* buf = smem + (phase & 1) * 32 * M;
  ++phase;
  const int lane = i & 31, warp = i >> 5, warps = threads >> 5;
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) buf[m * 32 + warp] = v[m];
  }
  sync();
#pragma unroll
  for (int m = 0; m < M; ++m) v[m] = lane < warps ? buf[m * 32 + lane] : 0.f;
  warp_sum(v);
}

// ... over the block.
template <int M>
__device__ __forceinline__ void block_sum(float (&v)[M], float* smem, int& phase) {
  threads_sum(v, smem, phase, threadIdx.x, blockDim.x, [] { __syncthreads(); });
}

// ... over group `group` of `threads` threads of a block split into groups (thread i of the
// group), behind named barrier 1 + group; smem is the group's own.
template <int M>
__device__ __forceinline__ void group_sum(float (&v)[M], float* smem, int& phase, int i,
                                          int threads, int group) {
  threads_sum(v, smem, phase, i, threads, [group, threads] {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + group), "r"(threads) : "memory");
  });
}

template <typename T>
struct NormFwdParams {
  const T* x;       // (rows, cols)
  const T* residual;  // (rows, cols), residual form only (else nullptr)
  T* sum;             // (rows, cols): x + residual rounded to T, residual form only
  const T* weight;  // (cols)
  const T* bias;    // (cols), nullptr: no bias
  T* y;             // (rows, cols)
  float* mean;      // (rows), nullptr for rmsnorm
  float* rstd;      // (rows)
  float* amax;      // (1) zeroed, or nullptr: y's FP8 amax (cuda/fp8/amax.cuh)
  int64_t rows, cols;
  float eps;
};

template <typename T>
struct NormBwdParams {
  const T* dy;        // (rows, cols)
  const T* x;         // (rows, cols)
  const T* weight;    // (cols)
  const float* mean;  // (rows), nullptr for rmsnorm
  const float* rstd;  // (rows)
  const T* dresidual;  // (rows, cols), residual form only (else nullptr): added to dx
  T* dx;              // (rows, cols)
  float* partial_dw;  // (gridDim.x, cols): sum of dy xhat over the rows of each block
  float* partial_db;  // (gridDim.x, cols) or nullptr: sum of dy over the rows of each block
  float* partial_dxs;  // (gridDim.x, cols), kernels with kColSum: sum of dx as stored
  int64_t rows, cols;
};

// Packs i, i + B, ..., i + (K-1) B of row `row` (those below `packs`) into registers, raw:
// i = thread of B (by default the block's).
template <typename T, int N, int K>
__device__ __forceinline__ void load_row(const T* base, int64_t row, int64_t cols,
                                                int64_t packs, Pack<T, N> (&dst)[K],
                                                unsigned i, unsigned b) {
  const Pack<T, N>* r = reinterpret_cast<const Pack<T, N>*>(base + row * cols);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t q = i + static_cast<int64_t>(k) * b;
    if (q < packs) dst[k] = r[q];
  }
}
template <typename T, int N, int K>
__device__ __forceinline__ void load_row(const T* base, int64_t row, int64_t cols,
                                                int64_t packs, Pack<T, N> (&dst)[K]) {
  load_row<T, N, K>(base, row, cols, packs, dst, threadIdx.x, blockDim.x);
}

struct RowPlan {
  bool vec;     // 16-byte packs (else one element per pack)
  int iters;    // packs per thread (K)
  int threads;  // block size
};

inline int round_up_warp(int64_t n) { return static_cast<int>(ceil_div(n, 32) * 32); }

inline RowPlan plan_rows(int64_t cols, int vec_elems, bool aligned, const char* op,
                         int min_k = 1) {
  if (aligned && cols % vec_elems == 0) {
    const int64_t packs = cols / vec_elems;
    for (int k = min_k; k * vec_elems <= kMaxVecElems; k *= 2)
      if (ceil_div(packs, k) <= kMaxVecThreads) return {true, k, round_up_warp(ceil_div(packs, k))};
    for (int k = 1; k * vec_elems <= kMaxVecElems; k *= 2)
      if (ceil_div(packs, k) <= kMaxVecThreads) return {true, k, round_up_warp(ceil_div(packs, k))};
  } else if (ceil_div(cols, kScalarIters) <= kMaxScalarThreads) {
    return {false, kScalarIters, round_up_warp(ceil_div(cols, kScalarIters))};
  }
  RAISE(op, ": C = ", cols, " is wider than the kernels take (at most ",
        kMaxVecThreads * kMaxVecElems, ")");
}

// x (T, C), C >= 1 (ops/norm.cpp checked the shapes), in bf16 or f32; returns {T, C}.
inline std::pair<int64_t, int64_t> check_x(const Tensor& x, const char* op) {
  ENSURE(x.dtype == DType::BF16 || x.dtype == DType::F32, op, ": x is ", dtype_name(x.dtype),
         ", the kernel takes bf16 or f32 (statistics f32)");
  ENSURE(x.size(0) < (int64_t{1} << 31), op, ": T = ", x.size(0), " rows is too many");
  return {x.size(0), x.size(1)};
}

// f(N, K) with std::integral_constant elements per pack N and packs per thread K of the plan:
// (1, kScalarIters) for the scalar variant, (16 / sizeof(T), plan.iters) for 16-byte packs.
template <typename T, typename F>
inline void plan_switch(const RowPlan& plan, const char* what, F&& f) {
  constexpr int V = 16 / sizeof(T);
  using std::integral_constant;
  if (!plan.vec) return f(integral_constant<int, 1>{}, integral_constant<int, kScalarIters>{});
  switch (plan.iters) {
    case 1:
      return f(integral_constant<int, V>{}, integral_constant<int, 1>{});
    case 2:
      return f(integral_constant<int, V>{}, integral_constant<int, 2>{});
    case 4:
      if constexpr (4 * V <= kMaxVecElems)
        return f(integral_constant<int, V>{}, integral_constant<int, 4>{});
      break;
  }
  RAISE(what, ": no kernel for ", plan.iters, " packs per thread");
}

}  // namespace engine::cuda::norm_detail
