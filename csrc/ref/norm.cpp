// Layer norms over the last dimension of x (T, C), computed row by row in double.
//   layernorm: xhat = (x - mean) * rstd,  y = xhat * w + b
//              dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w
//   rmsnorm:   xhat = x * rstd,           y = xhat * w
//              dx = rstd * (g - xhat * mean(g * xhat))
//   dweight += sum_t dy * xhat,  dbias += sum_t dy
// Residual forms: the row of x + residual is rounded to T into sum first and normalised from
// there; dx is rounded to T, then dresidual added in T's arithmetic (float for f32) and rounded,
// as ref::add does, so they are bitwise the separate add and the plain norm.
// Rows run in parallel for y and dx; parameter gradients run in parallel over column chunks,
// each summing the rows in order, so every result is independent of the thread count.
#include "ops/norm.h"
#include "ops/fp8.h"

#include <algorithm>
#include <cmath>

#include "ref/common.h"
#include "ops/gemm.h"

namespace engine::ref {
namespace {

constexpr int64_t kCols = 256;  // column chunk of the parameter-gradient sums

struct NormShape {
  int64_t rows, cols;
};

// The shared checks ran (ops/norm.cpp); the reference takes x in f32 or f64 (float_switch).
NormShape shape_of(const Tensor& x) { return {x.size(0), x.size(1)}; }

// res == nullptr: the plain norm of x; else sum = x + res, normalised.
template <typename T>
void norm_forward(const T* x, const T* res, T* sum, const T* w, const T* b, double eps, T* y,
                  T* mean, T* rstd, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (int64_t t = 0; t < rows; ++t) {
    const T* xr = x + t * cols;
    if (res) {
      T* sr = sum + t * cols;
      for (int64_t j = 0; j < cols; ++j) sr[j] = static_cast<T>(xr[j] + res[t * cols + j]);
      xr = sr;
    }
    double mu = 0;
    if (mean) {
      for (int64_t j = 0; j < cols; ++j) mu += xr[j];
      mu /= static_cast<double>(cols);
    }
    double ss = 0;
    for (int64_t j = 0; j < cols; ++j) ss += (xr[j] - mu) * (xr[j] - mu);
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    for (int64_t j = 0; j < cols; ++j) {
      double v = (xr[j] - mu) * rs * w[j];
      if (b) v += b[j];
      y[t * cols + j] = static_cast<T>(v);
    }
    if (mean) mean[t] = static_cast<T>(mu);
    rstd[t] = static_cast<T>(rs);
  }
}

// mean == nullptr selects rmsnorm (mean 0); dbias may be null; dres (may alias dx) is added to
// dx when set.
template <typename T>
void norm_backward(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                   const T* dres, T* dx, T* dw, T* db, int64_t rows, int64_t cols) {
  const bool parallel = rows * cols > (1 << 15);
  // Parameter gradients first, so dx may alias dy.
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t j0 = 0; j0 < cols; j0 += kCols) {
    const int64_t n = std::min(kCols, cols - j0);
    double sw[kCols] = {}, sb[kCols] = {};
    for (int64_t t = 0; t < rows; ++t) {
      const double mu = mean ? mean[t] : 0.0, rs = rstd[t];
      for (int64_t j = 0; j < n; ++j) {
        const double d = dy[t * cols + j0 + j];
        sw[j] += d * (x[t * cols + j0 + j] - mu) * rs;
        sb[j] += d;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      dw[j0 + j] = static_cast<T>(dw[j0 + j] + sw[j]);
      if (db) db[j0 + j] = static_cast<T>(db[j0 + j] + sb[j]);
    }
  }
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < rows; ++t) {
    const T* xr = x + t * cols;
    const T* dyr = dy + t * cols;
    const double mu = mean ? mean[t] : 0.0, rs = rstd[t];
    double g_mean = 0, gx_mean = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double g = static_cast<double>(dyr[j]) * w[j];
      g_mean += g;
      gx_mean += g * (xr[j] - mu) * rs;
    }
    g_mean /= static_cast<double>(cols);
    gx_mean /= static_cast<double>(cols);
    if (!mean) g_mean = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double g = static_cast<double>(dyr[j]) * w[j], xhat = (xr[j] - mu) * rs;
      const T v = static_cast<T>(rs * (g - g_mean - xhat * gx_mean));
      dx[t * cols + j] = dres ? static_cast<T>(v + dres[t * cols + j]) : v;
    }
  }
}

