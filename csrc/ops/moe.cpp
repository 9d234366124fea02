// The mixture-of-experts ops (ops/moe.h): the preconditions both backends share, and the dispatch.
// The backends check the dtypes they take where the two differ (the CUDA ops' f32 routing tensors
// and bf16 GEMM operands), and the CPU reference the index values it reads on the host (expert
// ids, rows, offsets, counts in range) before it writes anything.
#include "ops/moe.h"

namespace engine::ops {

GroupedWeight grouped_weight(const Tensor& w, const char* op) {
  GroupedWeight g;
  if (w.ndim() == 3) {
    g = {w.size(0), w.size(1), w.size(2), 1};
  } else {
    ENSURE(w.ndim() == 4, op, ": w has shape ", w.shape.str(),
           ", expected (E, N, K) or (S, E, N / S, K)");
    g = {w.size(1), w.size(0) * w.size(2), w.size(3), w.size(0)};
    ENSURE(g.stacks >= 1, op, ": w has shape ", w.shape.str(), ": no stacks");
  }
  ENSURE(g.experts >= 1 && g.experts <= kMoeMaxExperts, op, ": ", g.experts,
         " experts outside [1, ", kMoeMaxExperts, "]");
  return g;
}

namespace {

// Defined and of shape s, any dtype (where the backends take different dtypes).
void expect_sized(const Tensor& t, const Shape& s, const char* op, const char* name) {
  expect_defined(t, op, name);
  expect_shape(t, s, op, name);
}

void check_experts(int64_t e, const char* op) {
  ENSURE(e >= 1 && e <= kMoeMaxExperts, op, ": ", e, " experts outside [1, ", kMoeMaxExperts,
         "]");
}

// expert_idx or row_of: (T, k) i32 with 1 <= k <= kMoeMaxTopK; returns k.
int64_t check_idx_shape(const Tensor& idx, int64_t tokens, const char* op, const char* name) {
  expect_defined(idx, op, name);
  expect_dtype(idx, DType::I32, op, name);
  expect_ndim(idx, 2, op, name);
  ENSURE(idx.size(0) == tokens, op, ": ", name, " has shape ", idx.shape.str(), ", expected ",
         tokens, " rows");
  const int64_t k = idx.size(1);
  ENSURE(k >= 1 && k <= kMoeMaxTopK, op, ": top_k = ", k, " outside [1, ", kMoeMaxTopK, "]");
  return k;
}

// counts (E) i32 with E in [1, kMoeMaxExperts]; returns E.
int64_t check_counts(const Tensor& counts, const char* op) {
  expect_defined(counts, op, "counts");
  expect_dtype(counts, DType::I32, op, "counts");
  expect_ndim(counts, 1, op, "counts");
  const int64_t e = counts.size(0);
  check_experts(e, op);
  return e;
}

// probs (T, E) for E experts; returns T.
int64_t check_probs(const Tensor& probs, int64_t experts, const char* op) {
  expect_defined(probs, op, "probs");
  expect_ndim(probs, 2, op, "probs");
  const int64_t T = probs.size(0);
  expect_shape(probs, {T, experts}, op, "probs");
  return T;
}

// A (T, C) row tensor `rows` and an (R, C) permuted buffer `perm` of its dtype; returns C.
int64_t check_perm(const Tensor& perm, const char* perm_name, const Tensor& rows, const char* op) {
  const int64_t C = rows.size(1);
  expect_defined(perm, op, perm_name);
  expect_dtype(perm, rows.dtype, op, perm_name);
  expect_ndim(perm, 2, op, perm_name);
  ENSURE(perm.size(1) == C, op, ": ", perm_name, " has shape ", perm.shape.str(), ", expected ",
         C, " columns");
  return C;
}

// The shapes of a grouped product, in this order: the weight `w` (or its gradient) in the grouped
// layout; `lead`, the (R, ...) operand that gives R, of lead_cols columns (GroupedWeight::k when
// lead_is_k, else ::n); `other` of the other count, with `lead`'s dtype; the experts' row ranges
// offsets (E + 1), counts (E) i32. same_dtype: `lead` has w's dtype too (not so for the CUDA
// weight gradient: dw f32, dy and x bf16).
void check_grouped(const char* op, const Tensor& w, const char* w_name, const Tensor& lead,
                   const char* lead_name, bool lead_is_k, const Tensor& other,
                   const char* other_name, const Tensor& offsets, const Tensor& counts,
                   bool same_dtype) {
  expect_defined(w, op, w_name);
  const GroupedWeight g = grouped_weight(w, op);
  expect_defined(lead, op, lead_name);
  expect_ndim(lead, 2, op, lead_name);
  const int64_t R = lead.size(0);
  if (same_dtype) expect_dtype(lead, w.dtype, op, lead_name);
  expect_shape(lead, {R, lead_is_k ? g.k : g.n}, op, lead_name);
  expect(other, lead.dtype, {R, lead_is_k ? g.n : g.k}, op, other_name);
  expect(offsets, DType::I32, {g.experts + 1}, op, "offsets");
  expect(counts, DType::I32, {g.experts}, op, "counts");
}

// ---- Routing: one dtype for every float tensor but dlogits (CUDA: f32, dlogits bf16 or f32).

void check_moe_route_forward(const Tensor& logits, const Tensor& probs, const Tensor& lse,
                             const Tensor& expert_idx, const Tensor& weights, bool) {
  const char* op = "moe_route_forward";
  expect_defined(logits, op, "logits");
  expect_ndim(logits, 2, op, "logits");
  const int64_t T = logits.size(0), E = logits.size(1);
  check_experts(E, op);
  const int64_t k = check_idx_shape(expert_idx, T, op, "expert_idx");
  ENSURE(k <= E, op, ": top_k = ", k, " > ", E, " experts");
  expect(probs, logits.dtype, logits.shape, op, "probs");
  expect(lse, logits.dtype, {T}, op, "lse");
  expect(weights, logits.dtype, {T, k}, op, "weights");
}

void check_moe_aux_losses(const Tensor& probs, const Tensor& lse, const Tensor& counts,
                          const MoeAuxCoefs&, const Tensor& losses) {
  const char* op = "moe_aux_losses";
  const int64_t E = check_counts(counts, op);
  const int64_t T = check_probs(probs, E, op);
  expect(lse, probs.dtype, {T}, op, "lse");
  expect(losses, probs.dtype, {2}, op, "losses");
}

void check_moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                              const Tensor& expert_idx, const Tensor& weights,
                              const Tensor& counts, const MoeAuxCoefs&, float, bool,
                              const Tensor& dlogits) {
  const char* op = "moe_route_backward";
  const int64_t E = check_counts(counts, op);
  const int64_t T = check_probs(probs, E, op);
  const int64_t k = check_idx_shape(expert_idx, T, op, "expert_idx");
  expect(lse, probs.dtype, {T}, op, "lse");
  expect(weights, probs.dtype, {T, k}, op, "weights");
  expect(dweights, probs.dtype, {T, k}, op, "dweights");
  expect_sized(dlogits, {T, E}, op, "dlogits");
}

// ---- Dispatch.

void check_moe_dispatch(const Tensor& expert_idx, const Tensor& counts, const Tensor& offsets,
                        const Tensor& row_of) {
  const char* op = "moe_dispatch";
  expect_defined(expert_idx, op, "expert_idx");
  expect_ndim(expert_idx, 2, op, "expert_idx");
  const int64_t T = expert_idx.size(0);
  const int64_t k = check_idx_shape(expert_idx, T, op, "expert_idx");
  const int64_t E = check_counts(counts, op);
  expect(offsets, DType::I32, {E + 1}, op, "offsets");
  expect(row_of, DType::I32, {T, k}, op, "row_of");
  ENSURE(moe_permuted_rows(T, k, E) <= INT32_MAX, op, ": ", T, " tokens x top_k ", k,
         " overflow the i32 row indices");
}

void check_moe_permute(const Tensor& x, const Tensor& row_of, const Tensor& xp) {
  const char* op = "moe_permute";
  expect_defined(x, op, "x");
  expect_ndim(x, 2, op, "x");
  check_idx_shape(row_of, x.size(0), op, "row_of");
  check_perm(xp, "xp", x, op);
}

// weights: CPU yp's dtype, CUDA f32 (the backends check).
void check_moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights,
                         const Tensor& y) {
  const char* op = "moe_unpermute";
  expect_defined(y, op, "y");
  expect_ndim(y, 2, op, "y");
  const int64_t T = y.size(0);
  const int64_t k = check_idx_shape(row_of, T, op, "row_of");
  check_perm(yp, "yp", y, op);
  if (weights.data || weights.ndim() > 0) expect_sized(weights, {T, k}, op, "weights");
}

