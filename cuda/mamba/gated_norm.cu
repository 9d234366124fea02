// Mamba-2's gated RMSNorm (ops/ssd.h: v = y silu(z), out = weight v / sqrt(sumsq / W_total + eps))
// on the GPU, in the ops' two phases each way:
//   sumsq, dot: one warp per row (8 rows a block), lanes striding the row's columns, a shuffle tree;
//   forward: one thread per element of a grid-stride loop;
//   backward: a thread per column over a group of kRows rows (dy, dz per element; dweight's
//     partial sum of the group in a register, written to a (groups, W) f32 scratch), then a
//     kernel adding the groups' partials into dweight in group order.
// Every sum is f32 in a fixed order: reproducible bit for bit.
// Memory: y, z, dout, out, dy, dz bf16 column blocks (any alignment: scalar accesses), weight
// bf16, sumsq and dot f32 (T), dweight f32 (W) +=.
#include "ops/ssd.h"

#include "cuda/mamba/common.cuh"

namespace engine::cuda {
namespace {

using namespace mamba;

constexpr int64_t kRows = 64;  // rows per group of the backward (more past 65535 groups: grid.y's limit)

struct Rows {
  const bf16_t* p;
  int64_t ld;
  __device__ __forceinline__ float operator()(int64_t t, int64_t j) const { return bf(p[t * ld + j]); }
};
Rows rows(const ops::ColumnBlock& b) { return {block_ptr<const bf16_t>(b), b.ld()}; }

// out[t] = sum_j v^2 (kDot false) or sum_j dout w v (kDot true) over the row.
template <bool kDot>
__global__ void gated_row_sum_kernel(Rows y, Rows z, Rows dout, const bf16_t* __restrict__ w, int64_t T, int64_t W,
                                     float* __restrict__ out) {
  const int64_t t = blockIdx.x * int64_t{8} + threadIdx.x / 32;
  if (t >= T) return;
  float acc = 0.f;
  for (int64_t j = threadIdx.x % 32; j < W; j += 32) {
    const float v = y(t, j) * silu_f(z(t, j));
    acc += kDot ? dout(t, j) * bf(w[j]) * v : v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) out[t] = acc;
}

__global__ void gated_forward_kernel(Rows y, Rows z, const bf16_t* __restrict__ w, const float* __restrict__ sumsq,
                                     int64_t T, int64_t W, float inv_total, float eps, bf16_t* __restrict__ out,
                                     int64_t ldo) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < T * W; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = e / W, j = e % W;
    const float r = rsqrtf(sumsq[t] * inv_total + eps);
    out[t * ldo + j] = __float2bfloat16(bf(w[j]) * (y(t, j) * silu_f(z(t, j)) * r));
  }
}

__global__ void gated_backward_kernel(Rows dout, Rows y, Rows z, const bf16_t* __restrict__ w,
                                      const float* __restrict__ sumsq, const float* __restrict__ dot, int64_t T,
                                      int64_t W, float inv_total, float eps, bf16_t* __restrict__ dy, int64_t lddy,
                                      bf16_t* __restrict__ dz, int64_t lddz, int64_t per, float* __restrict__ partial) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= W) return;
  const float wj = bf(w[j]);
  float dw = 0.f;
  const int64_t t1 = min(T, (blockIdx.y + int64_t{1}) * per);
  for (int64_t t = blockIdx.y * per; t < t1; ++t) {
    const float r = rsqrtf(sumsq[t] * inv_total + eps), k = r * r * r * dot[t] * inv_total;
    const float yv = y(t, j), zv = z(t, j), go = dout(t, j);
    const float s = 1.f / (1.f + __expf(-zv)), v = yv * zv * s;
    const float dv = r * wj * go - v * k;
    dw += r * go * v;
    dy[t * lddy + j] = __float2bfloat16(dv * zv * s);
    dz[t * lddz + j] = __float2bfloat16(dv * yv * dsilu(zv, s));
  }
  partial[blockIdx.y * W + j] = dw;
}

__global__ void gated_dweight_kernel(const float* __restrict__ partial, int64_t groups, int64_t W,
                                     float* __restrict__ dweight) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= W) return;
  float s = 0.f;
  for (int64_t g = 0; g < groups; ++g) s += partial[g * W + j];
  dweight[j] += s;
}

void expect_f32(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::F32, op, ": ", name, " is ", dtype_name(t.dtype), ", expected f32");
}

