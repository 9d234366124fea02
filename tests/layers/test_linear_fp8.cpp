// The FP8 linear layer (layers/linear.h) on the CPU: its products follow the f32 layer within
// FP8 rounding and no closer than FP8 allows (so the FP8 path is the one that ran); per-row
// scales keep a row of small values that one scale a tensor flushes; the bias, the addend, the
// bias gradient and the += of the weight gradient are the f32 layer's; the GPU layer equals the
// CPU one (the same bytes from the same bf16 inputs); amaxes shared between the products give
// the same bits, and a shared amax is the one the products use.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "core/buffer.h"
#include "layers/linear.h"
#include "ops/elementwise.h"
#include "ops/fp8.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;
using layers::LinearPrecision;

namespace {

constexpr int64_t T = 48, kIn = 64, kOut = 32;

struct Grads {
  Owned y, dx, dw, db;
};

// shared: the forward's amaxes kept for the backward, and dy's in a slot (layers/linear.h).
Grads run(const LinearPrecision& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy,
          const Tensor& addend = {}, bool shared = false) {
  Grads g{empty({T, kOut}, x.dtype, x.device), empty({T, kIn}, x.dtype, x.device), zeros({kOut, kIn}, DType::F32, x.device),
          zeros({kOut}, DType::F32, x.device)};
  layers::LinearAmaxes saved;
  layers::Fp8Amax dy_amax;
  layers::linear_forward(p, x, w, b, g.y, addend, shared ? &saved : nullptr);
  layers::linear_backward(p, dy, x, w, g.dx, g.dw, g.db, shared ? &saved : nullptr, shared ? &dy_amax : nullptr);
  return g;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Owned ha = to_host(a, DType::F32), hb = to_host(b, DType::F32);
  return std::memcmp(ha->data, hb->data, ha->nbytes()) == 0;
}

// The backward as two calls, dx then dW (as a split backward runs it: dy quantised once a call,
// not as a pair), on g's forward.
Grads split_backward(const LinearPrecision& p, const Tensor& x, const Tensor& w, const Tensor& dy) {
  Grads g{{}, empty({T, kIn}, x.dtype, x.device), zeros({kOut, kIn}, DType::F32, x.device), {}};
  layers::linear_backward(p, dy, x, w, g.dx, {}, {});
  layers::linear_backward(p, dy, x, w, {}, g.dw, {});
  return g;
}

// With the amaxes shared, and with dy quantised once a call rather than as a pair: the bits of
// `plain` (run without slots on the same inputs).
void check_as_plain(const LinearPrecision& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy,
                    const Tensor& addend, const Grads& plain) {
  const Grads shared = run(p, x, w, b, dy, addend, true);
  CHECK(same_bits(shared.y, plain.y));
  CHECK(same_bits(shared.dx, plain.dx));
  CHECK(same_bits(shared.dw, plain.dw));
  const Grads split = split_backward(p, x, w, dy);
  CHECK(same_bits(split.dx, plain.dx));
  CHECK(same_bits(split.dw, plain.dw));
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

TEST_CASE("fp8 linear: amaxes shared between its products give the same bits, and the products use them") {
  Owned x = randn({T, kIn}, DType::F32, "fp8 share x"), w = randn({kOut, kIn}, DType::F32, "fp8 share w", 0.05);
  Owned b = randn({kOut}, DType::F32, "fp8 share b"), dy = randn({T, kOut}, DType::F32, "fp8 share dy", 1e-3);
  for (Fp8Recipe r : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) {
    CAPTURE(static_cast<int>(r));
    check_as_plain({r}, x, w, b, dy, {}, run({r}, x, w, b, dy));
  }
  // The slots hold the amaxes (per tensor), and an amax set before the call is the one used: an
  // x amax of three times the true one quantises x on another grid (a power of two would only
  // shift the exponents).
  layers::LinearAmaxes saved;
  Owned y = empty({T, kOut}, DType::F32, Device::CPU), y2 = empty({T, kOut}, DType::F32, Device::CPU);
  layers::linear_forward({Fp8Recipe::Tensorwise}, x, w, {}, y, {}, &saved);
  REQUIRE(saved.x);
  REQUIRE(saved.w);
  Owned want = empty({1}, DType::F32, Device::CPU);
  ops::fp8_amax(x, false, want);
  CHECK(get(saved.x.t, 0) == get(want, 0));
  ops::fp8_amax(w, false, want);
  CHECK(get(saved.w.t, 0) == get(want, 0));
  layers::LinearAmaxes tripled;
  tripled.x = layers::Fp8Amax::on(Device::CPU);
  set(tripled.x.t, 0, 3 * get(saved.x.t, 0));
  const double given = get(tripled.x.t, 0);
  layers::linear_forward({Fp8Recipe::Tensorwise}, x, w, {}, y2, {}, &tripled);
  CHECK(!same_bits(y2, y));
  CHECK(get(tripled.x.t, 0) == given);
  // Rowwise ignores the slots: the same set amax changes nothing there.
  Owned yr = empty({T, kOut}, DType::F32, Device::CPU), yr2 = empty({T, kOut}, DType::F32, Device::CPU);
  layers::linear_forward({Fp8Recipe::Rowwise}, x, w, {}, yr);
  layers::LinearAmaxes ignored;
  ignored.x = layers::Fp8Amax::on(Device::CPU);
  set(ignored.x.t, 0, given);
  layers::linear_forward({Fp8Recipe::Rowwise}, x, w, {}, yr2, {}, &ignored);
  CHECK(same_bits(yr2, yr));
  // A forward takes W's amax anew though the slots hold one: another W through the same slots
  // gives what fresh slots give.
  Owned w2 = randn({kOut, kIn}, DType::F32, "fp8 share w2", 0.2);
  layers::LinearAmaxes fresh;
  Owned y3 = empty({T, kOut}, DType::F32, Device::CPU), y4 = empty({T, kOut}, DType::F32, Device::CPU);
  saved.x = {};
  layers::linear_forward({Fp8Recipe::Tensorwise}, x, w2, {}, y3, {}, &saved);
  layers::linear_forward({Fp8Recipe::Tensorwise}, x, w2, {}, y4, {}, &fresh);
  CHECK(same_bits(y3, y4));
  layers::linear_forward({Fp8Recipe::Tensorwise}, x, w, {}, y3, {}, &saved);  // back to w's
  // dy's slot: filled by the first backward call, used as it is by the next.
  layers::Fp8Amax dya;
  Owned dx = empty({T, kIn}, DType::F32, Device::CPU), dw = zeros({kOut, kIn}, DType::F32, Device::CPU);
  layers::linear_backward({Fp8Recipe::Tensorwise}, dy, x, w, dx, {}, {}, &saved, &dya);
  REQUIRE(dya);
  ops::fp8_amax(dy, false, want);
  CHECK(get(dya.t, 0) == get(want, 0));
  Owned dx2 = empty({T, kIn}, DType::F32, Device::CPU);
  set(dya.t, 0, 3 * get(want, 0));
  layers::linear_backward({Fp8Recipe::Tensorwise}, dy, x, w, dx2, {}, {}, &saved, &dya);
  CHECK(!same_bits(dx2, dx));
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
    check_as_plain({r}, gx, gw, gb, gdy, gres, gpu);  // (dy's pair kernel against once a call)
  }
}
