// The rotary embedding's per-dimension inverse frequencies and output scale, one definition for
// the CPU reference (csrc/ref/rope.cpp) and the CUDA kernel (cuda/rope/rope.cu), so both turn
// each pair by the same angle. Pair i (< D/2) of a head of dim D turns by pos * inv_freq(i), with
// f(i) = theta^(-2i/D) the default frequency and, as transformers' modeling_rope_utils computes
// them (ROPE_INIT_FUNCTIONS):
//   none    f(i)
//   linear  f(i) / factor
//   llama3  wavelength w = 2 pi / f(i), L = original_max_position_embeddings:
//           w < L / high_freq_factor: f(i); w > L / low_freq_factor: f(i) / factor;
//           between: (1 - s) f(i) / factor + s f(i), s = (L / w - low) / (high - low)
//   yarn    the pair index where a wavelength fits r times in L, for r = beta_fast and beta_slow,
//             c(r) = D ln(L / (2 pi r)) / (2 ln theta),
//           lo = c(beta_fast), hi = c(beta_slow) (floor and ceil when truncate), clamped to
//           [0, D - 1] (hi: transformers' bound), hi += 0.001 when equal;
//           ramp(i) = clamp((i - lo) / (hi - lo), 0, 1):  f(i) (1 - ramp) + f(i) / factor ramp
// yarn also scales the rotated vector by attention_factor (transformers multiplies cos and sin
// by it); the other kinds by 1. Everything here is in double.
#pragma once
#include <math.h>

#if defined(__CUDACC__)
#define ENGINE_ROPE_HD __host__ __device__ inline
#else
#define ENGINE_ROPE_HD inline
#endif

namespace engine {

enum class RopeScalingKind { None, Linear, Llama3, Yarn };

namespace ops {

// What the rope ops need to know of the frequencies; fields a kind does not use are ignored.
struct RopeParams {
  double theta = 10000.0;  // base, > 0
  RopeScalingKind kind = RopeScalingKind::None;
  double factor = 1.0;                            // linear, llama3, yarn; > 0
  double low_freq_factor = 1.0;                   // llama3
  double high_freq_factor = 4.0;                  // llama3; > low_freq_factor
  double original_max_position_embeddings = 0.0;  // llama3, yarn (L); > 0
  double beta_fast = 32.0;                        // yarn; > 0
  double beta_slow = 1.0;                         // yarn; > 0
  bool truncate = true;                           // yarn: integer correction range
  double attention_factor = 1.0;                  // yarn: scale of the output; > 0
};

// Inverse frequency of pair i of a head of dim d (the formulas above).
ENGINE_ROPE_HD double rope_inv_freq(const RopeParams& p, int i, int d) {
  const double kTwoPi = 6.283185307179586476925;
  const double f = pow(p.theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  switch (p.kind) {
    case RopeScalingKind::None:
      return f;
    case RopeScalingKind::Linear:
      return f / p.factor;
    case RopeScalingKind::Llama3: {
      const double L = p.original_max_position_embeddings, wavelen = kTwoPi / f;
      if (wavelen < L / p.high_freq_factor) return f;
      if (wavelen > L / p.low_freq_factor) return f / p.factor;
      const double s = (L / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
      return (1.0 - s) * f / p.factor + s * f;
    }
    case RopeScalingKind::Yarn: {
      const double L = p.original_max_position_embeddings, dd = static_cast<double>(d);
      const double scale = dd / (2.0 * log(p.theta));
      double lo = scale * log(L / (kTwoPi * p.beta_fast)), hi = scale * log(L / (kTwoPi * p.beta_slow));
      if (p.truncate) {
        lo = floor(lo);
        hi = ceil(hi);
      }
      lo = fmax(lo, 0.0);
      hi = fmin(hi, dd - 1.0);
      if (lo == hi) hi += 0.001;
      const double ramp = fmin(fmax((static_cast<double>(i) - lo) / (hi - lo), 0.0), 1.0);
      return f * (1.0 - ramp) + f / p.factor * ramp;
    }
  }
  return f;
}

// 2-D positions (an image's patch row and column, as transformers' PixtralRotaryEmbedding): pair i
// of a head of dim d (a multiple of 4) turns by row * theta^(-4i/d) for i < d/4 and by
// col * theta^(-(4(i - d/4) + 2)/d) after: the even default frequencies for the rows, the odd ones
// for the columns. Returns the frequency; *coord is 0 (row) or 1 (column).
ENGINE_ROPE_HD double rope_2d_inv_freq(double theta, int i, int d, int* coord) {
  const int quarter = d / 4;
  *coord = i < quarter ? 0 : 1;
  const double j = i < quarter ? 2.0 * i : 2.0 * (i - quarter) + 1.0;  // index of the default frequency
  return pow(theta, -2.0 * j / static_cast<double>(d));
}

// The factor the rotated vector is scaled by (cos and sin are multiplied by it).
ENGINE_ROPE_HD double rope_output_scale(const RopeParams& p) {
  return p.kind == RopeScalingKind::Yarn ? p.attention_factor : 1.0;
}

}  // namespace ops
}  // namespace engine
