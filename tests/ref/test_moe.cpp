// Mixture-of-experts reference ops (ops/moe.h) on the CPU: routing against a direct softmax and
// a sort (ties to the lower expert index), the route backward (weights, aux and z losses) by
// fp64 central differences, dispatch invariants (padded offsets, stable rows) on skewed and
// empty experts, permute / unpermute and the unpermute backward by finite
// differences, the grouped linear products against per-expert loops and by finite differences
// (one and two weight stacks, experts with no rows, rows outside every expert untouched), and
// the jitter (range, determinism, self-adjointness), the shared expert's gate by finite
// differences. k = 1 and 2, odd sizes; routing with and without the renormalisation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/moe.h"
#include "tests/common/gradcheck.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

// Routes `logits` (T, E) f64 and dispatches; everything the later steps read.
struct Routed {
  Owned probs, lse, idx, w, counts, offsets, row_of;
};
Routed route(const Tensor& logits, int64_t k, bool renormalize = true) {
  const int64_t T = logits.size(0), E = logits.size(1);
  Routed r;
  r.probs = empty({T, E}, DType::F64, Device::CPU);
  r.lse = empty({T}, DType::F64, Device::CPU);
  r.idx = empty({T, k}, DType::I32, Device::CPU);
  r.w = empty({T, k}, DType::F64, Device::CPU);
  r.counts = empty({E}, DType::I32, Device::CPU);
  r.offsets = empty({E + 1}, DType::I32, Device::CPU);
  r.row_of = empty({T, k}, DType::I32, Device::CPU);
  ops::moe_route_forward(logits, r.probs, r.lse, r.idx, r.w, renormalize);
  ops::moe_dispatch(r.idx, r.counts, r.offsets, r.row_of);
  return r;
}

// Expert ids (T, k) i32: distinct experts per token, drawn with a skew (`hot` gets most tokens
// when >= 0) and never using the experts listed in `empty_experts`.
Owned random_assignment(int64_t T, int64_t k, int64_t E, int hot,
                        const std::vector<int>& empty_experts, const std::string& name) {
  Owned idx = empty({T, k}, DType::I32, Device::CPU);
  Owned u = randint({T, k, 4}, 0, 1 << 30, name);
  std::vector<int> allowed;
  for (int e = 0; e < E; ++e)
    if (std::find(empty_experts.begin(), empty_experts.end(), e) == empty_experts.end())
      allowed.push_back(e);
  REQUIRE(static_cast<int64_t>(allowed.size()) >= k);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> pool = allowed;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t* r = u.ptr<int32_t>() + (t * k + j) * 4;
      size_t pick = static_cast<size_t>(r[0]) % pool.size();
      if (hot >= 0 && r[1] % 8 != 0) {  // 7 in 8 draws go to the hot expert when it is free
        auto it = std::find(pool.begin(), pool.end(), hot);
        if (it != pool.end()) pick = static_cast<size_t>(it - pool.begin());
      }
      idx.ptr<int32_t>()[t * k + j] = pool[pick];
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
  return idx;
}

// Dispatch invariants: counts, offsets padded to kMoeRowAlign, rows inside the expert's range,
// all distinct, increasing with (token, slot) within an expert, inside the static bound.
void check_dispatch(const Tensor& idx, const Tensor& counts, const Tensor& offsets,
                    const Tensor& row_of, int64_t E) {
  const int64_t T = idx.size(0), k = idx.size(1);
  std::vector<int64_t> expect_counts(E, 0);
  for (int64_t a = 0; a < T * k; ++a) ++expect_counts[idx.ptr<int32_t>()[a]];
  const int32_t *c = counts.ptr<int32_t>(), *o = offsets.ptr<int32_t>();
  CHECK(o[0] == 0);
  for (int64_t e = 0; e < E; ++e) {
    CAPTURE(e);
    CHECK(c[e] == expect_counts[e]);
    CHECK(o[e] % ops::kMoeRowAlign == 0);
    CHECK(o[e + 1] - o[e] == (c[e] + ops::kMoeRowAlign - 1) / ops::kMoeRowAlign * ops::kMoeRowAlign);
  }
  CHECK(o[E] <= ops::moe_permuted_rows(T, k, E));
  std::vector<int64_t> last(E, -1);
  std::vector<bool> used(static_cast<size_t>(std::max<int64_t>(o[E], 1)), false);
  for (int64_t a = 0; a < T * k; ++a) {
    const int e = idx.ptr<int32_t>()[a];
    const int64_t r = row_of.ptr<int32_t>()[a];
    CAPTURE(a);
    REQUIRE(r >= o[e]);
    REQUIRE(r < o[e] + c[e]);
    CHECK(!used[r]);
    used[r] = true;
    CHECK(r > last[e]);  // stable: rows grow with (token, slot)
    last[e] = r;
  }
}

}  // namespace

