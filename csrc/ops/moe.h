// Dropless mixture of experts (Mixtral's sparse MoE block): routing, dispatch of token rows to
// experts, the grouped ("sparse") expert GEMMs and the weighted return to tokens.
// T tokens, C hidden, E experts, k = top_k, R = moe_permuted_rows(T, k, E) rows of the permuted
// (expert-contiguous) buffer.
//
// ---- Routing. logits (T, E) = xn W_r^T (the caller's GEMM).
//   moe_route_forward: p = softmax(logits_t), lse_t = log sum_e exp(logits_te); the k experts of
//     largest p in descending order of p, equal probabilities broken by the LOWER expert index
//     (deterministic, the same on every backend for equal inputs); their weights, renormalised
//     (renormalize: w_tj = p_{t, idx_tj} / sum_m p_{t, idx_tm}, Mixtral, HF's norm_topk_prob) or
//     the probabilities themselves (w_tj = p_{t, idx_tj}, Qwen2-MoE's default).
//       logits, probs (T, E); lse (T); expert_idx (T, k) i32; weights (T, k).
//     probs may alias logits (the logits are not needed afterwards).
//   moe_aux_losses: losses (2) = [aux, z] with the coefficients applied:
//       aux = aux_coef * E * sum_e f_e P_e,  f_e = counts_e / (T k),  P_e = mean_t p_te
//           (the Switch / Mixtral load-balancing loss; f_e is a count, it has no gradient)
//       z   = z_coef * mean_t lse_t^2           (the router z-loss, ST-MoE)
//     counts (E) i32 from moe_dispatch. T = 0 gives [0, 0].
//   moe_route_backward: dlogits (=) of  L = sum_tj dweights_tj w_tj + aux_grad_scale (aux + z)
//     with the expert choice held fixed (renormalize as in the forward), i.e.
//       g_te  = sum_j [idx_tj == e] (dweights_tj - sum_m dweights_tm w_tm) / S_t   (renormalize)
//               sum_j [idx_tj == e] dweights_tj                                   (otherwise)
//               + aux_grad_scale aux_coef E f_e / T                (S_t = sum_j p_{t, idx_tj})
//       dlogits_te = p_te (g_te - sum_e' p_te' g_te') + aux_grad_scale z_coef 2 lse_t p_te / T
//     aux_grad_scale is d(total loss) / d(aux + z): 1 when the two losses are added to a loss
//     that is itself the value being differentiated; the caller folds in whatever normalisation
//     its loss applies to them (e.g. 1 / micro-batches when each micro-batch's value is averaged).
//   dtypes: CPU f32 or f64, one dtype for all float tensors. CUDA: logits, probs, lse, weights,
//   dweights, losses f32; dlogits bf16 or f32 (the router's weight-gradient GEMM wants bf16).
//
// ---- Dispatch (dropless: every assignment gets a row).
//   moe_dispatch: counts_e = #{(t, j): idx_tj = e}; expert e owns the rows
//     [offsets_e, offsets_e + counts_e) of the permuted buffer, offsets_0 = 0,
//     offsets_{e+1} = offsets_e + round_up(counts_e, kMoeRowAlign) (each expert's rows padded to
//     the grouped GEMM's row tile, so one tile never holds two experts); offsets_E <= R.
//     row_of_tj = offsets_e + (number of assignments (t', j') to e with t' k + j' < t k + j):
//     assignments keep their (token, slot) order inside an expert (stable, deterministic).
//       expert_idx (T, k) i32 in [0, E); counts (E) i32; offsets (E + 1) i32; row_of (T, k) i32.
//     Nothing is read back to the host: R is the static bound below, and the padding rows
//     (between offsets_e + counts_e and offsets_{e+1}, and past offsets_E) are never written by
//     the ops here and never read as data (the GEMMs mask them).
//   moe_permute:   xp(row_of_tj) = x(t) for all (t, j); other rows of xp untouched.
//       x (T, C); row_of (T, k); xp (R, C); same dtype (CPU f32/f64; CUDA bf16 or f32).
//   moe_unpermute: y(t) = sum_j w_tj yp(row_of_tj)   (=; weights undefined: w = 1, which is the
//     backward of moe_permute). yp (R, C), weights (T, k) (CPU: yp's dtype; CUDA f32), y (T, C).
//   moe_unpermute_backward: dyp(row_of_tj) = w_tj dy(t) (=, other rows untouched) and
//     dweights_tj = dot(dy(t), yp(row_of_tj)) (=). dy (T, C), yp and dyp (R, C), dweights like
//     weights. CUDA: sums in f32.
//
// ---- Grouped linear (the experts' GEMMs). Expert e's rows are [offsets_e, offsets_e + counts_e)
// of x / y (device tensors on CUDA: no host sync); experts with 0 rows are allowed. The weights
// of expert e are W_e (N, K), stored as w (E, N, K), or as S adjacent stacks w (S, E, N/S, K)
// with W_e = [w(0, e); w(1, e); ...] (row n of W_e = w(n / (N/S), e, n % (N/S)): the adjacent
// gate and up weights of a SwiGLU expert seen as one (2F, C) matrix per expert).
//   grouped_linear_forward:         y_rows(e)  = x_rows(e) W_e^T          y (R, N)   =
//   grouped_linear_backward_input:  dx_rows(e) = dy_rows(e) W_e           dx (R, K)  =
//   grouped_linear_backward_weight: dW_e += dy_rows(e)^T x_rows(e)         dw (w's shape) +=
// Rows of y / dx outside every expert's range are untouched; an expert with no rows adds nothing.
// CPU: f32 or f64 for all (double accumulation). CUDA: x, dy, w bf16; y, dx bf16; dw f32
// (f32 accumulation); offsets_e a multiple of kMoeRowAlign (as moe_dispatch makes them);
// K and N multiples of 8; bf16 pointers 16-byte aligned, dw 8-byte aligned.
// GroupedLinearOptions::kernel picks the CUDA kernels (CPU tensors always run the reference);
// every kernel follows this contract.
//
// ---- Shared expert's gate (Qwen2-MoE): y_t += sigmoid(l_t) shared_t, l_t = xn_t . w_gate (the
// caller's GEMM, a (C -> 1) linear).
//   moe_shared_gate_forward:  y (T, C) += sigmoid(logits_t) shared (T, C); logits (T, 1).
//   moe_shared_gate_backward: dshared_t = sigmoid(l_t) dy_t (=);
//                             dlogits_t = sigmoid(l_t) (1 - sigmoid(l_t)) dot(dy_t, shared_t) (=).
//   CPU: one dtype for all, f32 or f64 (sums in double). CUDA: logits f32; dy, shared, dshared
//   and y bf16 or f32 (one dtype); dlogits bf16 or f32 (the weight-gradient GEMM wants bf16);
//   sums in f32.
//
// ---- Router jitter (Switch Transformer): y = x (1 + eps (2 u_i - 1)), u_i uniform in (0, 1]
// from Philox keyed by moe_jitter_key(seed) at the element index i of x (the same numbers on
// every backend). A diagonal scaling, so the same call applied to the gradient is the backward.
// y may alias x. CPU f32/f64; CUDA bf16 or f32.
#pragma once
#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ops {

