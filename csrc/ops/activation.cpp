// The activation ops (ops/activation.h): the preconditions both backends share, and the
// dispatch. The backends check the dtypes they take.
#include "ops/activation.h"

namespace engine::ops {
namespace {

// An element-wise activation: y (or dy and dx) of x's dtype and shape.
void check_unary(const char* op, const Tensor& x, const Tensor* dy, const Tensor& out, const char* out_name) {
  expect_defined(x, op, "x");
  if (dy) expect(*dy, x.dtype, x.shape, op, "dy");
  expect(out, x.dtype, x.shape, op, out_name);
}

void check_gelu_forward(const Tensor& x, const Tensor& y) { check_unary("gelu_forward", x, nullptr, y, "y"); }
void check_gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  check_unary("gelu_backward", x, &dy, dx, "dx");
}
void check_gelu_erf_forward(const Tensor& x, const Tensor& y) { check_unary("gelu_erf_forward", x, nullptr, y, "y"); }
void check_gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  check_unary("gelu_erf_backward", x, &dy, dx, "dx");
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

// The optional amax of an output: undefined or one f32 element.
void check_amax(const Tensor& amax, const char* op) {
  if (amax.data) expect(amax, DType::F32, {1}, op, "amax");
}

void check_swiglu_forward(const Tensor& gate_up, const Tensor& y, const Tensor& amax) {
  check_swiglu(gate_up, y, "swiglu_forward", "y");
  check_amax(amax, "swiglu_forward");
}

void check_swiglu_backward(const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up, const Tensor& amax) {
  const char* op = "swiglu_backward";
  check_swiglu(gate_up, dy, op, "dy");
  expect(dgate_up, gate_up.dtype, gate_up.shape, op, "dgate_up");
  check_amax(amax, op);
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_ACTIVATION_OPS)

}  // namespace engine::ops
