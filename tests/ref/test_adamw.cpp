// AdamW: several steps against a scalar f32 re-implementation of the header's formula (weight
// decay, grad_scale, bias correction), the size and direction of a first step, the compute copy
// (bf16 and f32), and argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/adamw.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

struct AdamCase {
  int64_t n;
  float lr, weight_decay, grad_scale;
  std::string name() const {
    return "n " + std::to_string(n) + " lr " + std::to_string(lr) + " wd " +
           std::to_string(weight_decay) + " gs " + std::to_string(grad_scale);
  }
};
const std::vector<AdamCase> kAdamCases = {
    {1, 1e-2f, 0.f, 1.f}, {1001, 3e-3f, 0.1f, 0.5f}, {70001, 1e-3f, 0.01f, 2.f}};

// The header's formula for one element, in f32 like the op ("All f32"); the bias corrections
// 1 - beta^t are computed in double and rounded, as documented in ref/adamw.cpp.
struct ScalarAdamW {
  float p, m = 0, v = 0;
  void step(float grad, const ops::AdamWParams& o) {
    const float g = grad * o.grad_scale;
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    const auto bc1 = static_cast<float>(1 - std::pow(double(o.beta1), double(o.step)));
    const auto bc2 = static_cast<float>(1 - std::pow(double(o.beta2), double(o.step)));
    p = p - o.lr * (m / bc1 / (std::sqrt(v / bc2) + o.eps) + o.weight_decay * p);
  }
};

}  // namespace

TEST_CASE("adamw_step matches a scalar re-implementation over several steps") {
  for (const AdamCase& c : kAdamCases) {
    SUBCASE(c.name().c_str()) {
      Owned param = randn({c.n}, DType::F32, "adam.p");
      Owned m = zeros({c.n}, DType::F32, Device::CPU);
      Owned v = zeros({c.n}, DType::F32, Device::CPU);
      Owned copy16 = empty({c.n}, DType::BF16, Device::CPU),
            copy32 = empty({c.n}, DType::F32, Device::CPU);
      std::vector<ScalarAdamW> ref;
      for (int64_t i = 0; i < c.n; ++i) ref.push_back({param.ptr<float>()[i]});
      ops::AdamWParams o;
      o.lr = c.lr;
      o.weight_decay = c.weight_decay;
      o.grad_scale = c.grad_scale;
      for (int64_t step = 1; step <= 4; ++step) {
        CAPTURE(step);
        o.step = step;
        Owned grad = randn({c.n}, DType::F32, "adam.g" + std::to_string(step));
        for (int64_t i = 0; i < c.n; ++i) ref[static_cast<size_t>(i)].step(grad.ptr<float>()[i], o);
        poison(copy16);
        poison(copy32);
        ops::adamw_step(param, grad, m, v, o, step % 2 ? copy16.t : copy32.t);
        Owned p_ref = empty({c.n}, DType::F32, Device::CPU);
        Owned m_ref = empty({c.n}, DType::F32, Device::CPU);
        Owned v_ref = empty({c.n}, DType::F32, Device::CPU);
        for (int64_t i = 0; i < c.n; ++i) {
          p_ref.ptr<float>()[i] = ref[static_cast<size_t>(i)].p;
          m_ref.ptr<float>()[i] = ref[static_cast<size_t>(i)].m;
          v_ref.ptr<float>()[i] = ref[static_cast<size_t>(i)].v;
        }
        // Same f32 operations in the same order: equal up to compiler contraction.
        CHECK_CLOSE(param.t, p_ref.t, 1e-6);
        CHECK_CLOSE(m.t, m_ref.t, 1e-6);
        CHECK_CLOSE(v.t, v_ref.t, 1e-6);
        bool copy_ok = true;
        for (int64_t i = 0; i < c.n; ++i) {
          const float w = param.ptr<float>()[i];
          copy_ok = copy_ok && (step % 2 ? copy16.ptr<bf16>()[i].bits == bf16(w).bits
                                         : copy32.ptr<float>()[i] == w);
        }
        CHECK(copy_ok);
      }
    }
  }
}

TEST_CASE("adamw_step update direction: the first step moves each weight by about lr") {
  // At t = 1 without decay, m_hat / sqrt(v_hat) = sign(g): every weight moves by lr against g.
  Owned param = randn({257}, DType::F32, "adam.p"), p0 = clone(param),
        grad = randn({257}, DType::F32, "adam.g");
  Owned m = zeros({257}, DType::F32, Device::CPU), v = zeros({257}, DType::F32, Device::CPU);
  ops::AdamWParams o;
  o.lr = 0.01f;
  ops::adamw_step(param, grad, m, v, o, Tensor{});
  for (int64_t i = 0; i < 257; ++i) {
    const double g = get(grad, i), step = get(param, i) - get(p0, i);
    CHECK(step == doctest::Approx(-0.01 * (g > 0 ? 1 : -1) * std::fabs(g) / (std::fabs(g) + 1e-8))
                      .epsilon(1e-4));
  }
}

