// The mixture-of-experts layer under tensor parallelism (each rank F / tp features of every
// expert, the router replicated), with and without sequence parallelism, against the same layer
// on one rank: outputs, aux losses, input gradients, every rank's block of the expert weight
// gradients (full_index: dim 1 of w_gate / w_up, dim 2 of w_out) and the replicated router's
// gradient (summed over tp under sequence parallelism, where each rank takes its token shard).
// Jitter on, so the noise must agree across ranks too. A second layer has Qwen2-MoE's parts: a
// shared expert (split as the dense MLP) with its replicated sigmoid gate, top-k weights not
// renormalised. f64 on the CPU: equal to rounding.
#include <doctest/doctest.h>

#include <cmath>

#include "comm/comm.h"
#include "layers/moe.h"
#include "tests/common/gradcheck.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr double kTol = 1e-10;

double rel_err(const Tensor& got, const Tensor& ref) {
  double e = 0, r = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    e += (get(got, i) - get(ref, i)) * (get(got, i) - get(ref, i));
    r += get(ref, i) * get(ref, i);
  }
  return r > 0 ? std::sqrt(e / r) : std::sqrt(e);
}

}  // namespace

TEST_CASE("mixture of experts: tensor parallel (and sequence parallel) reproduces one rank") {
  Comm& tp = world();
  const int r = tp.rank(), n = tp.size();
  const int64_t T = 24, C = 10;
  for (const int64_t shared : {0, 12}) {
  CAPTURE(shared);
  layers::MoeConfig c{.hidden_size = C, .ffn_hidden_size = 24, .num_experts = 5, .top_k = 2,
                      .norm_topk_prob = shared == 0, .shared_ffn_size = shared,
                      .aux_loss_coef = 0.1f, .z_loss_coef = 0.05f, .jitter = 0.1f,
                      .init_std = 0.3, .num_layers = 2};
  ParamTable st;
  layers::Moe::declare(st, "moe", c);
  ParamStore ss(st, Device::CPU, DType::F64);
  randomize_weights(ss, "moe.tp", 0.5);
  ParamTable pt(r, n);
  layers::Moe::declare(pt, "moe", c);
  ParamStore ps(pt, Device::CPU, DType::F64);
  for (const ParamSpec& p : pt.entries()) {
    const ParamSpec& s = st.get(p.name);
    for (int64_t i = 0; i < p.shape.numel(); ++i)
      set(ps.weights_flat(), p.offset + i, get(ss.weights_flat(), s.offset + full_index(p, i)));
  }
  Owned x = randn({T, C}, DType::F64, "moe.tp.x"), dy = randn({T, C}, DType::F64, "moe.tp.dy");
  const float scale = 0.6f;
  const uint64_t seed = 99;
  const layers::Env env1{Device::CPU, DType::F64};
  layers::Moe m1(ss, "moe", c), mp(ps, "moe", c);
  Owned y1 = empty({T, C}, DType::F64, Device::CPU), dx1 = empty({T, C}, DType::F64, Device::CPU);
  layers::MoeSaved s1;
  m1.forward(env1, x, y1, s1, seed);
  m1.backward(env1, dy, x, s1, dx1, scale);
  const double aux1 = layers::Moe::aux_loss(s1);

  for (bool sp : {false, true}) {
    CAPTURE(sp);
    CAPTURE(n);
    const layers::Env env{Device::CPU, DType::F64, &tp, sp};
    const int64_t rows = sp ? T / n : T, r0 = sp ? r * rows : 0;
    ps.zero_grads();
    Owned y = empty({rows, C}, DType::F64, Device::CPU), dx = empty({rows, C}, DType::F64, Device::CPU);
    layers::MoeSaved s;
    mp.forward(env, x->slice(r0, r0 + rows), y, s, seed);
    CHECK(rel_err(y, y1->slice(r0, r0 + rows)) < kTol);
    CHECK(layers::Moe::aux_loss(s) == doctest::Approx(aux1).epsilon(1e-12));
    mp.backward(env, dy->slice(r0, r0 + rows), x->slice(r0, r0 + rows), s, dx, scale);
    CHECK(rel_err(dx, dx1->slice(r0, r0 + rows)) < kTol);
    for (const ParamSpec& p : pt.entries()) {
      INFO(p.name);
      const ParamSpec& q = st.get(p.name);
      Owned got = empty(p.shape, DType::F64, Device::CPU), want = empty(p.shape, DType::F64, Device::CPU);
      for (int64_t i = 0; i < p.shape.numel(); ++i) {
        set(got, i, get(ps.grads_flat(), p.offset + i));
        set(want, i, get(ss.grads_flat(), q.offset + full_index(p, i)));
      }
      if (p.split_dim < 0 && sp) tp.all_reduce(got);  // partial sums over the token shards
      CHECK(rel_err(got, want) < kTol);
    }
  }
}
}
