// The element-wise ops (ops/elementwise.h): the preconditions both backends share, and the
// dispatch. The backends check the dtypes they take.
#include "ops/elementwise.h"

namespace engine::ops {
namespace {

void check_add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* op = "add";
  expect_defined(a, op, "a");
  expect(b, a.dtype, a.shape, op, "b");
  expect(out, a.dtype, a.shape, op, "out");
}

void check_add_inplace(const Tensor& acc, const Tensor& x) {
  const char* op = "add_inplace";
  expect_defined(acc, op, "acc");
  expect(x, acc.dtype, acc.shape, op, "x");
}

void check_scale_inplace(const Tensor& x, double s) { expect_defined(x, "scale_inplace", "x"); }

void check_cast(const Tensor& src, const Tensor& dst) {
  const char* op = "cast";
  expect_defined(src, op, "src");
  expect_defined(dst, op, "dst");
  expect_shape(dst, src.shape, op, "dst");
}

void check_sum(const Tensor& x) { expect_defined(x, "sum", "x"); }
void check_sum_squares(const Tensor& x) { expect_defined(x, "sum_squares", "x"); }
void check_count_nonfinite(const Tensor& x) { expect_defined(x, "count_nonfinite", "x"); }

// The operands' shapes and the column ranges.
void check_copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                        int64_t width, bool accumulate) {
  const char* op = "copy_columns";
  expect_defined(src, op, "src");
  expect_defined(dst, op, "dst");
  expect_ndim(src, 2, op, "src");
  expect_ndim(dst, 2, op, "dst");
  ENSURE(src.size(0) == dst.size(0), op, ": src has ", src.size(0), " rows but dst has ", dst.size(0));
  ENSURE(width >= 0 && src_col >= 0 && src_col + width <= src.size(1), op, ": columns [", src_col, ", ",
         src_col + width, ") of src ", src.shape.str());
  ENSURE(dst_col >= 0 && dst_col + width <= dst.size(1), op, ": columns [", dst_col, ", ", dst_col + width,
         ") of dst ", dst.shape.str());
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_ELEMENTWISE_OPS)

}  // namespace engine::ops
