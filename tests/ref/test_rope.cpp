// Rotary embedding: against the rotate-half formula written out here, forward then backward is
// the identity (times m^2 with yarn's scale m), rotated q . k depends only on the position
// difference, heads past rotated_heads stay bit-identical, backward vs fp64 finite differences,
// f32 vs f64, checks. The scaled frequencies (linear, llama3, yarn) against transformers'
// formulas written out again here over all dims at once, as modeling_rope_utils computes them,
// and against values worked out by hand from them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/rope.h"
#include "tests/common/testing.h"
#include "tests/ref/helpers.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::reftest;

namespace {

using ops::RopeParams;
using K = RopeScalingKind;

RopeParams plain(double theta) { return RopeParams{.theta = theta}; }
RopeParams linear(double theta, double factor) {
  return RopeParams{.theta = theta, .kind = K::Linear, .factor = factor};
}
RopeParams llama3(double theta, double factor, double low, double high, double original) {
  return RopeParams{.theta = theta, .kind = K::Llama3, .factor = factor, .low_freq_factor = low,
                    .high_freq_factor = high, .original_max_position_embeddings = original};
}
RopeParams yarn(double theta, double factor, double original, double attention_factor,
                bool truncate = true, double beta_fast = 32, double beta_slow = 1) {
  return RopeParams{.theta = theta, .kind = K::Yarn, .factor = factor,
                    .original_max_position_embeddings = original, .beta_fast = beta_fast,
                    .beta_slow = beta_slow, .truncate = truncate,
                    .attention_factor = attention_factor};
}

// transformers' inverse frequencies, the whole vector at once as its _compute_*_parameters
// write them (the engine computes one dim at a time, ops/rope_params.h).
std::vector<double> hf_inv_freq(const RopeParams& p, int d) {
  std::vector<double> f;
  for (int i = 0; i < d; i += 2) f.push_back(1.0 / std::pow(p.theta, double(i) / d));
  if (p.kind == K::Linear)
    for (double& v : f) v /= p.factor;
  if (p.kind == K::Llama3) {
    const double L = p.original_max_position_embeddings;
    const double low_wavelen = L / p.low_freq_factor, high_wavelen = L / p.high_freq_factor;
    for (double& v : f) {
      const double wavelen = 2 * M_PI / v;
      const double llama = wavelen > low_wavelen ? v / p.factor : v;
      const double smooth = (L / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      v = medium ? (1 - smooth) * llama / p.factor + smooth * llama : llama;
    }
  }
  if (p.kind == K::Yarn) {
    auto correction_dim = [&](double rotations) {
      return (d * std::log(p.original_max_position_embeddings / (rotations * 2 * M_PI))) /
             (2 * std::log(p.theta));
    };
    double low = correction_dim(p.beta_fast), high = correction_dim(p.beta_slow);
    if (p.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, d - 1.0);
    if (low == high) high += 0.001;
    for (size_t i = 0; i < f.size(); ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation_factor = 1 - ramp;
      f[i] = f[i] / p.factor * (1 - extrapolation_factor) + f[i] * extrapolation_factor;
    }
  }
  return f;
}

double hf_scale(const RopeParams& p) { return p.kind == K::Yarn ? p.attention_factor : 1.0; }

struct RopeCase {
  int64_t t, heads, rotated, dim;
  RopeParams rope;
  int max_pos;
  const char* label;
  std::string name() const {
    return "T" + std::to_string(t) + " NH" + std::to_string(heads) + " rot" +
           std::to_string(rotated) + " D" + std::to_string(dim) + " theta " +
           std::to_string(static_cast<int>(rope.theta)) + " " + label;
  }
};
const std::vector<RopeCase> kRopeCases = {
    {1, 1, 1, 2, plain(10000), 5, "default"},
    {5, 3, 2, 6, plain(10000), 7, "default"},
    {7, 4, 4, 10, plain(500000), 100, "default"},
    {3, 10, 8, 64, plain(10000), 4096, "default"},
    {6, 5, 0, 6, plain(10000), 9, "default"},
    {5, 3, 2, 16, linear(10000, 4), 300, "linear 4"},
    {6, 4, 3, 64, llama3(500000, 8, 1, 4, 32), 200, "llama3 8 (1, 4) L32"},
    {4, 2, 2, 10, llama3(10000, 2, 2, 3, 16), 200, "llama3 2 (2, 3) L16"},
    {6, 3, 2, 64, yarn(10000, 4, 32, 0.1 * std::log(4.0) + 1), 200, "yarn 4 L32"},
    {5, 3, 3, 64, yarn(10000, 4, 32, 1.3, false), 200, "yarn 4 L32 untruncated af 1.3"},
    {3, 2, 1, 128, yarn(10000, 8, 4096, 1.2, true, 16, 2), 40000, "yarn 8 L4096 beta 16, 2"},
};

// Positions restarting like packed documents: random in [0, max_pos).
Owned positions_for(const RopeCase& c) { return randint({c.t}, 0, c.max_pos, "rope.pos"); }

}  // namespace

TEST_CASE("rope forward matches the rotate-half formula and leaves other heads untouched") {
  for (const RopeCase& c : kRopeCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dt : {DType::F32, DType::F64}) {
        INFO(float_name(dt));
        Owned x = randn({c.t, c.heads, c.dim}, dt, "rope.x"), pos = positions_for(c);
        Owned ref = converted(x, DType::F64);
        const int64_t half = c.dim / 2;
        const std::vector<double> freq = hf_inv_freq(c.rope, static_cast<int>(c.dim));
        const double m = hf_scale(c.rope);
        for (int64_t t = 0; t < c.t; ++t)
          for (int64_t h = 0; h < c.rotated; ++h)
            for (int64_t i = 0; i < half; ++i) {
              const double angle = pos.ptr<int32_t>()[t] * freq[static_cast<size_t>(i)];
              const int64_t base = (t * c.heads + h) * c.dim;
              const double a = get(x, base + i), b = get(x, base + i + half);
              ref.ptr<double>()[base + i] = m * (a * std::cos(angle) - b * std::sin(angle));
              ref.ptr<double>()[base + i + half] = m * (b * std::cos(angle) + a * std::sin(angle));
            }
        Owned x0 = clone(x);
        ops::rope_forward(x, pos, static_cast<int>(c.rotated), c.rope);
        CHECK_CLOSE(x.t, ref.t, dt == DType::F64 ? 1e-12 : 2e-7);  // f64: angles up to 4e4 rad
        const int64_t row = c.heads * c.dim;
        bool untouched = true;
        for (int64_t t = 0; t < c.t; ++t)
          for (int64_t j = c.rotated * c.dim; j < row; ++j)
            untouched = untouched && get(x, t * row + j) == get(x0, t * row + j);
        CHECK(untouched);
      }
    }
  }
}

