// Mamba mixer reference ops (csrc/ref/mamba.cpp): the forward against a naive recurrence written
// out here (outputs and chunk_states), every gradient against fp64 central differences, packed
// documents equal to each document alone, column blocks touching only their columns, f32 vs f64,
// argument checks. Documents of odd lengths, of length 1 and empty, kernels longer than a
// document, chunks that straddle documents.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/mamba.h"
#include "tests/common/gradcheck.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;
using ops::ColumnBlock;

namespace {

int64_t total(const std::vector<int32_t>& lengths) {
  int64_t s = 0;
  for (int32_t l : lengths) s += l;
  return s;
}

Owned zeros_f64(Shape s) { return zeros(s, DType::F64, Device::CPU); }

// ---- causal conv1d ----

struct ConvCase {
  const char* name;
  std::vector<int32_t> docs;
  int64_t di, k;
  bool bias, silu;
};
const std::vector<ConvCase> kConvCases = {
    {"docs 1,2,7,3 K4 bias silu", {1, 2, 7, 3}, 5, 4, true, true},
    {"one doc 9 K3 no bias", {9}, 3, 3, false, true},
    {"docs 4,0,5 K4 linear", {4, 0, 5}, 4, 4, true, false},
    {"K1", {2, 3}, 6, 1, true, true},
    {"K6 > every doc", {2, 5, 1}, 2, 6, true, true},
};

struct ConvInputs {
  Owned xbase, w, b, cu;  // x: columns [1, 1 + di) of xbase (T, di + 3)
  int64_t t, di, k;
  ColumnBlock x() const { return {xbase, 1, di}; }
};

ConvInputs conv_inputs(const ConvCase& c, DType dtype) {
  ConvInputs in;
  in.t = total(c.docs), in.di = c.di, in.k = c.k;
  in.xbase = randn({in.t, c.di + 3}, dtype, "conv.x");
  in.w = randn({c.di, c.k}, dtype, "conv.w", 0.5);
  in.b = randn({c.di}, dtype, "conv.b", 0.5);
  in.cu = cu_from(c.docs);
  return in;
}

// The formula of ops/mamba.h, written out (no shared code with the reference).
double conv_naive(const ConvInputs& in, const ConvCase& c, int64_t t, int64_t d) {
  int64_t begin = 0;
  for (int64_t s = 0; s + 1 < in.cu->numel(); ++s)
    if (in.cu.ptr<int32_t>()[s] <= t) begin = in.cu.ptr<int32_t>()[s];
  double acc = c.bias ? get(in.b, d) : 0.0;
  for (int64_t j = 0; j < in.k; ++j) {
    const int64_t src = t - (in.k - 1) + j;
    if (src >= begin) acc += get(in.w, d * in.k + j) * get(in.xbase, src * (in.di + 3) + 1 + d);
  }
  return c.silu ? acc / (1 + std::exp(-acc)) : acc;
}

}  // namespace

TEST_CASE("mamba conv1d forward matches the causal formula per document") {
  for (const ConvCase& c : kConvCases) {
    SUBCASE(c.name) {
      ConvInputs in = conv_inputs(c, DType::F64);
      // y: columns [2, 2 + di) of a (T, di + 2) tensor; the other columns keep their poison.
      Owned ybase = empty({in.t, in.di + 2}, DType::F64, Device::CPU);
      poison(ybase);
      ops::causal_conv1d_forward(in.x(), in.w, c.bias ? in.b.t : Tensor(), in.cu, c.silu,
                                 ColumnBlock(ybase, 2, in.di));
      Owned ref = zeros_f64({in.t, in.di});
      Owned got = zeros_f64({in.t, in.di});
      bool others_untouched = true;
      for (int64_t t = 0; t < in.t; ++t) {
        for (int64_t d = 0; d < in.di; ++d) {
          set(ref, t * in.di + d, conv_naive(in, c, t, d));
          set(got, t * in.di + d, get(ybase, t * (in.di + 2) + 2 + d));
        }
        others_untouched = others_untouched && std::isnan(get(ybase, t * (in.di + 2))) &&
                           std::isnan(get(ybase, t * (in.di + 2) + 1));
      }
      CHECK_CLOSE(got.t, ref.t, 1e-14);
      CHECK(others_untouched);
    }
  }
}

