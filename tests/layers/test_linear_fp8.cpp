// The FP8 linear layer (layers/linear.h) on the CPU: its products follow the f32 layer within
// FP8 rounding and no closer than FP8 allows (so the FP8 path is the one that ran); per-row
// scales keep a row of small values that one scale a tensor flushes; the bias, the addend, the
// bias gradient and the += of the weight gradient are the f32 layer's; the GPU layer equals the
// CPU one (the same bytes from the same bf16 inputs).
#include <doctest/doctest.h>

#include <cmath>

#include "core/buffer.h"
#include "layers/linear.h"
#include "ops/elementwise.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;
using layers::LinearPrecision;

namespace {

constexpr int64_t T = 48, kIn = 64, kOut = 32;

struct Grads {
  Owned y, dx, dw, db;
};

Grads run(const LinearPrecision& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy,
          const Tensor& addend = {}) {
  Grads g{empty({T, kOut}, x.dtype, x.device), empty({T, kIn}, x.dtype, x.device), zeros({kOut, kIn}, DType::F32, x.device),
          zeros({kOut}, DType::F32, x.device)};
  layers::linear_forward(p, x, w, b, g.y, addend);
  layers::linear_backward(p, dy, x, w, g.dx, g.dw, g.db);
  return g;
}

double rel_rms(const Tensor& got, const Tensor& ref) { return compare(got, ref).rel_rms; }

}  // namespace

TEST_CASE("fp8 linear: forward, input and weight gradients within FP8 rounding of f32, and not closer") {
  Owned x = randn({T, kIn}, DType::F32, "fp8 lin x"), w = randn({kOut, kIn}, DType::F32, "fp8 lin w", 0.05);
  Owned b = randn({kOut}, DType::F32, "fp8 lin b"), dy = randn({T, kOut}, DType::F32, "fp8 lin dy", 1e-3);
  const Grads ref = run({}, x, w, b, dy);
  for (Fp8Recipe r : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) {
    CAPTURE(static_cast<int>(r));
    const Grads g = run({r}, x, w, b, dy);
    // e4m3 keeps 3 mantissa bits (a relative step of 2^-3 at most); e5m2 gradients 2.
    const double dgrad_tol = r == Fp8Recipe::Rowwise ? 0.08 : 0.15;
    const double y = rel_rms(g.y, ref.y), dx = rel_rms(g.dx, ref.dx), dw = rel_rms(g.dw, ref.dw);
    INFO("rel_rms y " << y << ", dx " << dx << ", dw " << dw);
    CHECK(y < 0.06);
    CHECK(dx < dgrad_tol);
    CHECK(dw < dgrad_tol);
    CHECK(y > 1e-3);  // FP8 rounding is there: the product did not run in f32
    CHECK(dx > 1e-3);
    CHECK(dw > 1e-3);
    CHECK_CLOSE(g.db, ref.db, 1e-6);  // the bias gradient sums dy itself
  }
}

TEST_CASE("fp8 linear: per-row scales keep a row of small values that one scale a tensor flushes") {
  Owned x = randn({T, kIn}, DType::F32, "fp8 rows x"), w = randn({kOut, kIn}, DType::F32, "fp8 rows w", 0.05);
  for (int64_t j = 0; j < kIn; ++j) set(x, 5 * kIn + j, get(x, 5 * kIn + j) * 1e-5);  // row 5: 1e-5 of the rest
  Owned y_ref = empty({T, kOut}, DType::F32, Device::CPU), y_t = empty({T, kOut}, DType::F32, Device::CPU),
        y_r = empty({T, kOut}, DType::F32, Device::CPU);
  layers::linear_forward({}, x, w, {}, y_ref);
  layers::linear_forward({Fp8Recipe::Tensorwise}, x, w, {}, y_t);
  layers::linear_forward({Fp8Recipe::Rowwise}, x, w, {}, y_r);
  const double t = rel_rms(y_t->slice(5, 6), y_ref->slice(5, 6)), r = rel_rms(y_r->slice(5, 6), y_ref->slice(5, 6));
  INFO("row 5: tensorwise " << t << ", rowwise " << r);
  CHECK(t > 0.2);  // 448e-5 of the tensor's amax: a few of e4m3's subnormal steps (2^-9)
  CHECK(r < 0.06);
}

