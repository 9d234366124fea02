// Varlen grouped-query attention: forward (out, lse) against a dense masked softmax over all T
// rows written out here; backward (whole dqkv) against fp64 finite differences of
// L = sum(out * R); f32 vs f64; thread-count determinism; argument checks.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "tests/common/attention_case.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

using AttnCase = testing::AttentionCase;

// GQA ratios 1, 2, 3; 1-token and empty sequences; windows shorter than a sequence; causal and not.
const std::vector<AttnCase> kAttnCases = {
    {{1}, 2, 2, 6, true, 0},
    {{5, 1, 8}, 6, 2, 6, true, 0},
    {{7, 3}, 4, 2, 10, true, 3},
    {{9}, 3, 3, 6, false, 0},
    {{6, 1, 4}, 6, 2, 10, false, 2},
    {{11}, 2, 1, 4, true, 1},
    {{4, 0, 3}, 3, 1, 6, true, 2, 0.37f},
};

// Larger sweep for the slow tier.
const std::vector<AttnCase> kSlowCases = {
    {{23, 1, 17}, 6, 3, 16, true, 0},
    {{19, 30}, 4, 1, 12, true, 7},
    {{25, 2, 9}, 6, 2, 10, false, 5},
};

// The tensors of one attention call.
struct Attn {
  AttnCase c;
  Owned qkv, out, lse, cu;
  ops::AttentionParams params() const {
    ops::AttentionParams p;
    p.qkv = qkv.t;
    p.out = out.t;
    p.lse = lse.t;
    p.cu_seqlens = cu.t;
    p.max_seqlen = c.lens.empty() ? 0 : *std::max_element(c.lens.begin(), c.lens.end());
    p.num_heads = c.heads;
    p.num_kv_heads = c.kv_heads;
    p.head_dim = c.dim;
    p.softmax_scale = c.scale > 0 ? c.scale : 1.f / std::sqrt(static_cast<float>(c.dim));
    p.causal = c.causal;
    p.window = c.window;
    return p;
  }
  void forward() {
    poison(out);
    poison(lse);
    ops::attention_forward(params());
  }
};

Attn make_attn(const AttnCase& c, DType dt) {
  const int64_t t = c.rows(), nh = c.heads + 2 * c.kv_heads;
  Attn a{c, randn({t, nh, c.dim}, dt, "attn.qkv"), empty({t, c.heads, c.dim}, dt, Device::CPU),
         empty({t, c.heads}, dt, Device::CPU),
         empty({static_cast<int64_t>(c.lens.size()) + 1}, DType::I32, Device::CPU)};
  int32_t* cu = a.cu.ptr<int32_t>();
  cu[0] = 0;
  for (size_t s = 0; s < c.lens.size(); ++s) cu[s + 1] = cu[s] + c.lens[s];
  return a;
}

// Dense reference over all T x T pairs with the visibility mask, in double.
void dense_attention(const Attn& a, Owned& out, Owned& lse) {
  const AttnCase& c = a.c;
  const int64_t t = c.rows(), nh = c.heads + 2 * c.kv_heads, d = c.dim;
  const double scale = a.params().softmax_scale;
  std::vector<int64_t> seq(t), local(t);
  for (int64_t s = 0, r = 0; s < static_cast<int64_t>(c.lens.size()); ++s)
    for (int i = 0; i < c.lens[s]; ++i, ++r) seq[r] = s, local[r] = i;
  out = empty({t, c.heads, d}, DType::F64, Device::CPU);
  lse = empty({t, c.heads}, DType::F64, Device::CPU);
  for (int64_t h = 0; h < c.heads; ++h) {
    const int64_t g = h / (c.heads / c.kv_heads);
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> w(t, 0.0);
      double m = -INFINITY;
      for (int64_t j = 0; j < t; ++j) {
        const bool visible = seq[i] == seq[j] && (!c.causal || local[j] <= local[i]) &&
                             (c.window == 0 || local[i] - local[j] < c.window);
        if (!visible) {
          w[j] = -INFINITY;
          continue;
        }
        double s = 0;
        for (int64_t e = 0; e < d; ++e)
          s += get(a.qkv, (i * nh + h) * d + e) * get(a.qkv, (j * nh + c.heads + g) * d + e);
        w[j] = scale * s;
        m = std::max(m, w[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < t; ++j) z += std::exp(w[j] - m);
      for (int64_t e = 0; e < d; ++e) {
        double o = 0;
        for (int64_t j = 0; j < t; ++j)
          o += std::exp(w[j] - m) / z * get(a.qkv, (j * nh + c.heads + c.kv_heads + g) * d + e);
        out.ptr<double>()[(i * c.heads + h) * d + e] = o;
      }
      lse.ptr<double>()[i * c.heads + h] = m + std::log(z);
    }
  }
}

// dqkv for dout = r (poisoned first).
Owned backward(Attn& a, const Tensor& r) {
  Owned dqkv = empty(a.qkv->shape, a.qkv->dtype, Device::CPU);
  poison(dqkv);
  ops::attention_backward({a.params(), r, dqkv.t});
  return dqkv;
}

void check_forward(const AttnCase& c) {
  for (DType dt : {DType::F32, DType::F64}) {
    INFO(float_name(dt));
    Attn a = make_attn(c, dt);
    a.forward();
    Owned out, lse;
    dense_attention(a, out, lse);
    CHECK_CLOSE(a.out.t, out.t, dt == DType::F64 ? 1e-13 : 1e-6);
    CHECK_CLOSE(a.lse.t, lse.t, dt == DType::F64 ? 1e-13 : 1e-6);
  }
}

void check_backward(const AttnCase& c) {
  Attn a = make_attn(c, DType::F64);
  Owned r = randn(a.out->shape, DType::F64, "attn.r");
  a.forward();
  Owned dqkv = backward(a, r);
  auto loss = [&] {
    a.forward();
    return projection(a.out, r);
  };
  CHECK_CLOSE(dqkv.t, numeric_grad(a.qkv, loss).t, kGradTol);
}

}  // namespace

