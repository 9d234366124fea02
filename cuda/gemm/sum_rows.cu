// Row and column reductions of a row-major matrix x (M, N), bf16 or f32, into f32 or bf16:
//   sum_rows:    out(j) = beta * out(j) + sum_i x(i, j)   (column sums: bias gradients)
//   sum_columns: out(i) = beta * out(i) + sum_j x(i, j)   (row sums)
// sum_rows is one kernel, no float atomics, and the result has the same bits every run:
//   Block (column tile, row chunk): a tile is 32 lanes x V columns (V = 16 bytes of x: 8 bf16
//   or 4 f32, one vector load per lane and row when rows are 16-byte aligned, else V strided
//   scalar loads); its 8 warps take every 8th row of the chunk, each lane adding its columns in
//   f32 in row order, R rows asked for (raw vectors, one 64-bit pointer stepped per group)
//   before any is added (R = 8 vector loads, 16 for narrow matrices of at most kNarrowTiles
//   tiles, kRowsInFlight scalar ones); the 8 warp sums are added in warp order. About
//   kBlocksPerSM blocks per multiprocessor in all: few, deep blocks, so that there are few
//   partials. With one chunk the block writes out; else it writes its partial(chunk, tile) and
//   counts itself done on the tile's counter (after a fence), and the tile's last block adds the
//   chunks' partials in a fixed order: thread group g of G adds chunks g, g + G, ... four
//   columns at a time, U loads in flight (12; 24 for narrow matrices, so that at N = 768 every
//   chunk's partial is asked for at once), the last round predicated; then the G group sums
//   are added in group order, beta * out is added (loaded by every block at its start, so the
//   last one does not wait for it at the end), and the block resets the counter for the next
//   call. Which block comes last changes nothing in the order; the chunk count depends on
//   (M, N) and the device only.
//   This one kernel replaced a two-pass version (pass 1 with one wave of resident blocks
//   writing partials, a second kernel adding them) that was slower at every shape tried. The
//   narrow path's R 16, U 24 beat R 8, U 12 (and R 12, or U 24 alone) on narrow matrices and lost
//   on wider ones, which keep R 8, U 12; 1 block per SM, or 3 or more, were slower (figures:
//   docs/PERF.md).
// sum_columns: one warp per row; lanes add strided vectors in f32, then a fixed xor butterfly.
// Scratch: the partials (chunks x tiles x tile width f32) and one counter per tile live in
// device buffers that only grow (the counters zeroed when allocated), reused in compute-stream
// order.
// sum_rows' shapes ran before (ops/gemm.cpp); sum_columns, called directly, checks its own.
#include "cuda/gemm/gemm.cuh"

#include <algorithm>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"

namespace engine::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMinRowsPerChunk = 64;
constexpr int kBlocksPerSM = 2;      // blocks of the whole grid per multiprocessor
constexpr int kVecRowsInFlight = 8;  // rows per warp loaded before any is added (16-byte loads)
constexpr int kCombineUnroll = 12;   // combine: partial loads in flight per thread
// Narrow matrices (at most kNarrowTiles column tiles: many row chunks per tile) keep more rows in
// flight and load every chunk's partial at once in the combine (88 chunks at 32768 x 768).
constexpr int kNarrowTiles = 4;
constexpr int kNarrowRowsInFlight = 16;
constexpr int kNarrowCombineUnroll = 24;
constexpr int kRowsInFlight = 4;     // ... scalar loads

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

