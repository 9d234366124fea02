// The rotary embedding ops (ops/rope.h): the preconditions both backends share, and the
// dispatch. The backends check the dtypes of x they take and their size limits.
#include "ops/rope.h"

namespace engine::ops {
namespace {

// x (named xname) (T, NH, D) with D even; positions (T) i32; 0 <= rotated_heads <= NH; theta > 0.
void check_rope(const Tensor& x, const Tensor& positions, int rotated_heads, float theta,
                const char* op, const char* xname) {
  expect_defined(x, op, xname);
  expect_ndim(x, 3, op, xname);
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2);
  expect(positions, DType::I32, {rows}, op, "positions");
  ENSURE(d % 2 == 0, op, ": head_dim of ", xname, " ", x.shape.str(), " must be even");
  ENSURE(rotated_heads >= 0 && rotated_heads <= heads, op, ": rotated_heads = ", rotated_heads,
         " not in [0, ", heads, "] for ", xname, " ", x.shape.str());
  ENSURE(theta > 0.f, op, ": theta must be > 0, got ", theta);
}

void check_rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads,
                        float theta) {
  check_rope(x, positions, rotated_heads, theta, "rope_forward", "x");
}

void check_rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads,
                         float theta) {
  check_rope(dx, positions, rotated_heads, theta, "rope_backward", "dx");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_ROPE_OPS)

}  // namespace engine::ops
