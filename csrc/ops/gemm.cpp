// The GEMM ops (ops/gemm.h): the preconditions both backends share, and the dispatch. The
// backends check the dtypes they take (the CPU one dtype for all, the GPU bf16 inputs).
#include "ops/gemm.h"

namespace engine::ops {
namespace {

void check_matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  const MatmulOptions& options) {
  const char* op = "matmul";
  expect_defined(a, op, "a");
  expect_defined(b, op, "b");
  expect_defined(c, op, "c");
  expect_ndim(a, 2, op, "a");
  expect_ndim(b, 2, op, "b");
  expect_ndim(c, 2, op, "c");
  const int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0), n = trans_b ? b.size(0) : b.size(1);
  ENSURE(k == kb, op, ": inner dimensions differ: op(a) is (", m, ", ", k, "), op(b) is (", kb,
         ", ", n, ") [trans_a=", trans_a, ", trans_b=", trans_b, "]");
  expect_shape(c, {m, n}, op, "c");
  const bool has_bias = options.bias.data != nullptr;
  if (has_bias) expect_shape(options.bias, {n}, op, "bias");
  const bool gelu_in = options.gelu_input.data != nullptr;
  const bool dgelu = options.dgelu_input.data != nullptr;
  if (gelu_in) {
    ENSURE(options.gelu, op, ": gelu_input is set but gelu is false");
    expect(options.gelu_input, c.dtype, c.shape, op, "gelu_input");
    ENSURE(options.gelu_input.data != c.data, op, ": gelu_input must not alias c");
  }
  if (dgelu) {
    expect(options.dgelu_input, c.dtype, c.shape, op, "dgelu_input");
    ENSURE(options.dgelu_input.data != c.data, op, ": dgelu_input must not alias c");
    ENSURE(!has_bias && !options.gelu && options.beta == 0.f, op,
           ": dgelu_input needs beta == 0 and no bias or gelu");
  }
  if (options.dbias.data) {
    ENSURE(dgelu, op, ": dbias is the bias gradient of the GELU backward: it needs dgelu_input");
    expect_shape(options.dbias, {n}, op, "dbias");
  }
  // The addend: c itself, or c's dtype and shape without overlapping c.
  if (const Tensor& r = options.addend; r.data && r.data != c.data) {
    ENSURE(r.dtype == c.dtype && r.shape == c.shape, op, ": addend is ", dtype_name(r.dtype), " ",
           r.shape.str(), ", expected c's ", dtype_name(c.dtype), " ", c.shape.str());
    const auto* rb = static_cast<const char*>(r.data);
    const auto* cb = static_cast<const char*>(c.data);
    ENSURE(rb + r.nbytes() <= cb || cb + c.nbytes() <= rb, op,
           ": addend overlaps c without being c");
  }
}

void check_sum_rows(const Tensor& x, const Tensor& out, float beta) {
  const char* op = "sum_rows";
  expect_defined(x, op, "x");
  expect_ndim(x, 2, op, "x");
  expect_defined(out, op, "out");
  expect_shape(out, {x.size(1)}, op, "out");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_GEMM_OPS)

}  // namespace engine::ops
