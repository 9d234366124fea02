// FP8 numerics: the two OCP 8-bit float formats Hopper's tensor cores multiply, the scaling that
// maps a tensor into one, and the scaled FP8 matrix product.
// Formats (bytes in u8 tensors; the format is an argument, not a dtype):
//   e4m3 (E4M3FN): 4 exponent bits, bias 7, 3 mantissa bits; no infinities; 0x7f / 0xff NaN;
//                  largest finite 448, smallest subnormal 2^-9
//   e5m2:          5 exponent bits, bias 15, 2 mantissa bits; IEEE-like (infinities, NaNs);
//                  largest finite 57344, smallest subnormal 2^-16
// Encoding (fp8_encode): round to nearest, ties to even, and saturate: a finite value or an
// infinity beyond the largest finite magnitude becomes that magnitude with its sign; a NaN of
// either sign becomes 0x7f (the GPU's arithmetic does not keep a NaN's sign through the scale's
// product, so no side keeps it). Otherwise this is the GPU's __nv_cvt_float_to_fp8(x, __NV_SATFINITE).
// Scaling, current (from this tensor's own amax) and per tensor or per row of the output:
//   fp8_amax:     amax = max |x| over the whole tensor (amax has 1 element) or over each row of
//                 op(x) (amax has op(x).size(0) elements), op(x) = x, or x^T with transpose; a
//                 NaN anywhere in a row makes that row's amax NaN
//   fp8_quantize: scale_r = max_finite(format) / amax_r in f32 (1 where amax_r == 0),
//                 out = encode(f32(op(x)(r, j)) * scale_r) (the product rounded to f32 first),
//                 scale_inv_r = 1 / scale_r in f32 (what the product multiplies back)
//   x (R, C) f32 or bf16 on the GPU, f32 or f64 on the CPU (converted to f32 before the scale);
//   out u8 (R, C), or (C, R) with transpose; amax and scale_inv f32, 1 element or one a row of out.
//   fp8_quantize_pair: both layouts from one read of x, each exactly as fp8_quantize gives it:
//                 out from x with amax (1 or R), out_t from x^T with amax_t (1 or C). amax and
//                 amax_t may be the same tensor (per tensor: the one amax serves both).
// fp8_matmul: c(i, j) = beta * d(i, j) + sa(i) * sb(j) * sum_k dec(a(i, k)) * dec(b(j, k)) + bias(j)
//   a u8 (M, K) and b u8 (N, K), both row-major with K contiguous (the weight (out, in) of a
//   linear layer is such a b); sa = a_scale_inv, one element or M; sb = b_scale_inv, one element
//   or N, per tensor or per row in both; c (M, N) bf16 or f32. Options (Fp8MatmulOptions): beta
//   0 or 1; d = the addend where set (c's shape and dtype, c itself or not overlapping it: a
//   residual added in the epilogue), else c (gradient accumulation); bias (N) or undefined, of
//   c's dtype. The formats: e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3.
//   CPU: c f32 or f64, the sum in double in k order, then scaled, then beta d and the bias added
//   in double. GPU (sm_90 cuBLASLt, f32 accumulation): K and N multiples of 16; every pointer
//   16-byte aligned; the addend and bias read in the epilogue where cuBLASLt takes them, else
//   added by one more pass over c (the same sum, rounded once more).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ops {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

constexpr const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }
constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.f : 57344.f; }

// The value of an FP8 byte (every byte: NaNs decode to NaN, e5m2's infinities to infinity).
inline float fp8_decode(uint8_t v, Fp8Format f) {
  const int mbits = f == Fp8Format::E4M3 ? 3 : 2, bias = f == Fp8Format::E4M3 ? 7 : 15;
  const int exp = (v & 0x7f) >> mbits, man = v & ((1 << mbits) - 1), emax = (1 << (7 - mbits)) - 1;
  const float sign = (v & 0x80) ? -1.f : 1.f;
  if (f == Fp8Format::E4M3 && (v & 0x7f) == 0x7f) return NAN;
  if (f == Fp8Format::E5M2 && exp == emax) return man ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), 1 - bias - mbits);
  return sign * std::ldexp(static_cast<float>(man + (1 << mbits)), exp - bias - mbits);
}

