// Varlen grouped-query attention: forward (out, lse) against a dense masked softmax over all T
// rows written out here; backward (whole dqkv) against fp64 finite differences of
// L = sum(out * R); f32 vs f64; thread-count determinism; argument checks.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "tests/common/attention_case.h"
#include "tests/common/gradcheck.h"
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

// ---- Separate keys (ops::AttentionParams::kv): micro-sequences ---------------------------------

namespace {

// Offsets (S + 1) of a list of lengths, or of given offsets, as a CPU i32 tensor.
Owned offsets_tensor(const std::vector<int32_t>& cu) {
  Owned t = empty({static_cast<int64_t>(cu.size())}, DType::I32, Device::CPU);
  std::copy(cu.begin(), cu.end(), t.ptr<int32_t>());
  return t;
}
std::vector<int32_t> offsets_of(const std::vector<int>& lens) {
  std::vector<int32_t> cu = {0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// Rows [r0, r1) of heads [h0, h0 + n) of a CPU (T, NH, D) tensor, as a new (r1 - r0, n, D) one.
Owned rows_heads(const Tensor& x, int64_t r0, int64_t r1, int64_t h0, int64_t n) {
  const int64_t nh = x.size(1), d = x.size(2);
  Owned part = empty({r1 - r0, n, d}, x.dtype, Device::CPU);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t e = 0; e < n * d; ++e)
      set(part, (r - r0) * n * d + e, get(x, (r * nh + h0) * d + e));
  return part;
}

// Whether every element is NaN (a poisoned tensor nothing wrote into).
bool all_nan(const Tensor& x) {
  for (int64_t i = 0; i < x.numel(); ++i)
    if (!std::isnan(get(x, i))) return false;
  return true;
}

// One call with separate keys on the CPU: queries in qkv (its k, v heads unused), keys in kv.
struct KvAttn {
  AttnCase c;  // c.lens: query lengths
  std::vector<int> lens_k;
  Owned qkv, kv, out, lse, cu, cu_k;
  ops::AttentionParams params() const {
    ops::AttentionParams p;
    p.qkv = qkv;
    p.out = out;
    p.lse = lse;
    p.cu_seqlens = cu;
    p.max_seqlen = c.max_len();
    p.num_heads = c.heads;
    p.num_kv_heads = c.kv_heads;
    p.head_dim = c.dim;
    p.softmax_scale = c.softmax_scale();
    p.causal = c.causal;
    p.window = c.window;
    p.kv = kv;
    p.cu_seqlens_k = cu_k;
    p.max_seqlen_k = lens_k.empty() ? 0 : *std::max_element(lens_k.begin(), lens_k.end());
    return p;
  }
  void forward() {
    poison(out);
    poison(lse);
    ops::attention_forward(params());
  }
};

KvAttn make_kv_attn(const AttnCase& c, const std::vector<int>& lens_k) {
  const int64_t t = c.rows(), nh = c.heads + 2 * c.kv_heads;
  const int64_t tk = std::accumulate(lens_k.begin(), lens_k.end(), int64_t{0});
  return {c,
          lens_k,
          randn({t, nh, c.dim}, DType::F64, "attn_kv.qkv"),
          randn({tk, 2 * c.kv_heads, c.dim}, DType::F64, "attn_kv.kv"),
          empty({t, c.heads, c.dim}, DType::F64, Device::CPU),
          empty({t, c.heads}, DType::F64, Device::CPU),
          offsets_tensor(offsets_of(c.lens)),
          offsets_tensor(offsets_of(lens_k))};
}

// Queries at the end of longer key sequences: sequences without queries (keys of documents that
// ended in an earlier chunk) and without keys at all, one query among many keys, windows that
// leave the oldest keys unseen, GQA; causal and not.
struct KvCase {
  AttnCase c;
  std::vector<int> lens_k;
};
const std::vector<KvCase> kKvCases = {
    {{{3, 0, 4}, 4, 2, 6, true, 0}, {5, 2, 4}},
    {{{1, 2, 0, 3}, 6, 2, 4, true, 3}, {7, 2, 0, 6}},
    {{{4, 2}, 3, 1, 6, false, 0}, {6, 5}},
    {{{2, 0, 5}, 4, 4, 5, false, 2}, {6, 3, 5}},
};

}  // namespace

TEST_CASE("attention with separate keys: backward matches fp64 finite differences (q heads, kv)") {
  for (const KvCase& kc : kKvCases) {
    SUBCASE(kc.c.name().c_str()) {
      KvAttn a = make_kv_attn(kc.c, kc.lens_k);
      Owned r = randn(a.out->shape, DType::F64, "attn_kv.r");
      a.forward();
      Owned dqkv = empty(a.qkv->shape, DType::F64, Device::CPU);
      Owned dkv = empty(a.kv->shape, DType::F64, Device::CPU);
      poison(dqkv);
      poison(dkv);
      ops::attention_backward({a.params(), r, dqkv, dkv});
      // dqkv: the q heads are written; the k and v heads are left as they were (poisoned here)
      // and are no gradient: qkv's own k and v heads do not enter the output (0 below).
      const int64_t t = a.qkv->size(0), h = kc.c.heads, hkv = kc.c.kv_heads;
      CHECK(all_nan(rows_heads(dqkv, 0, t, h, 2 * hkv)));
      Owned dqkv_full = zeros(a.qkv->shape, DType::F64, Device::CPU);
      for (int64_t i = 0; i < t; ++i)
        for (int64_t e = 0; e < h * kc.c.dim; ++e)
          set(dqkv_full, i * (h + 2 * hkv) * kc.c.dim + e,
              get(dqkv, i * (h + 2 * hkv) * kc.c.dim + e));
      auto loss = [&] {
        a.forward();
        return projection(a.out, r);
      };
      const Comparison cq = finite_difference_check(loss, a.qkv, dqkv_full, "dqkv", 1 << 20);
      INFO(cq.report);
      CHECK(cq.rel_rms <= kGradTol);
      const Comparison ck = finite_difference_check(loss, a.kv, dkv, "dkv", 1 << 20);
      INFO(ck.report);
      CHECK(ck.rel_rms <= kGradTol);
    }
  }
}

TEST_CASE("attention with separate keys: forward matches a dense masked softmax (end-aligned)") {
  for (const KvCase& kc : kKvCases) {
    SUBCASE(kc.c.name().c_str()) {
      KvAttn a = make_kv_attn(kc.c, kc.lens_k);
      a.forward();
      const AttnCase& c = kc.c;
      const int64_t h = c.heads, g_size = c.heads / c.kv_heads, d = c.dim, nh = h + 2 * c.kv_heads;
      const double scale = c.softmax_scale();
      Owned out = empty(a.out->shape, DType::F64, Device::CPU),
            lse = empty(a.lse->shape, DType::F64, Device::CPU);
      int64_t b = 0, bk = 0;
      for (size_t s = 0; s < c.lens.size(); b += c.lens[s], bk += kc.lens_k[s], ++s) {
        const int64_t lq = c.lens[s], lk = kc.lens_k[s];
        for (int64_t hh = 0; hh < h; ++hh)
          for (int64_t i = 0; i < lq; ++i) {
            const int64_t pos = i + lk - lq;  // the last lq of the lk positions
            std::vector<double> w(static_cast<size_t>(lk), -INFINITY);
            double m = -INFINITY;
            for (int64_t j = 0; j < lk; ++j) {
              if ((c.causal && j > pos) || (c.window > 0 && pos - j >= c.window)) continue;
              double dot = 0;
              for (int64_t e = 0; e < d; ++e)
                dot += get(a.qkv, ((b + i) * nh + hh) * d + e) *
                       get(a.kv, ((bk + j) * 2 * c.kv_heads + hh / g_size) * d + e);
              w[j] = scale * dot;
              m = std::max(m, w[j]);
            }
            double z = 0;
            for (int64_t j = 0; j < lk; ++j) z += std::exp(w[j] - m);
            for (int64_t e = 0; e < d; ++e) {
              double o = 0;
              for (int64_t j = 0; j < lk; ++j)
                o += std::exp(w[j] - m) / z *
                     get(a.kv, ((bk + j) * 2 * c.kv_heads + c.kv_heads + hh / g_size) * d + e);
              out.ptr<double>()[((b + i) * h + hh) * d + e] = o;
            }
            lse.ptr<double>()[(b + i) * h + hh] = m + std::log(z);
          }
      }
      CHECK_CLOSE(a.out.t, out.t, 1e-13);
      CHECK_CLOSE(a.lse.t, lse.t, 1e-13);
    }
  }
}

TEST_CASE("attention with separate keys: keys no query sees get dk = dv = 0") {
  // Sequence 1 has 4 keys and no query; in sequence 0 (queries at positions 3, 4) the window of
  // 2 leaves keys 0 and 1 unseen.
  KvAttn a = make_kv_attn({{2, 0, 3}, 4, 2, 6, true, 2}, {5, 4, 3});
  Owned r = randn(a.out->shape, DType::F64, "attn_kv.r");
  a.forward();
  Owned dqkv = empty(a.qkv->shape, DType::F64, Device::CPU),
        dkv = empty(a.kv->shape, DType::F64, Device::CPU);
  poison(dkv);
  ops::attention_backward({a.params(), r, dqkv, dkv});
  const int64_t row = 2 * 2 * 6;
  for (int64_t j = 0; j < 12; ++j) {
    const bool seen = (j >= 2 && j <= 4) || j >= 9;
    double sq = 0;
    for (int64_t e = 0; e < row; ++e) sq += get(dkv, j * row + e) * get(dkv, j * row + e);
    CAPTURE(j);
    CHECK(std::isfinite(sq));
    CHECK((sq > 0) == seen);
  }
}

TEST_CASE("attention micro-sequences: chunks with their key prefix reproduce the whole batch") {
  // Several documents of odd lengths (one of 1 token) cut into 2 and 3 chunks, inside documents
  // and at a document boundary (22 = 21 + 1); keys either the rows from the first document the
  // chunk touches (slice_varlen) or the whole prefix of the batch (documents without queries).
  // Head dims of the GPU's kernels (64, 128) and of its fallback (32, 80).
  const std::vector<int> lens = {21, 1, 50, 33, 7};
  const std::vector<std::vector<int64_t>> cuttings = {{0, 57, 112}, {0, 22, 80, 112}};
  for (const auto& [dim, window] : {std::pair{64, 0}, {128, 9}, {32, 0}, {80, 20}}) {
    const AttnCase c{lens, 4, 2, dim, true, window};
    Attn full = make_attn(c, DType::F64);
    Owned r = randn(full.out->shape, DType::F64, "attn.r");
    full.forward();
    Owned dfull = backward(full, r);
    const int64_t t = c.rows(), h = c.heads, hkv = c.kv_heads;
    Owned kv_all = rows_heads(full.qkv, 0, t, h, 2 * hkv);  // the batch's k, v heads
    for (const auto& cuts : cuttings)
      for (bool prefix : {false, true}) {
        CAPTURE(c.name());
        CAPTURE(cuts.size() - 1);
        CAPTURE(prefix);
        Owned dkv_sum = zeros(kv_all->shape, DType::F64, Device::CPU);
        for (const AttentionChunk& ch : attention_chunks(lens, cuts, prefix)) {
          const int64_t n = ch.end - ch.begin, nk = ch.end - ch.key_begin;
          Owned qkv = rows_heads(full.qkv, ch.begin, ch.end, 0, h + 2 * hkv);
          Owned kv = rows_heads(kv_all, ch.key_begin, ch.end, 0, 2 * hkv);
          Owned out = empty({n, h, dim}, DType::F64, Device::CPU),
                lse = empty({n, h}, DType::F64, Device::CPU);
          Owned cu = offsets_tensor(ch.cu_q), cu_k = offsets_tensor(ch.cu_k);
          poison(out);
          poison(lse);
          ops::AttentionParams p = full.params();
          p.qkv = qkv;
          p.out = out;
          p.lse = lse;
          p.cu_seqlens = cu;
          p.max_seqlen = ch.max_q;
          p.kv = kv;
          p.cu_seqlens_k = cu_k;
          p.max_seqlen_k = ch.max_k;
          ops::attention_forward(p);
          CHECK_CLOSE(out.t, rows_heads(full.out.t.view({t, h, dim}), ch.begin, ch.end, 0, h).t,
                      1e-14);
          Owned lse_full = rows_heads(full.lse.t.view({t, h, 1}), ch.begin, ch.end, 0, h);
          CHECK_CLOSE(lse.t, lse_full->view({n, h}), 1e-14);
          Owned dqkv = empty(qkv->shape, DType::F64, Device::CPU),
                dkv = empty({nk, 2 * hkv, dim}, DType::F64, Device::CPU);
          poison(dqkv);
          poison(dkv);
          Owned dout = rows_heads(r.t.view({t, h, dim}), ch.begin, ch.end, 0, h);
          ops::attention_backward({p, dout, dqkv, dkv});
          CHECK_CLOSE(rows_heads(dqkv, 0, n, 0, h).t, rows_heads(dfull, ch.begin, ch.end, 0, h).t,
                      1e-14);
          CHECK(all_nan(rows_heads(dqkv, 0, n, h, 2 * hkv)));
          for (int64_t i = 0; i < dkv->numel(); ++i)
            dkv_sum.ptr<double>()[ch.key_begin * 2 * hkv * dim + i] += dkv.ptr<double>()[i];
        }
        CHECK_CLOSE(dkv_sum.t, rows_heads(dfull, 0, t, h, 2 * hkv).t, 1e-13);
      }
  }
}

TEST_CASE("attention with separate keys rejects bad arguments, naming them") {
  KvAttn a = make_kv_attn({{3, 2}, 4, 2, 6, true, 0}, {4, 2});
  ops::AttentionParams p = a.params();
  ops::attention_forward(p);  // the baseline is accepted
  p.max_seqlen_k = 3;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("max_seqlen_k"), Error);
  Owned short_k = offsets_tensor({0, 2, 6});  // sequence 0: 2 keys for 3 queries
  p = a.params();
  p.cu_seqlens_k = short_k;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("keys (cu_seqlens_k)"), Error);
  Owned wrong = empty({6, 3, 6}, DType::F64, Device::CPU);
  p = a.params();
  p.kv = wrong;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("kv"), Error);
  Attn plain = make_attn({{3, 2}, 4, 2, 6, true, 0}, DType::F64);
  p = plain.params();
  p.cu_seqlens_k = a.cu_k;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("without kv"), Error);
  Owned dout = empty(a.out->shape, DType::F64, Device::CPU),
        dqkv = empty(a.qkv->shape, DType::F64, Device::CPU);
  CHECK_THROWS_WITH_AS(ops::attention_backward({a.params(), dout, dqkv}), doctest::Contains("dkv"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::attention_backward({plain.params(), dout, plain.qkv.t, a.kv.t}),
                       doctest::Contains("dkv"), Error);
}
