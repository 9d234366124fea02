// Per-head RMSNorm of the q and k heads of a packed qkv tensor, in place (ops/qk_norm.h):
//   forward   rstd = 1 / sqrt(mean(r^2) + eps),  input <- r,  r <- r * rstd * w_(q or k)
//   backward  xhat = input * rstd, g = dy * w,  dx = rstd (g - xhat mean(g xhat)),
//             dw_(q or k) += sum over its rows of dy * xhat
// A warp per row (t, head), lanes striding over the D elements (coalesced; a row is read twice,
// the second time from L1/L2). Sums in f32.
// Backward weight gradients, deterministic: a fixed grid (a function of the row count only)
// whose warps each take every (grid x kWarps)-th row and add their dy * xhat into their own
// slice of shared memory (a lane owns its columns, so no atomics); a block adds its warps'
// slices in order into its partial row of a scratch (grid, 2, D) and a second kernel sums the
// partial rows in block order into dweight.
// Memory: x, input, weight bf16 or f32; rstd, dweight f32. Limits: D <= 1024 (the backward's
// shared memory), rows (T x normalised heads) < 2^31 x kWarps.
// The shared preconditions ran before (ops/qk_norm.cpp); the launchers check the dtypes and D.
#include <algorithm>
#include <cstdint>

#include "core/buffer.h"
#include "ops/qk_norm.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp.cuh"