TEST_CASE("fp8 linear: the bias and the residual addend are added exactly; dW accumulates") {
  Owned x = randn({T, kIn}, DType::F32, "fp8 add x"), w = randn({kOut, kIn}, DType::F32, "fp8 add w", 0.05);
  Owned b = randn({kOut}, DType::F32, "fp8 add b"), res = randn({T, kOut}, DType::F32, "fp8 add res");
  Owned dy = randn({T, kOut}, DType::F32, "fp8 add dy");
  for (Fp8Recipe r : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) {
    Owned plain = empty({T, kOut}, DType::F32, Device::CPU), full = empty({T, kOut}, DType::F32, Device::CPU);
    layers::linear_forward({r}, x, w, {}, plain);
    layers::linear_forward({r}, x, w, b, full, res);
    Owned want = empty({T, kOut}, DType::F32, Device::CPU);
    for (int64_t i = 0; i < T * kOut; ++i) set(want, i, get(plain, i) + get(b, i % kOut) + get(res, i));
    CHECK_CLOSE(full, want, 1e-6);
    // y itself as the addend (the epilogue reads it before writing)
    Owned inplace = empty({T, kOut}, DType::F32, Device::CPU);
    copy_tensor(inplace, res);
    layers::linear_forward({r}, x, w, b, inplace, inplace);
    CHECK_CLOSE(inplace, want, 1e-6);
    Owned once = zeros({kOut, kIn}, DType::F32, Device::CPU), twice = zeros({kOut, kIn}, DType::F32, Device::CPU);
    layers::linear_backward({r}, dy, x, w, {}, once, {});
    layers::linear_backward({r}, dy, x, w, {}, twice, {});
    layers::linear_backward({r}, dy, x, w, {}, twice, {});
    Owned doubled = empty({kOut, kIn}, DType::F32, Device::CPU);
    for (int64_t i = 0; i < kOut * kIn; ++i) set(doubled, i, 2 * get(once, i));
    CHECK_CLOSE(twice, doubled, 1e-6);
  }
}

TEST_CASE("GPU fp8 linear equals the CPU layer on the same bf16 inputs" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // bf16 values on both sides, so that both quantise the same numbers to the same bytes.
  auto bf16_values = [](const Tensor& t) { return to_host(to_device(t, Device::CUDA, DType::BF16), DType::F32); };
  Owned x = bf16_values(randn({T, kIn}, DType::F32, "gpu fp8 lin x")), w = bf16_values(randn({kOut, kIn}, DType::F32, "gpu fp8 lin w", 0.05));
  Owned b = bf16_values(randn({kOut}, DType::F32, "gpu fp8 lin b"));
  Owned dy = bf16_values(randn({T, kOut}, DType::F32, "gpu fp8 lin dy", 1e-3));
  Owned res = bf16_values(randn({T, kOut}, DType::F32, "gpu fp8 lin res"));
  Owned gx = to_device(x, Device::CUDA, DType::BF16), gw = to_device(w, Device::CUDA, DType::BF16);
  Owned gb = to_device(b, Device::CUDA, DType::BF16), gdy = to_device(dy, Device::CUDA, DType::BF16);
  Owned gres = to_device(res, Device::CUDA, DType::BF16);
  for (Fp8Recipe r : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) {
    CAPTURE(static_cast<int>(r));
    const Grads cpu = run({r}, x, w, b, dy, res), gpu = run({r}, gx, gw, gb, gdy, gres);
    CHECK_CLOSE(gpu.y, cpu.y, 8e-3);  // bf16 outputs (y, dx); f32 accumulation in another order
    CHECK_CLOSE(gpu.dx, cpu.dx, 8e-3);
    CHECK_CLOSE(gpu.dw, cpu.dw, 1e-4);  // f32
    CHECK_CLOSE(gpu.db, cpu.db, 1e-4);
  }
}
