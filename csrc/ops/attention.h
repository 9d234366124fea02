// Scaled dot-product attention over packed variable-length sequences (varlen), grouped-query.
// Tokens of all sequences are concatenated: sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]).
// q head h uses kv head h / (num_heads / num_kv_heads). For query i and key j of one sequence
// (indices relative to the sequence start), j is visible iff (!causal || j <= i) and
// (window == 0 || i - j < window). No token sees another sequence. A window at least as long
// as every sequence (max_seqlen, max_seqlen_k) limits nothing; the CUDA dispatch passes it to
// the kernels as 0, whose 32-bit tile arithmetic it would otherwise overflow (INT_MAX).
//   out_i = sum_j softmax_j(scale * q_i . k_j) v_j,   lse_i = log sum_j exp(scale * q_i . k_j)
// Backward writes dqkv (=) from dout, recomputing probabilities from the saved lse.
//
// Separate keys (kv set; micro-sequences: a micro-batch cut into chunks of consecutive tokens
// processed in order, chunk c's queries seeing the keys and values of chunks 0 .. c): keys and
// values come from kv, sequence s owning its rows [cu_seqlens_k[s], cu_seqlens_k[s+1]), and
// qkv's own k and v heads are neither read nor (backward) written. With len_q(s) and
// len_k(s) >= len_q(s) the lengths of s in the two, its queries are the LAST len_q(s) of its
// len_k(s) key positions (aligned at the end): query i has position i + off, off = len_k(s) -
// len_q(s), and key j is visible iff (!causal || j <= i + off) && (window == 0 || i + off - j <
// window). Without kv this is the case kv = qkv's k and v heads, cu_seqlens_k = cu_seqlens.
// A sequence may have len_q = 0 (keys of documents that ended in an earlier chunk): its key
// rows get dk = dv = 0. Backward then writes dkv (=) for every key row and dqkv's q heads (=),
// leaving dqkv's k and v heads as they were.
#pragma once
#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ops {

// Which CUDA kernels run the op (CPU tensors always run the reference, ref/attention): the
// engine's flash kernels (cuda/attention/flash*), or cuDNN's fused attention
// (cuda/attention/cudnn_sdpa; bf16, head dims multiples of 8 up to 256; builds with cuDNN only,
// otherwise an error). Both follow this contract, the backward of either accepts the lse of either.
enum class AttentionBackend { Flash, Cudnn };

// Which flash kernels run the op on CUDA tensors (the Flash backend only). The layers leave it
// Auto (the model logs what Auto resolves to when it is built); the benchmark and the tests set
// it per call:
//   Auto     the Hopper kernels (cuda/attention/flash_sm90.cu, flash_bwd_sm90.cu) where they take
//            the call (an sm_90a build on a compute capability 9.0 device, head dim 64 or 128, no
//            separate kv, 16-byte aligned qkv and dout), else MmaSync
//   MmaSync  the portable mma.sync kernels (flash_fwd.cuh, flash_bwd.cuh): any GPU, separate kv
//            (micro-sequences), and the reference the Hopper kernels are tested against
//   Sm90     the same as Auto today (Auto may come to depend on the shape as measurements say)
// Head dims other than 64 and 128 run the f32 fallback (flash_fallback.cu) under any choice.
enum class AttentionKernel { Auto, MmaSync, Sm90 };

struct AttentionParams {
  Tensor qkv;         // (T, H + 2*Hkv, D): q heads, then k heads, then v heads
  Tensor out;         // (T, H, D)
  Tensor lse;         // (T, H) f32 (f64 when qkv is f64): log-sum-exp of the scaled scores
  Tensor cu_seqlens;  // (S + 1) i32 on the same device: sequence offsets, cu_seqlens[S] == T
  int max_seqlen = 0;     // longest sequence (kernels size their grids from it)
  int num_heads = 0;      // H
  int num_kv_heads = 0;   // Hkv, divides H
  int head_dim = 0;       // D
  float softmax_scale = 0.f;  // usually 1 / sqrt(D)
  bool causal = true;
  int window = 0;         // sliding window in tokens, 0 = unlimited
  // Optional separate keys and values (see above); leave all three unset for the usual case.
  Tensor kv;             // (Tk, 2*Hkv, D), dtype of qkv: k heads, then v heads of a key row
  Tensor cu_seqlens_k;   // (S + 1) i32, same device: key row offsets, cu_seqlens_k[S] == Tk,
                         // len_k(s) >= len_q(s) for every s
  int max_seqlen_k = 0;  // longest len_k (bounds every one; sizes the backward's grid)
  AttentionBackend backend = AttentionBackend::Flash;
  AttentionKernel kernel = AttentionKernel::Auto;  // of the Flash backend (above)

  // Whether kv is given (a default-constructed Tensor is not; an empty (0, ...) one is).
  bool separate_kv() const { return kv.data != nullptr || kv.ndim() != 0; }
};

struct AttentionBackwardParams {
  AttentionParams fwd;  // the forward's tensors (qkv, out, lse) and settings
  Tensor dout;          // (T, H, D)
  Tensor dqkv;          // (T, H + 2*Hkv, D), written; with fwd.kv only its q heads
  Tensor dkv = {};      // (Tk, 2*Hkv, D), dtype of kv, written: only with fwd.kv (= {}: the
                        // usual {fwd, dout, dqkv} leaves it out without a -Wextra warning)
};

// The tensors of the parameter structs, for the device check of the dispatch (ops/op.h).
template <typename F>
void visit_tensors(const AttentionParams& p, const char*, F&& f) {
  f(p.qkv, "qkv");
  f(p.out, "out");
  f(p.lse, "lse");
  f(p.cu_seqlens, "cu_seqlens");
  f(p.kv, "kv");
  f(p.cu_seqlens_k, "cu_seqlens_k");
}
template <typename F>
void visit_tensors(const AttentionBackwardParams& p, const char* name, F&& f) {
  visit_tensors(p.fwd, name, f);
  f(p.dout, "dout");
  f(p.dqkv, "dqkv");
  f(p.dkv, "dkv");
}

// For the run log: the flash kernels that a call on `device` with head_dim runs under `kernel`
// (default: what Auto resolves to), assuming qkv's own keys and 16-byte aligned tensors (calls
// with separate kv run "mma.sync" where this says "sm90"). CUDA: "sm90", "mma.sync", "fallback"
// (the f32 kernels of other head dims) or "unsupported" (head dims past 1 .. 256), for the current
// device (call it once the device is selected); CPU: "reference". (Backend Cudnn runs cuDNN's.)
const char* attention_kernel_name(Device device, int head_dim,
                                  AttentionKernel kernel = AttentionKernel::Auto);

}  // namespace engine::ops

// CPU: the reference (csrc/ref/attention.cpp). CUDA (cuda/attention/attention.cu): the window
// clamp above, then cuDNN's fused attention or the flash kernels as AttentionParams::backend says.
#define ENGINE_ATTENTION_OPS(OP)                                                         \
  OP(void, attention_forward, (const ops::AttentionParams& p), (p))                     \
  OP(void, attention_backward, (const ops::AttentionBackwardParams& p), (p))

ENGINE_DECLARE_OPS(ENGINE_ATTENTION_OPS)
