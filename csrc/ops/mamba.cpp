// The Mamba mixer ops (ops/mamba.h): the preconditions both backends share, and the dispatch.
// Activations and weights share one dtype on both backends (CPU f32 or f64, CUDA bf16); where
// the backends differ (chunk_states and the parameter gradients: CPU that dtype, CUDA f32) they
// check the dtype themselves. The CPU reference also checks cu_seqlens' values (it reads them on
// the host); the CUDA launchers their kernels' limits.
#include "ops/mamba.h"

namespace engine::ops {
namespace {

// Defined and of shape s, any dtype.
void expect_sized(const Tensor& t, const Shape& s, const char* op, const char* name) {
  expect_defined(t, op, name);
  expect_shape(t, s, op, name);
}

// A column block of `rows` rows and `width` columns of `dtype` inside its 2-D tensor.
void expect_block(const ColumnBlock& b, DType dtype, int64_t rows, int64_t width, const char* op,
                  const char* name) {
  expect_defined(b.base, op, name);
  expect_dtype(b.base, dtype, op, name);
  ENSURE(b.base.ndim() == 2, op, ": ", name, " must be a 2-D tensor, got shape ",
         b.base.shape.str());
  ENSURE(b.rows() == rows, op, ": ", name, " has ", b.rows(), " rows, expected ", rows);
  ENSURE(b.width == width, op, ": ", name, " has ", b.width, " columns, expected ", width);
  ENSURE(b.col >= 0 && b.col + b.width <= b.ld(), op, ": ", name, " columns [", b.col, ", ",
         b.col + b.width, ") outside its tensor of ", b.ld(), " columns");
}

// cu_seqlens (S + 1) i32; its values are the backends' (the CPU reads them, the GPU does not).
void check_cu_seqlens(const Tensor& cu, const char* op) {
  expect_defined(cu, op, "cu_seqlens");
  expect_dtype(cu, DType::I32, op, "cu_seqlens");
  ENSURE(cu.ndim() == 1 && cu.numel() >= 1, op, ": cu_seqlens must be (S + 1), got shape ",
         cu.shape.str());
}

struct ConvShape {
  int64_t tokens, channels, k;
};

// x, weight, bias in x's dtype; returns (T, Di, K).
ConvShape check_conv(const char* op, const ColumnBlock& x, const Tensor& weight,
                     const Tensor& bias, const Tensor& cu_seqlens) {
  expect_defined(x.base, op, "x");
  const DType dtype = x.base.dtype;
  expect_defined(weight, op, "weight");
  expect_dtype(weight, dtype, op, "weight");
  expect_ndim(weight, 2, op, "weight");
  const int64_t di = weight.size(0), k = weight.size(1);
  ENSURE(k >= 1, op, ": kernel size must be >= 1, weight ", weight.shape.str());
  expect_block(x, dtype, x.rows(), di, op, "x");
  if (bias.data) expect(bias, dtype, {di}, op, "bias");
  check_cu_seqlens(cu_seqlens, op);
  return {x.rows(), di, k};
}

void check_causal_conv1d_forward(const ColumnBlock& x, const Tensor& weight, const Tensor& bias,
                                 const Tensor& cu_seqlens, bool, const ColumnBlock& y) {
  const char* op = "causal_conv1d_forward";
  const ConvShape s = check_conv(op, x, weight, bias, cu_seqlens);
  expect_block(y, x.base.dtype, s.tokens, s.channels, op, "y");
}

// dweight, dbias: the backends check their dtype.
void check_causal_conv1d_backward(const ColumnBlock& dy, const ColumnBlock& x,
                                  const Tensor& weight, const Tensor& bias,
                                  const Tensor& cu_seqlens, bool, const ColumnBlock& dx,
                                  const Tensor& dweight, const Tensor& dbias) {
  const char* op = "causal_conv1d_backward";
  const ConvShape s = check_conv(op, x, weight, bias, cu_seqlens);
  const DType dtype = x.base.dtype;
  expect_block(dy, dtype, s.tokens, s.channels, op, "dy");
  expect_block(dx, dtype, s.tokens, s.channels, op, "dx");
  expect_sized(dweight, {s.channels, s.k}, op, "dweight");
  ENSURE(!dbias.data || bias.data, op, ": dbias given without bias");
  if (dbias.data) expect_sized(dbias, {s.channels}, op, "dbias");
}

struct ScanShape {
  int64_t tokens, channels, states;
};

// Every activation and weight in A_log's dtype; chunk_states (the backends check its dtype).
ScanShape check_scan(const char* op, const ScanArgs& a, const Tensor& chunk_states) {
  expect_defined(a.A_log, op, "A_log");
  const DType dtype = a.A_log.dtype;
  expect_ndim(a.A_log, 2, op, "A_log");
  const int64_t di = a.A_log.size(0), n = a.A_log.size(1), t = a.x.rows();
  ENSURE(n >= 1, op, ": A_log ", a.A_log.shape.str(), " has no states");
  ENSURE(a.chunk_len >= 1, op, ": chunk_len must be >= 1, got ", a.chunk_len);
  expect_block(a.x, dtype, t, di, op, "x");
  expect(a.dt, dtype, {t, di}, op, "dt");
  expect_block(a.B, dtype, t, n, op, "B");
  expect_block(a.C, dtype, t, n, op, "C");
  expect(a.D, dtype, {di}, op, "D");
  expect(a.dt_bias, dtype, {di}, op, "dt_bias");
  expect_block(a.z, dtype, t, di, op, "z");
  check_cu_seqlens(a.cu_seqlens, op);
  expect_sized(chunk_states, {scan_num_chunks(t, a.chunk_len), n, di}, op, "chunk_states");
  return {t, di, n};
}

void check_selective_scan_forward(const ScanArgs& a, const ColumnBlock& y,
                                  const Tensor& chunk_states) {
  const char* op = "selective_scan_forward";
  const ScanShape s = check_scan(op, a, chunk_states);
  expect_block(y, a.A_log.dtype, s.tokens, s.channels, op, "y");
}

// dA_log, dD, ddt_bias: the backends check their dtype.
void check_selective_scan_backward(const ScanArgs& a, const ColumnBlock& dy,
                                   const Tensor& chunk_states, const ScanGrads& g) {
  const char* op = "selective_scan_backward";
  const ScanShape s = check_scan(op, a, chunk_states);
  const DType dtype = a.A_log.dtype;
  expect_block(dy, dtype, s.tokens, s.channels, op, "dy");
  expect_block(g.dx, dtype, s.tokens, s.channels, op, "dx");
  expect(g.ddt, dtype, {s.tokens, s.channels}, op, "ddt");
  expect_block(g.dB, dtype, s.tokens, s.states, op, "dB");
  expect_block(g.dC, dtype, s.tokens, s.states, op, "dC");
  expect_block(g.dz, dtype, s.tokens, s.channels, op, "dz");
  expect_sized(g.dA_log, {s.channels, s.states}, op, "dA_log");
  expect_sized(g.dD, {s.channels}, op, "dD");
  expect_sized(g.ddt_bias, {s.channels}, op, "ddt_bias");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_MAMBA_OPS)

}  // namespace engine::ops
