// Dispatch of ops/attention.h: CPU -> ref/attention, CUDA -> cuda/attention (flash attention:
// the Hopper or the mma.sync kernels for head dims 64 and 128 as AttentionParams::kernel says, a
// simple f32 kernel for the others; or cuDNN's fused attention, cudnn_sdpa, when
// AttentionParams::backend says so).
#include "ops/attention.h"

#include <algorithm>

#include "ops/dispatch.h"
#include "ref/attention.h"

#ifdef ENGINE_CUDA
#include "cuda/attention/cudnn_sdpa.cuh"
#include "cuda/attention/flash.cuh"
#endif

namespace engine::ops {

#ifdef ENGINE_CUDA
namespace {
// A window at least as long as every sequence limits nothing: the kernels get 0 (unlimited),
// which also keeps their 32-bit tile arithmetic (first key + tile + window) from overflowing
// on windows such as INT_MAX meant as "no limit".
AttentionParams kernel_params(const AttentionParams& p) {
  AttentionParams q = p;
  const int longest = std::max(p.max_seqlen, p.separate_kv() ? p.max_seqlen_k : 0);
  if (q.window > 0 && q.window >= longest) q.window = 0;
  return q;
}
}  // namespace
#endif

void attention_forward(const AttentionParams& p) {
  if (device_of("attention_forward", {{"qkv", p.qkv},
                                      {"out", p.out},
                                      {"lse", p.lse},
                                      {"cu_seqlens", p.cu_seqlens},
                                      {"kv", p.kv},
                                      {"cu_seqlens_k", p.cu_seqlens_k}}) == Device::CPU)
    return ref::attention_forward(p);
#ifdef ENGINE_CUDA
  const AttentionParams q = kernel_params(p);
  if (q.backend == AttentionBackend::Cudnn) return cuda::cudnn_attention_forward(q);
  return cuda::attention_forward(q);
#endif
  no_cuda_build("attention_forward");
}

void attention_backward(const AttentionBackwardParams& p) {
  if (device_of("attention_backward", {{"qkv", p.fwd.qkv},
                                       {"out", p.fwd.out},
                                       {"lse", p.fwd.lse},
                                       {"cu_seqlens", p.fwd.cu_seqlens},
                                       {"kv", p.fwd.kv},
                                       {"cu_seqlens_k", p.fwd.cu_seqlens_k},
                                       {"dout", p.dout},
                                       {"dqkv", p.dqkv},
                                       {"dkv", p.dkv}}) == Device::CPU)
    return ref::attention_backward(p);
#ifdef ENGINE_CUDA
  AttentionBackwardParams q = p;
  q.fwd = kernel_params(p.fwd);
  if (q.fwd.backend == AttentionBackend::Cudnn) return cuda::cudnn_attention_backward(q);
  return cuda::attention_backward(q);
#endif
  no_cuda_build("attention_backward");
}

const char* attention_kernel_name(Device device, int head_dim, AttentionKernel kernel) {
  if (device == Device::CPU) return "reference";
#ifdef ENGINE_CUDA
  return cuda::attention_kernel_for(head_dim, kernel);
#else
  (void)head_dim;
  (void)kernel;
  no_cuda_build("attention_kernel_name");
#endif
}

}  // namespace engine::ops
