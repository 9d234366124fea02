// Causal depthwise conv1d of Mamba over packed documents (csrc/ops/mamba.h):
//   pre[t, d] = bias[d] + sum_{k < K} w[d, k] x[t - (K-1) + k, d]   (taps before the document: 0)
//   y = silu(pre) or pre
//   backward: dpre = dy silu'(pre) (pre recomputed), dx[s] = sum_k w[k] dpre[s + (K-1) - k] (taps
//   past the document's end: 0), dw[d, k] += sum_t dpre[t] x[t - (K-1) + k], dbias += sum_t dpre
// Work item: V consecutive channels over a run of consecutive tokens (a thread), channels across
// the warp so every token row is read as runs of whole 32-byte sectors. Forward: V = 4 (8-byte
// accesses) where x, y and the channel count allow it, else 1; backward: V = 1. The run length is
// chosen so that about 2^18 threads exist (one wave on an H200 holds 270k). A thread issues the
// loads of kGroup tokens together (bytes in flight), then walks them keeping the last K inputs
// in registers (the group's document-start bits too); at a document start the window is cleared.
// A group wholly inside the run with no document start takes a path without the per-token
// bounds, reset and tap checks. The backward walks K - 1 tokens past its run to finish dx of the
// run's last tokens: dx[s] is written once dpre[s + K - 1] is known, each dpre of the window
// counted only when its token is in s's document (its tokens-since-start count >= its distance
// from s).
// Weight gradients without float atomics: each thread writes its run's partial sums to a scratch
// (runs, K + 1, Di) f32 buffer; a second kernel adds them in run order into dweight / dbias
// (bitwise reproducible).
// Cost: the kernels are bound by instruction issue, not bytes (ncu: docs/PERF.md), so what
// counts is instructions per element: the silu's sigmoid with the one-instruction exp and
// reciprocal (the correctly rounded __frcp_rn added a call and a dozen instructions), row
// pointers stepped by 32-bit strides instead of 64-bit offsets per token, the check-free path for
// plain groups, and 4 channels a thread forward. Wider threads (more state per thread, fewer
// threads) and groups of 32 tokens were slower (docs/PERF.md).
// Memory: x, y, dy, dx bf16 column blocks of row-major tensors (any alignment: scalar loads where
// not aligned for the forward's 8-byte ones); weight, bias bf16; dweight, dbias f32. Limits: K <=
// 4, Di < 2^31 / 128 blocks, T < 2^31, rows of at most 2^25 elements.
// The shared preconditions ran before (ops/mamba.cpp: shapes, blocks inside their tensors, one
// dtype for x, weight, bias, y, dy, dx); the launchers check what is theirs: bf16 activations,
// f32 parameter gradients, and the limits above.
#include "ops/mamba.h"

#include <algorithm>
#include <cstdint>

#include "cuda/common/vector.cuh"
#include "cuda/mamba/common.cuh"

namespace engine::cuda {

namespace {

constexpr int kThreads = 128;  // channels per block
constexpr int kMaxK = ops::kMambaMaxConv;
constexpr int kGroup = 16;     // tokens whose loads a thread issues together (< 64)
static_assert(kGroup < 64, "a group's document starts are bits of one 64-bit word");
constexpr int64_t kTargetThreads = int64_t{1} << 18;
// Forward: channels per thread where the tensors allow it (8-byte accesses), else 1. The
// backward keeps one channel a thread (below).
constexpr int kFwdVec = 4;
constexpr int kBwdMinBlocks = 4;  // backward: resident blocks per multiprocessor

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

// The V channels at `row` as floats; zeros where !in.
template <int V>
__device__ __forceinline__ void load_row(const bf16_t* row, bool in, float (&out)[V]) {
  if (in) {
    load_pack<bf16_t, V>(row, out);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = 0.f;
  }
}

// The window hist[v][k] = x[t0 - (K-1) + k, d0 + v] (k < K - 1) of the run's first token, zeros
// before its document.
template <int K, int V>
__device__ __forceinline__ void load_history(const ConvParams& p, int64_t t0, int d0, int before,
                                             float (&hist)[V][K]) {
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int k = 0; k < K; ++k) hist[v][k] = 0.f;
#pragma unroll
  for (int j = 1; j < K; ++j) {
    if (j > before) break;
    float row[V];
    load_pack<bf16_t, V>(p.x + (t0 - j) * p.ldx + d0, row);
#pragma unroll
    for (int v = 0; v < V; ++v) hist[v][K - 1 - j] = row[v];
  }
}

// The channels' weights and biases as floats.
template <int K, int V>
__device__ __forceinline__ void load_weights(const ConvParams& p, int d0, float (&w)[V][K], float (&b)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
#pragma unroll
    for (int k = 0; k < K; ++k) w[v][k] = mamba::bf(p.w[(d0 + v) * K + k]);
    b[v] = p.bias ? mamba::bf(p.bias[d0 + v]) : 0.f;
  }
}

