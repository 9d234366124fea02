// Cross-entropy: losses against log-softmax written out here (masked rows give 0 and a zero
// gradient row, their labels are never read), the in-place gradient against fp64 finite
// differences of grad_scale * sum(losses), shift invariance at huge logits, f32 vs f64, checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/elementwise.h"
#include "ops/loss.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

struct LossCase {
  int64_t t, vocab;
  std::string name() const { return "T" + std::to_string(t) + " V" + std::to_string(vocab); }
};
const std::vector<LossCase> kLossCases = {{1, 5}, {7, 11}, {13, 67}, {4, 1}, {6, 3}};

struct Batch {
  Owned logits, labels, mask;
};

// Every third row masked (and given an invalid label, which must be ignored).
Batch make_batch(const LossCase& c, DType dt, double std = 3.0) {
  Batch b{randn({c.t, c.vocab}, dt, "ce.logits", std), randint({c.t}, 0, c.vocab, "ce.labels"),
          empty({c.t}, DType::U8, Device::CPU)};
  for (int64_t t = 0; t < c.t; ++t) {
    b.mask.ptr<uint8_t>()[t] = t % 3 != 1;
    if (t % 3 == 1) b.labels.ptr<int32_t>()[t] = t % 2 ? -7 : static_cast<int32_t>(c.vocab + 3);
  }
  return b;
}

Owned losses_of(const Batch& b, const Tensor& logits, bool with_grad, float scale) {
  Owned losses = empty({logits.size(0)}, logits.dtype, Device::CPU);
  poison(losses);
  ops::cross_entropy(logits, b.labels, b.mask, losses, with_grad, scale, 0.f, 0.f, 0);
  return losses;
}

}  // namespace

TEST_CASE("cross_entropy losses match log-softmax by hand, masked rows give 0") {
  for (const LossCase& c : kLossCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Batch b = make_batch(c, dt);
        Owned ref = empty({c.t}, DType::F64, Device::CPU);
        for (int64_t t = 0; t < c.t;
             ++t) {  // -log_softmax(x)[label] = log sum exp(x - m) - (x_label - m)
          double m = -INFINITY, z = 0;
          for (int64_t v = 0; v < c.vocab; ++v) m = std::max(m, get(b.logits, t * c.vocab + v));
          for (int64_t v = 0; v < c.vocab; ++v) z += std::exp(get(b.logits, t * c.vocab + v) - m);
          const int32_t label = b.labels.ptr<int32_t>()[t];
          const double logp = get(b.logits, t * c.vocab + label) - m - std::log(z);
          ref.ptr<double>()[t] = b.mask.ptr<uint8_t>()[t] ? -logp : 0.0;
        }
        // f64: a small loss is a difference of O(1) terms, so its relative error can reach a few
        // ulps of those terms divided by the loss (one row with a loss of ~1e-4: ~1e-12).
        CHECK_CLOSE(losses_of(b, b.logits, false, 1.f).t, ref.t, dt == DType::F64 ? 1e-10 : 1e-6);
      }
    }
  }
}

TEST_CASE("cross_entropy gradient (in place) matches fp64 finite differences of the scaled loss") {
  for (const LossCase& c : kLossCases) {
    SUBCASE(c.name().c_str()) {
      const float scale = 0.37f;
      Batch b = make_batch(c, DType::F64);
      Owned no_grad = losses_of(b, b.logits, false, scale);
      Owned grad = clone(b.logits);
      Owned with_grad = losses_of(b, grad, true, scale);
      CHECK(bitwise_equal(with_grad, no_grad));
      auto loss = [&] { return scale * sum_all(losses_of(b, b.logits, false, scale)); };
      CHECK_CLOSE(grad.t, numeric_grad(b.logits, loss).t, kGradTol);
      for (int64_t t = 1; t < c.t; t += 3)
        for (int64_t v = 0; v < c.vocab; ++v) CHECK(get(grad, t * c.vocab + v) == 0.0);
    }
  }
}

