// The CUDA side of the attention ops (ops/attention.h), after the shared checks of
// ops/attention.cpp: the window clamp, then cuDNN's fused attention (cudnn_sdpa.cu, when
// AttentionParams::backend is Cudnn; a build without cuDNN raises there) or the flash kernels
// (flash.cu).
#include <algorithm>

#include "cuda/attention/cudnn_sdpa.cuh"
#include "cuda/attention/flash.cuh"
#include "ops/attention.h"

namespace engine::cuda {
namespace {

// A window at least as long as every sequence limits nothing: the kernels get 0 (unlimited),
// which also keeps their 32-bit tile arithmetic (first key + tile + window) from overflowing
// on windows such as INT_MAX meant as "no limit".
ops::AttentionParams kernel_params(const ops::AttentionParams& p) {
  ops::AttentionParams q = p;
  const int longest = std::max(p.max_seqlen, p.separate_kv() ? p.max_seqlen_k : 0);
  if (q.window > 0 && q.window >= longest) q.window = 0;
  return q;
}

}  // namespace

void attention_forward(const ops::AttentionParams& p) {
  const ops::AttentionParams q = kernel_params(p);
  if (q.backend == ops::AttentionBackend::Cudnn) return cudnn_attention_forward(q);
  flash_attention_forward(q);
}

void attention_backward(const ops::AttentionBackwardParams& p) {
  ops::AttentionBackwardParams q = p;
  q.fwd = kernel_params(p.fwd);
  if (q.fwd.backend == ops::AttentionBackend::Cudnn) return cudnn_attention_backward(q);
  flash_attention_backward(q);
}

}  // namespace engine::cuda