// Round to nearest even with saturation (the contract above). Exact: the value is scaled by
// powers of two only, so the one rounding is nearbyint's (the default rounding mode, to even).
inline uint8_t fp8_encode(float x, Fp8Format f) {
  const int mbits = f == Fp8Format::E4M3 ? 3 : 2, bias = f == Fp8Format::E4M3 ? 7 : 15;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return 0x7f;
  const double a = std::fabs(static_cast<double>(x)), max = fp8_max(f);
  if (a >= max) return sign | (f == Fp8Format::E4M3 ? 0x7e : 0x7b);
  int e = 0;
  std::frexp(a, &e);                                      // a = m * 2^e, m in [0.5, 1)
  const int q_exp = std::max(e - 1, 1 - bias) - mbits;    // the quantum of a's binade
  const double r = std::nearbyint(std::ldexp(a, -q_exp)); // a in quanta, rounded to even
  // (below max, so r quanta never exceed it.) r quanta of 2^q_exp: the encoding's exponent field and mantissa from r's position.
  int64_t units = static_cast<int64_t>(r);
  int field = q_exp + mbits + bias;                       // the exponent field when r's top bit is 2^mbits
  if (units == 0) return sign;
  while (units >= (int64_t{2} << mbits)) {                // rounded up into the next binade
    units >>= 1;
    ++field;
  }
  if (units < (int64_t{1} << mbits)) return static_cast<uint8_t>(sign | units);  // subnormal
  return static_cast<uint8_t>(sign | (field << mbits) | (units - (int64_t{1} << mbits)));
}

struct Fp8MatmulOptions {
  Fp8MatmulOptions(float beta_ = 0.f) : beta(beta_) {}  // (a plain beta converts)
  float beta = 0.f;
  Tensor addend;  // read in place of c where beta == 1
  Tensor bias;    // (N)
};

template <typename F>
void visit_tensors(const Fp8MatmulOptions& o, const char*, F&& f) {
  f(o.addend, "addend");
  f(o.bias, "bias");
}

// The scale of a row from its amax (the contract above), and its inverse.
inline float fp8_scale(float amax, Fp8Format f) { return amax == 0.f ? 1.f : fp8_max(f) / amax; }

}  // namespace engine::ops

#define ENGINE_FP8_OPS(OP)                                                                      \
  OP(void, fp8_amax, (const Tensor& x, bool transpose, const Tensor& amax), (x, transpose, amax)) \
  OP(void, fp8_quantize,                                                                        \
     (const Tensor& x, bool transpose, const Tensor& amax, ops::Fp8Format format,               \
      const Tensor& out, const Tensor& scale_inv),                                              \
     (x, transpose, amax, format, out, scale_inv))                                              \
  OP(void, fp8_quantize_pair,                                                                   \
     (const Tensor& x, const Tensor& amax, const Tensor& amax_t, ops::Fp8Format format,         \
      const Tensor& out, const Tensor& scale_inv, const Tensor& out_t, const Tensor& scale_inv_t), \
     (x, amax, amax_t, format, out, scale_inv, out_t, scale_inv_t))                             \
  OP(void, fp8_matmul,                                                                          \
     (const Tensor& a, ops::Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,     \
      ops::Fp8Format b_format, const Tensor& b_scale_inv, const Tensor& c,                     \
      const ops::Fp8MatmulOptions& options),                                                    \
     (a, a_format, a_scale_inv, b, b_format, b_scale_inv, c, options))

ENGINE_DECLARE_OPS(ENGINE_FP8_OPS)
