// Mamba-2 reference ops (csrc/ref/ssd.cpp): the scan's forward against the quadratic (attention)
// form of the state space written out here, y[t] = D x[t] + sum_{s <= t, same document}
// (C[t] . B[s]) exp(A sum_{s < r <= t} delta[r]) delta[s] x[s] (outputs and chunk states); every
// gradient of the scan and of the gated RMSNorm against fp64 central differences, the delta clamp
// included; the norm split in two column shares equal to the whole row; column blocks touching
// only their columns; argument checks. Documents of odd lengths, of length 1 and empty, chunks
// that straddle documents, several groups.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/ssd.h"
#include "tests/common/gradcheck.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;
using ops::ColumnBlock;

namespace {

// f throws an error whose message holds every piece.
void check_error(const std::string& message, const std::vector<std::string>& pieces) {
  CHECK(!message.empty());
  for (const std::string& p : pieces) {
    INFO("message: ", message, "; missing: ", p);
    CHECK(message.find(p) != std::string::npos);
  }
}

struct SsdCase {
  const char* name;
  std::vector<int32_t> docs;
  int64_t heads, p, groups, n, chunk;
  double dt_min = 0, dt_max = 0;
};
const std::vector<SsdCase> kCases = {
    {"docs 1,4,6,2 one group chunk 3", {1, 4, 6, 2}, 2, 3, 1, 4, 3},
    {"one doc 7, 4 heads in 2 groups", {7}, 4, 2, 2, 3, 4},
    {"docs 3,0,5, heads = groups", {3, 0, 5}, 3, 2, 3, 2, 2},
    {"clamped delta", {5, 4}, 2, 2, 1, 3, 4, 0.3, 0.9},
};

// x, B, C in one (T, 1 + H P + 2 G N) buffer after a padding column; dt in (T, H + 2) at column 1.
struct SsdInputs {
  SsdCase c;
  int64_t t = 0;
  Owned xbc, dtbase, alog, D, bias, cu;
  int64_t width() const { return 1 + c.heads * c.p + 2 * c.groups * c.n; }
  ops::SsdArgs args() const {
    ops::SsdArgs a;
    const int64_t hp = c.heads * c.p, gn = c.groups * c.n;
    a.x = ColumnBlock(xbc, 1, hp);
    a.B = ColumnBlock(xbc, 1 + hp, gn);
    a.C = ColumnBlock(xbc, 1 + hp + gn, gn);
    a.dt = ColumnBlock(dtbase, 1, c.heads);
    a.A_log = alog;
    a.D = D;
    a.dt_bias = bias;
    a.cu_seqlens = cu;
    a.head_dim = c.p;
    a.groups = c.groups;
    a.dt_min = c.dt_min;
    a.dt_max = c.dt_max;
    a.chunk_len = c.chunk;
    return a;
  }
  Owned states(DType dtype) const {
    return empty({ops::scan_num_chunks(t, c.chunk), c.heads, c.p, c.n}, dtype, Device::CPU);
  }
};

SsdInputs ssd_inputs(const SsdCase& c, DType dtype) {
  SsdInputs in;
  in.c = c;
  for (int32_t l : c.docs) in.t += l;
  in.xbc = randn({in.t, in.width()}, dtype, "ssd.xbc");
  in.dtbase = randn({in.t, c.heads + 2}, dtype, "ssd.dt");
  in.alog = randn({c.heads}, dtype, "ssd.alog", 0.5);
  in.D = randn({c.heads}, dtype, "ssd.D");
  in.bias = randn({c.heads}, dtype, "ssd.bias", 0.5);
  in.cu = cu_from(c.docs);
  return in;
}

struct Naive {
  Owned y, states;
};

// The quadratic form (see the top), and the state S[t] = sum_s exp(A sum delta) delta x[s] B[s]^T
// after the last token of every chunk but the last.
Naive ssd_naive(const SsdInputs& in) {
  const SsdCase& c = in.c;
  const int64_t T = in.t, hp = c.heads * c.p, gn = c.groups * c.n, w = in.width();
  Naive out{zeros({T, hp}, DType::F64, Device::CPU),
            zeros({ops::scan_num_chunks(T, c.chunk), c.heads, c.p, c.n}, DType::F64, Device::CPU)};
  std::vector<int64_t> doc_start(static_cast<size_t>(T));
  for (int64_t s = 0; s + 1 < in.cu->numel(); ++s)
    for (int32_t t = in.cu.ptr<int32_t>()[s]; t < in.cu.ptr<int32_t>()[s + 1]; ++t)
      doc_start[static_cast<size_t>(t)] = in.cu.ptr<int32_t>()[s];
  auto x = [&](int64_t t, int64_t h, int64_t p) { return get(in.xbc, t * w + 1 + h * c.p + p); };
  auto B = [&](int64_t t, int64_t g, int64_t n) { return get(in.xbc, t * w + 1 + hp + g * c.n + n); };
  auto C = [&](int64_t t, int64_t g, int64_t n) { return get(in.xbc, t * w + 1 + hp + gn + g * c.n + n); };
  for (int64_t h = 0; h < c.heads; ++h) {
    const int64_t g = h / (c.heads / c.groups);
    const double A = -std::exp(get(in.alog, h));
    std::vector<double> delta(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      double d = std::log1p(std::exp(get(in.dtbase, t * (c.heads + 2) + 1 + h) + get(in.bias, h)));
      if (d < c.dt_min) d = c.dt_min;
      if (c.dt_max > 0 && d > c.dt_max) d = c.dt_max;
      delta[static_cast<size_t>(t)] = d;
    }
    for (int64_t t = 0; t < T; ++t) {
      const bool boundary = (t + 1) % c.chunk == 0 && t + 1 < T;
      for (int64_t p = 0; p < c.p; ++p) {
        double y = get(in.D, h) * x(t, h, p);
        for (int64_t s = doc_start[static_cast<size_t>(t)]; s <= t; ++s) {
          double decay_sum = 0;
          for (int64_t r = s + 1; r <= t; ++r) decay_sum += delta[static_cast<size_t>(r)];
          const double weight = std::exp(A * decay_sum) * delta[static_cast<size_t>(s)] * x(s, h, p);
          double cb = 0;
          for (int64_t n = 0; n < c.n; ++n) {
            cb += C(t, g, n) * B(s, g, n);
            if (boundary) {
              const int64_t i = (((t + 1) / c.chunk * c.heads + h) * c.p + p) * c.n + n;
              set(out.states, i, get(out.states, i) + weight * B(s, g, n));
            }
          }
          y += cb * weight;
        }
        set(out.y, t * hp + p + h * c.p, y);
      }
    }
  }
  return out;
}

struct Grads {
  Owned dxbc, ddtbase, dalog, dD, dbias;
  ops::SsdGrads grads(const SsdInputs& in) const {
    const int64_t hp = in.c.heads * in.c.p, gn = in.c.groups * in.c.n;
    return {ColumnBlock(dxbc, 1, hp),      ColumnBlock(ddtbase, 1, in.c.heads), ColumnBlock(dxbc, 1 + hp, gn),
            ColumnBlock(dxbc, 1 + hp + gn, gn), dalog, dD, dbias};
  }
};

Grads ssd_backward(const SsdInputs& in, const Tensor& dy) {
  Grads g{zeros(in.xbc->shape, DType::F64, Device::CPU), zeros(in.dtbase->shape, DType::F64, Device::CPU),
          zeros({in.c.heads}, DType::F64, Device::CPU), zeros({in.c.heads}, DType::F64, Device::CPU),
          zeros({in.c.heads}, DType::F64, Device::CPU)};
  Owned states = in.states(DType::F64), y = empty({in.t, in.c.heads * in.c.p}, DType::F64, Device::CPU);
  ops::ssd_scan_forward(in.args(), y, states);
  ops::ssd_scan_backward(in.args(), dy, states, g.grads(in));
  return g;
}

}  // namespace

