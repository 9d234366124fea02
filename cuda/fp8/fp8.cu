// FP8 scaling on the GPU (ops/fp8.h): amax per tensor or per row of op(x), and the quantisation
// op(x) * scale -> e4m3 / e5m2 bytes, with the row's inverse scale.
// amax: magnitudes compared as unsigned f32 bit patterns (the values' order, NaN above
// infinity: a NaN makes its row's amax NaN, as the CPU reference), so the result does not
// depend on the reduction order. Per tensor: a grid-stride loop, warp maxima, one atomicMax a
// warp into the zeroed output. Rows of x (op(x) = x): a block a row. Columns of x (op(x) = x^T):
// 8 columns a thread, a block's warps over a slice of the rows, merged in shared memory, one
// atomicMax a column a block into the zeroed output. Where rows are a multiple of 8 elements and
// x starts 16-byte aligned, the kernels move 8 elements a thread (16- or 32-byte loads, 8-byte
// stores); elsewhere one (the column amax: a thread a column over a slice of the rows).
// Quantise: scale = max_finite / amax in f32 (1 where amax is 0), the product rounded to f32 and
// converted by __nv_cvt_float_to_fp8(.., __NV_SATFINITE) (cvt.rn.satfinite on sm_89+: round to
// nearest even, saturating), NaN written as 0x7f; the inverse scales by the first
// threads. op(x) = x: a grid-stride loop; op(x) = x^T: tiles through shared memory, read along
// x's rows and written along out's (64 x 64 with 16-byte accesses where the shapes allow, else
// 32 x 32 element by element).
// The pair (fp8_quantize_pair): the transposed kernel also writes each pack it reads in x's own
// layout, so x is read once for both.
// The shared preconditions ran before (ops/fp8.cpp); the launchers check the dtypes they take.
#include <cuda_fp8.h>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"
#include "cuda/fp8/amax.cuh"
#include "ops/fp8.h"

namespace engine::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;
constexpr int kVec = 8;  // elements a thread in the vector forms

__device__ __forceinline__ unsigned block_max(unsigned v) {
  __shared__ unsigned warps[kThreads / 32];
  v = warp_max_bits(v);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : 0u;
  return warp_max_bits(v);
}

// V elements a thread (1, or kVec from a 16-byte aligned x), as 32-bit magnitudes.
template <typename T, int V>
__device__ __forceinline__ unsigned max_of(const T* p, unsigned m) {
  float v[V];
  load_pack<T, V>(p, v);
#pragma unroll
  for (int q = 0; q < V; ++q) m = max(m, magnitude_bits(v[q]));
  return m;
}

// n elements in groups of V (V divides n); kUnroll groups a thread in flight.
constexpr int kUnroll = 4;
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) amax_tensor_kernel(const T* x, int64_t n, unsigned* out) {
  wait_for_previous_kernel();
  unsigned m = 0;
  const int64_t groups = n / V, stride = int64_t{gridDim.x} * kThreads;
  int64_t g = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  for (; g + (kUnroll - 1) * stride < groups; g += kUnroll * stride) {
    float v[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load_pack<T, V>(x + (g + u * stride) * V, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int q = 0; q < V; ++q) m = max(m, magnitude_bits(v[u][q]));
  }
  for (; g < groups; g += stride) m = max_of<T, V>(x + g * V, m);
  m = warp_max_bits(m);
  if (threadIdx.x % 32 == 0 && m) atomicMax(out, m);
}

// A block a row, V elements a thread (V divides cols).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) amax_rows_kernel(const T* x, int64_t rows, int64_t cols, unsigned* out) {
  wait_for_previous_kernel();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    unsigned m = 0;
    for (int64_t j = int64_t{threadIdx.x} * V; j < cols; j += kThreads * V) m = max_of<T, V>(x + r * cols + j, m);
    m = block_max(m);
    if (threadIdx.x == 0) out[r] = m;
    __syncthreads();  // the shared warp maxima are reused by the next row
  }
}

