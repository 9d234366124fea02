// The Gated DeltaNet ops (ops/delta.h): the preconditions both backends share, and the dispatch.
// Activations and weights share one dtype (CPU f32 or f64); the backends check the dtype of the
// parameter gradients and of rstd. The CPU reference also checks cu_seqlens' values.
#include "ops/delta.h"

#include <utility>

#include "ops/block_checks.h"

namespace engine::ops {
namespace {

using namespace block_checks;

struct DeltaShape {
  int64_t tokens, key_heads, dk, value_heads, dv;
};

DeltaShape check_delta(const char* op, const DeltaArgs& a) {
  expect_defined(a.A_log, op, "A_log");
  const DType dtype = a.A_log.dtype;
  expect_ndim(a.A_log, 1, op, "A_log");
  const int64_t hv = a.A_log.size(0), hk = a.key_heads, t = a.q.rows();
  ENSURE(hk >= 1 && hv >= 1 && hv % hk == 0, op, ": ", hv, " value heads over ", hk,
         " key heads (both >= 1, the value heads a multiple of the key heads)");
  ENSURE(a.q.width % hk == 0 && a.q.width >= hk, op, ": q has ", a.q.width, " columns, not ", hk, " key heads");
  ENSURE(a.v.width % hv == 0 && a.v.width >= hv, op, ": v has ", a.v.width, " columns, not ", hv, " value heads");
  const int64_t dk = a.q.width / hk, dv = a.v.width / hv;
  expect_block(a.q, dtype, t, hk * dk, op, "q");
  expect_block(a.k, dtype, t, hk * dk, op, "k");
  expect_block(a.v, dtype, t, hv * dv, op, "v");
  expect_block(a.a, dtype, t, hv, op, "a");
  expect_block(a.b, dtype, t, hv, op, "b");
  expect(a.dt_bias, dtype, {hv}, op, "dt_bias");
  if (a.cu_seqlens.data || a.cu_seqlens.ndim() > 0) check_cu_seqlens(a.cu_seqlens, op);  // (none for a step)
  return {t, hk, dk, hv, dv};
}

// The backends check the state's dtype.
void check_gated_delta_step(const DeltaArgs& a, const Tensor& state, const ColumnBlock& o) {
  const char* op = "gated_delta_step";
  const DeltaShape s = check_delta(op, a);
  ENSURE(s.tokens == 1, op, ": one token, got ", s.tokens, " rows");
  expect_sized(state, {s.value_heads, s.dk, s.dv}, op, "state");
  expect_block(o, a.A_log.dtype, 1, s.value_heads * s.dv, op, "o");
}

void check_gated_delta_forward(const DeltaArgs& a, const ColumnBlock& o) {
  const char* op = "gated_delta_forward";
  check_cu_seqlens(a.cu_seqlens, op);
  const DeltaShape s = check_delta(op, a);
  expect_block(o, a.A_log.dtype, s.tokens, s.value_heads * s.dv, op, "o");
}

// dA_log, ddt_bias: the backends check their dtype.
void check_gated_delta_backward(const DeltaArgs& a, const ColumnBlock& do_, const DeltaGrads& g) {
  const char* op = "gated_delta_backward";
  check_cu_seqlens(a.cu_seqlens, op);
  const DeltaShape s = check_delta(op, a);
  const DType dtype = a.A_log.dtype;
  expect_block(do_, dtype, s.tokens, s.value_heads * s.dv, op, "do");
  expect_block(g.dq, dtype, s.tokens, s.key_heads * s.dk, op, "dq");
  expect_block(g.dk, dtype, s.tokens, s.key_heads * s.dk, op, "dk");
  expect_block(g.dv, dtype, s.tokens, s.value_heads * s.dv, op, "dv");
  expect_block(g.da, dtype, s.tokens, s.value_heads, op, "da");
  expect_block(g.db, dtype, s.tokens, s.value_heads, op, "db");
  expect_sized(g.dA_log, {s.value_heads}, op, "dA_log");
  expect_sized(g.ddt_bias, {s.value_heads}, op, "ddt_bias");
}

// y, z (T, heads x head_dim) and weight (head_dim) in y's dtype, rstd (T, heads) of any dtype.
// Returns (T, heads).
std::pair<int64_t, int64_t> check_head_norm(const char* op, const ColumnBlock& y, const ColumnBlock& z,
                                            const Tensor& weight, const Tensor& rstd, float eps) {
  expect_defined(y.base, op, "y");
  expect_defined(weight, op, "weight");
  const DType dtype = y.base.dtype;
  expect_ndim(weight, 1, op, "weight");
  const int64_t d = weight.size(0), t = y.rows();
  ENSURE(d >= 1 && y.width % d == 0 && y.width >= d, op, ": y has ", y.width, " columns, not whole heads of ", d);
  ENSURE(eps > 0, op, ": eps must be > 0, got ", eps);
  const int64_t heads = y.width / d;
  expect_block(y, dtype, t, heads * d, op, "y");
  expect_block(z, dtype, t, heads * d, op, "z");
  expect(weight, dtype, {d}, op, "weight");
  expect_sized(rstd, {t, heads}, op, "rstd");
  return {t, heads};
}

void check_head_rmsnorm_gated_forward(const ColumnBlock& y, const ColumnBlock& z, const Tensor& weight, float eps,
                                      const ColumnBlock& out, const Tensor& rstd) {
  const char* op = "head_rmsnorm_gated_forward";
  check_head_norm(op, y, z, weight, rstd, eps);
  expect_block(out, y.base.dtype, y.rows(), y.width, op, "out");
}

// dweight: the backends check its dtype.
void check_head_rmsnorm_gated_backward(const ColumnBlock& dout, const ColumnBlock& y, const ColumnBlock& z,
                                       const Tensor& weight, const Tensor& rstd, const ColumnBlock& dy,
                                       const ColumnBlock& dz, const Tensor& dweight) {
  const char* op = "head_rmsnorm_gated_backward";
  check_head_norm(op, y, z, weight, rstd, 1.f);
  const DType dtype = y.base.dtype;
  expect_block(dout, dtype, y.rows(), y.width, op, "dout");
  expect_block(dy, dtype, y.rows(), y.width, op, "dy");
  expect_block(dz, dtype, y.rows(), y.width, op, "dz");
  expect_sized(dweight, weight.shape, op, "dweight");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_DELTA_OPS)

}  // namespace engine::ops