TEST_CASE("mamba2 ssd scan forward matches the quadratic form (outputs and chunk states)") {
  for (const SsdCase& c : kCases) {
    SUBCASE(c.name) {
      SsdInputs in = ssd_inputs(c, DType::F64);
      Naive ref = ssd_naive(in);
      const int64_t hp = c.heads * c.p;
      Owned ybase = empty({in.t, hp + 1}, DType::F64, Device::CPU), states = in.states(DType::F64);
      poison(ybase);
      poison(states);
      ops::ssd_scan_forward(in.args(), ColumnBlock(ybase, 1, hp), states);
      Owned y = zeros({in.t, hp}, DType::F64, Device::CPU);
      bool col0_untouched = true;
      for (int64_t t = 0; t < in.t; ++t) {
        for (int64_t j = 0; j < hp; ++j) set(y, t * hp + j, get(ybase, t * (hp + 1) + 1 + j));
        col0_untouched = col0_untouched && std::isnan(get(ybase, t * (hp + 1)));
      }
      CHECK_CLOSE(y.t, ref.y.t, 1e-12);
      CHECK_CLOSE(states.t, ref.states.t, 1e-12);
      CHECK(col0_untouched);
    }
  }
}

TEST_CASE("mamba2 ssd scan backward matches fp64 finite differences (every input)") {
  for (const SsdCase& c : kCases) {
    SUBCASE(c.name) {
      SsdInputs in = ssd_inputs(c, DType::F64);
      const int64_t hp = c.heads * c.p;
      Owned r = randn({in.t, hp}, DType::F64, "ssd.r");
      Owned y = empty({in.t, hp}, DType::F64, Device::CPU), states = in.states(DType::F64);
      auto loss = [&] {
        ops::ssd_scan_forward(in.args(), y, states);
        return projection(y, r);
      };
      Grads g = ssd_backward(in, r);
      struct Item {
        const char* what;
        const Tensor& theta;
        const Tensor& analytic;
      };
      for (const Item& it : {Item{"dx dB dC", in.xbc, g.dxbc}, Item{"ddt", in.dtbase, g.ddtbase},
                             Item{"dA_log", in.alog, g.dalog}, Item{"dD", in.D, g.dD},
                             Item{"ddt_bias", in.bias, g.dbias}}) {
        auto cmp = finite_difference_check(loss, it.theta, it.analytic, std::string("ssd ") + it.what);
        INFO(it.what, ": ", cmp.report);
        CHECK(cmp.rel_rms < kGradTol);
      }
      // Columns outside the blocks keep their zeros (the padding column of x|B|C, dt's two).
      for (int64_t t = 0; t < in.t; ++t) {
        CHECK(get(g.dxbc, t * in.width()) == 0.0);
        CHECK(get(g.ddtbase, t * (c.heads + 2)) == 0.0);
        CHECK(get(g.ddtbase, t * (c.heads + 2) + c.heads + 1) == 0.0);
      }
    }
  }
}

