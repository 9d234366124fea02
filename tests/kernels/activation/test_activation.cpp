// GPU tests of cuda/activation (gelu tanh form, swiglu) against the f64 CPU reference
// (csrc/ref/activation.cpp), forward and backward, fresh random inputs of odd shapes (the
// element-wise tail of the 16-byte kernels, the scalar kernels on misaligned views), poisoned
// outputs, in-place aliasing, bitwise reproducibility.
// Tolerances: bf16 within twice the error of rounding the exact result to bf16, plus 1e-4 (the
// reference runs on the same bf16-rounded inputs; the kernel computes in f32, with fast exp and
// divide for bf16, and rounds once); f32 within 1e-5 (the reference's sigmoid form keeps the
// negative tail exact, where its earlier 1 + tanh u lost up to 2e-4 at x = -6.4 and gave 0 below
// x = -7: a one-element tensor drawn there failed 1e-5 on the reference's error, not the kernel's).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ops/activation.h"
#include "ops/fp8.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr double kF32Tol = 1e-5;

struct ShapeCase {
  Shape shape;  // gelu: the tensor; swiglu: y (..., F), gate_up (..., 2F)
  int64_t offset;  // 1: every tensor starts one element past a 16-byte boundary (scalar kernels)
  std::string name() const { return shape.str() + (offset ? " misaligned" : ""); }
};
const std::vector<ShapeCase> kGeluCases = {
    {{1}, 0},         {{7, 11}, 0}, {{1000, 2047}, 0}, {{3, 5, 4096}, 0},
    {{300, 4096}, 0}, {{13}, 0},    {{33, 64}, 1},     {{9, 2047}, 1}};
const std::vector<ShapeCase> kSwigluCases = {
    {{1, 11}, 0},    {{7, 64}, 0}, {{1000, 2047}, 0}, {{300, 4096}, 0},
    {{2, 3, 40}, 0}, {{5, 6}, 0},  {{9, 64}, 1},      {{4, 2047}, 1}};

Shape doubled_last(Shape s) {
  s.d[s.ndim - 1] *= 2;
  return s;
}

}  // namespace

TEST_CASE("cuda gelu forward and backward match the f64 reference (bf16 and f32)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const ShapeCase& k : kGeluCases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dtype_name(dt));
        Owned x = randn(k.shape, DType::F32, "gelu.x", 3.0),
              dy = randn(k.shape, DType::F32, "gelu.dy");
        auto [gx, x64] = device_input(x, dt, k.offset);
        auto [gdy, dy64] = device_input(dy, dt, k.offset);
        Owned y64 = empty(k.shape, DType::F64, Device::CPU),
              dx64 = empty(k.shape, DType::F64, Device::CPU);
        ops::gelu_forward(x64, y64);
        ops::gelu_backward(dy64, x64, dx64);

        DeviceTensor gy = gpu_poisoned(k.shape, dt, k.offset),
            gdx = gpu_poisoned(k.shape, dt, k.offset);
        ops::gelu_forward(gx.t, gy.t);
        ops::gelu_backward(gdy.t, gx.t, gdx.t);
        CHECK_CLOSE(gy.t, y64.t, output_tol(dt, y64, kF32Tol));
        CHECK_CLOSE(gdx.t, dx64.t, output_tol(dt, dx64, kF32Tol));

        // Reproducible, and in place: y = x, dx = dy.
        DeviceTensor gy2 = gpu_poisoned(k.shape, dt, k.offset);
        ops::gelu_forward(gx.t, gy2.t);
        CHECK(bitwise_equal(gy.t, gy2.t));
        DeviceTensor inplace = to_gpu(x, dt, k.offset);
        ops::gelu_forward(inplace.t, inplace.t);
        CHECK(bitwise_equal(gy.t, inplace.t));
        DeviceTensor dinplace = to_gpu(dy, dt, k.offset);
        ops::gelu_backward(dinplace.t, gx.t, dinplace.t);
        CHECK(bitwise_equal(gdx.t, dinplace.t));
      }
    }
  }
}

TEST_CASE("cuda gelu_erf (exact GELU) forward and backward match the f64 reference (bf16 and f32)" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const ShapeCase& k : kGeluCases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dtype_name(dt));
        Owned x = randn(k.shape, DType::F32, "erf.x", 3.0), dy = randn(k.shape, DType::F32, "erf.dy");
        auto [gx, x64] = device_input(x, dt, k.offset);
        auto [gdy, dy64] = device_input(dy, dt, k.offset);
        Owned y64 = empty(k.shape, DType::F64, Device::CPU), dx64 = empty(k.shape, DType::F64, Device::CPU);
        ops::gelu_erf_forward(x64, y64);
        ops::gelu_erf_backward(dy64, x64, dx64);
        DeviceTensor gy = gpu_poisoned(k.shape, dt, k.offset), gdx = gpu_poisoned(k.shape, dt, k.offset);
        ops::gelu_erf_forward(gx.t, gy.t);
        ops::gelu_erf_backward(gdy.t, gx.t, gdx.t);
        CHECK_CLOSE(gy.t, y64.t, output_tol(dt, y64, kF32Tol));
        CHECK_CLOSE(gdx.t, dx64.t, output_tol(dt, dx64, kF32Tol));
      }
    }
  }
}

