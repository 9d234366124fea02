// fp64 finite-difference checks of every layer's hand-written backward: input gradients and
// all parameter gradients, on awkward sizes and packed documents of lengths 1, 5 and 7.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "layers/block.h"
#include "layers/embedding.h"
#include "layers/lm_head.h"
#include "models/micro_batch.h"
#include "ops/elementwise.h"
#include "tests/common/gradcheck.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

const layers::Env kEnv{Device::CPU, DType::F64};
constexpr double kTol = 1e-6;

// Builds a store for the parameters `declare` adds, with random weights.
ParamStore make_store(const std::function<void(ParamTable&)>& declare, const std::string& name) {
  ParamTable t;
  declare(t);
  ParamStore store(t, Device::CPU, DType::F64);
  randomize_weights(store, name);
  return store;
}

// Checks d(sum(y * R))/dx and /dparams for a layer given as forward(x, y) and backward(dy, dx).
void check_layer(ParamStore& store, Shape in, Shape out, const std::string& name,
                 const std::function<void(const Tensor&, const Tensor&)>& forward,
                 const std::function<void(const Tensor&, const Tensor&)>& backward) {
  Owned x = randn(in, DType::F64, name + ":x");
  Owned r = randn(out, DType::F64, name + ":r");
  Owned y = empty(out, DType::F64, Device::CPU);
  auto loss = [&] {
    forward(x, y);
    return dot(y, r);
  };
  store.zero_grads();
  Owned dx = empty(in, DType::F64, Device::CPU);
  poison(dx);
  loss();
  backward(r, dx);
  auto cx = finite_difference_check(loss, x, dx, name + " dx");
  INFO(cx.report);
  CHECK(cx.rel_rms < kTol);
  auto cw = finite_difference_check(loss, store.weights_flat(), store.grads_flat(), name + " dparams");
  INFO(cw.report);
  CHECK(cw.rel_rms < kTol);
}

Sample g_s0, g_s1;
MicroBatch packed_batch(const ModelConfig& c, bool cross_document) {
  g_s0 = make_sample({1, 5}, c.vocab_size, "seq0");
  g_s1 = make_sample({6}, c.vocab_size, "seq1");
  return make_micro_batch({&g_s0, &g_s1}, 6, cross_document, Device::CPU);
}

}  // namespace

TEST_CASE("layer gradients: norms") {
  struct Case {
    NormKind kind;
    bool bias;
  };
  for (Case k : std::vector<Case>{{NormKind::LayerNorm, true}, {NormKind::LayerNorm, false}, {NormKind::RMSNorm, false}}) {
    CAPTURE(static_cast<int>(k.kind));
    CAPTURE(k.bias);
    ParamStore store = make_store([&](ParamTable& t) { layers::Norm::declare(t, "n", 11, k.kind, k.bias); }, "norm");
    layers::Norm norm(store, "n", k.kind, 1e-5f, k.bias);
    layers::NormSaved saved;
    Tensor xin;
    check_layer(store, {7, 11}, {7, 11}, "norm",
                [&](const Tensor& x, const Tensor& y) { norm.forward(kEnv, x, y, saved); xin = x; },
                [&](const Tensor& dy, const Tensor& dx) { norm.backward(dy, xin, saved, dx); });
  }
}

// The block's fused residual norms (Norm::forward_residual / backward_residual) against the
// separate ops::add / add_inplace around the plain forms, bitwise, in f32 and f64 activations,
// on (B, T, C) tensors (the norm sees their rows), with sum in place of x as the block uses it.
TEST_CASE("norm residual forms equal the separate adds and plain norm bitwise") {
  struct Case {
    NormKind kind;
    bool bias;
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
  };
  for (DType act : {DType::F32, DType::F64}) {
    const layers::Env env{Device::CPU, act};
    for (Case k : std::vector<Case>{{NormKind::LayerNorm, true}, {NormKind::LayerNorm, false}, {NormKind::RMSNorm, false}}) {
      CAPTURE(dtype_name(act));
      CAPTURE(static_cast<int>(k.kind));
      CAPTURE(k.bias);
      ParamTable t;
      layers::Norm::declare(t, "n", 13, k.kind, k.bias);
      ParamStore store(t, Device::CPU, act);
      randomize_weights(store, "normres");
      layers::Norm norm(store, "n", k.kind, 1e-5f, k.bias);
      const Shape shape{2, 5, 13};
      Owned x = randn(shape, act, "normres:x", 2.0), r = randn(shape, act, "normres:r");
      Owned dy = randn(shape, act, "normres:dy"), dres = randn(shape, act, "normres:dres");

      Owned h = env.act_tensor(shape), y = env.act_tensor(shape), dx = env.act_tensor(shape);
      layers::NormSaved s;
      ops::add(x, r, h);
      norm.forward(env, h, y, s);
      store.zero_grads();
      norm.backward(dy, h, s, dx);
      ops::add_inplace(dx, dres);
      Owned grads = empty(store.grads_flat().shape, act, Device::CPU);
      copy_tensor(grads, store.grads_flat());

      Owned hf = empty(shape, act, Device::CPU), yf = env.act_tensor(shape), dxf = env.act_tensor(shape);
      copy_tensor(hf, x);  // sum over x, as the block does
      layers::NormSaved sf;
      norm.forward_residual(env, hf, r, hf, yf, sf);
      CHECK(same(hf, h));
      CHECK(same(yf, y));
      CHECK(same(sf.rstd, s.rstd));
      if (k.kind == NormKind::LayerNorm) CHECK(same(sf.mean, s.mean));
      store.zero_grads();
      norm.backward_residual(dy, hf, sf, dres, dxf);
      CHECK(same(dxf, dx));
      CHECK(same(store.grads_flat(), grads));
    }
  }
}