// sum_rows (see the top of this file): block (tile, chunk); partial rows are ld floats apart (a
// multiple of 4: 16-byte aligned), the columns of the last tile past n hold 0.
// Registers: capped for R <= 8 (four blocks a multiprocessor), so that a programmatic dependent
// launch places the grid's two blocks a multiprocessor evenly. Launched while the kernel ahead
// still holds two blocks on every multiprocessor, a grid finds two free slots on each; uncapped
// it found one, the other blocks went wherever the kernel ahead ended first, some
// multiprocessors got three, and the kernel ran markedly slower (figures: docs/PERF.md).
template <typename T, bool kVec, typename Out, int R, int kCombineUnroll>
__global__ void __launch_bounds__(kThreads, R > kVecRowsInFlight ? 2 : 4)
    column_sums_kernel(const T* x, int64_t m, int64_t n, int64_t rows_per_chunk, float* partial,
                       int64_t ld, unsigned* counters, Out* out, float beta) {
  wait_for_previous_kernel();
  constexpr int V = kVecOf<T>;
  constexpr int kTile = 32 * V;
  constexpr int kQuads = kTile / 4;             // 4-column groups of a tile
  constexpr int kGroups = kThreads / kQuads;    // threads per 4-column group in the combine
  static_assert(kGroups >= 1 && kGroups <= kWarps && kThreads % kQuads == 0);
  __shared__ float s[kWarps][kTile];
  __shared__ bool last;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = std::min(m, r0 + rows_per_chunk);
  const int chunks = static_cast<int>(gridDim.y);
  auto col_of = [&](int k) { return kVec ? lane * V + k : lane + 32 * k; };
  static_assert(kTile <= kThreads, "one output column a thread at most");
  // beta * out's old value for column tid of the tile, asked for now rather than at the end, so
  // the tile's last block does not wait for it after the partials (no other block writes out).
  const bool mine = tid < kTile && col0 + tid < n;
  const float old = mine && beta != 0.f ? beta * to_float(out[col0 + tid]) : 0.f;
  float acc[V] = {};
  accumulate_rows<T, kVec, R>(x, n, r0, r1, col0, acc);
#pragma unroll
  for (int k = 0; k < V; ++k) s[warp][col_of(k)] = acc[k];
  __syncthreads();
  auto finish = [&](float total) { out[col0 + tid] = from_float<Out>(total + old); };
  if (chunks == 1) {
    if (mine) {
      float t = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) t += s[w][tid];
      finish(t);
    }
    return;
  }
  for (int i = tid; i < kTile; i += kThreads) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += s[w][i];
    partial[blockIdx.y * ld + col0 + i] = col0 + i < n ? t : 0.f;
  }
  __threadfence();  // this block's partials are visible device-wide before it counts itself
  __syncthreads();
  if (tid == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == static_cast<unsigned>(chunks - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();  // ... and every other block's, once the count says all are done

  const int q = tid % kQuads, g = tid / kQuads;
  float4 t4 = make_float4(0.f, 0.f, 0.f, 0.f);
  if (g < kGroups) {
    const float* base = partial + col0 + 4 * q;
    auto add = [&](const float4& v) {
      t4.x += v.x;
      t4.y += v.y;
      t4.z += v.z;
      t4.w += v.w;
    };
    // Rounds of kCombineUnroll loads issued before any is added, the last round predicated (a
    // remainder loop would wait for each load in turn: at 88 chunks, 6 of a group's 22 loads).
    for (int c = g; c < chunks; c += kCombineUnroll * kGroups) {
      float4 v[kCombineUnroll];
#pragma unroll
      for (int u = 0; u < kCombineUnroll; ++u) {
        const int cu = c + u * kGroups;
        v[u] = cu < chunks ? __ldcg(reinterpret_cast<const float4*>(base + cu * ld)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kCombineUnroll; ++u) add(v[u]);
    }
    s[g][4 * q] = t4.x;
    s[g][4 * q + 1] = t4.y;
    s[g][4 * q + 2] = t4.z;
    s[g][4 * q + 3] = t4.w;
  }
  __syncthreads();
  if (mine) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kGroups; ++w) t += s[w][tid];
    finish(t);
  }
  if (tid == 0) counters[blockIdx.x] = 0;
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

// One counter per column tile, zero between calls (the last block of a tile resets its own).
unsigned* tile_counters(size_t count) {
  static Buffer buf;
  if (buf.bytes() < count * sizeof(unsigned)) {
    buf = Buffer(count * sizeof(unsigned), Device::CUDA);
    CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, buf.bytes(), stream()));
  }
  return static_cast<unsigned*>(buf.data());
}

