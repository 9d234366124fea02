// Dispatch of ops/attention.h: CPU -> ref/attention, CUDA -> cuda/attention (flash attention:
// mma.sync kernels for head dims 64 and 128, a simple f32 kernel for the others; or cuDNN's
// fused attention, cudnn_sdpa, when AttentionParams::backend says so).
#include "ops/attention.h"

#include "ops/dispatch.h"
#include "ref/attention.h"

#ifdef ENGINE_CUDA
#include "cuda/attention/cudnn_sdpa.cuh"
#include "cuda/attention/flash.cuh"
#endif

namespace engine::ops {

void attention_forward(const AttentionParams& p) {
  if (device_of("attention_forward", {{"qkv", p.qkv},
                                      {"out", p.out},
                                      {"lse", p.lse},
                                      {"cu_seqlens", p.cu_seqlens},
                                      {"kv", p.kv},
                                      {"cu_seqlens_k", p.cu_seqlens_k}}) == Device::CPU)
    return ref::attention_forward(p);
#ifdef ENGINE_CUDA
  if (p.backend == AttentionBackend::Cudnn) return cuda::cudnn_attention_forward(p);
  return cuda::attention_forward(p);
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
  if (p.fwd.backend == AttentionBackend::Cudnn) return cuda::cudnn_attention_backward(p);
  return cuda::attention_backward(p);
#endif
  no_cuda_build("attention_backward");
}

}  // namespace engine::ops
