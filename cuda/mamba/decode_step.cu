// One token of the Mamba mixer against its cached state (ops/decode.h):
//   causal_conv1d_step:  pre[d] = bias[d] + sum_{k < K-1} w[d, k] state[k, d] + w[d, K-1] x[d],
//                        y = silu(pre) or pre; the state shifts up a row and takes x last
//   selective_scan_step: delta = softplus(dt + dt_bias), h[d, n] = exp(delta A[d, n]) h[d, n] +
//                        delta B[n] x[d], y[d] = (sum_n C[n] h[d, n] + D[d] x[d]) silu(z[d])
// One thread per channel d (it alone reads and writes its state); in f32, softplus and exp by the
// library's accurate functions (one token: no throughput to win with the training kernels'
// polynomials). Memory: activations, weights and the conv state bf16; the scan state f32.
// The shared checks ran (ops/decode.cpp); here: the dtypes and the kernels' limits.
#include "ops/decode.h"

#include "cuda/common/launch.cuh"
#include "cuda/mamba/common.cuh"

namespace engine::cuda {
namespace {

constexpr int kThreads = 128;

struct ConvStepArgs {
  const bf16_t* x;       // channel d at x[d]
  bf16_t* state;         // (K - 1, Di)
  const bf16_t* weight;  // (Di, K)
  const bf16_t* bias;    // (Di) or null
  bf16_t* y;             // channel d at y[d]
  int channels, k;
  bool silu;
};

__global__ void __launch_bounds__(kThreads) conv_step_kernel(const ConvStepArgs a) {
  const int d = blockIdx.x * kThreads + threadIdx.x;
  if (d >= a.channels) return;
  const float u = mamba::bf(a.x[d]);
  const bf16_t* w = a.weight + int64_t{d} * a.k;
  float acc = a.bias ? mamba::bf(a.bias[d]) : 0.f;
  for (int j = 0; j + 1 < a.k; ++j) acc = fmaf(mamba::bf(w[j]), mamba::bf(a.state[int64_t{j} * a.channels + d]), acc);
  acc = fmaf(mamba::bf(w[a.k - 1]), u, acc);
  for (int j = 0; j + 2 < a.k; ++j) a.state[int64_t{j} * a.channels + d] = a.state[int64_t{j + 1} * a.channels + d];
  if (a.k > 1) a.state[int64_t{a.k - 2} * a.channels + d] = a.x[d];
  a.y[d] = __float2bfloat16(a.silu ? acc / (1.f + expf(-acc)) : acc);
}

struct ScanStepArgs {
  const bf16_t *x, *dt, *A_log, *B, *C, *D, *dt_bias, *z;  // x, dt, z: channel d at [d]; B, C: (N)
  float* state;                                           // (Di, N)
  bf16_t* y;
  int channels, states;
};

__global__ void __launch_bounds__(kThreads) scan_step_kernel(const ScanStepArgs a) {
  const int d = blockIdx.x * kThreads + threadIdx.x;
  if (d >= a.channels) return;
  const float v = mamba::bf(a.dt[d]) + mamba::bf(a.dt_bias[d]);
  const float delta = v > 0.f ? v + log1pf(expf(-v)) : log1pf(expf(v));
  const float u = mamba::bf(a.x[d]);
  float* h = a.state + int64_t{d} * a.states;
  float acc = 0.f;
  for (int n = 0; n < a.states; ++n) {
    const float A = -expf(mamba::bf(a.A_log[int64_t{d} * a.states + n]));
    h[n] = fmaf(expf(delta * A), h[n], delta * mamba::bf(a.B[n]) * u);
    acc = fmaf(mamba::bf(a.C[n]), h[n], acc);
  }
  const float zv = mamba::bf(a.z[d]);
  a.y[d] = __float2bfloat16((acc + mamba::bf(a.D[d]) * u) * (zv / (1.f + expf(-zv))));
}

}  // namespace

void causal_conv1d_step(const ops::ColumnBlock& x, const Tensor& state, const Tensor& weight, const Tensor& bias,
                        bool silu, const ops::ColumnBlock& y) {
  const char* op = "causal_conv1d_step";
  mamba::expect_bf16(weight, op, "weight");
  const int64_t di = weight.size(0), k = weight.size(1);
  ENSURE(k <= ops::kMambaMaxConv, op, ": kernel size ", k, " is larger than the kernels take (", ops::kMambaMaxConv,
         ")");
  ENSURE(di < (int64_t{1} << 31), op, ": ", di, " channels");
  if (k > 1) mamba::expect_bf16(state, op, "state");
  ConvStepArgs a{mamba::block_ptr<const bf16_t>(x), k > 1 ? static_cast<bf16_t*>(state.data) : nullptr,
                 static_cast<const bf16_t*>(weight.data), bias.data ? static_cast<const bf16_t*>(bias.data) : nullptr,
                 mamba::block_ptr<bf16_t>(y), static_cast<int>(di), static_cast<int>(k), silu};
  if (di == 0) return;
  conv_step_kernel<<<static_cast<unsigned>(ceil_div(di, kThreads)), kThreads, 0, stream()>>>(a);
  check_launch(op);
}

void selective_scan_step(const ops::ScanArgs& s, const Tensor& state, const ops::ColumnBlock& y) {
  const char* op = "selective_scan_step";
  mamba::expect_bf16(s.A_log, op, "A_log");
  ENSURE(state.dtype == DType::F32, op, ": state is ", dtype_name(state.dtype), ", expected f32");
  const int64_t di = s.A_log.size(0), n = s.A_log.size(1);
  ENSURE(di < (int64_t{1} << 31) && n <= ops::kMambaMaxState, op, ": ", di, " channels of ", n,
         " states (the kernels take up to ", ops::kMambaMaxState, ")");
  ScanStepArgs a{mamba::block_ptr<const bf16_t>(s.x), static_cast<const bf16_t*>(s.dt.data),
                 static_cast<const bf16_t*>(s.A_log.data), mamba::block_ptr<const bf16_t>(s.B),
                 mamba::block_ptr<const bf16_t>(s.C), static_cast<const bf16_t*>(s.D.data),
                 static_cast<const bf16_t*>(s.dt_bias.data), mamba::block_ptr<const bf16_t>(s.z),
                 static_cast<float*>(state.data), mamba::block_ptr<bf16_t>(y), static_cast<int>(di),
                 static_cast<int>(n)};
  if (di == 0) return;
  scan_step_kernel<<<static_cast<unsigned>(ceil_div(di, kThreads)), kThreads, 0, stream()>>>(a);
  check_launch(op);
}

}  // namespace engine::cuda