TEST_CASE("moe routing: softmax, top-k by logit with ties to the lower index, renormalised weights") {
  SUBCASE("hand-made ties") {
    // row 0: experts 1 and 2 tie for first; row 1: all equal; row 2: tie for second place.
    Owned logits = empty({3, 4}, DType::F64, Device::CPU);
    const double v[12] = {1, 3, 3, 0, 2, 2, 2, 2, 5, -1, 4, 4};
    std::copy(v, v + 12, logits.ptr<double>());
    Routed r = route(logits, 2);
    const int32_t want[6] = {1, 2, 0, 1, 0, 2};
    for (int i = 0; i < 6; ++i) CHECK(r.idx.ptr<int32_t>()[i] == want[i]);
    CHECK(get(r.w, 0) == doctest::Approx(0.5));
    CHECK(get(r.w, 2) == doctest::Approx(0.5));
  }
  for (int64_t k : {1, 2}) {
    for (DType dt : {DType::F32, DType::F64}) {
      CAPTURE(k);
      INFO(float_name(dt));
      const int64_t T = 29, E = 7;
      Owned logits = randn({T, E}, dt, "route.logits", 2.0);
      Owned probs = empty({T, E}, dt, Device::CPU), lse = empty({T}, dt, Device::CPU);
      Owned idx = empty({T, k}, DType::I32, Device::CPU), w = empty({T, k}, dt, Device::CPU);
      Owned keep = clone(logits);
      ops::moe_route_forward(logits, logits, lse, idx, w, true);  // probs aliasing logits
      ops::moe_route_forward(keep, probs, lse, idx, w, true);
      CHECK(bitwise_equal(probs, logits));
      Owned w_raw = empty({T, k}, dt, Device::CPU);  // Qwen2-MoE: the probabilities themselves
      ops::moe_route_forward(keep, probs, lse, idx, w_raw, false);
      const double tol = dt == DType::F64 ? 1e-14 : 1e-6;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> l(E);
        for (int64_t e = 0; e < E; ++e) l[e] = get(keep, t * E + e);
        double m = *std::max_element(l.begin(), l.end()), s = 0;
        for (double x : l) s += std::exp(x - m);
        const double lse_t = m + std::log(s);
        CHECK(std::abs(get(lse, t) - lse_t) < tol * 10);
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += std::exp(l[order[j]] - lse_t);
        for (int64_t j = 0; j < k; ++j) {
          CHECK(idx.ptr<int32_t>()[t * k + j] == order[j]);
          CHECK(std::abs(get(w, t * k + j) - std::exp(l[order[j]] - lse_t) / sum) < tol);
          CHECK(std::abs(get(w_raw, t * k + j) - std::exp(l[order[j]] - lse_t)) < tol);
        }
        for (int64_t e = 0; e < E; ++e)
          CHECK(std::abs(get(probs, t * E + e) - std::exp(l[e] - lse_t)) < tol);
      }
    }
  }
}

TEST_CASE("moe route backward: fp64 finite differences of weights, aux loss and z loss") {
  struct Case {
    int64_t T, E, k;
    float aux, z, scale;
  };
  const std::vector<Case> cases = {{13, 7, 2, 0.01f, 0.001f, 1.f},  {13, 7, 1, 0.3f, 0.2f, 0.37f},
                                   {9, 3, 2, 0.f, 0.f, 1.f},        {11, 5, 2, 0.5f, 0.f, 2.f},
                                   {5, 1, 1, 0.2f, 0.1f, 1.f},      {1, 4, 2, 0.1f, 0.1f, 1.f}};
  for (const Case& c : cases) for (const bool renorm : {true, false}) {
    CAPTURE(c.T);
    CAPTURE(c.E);
    CAPTURE(c.k);
    CAPTURE(c.aux);
    CAPTURE(c.z);
    CAPTURE(renorm);
    Owned logits = randn({c.T, c.E}, DType::F64, "rb.logits", 1.5);
    Owned rw = randn({c.T, c.k}, DType::F64, "rb.rw");
    const ops::MoeAuxCoefs coefs{c.aux, c.z};
    Owned losses = empty({2}, DType::F64, Device::CPU);
    Routed base = route(logits, c.k, renorm);
    auto loss = [&] {
      Routed r = route(logits, c.k, renorm);
      ops::moe_aux_losses(r.probs, r.lse, r.counts, coefs, losses);
      return dot(r.w, rw) + c.scale * (get(losses, 0) + get(losses, 1));
    };
    Owned dlogits = empty({c.T, c.E}, DType::F64, Device::CPU);
    poison(dlogits);
    ops::moe_route_backward(rw, base.probs, base.lse, base.idx, base.w, base.counts, coefs, c.scale,
                            renorm, dlogits);
    auto cmp = finite_difference_check(loss, logits, dlogits, "dlogits");
    INFO(cmp.report);
    if (cmp.scale > 0) CHECK(cmp.rel_rms < kGradTol);
    else CHECK(sum_squares_of(dlogits) == 0);
  }
  SUBCASE("aux loss values") {  // uniform routing: aux = coef exactly (f_e = P_e = 1 / E)
    const int64_t T = 8, E = 4;
    Owned logits = zeros({T, E}, DType::F64, Device::CPU);
    Routed r = route(logits, 1);
    for (int64_t e = 0; e < E; ++e) r.counts.ptr<int32_t>()[e] = 2;  // as if balanced
    Owned losses = empty({2}, DType::F64, Device::CPU);
    ops::moe_aux_losses(r.probs, r.lse, r.counts, {0.25f, 0.5f}, losses);
    CHECK(get(losses, 0) == doctest::Approx(0.25));
    CHECK(get(losses, 1) == doctest::Approx(0.5 * std::log(4.0) * std::log(4.0)));
  }
}