// A thread a column j of x, over rows blockIdx.y, + gridDim.y, ...
template <typename T>
__global__ void __launch_bounds__(kThreads) amax_columns_kernel(const T* x, int64_t rows, int64_t cols, unsigned* out) {
  wait_for_previous_kernel();
  const int64_t j = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (j >= cols) return;
  unsigned m = 0;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) m = max(m, magnitude_bits(to_float(x[r * cols + j])));
  if (m) atomicMax(out + j, m);
}

// 8 columns a thread (a 16-byte load; cols a multiple of 8, x 16-byte aligned): a warp spans
// 256 columns of one row, the block's 8 warps take every 8th row of the block's rows
// [blockIdx.y * rows_per_block, ...), then the warps' maxima meet in shared memory and each
// column gets one atomicMax a block.
constexpr int kColVec = 8, kColWarps = kThreads / 32, kColSpan = 32 * kColVec;
template <typename T>
__global__ void __launch_bounds__(kThreads) amax_columns_vec_kernel(const T* x, int64_t rows, int64_t cols,
                                                                    int64_t rows_per_block, unsigned* out) {
  wait_for_previous_kernel();
  __shared__ unsigned part[kColWarps][kColSpan];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t c = int64_t{blockIdx.x} * kColSpan + lane * kColVec;
  const int64_t r0 = int64_t{blockIdx.y} * rows_per_block, r1 = std::min(rows, r0 + rows_per_block);
  unsigned m[kColVec] = {};
  if (c < cols)
    for (int64_t r = r0 + warp; r < r1; r += kColWarps) {
      float v[kColVec];
      load_pack<T, kColVec>(x + r * cols + c, v);
#pragma unroll
      for (int q = 0; q < kColVec; ++q) m[q] = max(m[q], magnitude_bits(v[q]));
    }
#pragma unroll
  for (int q = 0; q < kColVec; ++q) part[warp][lane * kColVec + q] = m[q];
  __syncthreads();
  const int64_t j = int64_t{blockIdx.x} * kColSpan + threadIdx.x;  // one column a thread (kThreads == kColSpan)
  unsigned v = 0;
#pragma unroll
  for (int w = 0; w < kColWarps; ++w) v = max(v, part[w][threadIdx.x]);
  if (j < cols && v) atomicMax(out + j, v);
}

__device__ __forceinline__ float scale_of(float amax, float max_finite) {
  return amax == 0.f ? 1.f : max_finite / amax;
}

__device__ __forceinline__ uint8_t encode(float v, bool e4m3) {
  if (v != v) return 0x7f;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2));
}

struct QuantizeParams {
  const void* x;
  int64_t rows, cols;        // of out (op(x))
  const float* amax;         // n_scales elements: 1 (per tensor) or rows
  float* scale_inv;
  int64_t n_scales;
  uint8_t* out;
  float max_finite;
  bool e4m3;
};

// The inverse scales, by the first n_scales threads of the grid.
__device__ __forceinline__ void write_scale_inv(const QuantizeParams& p, int64_t thread) {
  if (thread < p.n_scales) p.scale_inv[thread] = 1.f / scale_of(p.amax[thread], p.max_finite);
}

// V elements a thread (V divides cols, so a group is in one row; for V > 1 x 16-byte and out
// 8-byte aligned).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const QuantizeParams p) {
  wait_for_previous_kernel();
  const T* x = static_cast<const T*>(p.x);
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  write_scale_inv(p, first);
  const bool per_row = p.n_scales > 1;
  const int64_t groups = p.rows * p.cols / V;
  for (int64_t g = first; g < groups; g += int64_t{gridDim.x} * kThreads) {
    float v[V];
    load_pack<T, V>(x + g * V, v);
    const float scale = scale_of(p.amax[per_row ? g * V / p.cols : 0], p.max_finite);
    Pack<uint8_t, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = encode(v[j] * scale, p.e4m3);
    reinterpret_cast<Pack<uint8_t, V>*>(p.out)[g] = o;
  }
}