TEST_CASE("mamba conv1d backward matches fp64 finite differences (x, weight, bias)") {
  for (const ConvCase& c : kConvCases) {
    SUBCASE(c.name) {
      ConvInputs in = conv_inputs(c, DType::F64);
      Owned r = randn({in.t, in.di}, DType::F64, "conv.r");
      Owned y = empty({in.t, in.di}, DType::F64, Device::CPU);
      const Tensor bias = c.bias ? in.b.t : Tensor();
      auto loss = [&] {
        ops::causal_conv1d_forward(in.x(), in.w, bias, in.cu, c.silu, y);
        return projection(y, r);
      };
      // dx lands in the same columns of a zeroed copy of x's shape, so the whole of xbase
      // (columns outside the block: gradient 0) is checked at once.
      Owned dxbase = zeros_f64(in.xbase->shape);
      Owned dw = randn({in.di, in.k}, DType::F64, "conv.dw0"), db = randn({in.di}, DType::F64, "conv.db0");
      Owned dw0 = clone(dw), db0 = clone(db);
      ops::causal_conv1d_backward(r, in.x(), in.w, bias, in.cu, c.silu, ColumnBlock(dxbase, 1, in.di),
                                  dw, c.bias ? db.t : Tensor());
      for (int64_t i = 0; i < dw->numel(); ++i) set(dw, i, get(dw, i) - get(dw0, i));  // += checked
      if (c.bias)
        for (int64_t i = 0; i < db->numel(); ++i) set(db, i, get(db, i) - get(db0, i));
      auto cx = finite_difference_check(loss, in.xbase, dxbase, "conv dx");
      INFO(cx.report);
      CHECK(cx.rel_rms < kGradTol);
      auto cw = finite_difference_check(loss, in.w, dw, "conv dweight");
      INFO(cw.report);
      CHECK(cw.rel_rms < kGradTol);
      if (c.bias) {
        auto cb = finite_difference_check(loss, in.b, db, "conv dbias");
        INFO(cb.report);
        CHECK(cb.rel_rms < kGradTol);
      } else {
        CHECK(bitwise_equal(db, db0));
      }
    }
  }
}

// ---- selective scan ----

