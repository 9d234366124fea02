// CUDA launchers of the mixture-of-experts ops (contract, formulas and shapes: csrc/ops/moe.h).
// Kernels: routing.cu (route forward / backward, aux losses, jitter), dispatch.cu (histogram,
// padded offsets, stable rows, permute / unpermute), grouped_gemm.cu (the expert GEMMs on
// mma.sync tensor cores, one launch over all experts).
//   route forward    logits (T, E) f32 -> probs (T, E) f32 (may alias logits), lse (T) f32,
//                    expert_idx (T, k) i32, weights (T, k) f32. One warp per token.
//   aux losses       probs, lse f32, counts (E) i32 -> losses (2) f32 on the device (no sync);
//                    one block, fixed summation order (deterministic).
//   route backward   dweights, probs, lse, weights f32, expert_idx, counts i32 -> dlogits (T, E)
//                    bf16 or f32.
//   dispatch         expert_idx (T, k) -> counts (E), offsets (E + 1), row_of (T, k), all i32;
//                    three kernels (block histograms, one-block scan, stable block ranks); no
//                    host sync; deterministic.
//   permute, unpermute (+ backward): rows of bf16 or f32, 16-byte vectors when the row length
//                    and the pointers allow, f32 sums, one block per token.
//   grouped linear   bf16 x / dy / w, bf16 y / dx, f32 dw (+=): see grouped_gemm.cu (and
//                    grouped_gemm_sm90.cu: on sm_90 all three products on one persistent wgmma
//                    kernel, operands by TMA, 2-CTA clusters multicasting the shared operand; the
//                    backward reads its operands MN-major, no transposed copies). Needs
//                    K and N multiples of 8, 16-byte aligned bf16 pointers (8-byte dw) and
//                    expert offsets that are multiples of ops::kMoeRowAlign (moe_dispatch's).
// E <= ops::kMoeMaxExperts, k <= ops::kMoeMaxTopK. Every launcher runs on the compute stream.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/moe.h"

namespace engine::cuda {

void moe_route_forward(const Tensor& logits, const Tensor& probs, const Tensor& lse,
                       const Tensor& expert_idx, const Tensor& weights);
void moe_aux_losses(const Tensor& probs, const Tensor& lse, const Tensor& counts,
                    const ops::MoeAuxCoefs& coefs, const Tensor& losses);
void moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                        const Tensor& expert_idx, const Tensor& weights, const Tensor& counts,
                        const ops::MoeAuxCoefs& coefs, float aux_grad_scale, const Tensor& dlogits);
void moe_jitter(const Tensor& x, const Tensor& y, uint64_t seed, float eps);

void moe_dispatch(const Tensor& expert_idx, const Tensor& counts, const Tensor& offsets,
                  const Tensor& row_of);
void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor& xp);
void moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, const Tensor& y);
void moe_unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& weights, const Tensor& dyp, const Tensor& dweights);

void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& counts, const Tensor& y);
// The kernel behind grouped_linear_forward. Auto: the TMA wgmma kernel where it is built for the
// device (sm_90a code on a compute capability 9.0 GPU) and takes the shapes (one weight stack,
// or N/S % 64 == 0; K, N > 0), else the cp.async wgmma kernel on sm_90, else mma.sync
// (grouped_gemm_sm90.cu, grouped_gemm.cu). The others force one (tests and benchmarks; one that
// is not available, or TMA on shapes it does not take, is an error). Process-wide.
enum class GroupedForwardKernel { Auto, MmaSync, Wgmma, WgmmaTma };
void set_grouped_forward_kernel(GroupedForwardKernel k);
// The same choice for grouped_linear_backward_input: Auto / WgmmaTma = the TMA kernel reading W_e
// MN-major (the forward's shape rule; no scratch), else MmaSync (W_e through ldmatrix.trans);
// Wgmma = the cp.async forward kernel on a transposed copy of the weights (a scratch (E, K, N)
// bf16 for the call).
void set_grouped_dgrad_kernel(GroupedForwardKernel k);
// And for grouped_linear_backward_weight: Auto / WgmmaTma (Wgmma means the same) = the TMA
// kernel reading dy and x MN-major (no scratch), every size; MmaSync = the mma.sync kernel
// reading both through ldmatrix.trans.
void set_grouped_wgrad_kernel(GroupedForwardKernel k);
bool grouped_forward_kernel_available(GroupedForwardKernel k);
// The TMA kernel's schedule switches (benchmarks and tests; every setting gives the same bits):
// multicast (the shared operand to both CTAs of a cluster by one TMA multicast; off: each loads
// it), retire_each (each k step's wgmma retired before the next and its stage released at once;
// off: one step kept in flight), raster (pairs of row tiles per raster group, >= 1),
// tma_epilogue (the weight gradient's dW += by TMA reductions in L2; off: the threads load the
// old values and store the sums: the same round-to-nearest f32 sums, except that the copy
// engine's add may flush subnormals to zero). Initial values from
// ENGINE_MOE_NO_MULTICAST=1, ENGINE_MOE_RETIRE_EACH=0, ENGINE_MOE_RASTER=G and
// ENGINE_MOE_TMA_EPILOGUE=0, else on / on / 4 / on. Process-wide.
struct GroupedTmaSchedule {
  bool multicast = true;
  bool retire_each = true;
  int raster = 4;
  bool tma_epilogue = true;
};
void set_grouped_tma_schedule(const GroupedTmaSchedule& s);
GroupedTmaSchedule grouped_tma_schedule();
void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& counts, const Tensor& dx);
void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& counts, const Tensor& dw);

}  // namespace engine::cuda
