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

// One quantised layout: out = op(x) in FP8, its amax and inverse scales (names as the op calls them).
struct QuantizeArgs {
  const Tensor &amax, &out, &scale_inv;
  const char *amax_name, *out_name, *scale_inv_name;
};
void check_quantized(const char* op, const Tensor& x, bool transpose, const QuantizeArgs& q) {
  expect_defined(x, op, "x");
  expect_ndim(x, 2, op, "x");
  const int64_t rows = out_rows(x, transpose), cols = transpose ? x.size(0) : x.size(1);
  expect(q.out, DType::U8, {rows, cols}, op, q.out_name);
  expect_scales(q.amax, rows, op, q.amax_name);
  expect(q.scale_inv, DType::F32, q.amax.shape, op, q.scale_inv_name);
  ENSURE(q.scale_inv.data != q.amax.data, op, ": ", q.scale_inv_name, " must not alias ", q.amax_name);
}

void check_fp8_quantize(const Tensor& x, bool transpose, const Tensor& amax, Fp8Format format,
                        const Tensor& out, const Tensor& scale_inv) {
  check_quantized("fp8_quantize", x, transpose, {amax, out, scale_inv, "amax", "out", "scale_inv"});
  ENSURE(format == Fp8Format::E4M3 || format == Fp8Format::E5M2, "fp8_quantize: unknown format");
}

void check_fp8_quantize_pair(const Tensor& x, const Tensor& amax, const Tensor& amax_t, Fp8Format format,
                             const Tensor& out, const Tensor& scale_inv, const Tensor& out_t,
                             const Tensor& scale_inv_t) {
  const char* op = "fp8_quantize_pair";
  check_quantized(op, x, false, {amax, out, scale_inv, "amax", "out", "scale_inv"});
  check_quantized(op, x, true, {amax_t, out_t, scale_inv_t, "amax_t", "out_t", "scale_inv_t"});
  ENSURE(scale_inv.data != amax_t.data && scale_inv_t.data != amax.data && scale_inv.data != scale_inv_t.data,
         op, ": the inverse scales must not alias each other or an amax");
  ENSURE(format == Fp8Format::E4M3 || format == Fp8Format::E5M2, op, ": unknown format");
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
