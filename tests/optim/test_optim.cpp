#include <doctest/doctest.h>

#include <cmath>

#include "comm/comm.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "tests/common/tiny.h"

using namespace engine;

TEST_CASE("learning-rate schedules: warmup, cosine, linear, constant, floor") {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  o.decay_steps = 10;
  o.decay = DecayKind::Cosine;
  CHECK(learning_rate(o, 1) == doctest::Approx(0.25));
  CHECK(learning_rate(o, 4) == doctest::Approx(1.0));
  CHECK(learning_rate(o, 9) == doctest::Approx(0.1 + 0.9 * 0.5));  // halfway through decay
  CHECK(learning_rate(o, 14) == doctest::Approx(0.1));
  CHECK(learning_rate(o, 100) == doctest::Approx(0.1));
  o.decay = DecayKind::Linear;
  CHECK(learning_rate(o, 6) == doctest::Approx(1.0 - 0.9 * 0.2));
  o.decay = DecayKind::Constant;
  CHECK(learning_rate(o, 50) == doctest::Approx(1.0));
  o.warmup_steps = 0;
  o.decay = DecayKind::Cosine;
  CHECK(learning_rate(o, 0) == doctest::Approx(1.0));
}

TEST_CASE("AdamW: decoupled weight decay skips norms and biases; clipping scales the update") {
  ModelConfig c = testing::tiny_model(ModelFamily::GPT2);
  auto model = make_model(c, Device::CPU, DType::F32);
  ParamStore& p = model->params();
  p.init(3);
  OptimizerConfig o;
  o.lr = 0.1;
  o.warmup_steps = 0;
  o.decay = DecayKind::Constant;
  o.weight_decay = 0.5;
  o.grad_clip = 0;
  AdamW opt(p, o, world(), 0, 3);
  const float w_before = p.weight("layers.0.attn.wq").ptr<float>()[7];
  const float n_before = p.weight("layers.0.norm1.weight").ptr<float>()[2];
  p.zero_grads();
  StepStats st = opt.step(1);
  CHECK(st.grad_norm == 0);
  // zero gradient: Adam's term is 0, only decay acts: w <- w - lr * wd * w
  CHECK(p.weight("layers.0.attn.wq").ptr<float>()[7] == doctest::Approx(w_before * (1 - 0.1 * 0.5)));
  CHECK(p.weight("layers.0.norm1.weight").ptr<float>()[2] == n_before);

  // Clipping: a gradient of norm 10 clipped to 1 moves Adam's first step exactly as much
  // (Adam normalises), but the moments see the clipped gradient.
  o.weight_decay = 0;
  o.grad_clip = 1.0;
  AdamW opt2(p, o, world(), 0, 3);
  p.zero_grads();
  Tensor g = p.grads_flat();
  const int64_t off = p.table().get("layers.1.mlp.w_out").offset;
  g.ptr<float>()[off] = 6.f;
  g.ptr<float>()[off + 1] = 8.f;
  st = opt2.step(1);
  CHECK(st.grad_norm == doctest::Approx(10.0));
  CHECK(st.clip_scale == doctest::Approx(0.1).epsilon(1e-5));
  CHECK(opt2.exp_avg().ptr<float>()[off] == doctest::Approx((1 - o.beta1) * 0.6).epsilon(1e-5));
}