// The plain and residual forms; residual, sum, dresidual undefined: plain.
void layernorm_fwd(const char* op, const Tensor& x, const Tensor& residual, const Tensor& weight,
                   const Tensor& bias, float eps, const Tensor& sum, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd) {
  auto [rows, cols] = shape_of(x);
  const bool res = residual.defined();
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    norm_forward<T>(x.ptr<T>(), res ? residual.ptr<T>() : nullptr, res ? sum.ptr<T>() : nullptr,
                    weight.ptr<T>(), bias.data ? bias.ptr<T>() : nullptr, eps, y.ptr<T>(),
                    mean.ptr<T>(), rstd.ptr<T>(), rows, cols);
  });
}

void layernorm_bwd(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                   const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                   const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  auto [rows, cols] = shape_of(x);
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    norm_backward<T>(dy.ptr<T>(), x.ptr<T>(), weight.ptr<T>(), mean.ptr<T>(), rstd.ptr<T>(),
                     dresidual.data ? dresidual.ptr<T>() : nullptr, dx.ptr<T>(),
                     dweight.ptr<T>(), dbias.data ? dbias.ptr<T>() : nullptr, rows, cols);
  });
}

void rmsnorm_fwd(const char* op, const Tensor& x, const Tensor& residual, const Tensor& weight,
                 float eps, const Tensor& sum, const Tensor& y, const Tensor& rstd) {
  auto [rows, cols] = shape_of(x);
  const bool res = residual.defined();
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    norm_forward<T>(x.ptr<T>(), res ? residual.ptr<T>() : nullptr, res ? sum.ptr<T>() : nullptr,
                    weight.ptr<T>(), nullptr, eps, y.ptr<T>(), nullptr, rstd.ptr<T>(), rows,
                    cols);
  });
}

void rmsnorm_bwd(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                 const Tensor& rstd, const Tensor& dresidual, const Tensor& dx,
                 const Tensor& dweight) {
  auto [rows, cols] = shape_of(x);
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    norm_backward<T>(dy.ptr<T>(), x.ptr<T>(), weight.ptr<T>(), nullptr, rstd.ptr<T>(),
                     dresidual.data ? dresidual.ptr<T>() : nullptr, dx.ptr<T>(),
                     dweight.ptr<T>(), nullptr, rows, cols);
  });
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& amax) {
  layernorm_fwd("layernorm_forward", x, Tensor(), weight, bias, eps, Tensor(), y, mean, rstd);
  if (amax.data) ref::fp8_amax(y.rows(), false, amax);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  layernorm_bwd("layernorm_backward", dy, x, weight, mean, rstd, Tensor(), dx, dweight, dbias);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                     const Tensor& rstd, const Tensor& amax) {
  rmsnorm_fwd("rmsnorm_forward", x, Tensor(), weight, eps, Tensor(), y, rstd);
  if (amax.data) ref::fp8_amax(y.rows(), false, amax);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight) {
  rmsnorm_bwd("rmsnorm_backward", dy, x, weight, rstd, Tensor(), dx, dweight);
}

void layernorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, float eps, const Tensor& sum, const Tensor& y,
                                const Tensor& mean, const Tensor& rstd, const Tensor& amax) {
  const char* op = "layernorm_residual_forward";
  layernorm_fwd(op, x, residual, weight, bias, eps, sum, y, mean, rstd);
  if (amax.data) ref::fp8_amax(y.rows(), false, amax);
}

void layernorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                                 const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dx_colsum) {
  const char* op = "layernorm_residual_backward";
  layernorm_bwd(op, dy, x, weight, mean, rstd, dresidual, dx, dweight, dbias);
  if (dx_colsum.data) sum_rows(dx, dx_colsum, 1.f);
}

void rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              float eps, const Tensor& sum, const Tensor& y, const Tensor& rstd,
                              const Tensor& amax) {
  const char* op = "rmsnorm_residual_forward";
  rmsnorm_fwd(op, x, residual, weight, eps, sum, y, rstd);
  if (amax.data) ref::fp8_amax(y.rows(), false, amax);
}

void rmsnorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& rstd, const Tensor& dresidual, const Tensor& dx,
                               const Tensor& dweight, const Tensor& dx_colsum) {
  const char* op = "rmsnorm_residual_backward";
  rmsnorm_bwd(op, dy, x, weight, rstd, dresidual, dx, dweight);
  if (dx_colsum.data) sum_rows(dx, dx_colsum, 1.f);
}

}  // namespace engine::ref
