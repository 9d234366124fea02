// Flash attention on the GPU: the launchers behind ops::attention_forward / attention_backward
// for CUDA tensors (contract in csrc/ops/attention.h; CPU oracle csrc/ref/attention.cpp).
// Plain C++ declarations, so g++-built files include this header.
//
//   forward:  out (T, H, D) bf16 and lse (T, H) f32 from qkv (T, H + 2 Hkv, D) bf16
//   backward: dqkv (T, H + 2 Hkv, D) bf16 written (=) from dout (T, H, D) bf16, out and lse
// cu_seqlens (S + 1) i32 lives on the device and is never read on the host: max_seqlen must
// bound every sequence length (the grids are sized from it; rows past it would be left
// unwritten). Head dims 64 and 128 run the mma.sync kernels (flash_fwd.cuh, flash_bwd.cuh;
// qkv, out, dout and dqkv 16-byte aligned); any other D <= 256 runs simple f32 kernels
// (flash_fallback.cu). Backward on the mma path draws an f32 (T, H, D) dQ accumulator and a
// (T, H) f32 scratch from the caching allocator (engine::Buffer); its dQ is not bitwise
// deterministic (f32 atomics), dK and dV are, and the fallback path is fully deterministic.
#pragma once
#include "ops/attention.h"

namespace engine::cuda {

void attention_forward(const ops::AttentionParams& p);
void attention_backward(const ops::AttentionBackwardParams& p);

}  // namespace engine::cuda
