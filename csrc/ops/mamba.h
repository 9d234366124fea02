// Mamba (selective state-space, S6) mixer ops, as Hugging Face MambaMixer's "slow path", over
// packed varlen batches: T tokens, documents from cu_seqlens (S + 1) i32 (cu[0] = 0,
// non-decreasing, cu[S] = T). Neither op lets anything cross a document start: the conv taps
// before a document's first token are zeros and the scan state is zero before it.
//
// causal_conv1d (depthwise, kernel K, per channel d of Di):
//   pre[t, d] = bias[d] + sum_{k < K} weight[d, k] x[t - (K-1) + k, d]     (x = 0 before the doc)
//   y = silu(pre) when `silu`, else pre
// selective_scan (per channel d, state n of N):
//   delta[t, d] = softplus(dt[t, d] + dt_bias[d]),   A[d, n] = -exp(A_log[d, n])
//   h[t, d, n]  = exp(delta A[d, n]) h[t-1, d, n] + delta B[t, n] x[t, d]   (h = 0 before the doc)
//   y[t, d]     = (sum_n C[t, n] h[t, d, n] + D[d] x[t, d]) * silu(z[t, d])
//
// Activation arguments are ColumnBlocks: columns [col, col + width) of a row-major (T, ld)
// tensor, so the layer hands over GEMM outputs without copies (x and z are the two halves of
// in_proj's (T, 2 Di) output, B and C the two halves of x_proj's (T, 2N) B|C output); a plain
// (T, width) tensor converts to a block of all its columns. Blocks written by an op (y, dx, dz,
// dB, dC) only have their own columns touched.
//
// The scan is computed in chunks of `chunk_len` tokens of the packed batch (fixed token ranges:
// documents may start anywhere inside a chunk). Forward writes chunk_states (ceil(T / chunk_len),
// N, Di): entry [c, n, d] is h[c * chunk_len - 1, d, n], the state after the last token of the
// previous chunk (0 for chunk 0, and whatever the state of that token's document was); backward
// recomputes the states of each chunk from them instead of storing T x Di x N states. The CPU
// reference writes the same chunk_states and ignores them in backward (it recomputes from the
// document starts); results do not depend on chunk_len except for rounding.
//
// Dtypes: CPU: everything f32, or everything f64 (fp64 gradient checks). CUDA: activations,
// weights and activation gradients bf16; chunk_states f32; parameter gradients (dweight, dbias,
// dA_log, dD, ddt_bias) f32. The CUDA kernels take N <= 16, K <= 4, chunk_len <= 128.
// Gradients: activation gradients are written (=); parameter gradients accumulated (+=).
// Optional tensors (conv bias, dbias) may be undefined.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ops {

struct ColumnBlock {
  Tensor base;        // (T, ld) row-major
  int64_t col = 0;    // first column
  int64_t width = 0;  // number of columns
  ColumnBlock() = default;
  // Every column of a 2-D tensor (of none for an undefined tensor); from anything that converts to
  // a tensor view (Tensor, Owned), implicitly.
  template <typename T>
    requires std::is_convertible_v<const T&, const Tensor&>
  ColumnBlock(const T& t)  // NOLINT(google-explicit-constructor)
      : ColumnBlock(static_cast<const Tensor&>(t), 0, whole_width(t)) {}
  ColumnBlock(const Tensor& t, int64_t first, int64_t n) : base(t), col(first), width(n) {}
  static int64_t whole_width(const Tensor& t) { return t.ndim() == 2 ? t.size(1) : 0; }
  int64_t rows() const { return base.ndim() >= 1 ? base.size(0) : 0; }
  int64_t ld() const { return base.ndim() == 2 ? base.size(1) : 0; }
};

// A block holds its tensor, named as the parameter (or member) it is.
template <typename F>
void visit_tensors(const ColumnBlock& b, const char* name, F&& f) {
  f(b.base, name);
}

// The CUDA kernels' limits (a channel's states and conv taps live in registers); the config
// checks models against them.
constexpr int kMambaMaxState = 16;  // N
constexpr int kMambaMaxConv = 4;    // K