namespace {

struct ScanCase {
  const char* name;
  std::vector<int32_t> docs;
  int64_t di, n, chunk;
};
const std::vector<ScanCase> kScanCases = {
    {"docs 1,4,7,2,9 chunk 4", {1, 4, 7, 2, 9}, 5, 3, 4},
    {"one doc 13 chunk 5", {13}, 3, 4, 5},
    {"length-1 docs chunk 1", {1, 1, 1}, 4, 2, 1},
    {"chunk longer than the batch", {3, 6}, 6, 5, 64},
    {"empty document, chunk 3", {4, 0, 5}, 2, 3, 3},
};

// x plain (T, Di); B, C: columns [1, 1 + N) and [1 + N, 1 + 2N) of bc (T, 2N + 1); z: columns
// [Di + 1, 2 Di + 1) of zbase (T, 2 Di + 1) (the gate half of an in_proj output, off by one).
struct ScanInputs {
  Owned x, dt, alog, bc, D, bias, zbase, cu;
  int64_t t, di, n, chunk;
  ops::ScanArgs args() const {
    ops::ScanArgs a;
    a.x = x;
    a.dt = dt;
    a.A_log = alog;
    a.B = ColumnBlock(bc, 1, n);
    a.C = ColumnBlock(bc, 1 + n, n);
    a.D = D;
    a.dt_bias = bias;
    a.z = ColumnBlock(zbase, di + 1, di);
    a.cu_seqlens = cu;
    a.chunk_len = chunk;
    return a;
  }
  Owned states() const { return empty({ops::scan_num_chunks(t, chunk), n, di}, x->dtype, Device::CPU); }
};

ScanInputs scan_inputs(const std::vector<int32_t>& docs, int64_t di, int64_t n, int64_t chunk,
                       DType dtype) {
  ScanInputs in;
  in.t = total(docs), in.di = di, in.n = n, in.chunk = chunk;
  in.x = randn({in.t, di}, dtype, "scan.x");
  in.dt = randn({in.t, di}, dtype, "scan.dt", 0.5);
  in.alog = randn({di, n}, dtype, "scan.alog", 0.1);
  for (int64_t d = 0; d < di; ++d)
    for (int64_t j = 0; j < n; ++j) set(in.alog, d * n + j, get(in.alog, d * n + j) + std::log(j + 1.0));
  in.bc = randn({in.t, 2 * n + 1}, dtype, "scan.bc");
  in.D = randn({di}, dtype, "scan.D");
  in.bias = randn({di}, dtype, "scan.bias", 0.5);
  for (int64_t d = 0; d < di; ++d) set(in.bias, d, get(in.bias, d) - 1.0);
  in.zbase = randn({in.t, 2 * di + 1}, dtype, "scan.z");
  in.cu = cu_from(docs);
  return in;
}

struct NaiveScan {
  Owned y, states;
};

// The recurrence of ops/mamba.h written out over the whole batch, states reset at document
// starts, the state after every token kept.
NaiveScan scan_naive(const ScanInputs& in) {
  const int64_t t_all = in.t, di = in.di, n = in.n, chunks = ops::scan_num_chunks(in.t, in.chunk);
  NaiveScan out{zeros_f64({t_all, di}), zeros_f64({chunks, n, di})};
  std::vector<bool> start(static_cast<size_t>(t_all), false);
  for (int64_t s = 0; s + 1 < in.cu->numel(); ++s)
    if (in.cu.ptr<int32_t>()[s] < t_all) start[static_cast<size_t>(in.cu.ptr<int32_t>()[s])] = true;
  auto B = [&](int64_t t, int64_t j) { return get(in.bc, t * (2 * n + 1) + 1 + j); };
  auto C = [&](int64_t t, int64_t j) { return get(in.bc, t * (2 * n + 1) + 1 + n + j); };
  for (int64_t d = 0; d < di; ++d) {
    std::vector<double> h(static_cast<size_t>(n), 0.0);
    for (int64_t t = 0; t < t_all; ++t) {
      if (start[static_cast<size_t>(t)]) std::fill(h.begin(), h.end(), 0.0);
      const double v = get(in.dt, t * di + d) + get(in.bias, d);
      const double delta = std::log(1 + std::exp(v));
      const double u = get(in.x, t * di + d);
      double acc = get(in.D, d) * u;
      for (int64_t j = 0; j < n; ++j) {
        const double a = -std::exp(get(in.alog, d * n + j));
        h[static_cast<size_t>(j)] = std::exp(delta * a) * h[static_cast<size_t>(j)] + delta * B(t, j) * u;
        acc += C(t, j) * h[static_cast<size_t>(j)];
      }
      const double z = get(in.zbase, t * (2 * di + 1) + di + 1 + d);
      set(out.y, t * di + d, acc * z / (1 + std::exp(-z)));
      if ((t + 1) % in.chunk == 0 && t + 1 < t_all)
        for (int64_t j = 0; j < n; ++j)
          set(out.states, ((t + 1) / in.chunk * n + j) * di + d, h[static_cast<size_t>(j)]);
    }
  }
  return out;
}

struct ScanGradsOwned {
  Owned dx, ddt, dbc, dzbase, dalog, dD, dbias;
  ops::ScanGrads grads(const ScanInputs& in) const {
    return {dx, ddt, ColumnBlock(dbc, 1, in.n), ColumnBlock(dbc, 1 + in.n, in.n),
            ColumnBlock(dzbase, in.di + 1, in.di), dalog, dD, dbias};
  }
};

// Activation gradients in zeroed tensors of the inputs' shapes (columns outside the blocks stay
// 0, the exact gradient there), parameter gradients from zero.
ScanGradsOwned scan_backward(const ScanInputs& in, const Tensor& dy, DType dtype) {
  ScanGradsOwned g{zeros(in.x->shape, dtype, Device::CPU),     zeros(in.dt->shape, dtype, Device::CPU),
                   zeros(in.bc->shape, dtype, Device::CPU),    zeros(in.zbase->shape, dtype, Device::CPU),
                   zeros(in.alog->shape, dtype, Device::CPU),  zeros(in.D->shape, dtype, Device::CPU),
                   zeros(in.bias->shape, dtype, Device::CPU)};
  Owned states = in.states(), y = empty({in.t, in.di}, dtype, Device::CPU);
  ops::selective_scan_forward(in.args(), y, states);
  ops::selective_scan_backward(in.args(), dy, states, g.grads(in));
  return g;
}

}  // namespace