TEST_CASE("moe dispatch: counts, padded offsets, stable rows; skewed and empty experts") {
  struct Case {
    int64_t T, E, k;
    int hot;
    std::vector<int> empties;
  };
  const std::vector<Case> cases = {{37, 5, 2, -1, {}},        {37, 5, 1, 2, {}},
                                   {300, 8, 2, 0, {3, 5}},     {129, 3, 1, -1, {0, 2}},
                                   {1, 6, 2, -1, {}},          {0, 4, 2, -1, {}},
                                   {257, 64, 2, 7, {}}};
  for (const Case& c : cases) {
    CAPTURE(c.T);
    CAPTURE(c.E);
    CAPTURE(c.k);
    Owned idx = random_assignment(c.T, c.k, c.E, c.hot, c.empties, "dispatch");
    Owned counts = empty({c.E}, DType::I32, Device::CPU), offsets = empty({c.E + 1}, DType::I32, Device::CPU);
    Owned row_of = empty({c.T, c.k}, DType::I32, Device::CPU);
    poison(counts);
    ops::moe_dispatch(idx, counts, offsets, row_of);
    check_dispatch(idx, counts, offsets, row_of, c.E);
    for (int e : c.empties) CHECK(counts.ptr<int32_t>()[e] == 0);
  }
  Owned bad = empty({2, 1}, DType::I32, Device::CPU);
  bad.ptr<int32_t>()[0] = 0;
  bad.ptr<int32_t>()[1] = 3;
  Owned counts = empty({3}, DType::I32, Device::CPU), offsets = empty({4}, DType::I32, Device::CPU);
  Owned row_of = empty({2, 1}, DType::I32, Device::CPU);
  CHECK_THROWS_AS(ops::moe_dispatch(bad, counts, offsets, row_of), Error);
}