TEST_CASE("cross_entropy is stable at huge logits (shift invariance)") {
  const LossCase c{9, 50};
  Batch b = make_batch(c, DType::F64);
  Owned shifted = clone(b.logits);
  for (int64_t i = 0; i < shifted->numel(); ++i) set(shifted, i, get(shifted, i) + 1000.0);
  CHECK_CLOSE(losses_of(b, shifted, false, 1.f).t, losses_of(b, b.logits, false, 1.f).t, 1e-12);
  Owned g1 = clone(b.logits), g2 = clone(shifted);
  losses_of(b, g1, true, 1.f);
  losses_of(b, g2, true, 1.f);
  CHECK_CLOSE(g2.t, g1.t, 1e-10);
}

TEST_CASE("cross_entropy f32 agrees with f64") {
  const LossCase c{11, 301};
  Batch b32 = make_batch(c, DType::F32);
  Owned l64 = converted(b32.logits, DType::F64), g32 = clone(b32.logits), g64 = clone(l64);
  CHECK_CLOSE(losses_of(b32, b32.logits, false, 1.f).t, losses_of(b32, l64, false, 1.f).t, 1e-6);
  losses_of(b32, g32, true, 0.5f);
  losses_of(b32, g64, true, 0.5f);
  CHECK_CLOSE(g32.t, g64.t, 1e-6);
}

TEST_CASE("cross_entropy rejects an out-of-range label where the mask is set, and bad shapes") {
  Batch b = make_batch({5, 7}, DType::F32);
  b.labels.ptr<int32_t>()[2] = 7;
  Owned losses = empty({5}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(b.logits, b.labels, b.mask, losses, false, 1.f, 0.f, 0.f,
                                          0),
                       doctest::Contains("labels[2] = 7"), Error);
  b.labels.ptr<int32_t>()[2] = 0;
  Owned losses64 = empty({5}, DType::F64, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(b.logits, b.labels, b.mask, losses64, false, 1.f,
                                          0.f, 0.f, 0),
                       doctest::Contains("losses is f64"), Error);
  Owned mask_i32 = empty({5}, DType::I32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(b.logits, b.labels, mask_i32, losses, false, 1.f,
                                          0.f, 0.f, 0),
                       doctest::Contains("mask is i32"), Error);
}

// ---- z-loss and label smoothing: the loss written out from its definition (cross-entropy
// against (1 - eps) onehot + eps / V, plus z lse^2), the gradient against fp64 finite
// differences, and the plain op as the z = eps = 0 case.

namespace {

struct Reg {
  float z, eps;
  std::string name() const { return "z " + std::to_string(z) + " eps " + std::to_string(eps); }
};
const std::vector<Reg> kRegs = {{0.f, 0.f}, {1e-2f, 0.f}, {0.f, 0.1f}, {0.3f, 0.25f}};

Owned reg_losses(const Batch& b, const Tensor& logits, bool with_grad, float scale, Reg reg) {
  Owned losses = empty({logits.size(0)}, logits.dtype, Device::CPU);
  poison(losses);
  ops::cross_entropy(logits, b.labels, b.mask, losses, with_grad, scale, reg.z, reg.eps, 0);
  return losses;
}

}  // namespace

TEST_CASE("cross_entropy with z-loss and label smoothing: losses from the definition") {
  for (const LossCase& c : kLossCases) {
    SUBCASE(c.name().c_str()) {
      for (const Reg& reg : kRegs) {
        INFO(reg.name());
        Batch b = make_batch(c, DType::F64, 4.0);
        Owned ref = empty({c.t}, DType::F64, Device::CPU);
        for (int64_t t = 0; t < c.t; ++t) {
          if (!b.mask.ptr<uint8_t>()[t]) {
            ref.ptr<double>()[t] = 0;
            continue;
          }
          double m = -INFINITY, z = 0;
          for (int64_t v = 0; v < c.vocab; ++v) m = std::max(m, get(b.logits, t * c.vocab + v));
          for (int64_t v = 0; v < c.vocab; ++v) z += std::exp(get(b.logits, t * c.vocab + v) - m);
          const double lse = m + std::log(z);
          const int32_t label = b.labels.ptr<int32_t>()[t];
          double loss = 0;  // -sum_v target_v log softmax_v
          for (int64_t v = 0; v < c.vocab; ++v) {
            const double eps = reg.eps;
            const double target =
                (v == label ? 1.0 - eps : 0.0) + eps / static_cast<double>(c.vocab);
            loss -= target * (get(b.logits, t * c.vocab + v) - lse);
          }
          ref.ptr<double>()[t] = loss + reg.z * lse * lse;
        }
        CHECK_CLOSE(reg_losses(b, b.logits, false, 1.f, reg).t, ref.t, 1e-12);
      }
    }
  }
}