TEST_CASE("mamba selective scan forward matches the recurrence (outputs and chunk states)") {
  for (const ScanCase& c : kScanCases) {
    SUBCASE(c.name) {
      ScanInputs in = scan_inputs(c.docs, c.di, c.n, c.chunk, DType::F64);
      NaiveScan ref = scan_naive(in);
      Owned ybase = empty({in.t, in.di + 1}, DType::F64, Device::CPU), states = in.states();
      poison(ybase);
      poison(states);
      ops::selective_scan_forward(in.args(), ColumnBlock(ybase, 1, in.di), states);
      Owned y = zeros_f64({in.t, in.di});
      bool col0_untouched = true;
      for (int64_t t = 0; t < in.t; ++t) {
        for (int64_t d = 0; d < in.di; ++d) set(y, t * in.di + d, get(ybase, t * (in.di + 1) + 1 + d));
        col0_untouched = col0_untouched && std::isnan(get(ybase, t * (in.di + 1)));
      }
      CHECK_CLOSE(y.t, ref.y.t, 1e-13);
      CHECK_CLOSE(states.t, ref.states.t, 1e-13);
      CHECK(col0_untouched);
    }
  }
}

TEST_CASE("mamba selective scan backward matches fp64 finite differences (every input)") {
  for (const ScanCase& c : kScanCases) {
    SUBCASE(c.name) {
      ScanInputs in = scan_inputs(c.docs, c.di, c.n, c.chunk, DType::F64);
      Owned r = randn({in.t, in.di}, DType::F64, "scan.r");
      Owned y = empty({in.t, in.di}, DType::F64, Device::CPU), states = in.states();
      auto loss = [&] {
        ops::selective_scan_forward(in.args(), y, states);
        return projection(y, r);
      };
      ScanGradsOwned g = scan_backward(in, r, DType::F64);
      struct Item {
        const char* what;
        const Tensor& theta;
        const Tensor& analytic;
      };
      for (const Item& it : {Item{"dx", in.x, g.dx}, Item{"ddt", in.dt, g.ddt}, Item{"dA_log", in.alog, g.dalog},
                             Item{"dB dC", in.bc, g.dbc}, Item{"dD", in.D, g.dD},
                             Item{"ddt_bias", in.bias, g.dbias}, Item{"dz", in.zbase, g.dzbase}}) {
        auto cmp = finite_difference_check(loss, it.theta, it.analytic, std::string("scan ") + it.what);
        INFO(it.what, ": ", cmp.report);
        CHECK(cmp.rel_rms < kGradTol);
      }
    }
  }
}

