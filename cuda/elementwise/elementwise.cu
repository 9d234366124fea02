// Whole-tensor element-wise ops and reductions on the GPU (ops/elementwise.h).
//   add:            out_i = a_i + b_i           (in f32, rounded once to the dtype)
//   scale_inplace:  x_i = x_i * s               (in double, rounded to f32 then to the dtype,
//                                                exactly as the CPU reference)
//   cast:           dst_i = src_i               (bf16 <- f32 rounds to nearest even)
//   sum, sum_squares, count_nonfinite: sum over i of x_i, x_i^2, [x_i is NaN or inf]
// Memory: contiguous tensors; every thread moves 8 elements per step with 16-byte accesses
// (cuda/common/vector.cuh: misaligned heads peeled, pointers that disagree on their
// misalignment fall back to element accesses), in a grid-stride loop over one wave of blocks.
// cast bf16 -> f32 has its own body layout (cast_bf16_f32_kernel: whole-sector f32 stores).
// Reductions: each thread adds the 8 terms of a vector in f32 and the vector sums into a double;
// blocks reduce in a fixed tree into one double per block (at most kReduceBlocks, a number set by
// the element count alone), and a single block adds those in order. No atomics, so the same tensor
// gives the same bits every run. Limit: squares are formed in f32, so |x| must stay below ~1e19.
// The shared preconditions ran before (ops/elementwise.cpp); the launchers check the dtypes they
// take: bf16 or f32 (cast refuses f64 by name).
#include "ops/elementwise.h"

#include <cmath>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"

namespace engine::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kE = 8;                 // elements per vector step (16 bytes of bf16, 32 of f32)
constexpr int kReduceBlocks = 2048;   // most partial sums of a reduction
constexpr int kFinishThreads = 1024;  // the block that adds the partial sums

// ---- argument checks ----------------------------------------------------------------------

// t in bf16 or f32.
void expect_float(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
         dtype_name(t.dtype), ", expected bf16 or f32");
}

// ---- element-wise maps --------------------------------------------------------------------

// Runs op.one(i) over the scalar head and tail and op.vec(i) over the aligned body.
template <typename Op>
__global__ void map_kernel(Op op, int64_t n, int64_t head) {
  wait_for_previous_kernel();
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t nvec = (n - head) / kE, tail = head + nvec * kE;
  for (int64_t v = tid; v < nvec; v += stride) op.vec(head + v * kE);
  for (int64_t i = tid; i < head; i += stride) op.one(i);
  for (int64_t i = tail + tid; i < n; i += stride) op.one(i);
}

template <typename T>
struct AddOp {
  const T* a;
  const T* b;
  T* out;
  __device__ void one(int64_t i) const { out[i] = from_float<T>(to_float(a[i]) + to_float(b[i])); }
  __device__ void vec(int64_t i) const {
    float x[kE], y[kE];
    load_pack(a + i, x);
    load_pack(b + i, y);
#pragma unroll
    for (int k = 0; k < kE; ++k) x[k] += y[k];
    store_pack(out + i, x);
  }
};

template <typename T>
struct ScaleOp {
  T* x;
  double s;
  __device__ float scaled(float v) const {
    return static_cast<float>(static_cast<double>(v) * s);
  }
  __device__ void one(int64_t i) const { x[i] = from_float<T>(scaled(to_float(x[i]))); }
  __device__ void vec(int64_t i) const {
    float v[kE];
    load_pack(x + i, v);
#pragma unroll
    for (int k = 0; k < kE; ++k) v[k] = scaled(v[k]);
    store_pack(x + i, v);
  }
};

template <typename S, typename D>
struct CastOp {
  const S* src;
  D* dst;
  __device__ void one(int64_t i) const { dst[i] = from_float<D>(to_float(src[i])); }
  __device__ void vec(int64_t i) const {
    float v[kE];
    load_pack(src + i, v);
    store_pack(dst + i, v);
  }
};