TEST_CASE("moe permute / unpermute: row moves, adjointness, unpermute backward by finite differences") {
  for (int64_t k : {1, 2}) {
    CAPTURE(k);
    const int64_t T = 19, E = 5, C = 7;
    Owned idx = random_assignment(T, k, E, 1, {3}, "perm");
    Owned counts = empty({E}, DType::I32, Device::CPU), offsets = empty({E + 1}, DType::I32, Device::CPU);
    Owned row_of = empty({T, k}, DType::I32, Device::CPU);
    ops::moe_dispatch(idx, counts, offsets, row_of);
    const int64_t R = ops::moe_permuted_rows(T, k, E);
    Owned x = randn({T, C}, DType::F64, "perm.x");
    Owned xp = zeros({R, C}, DType::F64, Device::CPU);
    ops::moe_permute(x, row_of, xp);
    for (int64_t a = 0; a < T * k; ++a)
      for (int64_t c = 0; c < C; ++c)
        CHECK(get(xp, int64_t{row_of.ptr<int32_t>()[a]} * C + c) == get(x, (a / k) * C + c));
    // <permute(x), Y> = <x, unpermute(Y)> with unit weights (Y zero outside the used rows).
    Owned Y = zeros({R, C}, DType::F64, Device::CPU);
    Owned yr = randn({R, C}, DType::F64, "perm.Y");
    for (int64_t a = 0; a < T * k; ++a) {
      const int64_t r = row_of.ptr<int32_t>()[a];
      for (int64_t c = 0; c < C; ++c) set(Y, r * C + c, get(yr, r * C + c));
    }
    Owned back = empty({T, C}, DType::F64, Device::CPU);
    ops::moe_unpermute(Y, row_of, Tensor{}, back);
    CHECK(dot(xp, Y) == doctest::Approx(dot(x, back)).epsilon(1e-12));

    // Weighted unpermute: finite differences w.r.t. yp and the weights.
    Owned yp = randn({R, C}, DType::F64, "perm.yp"), w = randn({T, k}, DType::F64, "perm.w");
    Owned r = randn({T, C}, DType::F64, "perm.r"), y = empty({T, C}, DType::F64, Device::CPU);
    auto loss = [&] {
      ops::moe_unpermute(yp, row_of, w, y);
      return dot(y, r);
    };
    Owned dyp = zeros({R, C}, DType::F64, Device::CPU), dw = empty({T, k}, DType::F64, Device::CPU);
    poison(dw);
    ops::moe_unpermute_backward(r, yp, row_of, w, dyp, dw);
    auto cy = finite_difference_check(loss, yp, dyp, "dyp");
    INFO(cy.report);
    CHECK(cy.rel_rms < kGradTol);
    auto cw = finite_difference_check(loss, w, dw, "dweights");
    INFO(cw.report);
    CHECK(cw.rel_rms < kGradTol);
  }
}

TEST_CASE("grouped linear: forward, input and weight gradients (fp64 finite differences)") {
  struct Case {
    const char* name;
    std::vector<int32_t> counts;
    int64_t stacks, n_per_stack, k;
  };
  const std::vector<Case> cases = {
      {"skewed, one empty", {5, 0, 13, 1}, 1, 6, 7},
      {"two stacks (gate|up)", {3, 9, 0}, 2, 5, 4},
      {"one expert", {11}, 1, 3, 9},
      {"all empty", {0, 0}, 1, 4, 3},
  };
  for (const Case& c : cases) {
    SUBCASE(c.name) {
      const int64_t E = static_cast<int64_t>(c.counts.size()), N = c.stacks * c.n_per_stack, K = c.k;
      Owned counts = empty({E}, DType::I32, Device::CPU), offsets = empty({E + 1}, DType::I32, Device::CPU);
      offsets.ptr<int32_t>()[0] = 0;
      for (int64_t e = 0; e < E; ++e) {
        counts.ptr<int32_t>()[e] = c.counts[e];
        offsets.ptr<int32_t>()[e + 1] = offsets.ptr<int32_t>()[e] + c.counts[e] + 3;  // gaps
      }
      const int64_t R = offsets.ptr<int32_t>()[E] + 2;
      const Shape wshape = c.stacks == 1 ? Shape{E, N, K} : Shape{c.stacks, E, c.n_per_stack, K};
      Owned x = randn({R, K}, DType::F64, "gl.x"), w = randn(wshape, DType::F64, "gl.w");
      Owned y = empty({R, N}, DType::F64, Device::CPU);
      poison(y);
      ops::grouped_linear_forward(x, w, offsets, counts, y, {});
      // Direct check, and the untouched rows.
      std::vector<bool> owned(R, false);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = offsets.ptr<int32_t>()[e]; r < offsets.ptr<int32_t>()[e] + c.counts[e]; ++r) {
          owned[r] = true;
          for (int64_t n = 0; n < N; ++n) {
            const int64_t s = n / c.n_per_stack, nn = n % c.n_per_stack;
            double acc = 0;
            for (int64_t kk = 0; kk < K; ++kk)
              acc += get(x, r * K + kk) * get(w, ((s * E + e) * c.n_per_stack + nn) * K + kk);
            CHECK(get(y, r * N + n) == doctest::Approx(acc).epsilon(1e-12));
          }
        }
      for (int64_t r = 0; r < R; ++r)
        if (!owned[r]) CHECK(std::isnan(get(y, r * N)));

      // Loss over the owned rows only (the others hold NaN / are not outputs).
      Owned rr = randn({R, N}, DType::F64, "gl.r");
      for (int64_t r = 0; r < R; ++r)
        if (!owned[r])
          for (int64_t n = 0; n < N; ++n) set(rr, r * N + n, 0.0);
      Owned y2 = zeros({R, N}, DType::F64, Device::CPU);
      auto loss = [&] {
        ops::grouped_linear_forward(x, w, offsets, counts, y2, {});
        return dot(y2, rr);
      };
      Owned dx = zeros({R, K}, DType::F64, Device::CPU);
      ops::grouped_linear_backward_input(rr, w, offsets, counts, dx, {});
      auto cx = finite_difference_check(loss, x, dx, "dx");
      INFO(cx.report);
      if (cx.scale > 0) CHECK(cx.rel_rms < kGradTol);
      Owned dw0 = randn(wshape, DType::F64, "gl.dw0"), dw = clone(dw0);
      ops::grouped_linear_backward_weight(rr, x, offsets, counts, dw, {});  // += onto dw0
      Owned ddw = empty(wshape, DType::F64, Device::CPU);
      for (int64_t i = 0; i < ddw->numel(); ++i) set(ddw, i, get(dw, i) - get(dw0, i));
      auto cw = finite_difference_check(loss, w, ddw, "dw");
      INFO(cw.report);
      if (cw.scale > 0) CHECK(cw.rel_rms < kGradTol);
      else CHECK(sum_squares_of(ddw) == 0);
    }
  }
  SUBCASE("rejects ranges outside the buffer") {
    Owned x = randn({4, 3}, DType::F64, "gl.bad"), w = randn({1, 2, 3}, DType::F64, "gl.badw");
    Owned y = empty({4, 2}, DType::F64, Device::CPU);
    Owned counts = empty({1}, DType::I32, Device::CPU), offsets = empty({2}, DType::I32, Device::CPU);
    counts.ptr<int32_t>()[0] = 3;
    offsets.ptr<int32_t>()[0] = 2;
    offsets.ptr<int32_t>()[1] = 5;
    CHECK_THROWS_AS(ops::grouped_linear_forward(x, w, offsets, counts, y, {}), Error);
  }
}