// out (rows, cols) = quantised x^T, x (cols, rows): a 32 x 32 tile a block of 32 x 8 threads.
template <typename T>
__global__ void __launch_bounds__(kTile * 8) quantize_transposed_kernel(const QuantizeParams p) {
  wait_for_previous_kernel();
  __shared__ float tile[kTile][kTile + 1];
  const T* x = static_cast<const T*>(p.x);
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  write_scale_inv(p, (int64_t{blockIdx.y} * gridDim.x + blockIdx.x) * (kTile * 8) + threadIdx.x);
  const int64_t r0 = int64_t{blockIdx.x} * kTile;  // out rows = x columns
  const int64_t c0 = int64_t{blockIdx.y} * kTile;  // out columns = x rows
  for (int i = ty; i < kTile; i += 8) {
    const int64_t xr = c0 + i, xc = r0 + tx;
    tile[i][tx] = xr < p.cols && xc < p.rows ? to_float(x[xr * p.rows + xc]) : 0.f;
  }
  __syncthreads();
  const bool per_row = p.n_scales > 1;
  for (int i = ty; i < kTile; i += 8) {
    const int64_t r = r0 + i, c = c0 + tx;
    if (r >= p.rows || c >= p.cols) continue;
    const float scale = scale_of(p.amax[per_row ? r : 0], p.max_finite);
    p.out[r * p.cols + c] = encode(tile[tx][i] * scale, p.e4m3);
  }
}

// The same with 16-byte accesses: x (cols, rows) read as rows of 8-element packs, out written
// 16 bytes a thread. A block of 256 threads takes a 64 x 64 tile: 64 out rows (x columns) by 64
// out columns (x rows). Needs out's rows (x's columns) a multiple of 8, its columns (x's rows) a
// multiple of 16, x and out 16-byte aligned. The out row a thread writes is its lane's within a
// warp, so the shared-memory reads of a warp fall in distinct banks.
// kPair (fp8_quantize_pair): each 8-element pack of x read is also quantised in x's own layout
// into `plain` (scales per x row or per tensor), 8 bytes a thread (plain.out 8-byte aligned).
constexpr int kBig = 64;
template <typename T, bool kPair>
__global__ void __launch_bounds__(kThreads) quantize_transposed_vec_kernel(const QuantizeParams p,
                                                                           const QuantizeParams plain) {
  wait_for_previous_kernel();
  __shared__ float tile[kBig][kBig + 1];  // [x row][x column]
  const T* x = static_cast<const T*>(p.x);
  const int64_t thread = (int64_t{blockIdx.y} * gridDim.x + blockIdx.x) * kThreads + threadIdx.x;
  write_scale_inv(p, thread);
  if constexpr (kPair) write_scale_inv(plain, thread);
  const int64_t r0 = int64_t{blockIdx.x} * kBig;  // out rows = x columns
  const int64_t c0 = int64_t{blockIdx.y} * kBig;  // out columns = x rows
#pragma unroll
  for (int k = 0; k < kBig * kBig / kVec / kThreads; ++k) {
    const int i = (threadIdx.x + k * kThreads) / (kBig / kVec), v = (threadIdx.x + k * kThreads) % (kBig / kVec);
    const int64_t xr = c0 + i, xc = r0 + v * kVec;
    float f[kVec] = {};
    if (xr < p.cols && xc < p.rows) {
      load_pack<T, kVec>(x + xr * p.rows + xc, f);
      if constexpr (kPair) {
        const float scale = scale_of(plain.amax[plain.n_scales > 1 ? xr : 0], plain.max_finite);
        Pack<uint8_t, kVec> o;
#pragma unroll
        for (int e = 0; e < kVec; ++e) o.v[e] = encode(f[e] * scale, plain.e4m3);
        *reinterpret_cast<Pack<uint8_t, kVec>*>(plain.out + xr * p.rows + xc) = o;
      }
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) tile[i][v * kVec + e] = f[e];
  }
  __syncthreads();
  const int rr = threadIdx.x % kBig, chunk = threadIdx.x / kBig;  // 4 chunks of 16 out columns
  const int64_t r = r0 + rr, c = c0 + chunk * 16;
  if (r >= p.rows || c >= p.cols) return;
  const float scale = scale_of(p.amax[p.n_scales > 1 ? r : 0], p.max_finite);
  Pack<uint8_t, 16> o;
#pragma unroll
  for (int e = 0; e < 16; ++e) o.v[e] = encode(tile[chunk * 16 + e][rr] * scale, p.e4m3);
  *reinterpret_cast<Pack<uint8_t, 16>*>(p.out + r * p.cols + c) = o;
}

