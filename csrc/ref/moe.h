// CPU reference of the mixture-of-experts ops (ops/moe.h): same signatures and contract, f32 or
// f64 floats (one dtype per call), i32 indices. Sums in double, in a fixed order (bitwise
// reproducible). Every index read (expert ids, rows, offsets) is range-checked before anything
// is written.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/moe.h"

namespace engine::ref {

void moe_route_forward(const Tensor& logits, const Tensor& probs, const Tensor& lse,
                       const Tensor& expert_idx, const Tensor& weights);
void moe_aux_losses(const Tensor& probs, const Tensor& lse, const Tensor& counts,
                    const ops::MoeAuxCoefs& coefs, const Tensor& losses);
void moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                        const Tensor& expert_idx, const Tensor& weights, const Tensor& counts,
                        const ops::MoeAuxCoefs& coefs, float aux_grad_scale, const Tensor& dlogits);

void moe_dispatch(const Tensor& expert_idx, const Tensor& counts, const Tensor& offsets,
                  const Tensor& row_of);
void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor& xp);
void moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, const Tensor& y);
void moe_unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& weights, const Tensor& dyp, const Tensor& dweights);

void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& counts, const Tensor& y);
void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& counts, const Tensor& dx);
void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& counts, const Tensor& dw);

void moe_jitter(const Tensor& x, const Tensor& y, uint64_t seed, float eps);

}  // namespace engine::ref
