// Per-head RMSNorm of the q and k heads of a packed qkv tensor, in place (ops/qk_norm.h):
//   rstd = 1 / sqrt(mean(r^2) + eps),  r <- r * rstd * w_(q or k)
//   backward: xhat = input * rstd, g = dy * w,  dx = rstd * (g - xhat * mean(g * xhat)),
//             dw += sum over the rows of that weight's heads of dy * xhat
// Rows are every (t, head) with head < q_heads + k_heads; every sum in double. Rows run in
// parallel; the weight gradients run in parallel over columns, each summing the rows in (t,
// head) order, so every result is independent of the thread count.
// The shared checks ran before (ops/qk_norm.cpp); the reference takes f32 or f64.
#include "ops/qk_norm.h"

#include <cmath>

#include "ref/common.h"

namespace engine::ref {

void qk_norm_forward(const Tensor& x, const Tensor& weight, int q_heads, float eps, const Tensor& input,
                     const Tensor& rstd) {
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2), normed = rstd.size(1);
  float_switch(x.dtype, "qk_norm_forward", "x", [&](auto tag) {
    using T = decltype(tag);
    T* px = x.ptr<T>();
    T* pin = input.ptr<T>();
    T* prs = rstd.ptr<T>();
    const T* w = weight.ptr<T>();
#pragma omp parallel for schedule(static) if (rows * normed * d > (1 << 15))
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t h = 0; h < normed; ++h) {
        T* r = px + (t * heads + h) * d;
        T* saved = pin + (t * normed + h) * d;
        const T* wr = w + (h < q_heads ? 0 : d);
        double ss = 0;
        for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(r[j]) * r[j];
        const double rs = 1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps));
        for (int64_t j = 0; j < d; ++j) {
          saved[j] = r[j];
          r[j] = static_cast<T>(static_cast<double>(r[j]) * rs * wr[j]);
        }
        prs[t * normed + h] = static_cast<T>(rs);
      }
    }
  });
}

void qk_norm_backward(const Tensor& dx, const Tensor& input, const Tensor& weight, int q_heads,
                      const Tensor& rstd, const Tensor& dweight) {
  const int64_t rows = dx.size(0), heads = dx.size(1), d = dx.size(2), normed = rstd.size(1);
  float_switch(dx.dtype, "qk_norm_backward", "dx", [&](auto tag) {
    using T = decltype(tag);
    T* pdx = dx.ptr<T>();
    const T* pin = input.ptr<T>();
    const T* prs = rstd.ptr<T>();
    const T* w = weight.ptr<T>();
    T* dw = dweight.ptr<T>();
    const bool parallel = rows * normed * d > (1 << 15);
    // Weight gradients first: dx is overwritten below.
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t j = 0; j < d; ++j) {
      double sq = 0, sk = 0;
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t h = 0; h < normed; ++h) {
          const double v = static_cast<double>(pdx[(t * heads + h) * d + j]) * pin[(t * normed + h) * d + j] *
                           prs[t * normed + h];
          (h < q_heads ? sq : sk) += v;
        }
      dw[j] = static_cast<T>(dw[j] + sq);
      dw[d + j] = static_cast<T>(dw[d + j] + sk);
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t h = 0; h < normed; ++h) {
        T* g = pdx + (t * heads + h) * d;
        const T* xr = pin + (t * normed + h) * d;
        const T* wr = w + (h < q_heads ? 0 : d);
        const double rs = prs[t * normed + h];
        double gx = 0;
        for (int64_t j = 0; j < d; ++j) gx += static_cast<double>(g[j]) * wr[j] * xr[j] * rs;
        gx /= static_cast<double>(d);
        for (int64_t j = 0; j < d; ++j)
          g[j] = static_cast<T>(rs * (static_cast<double>(g[j]) * wr[j] - xr[j] * rs * gx));
      }
    }
  });
}

}  // namespace engine::ref