TEST_CASE("cross_entropy with z-loss and label smoothing: gradient vs fp64 finite differences") {
  for (const LossCase& c : kLossCases) {
    SUBCASE(c.name().c_str()) {
      for (const Reg& reg : kRegs) {
        for (double std : {0.1, 6.0}) {
          INFO(reg.name(), " logit std ", std);
          const float scale = 0.37f;
          Batch b = make_batch(c, DType::F64, std);
          Owned grad = clone(b.logits);
          Owned with_grad = reg_losses(b, grad, true, scale, reg);
          CHECK(bitwise_equal(with_grad, reg_losses(b, b.logits, false, scale, reg)));
          auto loss = [&] { return scale * sum_all(reg_losses(b, b.logits, false, scale, reg)); };
          // Relative to the gradient's scale, with a floor: at V = 1 and z = 0 the gradient is
          // exactly 0 and the differences are rounding noise of ~1e-12.
          const Comparison cmp = compare(grad, numeric_grad(b.logits, loss), "gradient");
          INFO(cmp.report);
          CHECK(cmp.nonfinite == 0);
          CHECK(cmp.rel_rms * cmp.scale <= kGradTol * std::max(cmp.scale, 1e-4));
          for (int64_t t = 1; t < c.t; t += 3)
            for (int64_t v = 0; v < c.vocab; ++v) CHECK(get(grad, t * c.vocab + v) == 0.0);
        }
      }
    }
  }
}

TEST_CASE("cross_entropy rejects a non-finite z_loss and label smoothing outside [0, 1]") {
  Batch b = make_batch({5, 7}, DType::F32);
  Owned losses = empty({5}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(
      ops::cross_entropy(b.logits, b.labels, b.mask, losses, false, 1.f, 0.f, 1.5f, 0),
      doctest::Contains("label_smoothing = 1.5 outside [0, 1]"), Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(b.logits, b.labels, b.mask, losses, false, 1.f, NAN, 0.f,
                                          0),
                       doctest::Contains("z_loss = nan is not finite"), Error);
}

TEST_CASE("cross_entropy over padded rows (columns < width): the same losses and gradient, padding untouched") {
  const int64_t t = 9, v = 7, w = 8;
  for (float eps : {0.f, 0.1f}) {
    Owned pad = randn({t, w}, DType::F64, "ce.pad", 2.0);
    for (int64_t r = 0; r < t; ++r) pad.ptr<double>()[r * w + v] = NAN;  // never read or written
    Owned compact = empty({t, v}, DType::F64, Device::CPU);
    ops::copy_columns(pad, 0, compact, 0, v, false);
    Owned labels = randint({t}, 0, v, "ce.pad.labels");
    Owned mask = empty({t}, DType::U8, Device::CPU);
    for (int64_t r = 0; r < t; ++r) mask.ptr<uint8_t>()[r] = r != 4;
    Owned l1 = empty({t}, DType::F64, Device::CPU), l2 = empty({t}, DType::F64, Device::CPU);
    ops::cross_entropy(pad, labels, mask, l1, true, 0.5f, 1e-3f, eps, v);
    ops::cross_entropy(compact, labels, mask, l2, true, 0.5f, 1e-3f, eps, 0);
    CHECK(bitwise_equal(l1, l2));
    for (int64_t r = 0; r < t; ++r) {
      CHECK(std::isnan(pad.ptr<double>()[r * w + v]));
      for (int64_t c = 0; c < v; ++c) CHECK(pad.ptr<double>()[r * w + c] == compact.ptr<double>()[r * v + c]);
    }
  }
  Owned x = randn({2, 4}, DType::F64, "ce.pad.bad");
  Owned labels = randint({2}, 0, 3, "ce.pad.bad.labels"), mask = empty({2}, DType::U8, Device::CPU);
  Owned l = empty({2}, DType::F64, Device::CPU);
  CHECK_THROWS_WITH(ops::cross_entropy(x, labels, mask, l, false, 1.f, 0.f, 0.f, 5), doctest::Contains("columns = 5"));
}