TEST_CASE("mamba selective scan accumulates parameter gradients and writes activation gradients") {
  ScanInputs in = scan_inputs({3, 5}, 4, 3, 3, DType::F64);
  Owned r = randn({in.t, in.di}, DType::F64, "scan.r");
  ScanGradsOwned fresh = scan_backward(in, r, DType::F64);
  // Prefilled: parameter gradients gain the same amounts; activation gradients are overwritten.
  ScanGradsOwned pre{randn(in.x->shape, DType::F64, "p.dx"),      randn(in.dt->shape, DType::F64, "p.ddt"),
                     clone(fresh.dbc),                            clone(fresh.dzbase),
                     randn(in.alog->shape, DType::F64, "p.dalog"), randn(in.D->shape, DType::F64, "p.dD"),
                     randn(in.bias->shape, DType::F64, "p.db")};
  Owned dalog0 = clone(pre.dalog), dD0 = clone(pre.dD), db0 = clone(pre.dbias);
  for (int64_t i = 0; i < pre.dbc->numel(); ++i)  // only the block columns may change
    if (i % (2 * in.n + 1) != 0) set(pre.dbc, i, 7.0);
  Owned states = in.states(), y = empty({in.t, in.di}, DType::F64, Device::CPU);
  ops::selective_scan_forward(in.args(), y, states);
  ops::selective_scan_backward(in.args(), r, states, pre.grads(in));
  CHECK(bitwise_equal(pre.dx, fresh.dx));
  CHECK(bitwise_equal(pre.ddt, fresh.ddt));
  CHECK(bitwise_equal(pre.dbc, fresh.dbc));
  CHECK(bitwise_equal(pre.dzbase, fresh.dzbase));
  for (int64_t i = 0; i < pre.dalog->numel(); ++i)
    CHECK(get(pre.dalog, i) - get(dalog0, i) == doctest::Approx(get(fresh.dalog, i)).epsilon(1e-12));
  for (int64_t i = 0; i < pre.dD->numel(); ++i) {
    CHECK(get(pre.dD, i) - get(dD0, i) == doctest::Approx(get(fresh.dD, i)).epsilon(1e-12));
    CHECK(get(pre.dbias, i) - get(db0, i) == doctest::Approx(get(fresh.dbias, i)).epsilon(1e-12));
  }
}

TEST_CASE("mamba ops: packed documents equal each document alone") {
  const std::vector<int32_t> docs = {5, 1, 4};
  const int64_t di = 3, n = 2;
  ScanInputs packed = scan_inputs(docs, di, n, 2, DType::F64);
  Owned r = randn({packed.t, di}, DType::F64, "pack.r");
  Owned y = empty({packed.t, di}, DType::F64, Device::CPU), states = packed.states();
  ops::selective_scan_forward(packed.args(), y, states);
  ScanGradsOwned g = scan_backward(packed, r, DType::F64);
  Owned yc = empty({packed.t, di}, DType::F64, Device::CPU);
  Owned dxc = empty({packed.t, di}, DType::F64, Device::CPU);
  Owned cw = randn({di, 4}, DType::F64, "pack.cw"), cb = randn({di}, DType::F64, "pack.cb");
  ops::causal_conv1d_forward(packed.x, cw, cb, packed.cu, true, yc);
  Owned dcw = zeros_f64({di, 4}), dcb = zeros_f64({di});
  ops::causal_conv1d_backward(r, packed.x, cw, cb, packed.cu, true, dxc, dcw, dcb);
  Owned dA_sum = zeros_f64({di, n}), dcw_sum = zeros_f64({di, 4});

  int64_t begin = 0;
  for (int32_t len : docs) {
    CAPTURE(len);
    // Document alone: its rows of every per-token tensor, the same parameters.
    auto rows = [&](const Tensor& t) {
      Owned o = empty({len, t.size(1)}, DType::F64, Device::CPU);
      for (int64_t i = 0; i < o->numel(); ++i) set(o, i, get(t, begin * t.size(1) + i));
      return o;
    };
    ScanInputs one;
    one.t = len, one.di = di, one.n = n, one.chunk = 2;
    one.x = rows(packed.x), one.dt = rows(packed.dt), one.bc = rows(packed.bc), one.zbase = rows(packed.zbase);
    one.alog = clone(packed.alog), one.D = clone(packed.D), one.bias = clone(packed.bias);
    one.cu = cu_from({len});
    Owned y1 = empty({len, di}, DType::F64, Device::CPU), s1 = one.states(), r1 = rows(r);
    ops::selective_scan_forward(one.args(), y1, s1);
    CHECK(bitwise_equal(y1, rows(y)));
    ScanGradsOwned g1 = scan_backward(one, r1, DType::F64);
    CHECK(bitwise_equal(g1.dx, rows(g.dx)));
    CHECK(bitwise_equal(g1.ddt, rows(g.ddt)));
    CHECK(bitwise_equal(g1.dbc, rows(g.dbc)));
    CHECK(bitwise_equal(g1.dzbase, rows(g.dzbase)));
    for (int64_t i = 0; i < dA_sum->numel(); ++i) set(dA_sum, i, get(dA_sum, i) + get(g1.dalog, i));

    Owned yc1 = empty({len, di}, DType::F64, Device::CPU), dxc1 = empty({len, di}, DType::F64, Device::CPU);
    ops::causal_conv1d_forward(one.x, cw, cb, one.cu, true, yc1);
    CHECK(bitwise_equal(yc1, rows(yc)));
    Owned dcw1 = zeros_f64({di, 4}), dcb1 = zeros_f64({di});
    ops::causal_conv1d_backward(r1, one.x, cw, cb, one.cu, true, dxc1, dcw1, dcb1);
    CHECK(bitwise_equal(dxc1, rows(dxc)));
    for (int64_t i = 0; i < dcw_sum->numel(); ++i) set(dcw_sum, i, get(dcw_sum, i) + get(dcw1, i));
    begin += len;
  }
  CHECK_CLOSE(dA_sum.t, g.dalog.t, 1e-13);
  CHECK_CLOSE(dcw_sum.t, dcw.t, 1e-13);
}