// Token t enters the windows: shift, clear at a document start (not for the run's first token,
// whose history is loaded), take the new inputs.
template <int K, int V>
__device__ __forceinline__ void push(float (&hist)[V][K], const float (&xs)[V], bool first, bool start) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    if (!first) {
#pragma unroll
      for (int k = 0; k + 1 < K; ++k) hist[v][k] = start ? 0.f : hist[v][k + 1];
    }
    hist[v][K - 1] = xs[v];
  }
}

// Thread: V consecutive channels d0 .. (one 2V-byte access a row; V = 1 where the tensors or the
// channel count do not allow wider ones) over one run of tokens, in groups of G = kGroup tokens
// whose loads are issued together. A group wholly inside the run with no document start (the
// common case) takes a path without the per-token bounds, reset and tap checks (kPlain). MB:
// resident blocks per multiprocessor (caps the registers).
template <int K, int V, int MB>
static __global__ void __launch_bounds__(kThreads, MB) conv_fwd_kernel(ConvParams p) {
  constexpr int G = kGroup;
  const int d0 = (blockIdx.y * kThreads + threadIdx.x) * V;
  if (d0 >= p.channels) return;
  const int64_t t0 = blockIdx.x * p.run, t1 = min(t0 + p.run, p.tokens);
  float w[V][K], b[V];
  load_weights<K, V>(p, d0, w, b);
  float hist[V][K];
  load_history<K, V>(p, t0, d0, taps_before<K>(p.starts, t0), hist);
  // Row pointers advance by 32-bit strides (no 64-bit offset math per token).
  const int ldx = static_cast<int>(p.ldx), ldy = static_cast<int>(p.ldy);
  const bf16_t* xg = p.x + t0 * p.ldx + d0;
  bf16_t* yg = p.y + t0 * p.ldy + d0;
  for (int64_t g = t0; g < t1; g += G, xg += G * ldx, yg += G * ldy) {
    const uint64_t starts = mamba::start_bits64(p.starts, p.start_words, g);
    auto group = [&]<bool kPlain>() {
      float xs[G][V];
#pragma unroll
      for (int i = 0; i < G; ++i) load_row<V>(xg + i * ldx, kPlain || g + i < t1, xs[i]);
#pragma unroll
      for (int i = 0; i < G; ++i) {
        if (!kPlain && g + i >= t1) break;
        push<K, V>(hist, xs[i], i == 0 && g == t0, !kPlain && ((starts >> i) & 1u));
        float out[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float acc = b[v];
#pragma unroll
          for (int k = 0; k < K; ++k) acc += w[v][k] * hist[v][k];
          out[v] = p.silu ? acc * cuda::sigmoid_ex2(acc) : acc;
        }
        store_pack<bf16_t, V>(yg + i * ldy, out);
      }
    };
    if (g + G <= t1 && (starts & ((uint64_t{1} << G) - 1)) == 0) group.template operator()<true>();
    else group.template operator()<false>();
  }
}