constexpr int64_t kMoeRowAlign = 128;  // expert row ranges start on multiples of this
constexpr int kMoeMaxExperts = 1024;
constexpr int kMoeMaxTopK = 8;

// Rows of the permuted buffer: enough for any routing of T tokens (each expert pads < align).
constexpr int64_t moe_permuted_rows(int64_t tokens, int64_t top_k, int64_t experts) {
  return tokens * top_k + experts * (kMoeRowAlign - 1);
}

struct MoeAuxCoefs {
  float aux_loss_coef = 0.f;  // load balancing
  float z_loss_coef = 0.f;    // router z-loss
};

// The CUDA kernels of the grouped linear ops (cuda/moe/):
//   Portable  the mma.sync kernels (grouped_gemm.cu), any GPU.
//   Hopper    the wgmma kernels (grouped_gemm_sm90*.cu; an error on a device where the TMA kernel
//             is not built: sm_90a code on a compute capability 9.0 GPU): the persistent TMA
//             kernel for the three products where it takes the shapes; otherwise (S > 1 weight
//             stacks with N/S % 64 != 0, K = 0) the cp.async wgmma forward and the mma.sync dgrad.
//   Auto      each product on the first of those kernels that is built for the device and takes
//             the shapes, the mma.sync kernel last: Hopper on an sm_90 GPU, else Portable.
enum class GroupedKernel { Auto, Hopper, Portable };
struct GroupedLinearOptions {
  GroupedKernel kernel = GroupedKernel::Auto;
};