TEST_CASE("mamba ops: f32 agrees with f64") {
  ScanInputs in64 = scan_inputs({7, 1, 12}, 6, 4, 5, DType::F64);
  ScanInputs in32 = scan_inputs({7, 1, 12}, 6, 4, 5, DType::F32);  // same seed names: same values
  Owned r = randn({in64.t, in64.di}, DType::F64, "f32.r"), r32 = converted(r, DType::F32);
  Owned y64 = empty({in64.t, 6}, DType::F64, Device::CPU), y32 = empty({in64.t, 6}, DType::F32, Device::CPU);
  Owned s64 = in64.states(), s32 = in32.states();
  ops::selective_scan_forward(in64.args(), y64, s64);
  ops::selective_scan_forward(in32.args(), y32, s32);
  CHECK_CLOSE(y32.t, y64.t, 1e-5);
  CHECK_CLOSE(s32.t, s64.t, 1e-5);
  ScanGradsOwned g64 = scan_backward(in64, r, DType::F64), g32 = scan_backward(in32, r32, DType::F32);
  CHECK_CLOSE(g32.dx.t, g64.dx.t, 1e-5);
  CHECK_CLOSE(g32.ddt.t, g64.ddt.t, 1e-5);
  CHECK_CLOSE(g32.dbc.t, g64.dbc.t, 1e-5);
  CHECK_CLOSE(g32.dalog.t, g64.dalog.t, 1e-5);
}

TEST_CASE("mamba ops reject bad arguments, naming them") {
  ScanInputs in = scan_inputs({3, 4}, 3, 2, 4, DType::F32);
  Owned y = empty({in.t, 3}, DType::F32, Device::CPU);
  Owned bad_states = empty({1, 2, 3}, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::selective_scan_forward(in.args(), y, bad_states),
                       doctest::Contains("chunk_states"), Error);
  ops::ScanArgs a = in.args();
  a.B = ColumnBlock(in.bc, 2, 2 * in.n);  // past the end of bc's columns
  Owned states = in.states();
  CHECK_THROWS_WITH_AS(ops::selective_scan_forward(a, y, states), doctest::Contains("B"), Error);
  a = in.args();
  Owned short_cu = cu_from({3, 3});
  a.cu_seqlens = short_cu;
  CHECK_THROWS_WITH_AS(ops::selective_scan_forward(a, y, states), doctest::Contains("cu_seqlens"), Error);
  Owned w = randn({3, 4}, DType::F32, "bad.w"), b = randn({4}, DType::F32, "bad.b");
  CHECK_THROWS_WITH_AS(ops::causal_conv1d_forward(in.x, w, b, in.cu, true, y), doctest::Contains("bias"), Error);
}