// The backward: one channel a thread (wider threads were slower: docs/PERF.md), groups of kGroup.
template <int K>
static __global__ void __launch_bounds__(kThreads, kBwdMinBlocks) conv_bwd_kernel(ConvParams p) {
  constexpr int V = 1, G = kGroup;
  const int d0 = (blockIdx.y * kThreads + threadIdx.x) * V;
  if (d0 >= p.channels) return;
  const int64_t t0 = blockIdx.x * p.run, t1 = min(t0 + p.run, p.tokens);
  const int64_t walk_end = t1 + K - 1;  // dx[t1 - 1] needs dpre up to t1 - 1 + K - 1
  const int64_t load_end = min(walk_end, p.tokens);
  float w[V][K], b[V];
  load_weights<K, V>(p, d0, w, b);
  int pos = taps_before<K>(p.starts, t0);  // tokens since the document start, capped at K - 1
  float hist[V][K];
  load_history<K, V>(p, t0, d0, pos, hist);
  float dp[V][K];  // dpre of tokens t - (K-1) + j
  int dpos[K];     // their tokens-since-start counts (-1: past the batch)
  float gw[V][K], gb[V];
#pragma unroll
  for (int j = 0; j < K; ++j) dpos[j] = -1;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    gb[v] = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) dp[v][k] = 0.f, gw[v][k] = 0.f;
  }
  const int ldx = static_cast<int>(p.ldx), lddy = static_cast<int>(p.lddy), lddx = static_cast<int>(p.lddx);
  const bf16_t* xg = p.x + t0 * p.ldx + d0;
  const bf16_t* gg = p.dy + t0 * p.lddy + d0;
  bf16_t* dxg = p.dx + (t0 - (K - 1)) * p.lddx + d0;  // row s = t - (K - 1) of token t = g + i
  for (int64_t g = t0; g < walk_end; g += G, xg += G * ldx, gg += G * lddy, dxg += G * lddx) {
    const uint64_t starts = mamba::start_bits64(p.starts, p.start_words, g);
    // kPlain: every token of the group is the run's own (so inside the batch), past its first
    // K - 1, none starts a document, and the window's tokens are all K - 1 or more into theirs:
    // every tap counts and pos stays K - 1.
    auto group = [&]<bool kPlain>() {
      float xs[G][V], gs[G][V];
#pragma unroll
      for (int i = 0; i < G; ++i) {
        load_row<V>(xg + i * ldx, kPlain || g + i < load_end, xs[i]);
        load_row<V>(gg + i * lddy, kPlain || g + i < load_end, gs[i]);
      }
#pragma unroll
      for (int i = 0; i < G; ++i) {
        const int64_t t = g + i;
        if (!kPlain && t >= walk_end) break;
        const bool live = kPlain || t < p.tokens, own = kPlain || t < t1;
        float dpre[V];
        int tpos = -1;
        if (live) {
          const bool start = !kPlain && ((starts >> i) & 1u);
          if (!kPlain && t != t0) pos = start ? 0 : min(pos + 1, K - 1);
          push<K, V>(hist, xs[i], !kPlain && t == t0, start);
          tpos = pos;
        }
#pragma unroll
        for (int v = 0; v < V; ++v) {
          dpre[v] = 0.f;
          if (live) {
            float pre = b[v];
#pragma unroll
            for (int k = 0; k < K; ++k) pre += w[v][k] * hist[v][k];
            dpre[v] = p.silu ? gs[i][v] * mamba::dsilu(pre, cuda::sigmoid_ex2(pre)) : gs[i][v];
            if (own) {
              gb[v] += dpre[v];
#pragma unroll
              for (int k = 0; k < K; ++k) gw[v][k] += dpre[v] * hist[v][k];
            }
          }
        }
        if (!kPlain) {
#pragma unroll
          for (int j = 0; j + 1 < K; ++j) dpos[j] = dpos[j + 1];
          dpos[K - 1] = tpos;
        }
        float out[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
          for (int j = 0; j + 1 < K; ++j) dp[v][j] = dp[v][j + 1];
          dp[v][K - 1] = dpre[v];
          float acc = 0.f;
#pragma unroll
          for (int j = 0; j < K; ++j)
            if (kPlain || dpos[j] >= j) acc += w[v][K - 1 - j] * dp[v][j];
          out[v] = acc;
        }
        if (kPlain || t - (K - 1) >= t0) store_pack<bf16_t, V>(dxg + i * lddx, out);  // s < t1 holds
      }
    };
    bool settled = pos == K - 1;
#pragma unroll
    for (int j = 0; j < K; ++j) settled = settled && dpos[j] >= j;
    if (settled && g >= t0 + K - 1 && g + G <= t1 && (starts & ((uint64_t{1} << G) - 1)) == 0) {
      group.template operator()<true>();
#pragma unroll
      for (int j = 0; j < K; ++j) dpos[j] = K - 1;  // what the group's tokens left there
    } else
      group.template operator()<false>();
  }
  float* part = p.part + static_cast<int64_t>(blockIdx.x) * (K + 1) * p.channels + d0;
#pragma unroll
  for (int v = 0; v < V; ++v) {
#pragma unroll
    for (int k = 0; k < K; ++k) part[static_cast<int64_t>(k) * p.channels + v] = gw[v][k];
    part[static_cast<int64_t>(K) * p.channels + v] = gb[v];
  }
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

