// Flash attention on the GPU: the launchers that cuda::attention_forward / attention_backward
// (cuda/attention/attention.cu) run for the Flash backend, after the shared checks of
// ops/attention.cpp and the window clamp (contract in csrc/ops/attention.h; CPU oracle
// csrc/ref/attention.cpp). Plain C++ declarations, so g++-built files include this header.
//
//   forward:  out (T, H, D) bf16 and lse (T, H) f32 from qkv (T, H + 2 Hkv, D) bf16
//   backward: dqkv (T, H + 2 Hkv, D) bf16 written (=) from dout (T, H, D) bf16, out and lse
// With separate keys (kv (Tk, 2 Hkv, D) bf16, cu_seqlens_k): keys and values from kv, the
// queries the last positions of their sequence's keys; backward writes dqkv's q heads and dkv.
// cu_seqlens (S + 1) i32 lives on the device and is never read on the host (cu_seqlens_k
// neither, so len_k >= len_q is the caller's to keep): max_seqlen (max_seqlen_k) must bound
// every query (key) length (the grids are sized from them; rows past them would be left
// unwritten). Head dims 64 and 128 run the mma.sync or the Hopper kernels (below; qkv, out,
// dout, dqkv, kv and dkv 16-byte aligned); any other D <= 256 runs simple f32 kernels
// (flash_fallback.cu). Backward on the mma path draws an f32 (T, H, D) dQ accumulator and a
// (T, H) f32 scratch from the caching allocator (engine::Buffer); its dQ is not bitwise
// deterministic (f32 atomics), dK and dV are, and the fallback path is fully deterministic.
#pragma once
#include "ops/attention.h"

namespace engine::cuda {

// The kernels of a call follow ops::AttentionParams::kernel (ops/attention.h), resolved per call
// (forward and backward alike):
//   Auto, Sm90  the Hopper kernels (flash_sm90.cu, flash_bwd_sm90.cu) where they take the call (an
//               sm_90a build on a compute capability 9.0 device, no separate kv, 16-byte aligned
//               qkv and dout, head dim 64 or 128), else as MmaSync
//   MmaSync     the portable mma.sync kernels (flash_fwd.cuh, flash_bwd.cuh), the reference the
//               Hopper kernels are tested against
// Head dims other than 64 and 128 run the f32 fallback (flash_fallback.cu) under any choice.
// Whether the Hopper forward can run on this device for head_dim (64 or 128).
bool attention_sm90_available(int head_dim);
// What `kernel` resolves to for head_dim on the current device, for calls on qkv's own keys with
// 16-byte aligned tensors: "sm90", "mma.sync", "fallback", or "unsupported" (head dims past
// 1 .. 256, which the launchers reject). Behind ops::attention_kernel_name.
const char* attention_kernel_for(int head_dim, ops::AttentionKernel kernel);

void flash_attention_forward(const ops::AttentionParams& p);
void flash_attention_backward(const ops::AttentionBackwardParams& p);

}  // namespace engine::cuda