TEST_CASE("rope backward undoes forward (identity, times m^2) and matches fp64 finite differences") {
  for (const RopeCase& c : kRopeCases) {
    SUBCASE(c.name().c_str()) {
      Owned x = randn({c.t, c.heads, c.dim}, DType::F64, "rope.x"), pos = positions_for(c);
      Owned y = clone(x), x_m2 = clone(x);
      const double m = hf_scale(c.rope);
      const int64_t row = c.heads * c.dim;
      for (int64_t t = 0; t < c.t; ++t)
        for (int64_t j = 0; j < c.rotated * c.dim; ++j) set(x_m2, t * row + j, m * m * get(x, t * row + j));
      ops::rope_forward(y, pos, static_cast<int>(c.rotated), c.rope);
      ops::rope_backward(y, pos, static_cast<int>(c.rotated), c.rope);
      CHECK_CLOSE(y.t, x_m2.t, 1e-14);
      Owned r = randn(x->shape, DType::F64, "rope.r"), dx = clone(r);
      ops::rope_backward(dx, pos, static_cast<int>(c.rotated), c.rope);
      auto loss = [&] {
        Owned out = clone(x);
        ops::rope_forward(out, pos, static_cast<int>(c.rotated), c.rope);
        return projection(out, r);
      };
      CHECK_CLOSE(dx.t, numeric_grad(x, loss).t, kGradTol);
    }
  }
}

TEST_CASE("rope: rotated q . k depends only on the position difference") {
  // Rows 0, 1 hold q at p and k at p'; rows 2, 3 the same vectors at p + s and p' + s.
  for (int64_t dim : {6, 10, 64}) {
    CAPTURE(dim);
    Owned qk = randn({2, 1, dim}, DType::F64, "rope.qk");
    Owned x = empty({4, 1, dim}, DType::F64, Device::CPU),
          pos = empty({4}, DType::I32, Device::CPU);
    for (int64_t i = 0; i < 4 * dim; ++i) set(x, i, get(qk, i % (2 * dim)));
    Owned pq = randint({3}, 0, 2000, "rope.shift");
    const int32_t p = pq.ptr<int32_t>()[0], p2 = pq.ptr<int32_t>()[1], s = pq.ptr<int32_t>()[2];
    for (int32_t i : {0, 1, 2, 3}) pos.ptr<int32_t>()[i] = (i % 2 ? p2 : p) + (i >= 2 ? s : 0);
    ops::rope_forward(x, pos, 1, plain(10000));
    double d01 = 0, d23 = 0;
    for (int64_t j = 0; j < dim; ++j) {
      d01 += get(x, j) * get(x, dim + j);
      d23 += get(x, 2 * dim + j) * get(x, 3 * dim + j);
    }
    CHECK(d23 == doctest::Approx(d01).epsilon(1e-10));
  }
}

