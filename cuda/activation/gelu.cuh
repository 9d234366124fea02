// The tanh-form GELU and its derivative on one f32 value, for every kernel that applies them
// (cuda/activation/activation.cu; the fallback GEMM epilogue of cuda/gemm/gemm.cu):
//   u = c (x + a x^3), c = sqrt(2/pi), a = 0.044715
//   gelu(x)  = 0.5 x (1 + tanh u) = x s,  s = sigmoid(2u) = 1 / (1 + e^(-2u))
//   gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3a x^2)
//            = s (1 + 2x (1 - s) c (1 + 3a x^2))
// The sigmoid form needs no tanh and no cancellation in 1 + tanh u; e^(-2u) = inf gives s = 0.
// kFast (outputs rounded to bf16): the fast exp / divide (error ~1e-6, far below bf16's 4e-3);
// else IEEE exp and division.
#pragma once
#include "cuda/common/fast_math.cuh"

namespace engine::cuda::gelu {

constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kA = 0.044715f;

template <bool kFast>
__device__ __forceinline__ float forward(float x) {
  const float u = kC * (x + kA * x * x * x);
  return x * sigmoid<kFast>(2.f * u);
}

template <bool kFast>
__device__ __forceinline__ float grad(float x) {
  const float u = kC * (x + kA * x * x * x);
  const float s = sigmoid<kFast>(2.f * u);
  return s * (1.f + 2.f * x * (1.f - s) * kC * (1.f + 3.f * kA * x * x));
}

}  // namespace engine::cuda::gelu
