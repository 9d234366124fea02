// Causal depthwise conv1d of Mamba over packed documents (csrc/ops/mamba.h):
//   pre[t, d] = bias[d] + sum_{k < K} w[d, k] x[t - (K-1) + k, d]   (taps before the document: 0)
//   y = silu(pre) or pre
//   backward: dpre = dy silu'(pre) (pre recomputed), dx[s] = sum_k w[k] dpre[s + (K-1) - k] (taps
//   past the document's end: 0), dw[d, k] += sum_t dpre[t] x[t - (K-1) + k], dbias += sum_t dpre
// Work item: one channel d over a run of consecutive tokens (a thread), channels across the warp
// so every token row is read as runs of whole 32-byte sectors. The run length is chosen so that
// about 2^18 threads exist (one wave on an H200 holds 270k). A thread issues the loads of
// kGroup tokens together (bytes in flight), then walks them keeping the last K inputs in
// registers (the group's document-start bits too); at a document start the window is cleared. The backward walks K - 1 tokens past its
// run to finish dx of the run's last tokens: dx[s] is written once dpre[s + K - 1] is known, each
// dpre of the window counted only when its token is in s's document (its tokens-since-start
// count >= its distance from s).
// Weight gradients without float atomics: each thread writes its run's partial sums to a scratch
// (runs, K + 1, Di) f32 buffer; a second kernel adds them in run order into dweight / dbias
// (bitwise reproducible).
// Memory: x, y, dy, dx bf16 column blocks of row-major tensors (any alignment: scalar loads);
// weight, bias bf16; dweight, dbias f32. Limits: K <= 4, Di < 2^31 / 128 blocks, T < 2^31.
#include "cuda/mamba/conv1d.cuh"

#include <algorithm>
#include <cstdint>

#include "cuda/mamba/common.cuh"

namespace engine::cuda {

namespace {

constexpr int kThreads = 128;  // channels per block
constexpr int kMaxK = ops::kMambaMaxConv;
constexpr int kGroup = 16;     // tokens whose loads a thread issues together (<= 64)
constexpr int64_t kTargetThreads = int64_t{1} << 18;

struct ConvParams {
  const bf16_t* x;       // (T, ldx): channel d of token t at x[t * ldx + d]
  int64_t ldx;
  const bf16_t* w;       // (Di, K)
  const bf16_t* bias;    // (Di) or null
  const uint32_t* starts;  // (start_words) document-start bits
  int64_t start_words;
  int64_t tokens;
  int channels;
  int64_t run;           // tokens per thread
  bool silu;
  bf16_t* y;             // forward: (T, ldy)
  int64_t ldy;
  const bf16_t* dy;      // backward: (T, lddy)
  int64_t lddy;
  bf16_t* dx;            // backward: (T, lddx)
  int64_t lddx;
  float* part;           // backward: (runs, K + 1, Di) partial dweight (k < K) and dbias (k = K)
};

// Tokens of t's document before t, at most K - 1 (token 0 always starts a document).
template <int K>
__device__ __forceinline__ int taps_before(const uint32_t* starts, int64_t t) {
  int p = 0;
#pragma unroll
  for (int j = 1; j < K; ++j) {
    if (mamba::is_start(starts, t - j + 1)) break;
    p = j;
  }
  return p;
}

// The window hist[k] = x[t0 - (K-1) + k] (k < K - 1) of the run's first token, zeros before its
// document.
template <int K>
__device__ __forceinline__ void load_history(const ConvParams& p, int64_t t0, int d, int before,
                                             float (&hist)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) hist[k] = 0.f;
#pragma unroll
  for (int j = 1; j < K; ++j)
    if (j <= before) hist[K - 1 - j] = mamba::bf(p.x[(t0 - j) * p.ldx + d]);
}

template <int K>
static __global__ void __launch_bounds__(kThreads, 6) conv_fwd_kernel(ConvParams p) {
  const int d = blockIdx.y * kThreads + threadIdx.x;
  if (d >= p.channels) return;
  const int64_t t0 = blockIdx.x * p.run, t1 = min(t0 + p.run, p.tokens);
  float w[K];
#pragma unroll
  for (int k = 0; k < K; ++k) w[k] = mamba::bf(p.w[d * K + k]);
  const float b = p.bias ? mamba::bf(p.bias[d]) : 0.f;
  float hist[K];
  load_history<K>(p, t0, d, taps_before<K>(p.starts, t0), hist);
  for (int64_t g = t0; g < t1; g += kGroup) {
    float xs[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) xs[i] = g + i < t1 ? mamba::bf(p.x[(g + i) * p.ldx + d]) : 0.f;
    const uint64_t starts = mamba::start_bits64(p.starts, p.start_words, g);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int64_t t = g + i;
      if (t >= t1) break;
      if (t != t0) {
#pragma unroll
        for (int k = 0; k + 1 < K; ++k) hist[k] = hist[k + 1];
        if ((starts >> i) & 1u) {
#pragma unroll
          for (int k = 0; k + 1 < K; ++k) hist[k] = 0.f;
        }
      }
      hist[K - 1] = xs[i];
      float acc = b;
#pragma unroll
      for (int k = 0; k < K; ++k) acc += w[k] * hist[k];
      if (p.silu) acc *= mamba::sigmoid(acc);
      p.y[t * p.ldy + d] = __float2bfloat16(acc);
    }
  }
}