TEST_CASE("attention forward matches a dense masked softmax (out and lse)") {
  for (const AttnCase& c : kAttnCases) {
    SUBCASE(c.name().c_str()) { check_forward(c); }
  }
}

TEST_CASE("attention backward matches fp64 finite differences over the whole qkv") {
  for (const AttnCase& c : kAttnCases) {
    SUBCASE(c.name().c_str()) { check_backward(c); }
  }
}

TEST_CASE("attention larger sweep: dense forward and finite differences" *
          doctest::test_suite("slow")) {
  for (const AttnCase& c : kSlowCases) {
    SUBCASE(c.name().c_str()) {
      check_forward(c);
      check_backward(c);
    }
  }
}

TEST_CASE("attention f32 agrees with f64, forward and backward") {
  const AttnCase c{{5, 1, 12}, 6, 2, 10, true, 4};
  Attn a32 = make_attn(c, DType::F32), a64 = make_attn(c, DType::F64);
  a64.qkv = converted(a32.qkv, DType::F64);
  Owned r32 = randn(a32.out->shape, DType::F32, "attn.r"), r64 = converted(r32, DType::F64);
  a32.forward();
  a64.forward();
  CHECK_CLOSE(a32.out.t, a64.out.t, 1e-6);
  CHECK_CLOSE(a32.lse.t, a64.lse.t, 1e-6);
  CHECK_CLOSE(backward(a32, r32).t, backward(a64, r64).t, 1e-6);
}

TEST_CASE("attention backward is bitwise identical on 1 and 3 threads") {
  const int saved = omp_get_max_threads();
  const AttnCase c{{40, 1, 33}, 6, 2, 16, true, 0};
  Attn a = make_attn(c, DType::F32);
  Owned r = randn(a.out->shape, DType::F32, "attn.r");
  a.forward();
  omp_set_num_threads(1);
  Owned d1 = backward(a, r);
  omp_set_num_threads(3);
  Owned d3 = backward(a, r);
  omp_set_num_threads(saved);
  CHECK(bitwise_equal(d1, d3));
}

TEST_CASE("attention rejects bad arguments, naming them") {
  Attn a = make_attn({{3, 4}, 4, 2, 6, true, 0}, DType::F32);
  ops::AttentionParams p = a.params();
  p.num_kv_heads = 3;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("num_kv_heads"), Error);
  p = a.params();
  p.max_seqlen = 3;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("max_seqlen"), Error);
  p = a.params();
  p.softmax_scale = 0.f;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("softmax_scale"), Error);
  p = a.params();
  a.cu.ptr<int32_t>()[2] = 6;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("cu_seqlens[S]"), Error);
  a.cu.ptr<int32_t>()[2] = 7;
  p.head_dim = 5;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("qkv"), Error);
  p = a.params();
  Owned dout = empty({7, 4, 5}, DType::F32, Device::CPU),
        dqkv = empty(a.qkv->shape, DType::F32, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::attention_backward({p, dout.t, dqkv.t}), doctest::Contains("dout"),
                       Error);
}
