// Gated DeltaNet reference ops (csrc/ref/delta.cpp): the forward against the delta rule written
// out here in its transition form, S[t] = exp(g) (I - beta k^ k^^T) S[t-1] + beta k^ v^T with
// explicit matrices (another arrangement of the same rule than the op's); every gradient of the
// rule and of the per-head gated norm against fp64 central differences; key heads shared by
// several value heads; column blocks touching only their columns; argument checks. Documents of
// odd lengths, of length 1 and empty.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/delta.h"
#include "tests/common/gradcheck.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;
using ops::ColumnBlock;

namespace {

struct DeltaCase {
  const char* name;
  std::vector<int32_t> docs;
  int64_t hk, hv, dk, dv;
};
const std::vector<DeltaCase> kCases = {
    {"docs 1,4,3 one head", {1, 4, 3}, 1, 1, 3, 2},
    {"one doc 6, 2 value heads a key head", {6}, 1, 2, 2, 3},
    {"docs 3,0,4, 2 key heads x 2", {3, 0, 4}, 2, 4, 2, 2},
};

// q, k, v in one (T, 1 + 2 Hk dk + Hv dv) buffer after a padding column; b, a in (T, 2 Hv + 1)
// from column 1.
struct DeltaInputs {
  DeltaCase c;
  int64_t t = 0;
  Owned qkv, ba, alog, bias, cu;
  int64_t width() const { return 1 + 2 * c.hk * c.dk + c.hv * c.dv; }
  ops::DeltaArgs args() const {
    ops::DeltaArgs a;
    const int64_t qk = c.hk * c.dk;
    a.q = ColumnBlock(qkv, 1, qk);
    a.k = ColumnBlock(qkv, 1 + qk, qk);
    a.v = ColumnBlock(qkv, 1 + 2 * qk, c.hv * c.dv);
    a.b = ColumnBlock(ba, 1, c.hv);
    a.a = ColumnBlock(ba, 1 + c.hv, c.hv);
    a.A_log = alog;
    a.dt_bias = bias;
    a.cu_seqlens = cu;
    a.key_heads = c.hk;
    return a;
  }
};

DeltaInputs delta_inputs(const DeltaCase& c) {
  DeltaInputs in;
  in.c = c;
  for (int32_t l : c.docs) in.t += l;
  in.qkv = randn({in.t, in.width()}, DType::F64, "gdn.qkv");
  in.ba = randn({in.t, 2 * c.hv + 1}, DType::F64, "gdn.ba");
  in.alog = randn({c.hv}, DType::F64, "gdn.alog", 0.5);
  in.bias = randn({c.hv}, DType::F64, "gdn.bias", 0.5);
  in.cu = cu_from(c.docs);
  return in;
}

using Matrix = std::vector<std::vector<double>>;

// The transition form over the whole batch, the state reset at document starts.
Owned delta_naive(const DeltaInputs& in) {
  const DeltaCase& c = in.c;
  const int64_t T = in.t, w = in.width(), qk = c.hk * c.dk;
  Owned out = zeros({T, c.hv * c.dv}, DType::F64, Device::CPU);
  std::vector<bool> start(static_cast<size_t>(T), false);
  for (int64_t s = 0; s + 1 < in.cu->numel(); ++s)
    if (in.cu.ptr<int32_t>()[s] < T) start[static_cast<size_t>(in.cu.ptr<int32_t>()[s])] = true;
  auto unit = [&](int64_t t, int64_t col0, int64_t d, double scale) {
    std::vector<double> x(static_cast<size_t>(d));
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += std::pow(get(in.qkv, t * w + col0 + j), 2);
    for (int64_t j = 0; j < d; ++j) x[static_cast<size_t>(j)] = get(in.qkv, t * w + col0 + j) / std::sqrt(ss + 1e-6) * scale;
    return x;
  };
  for (int64_t h = 0; h < c.hv; ++h) {
    const int64_t kh = h / (c.hv / c.hk);
    Matrix S(static_cast<size_t>(c.dk), std::vector<double>(static_cast<size_t>(c.dv), 0.0));
    for (int64_t t = 0; t < T; ++t) {
      if (start[static_cast<size_t>(t)]) S.assign(static_cast<size_t>(c.dk), std::vector<double>(static_cast<size_t>(c.dv), 0.0));
      const auto q = unit(t, 1 + kh * c.dk, c.dk, 1 / std::sqrt(static_cast<double>(c.dk)));
      const auto k = unit(t, 1 + qk + kh * c.dk, c.dk, 1.0);
      const double beta = 1 / (1 + std::exp(-get(in.ba, t * (2 * c.hv + 1) + 1 + h)));
      const double pre = get(in.ba, t * (2 * c.hv + 1) + 1 + c.hv + h) + get(in.bias, h);
      const double g = -std::exp(get(in.alog, h)) * std::log1p(std::exp(pre));
      // M = I - beta k k^T; S = exp(g) M S + beta k v^T
      Matrix next(S.size(), std::vector<double>(static_cast<size_t>(c.dv), 0.0));
      for (int64_t i = 0; i < c.dk; ++i)
        for (int64_t j = 0; j < c.dv; ++j) {
          double ms = 0;
          for (int64_t r = 0; r < c.dk; ++r)
            ms += ((i == r ? 1.0 : 0.0) - beta * k[static_cast<size_t>(i)] * k[static_cast<size_t>(r)]) *
                  S[static_cast<size_t>(r)][static_cast<size_t>(j)];
          next[static_cast<size_t>(i)][static_cast<size_t>(j)] =
              std::exp(g) * ms + beta * k[static_cast<size_t>(i)] * get(in.qkv, t * w + 1 + 2 * qk + h * c.dv + j);
        }
      S = next;
      for (int64_t j = 0; j < c.dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < c.dk; ++i) o += S[static_cast<size_t>(i)][static_cast<size_t>(j)] * q[static_cast<size_t>(i)];
        set(out, t * c.hv * c.dv + h * c.dv + j, o);
      }
    }
  }
  return out;
}