TEST_CASE("layer gradients: attention (GQA, RoPE, window, biases, qk_norm, packed documents)") {
  struct Case {
    const char* name;
    ModelFamily family;
    int heads, kv_heads, head_dim, window;
    bool cross_document;
    RopeScalingConfig rope_scaling = {};
  };
  RopeScalingConfig yarn;  // its ramp inside head_dim 8 at rope_theta 100: pairs 0..3
  yarn.type = RopeScalingKind::Yarn;
  yarn.factor = 4;
  yarn.original_max_position_embeddings = 64;
  yarn.attention_factor = 1.3;
  const std::vector<Case> cases = {
      {"gpt2 mha bias", ModelFamily::GPT2, 3, 3, 5, 0, false},
      {"llama gqa 3:1 rope", ModelFamily::Llama, 6, 2, 4, 0, false},
      {"llama gqa 2:1 cross-doc", ModelFamily::Llama, 4, 2, 6, 0, true},
      {"mistral window 2", ModelFamily::Mistral, 6, 3, 4, 2, true},
      {"llama yarn rope scaling", ModelFamily::Llama, 4, 2, 8, 0, false, yarn},
      {"qwen3 qk_norm, head_dim 6 x 6 heads != hidden 14", ModelFamily::Qwen3, 6, 2, 6, 0, false},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    ModelConfig c = tiny_model(k.family);
    c.num_heads = k.heads;
    c.num_kv_heads = k.kv_heads;
    c.head_dim = k.head_dim;
    c.sliding_window = k.window;
    c.rope_scaling = k.rope_scaling;
    ParamStore store = make_store([&](ParamTable& t) { layers::Attention::declare(t, "a", c); }, k.name);
    layers::Attention attn(store, "a", c);
    MicroBatch mb = packed_batch(c, k.cross_document);
    layers::AttentionSaved saved;
    Tensor xin;
    const Shape shape{mb.num_tokens, c.hidden_size};
    check_layer(store, shape, shape, k.name,
                [&](const Tensor& x, const Tensor& y) { attn.forward(kEnv, x, mb.segments(), y, saved); xin = x; },
                [&](const Tensor& dy, const Tensor& dx) { attn.backward(kEnv, dy, xin, mb.segments(), saved, dx); });
  }
}

TEST_CASE("layer gradients: MLPs (GELU with biases, SwiGLU)") {
  for (ModelFamily f : {ModelFamily::GPT2, ModelFamily::Llama}) {
    ModelConfig c = tiny_model(f);
    CAPTURE(family_name(f));
    ParamStore store = make_store([&](ParamTable& t) { layers::Mlp::declare(t, "m", c); }, "mlp");
    layers::Mlp mlp(store, "m", c);
    layers::MlpSaved saved;
    Tensor xin;
    check_layer(store, {9, c.hidden_size}, {9, c.hidden_size}, "mlp",
                [&](const Tensor& x, const Tensor& y) { mlp.forward(kEnv, x, y, saved); xin = x; },
                [&](const Tensor& dy, const Tensor& dx) { mlp.backward(kEnv, dy, xin, saved, dx); });
  }
}

TEST_CASE("layer gradients: transformer block") {
  for (ModelFamily f : {ModelFamily::GPT2, ModelFamily::Llama, ModelFamily::Mistral, ModelFamily::Qwen3}) {
    ModelConfig c = tiny_model(f);
    CAPTURE(family_name(f));
    ParamStore store = make_store([&](ParamTable& t) { layers::Block::declare(t, 0, c); }, "block");
    layers::Block block(store, 0, c);
    MicroBatch mb = packed_batch(c, false);
    layers::BlockSaved saved;
    Tensor xin;
    const Shape shape{mb.num_tokens, c.hidden_size};
    check_layer(store, shape, shape, "block",
                [&](const Tensor& x, const Tensor& y) {
                  block.forward(kEnv, x, mb.segments(), saved);
                  copy_tensor(y, saved.y);
                  xin = x;
                },
                [&](const Tensor& dy, const Tensor& dx) { block.backward(kEnv, dy, xin, mb.segments(), saved, dx); });
  }
}

