// The FP8 ops (ops/fp8.h): the preconditions both backends share, and the dispatch. The backends
// check the dtypes of x and c they take and, on the GPU, the product's alignment rules.
#include "ops/fp8.h"

namespace engine::ops {
namespace {

// op(x)'s rows: x's, or its columns with transpose. x must be 2-D.
int64_t out_rows(const Tensor& x, bool transpose) { return transpose ? x.size(1) : x.size(0); }

// A scale vector (amax, scale_inv) of one element (per tensor) or one a row.
void expect_scales(const Tensor& t, int64_t rows, const char* op, const char* name) {
  expect_defined(t, op, name);
  expect_dtype(t, DType::F32, op, name);
  ENSURE(t.ndim() == 1 && (t.size(0) == 1 || t.size(0) == rows), op, ": ", name, " has shape ",
         t.shape.str(), ", expected (1) (per tensor) or (", rows, ") (one a row)");
}

void check_fp8_amax(const Tensor& x, bool transpose, const Tensor& amax) {
  expect_defined(x, "fp8_amax", "x");
  expect_ndim(x, 2, "fp8_amax", "x");
  expect_scales(amax, out_rows(x, transpose), "fp8_amax", "amax");
}

void check_fp8_quantize(const Tensor& x, bool transpose, const Tensor& amax, Fp8Format format,
                        const Tensor& out, const Tensor& scale_inv) {
  expect_defined(x, "fp8_quantize", "x");
  expect_ndim(x, 2, "fp8_quantize", "x");
  const int64_t rows = out_rows(x, transpose), cols = transpose ? x.size(0) : x.size(1);
  expect(out, DType::U8, {rows, cols}, "fp8_quantize", "out");
  expect_scales(amax, rows, "fp8_quantize", "amax");
  expect(scale_inv, DType::F32, amax.shape, "fp8_quantize", "scale_inv");
  ENSURE(scale_inv.data != amax.data, "fp8_quantize: scale_inv must not alias amax");
  ENSURE(format == Fp8Format::E4M3 || format == Fp8Format::E5M2, "fp8_quantize: unknown format");
}

void check_fp8_matmul(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                      Fp8Format b_format, const Tensor& b_scale_inv, const Tensor& c, const Fp8MatmulOptions& o) {
  expect_defined(a, "fp8_matmul", "a");
  expect_dtype(a, DType::U8, "fp8_matmul", "a");
  expect_ndim(a, 2, "fp8_matmul", "a");
  expect_defined(b, "fp8_matmul", "b");
  expect_dtype(b, DType::U8, "fp8_matmul", "b");
  expect_ndim(b, 2, "fp8_matmul", "b");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  ENSURE(b.size(1) == k, "fp8_matmul: a is ", a.shape.str(), " and b is ", b.shape.str(),
         "; both (rows, K) with the same K");
  expect_defined(c, "fp8_matmul", "c");
  expect_shape(c, {m, n}, "fp8_matmul", "c");
  expect_scales(a_scale_inv, m, "fp8_matmul", "a_scale_inv");
  expect_scales(b_scale_inv, n, "fp8_matmul", "b_scale_inv");
  ENSURE((a_scale_inv.size(0) == 1) == (b_scale_inv.size(0) == 1) || (m == 1 || n == 1),
         "fp8_matmul: a_scale_inv ", a_scale_inv.shape.str(), " and b_scale_inv ", b_scale_inv.shape.str(),
         " mix per-tensor and per-row scales; both must be one or the other");
  ENSURE(!(a_format == Fp8Format::E5M2 && b_format == Fp8Format::E5M2),
         "fp8_matmul: e5m2 x e5m2 is not a product the tensor cores take (one side must be e4m3)");
  ENSURE(o.beta == 0.f || o.beta == 1.f, "fp8_matmul: beta must be 0 or 1, got ", o.beta);
  if (o.addend.data) {
    ENSURE(o.beta == 1.f, "fp8_matmul: an addend is read with beta = 1, got beta ", o.beta);
    expect(o.addend, c.dtype, c.shape, "fp8_matmul", "addend");
    ENSURE(o.addend.data == c.data || static_cast<const char*>(o.addend.data) + o.addend.nbytes() <= c.data ||
               static_cast<const char*>(c.data) + c.nbytes() <= o.addend.data,
           "fp8_matmul: the addend must be c itself or not overlap it");
  }
  if (o.bias.data) expect(o.bias, c.dtype, {n}, "fp8_matmul", "bias");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_FP8_OPS)

}  // namespace engine::ops
