// Row and column reductions of a row-major matrix x (M, N), bf16 or f32, into f32 or bf16:
//   sum_rows:    out(j) = beta * out(j) + sum_i x(i, j)   (column sums: bias gradients)
//   sum_columns: out(i) = beta * out(i) + sum_j x(i, j)   (row sums)
// sum_rows runs in two passes, no atomics, so the result has the same bits every run:
//   1. Block (column tile, row chunk): a tile is 32 lanes x V columns (V = 16 bytes of x: 8 bf16
//      or 4 f32, one vector load per lane and row when rows are 16-byte aligned, else V strided
//      scalar loads); its 8 warps take every 8th row of the chunk, each lane adding its columns in
//      f32 in row order, kRowsInFlight rows asked for (raw vectors, one 64-bit pointer stepped
//      per group) before any is added; the 8 warp sums are added in warp order into
//      partial(chunk, column). (8 rows in flight, and a single kernel whose last block per tile
//      adds the partials, both measured slower at 32768 x 768: 56-59% and 49-50% of copy,
//      against 60-62%.)
//      The number of chunks depends on (M, N) and the device only: about one wave of resident
//      blocks in all (so the same device gives the same bits every run).
//   2. kFinishLanes threads per column each add every kFinishLanes-th chunk partial in chunk
//      order, then one adds their kFinishLanes sums in order and applies beta (the old single
//      thread per column walked all chunks, a chain of dependent L2 loads that took longer than
//      pass 1 itself for N = 768).
// sum_columns: one warp per row; lanes add strided vectors in f32, then a fixed xor butterfly.
// Scratch: the partials (chunks x N f32) live in a device buffer that only grows, reused in
// compute-stream order.
#include "cuda/gemm/sum_rows.cuh"

#include <algorithm>
#include <utility>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"

namespace engine::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMinRowsPerChunk = 64;
constexpr int kFinishLanes = 32;  // pass-2 threads per column
constexpr int kFinishUnroll = 4;  // pass-2 loads in flight per thread
constexpr int kRowsInFlight = 4;  // pass 1: rows per warp loaded before any is added

template <typename T>
constexpr int kVecOf = 16 / static_cast<int>(sizeof(T));  // columns per lane