void check_moe_unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                                  const Tensor& weights, const Tensor& dyp,
                                  const Tensor& dweights) {
  const char* op = "moe_unpermute_backward";
  expect_defined(dy, op, "dy");
  expect_ndim(dy, 2, op, "dy");
  const int64_t T = dy.size(0);
  const int64_t k = check_idx_shape(row_of, T, op, "row_of");
  check_perm(yp, "yp", dy, op);
  expect(dyp, dy.dtype, yp.shape, op, "dyp");
  expect_sized(weights, {T, k}, op, "weights");
  expect_sized(dweights, {T, k}, op, "dweights");
}

// ---- Grouped linear.

void check_grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                                  const Tensor& counts, const Tensor& y,
                                  const GroupedLinearOptions&) {
  check_grouped("grouped_linear_forward", w, "w", x, "x", true, y, "y", offsets, counts, true);
}

void check_grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                         const Tensor& counts, const Tensor& dx,
                                         const GroupedLinearOptions&) {
  check_grouped("grouped_linear_backward_input", w, "w", dy, "dy", false, dx, "dx", offsets,
                counts, true);
}

void check_grouped_linear_backward_weight(const Tensor& dy, const Tensor& x,
                                          const Tensor& offsets, const Tensor& counts,
                                          const Tensor& dw, const GroupedLinearOptions&) {
  check_grouped("grouped_linear_backward_weight", dw, "dw", dy, "dy", false, x, "x", offsets,
                counts, false);
}

