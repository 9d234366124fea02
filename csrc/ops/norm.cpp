// The norm ops (ops/norm.h): the preconditions both backends share, and the dispatch.
#include "ops/norm.h"

namespace engine::ops {
namespace {

// Statistics and parameter gradients: f64 when x is f64, else f32.
DType stat_dtype(const Tensor& x) { return x.dtype == DType::F64 ? DType::F64 : DType::F32; }

// x (T, C), C >= 1. The backends check the dtypes of x they take.
void check_x(const Tensor& x, const char* op) {
  expect_defined(x, op, "x");
  expect_ndim(x, 2, op, "x");
  ENSURE(x.size(1) > 0, op, ": x has shape ", x.shape.str(), ", normalising needs columns");
}

// residual / sum / mean: nullptr for the forms without them.
void check_forward(const char* op, const Tensor& x, const Tensor* residual, const Tensor& weight,
                   const Tensor* bias, float eps, const Tensor* sum, const Tensor& y,
                   const Tensor* mean, const Tensor& rstd) {
  check_x(x, op);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (residual) {
    ENSURE(residual->defined() && sum->defined(), op, ": residual and sum must be given");
    expect(*residual, x.dtype, x.shape, op, "residual");
    expect(*sum, x.dtype, x.shape, op, "sum");
    ENSURE(y.data != sum->data || rows == 0, op, ": y must not alias sum");
  }
  expect(weight, x.dtype, {cols}, op, "weight");
  if (bias && bias->data) expect(*bias, x.dtype, {cols}, op, "bias");
  expect(y, x.dtype, x.shape, op, "y");
  if (mean) expect(*mean, stat_dtype(x), {rows}, op, "mean");
  expect(rstd, stat_dtype(x), {rows}, op, "rstd");
  ENSURE(eps >= 0.f, op, ": eps must be >= 0, got ", eps);
}

// dresidual / mean / dbias / dx_colsum: nullptr for the forms without them.
void check_backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                    const Tensor* mean, const Tensor& rstd, const Tensor* dresidual,
                    const Tensor& dx, const Tensor& dweight, const Tensor* dbias,
                    const Tensor* dx_colsum) {
  check_x(x, op);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (dresidual) {
    ENSURE(dresidual->defined(), op, ": dresidual must be given");
    expect(*dresidual, x.dtype, x.shape, op, "dresidual");
  }
  expect(dy, x.dtype, x.shape, op, "dy");
  expect(weight, x.dtype, {cols}, op, "weight");
  if (mean) expect(*mean, stat_dtype(x), {rows}, op, "mean");
  expect(rstd, stat_dtype(x), {rows}, op, "rstd");
  expect(dx, x.dtype, x.shape, op, "dx");
  expect(dweight, stat_dtype(x), {cols}, op, "dweight");
  if (dbias && dbias->data) expect(*dbias, stat_dtype(x), {cols}, op, "dbias");
  if (dx_colsum && dx_colsum->data) expect(*dx_colsum, stat_dtype(x), {cols}, op, "dx_colsum");
}

// The forwards' optional amax of y: undefined or one f32 element.
void check_amax(const Tensor& amax, const char* op) {
  if (amax.data) expect(amax, DType::F32, {1}, op, "amax");
}

void check_layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& amax) {
  check_forward("layernorm_forward", x, nullptr, weight, &bias, eps, nullptr, y, &mean, rstd);
  check_amax(amax, "layernorm_forward");
}

void check_rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                           const Tensor& rstd, const Tensor& amax) {
  check_forward("rmsnorm_forward", x, nullptr, weight, nullptr, eps, nullptr, y, nullptr, rstd);
  check_amax(amax, "rmsnorm_forward");
}

void check_layernorm_residual_forward(const Tensor& x, const Tensor& residual,
                                      const Tensor& weight, const Tensor& bias, float eps,
                                      const Tensor& sum, const Tensor& y, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& amax) {
  check_forward("layernorm_residual_forward", x, &residual, weight, &bias, eps, &sum, y, &mean,
                rstd);
  check_amax(amax, "layernorm_residual_forward");
}

void check_rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                    float eps, const Tensor& sum, const Tensor& y,
                                    const Tensor& rstd, const Tensor& amax) {
  check_forward("rmsnorm_residual_forward", x, &residual, weight, nullptr, eps, &sum, y, nullptr,
                rstd);
  check_amax(amax, "rmsnorm_residual_forward");
}

void check_layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                              const Tensor& dweight, const Tensor& dbias) {
  check_backward("layernorm_backward", dy, x, weight, &mean, rstd, nullptr, dx, dweight, &dbias,
                 nullptr);
}

void check_rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& rstd, const Tensor& dx, const Tensor& dweight) {
  check_backward("rmsnorm_backward", dy, x, weight, nullptr, rstd, nullptr, dx, dweight, nullptr,
                 nullptr);
}

void check_layernorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                       const Tensor& mean, const Tensor& rstd,
                                       const Tensor& dresidual, const Tensor& dx,
                                       const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dx_colsum) {
  check_backward("layernorm_residual_backward", dy, x, weight, &mean, rstd, &dresidual, dx,
                 dweight, &dbias, &dx_colsum);
}

void check_rmsnorm_residual_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                     const Tensor& rstd, const Tensor& dresidual, const Tensor& dx,
                                     const Tensor& dweight, const Tensor& dx_colsum) {
  check_backward("rmsnorm_residual_backward", dy, x, weight, nullptr, rstd, &dresidual, dx,
                 dweight, nullptr, &dx_colsum);
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_NORM_OPS)

}  // namespace engine::ops