struct Grads {
  Owned dqkv, dba, dalog, dbias;
  ops::DeltaGrads grads(const DeltaInputs& in) const {
    const int64_t qk = in.c.hk * in.c.dk;
    return {ColumnBlock(dqkv, 1, qk), ColumnBlock(dqkv, 1 + qk, qk), ColumnBlock(dqkv, 1 + 2 * qk, in.c.hv * in.c.dv),
            ColumnBlock(dba, 1 + in.c.hv, in.c.hv), ColumnBlock(dba, 1, in.c.hv), dalog, dbias};
  }
};

}  // namespace

TEST_CASE("gated delta rule forward matches the transition form (I - beta k k^T)") {
  for (const DeltaCase& c : kCases) {
    SUBCASE(c.name) {
      DeltaInputs in = delta_inputs(c);
      const int64_t vw = c.hv * c.dv;
      Owned obase = empty({in.t, vw + 1}, DType::F64, Device::CPU);
      poison(obase);
      ops::gated_delta_forward(in.args(), ColumnBlock(obase, 1, vw));
      Owned o = zeros({in.t, vw}, DType::F64, Device::CPU);
      bool col0_untouched = true;
      for (int64_t t = 0; t < in.t; ++t) {
        for (int64_t j = 0; j < vw; ++j) set(o, t * vw + j, get(obase, t * (vw + 1) + 1 + j));
        col0_untouched = col0_untouched && std::isnan(get(obase, t * (vw + 1)));
      }
      CHECK_CLOSE(o.t, delta_naive(in).t, 1e-12);
      CHECK(col0_untouched);
    }
  }
}

TEST_CASE("gated delta rule backward matches fp64 finite differences (every input)") {
  for (const DeltaCase& c : kCases) {
    SUBCASE(c.name) {
      DeltaInputs in = delta_inputs(c);
      const int64_t vw = c.hv * c.dv;
      Owned r = randn({in.t, vw}, DType::F64, "gdn.r"), o = empty({in.t, vw}, DType::F64, Device::CPU);
      auto loss = [&] {
        ops::gated_delta_forward(in.args(), o);
        return projection(o, r);
      };
      Grads g{zeros(in.qkv->shape, DType::F64, Device::CPU), zeros(in.ba->shape, DType::F64, Device::CPU),
              zeros({c.hv}, DType::F64, Device::CPU), zeros({c.hv}, DType::F64, Device::CPU)};
      ops::gated_delta_backward(in.args(), r, g.grads(in));
      struct Item {
        const char* what;
        const Tensor& theta;
        const Tensor& analytic;
      };
      for (const Item& it : {Item{"dq dk dv", in.qkv, g.dqkv}, Item{"da db", in.ba, g.dba},
                             Item{"dA_log", in.alog, g.dalog}, Item{"ddt_bias", in.bias, g.dbias}}) {
        auto cmp = finite_difference_check(loss, it.theta, it.analytic, std::string("gated delta ") + it.what);
        INFO(it.what, ": ", cmp.report);
        CHECK(cmp.rel_rms < kGradTol);
      }
      for (int64_t t = 0; t < in.t; ++t) {  // the padding columns keep their zeros
        CHECK(get(g.dqkv, t * in.width()) == 0.0);
        CHECK(get(g.dba, t * (2 * c.hv + 1)) == 0.0);
      }
      // Parameter gradients accumulate; activation gradients are written.
      Grads again{clone(g.dqkv), clone(g.dba), clone(g.dalog), clone(g.dbias)};
      ops::gated_delta_backward(in.args(), r, again.grads(in));
      CHECK_CLOSE(again.dqkv.t, g.dqkv.t, 0.0);
      for (int64_t h = 0; h < c.hv; ++h) CHECK(get(again.dalog, h) == doctest::Approx(2 * get(g.dalog, h)).epsilon(1e-12));
    }
  }
}