// A column block the conv kernels read or write (shape checked before): rows short enough for
// the kernels' 32-bit pointer steps (a multiple of the row length, up to 64 rows).
void expect_conv_block(const ops::ColumnBlock& b, const char* op, const char* name) {
  ENSURE(b.ld() < (int64_t{1} << 25), op, ": ", name, " rows of ", b.ld(),
         " elements (the conv kernels need fewer than 2^25)");
}

// x in bf16 (weight, bias: x's dtype) and the kernels' limits.
ConvShape check_conv(const char* op, const ops::ColumnBlock& x, const Tensor& weight) {
  mamba::expect_bf16(x.base, op, "x");
  const int64_t di = weight.size(0), k = weight.size(1);
  ENSURE(k >= 1 && k <= kMaxK, op, ": kernel size ", k, " not in [1, ", kMaxK, "] (CUDA kernels)");
  ENSURE(di >= 1 && di < (int64_t{1} << 31) - kThreads, op, ": ", di, " channels");
  expect_conv_block(x, op, "x");
  ENSURE(x.rows() < (int64_t{1} << 31), op, ": T = ", x.rows(), " tokens");
  return {x.rows(), static_cast<int>(di), static_cast<int>(k)};
}

// Whether every row of the given (pointer, row length) blocks and the channel count allow accesses
// of V channels (2 V bytes, aligned).
bool vector_rows(int v, int channels, std::initializer_list<std::pair<const void*, int64_t>> blocks) {
  if (channels % v != 0) return false;
  for (const auto& [ptr, ld] : blocks)
    if (reinterpret_cast<uintptr_t>(ptr) % (2 * v) != 0 || ld % v != 0) return false;
  return true;
}

// v: channels per thread.
ConvParams conv_params(const ConvShape& s, const ops::ColumnBlock& x, const Tensor& weight,
                       const Tensor& bias, bool silu, const Owned& starts, int v) {
  ConvParams p{};
  p.x = mamba::block_ptr<const bf16_t>(x);
  p.ldx = x.ld();
  p.w = static_cast<const bf16_t*>(weight.data);
  p.bias = bias.data ? static_cast<const bf16_t*>(bias.data) : nullptr;
  p.starts = static_cast<const uint32_t*>(starts.t.data);
  p.start_words = mamba::start_words(s.tokens);
  p.tokens = s.tokens;
  p.channels = s.channels;
  // About kTargetThreads threads (of v channels each), at least 32 tokens each.
  p.run = 32;
  while (p.run < 4096 && s.channels / v * ceil_div(s.tokens, p.run) > kTargetThreads) p.run *= 2;
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
  const ConvShape s = check_conv(op, x, weight);
  expect_conv_block(y, op, "y");
  if (s.tokens == 0) return;
  Owned starts = mamba::doc_start_bits(cu_seqlens, s.tokens);
  bf16_t* yp = mamba::block_ptr<bf16_t>(y);
  const bool wide =
      vector_rows(kFwdVec, s.channels, {{mamba::block_ptr<const bf16_t>(x), x.ld()}, {yp, y.ld()}});
  const int v = wide ? kFwdVec : 1;
  ConvParams p = conv_params(s, x, weight, bias, silu, starts, v);
  p.y = yp;
  p.ldy = y.ld();
  const dim3 grid(static_cast<unsigned>(ceil_div(s.tokens, p.run)),
                  static_cast<unsigned>(ceil_div(s.channels / v, kThreads)));
  k_switch(s.k, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
    if (wide)
      conv_fwd_kernel<K, kFwdVec, 3><<<grid, kThreads, 0, stream()>>>(p);
    else
      conv_fwd_kernel<K, 1, 6><<<grid, kThreads, 0, stream()>>>(p);
  });
  check_launch("conv_fwd_kernel");
}

void causal_conv1d_backward(const ops::ColumnBlock& dy, const ops::ColumnBlock& x,
                            const Tensor& weight, const Tensor& bias, const Tensor& cu_seqlens,
                            bool silu, const ops::ColumnBlock& dx, const Tensor& dweight,
                            const Tensor& dbias) {
  const char* op = "causal_conv1d_backward";
  const ConvShape s = check_conv(op, x, weight);
  expect_conv_block(dy, op, "dy");
  expect_conv_block(dx, op, "dx");
  ops::expect_dtype(dweight, DType::F32, op, "dweight");
  if (dbias.data) ops::expect_dtype(dbias, DType::F32, op, "dbias");
  if (s.tokens == 0) return;
  Owned starts = mamba::doc_start_bits(cu_seqlens, s.tokens);
  ConvParams p = conv_params(s, x, weight, bias, silu, starts, 1);
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