TEST_CASE("mamba2 ssd scan: f32 follows f64, parameter gradients accumulate") {
  SsdInputs in = ssd_inputs(kCases[1], DType::F64);
  const int64_t hp = in.c.heads * in.c.p;
  Owned r = randn({in.t, hp}, DType::F64, "ssd.r");
  Grads once = ssd_backward(in, r);
  Grads twice{zeros(in.xbc->shape, DType::F64, Device::CPU), zeros(in.dtbase->shape, DType::F64, Device::CPU),
              clone(once.dalog), clone(once.dD), clone(once.dbias)};
  Owned states = in.states(DType::F64), y = empty({in.t, hp}, DType::F64, Device::CPU);
  ops::ssd_scan_forward(in.args(), y, states);
  ops::ssd_scan_backward(in.args(), r, states, twice.grads(in));
  for (int64_t h = 0; h < in.c.heads; ++h) {
    CHECK(get(twice.dalog, h) == doctest::Approx(2 * get(once.dalog, h)).epsilon(1e-12));
    CHECK(get(twice.dD, h) == doctest::Approx(2 * get(once.dD, h)).epsilon(1e-12));
    CHECK(get(twice.dbias, h) == doctest::Approx(2 * get(once.dbias, h)).epsilon(1e-12));
  }
  CHECK_CLOSE(twice.dxbc.t, once.dxbc.t, 0.0);  // activation gradients are written, not added
  // f32 inputs of the same values give the f64 result within f32 rounding.
  SsdInputs in32;
  in32.c = in.c;
  in32.t = in.t;
  in32.xbc = converted(in.xbc, DType::F32);
  in32.dtbase = converted(in.dtbase, DType::F32);
  in32.alog = converted(in.alog, DType::F32);
  in32.D = converted(in.D, DType::F32);
  in32.bias = converted(in.bias, DType::F32);
  in32.cu = clone(in.cu);
  Owned y32 = empty({in.t, hp}, DType::F32, Device::CPU), s32 = in32.states(DType::F32);
  ops::ssd_scan_forward(in32.args(), y32, s32);
  CHECK_CLOSE(converted(y32, DType::F64).t, y.t, 1e-5);
}

