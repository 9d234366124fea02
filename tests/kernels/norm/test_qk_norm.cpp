// GPU tests of cuda/norm/qk_norm.cu against the f64 CPU reference (csrc/ref/qk_norm.cpp):
// forward (normalised rows, the saved input bit for bit, rstd, v heads untouched) and backward
// (dx, dweight accumulated onto nonzero values) on fresh random inputs: one row, odd head dims,
// no q heads, D = 1024 (the limit), and more rows than the backward grid's warps (every warp
// then takes several rows); the backward's weight gradients bitwise reproducible.
// Tolerances: bf16 outputs as output_tol (twice bf16 rounding plus 1e-4; the kernel computes in
// f32 and rounds once), f32 outputs and the f32 statistics within 2e-5 (sums in f32).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ops/qk_norm.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr double kF32Tol = 2e-5;
constexpr float kEps = 1e-6f;

struct QkCase {
  int64_t t, q, k, v, d;
  std::string name() const {
    return "T" + std::to_string(t) + " q" + std::to_string(q) + " k" + std::to_string(k) + " v" + std::to_string(v) +
           " D" + std::to_string(d);
  }
};
const std::vector<QkCase> kCases = {{1, 1, 1, 1, 2},   {7, 6, 2, 2, 10},   {33, 3, 1, 1, 100}, {5, 0, 2, 1, 16},
                                    {3, 2, 1, 0, 1024}, {300, 8, 2, 2, 128}, {900, 4, 2, 2, 64}};

Owned weight_for(const QkCase& c) {
  Owned w = randn({2, c.d}, DType::F32, "qk.w", 0.3);
  for (int64_t i = 0; i < w->numel(); ++i) set(w, i, 1.0 + get(w, i));
  return w;
}

}  // namespace

TEST_CASE("cuda qk_norm forward and backward match the f64 reference (bf16 and f32)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const QkCase& c : kCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dtype_name(dt));
        const int64_t NH = c.q + c.k + c.v, N = c.q + c.k;
        const int q = static_cast<int>(c.q);
        auto [gx, rx] = device_input(randn({c.t, NH, c.d}, DType::F32, "qk.x"), dt);
        auto [gw, rw] = device_input(weight_for(c), dt);
        DeviceTensor orig = to_gpu(rx, dt);
        DeviceTensor gin = gpu_poisoned({c.t, N, c.d}, dt), grs = gpu_poisoned({c.t, N}, DType::F32);
        Owned rin = empty({c.t, N, c.d}, DType::F64, Device::CPU), rrs = empty({c.t, N}, DType::F64, Device::CPU);
        ops::qk_norm_forward(rx, rw, q, kEps, rin, rrs);
        ops::qk_norm_forward(gx.t, gw.t, q, kEps, gin.t, grs.t);
        CHECK_CLOSE(gx.t, rx.t, output_tol(dt, rx, kF32Tol));
        CHECK_CLOSE(grs.t, rrs.t, kF32Tol);
        CHECK(bitwise_equal(gin.t, to_gpu(rin, dt).t));  // the input as it was
        Owned hx = to_host(gx.t, DType::F32), ho = to_host(orig.t, DType::F32);
        bool untouched = true;  // the v heads
        for (int64_t t = 0; t < c.t; ++t)
          for (int64_t i = N * c.d; i < NH * c.d; ++i)
            untouched = untouched && get(hx, t * NH * c.d + i) == get(ho, t * NH * c.d + i);
        CHECK(untouched);

        auto [gdy, rdy] = device_input(randn({c.t, NH, c.d}, DType::F32, "qk.dy"), dt);
        Owned dw0 = randn({2, c.d}, DType::F32, "qk.dw0");
        DeviceTensor gdw = to_gpu(dw0, DType::F32), gdw2 = to_gpu(dw0, DType::F32);
        DeviceTensor gdy2 = to_gpu(rdy, dt);
        Owned rdw = to_host(dw0, DType::F64);
        ops::qk_norm_backward(rdy, rin, rw, q, rrs, rdw);
        ops::qk_norm_backward(gdy.t, gin.t, gw.t, q, grs.t, gdw.t);
        CHECK_CLOSE(gdy.t, rdy.t, output_tol(dt, rdy, kF32Tol));
        CHECK_CLOSE(gdw.t, rdw.t, kF32Tol);
        ops::qk_norm_backward(gdy2.t, gin.t, gw.t, q, grs.t, gdw2.t);
        CHECK(bitwise_equal(gdw.t, gdw2.t));
        CHECK(bitwise_equal(gdy.t, gdy2.t));
      }
    }
  }
}

TEST_CASE("cuda qk_norm launchers reject what the kernels do not take" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  DeviceTensor x = gpu_poisoned({2, 3, 1026}, DType::BF16), w = gpu_poisoned({2, 1026}, DType::BF16);
  DeviceTensor in = gpu_poisoned({2, 2, 1026}, DType::BF16), rs = gpu_poisoned({2, 2}, DType::F32);
  CHECK_THROWS_WITH_AS(ops::qk_norm_forward(x.t, w.t, 1, kEps, in.t, rs.t), doctest::Contains("head_dim"), Error);
  DeviceTensor x8 = gpu_poisoned({2, 3, 8}, DType::BF16), w8 = gpu_poisoned({2, 8}, DType::BF16);
  DeviceTensor in8 = gpu_poisoned({2, 2, 8}, DType::BF16), dw16 = gpu_poisoned({2, 8}, DType::BF16);
  CHECK_THROWS_WITH_AS(ops::qk_norm_backward(x8.t, in8.t, w8.t, 1, rs.t, dw16.t), doctest::Contains("dweight"), Error);
}