template <int K>
static __global__ void __launch_bounds__(kThreads, 4) conv_bwd_kernel(ConvParams p) {
  const int d = blockIdx.y * kThreads + threadIdx.x;
  if (d >= p.channels) return;
  const int64_t t0 = blockIdx.x * p.run, t1 = min(t0 + p.run, p.tokens);
  const int64_t walk_end = t1 + K - 1;  // dx[t1 - 1] needs dpre up to t1 - 1 + K - 1
  const int64_t load_end = min(walk_end, p.tokens);
  float w[K];
#pragma unroll
  for (int k = 0; k < K; ++k) w[k] = mamba::bf(p.w[d * K + k]);
  const float b = p.bias ? mamba::bf(p.bias[d]) : 0.f;
  int pos = taps_before<K>(p.starts, t0);  // tokens since the document start, capped at K - 1
  float hist[K];
  load_history<K>(p, t0, d, pos, hist);
  float dp[K];  // dpre of tokens t - (K-1) + j
  int dpos[K];  // their tokens-since-start counts (-1: past the batch)
#pragma unroll
  for (int j = 0; j < K; ++j) dp[j] = 0.f, dpos[j] = -1;
  float gw[K], gb = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) gw[k] = 0.f;
  for (int64_t g = t0; g < walk_end; g += kGroup) {
    float xs[kGroup], gs[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const bool in = g + i < load_end;
      xs[i] = in ? mamba::bf(p.x[(g + i) * p.ldx + d]) : 0.f;
      gs[i] = in ? mamba::bf(p.dy[(g + i) * p.lddy + d]) : 0.f;
    }
    const uint64_t starts = mamba::start_bits64(p.starts, p.start_words, g);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int64_t t = g + i;
      if (t >= walk_end) break;
      float dpre = 0.f;
      int tpos = -1;
      if (t < p.tokens) {
        if (t != t0) {
#pragma unroll
          for (int k = 0; k + 1 < K; ++k) hist[k] = hist[k + 1];
          if ((starts >> i) & 1u) {
            pos = 0;
#pragma unroll
            for (int k = 0; k + 1 < K; ++k) hist[k] = 0.f;
          } else {
            pos = min(pos + 1, K - 1);
          }
        }
        hist[K - 1] = xs[i];
        float pre = b;
#pragma unroll
        for (int k = 0; k < K; ++k) pre += w[k] * hist[k];
        dpre = p.silu ? gs[i] * mamba::dsilu(pre, mamba::sigmoid(pre)) : gs[i];
        tpos = pos;
        if (t < t1) {
          gb += dpre;
#pragma unroll
          for (int k = 0; k < K; ++k) gw[k] += dpre * hist[k];
        }
      }
#pragma unroll
      for (int j = 0; j + 1 < K; ++j) dp[j] = dp[j + 1], dpos[j] = dpos[j + 1];
      dp[K - 1] = dpre;
      dpos[K - 1] = tpos;
      const int64_t s = t - (K - 1);
      if (s >= t0) {  // s < t1 holds: t < t1 + K - 1
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < K; ++j)
          if (dpos[j] >= j) acc += w[K - 1 - j] * dp[j];
        p.dx[s * p.lddx + d] = __float2bfloat16(acc);
      }
    }
  }
  float* part = p.part + static_cast<int64_t>(blockIdx.x) * (K + 1) * p.channels + d;
#pragma unroll
  for (int k = 0; k < K; ++k) part[static_cast<int64_t>(k) * p.channels] = gw[k];
  part[static_cast<int64_t>(K) * p.channels] = gb;
}

// dweight[d, k] += sum_r part[r, k, d] (k < K), dbias[d] += sum_r part[r, K, d], in run order.
static __global__ void conv_param_reduce_kernel(const float* __restrict__ part, int64_t runs, int k_size,
                                                int channels, float* __restrict__ dweight,
                                                float* __restrict__ dbias) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= static_cast<int64_t>(k_size + 1) * channels) return;
  const int k = static_cast<int>(i / channels), d = static_cast<int>(i % channels);
  float s = 0.f;
  for (int64_t r = 0; r < runs; ++r) s += part[(r * (k_size + 1) + k) * channels + d];
  if (k < k_size)
    dweight[static_cast<int64_t>(d) * k_size + k] += s;
  else if (dbias)
    dbias[d] += s;
}

struct ConvShape {
  int64_t tokens;
  int channels, k;
};