TEST_CASE("rope f32 agrees with f64") {
  for (const RopeParams& rope : {plain(10000), yarn(10000, 4, 8, 1.2)}) {
    const RopeCase c{9, 6, 4, 10, rope, 300, ""};
    Owned x32 = randn({c.t, c.heads, c.dim}, DType::F32, "rope.x"), pos = positions_for(c);
    Owned x64 = converted(x32, DType::F64);
    ops::rope_forward(x32, pos, 4, c.rope);
    ops::rope_forward(x64, pos, 4, c.rope);
    CHECK_CLOSE(x32.t, x64.t, 2e-7);
    ops::rope_backward(x32, pos, 4, c.rope);
    ops::rope_backward(x64, pos, 4, c.rope);
    CHECK_CLOSE(x32.t, x64.t, 2e-7);
  }
}

TEST_CASE("rope rejects bad arguments, naming them") {
  Owned x = randn({3, 2, 5}, DType::F32, "bad.x"), pos = randint({3}, 0, 9, "bad.pos");
  CHECK_THROWS_WITH_AS(ops::rope_forward(x, pos, 1, plain(10000)), doctest::Contains("even"), Error);
  Owned x6 = randn({3, 2, 6}, DType::F32, "bad.x6");
  CHECK_THROWS_WITH_AS(ops::rope_forward(x6, pos, 3, plain(10000)), doctest::Contains("rotated_heads"),
                       Error);
  Owned pos4 = randint({4}, 0, 9, "bad.pos4");
  CHECK_THROWS_WITH_AS(ops::rope_backward(x6, pos4, 1, plain(10000)), doctest::Contains("positions"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::rope_forward(x6, pos, 1, plain(0)), doctest::Contains("theta"), Error);
  CHECK_THROWS_WITH_AS(ops::rope_forward(x6, pos, 1, linear(10000, 0)), doctest::Contains("factor"), Error);
  CHECK_THROWS_WITH_AS(ops::rope_forward(x6, pos, 1, llama3(10000, 8, 4, 4, 32)),
                       doctest::Contains("low_freq_factor < high_freq_factor"), Error);
  CHECK_THROWS_WITH_AS(ops::rope_forward(x6, pos, 1, llama3(10000, 8, 1, 4, 0)),
                       doctest::Contains("original_max_position_embeddings"), Error);
  CHECK_THROWS_WITH_AS(ops::rope_backward(x6, pos, 1, yarn(10000, 4, 32, 0)),
                       doctest::Contains("attention_factor"), Error);
}

// Values worked out from transformers' formulas (modeling_rope_utils) in fp64 by hand: linear
// divides every frequency by the factor; llama3 (L = 32, low 1, high 4: wavelengths below 8 kept,
// above 32 divided by 8, smoothed between: dims 1..3 of D = 64, theta 5e5); yarn (L = 32,
// D = 64, theta 1e4: correction range [0, 6] truncated, [0, 5.6558] not; L = 4096, D = 128,
// factor 8: [20, 46]).
TEST_CASE("rope inverse frequencies match transformers' formulas for each scaling type") {
  struct Expect {
    const char* label;
    RopeParams rope;
    int d;
    std::vector<std::pair<int, double>> values;
  };
  const std::vector<Expect> cases = {
      {"none", plain(10000), 16, {{0, 1.0}, {1, 0.31622776601683794}, {7, 3.1622776601683794e-4}}},
      {"linear", linear(10000, 4), 16, {{0, 0.25}, {1, 0.07905694150420949}, {2, 0.025}}},
      {"llama3", llama3(500000, 8, 1, 4, 32), 64,
       {{0, 1.0}, {1, 0.5435406618701049}, {2, 0.2146673579985814}, {3, 0.0781481555089739},
        {4, 0.02424034309358572}, {5, 0.016085921679081315}, {31, 3.7673226901739635e-07}}},
      {"yarn", yarn(10000, 4, 32, 1), 64,
       {{0, 1.0}, {1, 0.6561574331658989}, {3, 0.26356031464286395}, {6, 0.044456985250973066},
        {7, 0.0333380358040831}, {31, 3.33380358040831e-05}}},
      {"yarn untruncated", yarn(10000, 4, 32, 1, false), 64,
       {{0, 1.0}, {1, 0.6504521238265817}, {3, 0.25393532099938626}, {5, 0.07990562782827555},
        {6, 0.044456985250973066}, {31, 3.33380358040831e-05}}},
      {"yarn L4096", yarn(10000, 8, 4096, 1), 128,
       {{0, 1.0}, {10, 0.23713737056616555}, {20, 0.056234132519034905}, {30, 0.008847401809545132},
        {40, 0.0010338215427473545}, {63, 1.4434774808618228e-05}}},
  };
  for (const Expect& e : cases) {
    SUBCASE(e.label) {
      for (const auto& [i, want] : e.values) {
        CAPTURE(i);
        CHECK(ops::rope_inv_freq(e.rope, i, e.d) == doctest::Approx(want).epsilon(1e-13));
      }
      const std::vector<double> hf = hf_inv_freq(e.rope, e.d);
      for (int i = 0; i < e.d / 2; ++i) {
        CAPTURE(i);
        CHECK(ops::rope_inv_freq(e.rope, i, e.d) == doctest::Approx(hf[static_cast<size_t>(i)]).epsilon(1e-13));
      }
    }
  }
  CHECK(ops::rope_output_scale(yarn(10000, 4, 32, 1.25)) == 1.25);
  CHECK(ops::rope_output_scale(llama3(10000, 8, 1, 4, 32)) == 1.0);
}

// 2-D positions as transformers' PixtralRotaryEmbedding builds them: freqs = theta^(-2j/D) for
// j < D/2; a patch at (row, col) gets [row freqs[0::2], col freqs[1::2]] (D/2 angles), repeated
// for both halves, and x cos + rotate_half(x) sin.
TEST_CASE("rope with 2-D positions (patch rows and columns) matches Pixtral's construction") {
  const int64_t t = 11, heads = 3, rotated = 2, d = 20;  // d / 4 = 5 pairs a coordinate
  const double theta = 10000.0;
  Owned x = randn({t, heads, d}, DType::F64, "rope2d.x"), pos = randint({t, 2}, 0, 37, "rope2d.pos");
  std::vector<double> freqs;
  for (int64_t j = 0; j < d / 2; ++j) freqs.push_back(1.0 / std::pow(theta, 2.0 * static_cast<double>(j) / d));
  Owned ref = clone(x);
  for (int64_t r = 0; r < t; ++r) {
    std::vector<double> angle;
    for (int64_t j = 0; j < d / 2; j += 2) angle.push_back(pos.ptr<int32_t>()[2 * r] * freqs[static_cast<size_t>(j)]);
    for (int64_t j = 1; j < d / 2; j += 2) angle.push_back(pos.ptr<int32_t>()[2 * r + 1] * freqs[static_cast<size_t>(j)]);
    for (int64_t h = 0; h < rotated; ++h)
      for (int64_t k = 0; k < d; ++k) {
        const int64_t base = (r * heads + h) * d;
        const double a = angle[static_cast<size_t>(k % (d / 2))];
        const double rot = k < d / 2 ? -get(x, base + k + d / 2) : get(x, base + k - d / 2);
        ref.ptr<double>()[base + k] = get(x, base + k) * std::cos(a) + rot * std::sin(a);
      }
  }
  Owned y = clone(x);
  ops::rope_forward(y, pos, static_cast<int>(rotated), plain(theta));
  CHECK_CLOSE(y.t, ref.t, 1e-12);  // (heads past rotated: ref keeps x's values there)
  // The backward is the forward's transpose: <rope(x), g> = <x, rope_backward(g)>.
  Owned g = randn({t, heads, d}, DType::F64, "rope2d.g"), gb = clone(g);
  ops::rope_backward(gb, pos, static_cast<int>(rotated), plain(theta));
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < x->numel(); ++i) lhs += get(y, i) * get(g, i), rhs += get(x, i) * get(gb, i);
  CHECK(std::fabs(lhs - rhs) <= 1e-10 * std::fabs(lhs));
  // What 2-D positions cannot take, named.
  Owned x6 = randn({t, heads, 6}, DType::F64, "rope2d.x6"), pos3 = randint({t, 3}, 0, 5, "rope2d.pos3");
  CHECK_THROWS_WITH_AS(ops::rope_forward(x6, pos, 1, plain(theta)), doctest::Contains("multiple of 4"), Error);
  CHECK_THROWS_WITH_AS(ops::rope_forward(y, pos, 1, linear(theta, 2)), doctest::Contains("no frequency scaling"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::rope_forward(y, pos3, 1, plain(theta)), doctest::Contains("positions"), Error);
}