// acc[k] += x(r, col_of(k)) over the rows r = r0 + warp, r0 + warp + kWarps, ... < r1 of the
// warp, in row order, R rows in flight (raw vectors, converted when added); full groups of R rows
// unpredicated, then the last group predicated.
template <typename T, bool kVec, int R>
__device__ __forceinline__ void accumulate_rows(const T* x, int64_t n, int64_t r0, int64_t r1,
                                                int64_t col0, float (&acc)[kVecOf<T>]) {
  constexpr int V = kVecOf<T>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t step = int64_t{kWarps} * n;  // elements between a warp's consecutive rows
  int64_t r = r0 + warp;
  if constexpr (kVec) {
    using P = Pack<T, V>;
    if (col0 + lane * V >= n) return;
    const T* ptr = x + r * n + col0 + lane * V;
    for (; r + (R - 1) * kWarps < r1; r += R * kWarps, ptr += R * step) {
      P v[R];
#pragma unroll
      for (int u = 0; u < R; ++u) v[u] = *reinterpret_cast<const P*>(ptr + u * step);
#pragma unroll
      for (int u = 0; u < R; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_float(v[u].v[k]);
    }
    if (r < r1) {
      P v[R - 1];
#pragma unroll
      for (int u = 0; u < R - 1; ++u)
        if (r + u * kWarps < r1) v[u] = *reinterpret_cast<const P*>(ptr + u * step);
#pragma unroll
      for (int u = 0; u < R - 1; ++u)
        if (r + u * kWarps < r1)
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] += to_float(v[u].v[k]);
    }
  } else {
    const T* ptr = x + r * n + col0 + lane;
    bool in[V];
#pragma unroll
    for (int k = 0; k < V; ++k) in[k] = col0 + lane + 32 * k < n;
    for (; r + (R - 1) * kWarps < r1; r += R * kWarps, ptr += R * step) {
      float v[R][V];
#pragma unroll
      for (int u = 0; u < R; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) v[u][k] = in[k] ? to_float(ptr[u * step + 32 * k]) : 0.f;
#pragma unroll
      for (int u = 0; u < R; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += v[u][k];
    }
    for (; r < r1; r += kWarps, ptr += step)
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += in[k] ? to_float(ptr[32 * k]) : 0.f;
  }
}

// Pass 1: partial(chunk, j) = sum over the rows of the chunk of x(i, j), for the block's column
// tile: each warp adds its rows (accumulate_rows), then the warp sums are added in warp order.
template <typename T, bool kVec>
__global__ void column_partial_kernel(const T* x, int64_t m, int64_t n, int64_t rows_per_chunk,
                                      float* partial) {
  constexpr int V = kVecOf<T>;
  constexpr int kTile = 32 * V;
  __shared__ float s[kWarps][kTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = std::min(m, r0 + rows_per_chunk);
  auto col_of = [&](int k) { return kVec ? lane * V + k : lane + 32 * k; };
  float acc[V] = {};
  accumulate_rows<T, kVec, kRowsInFlight>(x, n, r0, r1, col0, acc);
#pragma unroll
  for (int k = 0; k < V; ++k) s[warp][col_of(k)] = acc[k];
  __syncthreads();
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    if (col0 + i >= n) continue;
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += s[w][i];
    partial[blockIdx.y * n + col0 + i] = t;
  }
}

// Pass 2: out(j) = beta * out(j) + sum over chunks of partial(c, j). Block (32 columns x
// kFinishLanes): thread (x, y) adds the chunks c = y, y + kFinishLanes, ... of column x in turn
// (kFinishUnroll loads in flight), then thread (x, 0) adds the kFinishLanes sums in order: a
// fixed order, and each thread walks chunks / kFinishLanes partials instead of all of them.
template <typename Out>
__global__ void __launch_bounds__(32 * kFinishLanes)
    column_finish_kernel(const float* partial, int64_t chunks, int64_t n, Out* out, float beta) {
  __shared__ float sums[kFinishLanes][33];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float t = 0.f;
  if (j < n) {
    int64_t c = threadIdx.y;
    for (; c + (kFinishUnroll - 1) * kFinishLanes < chunks; c += kFinishUnroll * kFinishLanes) {
      float v[kFinishUnroll];
#pragma unroll
      for (int u = 0; u < kFinishUnroll; ++u) v[u] = partial[(c + u * kFinishLanes) * n + j];
#pragma unroll
      for (int u = 0; u < kFinishUnroll; ++u) t += v[u];
    }
    for (; c < chunks; c += kFinishLanes) t += partial[c * n + j];
  }
  sums[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float total = 0.f;
#pragma unroll
    for (int r = 0; r < kFinishLanes; ++r) total += sums[r][threadIdx.x];
    if (beta != 0.f) total += beta * to_float(out[j]);
    out[j] = from_float<Out>(total);
  }
}

// out(i) = beta * out(i) + sum_j x(i, j): one warp per row.
template <typename T, bool kVec, typename Out>
__global__ void row_sum_kernel(const T* x, int64_t m, int64_t n, Out* out, float beta) {
  constexpr int V = kVecOf<T>;
  const int lane = threadIdx.x & 31;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (i >= m) return;
  const T* row = x + i * n;
  float acc = 0.f;
  if constexpr (kVec) {
    for (int64_t c = static_cast<int64_t>(lane) * V; c < n; c += 32 * V) {
      float v[V];
      load_pack(row + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += v[k];
    }
  } else {
    for (int64_t c = lane; c < n; c += 32) acc += to_float(row[c]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    if (beta != 0.f) acc += beta * to_float(out[i]);
    out[i] = from_float<Out>(acc);
  }
}

float* partial_scratch(size_t count) {
  static Buffer buf;
  if (buf.bytes() < count * sizeof(float)) buf = Buffer(count * sizeof(float), Device::CUDA);
  return static_cast<float*>(buf.data());
}

// x (M, N) and out (x.size(out_dim)) on cuda; returns {M, N}.
std::pair<int64_t, int64_t> check_args(const Tensor& x, const Tensor& out, int out_dim,
                                       const char* op) {
  ENSURE(x.ndim() == 2, op, ": x must be 2-D, got shape ", x.shape.str());
  const int64_t out_len = x.size(out_dim);
  expect_cuda_float(x, op, "x");
  expect_cuda_float(out, op, "out");
  ENSURE(out.shape == Shape{out_len}, op, ": out has shape ", out.shape.str(), ", expected (",
         out_len, ") for x ", x.shape.str());
  return {x.size(0), x.size(1)};
}

// Calls f(T{}, Out{}) for the dtypes of x and out.
template <typename F>
void dtype_pair(const Tensor& x, const Tensor& out, F&& f) {
  float_switch(x.dtype, [&](auto xt) { float_switch(out.dtype, [&](auto ot) { f(xt, ot); }); });
}

}  // namespace

void sum_rows(const Tensor& x, const Tensor& out, float beta) {
  const auto [m, n] = check_args(x, out, 1, "sum_rows");
  if (n == 0) return;
  dtype_pair(x, out, [&](auto xt, auto ot) {
    using T = decltype(xt);
    using Out = decltype(ot);
    constexpr int V = kVecOf<T>;
    const int64_t tiles = ceil_div(n, 32 * V);
    const bool vec = n % V == 0 && aligned16(x.data);
    auto pass1 = vec ? column_partial_kernel<T, true> : column_partial_kernel<T, false>;
    int64_t chunks = 0, rows_per_chunk = 0;
    if (m > 0) {
      // As many blocks as are resident at once (one wave), at least kMinRowsPerChunk rows each.
      const int64_t resident = persistent_grid(pass1, kThreads, 0, int64_t{1} << 30);
      const int64_t want = std::clamp<int64_t>(resident / tiles, 1,
                                               std::max<int64_t>(1, m / kMinRowsPerChunk));
      rows_per_chunk = ceil_div(m, want);
      chunks = ceil_div(m, rows_per_chunk);
    }
    float* partial = partial_scratch(static_cast<size_t>(std::max<int64_t>(chunks, 1) * n));
    if (chunks > 0) {
      const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
      pass1<<<grid, kThreads, 0, stream()>>>(static_cast<const T*>(x.data), m, n, rows_per_chunk,
                                            partial);
      check_launch("column_partial_kernel");
    }
    column_finish_kernel<Out><<<static_cast<unsigned>(ceil_div(n, 32)), dim3(32, kFinishLanes), 0,
                                stream()>>>(partial, chunks, n, static_cast<Out*>(out.data), beta);
    check_launch("column_finish_kernel");
  });
}

void sum_columns(const Tensor& x, const Tensor& out, float beta) {
  const auto [m, n] = check_args(x, out, 0, "sum_columns");
  if (m == 0) return;
  dtype_pair(x, out, [&](auto xt, auto ot) {
    using T = decltype(xt);
    using Out = decltype(ot);
    const bool vec = n % kVecOf<T> == 0 && aligned16(x.data);
    const auto blocks = static_cast<unsigned>(ceil_div(m, kWarps));
    const T* px = static_cast<const T*>(x.data);
    auto* po = static_cast<Out*>(out.data);
    if (vec) row_sum_kernel<T, true, Out><<<blocks, kThreads, 0, stream()>>>(px, m, n, po, beta);
    else row_sum_kernel<T, false, Out><<<blocks, kThreads, 0, stream()>>>(px, m, n, po, beta);
    check_launch("row_sum_kernel");
  });
}

}  // namespace engine::cuda