TEST_CASE("mamba2 ssd scan refuses what it cannot compute, naming the argument") {
  SsdInputs in = ssd_inputs(kCases[1], DType::F64);
  Owned y = empty({in.t, in.c.heads * in.c.p}, DType::F64, Device::CPU), states = in.states(DType::F64);
  ops::SsdArgs a = in.args();
  a.groups = 3;  // 4 heads
  check_error(error_of([&] { ops::ssd_scan_forward(a, y, states); }), {"ssd_scan_forward", "groups"});
  a = in.args();
  a.dt_min = 0.5, a.dt_max = 0.2;
  check_error(error_of([&] { ops::ssd_scan_forward(a, y, states); }), {"clamp", "0.5", "0.2"});
  Owned wrong = empty({1, in.c.heads, in.c.p, in.c.n}, DType::F64, Device::CPU);
  check_error(error_of([&] { ops::ssd_scan_forward(in.args(), y, wrong); }), {"chunk_states"});
}

namespace {

struct NormInputs {
  Owned ybase, zbase, w;  // y, z: columns [1, 1 + W) of (T, W + 2)
  int64_t t, width;
  ColumnBlock y(int64_t first = 0, int64_t n = -1) const { return {ybase, 1 + first, n < 0 ? width : n}; }
  ColumnBlock z(int64_t first = 0, int64_t n = -1) const { return {zbase, 1 + first, n < 0 ? width : n}; }
};

NormInputs norm_inputs(int64_t t, int64_t width, DType dtype) {
  return {randn({t, width + 2}, dtype, "gn.y"), randn({t, width + 2}, dtype, "gn.z"),
          randn({width}, dtype, "gn.w"), t, width};
}

// out = gated_rmsnorm(y, z) of the whole rows.
void gated_norm(const NormInputs& in, const Tensor& out, float eps) {
  Owned ss = empty({in.t}, in.ybase->dtype, Device::CPU);
  ops::gated_rmsnorm_sumsq(in.y(), in.z(), ss);
  ops::gated_rmsnorm_forward(in.y(), in.z(), in.w, ss, in.width, eps, out);
}

}  // namespace