// Chunk length the layer uses: 64 tokens keeps the backward's per-chunk shared memory small
// enough for 4 blocks per multiprocessor, and chunk_states at T * Di * N / 64 floats.
constexpr int64_t kScanChunk = 64;

// Number of chunks (rows of chunk_states) for T tokens.
inline int64_t scan_num_chunks(int64_t tokens, int64_t chunk_len) {
  return tokens == 0 ? 0 : (tokens + chunk_len - 1) / chunk_len;
}

struct ScanArgs {
  ColumnBlock x;       // (T, Di) the conv output (u)
  Tensor dt;           // (T, Di) dt_low W_dt^T, before dt_bias and softplus
  Tensor A_log;        // (Di, N)
  ColumnBlock B;       // (T, N)
  ColumnBlock C;       // (T, N)
  Tensor D;            // (Di)
  Tensor dt_bias;      // (Di)
  ColumnBlock z;       // (T, Di) gate
  Tensor cu_seqlens;   // (S + 1) i32
  int64_t chunk_len = kScanChunk;
};

template <typename F>
void visit_tensors(const ScanArgs& a, const char*, F&& f) {
  visit_tensors(a.x, "x", f);
  f(a.dt, "dt");
  f(a.A_log, "A_log");
  visit_tensors(a.B, "B", f);
  visit_tensors(a.C, "C", f);
  f(a.D, "D");
  f(a.dt_bias, "dt_bias");
  visit_tensors(a.z, "z", f);
  f(a.cu_seqlens, "cu_seqlens");
}

struct ScanGrads {
  ColumnBlock dx;   // (T, Di)  =
  Tensor ddt;       // (T, Di)  =   (gradient of dt, i.e. of the dt_proj GEMM output)
  ColumnBlock dB;   // (T, N)   =
  ColumnBlock dC;   // (T, N)   =
  ColumnBlock dz;   // (T, Di)  =
  Tensor dA_log;    // (Di, N)  +=
  Tensor dD;        // (Di)     +=
  Tensor ddt_bias;  // (Di)     +=
};

template <typename F>
void visit_tensors(const ScanGrads& g, const char*, F&& f) {
  visit_tensors(g.dx, "dx", f);
  f(g.ddt, "ddt");
  visit_tensors(g.dB, "dB", f);
  visit_tensors(g.dC, "dC", f);
  visit_tensors(g.dz, "dz", f);
  f(g.dA_log, "dA_log");
  f(g.dD, "dD");
  f(g.ddt_bias, "ddt_bias");
}

}  // namespace engine::ops

// causal_conv1d: x, y, dy, dx (T, Di) blocks; weight (Di, K); bias (Di) or undefined;
//   dweight (Di, K) +=, dbias (Di) += (undefined when bias is).
// selective_scan: y, dy (T, Di) blocks (dy the gradient of y); chunk_states
//   (scan_num_chunks(T, chunk_len), N, Di), written by forward, read by backward.
#define ENGINE_MAMBA_OPS(OP)                                                                  \
  OP(void, causal_conv1d_forward,                                                             \
     (const ops::ColumnBlock& x, const Tensor& weight, const Tensor& bias,                    \
      const Tensor& cu_seqlens, bool silu, const ops::ColumnBlock& y),                        \
     (x, weight, bias, cu_seqlens, silu, y))                                                  \
  OP(void, causal_conv1d_backward,                                                            \
     (const ops::ColumnBlock& dy, const ops::ColumnBlock& x, const Tensor& weight,            \
      const Tensor& bias, const Tensor& cu_seqlens, bool silu, const ops::ColumnBlock& dx,    \
      const Tensor& dweight, const Tensor& dbias),                                            \
     (dy, x, weight, bias, cu_seqlens, silu, dx, dweight, dbias))                             \
  OP(void, selective_scan_forward,                                                            \
     (const ops::ScanArgs& a, const ops::ColumnBlock& y, const Tensor& chunk_states),         \
     (a, y, chunk_states))                                                                    \
  OP(void, selective_scan_backward,                                                           \
     (const ops::ScanArgs& a, const ops::ColumnBlock& dy, const Tensor& chunk_states,         \
      const ops::ScanGrads& g),                                                               \
     (a, dy, chunk_states, g))

ENGINE_DECLARE_OPS(ENGINE_MAMBA_OPS)