// Whether the 16-byte transposed kernel takes p (out = x^T; see above).
bool transposed_vec(const QuantizeParams& p) {
  return p.rows % kVec == 0 && p.cols % 16 == 0 && aligned16(p.x) && aligned16(p.out);
}

template <typename T, bool kPair>
void launch_transposed_vec(const QuantizeParams& p, const QuantizeParams& plain) {
  const int64_t gx = std::max<int64_t>(ceil_div(p.rows, kBig), 1), gy = std::max<int64_t>(ceil_div(p.cols, kBig), 1);
  ENSURE(gy <= 65535, "fp8 quantise: x has ", p.cols, " rows, the transposed kernel takes at most ", 65535 * kBig);
  // (enough threads for the inverse scales: out's rows, at most 64 a block's 256 threads, and
  // x's rows, 64 a block)
  quantize_transposed_vec_kernel<T, kPair><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kThreads, 0,
                                             stream()>>>(p, plain);
  check_launch("fp8 quantize_transposed_vec_kernel");
}

QuantizeParams quantize_params(const Tensor& x, const Tensor& amax, ops::Fp8Format format, const Tensor& out,
                               const Tensor& scale_inv) {
  return {x.data, out.size(0), out.size(1), static_cast<const float*>(amax.data),
          static_cast<float*>(scale_inv.data), amax.size(0), static_cast<uint8_t*>(out.data),
          ops::fp8_max(format), format == ops::Fp8Format::E4M3};
}

template <typename F>
void float_input(const Tensor& x, const char* op, F&& f) {
  expect_cuda_float(x, op, "x");
  if (x.dtype == DType::BF16) f(bf16_t{});
  else f(float{});
}

}  // namespace

void fp8_amax(const Tensor& x, bool transpose, const Tensor& amax) {
  expect_cuda(amax, "fp8_amax", "amax");
  const int64_t rows = x.size(0), cols = x.size(1);
  auto* out = static_cast<unsigned*>(amax.data);
  const bool per_row = amax.size(0) == (transpose ? cols : rows) && amax.size(0) != 1;
  // 8 elements a thread: rows of a multiple of 8 and a 16-byte aligned start.
  const bool vec = cols % kVec == 0 && aligned16(x.data);
  float_input(x, "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data);
    if (per_row && !transpose) {
      if (rows == 0) return;
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(rows, 1 << 20));
      if (vec) amax_rows_kernel<T, kVec><<<grid, kThreads, 0, stream()>>>(px, rows, cols, out);
      else amax_rows_kernel<T, 1><<<grid, kThreads, 0, stream()>>>(px, rows, cols, out);
      check_launch("fp8 amax_rows_kernel");
      return;
    }
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * static_cast<size_t>(amax.size(0)), stream()));
    if (x.numel() == 0) return;
    if (per_row && cols % kColVec == 0 && aligned16(x.data)) {
      const int64_t col_blocks = ceil_div(cols, kColSpan);
      // about four blocks an SM, each over at least 8 rows a warp
      const int64_t row_blocks = std::clamp<int64_t>(int64_t{sm_count()} * 4 / col_blocks, 1,
                                                     std::min<int64_t>(ceil_div(rows, 8 * kColWarps), 65535));
      const int64_t per_block = ceil_div(rows, row_blocks);
      amax_columns_vec_kernel<T><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(ceil_div(rows, per_block))),
                                   kThreads, 0, stream()>>>(px, rows, cols, per_block, out);
      check_launch("fp8 amax_columns_vec_kernel");
    } else if (per_row) {
      const int64_t col_blocks = ceil_div(cols, kThreads);
      const int64_t row_groups = std::clamp<int64_t>(int64_t{sm_count()} * 8 / col_blocks, 1, std::min<int64_t>(rows, 65535));
      amax_columns_kernel<T><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_groups)), kThreads, 0,
                               stream()>>>(px, rows, cols, out);
      check_launch("fp8 amax_columns_kernel");
    } else {
      if (vec) amax_tensor_kernel<T, kVec><<<stream_blocks(x.numel() / kVec, kThreads), kThreads, 0, stream()>>>(px, x.numel(), out);
      else amax_tensor_kernel<T, 1><<<stream_blocks(x.numel(), kThreads), kThreads, 0, stream()>>>(px, x.numel(), out);
      check_launch("fp8 amax_tensor_kernel");
    }
  });
}