TEST_CASE("mamba2 gated rmsnorm: the formula, fp64 gradients, and two column shares equal to the whole row") {
  const int64_t T = 5, W = 6;
  const float eps = 1e-3f;
  NormInputs in = norm_inputs(T, W, DType::F64);
  Owned out = empty({T, W}, DType::F64, Device::CPU);
  gated_norm(in, out, eps);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    std::vector<double> v(W);
    for (int64_t i = 0; i < W; ++i) {
      const double z = get(in.zbase, t * (W + 2) + 1 + i);
      v[static_cast<size_t>(i)] = get(in.ybase, t * (W + 2) + 1 + i) * z / (1 + std::exp(-z));
      ss += v[static_cast<size_t>(i)] * v[static_cast<size_t>(i)];
    }
    for (int64_t i = 0; i < W; ++i)
      CHECK(get(out, t * W + i) ==
            doctest::Approx(get(in.w, i) * v[static_cast<size_t>(i)] / std::sqrt(ss / W + eps)).epsilon(1e-12));
  }
  Owned r = randn({T, W}, DType::F64, "gn.r");
  Owned dybase = zeros(in.ybase->shape, DType::F64, Device::CPU), dzbase = zeros(in.zbase->shape, DType::F64, Device::CPU);
  Owned dw = zeros({W}, DType::F64, Device::CPU), ss = empty({T}, DType::F64, Device::CPU),
        dot = empty({T}, DType::F64, Device::CPU);
  ops::gated_rmsnorm_sumsq(in.y(), in.z(), ss);
  ops::gated_rmsnorm_dot(r, in.y(), in.z(), in.w, dot);
  ops::gated_rmsnorm_backward(r, in.y(), in.z(), in.w, ss, dot, W, eps, ColumnBlock(dybase, 1, W),
                              ColumnBlock(dzbase, 1, W), dw);
  auto loss = [&] {
    gated_norm(in, out, eps);
    return projection(out, r);
  };
  struct Item {
    const char* what;
    const Tensor& theta;
    const Tensor& analytic;
  };
  for (const Item& it : {Item{"dy", in.ybase, dybase}, Item{"dz", in.zbase, dzbase}, Item{"dweight", in.w, dw}}) {
    auto cmp = finite_difference_check(loss, it.theta, it.analytic, std::string("gated norm ") + it.what);
    INFO(it.what, ": ", cmp.report);
    CHECK(cmp.rel_rms < kGradTol);
  }
  // Two shares of 2 and 4 columns with their row sums added (what the tensor-parallel layer's
  // all-reduce does) give the whole row's output and gradients.
  Owned ss_a = empty({T}, DType::F64, Device::CPU), ss_b = empty({T}, DType::F64, Device::CPU);
  Owned out2 = empty({T, W}, DType::F64, Device::CPU), dot_a = empty({T}, DType::F64, Device::CPU),
        dot_b = empty({T}, DType::F64, Device::CPU);
  Owned dy2 = zeros({T, W}, DType::F64, Device::CPU), dz2 = zeros({T, W}, DType::F64, Device::CPU),
        dw2 = zeros({W}, DType::F64, Device::CPU);
  const int64_t cut = 2;
  ops::gated_rmsnorm_sumsq(in.y(0, cut), in.z(0, cut), ss_a);
  ops::gated_rmsnorm_sumsq(in.y(cut, W - cut), in.z(cut, W - cut), ss_b);
  for (int64_t t = 0; t < T; ++t) set(ss_a, t, get(ss_a, t) + get(ss_b, t));
  const Tensor w_a = in.w->slice(0, cut), w_b = in.w->slice(cut, W);
  ops::gated_rmsnorm_forward(in.y(0, cut), in.z(0, cut), w_a, ss_a, W, eps, ColumnBlock(out2, 0, cut));
  ops::gated_rmsnorm_forward(in.y(cut, W - cut), in.z(cut, W - cut), w_b, ss_a, W, eps, ColumnBlock(out2, cut, W - cut));
  gated_norm(in, out, eps);
  CHECK_CLOSE(out2.t, out.t, 1e-14);
  ops::gated_rmsnorm_dot(ColumnBlock(r, 0, cut), in.y(0, cut), in.z(0, cut), w_a, dot_a);
  ops::gated_rmsnorm_dot(ColumnBlock(r, cut, W - cut), in.y(cut, W - cut), in.z(cut, W - cut), w_b, dot_b);
  for (int64_t t = 0; t < T; ++t) set(dot_a, t, get(dot_a, t) + get(dot_b, t));
  ops::gated_rmsnorm_backward(ColumnBlock(r, 0, cut), in.y(0, cut), in.z(0, cut), w_a, ss_a, dot_a, W, eps,
                              ColumnBlock(dy2, 0, cut), ColumnBlock(dz2, 0, cut), dw2->slice(0, cut));
  ops::gated_rmsnorm_backward(ColumnBlock(r, cut, W - cut), in.y(cut, W - cut), in.z(cut, W - cut), w_b, ss_a, dot_a,
                              W, eps, ColumnBlock(dy2, cut, W - cut), ColumnBlock(dz2, cut, W - cut),
                              dw2->slice(cut, W));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < W; ++i) {
      CHECK(get(dy2, t * W + i) == doctest::Approx(get(dybase, t * (W + 2) + 1 + i)).epsilon(1e-12));
      CHECK(get(dz2, t * W + i) == doctest::Approx(get(dzbase, t * (W + 2) + 1 + i)).epsilon(1e-12));
    }
  CHECK_CLOSE(dw2.t, dw.t, 1e-13);
  check_error(error_of([&] { ops::gated_rmsnorm_forward(in.y(), in.z(), in.w, ss, W - 1, eps, out); }),
                 {"gated_rmsnorm_forward", "total_width"});
}