// t in bf16 or f32.
void expect_float(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
         dtype_name(t.dtype), ", expected bf16 or f32");
}

// Calls f(T{}, Out{}) for the dtypes of x and out.
template <typename F>
void dtype_pair(const Tensor& x, const Tensor& out, F&& f) {
  float_switch(x.dtype, [&](auto xt) { float_switch(out.dtype, [&](auto ot) { f(xt, ot); }); });
}

}  // namespace

void sum_rows(const Tensor& x, const Tensor& out, float beta) {
  expect_float(x, "sum_rows", "x");  // the shapes were checked in ops/gemm.cpp
  expect_float(out, "sum_rows", "out");
  const int64_t m = x.size(0), n = x.size(1);
  if (n == 0) return;
  dtype_pair(x, out, [&](auto xt, auto ot) {
    using T = decltype(xt);
    using Out = decltype(ot);
    constexpr int V = kVecOf<T>;
    constexpr int64_t kTile = 32 * V;
    const int64_t tiles = ceil_div(n, kTile);
    const bool vec = n % V == 0 && aligned16(x.data);
    // About kBlocksPerSM blocks per multiprocessor in all, at least kMinRowsPerChunk rows each.
    const int64_t want = std::clamp<int64_t>(int64_t{kBlocksPerSM} * sm_count() / tiles, 1,
                                             std::max<int64_t>(1, m / kMinRowsPerChunk));
    const int64_t rows_per_chunk = std::max<int64_t>(1, ceil_div(m, want));
    const int64_t chunks = std::max<int64_t>(1, ceil_div(m, rows_per_chunk));
    const int64_t ld = tiles * kTile;
    float* partial = chunks > 1 ? partial_scratch(static_cast<size_t>(chunks * ld)) : nullptr;
    unsigned* counters = chunks > 1 ? tile_counters(static_cast<size_t>(tiles)) : nullptr;
    auto kernel =
        !vec ? column_sums_kernel<T, false, Out, kRowsInFlight, kCombineUnroll>
        : tiles <= kNarrowTiles
            ? column_sums_kernel<T, true, Out, kNarrowRowsInFlight, kNarrowCombineUnroll>
            : column_sums_kernel<T, true, Out, kVecRowsInFlight, kCombineUnroll>;
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
    // A programmatic dependent of the kernel ahead (its blocks resident before that one ends),
    // except for narrow matrices, where the plain launch was faster back to back (the wider ones
    // gain from the dependent launch; figures: docs/PERF.md). (Likely the trap in the register
    // note above column_sums_kernel: the narrow kernel takes about twice the registers, two
    // blocks fit a multiprocessor, so an early grid of two a multiprocessor finds no free slot
    // beside the kernel ahead. Not tested separately.)
    if (tiles <= kNarrowTiles)
      kernel<<<grid, kThreads, 0, stream()>>>(static_cast<const T*>(x.data), m, n, rows_per_chunk,
                                              partial, ld, counters, static_cast<Out*>(out.data),
                                              beta);
    else
      launch_dependent(kernel, grid, kThreads, 0, static_cast<const T*>(x.data), m, n,
                       rows_per_chunk, partial, ld, counters, static_cast<Out*>(out.data), beta);
    check_launch("column_sums_kernel");
  });
}

void sum_columns(const Tensor& x, const Tensor& out, float beta) {
  const char* op = "sum_columns";
  ENSURE(x.ndim() == 2, op, ": x must be 2-D, got shape ", x.shape.str());
  expect_cuda_float(x, op, "x");
  expect_cuda_float(out, op, "out");
  ENSURE(out.shape == Shape{x.size(0)}, op, ": out has shape ", out.shape.str(), ", expected (",
         x.size(0), ") for x ", x.shape.str());
  const int64_t m = x.size(0), n = x.size(1);
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