// A vision encoder's block: attention + MLP over image patches, bidirectional within each image
// (ModelConfig::causal false), its RoPE 2-D over the patches' rows and columns (ops/rope.h).
TEST_CASE("layer gradients: a bidirectional block over image patches (2-D RoPE)") {
  ModelConfig c = tiny_model(ModelFamily::Llama);
  c.num_heads = 3;
  c.num_kv_heads = 3;
  c.head_dim = 8;  // (a multiple of 4: D/4 pairs turn with the row, D/4 with the column)
  c.causal = false;
  ParamStore store = make_store([&](ParamTable& t) { layers::Block::declare(t, 0, c); }, "vblock");
  layers::Block block(store, 0, c);
  const TwoImages im = two_images();  // 2 x 3 patches, then 1 x 2
  const layers::SegmentInfo& seg = im.seg;
  layers::BlockSaved saved;
  Tensor xin;
  const Shape shape{8, c.hidden_size};
  auto forward = [&](const Tensor& x, const Tensor& y) {
    block.forward(kEnv, x, seg, saved);
    copy_tensor(y, saved.y);
    xin = x;
  };
  check_layer(store, shape, shape, "vision block", forward,
              [&](const Tensor& dy, const Tensor& dx) { block.backward(kEnv, dy, xin, seg, saved, dx); });
  // Every patch sees its whole image, none of the other: the first patch's output moves with the
  // image's last patch and not with the next image's.
  Owned x = randn(shape, DType::F64, "vblock.x"), y0 = empty(shape, DType::F64, Device::CPU),
        y1 = empty(shape, DType::F64, Device::CPU), y2 = empty(shape, DType::F64, Device::CPU);
  forward(x, y0);
  const double x5 = x.ptr<double>()[5 * c.hidden_size];
  x.ptr<double>()[5 * c.hidden_size] += 0.5;  // patch 5: the first image's last
  forward(x, y1);
  x.ptr<double>()[5 * c.hidden_size] = x5;    // restored exactly (x + 0.5 - 0.5 need not be x)
  x.ptr<double>()[6 * c.hidden_size] += 0.5;  // patch 6: the second image's first
  forward(x, y2);
  double moved_by_own = 0, moved_by_other = 0;
  for (int64_t j = 0; j < c.hidden_size; ++j) {
    moved_by_own += std::fabs(get(y1, j) - get(y0, j));
    moved_by_other += std::fabs(get(y2, j) - get(y0, j));
  }
  CHECK(moved_by_own > 1e-6);
  CHECK(moved_by_other == 0);
}

TEST_CASE("layer gradients: embedding tables (tokens and learned positions)") {
  ModelConfig c = tiny_model(ModelFamily::GPT2);
  ParamStore store = make_store([&](ParamTable& t) { layers::Embedding::declare(t, c); }, "emb");
  layers::Embedding emb(store, c);
  const layers::Env env{Device::CPU, DType::F64};
  MicroBatch mb = packed_batch(c, false);
  Owned y = empty({mb.num_tokens, c.hidden_size}, DType::F64, Device::CPU);
  Owned r = randn(y->shape, DType::F64, "emb:r");
  auto loss = [&] {
    emb.forward(env, mb.tokens, mb.positions, y);
    return dot(y, r);
  };
  store.zero_grads();
  emb.backward(env, mb.tokens, mb.positions, r);
  auto cw = finite_difference_check(loss, store.weights_flat(), store.grads_flat(), "embedding");
  INFO(cw.report);
  CHECK(cw.rel_rms < kTol);
}

TEST_CASE("layer gradients: LM head with cross-entropy, tied and untied") {
  for (ModelFamily f : {ModelFamily::GPT2, ModelFamily::Llama}) {
    ModelConfig c = tiny_model(f);
    CAPTURE(family_name(f));
    ParamStore store = make_store(
        [&](ParamTable& t) {
          layers::Embedding::declare(t, c);
          layers::LmHead::declare(t, c);
        },
        "head");
    layers::LmHead head(store, c);
    MicroBatch mb = packed_batch(c, false);
    Owned x = randn({mb.num_tokens, c.hidden_size}, DType::F64, "head:x");
    const float scale = 0.37f;  // the gradient must carry grad_scale
    auto loss = [&] {
      layers::HeadSaved s;
      return scale * head.forward(kEnv, x, mb.labels, mb.loss_mask, false, 1.f, s);
    };
    store.zero_grads();
    layers::HeadSaved s;
    head.forward(kEnv, x, mb.labels, mb.loss_mask, true, scale, s);
    auto cx = finite_difference_check(loss, x, s.dx, "head dx");
    INFO(cx.report);
    CHECK(cx.rel_rms < kTol);
    auto cw = finite_difference_check(loss, store.weights_flat(), store.grads_flat(), "head dparams");
    INFO(cw.report);
    CHECK(cw.rel_rms < kTol);
  }
}