// bf16 -> f32 body (head peeled, so src + head and dst + head are 16-byte aligned). A 16-byte
// f32 store per lane from 8-element vectors would leave every 32-byte sector it touches half
// written (lane l's 32 bytes take two instructions); here, in each 256-element span of a warp,
// lane l converts elements [4l, 4l + 4) and [128 + 4l, 128 + 4l + 4): each of its two 8-byte
// loads and two 16-byte stores is contiguous across the warp (whole sectors per instruction).
// kCastSpans spans per loop trip, so 2 kCastSpans loads are in flight per lane. The elements
// past the last whole span (fewer than 256) go one per thread.
constexpr int kCastSpan = 256;
constexpr int kCastSpans = 4;

__global__ void __launch_bounds__(kThreads) cast_bf16_f32_kernel(const bf16_t* src, float* dst,
                                                                 int64_t n, int64_t head) {
  wait_for_previous_kernel();
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int lane = threadIdx.x & 31;
  const int64_t warp = tid >> 5, warps = stride >> 5;
  const int64_t spans = (n - head) / kCastSpan, rest = head + spans * kCastSpan;
  const bf16_t* s0 = src + head + 4 * lane;
  float* d0 = dst + head + 4 * lane;
  auto load = [&](int64_t span, int half) {
    return *reinterpret_cast<const uint2*>(s0 + span * kCastSpan + half * (kCastSpan / 2));
  };
  auto store = [&](int64_t span, int half, uint2 v) {
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&v.x);
    const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&v.y);
    const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
    *reinterpret_cast<float4*>(d0 + span * kCastSpan + half * (kCastSpan / 2)) =
        make_float4(a.x, a.y, b.x, b.y);
  };
  int64_t s = warp;
  for (; s + (kCastSpans - 1) * warps < spans; s += kCastSpans * warps) {
    uint2 v[kCastSpans][2];
#pragma unroll
    for (int u = 0; u < kCastSpans; ++u) {
      v[u][0] = load(s + u * warps, 0);
      v[u][1] = load(s + u * warps, 1);
    }
#pragma unroll
    for (int u = 0; u < kCastSpans; ++u) {
      store(s + u * warps, 0, v[u][0]);
      store(s + u * warps, 1, v[u][1]);
    }
  }
  for (; s < spans; s += warps) {
    const uint2 a = load(s, 0), b = load(s, 1);
    store(s, 0, a);
    store(s, 1, b);
  }
  for (int64_t i = tid; i < head; i += stride) dst[i] = __bfloat162float(src[i]);
  for (int64_t i = rest + tid; i < n; i += stride) dst[i] = __bfloat162float(src[i]);
}

template <typename Op>
void launch_map(const Op& op, int64_t n, std::initializer_list<VecPtr> ptrs, const char* name) {
  if (n == 0) return;
  const int64_t head = vector_head(ptrs, kE, n);
  const unsigned blocks = stream_blocks(vector_items(n, head, kE), kThreads);
  launch_dependent(map_kernel<Op>, blocks, kThreads, 0, op, n, head);
  check_launch(name);
}

void launch_cast_bf16_f32(const bf16_t* src, float* dst, int64_t n, int64_t head) {
  const int64_t spans = (n - head) / kCastSpan;
  const int blocks = persistent_grid(cast_bf16_f32_kernel, kThreads, 0,
                                     std::max<int64_t>(1, ceil_div(spans * 32, kThreads)));
  launch_dependent(cast_bf16_f32_kernel, blocks, kThreads, 0, src, dst, n, head);
  check_launch("cast_bf16_f32_kernel");
}

// ---- reductions ---------------------------------------------------------------------------

enum class Reduce { Sum, SumSquares, NonFinite };

template <Reduce R>
__device__ __forceinline__ float term(float x) {
  if constexpr (R == Reduce::Sum) return x;
  else if constexpr (R == Reduce::SumSquares) return x * x;
  else return isfinite(x) ? 0.f : 1.f;
}

// Sums s[0 .. blockDim.x) into s[0] in a fixed tree (blockDim.x a power of two).
__device__ __forceinline__ void block_tree_sum(double* s) {
  for (int off = blockDim.x / 2; off > 0; off >>= 1) {
    if (static_cast<int>(threadIdx.x) < off) s[threadIdx.x] += s[threadIdx.x + off];
    __syncthreads();
  }
}

