// Polynomial forms of the selective scan's special functions, so that their work runs on the
// FMA pipes (128 per clock and multiprocessor) instead of the special-function unit (16 per
// clock: ex2.approx, lg2.approx, rcp.approx), which bounds the scan's kernels. Plain C++ as well
// as device code, so that their accuracy is tested on the CPU (tests/kernels/mamba/test_mamba.cpp).
//
// exp2_poly(x), 2^x for x <= 0: the decays exp(delta A) = 2^(delta A log2 e).
// Cody-Waite style reduction: x = j + f with j = round(x) (the 1.5 * 2^23 trick: adding it rounds
// to an integer that lands in the low mantissa bits) and f = x - j in [-1/2, 1/2] (exact);
// 2^f by a degree-6 polynomial with p(0) = 1 exactly (minimax for the relative error on
// [-1/2, 1/2] under that constraint, 2.0e-9; coefficients rounded to f32); 2^j by adding j to
// the exponent field (the integer j sits in the low bits of x + 1.5 * 2^23, so shifting those
// bits left by 23 and adding them to p's bits adds j to its exponent). Measured on the CPU against
// exp2 in f64 over [-126, 0] (every 7th float): at most 0.95 ulp, exact at the integers (degree 5:
// 2.03 ulp; ex2.approx: 2 ulp).
// Arguments below -126 (and -inf, NaN) give 2^-126 = 1.2e-38 where ex2.approx gives 0 (a decay
// that is zero for any purpose: the scan's states are sums of products of bf16 inputs); the
// result never leaves the normal range. Positive arguments are outside the contract.
// Cost: 11 FP32/integer instructions (max, 3 adds, 6 FMAs, one shift-add) for one
// special-function instruction.
#pragma once
#include <cstdint>
#include <cstring>
#include <math.h>

#if defined(__CUDACC__)
#define MAMBA_HD __host__ __device__ __forceinline__
#else
#define MAMBA_HD inline
#endif

namespace engine::cuda::mamba {

MAMBA_HD uint32_t f32_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

MAMBA_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

// 2^x for x <= 0 (see the file comment: within 1 ulp; 2^-126 below -126).
MAMBA_HD float exp2_poly(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23
  x = fmaxf(x, -126.f);
  const float t = x + kRound;  // kRound + round(x): round(x) in the low mantissa bits
  const float j = t - kRound;
  const float f = x - j;       // exact, |f| <= 1/2
  float p = 0x1.41fbbcp-13f;        // 1.5353362e-4
  p = fmaf(p, f, 0x1.5f3e52p-10f);  // 1.3398874e-3
  p = fmaf(p, f, 0x1.3b2d4cp-7f);   // 9.6184373e-3
  p = fmaf(p, f, 0x1.c6aee8p-5f);   // 5.5503324e-2
  p = fmaf(p, f, 0x1.ebfbdcp-3f);   // 0.24022648
  p = fmaf(p, f, 0x1.62e430p-1f);   // 0.69314720
  p = fmaf(p, f, 1.f);
  // p in [2^-1/2, 2^1/2]: exponent field 126 or 127; j >= -126 keeps the sum's exponent >= 1.
  return f32_from_bits(f32_bits(p) + (f32_bits(t) << 23));
}

// log1p(u) / u for u in [0, 1] (softplus(v) = max(v, 0) + u log1p_q(u) with u = e^-|v|, one
// special-function instruction instead of an exp and a log): degree-8 minimax for the relative
// error (3.0e-8), coefficients rounded to f32; u log1p_q(u) measured on the CPU against log1p in
// f64: within 1.8e-7 relative over (0, 1] (3 ulp at log1p(1)). 9 FMAs.
MAMBA_HD float log1p_q(float u) {
  float q = 0x1.56edf4p-8f;          // 5.2326888e-3
  q = fmaf(q, u, -0x1.e369d8p-6f);   // -2.9505216e-2
  q = fmaf(q, u, 0x1.4069d0p-4f);    // 7.8225911e-2
  q = fmaf(q, u, -0x1.17d2bcp-3f);   // -0.13663241
  q = fmaf(q, u, 0x1.874a7ep-3f);    // 0.19106005
  q = fmaf(q, u, -0x1.fcc8c6p-3f);   // -0.24842982
  q = fmaf(q, u, 0x1.553004p-2f);    // 0.33319098
  q = fmaf(q, u, -0x1.fffeacp-2f);   // -0.49999493
  return fmaf(q, u, 0x1.fffffep-1f);  // 0.99999994
}

}  // namespace engine::cuda::mamba
