// The one-token decode ops (ops/decode.h): the preconditions both backends share, and the
// dispatch. The backends check the dtypes they take (the scan state: CPU the tensors' dtype,
// CUDA f32) and their kernels' size limits.
#include "ops/decode.h"

namespace engine::ops {
namespace {

// A block of one row and `width` columns of `dtype` inside its 2-D tensor.
void expect_row_block(const ColumnBlock& b, DType dtype, int64_t width, const char* op, const char* name) {
  expect_defined(b.base, op, name);
  expect_dtype(b.base, dtype, op, name);
  ENSURE(b.base.ndim() == 2 && b.rows() == 1, op, ": ", name, " must be one row of a 2-D tensor, got shape ",
         b.base.shape.str());
  ENSURE(b.width == width, op, ": ", name, " has ", b.width, " columns, expected ", width);
  ENSURE(b.col >= 0 && b.col + b.width <= b.ld(), op, ": ", name, " columns [", b.col, ", ", b.col + b.width,
         ") outside its tensor of ", b.ld(), " columns");
}

void check_attention_decode(const DecodeAttentionParams& p) {
  const char* op = "attention_decode";
  ENSURE(p.num_heads > 0 && p.num_kv_heads > 0 && p.head_dim > 0 && p.num_heads % p.num_kv_heads == 0, op,
         ": num_heads ", p.num_heads, " must be a positive multiple of num_kv_heads ", p.num_kv_heads,
         ", head_dim ", p.head_dim, " positive");
  ENSURE(p.window >= 0, op, ": window must be >= 0, got ", p.window);
  ENSURE(p.softmax_scale > 0.f, op, ": softmax_scale must be > 0, got ", p.softmax_scale);
  const int64_t H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  expect_defined(p.qkv, op, "qkv");
  const DType dtype = p.qkv.dtype;
  expect(p.qkv, dtype, {1, H + 2 * Hkv, D}, op, "qkv");
  expect_defined(p.cache, op, "cache");
  expect_dtype(p.cache, dtype, op, "cache");
  expect_ndim(p.cache, 3, op, "cache");
  ENSURE(p.cache.size(0) >= 1 && p.cache.size(1) == 2 * Hkv && p.cache.size(2) == D, op, ": cache must be (L >= 1, ",
         2 * Hkv, ", ", D, "), got ", p.cache.shape.str());
  expect(p.out, dtype, {1, H, D}, op, "out");
}

void check_causal_conv1d_step(const ColumnBlock& x, const Tensor& state, const Tensor& weight, const Tensor& bias,
                              bool, const ColumnBlock& y) {
  const char* op = "causal_conv1d_step";
  expect_defined(weight, op, "weight");
  expect_ndim(weight, 2, op, "weight");
  const DType dtype = weight.dtype;
  const int64_t di = weight.size(0), k = weight.size(1);
  ENSURE(k >= 1, op, ": kernel size must be >= 1, weight ", weight.shape.str());
  expect_row_block(x, dtype, di, op, "x");
  expect_row_block(y, dtype, di, op, "y");
  if (bias.data) expect(bias, dtype, {di}, op, "bias");
  if (k > 1) expect(state, dtype, {k - 1, di}, op, "state");
}

void check_selective_scan_step(const ScanArgs& a, const Tensor& state, const ColumnBlock& y) {
  const char* op = "selective_scan_step";
  expect_defined(a.A_log, op, "A_log");
  expect_ndim(a.A_log, 2, op, "A_log");
  const DType dtype = a.A_log.dtype;
  const int64_t di = a.A_log.size(0), n = a.A_log.size(1);
  expect_row_block(a.x, dtype, di, op, "x");
  expect(a.dt, dtype, {1, di}, op, "dt");
  expect_row_block(a.B, dtype, n, op, "B");
  expect_row_block(a.C, dtype, n, op, "C");
  expect(a.D, dtype, {di}, op, "D");
  expect(a.dt_bias, dtype, {di}, op, "dt_bias");
  expect_row_block(a.z, dtype, di, op, "z");
  expect_row_block(y, dtype, di, op, "y");
  expect_defined(state, op, "state");
  expect_shape(state, {di, n}, op, "state");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_DECODE_OPS)

}  // namespace engine::ops
