// The query/key norm ops (ops/qk_norm.h): the preconditions both backends share, and the
// dispatch. The backends check the dtypes of x they take and their size limits.
#include "ops/qk_norm.h"

namespace engine::ops {
namespace {

DType stat_dtype(const Tensor& x) { return x.dtype == DType::F64 ? DType::F64 : DType::F32; }

// x (named xname) (T, NH, D), D >= 1; rstd (T, H) with q_heads <= H <= NH; input (T, H, D) of
// x's dtype; weight (2, D) of x's dtype.
void check_qk_norm(const char* op, const char* xname, const Tensor& x, const Tensor& weight, int q_heads,
                   const Tensor& input, const Tensor& rstd) {
  expect_defined(x, op, xname);
  expect_ndim(x, 3, op, xname);
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2);
  ENSURE(d > 0, op, ": ", xname, " has shape ", x.shape.str(), ", normalising needs a head dimension");
  expect_defined(rstd, op, "rstd");
  expect_ndim(rstd, 2, op, "rstd");
  const int64_t normed = rstd.size(1);
  ENSURE(q_heads >= 0 && q_heads <= normed && normed <= heads, op, ": q_heads = ", q_heads, " and rstd ",
         rstd.shape.str(), " (q + k heads) do not fit ", xname, " ", x.shape.str());
  expect(rstd, stat_dtype(x), {rows, normed}, op, "rstd");
  expect(input, x.dtype, {rows, normed, d}, op, "input");
  expect(weight, x.dtype, {2, d}, op, "weight");
  ENSURE(input.data != x.data || input.numel() == 0, op, ": input must not alias ", xname);
}

void check_qk_norm_forward(const Tensor& x, const Tensor& weight, int q_heads, float eps, const Tensor& input,
                           const Tensor& rstd) {
  check_qk_norm("qk_norm_forward", "x", x, weight, q_heads, input, rstd);
  ENSURE(eps >= 0.f, "qk_norm_forward: eps must be >= 0, got ", eps);
}

void check_qk_norm_backward(const Tensor& dx, const Tensor& input, const Tensor& weight, int q_heads,
                            const Tensor& rstd, const Tensor& dweight) {
  check_qk_norm("qk_norm_backward", "dx", dx, weight, q_heads, input, rstd);
  expect(dweight, stat_dtype(dx), {2, dx.size(2)}, "qk_norm_backward", "dweight");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_QK_NORM_OPS)

}  // namespace engine::ops
