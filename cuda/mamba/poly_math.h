// Polynomial log1p of the selective scan's softplus (scan_impl.cuh's softplus_fast), so that its
// work runs on the FMA pipes (128 per clock and multiprocessor) instead of the special-function
// unit (16 per clock: ex2.approx, lg2.approx), which bounds the scan's kernels. Plain C++ as well
// as device code, so that its accuracy is tested on the CPU (tests/kernels/mamba/test_mamba.cpp).
#pragma once
#include <math.h>

#if defined(__CUDACC__)
#define MAMBA_HD __host__ __device__ __forceinline__
#else
#define MAMBA_HD inline
#endif

namespace engine::cuda::mamba {

// log1p(u) / u for u in [0, 1] (softplus(v) = max(v, 0) + u log1p_q(u) with u = e^-|v|, one
// special-function instruction instead of an exp and a log): degree-8 minimax for the relative
// error (3.0e-8), coefficients rounded to f32; u log1p_q(u) within 1.8e-7 relative of log1p
// over (0, 1] (3 ulp at log1p(1)). 9 FMAs.
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
