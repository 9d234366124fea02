// Dispatch of ops/moe.h: CPU -> ref/moe, CUDA -> cuda/moe.
#include "ops/moe.h"

#include "ops/dispatch.h"
#include "ref/moe.h"

#ifdef ENGINE_CUDA
#include "cuda/moe/moe.cuh"
#define MOE_CUDA(call) return cuda::call
#else
#define MOE_CUDA(call) (void)0
#endif

namespace engine::ops {

GroupedWeight grouped_weight(const Tensor& w, const char* op) {
  GroupedWeight g;
  if (w.ndim() == 3) {
    g = {w.size(0), w.size(1), w.size(2), 1};
  } else {
    ENSURE(w.ndim() == 4, op, ": w has shape ", w.shape.str(),
           ", expected (E, N, K) or (S, E, N / S, K)");
    g = {w.size(1), w.size(0) * w.size(2), w.size(3), w.size(0)};
    ENSURE(g.stacks >= 1, op, ": w has shape ", w.shape.str(), ": no stacks");
  }
  ENSURE(g.experts >= 1 && g.experts <= kMoeMaxExperts, op, ": ", g.experts,
         " experts outside [1, ", kMoeMaxExperts, "]");
  return g;
}

void moe_route_forward(const Tensor& logits, const Tensor& probs, const Tensor& lse,
                       const Tensor& expert_idx, const Tensor& weights) {
  if (device_of("moe_route_forward", {{"logits", logits}, {"probs", probs}, {"lse", lse},
                                      {"expert_idx", expert_idx}, {"weights", weights}}) == Device::CPU)
    return ref::moe_route_forward(logits, probs, lse, expert_idx, weights);
  MOE_CUDA(moe_route_forward(logits, probs, lse, expert_idx, weights));
  no_cuda_build("moe_route_forward");
}

void moe_aux_losses(const Tensor& probs, const Tensor& lse, const Tensor& counts,
                    const MoeAuxCoefs& coefs, const Tensor& losses) {
  if (device_of("moe_aux_losses", {{"probs", probs}, {"lse", lse}, {"counts", counts},
                                   {"losses", losses}}) == Device::CPU)
    return ref::moe_aux_losses(probs, lse, counts, coefs, losses);
  MOE_CUDA(moe_aux_losses(probs, lse, counts, coefs, losses));
  no_cuda_build("moe_aux_losses");
}

void moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                        const Tensor& expert_idx, const Tensor& weights, const Tensor& counts,
                        const MoeAuxCoefs& coefs, float aux_grad_scale, const Tensor& dlogits) {
  if (device_of("moe_route_backward",
                {{"dweights", dweights}, {"probs", probs}, {"lse", lse}, {"expert_idx", expert_idx},
                 {"weights", weights}, {"counts", counts}, {"dlogits", dlogits}}) == Device::CPU)
    return ref::moe_route_backward(dweights, probs, lse, expert_idx, weights, counts, coefs,
                                   aux_grad_scale, dlogits);
  MOE_CUDA(moe_route_backward(dweights, probs, lse, expert_idx, weights, counts, coefs,
                              aux_grad_scale, dlogits));
  no_cuda_build("moe_route_backward");
}

void moe_dispatch(const Tensor& expert_idx, const Tensor& counts, const Tensor& offsets,
                  const Tensor& row_of) {
  if (device_of("moe_dispatch", {{"expert_idx", expert_idx}, {"counts", counts},
                                 {"offsets", offsets}, {"row_of", row_of}}) == Device::CPU)
    return ref::moe_dispatch(expert_idx, counts, offsets, row_of);
  MOE_CUDA(moe_dispatch(expert_idx, counts, offsets, row_of));
  no_cuda_build("moe_dispatch");
}

void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor& xp) {
  if (device_of("moe_permute", {{"x", x}, {"row_of", row_of}, {"xp", xp}}) == Device::CPU)
    return ref::moe_permute(x, row_of, xp);
  MOE_CUDA(moe_permute(x, row_of, xp));
  no_cuda_build("moe_permute");
}

void moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, const Tensor& y) {
  if (device_of("moe_unpermute", {{"yp", yp}, {"row_of", row_of}, {"weights", weights}, {"y", y}}) ==
      Device::CPU)
    return ref::moe_unpermute(yp, row_of, weights, y);
  MOE_CUDA(moe_unpermute(yp, row_of, weights, y));
  no_cuda_build("moe_unpermute");
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& weights, const Tensor& dyp, const Tensor& dweights) {
  if (device_of("moe_unpermute_backward", {{"dy", dy}, {"yp", yp}, {"row_of", row_of},
                                           {"weights", weights}, {"dyp", dyp},
                                           {"dweights", dweights}}) == Device::CPU)
    return ref::moe_unpermute_backward(dy, yp, row_of, weights, dyp, dweights);
  MOE_CUDA(moe_unpermute_backward(dy, yp, row_of, weights, dyp, dweights));
  no_cuda_build("moe_unpermute_backward");
}

void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& counts, const Tensor& y,
                            [[maybe_unused]] const GroupedLinearOptions& options) {
  if (device_of("grouped_linear_forward", {{"x", x}, {"w", w}, {"offsets", offsets},
                                           {"counts", counts}, {"y", y}}) == Device::CPU)
    return ref::grouped_linear_forward(x, w, offsets, counts, y);
  MOE_CUDA(grouped_linear_forward(x, w, offsets, counts, y, options));
  no_cuda_build("grouped_linear_forward");
}

void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& counts, const Tensor& dx,
                                   [[maybe_unused]] const GroupedLinearOptions& options) {
  if (device_of("grouped_linear_backward_input", {{"dy", dy}, {"w", w}, {"offsets", offsets},
                                                  {"counts", counts}, {"dx", dx}}) == Device::CPU)
    return ref::grouped_linear_backward_input(dy, w, offsets, counts, dx);
  MOE_CUDA(grouped_linear_backward_input(dy, w, offsets, counts, dx, options));
  no_cuda_build("grouped_linear_backward_input");
}

void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& counts, const Tensor& dw,
                                    [[maybe_unused]] const GroupedLinearOptions& options) {
  if (device_of("grouped_linear_backward_weight", {{"dy", dy}, {"x", x}, {"offsets", offsets},
                                                   {"counts", counts}, {"dw", dw}}) == Device::CPU)
    return ref::grouped_linear_backward_weight(dy, x, offsets, counts, dw);
  MOE_CUDA(grouped_linear_backward_weight(dy, x, offsets, counts, dw, options));
  no_cuda_build("grouped_linear_backward_weight");
}

void moe_jitter(const Tensor& x, const Tensor& y, uint64_t seed, float eps) {
  if (device_of("moe_jitter", {{"x", x}, {"y", y}}) == Device::CPU)
    return ref::moe_jitter(x, y, seed, eps);
  MOE_CUDA(moe_jitter(x, y, seed, eps));
  no_cuda_build("moe_jitter");
}

}  // namespace engine::ops