void row_sum(const char* op, bool is_dot, const ops::ColumnBlock& y, const ops::ColumnBlock& z,
             const ops::ColumnBlock* dout, const Tensor& weight, const Tensor& out) {
  expect_bf16(y.base, op, "y");
  expect_f32(out, op, is_dot ? "dot" : "sumsq");
  const int64_t T = y.rows();
  if (T == 0) return;
  const Rows d = dout ? rows(*dout) : Rows{nullptr, 0};
  const bf16_t* w = weight.data ? static_cast<const bf16_t*>(weight.data) : nullptr;
  const unsigned blocks = static_cast<unsigned>(ceil_div(T, 8));
  if (is_dot)
    gated_row_sum_kernel<true><<<blocks, 256, 0, stream()>>>(rows(y), rows(z), d, w, T, y.width,
                                                            static_cast<float*>(out.data));
  else
    gated_row_sum_kernel<false><<<blocks, 256, 0, stream()>>>(rows(y), rows(z), d, w, T, y.width,
                                                             static_cast<float*>(out.data));
  check_launch("gated_row_sum_kernel");
}

}  // namespace

void gated_rmsnorm_sumsq(const ops::ColumnBlock& y, const ops::ColumnBlock& z, const Tensor& sumsq) {
  row_sum("gated_rmsnorm_sumsq", false, y, z, nullptr, Tensor{}, sumsq);
}

void gated_rmsnorm_dot(const ops::ColumnBlock& dout, const ops::ColumnBlock& y, const ops::ColumnBlock& z,
                       const Tensor& weight, const Tensor& dot) {
  row_sum("gated_rmsnorm_dot", true, y, z, &dout, weight, dot);
}

void gated_rmsnorm_forward(const ops::ColumnBlock& y, const ops::ColumnBlock& z, const Tensor& weight,
                           const Tensor& sumsq, int64_t total_width, float eps, const ops::ColumnBlock& out) {
  const char* op = "gated_rmsnorm_forward";
  expect_bf16(y.base, op, "y");
  expect_f32(sumsq, op, "sumsq");
  const int64_t T = y.rows(), W = y.width;
  if (T * W == 0) return;
  gated_forward_kernel<<<stream_blocks(T * W, 256), 256, 0, stream()>>>(
      rows(y), rows(z), static_cast<const bf16_t*>(weight.data), static_cast<const float*>(sumsq.data), T, W,
      1.f / static_cast<float>(total_width), eps, block_ptr<bf16_t>(out), out.ld());
  check_launch("gated_forward_kernel");
}

void gated_rmsnorm_backward(const ops::ColumnBlock& dout, const ops::ColumnBlock& y, const ops::ColumnBlock& z,
                            const Tensor& weight, const Tensor& sumsq, const Tensor& dot, int64_t total_width,
                            float eps, const ops::ColumnBlock& dy, const ops::ColumnBlock& dz, const Tensor& dweight) {
  const char* op = "gated_rmsnorm_backward";
  expect_bf16(y.base, op, "y");
  expect_f32(sumsq, op, "sumsq");
  expect_f32(dot, op, "dot");
  expect_f32(dweight, op, "dweight");
  const int64_t T = y.rows(), W = y.width;
  if (T * W == 0) return;
  const int64_t per = std::max(kRows, ceil_div(T, 65535)), groups = ceil_div(T, per);
  Owned partial = empty({groups * W}, DType::F32, Device::CUDA);
  const unsigned col_blocks = static_cast<unsigned>(ceil_div(W, 256));
  gated_backward_kernel<<<dim3(col_blocks, static_cast<unsigned>(groups)), 256, 0, stream()>>>(
      rows(dout), rows(y), rows(z), static_cast<const bf16_t*>(weight.data), static_cast<const float*>(sumsq.data),
      static_cast<const float*>(dot.data), T, W, 1.f / static_cast<float>(total_width), eps, block_ptr<bf16_t>(dy),
      dy.ld(), block_ptr<bf16_t>(dz), dz.ld(), per, static_cast<float*>(partial.t.data));
  check_launch("gated_backward_kernel");
  gated_dweight_kernel<<<col_blocks, 256, 0, stream()>>>(static_cast<const float*>(partial.t.data), groups, W,
                                                         static_cast<float*>(dweight.data));
  check_launch("gated_dweight_kernel");
}

}  // namespace engine::cuda
