// The activation ops (ops/activation.h): the preconditions both backends share, and the
// dispatch. The backends check the dtypes they take.
#include "ops/activation.h"

namespace engine::ops {
namespace {

void check_gelu_forward(const Tensor& x, const Tensor& y) {
  const char* op = "gelu_forward";
  expect_defined(x, op, "x");
  expect(y, x.dtype, x.shape, op, "y");
}

void check_gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const char* op = "gelu_backward";
  expect_defined(x, op, "x");
  expect(dy, x.dtype, x.shape, op, "dy");
  expect(dx, x.dtype, x.shape, op, "dx");
}

void check_gelu_erf_forward(const Tensor& x, const Tensor& y) {
  const char* op = "gelu_erf_forward";
  expect_defined(x, op, "x");
  expect(y, x.dtype, x.shape, op, "y");
}

void check_gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const char* op = "gelu_erf_backward";
  expect_defined(x, op, "x");
  expect(dy, x.dtype, x.shape, op, "dy");
  expect(dx, x.dtype, x.shape, op, "dx");
}

// gate_up (..., 2F); y (named yname) (..., F) of gate_up's dtype with the same leading dimensions.
void check_swiglu(const Tensor& gate_up, const Tensor& y, const char* op, const char* yname) {
  expect_defined(gate_up, op, "gate_up");
  ENSURE(gate_up.ndim() >= 1 && gate_up.size(-1) % 2 == 0, op, ": gate_up has shape ",
         gate_up.shape.str(), ", its last dimension must be 2 * F");
  Shape expected = gate_up.shape;
  expected.d[expected.ndim - 1] = gate_up.size(-1) / 2;
  expect(y, gate_up.dtype, expected, op, yname);
}

void check_swiglu_forward(const Tensor& gate_up, const Tensor& y) {
  check_swiglu(gate_up, y, "swiglu_forward", "y");
}

void check_swiglu_backward(const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up) {
  const char* op = "swiglu_backward";
  check_swiglu(gate_up, dy, op, "dy");
  expect(dgate_up, gate_up.dtype, gate_up.shape, op, "dgate_up");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_ACTIVATION_OPS)

}  // namespace engine::ops
