// Rotary embedding, "rotate half" pairing: in each of the first `rotated_heads` heads of row t,
// dimension i (< D/2) pairs with i + D/2 and the pair turns by angle a = pos(t) * inv_freq(i),
// scaled by m (inv_freq and m: ops/rope_params.h, shared with the CUDA kernel; 2-D positions:
// pos(t) the row or the column, rope_2d_inv_freq):
//   forward  (a, b) -> m (a cos - b sin, b cos + a sin)
//   backward (a, b) -> m (a cos + b sin, b cos - a sin)   (the transpose of the forward map)
// In place; rows in parallel. Heads past rotated_heads (v of a packed qkv) are not touched.
// The shared checks ran before (ops/rope.cpp); the reference takes f32 or f64.
#include "ops/rope.h"

#include <cmath>
#include <vector>

#include "ref/common.h"

namespace engine::ref {
namespace {

void rope_apply(const Tensor& x, const Tensor& positions, int rotated_heads, const ops::RopeParams& rope,
                double direction, const char* op, const char* xname) {
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2);
  const int64_t half = d / 2;
  const bool two_d = positions.ndim() == 2;  // (T, 2): row and column, each pair using one
  std::vector<double> inv_freq(static_cast<size_t>(half));
  std::vector<int> coord(static_cast<size_t>(half), 0);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] =
        two_d ? ops::rope_2d_inv_freq(rope.theta, static_cast<int>(i), static_cast<int>(d), &coord[static_cast<size_t>(i)])
              : ops::rope_inv_freq(rope, static_cast<int>(i), static_cast<int>(d));
  const double m = ops::rope_output_scale(rope);
  const int32_t* pos = positions.ptr<int32_t>();
  const int64_t stride = two_d ? 2 : 1;
  float_switch(x.dtype, op, xname, [&](auto tag) {
    using T = decltype(tag);
    T* px = x.ptr<T>();
#pragma omp parallel for schedule(static) if (rows * rotated_heads * d > (1 << 15))
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos[t * stride + coord[static_cast<size_t>(i)]] * inv_freq[static_cast<size_t>(i)];
        const double c = std::cos(angle) * m, s = direction * (std::sin(angle) * m);
        for (int64_t h = 0; h < rotated_heads; ++h) {
          T* head = px + (t * heads + h) * d;
          const double a = head[i], b = head[i + half];
          head[i] = static_cast<T>(a * c - b * s);
          head[i + half] = static_cast<T>(b * c + a * s);
        }
      }
    }
  });
}

}  // namespace

void rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads, const ops::RopeParams& rope) {
  rope_apply(x, positions, rotated_heads, rope, +1.0, "rope_forward", "x");
}

void rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads,
                   const ops::RopeParams& rope) {
  rope_apply(dx, positions, rotated_heads, rope, -1.0, "rope_backward", "dx");
}

}  // namespace engine::ref