ConvShape check_conv(const char* op, const ops::ColumnBlock& x, const Tensor& weight,
                     const Tensor& bias, const Tensor& cu_seqlens) {
  expect_cuda(weight, op, "weight");
  ENSURE(weight.dtype == DType::BF16 && weight.ndim() == 2, op, ": weight must be (Di, K) bf16, got ",
         dtype_name(weight.dtype), " ", weight.shape.str());
  const int64_t di = weight.size(0), k = weight.size(1);
  ENSURE(k >= 1 && k <= kMaxK, op, ": kernel size ", k, " not in [1, ", kMaxK, "] (CUDA kernels)");
  ENSURE(di >= 1 && di < (int64_t{1} << 31) - kThreads, op, ": ", di, " channels");
  mamba::expect_block(x, x.rows(), di, op, "x");
  if (bias.data) expect_cuda(bias, DType::BF16, {di}, op, "bias");
  mamba::expect_cu_seqlens(cu_seqlens, op);
  ENSURE(x.rows() < (int64_t{1} << 31), op, ": T = ", x.rows(), " tokens");
  return {x.rows(), static_cast<int>(di), static_cast<int>(k)};
}

ConvParams conv_params(const ConvShape& s, const ops::ColumnBlock& x, const Tensor& weight,
                       const Tensor& bias, bool silu, const Owned& starts) {
  ConvParams p{};
  p.x = mamba::block_ptr<const bf16_t>(x);
  p.ldx = x.ld();
  p.w = static_cast<const bf16_t*>(weight.data);
  p.bias = bias.data ? static_cast<const bf16_t*>(bias.data) : nullptr;
  p.starts = static_cast<const uint32_t*>(starts.t.data);
  p.start_words = mamba::start_words(s.tokens);
  p.tokens = s.tokens;
  p.channels = s.channels;
  p.run = 32;  // about kTargetThreads threads, at least 32 tokens each
  while (p.run < 4096 && s.channels * ceil_div(s.tokens, p.run) > kTargetThreads) p.run *= 2;
  p.silu = silu;
  return p;
}

template <typename F>
void k_switch(int k, F&& f) {
  switch (k) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 4>{});
  }
}

}  // namespace

void causal_conv1d_forward(const ops::ColumnBlock& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& cu_seqlens, bool silu, const ops::ColumnBlock& y) {
  const char* op = "causal_conv1d_forward";
  const ConvShape s = check_conv(op, x, weight, bias, cu_seqlens);
  mamba::expect_block(y, s.tokens, s.channels, op, "y");
  if (s.tokens == 0) return;
  Owned starts = mamba::doc_start_bits(cu_seqlens, s.tokens);
  ConvParams p = conv_params(s, x, weight, bias, silu, starts);
  p.y = mamba::block_ptr<bf16_t>(y);
  p.ldy = y.ld();
  const dim3 grid(static_cast<unsigned>(ceil_div(s.tokens, p.run)),
                  static_cast<unsigned>(ceil_div(s.channels, kThreads)));
  k_switch(s.k, [&](auto kc) {
    conv_fwd_kernel<decltype(kc)::value><<<grid, kThreads, 0, stream()>>>(p);
  });
  check_launch("conv_fwd_kernel");
}

void causal_conv1d_backward(const ops::ColumnBlock& dy, const ops::ColumnBlock& x,
                            const Tensor& weight, const Tensor& bias, const Tensor& cu_seqlens,
                            bool silu, const ops::ColumnBlock& dx, const Tensor& dweight,
                            const Tensor& dbias) {
  const char* op = "causal_conv1d_backward";
  const ConvShape s = check_conv(op, x, weight, bias, cu_seqlens);
  mamba::expect_block(dy, s.tokens, s.channels, op, "dy");
  mamba::expect_block(dx, s.tokens, s.channels, op, "dx");
  expect_cuda(dweight, DType::F32, {s.channels, s.k}, op, "dweight");
  ENSURE(!dbias.data || bias.data, op, ": dbias given without bias");
  if (dbias.data) expect_cuda(dbias, DType::F32, {s.channels}, op, "dbias");
  if (s.tokens == 0) return;
  Owned starts = mamba::doc_start_bits(cu_seqlens, s.tokens);
  ConvParams p = conv_params(s, x, weight, bias, silu, starts);
  p.dy = mamba::block_ptr<const bf16_t>(dy);
  p.lddy = dy.ld();
  p.dx = mamba::block_ptr<bf16_t>(dx);
  p.lddx = dx.ld();
  const int64_t runs = ceil_div(s.tokens, p.run);
  Owned part = empty({runs, s.k + 1, s.channels}, DType::F32, Device::CUDA);
  p.part = part.ptr<float>();
  const dim3 grid(static_cast<unsigned>(runs), static_cast<unsigned>(ceil_div(s.channels, kThreads)));
  k_switch(s.k, [&](auto kc) {
    conv_bwd_kernel<decltype(kc)::value><<<grid, kThreads, 0, stream()>>>(p);
  });
  check_launch("conv_bwd_kernel");
  const int64_t items = static_cast<int64_t>(s.k + 1) * s.channels;
  conv_param_reduce_kernel<<<static_cast<unsigned>(ceil_div(items, 256)), 256, 0, stream()>>>(
      part.ptr<float>(), runs, s.k, s.channels, dweight.ptr<float>(),
      dbias.data ? dbias.ptr<float>() : nullptr);
  check_launch("conv_param_reduce_kernel");
}

}  // namespace engine::cuda