TEST_CASE("adamw_step rejects bad arguments, naming them") {
  Owned p = randn({6}, DType::F32, "bad.p"), g = randn({6}, DType::F32, "bad.g");
  Owned m = zeros({6}, DType::F32, Device::CPU), v = zeros({6}, DType::F32, Device::CPU);
  Owned g5 = randn({5}, DType::F32, "bad.g5"), g64 = randn({6}, DType::F64, "bad.g64");
  ops::AdamWParams o;
  CHECK_THROWS_WITH_AS(ops::adamw_step(p, g5, m, v, o, Tensor{}), doctest::Contains("grad has 5 elements"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::adamw_step(p, g64, m, v, o, Tensor{}), doctest::Contains("grad is f64"), Error);
  Owned copy = empty({6}, DType::I32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::adamw_step(p, g, m, v, o, copy), doctest::Contains("compute_copy"),
                       Error);
  o.step = 0;
  CHECK_THROWS_WITH_AS(ops::adamw_step(p, g, m, v, o, Tensor{}), doctest::Contains("step = 0"), Error);
}

TEST_CASE("adamw_step with decay runs: one call equals a call per run, bad runs rejected") {
  // Runs of 1 to 300 elements (several shorter than a 4-element vector), decays 0 / 0.1 / 0.03.
  const int64_t n = 20000;
  std::vector<ops::DecayRun> runs;
  for (int64_t end = 0, k = 0; end < n; ++k) {
    end = std::min(n, end + 1 + (k * 7919) % 300);
    runs.push_back({end, k % 3 == 0 ? 0.f : k % 3 == 1 ? 0.1f : 0.03f, k % 4 == 1 ? 0.f : k % 4 == 2 ? 0.5f : 1.f});
  }
  Owned p1 = randn({n}, DType::F32, "runs.p"), p2 = randn({n}, DType::F32, "runs.p");
  Owned g = randn({n}, DType::F32, "runs.g");
  Owned m1 = randn({n}, DType::F32, "runs.m"), m2 = randn({n}, DType::F32, "runs.m");
  Owned v1 = zeros({n}, DType::F32, Device::CPU), v2 = zeros({n}, DType::F32, Device::CPU);
  ops::AdamWParams o;
  o.lr = 1e-2f;
  o.step = 3;
  o.decay_runs = runs;
  ops::adamw_step(p1, g, m1, v1, o, Tensor{});
  o.decay_runs.clear();
  int64_t begin = 0;
  const Owned p0 = randn({n}, DType::F32, "runs.p");
  for (const ops::DecayRun& r : runs) {
    o.weight_decay = r.weight_decay;
    o.lr = 1e-2f * r.lr_scale;  // a run's learning rate: lr x its scale
    ops::adamw_step(p2->slice(begin, r.end), g->slice(begin, r.end), m2->slice(begin, r.end),
                    v2->slice(begin, r.end), o, Tensor{});
    if (r.lr_scale == 0.f)  // scale 0: the weights unchanged
      CHECK(std::memcmp(p2->slice(begin, r.end).data, p0->slice(begin, r.end).data, (r.end - begin) * 4) == 0);
    begin = r.end;
  }
  CHECK(std::memcmp(p1.t.data, p2.t.data, n * 4) == 0);
  CHECK(std::memcmp(m1.t.data, m2.t.data, n * 4) == 0);
  CHECK(std::memcmp(v1.t.data, v2.t.data, n * 4) == 0);

  o.decay_runs = {{5, 0.f}, {5, 0.1f}, {n, 0.f}};
  CHECK_THROWS_WITH_AS(ops::adamw_step(p1, g, m1, v1, o, Tensor{}),
                       doctest::Contains("decay run 1 ends at 5"), Error);
  o.decay_runs = {{5, 0.f, -0.5f}, {n, 0.1f}};
  CHECK_THROWS_WITH_AS(ops::adamw_step(p1, g, m1, v1, o, Tensor{}),
                       doctest::Contains("learning-rate scale -0.5"), Error);
  o.decay_runs = {{5, 0.f}, {n - 1, 0.1f}};
  CHECK_THROWS_WITH_AS(ops::adamw_step(p1, g, m1, v1, o, Tensor{}),
                       doctest::Contains("the decay runs end at 19999, the buffer at 20000"), Error);
}
