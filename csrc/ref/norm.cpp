// Layer norms over the last dimension of x (T, C), computed row by row in double.
//   layernorm: xhat = (x - mean) * rstd,  y = xhat * w + b
//              dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w
//   rmsnorm:   xhat = x * rstd,           y = xhat * w
//              dx = rstd * (g - xhat * mean(g * xhat))
//   dweight += sum_t dy * xhat,  dbias += sum_t dy
// Rows run in parallel for y and dx; parameter gradients run in parallel over column chunks,
// each summing the rows in order, so every result is independent of the thread count.
#include "ref/norm.h"

#include <algorithm>
#include <cmath>

#include "ref/common.h"

namespace engine::ref {
namespace {

constexpr int64_t kCols = 256;  // column chunk of the parameter-gradient sums

struct NormShape {
  int64_t rows, cols;
};

NormShape check_x(const Tensor& x, const char* op) {
  expect_cpu(x, op, "x");
  expect_ndim(x, 2, op, "x");
  ENSURE(x.size(1) > 0, op, ": x has shape ", x.shape.str(), ", normalising needs columns");
  return {x.size(0), x.size(1)};
}

template <typename T>
void norm_forward(const T* x, const T* w, const T* b, double eps, T* y, T* mean, T* rstd,
                  int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (int64_t t = 0; t < rows; ++t) {
    const T* xr = x + t * cols;
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

// mean == nullptr selects rmsnorm (mean 0); dbias may be null.
template <typename T>
void norm_backward(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx,
                   T* dw, T* db, int64_t rows, int64_t cols) {
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
      dx[t * cols + j] = static_cast<T>(rs * (g - g_mean - xhat * gx_mean));
    }
  }
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_forward";
  auto [rows, cols] = check_x(x, op);
  expect(weight, x.dtype, {cols}, op, "weight");
  if (bias.data) expect(bias, x.dtype, {cols}, op, "bias");
  expect(y, x.dtype, x.shape, op, "y");
  expect(mean, x.dtype, {rows}, op, "mean");
  expect(rstd, x.dtype, {rows}, op, "rstd");
  ENSURE(eps >= 0.f, op, ": eps must be >= 0, got ", eps);
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    norm_forward<T>(x.ptr<T>(), weight.ptr<T>(), bias.data ? bias.ptr<T>() : nullptr, eps, y.ptr<T>(), mean.ptr<T>(),
                    rstd.ptr<T>(), rows, cols);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  const char* op = "layernorm_backward";
  auto [rows, cols] = check_x(x, op);
  expect(dy, x.dtype, x.shape, op, "dy");
  expect(weight, x.dtype, {cols}, op, "weight");
  expect(mean, x.dtype, {rows}, op, "mean");
  expect(rstd, x.dtype, {rows}, op, "rstd");
  expect(dx, x.dtype, x.shape, op, "dx");
  expect(dweight, x.dtype, {cols}, op, "dweight");
  if (dbias.data) expect(dbias, x.dtype, {cols}, op, "dbias");
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    norm_backward<T>(dy.ptr<T>(), x.ptr<T>(), weight.ptr<T>(), mean.ptr<T>(), rstd.ptr<T>(),
                     dx.ptr<T>(), dweight.ptr<T>(),
                     dbias.data ? dbias.ptr<T>() : nullptr, rows, cols);
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                     const Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  auto [rows, cols] = check_x(x, op);
  expect(weight, x.dtype, {cols}, op, "weight");
  expect(y, x.dtype, x.shape, op, "y");
  expect(rstd, x.dtype, {rows}, op, "rstd");
  ENSURE(eps >= 0.f, op, ": eps must be >= 0, got ", eps);
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    norm_forward<T>(x.ptr<T>(), weight.ptr<T>(), nullptr, eps, y.ptr<T>(), nullptr, rstd.ptr<T>(),
                    rows, cols);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight) {
  const char* op = "rmsnorm_backward";
  auto [rows, cols] = check_x(x, op);
  expect(dy, x.dtype, x.shape, op, "dy");
  expect(weight, x.dtype, {cols}, op, "weight");
  expect(rstd, x.dtype, {rows}, op, "rstd");
  expect(dx, x.dtype, x.shape, op, "dx");
  expect(dweight, x.dtype, {cols}, op, "dweight");
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    norm_backward<T>(dy.ptr<T>(), x.ptr<T>(), weight.ptr<T>(), nullptr, rstd.ptr<T>(),
                     dx.ptr<T>(), dweight.ptr<T>(), nullptr, rows, cols);
  });
}

}  // namespace engine::ref