inline PhiloxKey moe_jitter_key(uint64_t seed) { return philox_key(seed, "moe.jitter"); }

// The experts' weight layout of the grouped linear ops: w (E, N, K) or (S, E, N/S, K).
struct GroupedWeight {
  int64_t experts = 0, n = 0, k = 0;  // E, N (all stacks), K
  int64_t stacks = 1;                 // S
  int64_t n_per_stack() const { return n / stacks; }
};
// Reads the layout from w's shape (3-D or 4-D), naming `op` in errors.
GroupedWeight grouped_weight(const Tensor& w, const char* op);

}  // namespace engine::ops

// weights of moe_unpermute: undefined (Tensor{}) for w = 1. options of the grouped linear ops:
// the CUDA kernel choice (the CPU reference takes and ignores it).
#define ENGINE_MOE_OPS(OP)                                                                      \
  OP(void, moe_route_forward,                                                                   \
     (const Tensor& logits, const Tensor& probs, const Tensor& lse, const Tensor& expert_idx,   \
      const Tensor& weights, bool renormalize),                                                 \
     (logits, probs, lse, expert_idx, weights, renormalize))                                    \
  OP(void, moe_aux_losses,                                                                      \
     (const Tensor& probs, const Tensor& lse, const Tensor& counts,                             \
      const ops::MoeAuxCoefs& coefs, const Tensor& losses),                                     \
     (probs, lse, counts, coefs, losses))                                                       \
  OP(void, moe_route_backward,                                                                  \
     (const Tensor& dweights, const Tensor& probs, const Tensor& lse, const Tensor& expert_idx, \
      const Tensor& weights, const Tensor& counts, const ops::MoeAuxCoefs& coefs,               \
      float aux_grad_scale, bool renormalize, const Tensor& dlogits),                           \
     (dweights, probs, lse, expert_idx, weights, counts, coefs, aux_grad_scale, renormalize,    \
      dlogits))                                                                                 \
  OP(void, moe_dispatch,                                                                        \
     (const Tensor& expert_idx, const Tensor& counts, const Tensor& offsets,                    \
      const Tensor& row_of),                                                                    \
     (expert_idx, counts, offsets, row_of))                                                     \
  OP(void, moe_permute, (const Tensor& x, const Tensor& row_of, const Tensor& xp),              \
     (x, row_of, xp))                                                                           \
  OP(void, moe_unpermute,                                                                       \
     (const Tensor& yp, const Tensor& row_of, const Tensor& weights, const Tensor& y),          \
     (yp, row_of, weights, y))                                                                  \
  OP(void, moe_unpermute_backward,                                                              \
     (const Tensor& dy, const Tensor& yp, const Tensor& row_of, const Tensor& weights,          \
      const Tensor& dyp, const Tensor& dweights),                                               \
     (dy, yp, row_of, weights, dyp, dweights))                                                  \
  OP(void, grouped_linear_forward,                                                              \
     (const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& counts,            \
      const Tensor& y, const ops::GroupedLinearOptions& options),                               \
     (x, w, offsets, counts, y, options))                                                       \
  OP(void, grouped_linear_backward_input,                                                       \
     (const Tensor& dy, const Tensor& w, const Tensor& offsets, const Tensor& counts,           \
      const Tensor& dx, const ops::GroupedLinearOptions& options),                              \
     (dy, w, offsets, counts, dx, options))                                                     \
  OP(void, grouped_linear_backward_weight,                                                      \
     (const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& counts,           \
      const Tensor& dw, const ops::GroupedLinearOptions& options),                              \
     (dy, x, offsets, counts, dw, options))                                                     \
  OP(void, moe_shared_gate_forward,                                                             \
     (const Tensor& logits, const Tensor& shared, const Tensor& y), (logits, shared, y))        \
  OP(void, moe_shared_gate_backward,                                                            \
     (const Tensor& dy, const Tensor& logits, const Tensor& shared, const Tensor& dshared,       \
      const Tensor& dlogits),                                                                   \
     (dy, logits, shared, dshared, dlogits))                                                    \
  OP(void, moe_jitter, (const Tensor& x, const Tensor& y, uint64_t seed, float eps),            \
     (x, y, seed, eps))

ENGINE_DECLARE_OPS(ENGINE_MOE_OPS)