// ---- Shared expert's gate: logits (T, 1); the (T, C) tensors of one dtype (dlogits sized only).

void check_moe_shared_gate_forward(const Tensor& logits, const Tensor& shared, const Tensor& y) {
  const char* op = "moe_shared_gate_forward";
  expect_defined(shared, op, "shared");
  expect_ndim(shared, 2, op, "shared");
  expect_sized(logits, {shared.size(0), 1}, op, "logits");
  expect(y, shared.dtype, shared.shape, op, "y");
}

void check_moe_shared_gate_backward(const Tensor& dy, const Tensor& logits, const Tensor& shared,
                                    const Tensor& dshared, const Tensor& dlogits) {
  const char* op = "moe_shared_gate_backward";
  expect_defined(shared, op, "shared");
  expect_ndim(shared, 2, op, "shared");
  expect_sized(logits, {shared.size(0), 1}, op, "logits");
  expect(dy, shared.dtype, shared.shape, op, "dy");
  expect(dshared, shared.dtype, shared.shape, op, "dshared");
  expect_sized(dlogits, {shared.size(0), 1}, op, "dlogits");
}

// ---- Jitter.

void check_moe_jitter(const Tensor& x, const Tensor& y, uint64_t, float) {
  const char* op = "moe_jitter";
  expect_defined(x, op, "x");
  expect(y, x.dtype, x.shape, op, "y");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_MOE_OPS)

}  // namespace engine::ops
