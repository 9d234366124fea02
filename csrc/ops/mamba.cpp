// The Mamba and Mamba-2 mixer ops (ops/mamba.h, ops/ssd.h): the preconditions both backends
// share, and the dispatch.
// Activations and weights share one dtype on both backends (CPU f32 or f64, CUDA bf16); where
// the backends differ (chunk_states and the parameter gradients: CPU that dtype, CUDA f32) they
// check the dtype themselves. The CPU reference also checks cu_seqlens' values (it reads them on
// the host); the CUDA launchers their kernels' limits.
#include "ops/mamba.h"

#include <utility>

#include "ops/block_checks.h"
#include "ops/ssd.h"

namespace engine::ops {
namespace {

using namespace block_checks;

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

struct SsdShape {
  int64_t tokens, heads, head_dim, groups, states;
};

// Every activation and weight in A_log's dtype; chunk_states (the backends check its dtype).
SsdShape check_ssd(const char* op, const SsdArgs& a, const Tensor& chunk_states) {
  expect_defined(a.A_log, op, "A_log");
  const DType dtype = a.A_log.dtype;
  expect_ndim(a.A_log, 1, op, "A_log");
  const int64_t h = a.A_log.size(0), t = a.x.rows(), p = a.head_dim, g = a.groups;
  ENSURE(h >= 1 && p >= 1 && g >= 1 && h % g == 0, op, ": ", h, " heads of ", p, " channels in ", g,
         " groups (heads, head_dim and groups >= 1, groups dividing heads)");
  ENSURE(a.chunk_len >= 1, op, ": chunk_len must be >= 1, got ", a.chunk_len);
  ENSURE(a.dt_min >= 0 && (a.dt_max <= 0 || a.dt_max >= a.dt_min), op, ": the delta clamp [", a.dt_min, ", ",
         a.dt_max, "] is not a range of non-negative values");
  expect_block(a.x, dtype, t, h * p, op, "x");
  expect_block(a.dt, dtype, t, h, op, "dt");
  ENSURE(a.B.width % g == 0 && a.B.width >= g, op, ": B has ", a.B.width, " columns, not ", g, " groups of states");
  const int64_t n = a.B.width / g;
  expect_block(a.B, dtype, t, g * n, op, "B");
  expect_block(a.C, dtype, t, g * n, op, "C");
  expect(a.D, dtype, {h}, op, "D");
  expect(a.dt_bias, dtype, {h}, op, "dt_bias");
  if (chunk_states.data || chunk_states.ndim() > 0) {  // (none for a step)
    check_cu_seqlens(a.cu_seqlens, op);
    expect_sized(chunk_states, {scan_num_chunks(t, a.chunk_len), h, p, n}, op, "chunk_states");
  }
  return {t, h, p, g, n};
}

void check_ssd_scan_forward(const SsdArgs& a, const ColumnBlock& y, const Tensor& chunk_states) {
  const char* op = "ssd_scan_forward";
  expect_defined(chunk_states, op, "chunk_states");
  const SsdShape s = check_ssd(op, a, chunk_states);
  expect_block(y, a.A_log.dtype, s.tokens, s.heads * s.head_dim, op, "y");
}

// dA_log, dD, ddt_bias: the backends check their dtype.
void check_ssd_scan_backward(const SsdArgs& a, const ColumnBlock& dy, const Tensor& chunk_states,
                             const SsdGrads& g) {
  const char* op = "ssd_scan_backward";
  expect_defined(chunk_states, op, "chunk_states");
  const SsdShape s = check_ssd(op, a, chunk_states);
  const DType dtype = a.A_log.dtype;
  const int64_t t = s.tokens, width = s.heads * s.head_dim, gn = s.groups * s.states;
  expect_block(dy, dtype, t, width, op, "dy");
  expect_block(g.dx, dtype, t, width, op, "dx");
  expect_block(g.ddt, dtype, t, s.heads, op, "ddt");
  expect_block(g.dB, dtype, t, gn, op, "dB");
  expect_block(g.dC, dtype, t, gn, op, "dC");
  expect_sized(g.dA_log, {s.heads}, op, "dA_log");
  expect_sized(g.dD, {s.heads}, op, "dD");
  expect_sized(g.ddt_bias, {s.heads}, op, "ddt_bias");
}

// The backends check the state's dtype.
void check_ssd_scan_step(const SsdArgs& a, const Tensor& state, const ColumnBlock& y) {
  const char* op = "ssd_scan_step";
  const SsdShape s = check_ssd(op, a, Tensor{});
  ENSURE(s.tokens == 1, op, ": one token, got ", s.tokens, " rows");
  expect_sized(state, {s.heads, s.head_dim, s.states}, op, "state");
  expect_block(y, a.A_log.dtype, 1, s.heads * s.head_dim, op, "y");
}

// y, z (T, W) in y's dtype, weight (W) where given; a row statistic (T) of any dtype (the
// backends check it). Returns (T, W).
std::pair<int64_t, int64_t> check_gated(const char* op, const ColumnBlock& y, const ColumnBlock& z,
                                        const Tensor& weight, const Tensor& stat, const char* stat_name) {
  expect_defined(y.base, op, "y");
  const DType dtype = y.base.dtype;
  const int64_t t = y.rows(), w = y.width;
  expect_block(y, dtype, t, w, op, "y");
  expect_block(z, dtype, t, w, op, "z");
  if (weight.data || weight.ndim() > 0) expect(weight, dtype, {w}, op, "weight");
  expect_sized(stat, {t}, op, stat_name);
  return {t, w};
}

void check_total_width(const char* op, int64_t width, int64_t total_width, float eps) {
  ENSURE(total_width >= width && width >= 1, op, ": total_width ", total_width, " must be at least the row's ",
         width, " columns");
  ENSURE(eps > 0, op, ": eps must be > 0, got ", eps);
}

void check_gated_rmsnorm_sumsq(const ColumnBlock& y, const ColumnBlock& z, const Tensor& sumsq) {
  check_gated("gated_rmsnorm_sumsq", y, z, Tensor{}, sumsq, "sumsq");
}

void check_gated_rmsnorm_forward(const ColumnBlock& y, const ColumnBlock& z, const Tensor& weight,
                                 const Tensor& sumsq, int64_t total_width, float eps, const ColumnBlock& out) {
  const char* op = "gated_rmsnorm_forward";
  expect_defined(weight, op, "weight");
  const auto [t, w] = check_gated(op, y, z, weight, sumsq, "sumsq");
  check_total_width(op, w, total_width, eps);
  expect_block(out, y.base.dtype, t, w, op, "out");
}

void check_gated_rmsnorm_dot(const ColumnBlock& dout, const ColumnBlock& y, const ColumnBlock& z,
                             const Tensor& weight, const Tensor& dot) {
  const char* op = "gated_rmsnorm_dot";
  expect_defined(weight, op, "weight");
  const auto [t, w] = check_gated(op, y, z, weight, dot, "dot");
  expect_block(dout, y.base.dtype, t, w, op, "dout");
}

// dweight: the backends check its dtype.
void check_gated_rmsnorm_backward(const ColumnBlock& dout, const ColumnBlock& y, const ColumnBlock& z,
                                  const Tensor& weight, const Tensor& sumsq, const Tensor& dot,
                                  int64_t total_width, float eps, const ColumnBlock& dy, const ColumnBlock& dz,
                                  const Tensor& dweight) {
  const char* op = "gated_rmsnorm_backward";
  expect_defined(weight, op, "weight");
  const auto [t, w] = check_gated(op, y, z, weight, sumsq, "sumsq");
  check_total_width(op, w, total_width, eps);
  expect_sized(dot, {t}, op, "dot");
  const DType dtype = y.base.dtype;
  expect_block(dout, dtype, t, w, op, "dout");
  expect_block(dy, dtype, t, w, op, "dy");
  expect_block(dz, dtype, t, w, op, "dz");
  expect_sized(dweight, {w}, op, "dweight");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_MAMBA_OPS)
ENGINE_DEFINE_OPS(ENGINE_SSD_OPS)

}  // namespace engine::ops