TEST_CASE("moe jitter: factors in [1 - eps, 1 + eps], one function of (seed, index), self-adjoint") {
  Owned x = randn({13, 11}, DType::F64, "jit.x"), y = empty({13, 11}, DType::F64, Device::CPU);
  ops::moe_jitter(x, y, 77, 0.1f);
  bool varied = false;
  for (int64_t i = 0; i < x->numel(); ++i) {
    const double f = get(y, i) / get(x, i);
    CHECK(f >= 0.9 - 1e-12);
    CHECK(f <= 1.1 + 1e-12);
    varied |= std::abs(f - 1.0) > 1e-3;
  }
  CHECK(varied);
  Owned y2 = clone(x);
  ops::moe_jitter(y2, y2, 77, 0.1f);  // in place, same numbers
  CHECK(bitwise_equal(y2, y));
  Owned y3 = empty({13, 11}, DType::F64, Device::CPU);
  ops::moe_jitter(x, y3, 78, 0.1f);
  CHECK(!bitwise_equal(y3, y));
  Owned a = randn({13, 11}, DType::F64, "jit.a"), ja = empty({13, 11}, DType::F64, Device::CPU);
  ops::moe_jitter(a, ja, 77, 0.1f);
  CHECK(dot(y, a) == doctest::Approx(dot(x, ja)).epsilon(1e-13));
}

TEST_CASE("moe shared gate: forward values and fp64 finite differences of the backward") {
  for (const auto& [T, C] : std::vector<std::pair<int64_t, int64_t>>{{7, 5}, {1, 3}}) {
    CAPTURE(T);
    Owned logits = randn({T, 1}, DType::F64, "sg.logits", 2.0);
    Owned shared = randn({T, C}, DType::F64, "sg.shared"), y0 = randn({T, C}, DType::F64, "sg.y");
    Owned proj = randn({T, C}, DType::F64, "sg.proj");
    auto forward = [&] {
      Owned y = clone(y0);
      ops::moe_shared_gate_forward(logits, shared, y);
      return y;
    };
    Owned y = forward();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double g = 1.0 / (1.0 + std::exp(-get(logits, t)));
        CHECK(get(y, t * C + c) == doctest::Approx(get(y0, t * C + c) + g * get(shared, t * C + c)));
      }
    Owned dshared = empty({T, C}, DType::F64, Device::CPU), dlogits = empty({T, 1}, DType::F64, Device::CPU);
    poison(dshared);
    poison(dlogits);
    ops::moe_shared_gate_backward(proj, logits, shared, dshared, dlogits);
    auto loss = [&] { return dot(forward(), proj); };
    for (auto [theta, grad, name] : {std::tuple{logits.t, dlogits.t, "dlogits"}, std::tuple{shared.t, dshared.t, "dshared"}}) {
      auto cmp = finite_difference_check(loss, theta, grad, name);
      INFO(cmp.report);
      CHECK(cmp.rel_rms < kGradTol);
    }
  }
}