template <Reduce R, typename T>
__global__ void reduce_partial_kernel(const T* x, int64_t n, int64_t head, double* partial) {
  __shared__ double s[kThreads];
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t nvec = (n - head) / kE, tail = head + nvec * kE;
  auto vector_sum = [](const float (&e)[kE]) {
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < kE; ++k) part += term<R>(e[k]);
    return part;
  };
  double acc = 0;
  int64_t v = tid;
  for (; v + stride < nvec; v += 2 * stride) {  // two vectors in flight, added in index order
    float e0[kE], e1[kE];
    load_pack(x + head + v * kE, e0);
    load_pack(x + head + (v + stride) * kE, e1);
    acc += vector_sum(e0);
    acc += vector_sum(e1);
  }
  if (v < nvec) {
    float e[kE];
    load_pack(x + head + v * kE, e);
    acc += vector_sum(e);
  }
  for (int64_t i = tid; i < head; i += stride) acc += term<R>(to_float(x[i]));
  for (int64_t i = tail + tid; i < n; i += stride) acc += term<R>(to_float(x[i]));
  s[threadIdx.x] = acc;
  __syncthreads();
  block_tree_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

__global__ void reduce_finish_kernel(const double* partial, int count, double* out) {
  __shared__ double s[kFinishThreads];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  s[threadIdx.x] = acc;
  __syncthreads();
  block_tree_sum(s);
  if (threadIdx.x == 0) *out = s[0];
}

// Device scratch for the partial sums and the result; only grows. Reuse is ordered by the
// compute stream, and the result is read back before the next reduction can start.
double* reduce_scratch() {
  static Buffer buf(sizeof(double) * (kReduceBlocks + 1), Device::CUDA);
  return static_cast<double*>(buf.data());
}

template <Reduce R>
double reduce(const Tensor& x, const char* op) {
  expect_float(x, op, "x");
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  double* partial = reduce_scratch();
  double* result = partial + kReduceBlocks;
  const size_t elem = dtype_size(x.dtype);
  const int64_t head = vector_head({{x.data, elem}}, kE, n);
  // The grid depends on n and the alignment only, so the summation order is fixed per tensor.
  const int blocks = static_cast<int>(
      std::clamp<int64_t>(ceil_div(vector_items(n, head, kE), kThreads), 1, kReduceBlocks));
  if (x.dtype == DType::BF16)
    reduce_partial_kernel<R><<<blocks, kThreads, 0, stream()>>>(static_cast<const bf16_t*>(x.data),
                                                                 n, head, partial);
  else
    reduce_partial_kernel<R><<<blocks, kThreads, 0, stream()>>>(static_cast<const float*>(x.data),
                                                                 n, head, partial);
  check_launch(op);
  reduce_finish_kernel<<<1, kFinishThreads, 0, stream()>>>(partial, blocks, result);
  check_launch(op);
  double host = 0;
  device::copy(&host, false, result, true, sizeof(double));  // waits for the compute stream
  return host;
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  expect_float(a, "add", "a");  // b and out have a's dtype (ops/elementwise.cpp)
  const int64_t n = a.numel();
  const size_t e = dtype_size(a.dtype);
  if (a.dtype == DType::BF16)
    launch_map(AddOp<bf16_t>{static_cast<const bf16_t*>(a.data), static_cast<const bf16_t*>(b.data),
                             static_cast<bf16_t*>(out.data)},
               n, {{a.data, e}, {b.data, e}, {out.data, e}}, "add_kernel<bf16>");
  else
    launch_map(AddOp<float>{static_cast<const float*>(a.data), static_cast<const float*>(b.data),
                            static_cast<float*>(out.data)},
               n, {{a.data, e}, {b.data, e}, {out.data, e}}, "add_kernel<f32>");
}

void add_inplace(const Tensor& acc, const Tensor& x) {
  expect_float(acc, "add_inplace", "acc");
  add(acc, x, acc);
}