void fp8_quantize(const Tensor& x, bool transpose, const Tensor& amax, ops::Fp8Format format,
                  const Tensor& out, const Tensor& scale_inv) {
  expect_cuda(amax, "fp8_quantize", "amax");
  expect_cuda(out, "fp8_quantize", "out");
  expect_cuda(scale_inv, "fp8_quantize", "scale_inv");
  const QuantizeParams p = quantize_params(x, amax, format, out, scale_inv);
  float_input(x, "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    if (!transpose) {
      const bool vec = p.cols % kVec == 0 && aligned16(x.data) && reinterpret_cast<uintptr_t>(out.data) % kVec == 0;
      const unsigned grid = stream_blocks(std::max(out.numel() / (vec ? kVec : 1), p.n_scales), kThreads);
      if (vec) quantize_kernel<T, kVec><<<grid, kThreads, 0, stream()>>>(p);
      else quantize_kernel<T, 1><<<grid, kThreads, 0, stream()>>>(p);
      check_launch("fp8 quantize_kernel");
      return;
    }
    if (transposed_vec(p)) {
      launch_transposed_vec<T, false>(p, p);
      return;
    }
    const int64_t gx = std::max<int64_t>(ceil_div(p.rows, kTile), 1), gy = std::max<int64_t>(ceil_div(p.cols, kTile), 1);
    ENSURE(gy <= 65535, "fp8_quantize: x has ", x.size(0), " rows, the transposed kernel takes at most ",
           65535 * kTile);
    quantize_transposed_kernel<T><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kTile * 8, 0, stream()>>>(p);
    check_launch("fp8 quantize_transposed_kernel");
  });
}

void fp8_quantize_pair(const Tensor& x, const Tensor& amax, const Tensor& amax_t, ops::Fp8Format format,
                       const Tensor& out, const Tensor& scale_inv, const Tensor& out_t, const Tensor& scale_inv_t) {
  expect_cuda(out_t, "fp8_quantize_pair", "out_t");
  expect_cuda(scale_inv_t, "fp8_quantize_pair", "scale_inv_t");
  expect_cuda(amax_t, "fp8_quantize_pair", "amax_t");
  const QuantizeParams p = quantize_params(x, amax_t, format, out_t, scale_inv_t);
  // One pass where the 16-byte transposed kernel takes x and out is 8-byte aligned; else the two
  // layouts one after the other (the same bytes).
  if (!transposed_vec(p) || reinterpret_cast<uintptr_t>(out.data) % kVec != 0) {
    cuda::fp8_quantize(x, false, amax, format, out, scale_inv);
    cuda::fp8_quantize(x, true, amax_t, format, out_t, scale_inv_t);
    return;
  }
  expect_cuda(out, "fp8_quantize_pair", "out");
  expect_cuda(scale_inv, "fp8_quantize_pair", "scale_inv");
  expect_cuda(amax, "fp8_quantize_pair", "amax");
  const QuantizeParams plain = quantize_params(x, amax, format, out, scale_inv);
  float_input(x, "fp8_quantize_pair", [&](auto tag) { launch_transposed_vec<decltype(tag), true>(p, plain); });
}

}  // namespace engine::cuda