namespace engine::cuda {
namespace {

constexpr int kWarps = 4;  // rows in flight per block
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeadDim = 1024;
constexpr int64_t kMaxBwdBlocks = 1024;  // backward grid (partial rows of the weight gradients)
constexpr int kSumThreads = 256;

template <typename T>
struct QkNormParams {
  T* x;              // (T, heads, d), normalised in place / dy in, dx out
  T* input;          // (T, normed, d) the forward's input rows
  const T* weight;   // (2, d): q, k
  float* rstd;       // (T, normed)
  float* partial;    // backward: (grid, 2, d) per-block weight-gradient sums
  int64_t rows;      // T * normed
  int heads, normed, q_heads, d;
  float eps;
};

template <typename T>
static __global__ void __launch_bounds__(kThreads) qk_norm_forward_kernel(const QkNormParams<T> p) {
  wait_for_previous_kernel();
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  if (row >= p.rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t t = row / p.normed;
  const int h = static_cast<int>(row % p.normed);
  T* x = p.x + (t * p.heads + h) * p.d;
  T* in = p.input + row * p.d;
  const T* w = p.weight + (h < p.q_heads ? 0 : p.d);
  float ss = 0.f;
  for (int j = lane; j < p.d; j += 32) {
    const float v = to_float(x[j]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float rs = 1.f / sqrtf(ss / static_cast<float>(p.d) + p.eps);
  for (int j = lane; j < p.d; j += 32) {
    const T v = x[j];
    in[j] = v;
    x[j] = from_float<T>(to_float(v) * rs * to_float(w[j]));
  }
  if (lane == 0) p.rstd[row] = rs;
}

template <typename T>
static __global__ void __launch_bounds__(kThreads) qk_norm_backward_kernel(const QkNormParams<T> p) {
  wait_for_previous_kernel();
  extern __shared__ float acc_all[];  // (kWarps, 2, d)
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int width = 2 * p.d;
  for (int c = static_cast<int>(threadIdx.x); c < kWarps * width; c += kThreads) acc_all[c] = 0.f;
  __syncthreads();
  float* acc = acc_all + warp * width;
  const int64_t stride = int64_t{gridDim.x} * kWarps;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + warp; row < p.rows; row += stride) {
    const int64_t t = row / p.normed;
    const int h = static_cast<int>(row % p.normed);
    T* dx = p.x + (t * p.heads + h) * p.d;
    const T* in = p.input + row * p.d;
    const int which = h < p.q_heads ? 0 : 1;
    const T* w = p.weight + which * p.d;
    float* a = acc + which * p.d;
    const float rs = p.rstd[row];
    float gx = 0.f;
    for (int j = lane; j < p.d; j += 32) {
      const float dy = to_float(dx[j]), xhat = to_float(in[j]) * rs;
      gx += dy * to_float(w[j]) * xhat;
      a[j] += dy * xhat;
    }
    gx = warp_sum(gx) / static_cast<float>(p.d);
    for (int j = lane; j < p.d; j += 32) {
      const float g = to_float(dx[j]) * to_float(w[j]), xhat = to_float(in[j]) * rs;
      dx[j] = from_float<T>(rs * (g - xhat * gx));
    }
  }
  __syncthreads();
  float* out = p.partial + int64_t{blockIdx.x} * width;
  for (int c = static_cast<int>(threadIdx.x); c < width; c += kThreads) {
    float s = 0.f;
    for (int k = 0; k < kWarps; ++k) s += acc_all[k * width + c];
    out[c] = s;
  }
}

// dweight[c] += sum over blocks b (in order) of partial[b][c].
static __global__ void __launch_bounds__(kSumThreads)
    qk_norm_weight_grad_kernel(const float* partial, int blocks, int width, float* dweight) {
  wait_for_previous_kernel();
  const int c = static_cast<int>(blockIdx.x * kSumThreads + threadIdx.x);
  if (c >= width) return;
  float s = 0.f;
  for (int b = 0; b < blocks; ++b) s += partial[int64_t{b} * width + c];
  dweight[c] += s;
}

template <typename T>
QkNormParams<T> make_params(const Tensor& x, const Tensor& input, const Tensor& weight, int q_heads,
                            const Tensor& rstd, float eps, const char* op) {
  expect_cuda_float(x, op, "x");
  expect_cuda(input, x.dtype, input.shape, op, "input");
  expect_cuda(weight, x.dtype, weight.shape, op, "weight");
  expect_cuda(rstd, DType::F32, rstd.shape, op, "rstd");
  ENSURE(x.size(2) <= kMaxHeadDim, op, ": head_dim ", x.size(2), " is more than the kernel's ", kMaxHeadDim);
  const int64_t rows = x.size(0) * rstd.size(1);
  ENSURE(ceil_div(rows, kWarps) < (int64_t{1} << 31), op, ": ", rows, " rows are more than the grid takes");
  QkNormParams<T> p{};
  p.x = static_cast<T*>(x.data);
  p.input = static_cast<T*>(input.data);
  p.weight = static_cast<const T*>(weight.data);
  p.rstd = static_cast<float*>(rstd.data);
  p.rows = rows;
  p.heads = static_cast<int>(x.size(1));
  p.normed = static_cast<int>(rstd.size(1));
  p.q_heads = q_heads;
  p.d = static_cast<int>(x.size(2));
  p.eps = eps;
  return p;
}

}  // namespace

void qk_norm_forward(const Tensor& x, const Tensor& weight, int q_heads, float eps, const Tensor& input,
                     const Tensor& rstd) {
  const char* op = "qk_norm_forward";
  expect_cuda_float(x, op, "x");
  float_switch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const QkNormParams<T> p = make_params<T>(x, input, weight, q_heads, rstd, eps, op);
    if (p.rows == 0) return;
    launch_dependent(qk_norm_forward_kernel<T>, static_cast<unsigned>(ceil_div(p.rows, kWarps)), kThreads, 0, p);
    check_launch("qk_norm_forward_kernel");
  });
}

void qk_norm_backward(const Tensor& dx, const Tensor& input, const Tensor& weight, int q_heads,
                      const Tensor& rstd, const Tensor& dweight) {
  const char* op = "qk_norm_backward";
  expect_cuda_float(dx, op, "dx");
  expect_cuda(dweight, DType::F32, dweight.shape, op, "dweight");
  float_switch(dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    QkNormParams<T> p = make_params<T>(dx, input, weight, q_heads, rstd, 0.f, op);
    if (p.rows == 0) return;
    const int grid = static_cast<int>(std::min(ceil_div(p.rows, kWarps), kMaxBwdBlocks));
    const int width = 2 * p.d;
    // Released to the cache at return; later users of the block run after these kernels on the
    // same (compute) stream.
    Buffer scratch(static_cast<size_t>(grid) * width * sizeof(float), Device::CUDA);
    p.partial = static_cast<float*>(scratch.data());
    const size_t smem = static_cast<size_t>(kWarps) * width * sizeof(float);
    launch_dependent(qk_norm_backward_kernel<T>, grid, kThreads, smem, p);
    check_launch("qk_norm_backward_kernel");
    launch_dependent(qk_norm_weight_grad_kernel, static_cast<unsigned>(ceil_div(width, kSumThreads)), kSumThreads,
                     0, static_cast<const float*>(p.partial), grid, width, static_cast<float*>(dweight.data));
    check_launch("qk_norm_weight_grad_kernel");
  });
}

}  // namespace engine::cuda