void scale_inplace(const Tensor& x, double s) {
  expect_float(x, "scale_inplace", "x");
  const int64_t n = x.numel();
  const size_t e = dtype_size(x.dtype);
  if (x.dtype == DType::BF16)
    launch_map(ScaleOp<bf16_t>{static_cast<bf16_t*>(x.data), s}, n, {{x.data, e}},
               "scale_kernel<bf16>");
  else
    launch_map(ScaleOp<float>{static_cast<float*>(x.data), s}, n, {{x.data, e}},
               "scale_kernel<f32>");
}

void cast(const Tensor& src, const Tensor& dst) {
  const char* op = "cast";
  for (const Tensor* t : {&src, &dst})
    ENSURE(t->dtype != DType::F64, op, ": ", t == &src ? "src" : "dst",
           " is f64; the GPU holds no f64 tensors (cast on the CPU, then copy)");
  expect_float(src, op, "src");
  expect_float(dst, op, "dst");
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.dtype == dst.dtype) {
    if (src.data != dst.data)
      CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  const std::initializer_list<VecPtr> ptrs = {{src.data, dtype_size(src.dtype)},
                                              {dst.data, dtype_size(dst.dtype)}};
  if (src.dtype == DType::F32)
    launch_map(CastOp<float, bf16_t>{static_cast<const float*>(src.data), static_cast<bf16_t*>(dst.data)},
               n, ptrs, "cast_kernel<f32, bf16>");
  else if (const int64_t head = vector_head(ptrs, kE, n); head < n)
    launch_cast_bf16_f32(static_cast<const bf16_t*>(src.data), static_cast<float*>(dst.data), n,
                         head);
  else  // the pointers disagree on their misalignment: element by element
    launch_map(CastOp<bf16_t, float>{static_cast<const bf16_t*>(src.data), static_cast<float*>(dst.data)},
               n, ptrs, "cast_kernel<bf16, f32>");
}

double sum(const Tensor& x) { return reduce<Reduce::Sum>(x, "sum"); }
double sum_squares(const Tensor& x) { return reduce<Reduce::SumSquares>(x, "sum_squares"); }
int64_t count_nonfinite(const Tensor& x) {
  return static_cast<int64_t>(reduce<Reduce::NonFinite>(x, "count_nonfinite"));
}

namespace {

// ---- copy_columns: one thread per element of the block -------------------------------------

template <typename S, typename D>
__global__ void copy_columns_kernel(const S* src, int64_t cs, D* dst, int64_t cd, int64_t rows, int64_t width,
                                    bool accumulate) {
  const int64_t n = rows * width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i - r * width;
    const float v = to_float(src[r * cs + c]);
    D& d = dst[r * cd + c];
    d = from_float<D>(accumulate ? to_float(d) + v : v);
  }
}

template <typename S, typename D>
void launch_copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,
                         bool accumulate) {
  const int64_t rows = src.size(0);
  copy_columns_kernel<S, D><<<stream_blocks(rows * width, kThreads), kThreads, 0, stream()>>>(
      static_cast<const S*>(src.data) + src_col, src.size(1), static_cast<D*>(dst.data) + dst_col, dst.size(1),
      rows, width, accumulate);
  check_launch("copy_columns_kernel");
}

}  // namespace

void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,
                  bool accumulate) {
  const char* op = "copy_columns";
  expect_float(src, op, "src");
  expect_float(dst, op, "dst");
  if (src.size(0) == 0 || width == 0) return;
  const bool sb = src.dtype == DType::BF16, db = dst.dtype == DType::BF16;
  if (sb && db) launch_copy_columns<bf16_t, bf16_t>(src, src_col, dst, dst_col, width, accumulate);
  else if (sb) launch_copy_columns<bf16_t, float>(src, src_col, dst, dst_col, width, accumulate);
  else if (db) launch_copy_columns<float, bf16_t>(src, src_col, dst, dst_col, width, accumulate);
  else launch_copy_columns<float, float>(src, src_col, dst, dst_col, width, accumulate);
}

}  // namespace engine::cuda

