// The rotary embedding ops (ops/rope.h): the preconditions both backends share, and the
// dispatch. The backends check the dtypes of x they take and their size limits.
#include "ops/rope.h"

namespace engine::ops {
namespace {

// x (named xname) (T, NH, D) with D even; positions (T) or (T, 2) i32; 0 <= rotated_heads <= NH; the
// frequency parameters in range (ops/rope_params.h; the config validation names the keys).
void check_rope(const Tensor& x, const Tensor& positions, int rotated_heads, const RopeParams& r,
                const char* op, const char* xname) {
  expect_defined(x, op, xname);
  expect_ndim(x, 3, op, xname);
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2);
  const bool two_d = positions.ndim() == 2;
  if (two_d) {
    expect(positions, DType::I32, {rows, 2}, op, "positions");
    ENSURE(d % 4 == 0, op, ": 2-D positions (rows, columns) turn D/4 pairs each: head_dim of ", xname, " ",
           x.shape.str(), " must be a multiple of 4");
    ENSURE(r.kind == RopeScalingKind::None, op, ": 2-D positions take no frequency scaling (kind none)");
  } else {
    expect(positions, DType::I32, {rows}, op, "positions");
  }
  ENSURE(d % 2 == 0, op, ": head_dim of ", xname, " ", x.shape.str(), " must be even");
  ENSURE(rotated_heads >= 0 && rotated_heads <= heads, op, ": rotated_heads = ", rotated_heads,
         " not in [0, ", heads, "] for ", xname, " ", x.shape.str());
  ENSURE(r.theta > 0, op, ": theta must be > 0, got ", r.theta);
  if (r.kind == RopeScalingKind::None) return;
  ENSURE(r.factor > 0, op, ": factor must be > 0, got ", r.factor);
  if (r.kind == RopeScalingKind::Llama3 || r.kind == RopeScalingKind::Yarn)
    ENSURE(r.original_max_position_embeddings > 0, op, ": original_max_position_embeddings must be > 0, got ",
           r.original_max_position_embeddings);
  if (r.kind == RopeScalingKind::Llama3)
    ENSURE(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor, op,
           ": llama3 needs 0 < low_freq_factor < high_freq_factor, got ", r.low_freq_factor, " and ",
           r.high_freq_factor);
  if (r.kind == RopeScalingKind::Yarn)
    ENSURE(r.beta_fast > 0 && r.beta_slow > 0 && r.attention_factor > 0, op,
           ": yarn needs beta_fast, beta_slow and attention_factor > 0, got ", r.beta_fast, ", ", r.beta_slow,
           ", ", r.attention_factor);
}

void check_rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads,
                        const RopeParams& rope) {
  check_rope(x, positions, rotated_heads, rope, "rope_forward", "x");
}

void check_rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads,
                         const RopeParams& rope) {
  check_rope(dx, positions, rotated_heads, rope, "rope_backward", "dx");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_ROPE_OPS)

}  // namespace engine::ops