TEST_CASE("per-head gated rmsnorm (norm before gate): the formula and fp64 gradients") {
  const int64_t T = 4, heads = 3, d = 5, W = heads * d;
  const float eps = 1e-3f;
  Owned ybase = randn({T, W + 1}, DType::F64, "hn.y"), z = randn({T, W}, DType::F64, "hn.z"),
        w = randn({d}, DType::F64, "hn.w");
  const ColumnBlock y(ybase, 1, W);
  Owned out = empty({T, W}, DType::F64, Device::CPU), rstd = empty({T, heads}, DType::F64, Device::CPU);
  ops::head_rmsnorm_gated_forward(y, z, w, eps, out, rstd);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += std::pow(get(ybase, t * (W + 1) + 1 + h * d + i), 2);
      const double r = 1 / std::sqrt(ss / d + eps);
      for (int64_t i = 0; i < d; ++i) {
        const double zi = get(z, t * W + h * d + i);
        CHECK(get(out, t * W + h * d + i) ==
              doctest::Approx(get(w, i) * get(ybase, t * (W + 1) + 1 + h * d + i) * r * zi / (1 + std::exp(-zi)))
                  .epsilon(1e-12));
      }
    }
  Owned r = randn({T, W}, DType::F64, "hn.r");
  Owned dybase = zeros(ybase->shape, DType::F64, Device::CPU), dz = zeros({T, W}, DType::F64, Device::CPU),
        dw = zeros({d}, DType::F64, Device::CPU);
  ops::head_rmsnorm_gated_backward(r, y, z, w, rstd, ColumnBlock(dybase, 1, W), dz, dw);
  auto loss = [&] {
    ops::head_rmsnorm_gated_forward(y, z, w, eps, out, rstd);
    return projection(out, r);
  };
  struct Item {
    const char* what;
    const Tensor& theta;
    const Tensor& analytic;
  };
  for (const Item& it : {Item{"dy", ybase, dybase}, Item{"dz", z, dz}, Item{"dweight", w, dw}}) {
    auto cmp = finite_difference_check(loss, it.theta, it.analytic, std::string("head norm ") + it.what);
    INFO(it.what, ": ", cmp.report);
    CHECK(cmp.rel_rms < kGradTol);
  }
  CHECK_THROWS_WITH_AS(ops::head_rmsnorm_gated_forward(ColumnBlock(ybase, 1, W - 1), ColumnBlock(z, 0, W - 1), w, eps,
                                                       ColumnBlock(out, 0, W - 1), rstd),
                       doctest::Contains("whole heads"), Error);
}

TEST_CASE("gated delta rule refuses what it cannot compute, naming the argument") {
  DeltaInputs in = delta_inputs(kCases[2]);
  Owned o = empty({in.t, in.c.hv * in.c.dv}, DType::F64, Device::CPU);
  ops::DeltaArgs a = in.args();
  a.key_heads = 3;  // 4 value heads
  CHECK_THROWS_WITH_AS(ops::gated_delta_forward(a, o), doctest::Contains("key heads"), Error);
  a = in.args();
  a.b = ColumnBlock(in.ba, 0, in.c.hv + 1);
  CHECK_THROWS_WITH_AS(ops::gated_delta_forward(a, o), doctest::Contains("b has"), Error);
}
