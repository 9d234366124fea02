// The special-function unit's one-instruction forms, shared by the kernels that lean on them
// (attention's softmax, the cross-entropy and distillation rows, the Mamba scans and conv):
// 2^x and 1 / x, approximate (ex2: 2 ulp; rcp: 1 ulp) and flushing denormals to zero. The
// library's __expf and __frcp_rn add a range fix-up or a dozen instructions and a call when
// denormals are kept, as this build does. The constants are usable in host code as well.
#pragma once

namespace engine::cuda {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): e^x = 2^(x log2(e))
constexpr float kLn2 = 0.6931471805599453f;    // ln(2): log(x) = log2(x) ln(2)

#ifdef __CUDACC__
// 2^x (-inf -> +0, +inf -> +inf).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 1 / x (rcp(inf) = 0).
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 1 / (1 + e^-z). kFast: the library's fast exp and divide (error ~1e-6, for bf16 outputs);
// else IEEE exp and division.
template <bool kFast>
__device__ __forceinline__ float sigmoid(float z) {
  if constexpr (kFast)
    return __fdividef(1.f, 1.f + __expf(-z));
  else
    return 1.f / (1.f + expf(-z));
}
// 1 / (1 + e^-v) in the one-instruction forms above (the Mamba gates): 0 when e^-v overflows
// (rcp(inf) = 0), 1 when it underflows.
__device__ __forceinline__ float sigmoid_ex2(float v) { return rcp(1.f + ex2(v * -kLog2e)); }
#endif

}  // namespace engine::cuda