TEST_CASE("cuda swiglu forward and backward match the f64 reference (bf16 and f32)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const ShapeCase& k : kSwigluCases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dtype_name(dt));
        const Shape gu_shape = doubled_last(k.shape);
        Owned gu = randn(gu_shape, DType::F32, "swiglu.gu", 2.0),
              dy = randn(k.shape, DType::F32, "swiglu.dy");
        auto [ggu, gu64] = device_input(gu, dt, k.offset);
        auto [gdy, dy64] = device_input(dy, dt, k.offset);
        Owned y64 = empty(k.shape, DType::F64, Device::CPU),
              dgu64 = empty(gu_shape, DType::F64, Device::CPU);
        ops::swiglu_forward(gu64, y64, {});
        ops::swiglu_backward(dy64, gu64, dgu64, {});

        DeviceTensor gy = gpu_poisoned(k.shape, dt, k.offset),
            gdgu = gpu_poisoned(gu_shape, dt, k.offset);
        ops::swiglu_forward(ggu.t, gy.t, {});
        ops::swiglu_backward(gdy.t, ggu.t, gdgu.t, {});
        CHECK_CLOSE(gy.t, y64.t, output_tol(dt, y64, kF32Tol));
        CHECK_CLOSE(gdgu.t, dgu64.t, output_tol(dt, dgu64, kF32Tol));

        // Reproducible, and in place: dgate_up = gate_up.
        DeviceTensor gdgu2 = gpu_poisoned(gu_shape, dt, k.offset);
        ops::swiglu_backward(gdy.t, ggu.t, gdgu2.t, {});
        CHECK(bitwise_equal(gdgu.t, gdgu2.t));
        DeviceTensor inplace = to_gpu(gu, dt, k.offset);
        ops::swiglu_backward(gdy.t, inplace.t, inplace.t, {});
        CHECK(bitwise_equal(gdgu.t, inplace.t));

        // The amax written beside each output (FP8) equals fp8_amax of the output as stored; the
        // outputs are the same bits as without it.
        DeviceTensor amax = gpu_poisoned({1}, DType::F32), amax_ref = gpu_poisoned({1}, DType::F32);
        DeviceTensor gy3 = gpu_poisoned(k.shape, dt, k.offset), gdgu3 = gpu_poisoned(gu_shape, dt, k.offset);
        ops::swiglu_forward(ggu.t, gy3.t, amax.t);
        CHECK(bitwise_equal(gy.t, gy3.t));
        ops::fp8_amax(gy.t.view({gy.t.numel(), 1}), false, amax_ref.t);
        CHECK(bitwise_equal(amax.t, amax_ref.t));
        ops::swiglu_backward(gdy.t, ggu.t, gdgu3.t, amax.t);
        CHECK(bitwise_equal(gdgu.t, gdgu3.t));
        ops::fp8_amax(gdgu.t.view({gdgu.t.numel(), 1}), false, amax_ref.t);
        CHECK(bitwise_equal(amax.t, amax_ref.t));
      }
    }
  }
}

TEST_CASE("cuda activation launchers reject mismatched dtypes and shapes" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  Owned x = randn({4, 6}, DType::F32, "act.x");
  DeviceTensor gx = to_gpu(x, DType::BF16), gx32 = to_gpu(x, DType::F32);
  DeviceTensor y3 = gpu_poisoned({4, 3}, DType::BF16), y5 = gpu_poisoned({4, 5}, DType::BF16),
      y32 = gpu_poisoned({4, 3}, DType::F32);
  CHECK_THROWS_AS(ops::gelu_forward(gx.t, gx32.t), Error);   // dtype
  CHECK_THROWS_AS(ops::gelu_forward(gx.t, y3.t), Error);     // shape
  CHECK_THROWS_AS(ops::swiglu_forward(gx.t, y5.t, {}), Error);   // F != 6 / 2
  CHECK_THROWS_AS(ops::swiglu_forward(gx.t, y32.t, {}), Error);  // dtype
  DeviceTensor odd = to_gpu(randn({4, 5}, DType::F32, "act.odd"), DType::BF16);
  CHECK_THROWS_AS(ops::swiglu_forward(odd.t, y3.t, {}), Error);  // 2F odd
}
