// LoRA (layers/lora.h) in fp64: finite differences of the adapted attention, SwiGLU MLP, blocks and
// whole models with every base parameter frozen; the frozen parameters' place in the buffers;
// the adapted model at init equals the base model (B = 0).
#include <doctest/doctest.h>

#include <cstring>
#include <functional>

#include "layers/block.h"
#include "layers/lora.h"
#include "models/micro_batch.h"
#include "models/model.h"
#include "tests/common/gradcheck.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

const layers::Env kEnv{Device::CPU, DType::F64};
constexpr double kTol = 1e-6;

ModelConfig with_lora(ModelConfig c, std::vector<std::string> targets, int rank = 3, double alpha = 5) {
  c.lora.rank = rank;
  c.lora.alpha = alpha;
  c.lora.targets = std::move(targets);
  return c;
}

const std::vector<std::string> kAll = {"q", "k", "v", "o", "gate", "up", "down"};

ParamStore lora_store(const std::function<void(ParamTable&)>& declare, const ModelConfig& c, const std::string& name) {
  ParamTable t;
  layers::set_lora_freezing(t, c);
  declare(t);
  ParamStore store(t, Device::CPU, DType::F64);
  randomize_weights(store, name);  // B != 0, so that every path has a gradient
  return store;
}

// d(sum(y * R)) / dx and / d(the trainable parameters: the LoRA factors) by finite differences.
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
  auto cw = finite_difference_check(loss, store.weights_flat(), store.grads_flat(), name + " dlora", 600);
  INFO(cw.report);
  CHECK(cw.rel_rms < kTol);
}

}  // namespace

TEST_CASE("lora: frozen parameters live outside the trainable buffers; only the factors have gradients") {
  const ModelConfig c = with_lora(tiny_model(ModelFamily::Llama), kAll);
  const ParamTable t = model_param_table(c);
  int64_t lora = 0, frozen = 0, factors = 0;
  for (const ParamSpec& s : t.entries()) {
    CAPTURE(s.name);
    CHECK(s.frozen == !layers::is_lora_param(s.name));
    (s.frozen ? frozen : lora) += s.shape.numel();
    factors += s.frozen ? 0 : 1;
    if (s.name == "layers.1.attn.wq.lora_a") CHECK(s.shape == Shape{3, c.hidden_size});
    if (s.name == "layers.1.mlp.w_out.lora_b") CHECK(s.shape == Shape{c.hidden_size, 3});
  }
  CHECK(factors == 2 * 7 * c.num_layers);
  CHECK(t.num_parameters() == lora + frozen);
  // The trainable space: the factors and their alignment gaps only.
  CHECK(t.total_elements() >= lora);
  CHECK(t.total_elements() < lora + 64 * factors);
  CHECK(t.frozen_elements() >= frozen);
  // q, k, v and gate, up stay adjacent for their fused GEMMs.
  CHECK(t.get("layers.0.attn.wk").offset == t.get("layers.0.attn.wq").offset + t.get("layers.0.attn.wq").shape.numel());
  ParamStore store(t, Device::CPU, DType::F32);
  CHECK(store.capacity() == t.total_elements());
  CHECK(store.grads_flat().numel() == t.total_elements());
  CHECK_THROWS_WITH(store.grad("layers.0.attn.wq"), doctest::Contains("frozen"));
  // Init: A uniform in +-1/sqrt(in), B zero; the base as without LoRA, keyed by name.
  store.init(7);
  ParamStore plain(model_param_table(tiny_model(ModelFamily::Llama)), Device::CPU, DType::F32);
  plain.init(7);
  const Tensor wq = store.weight("layers.0.attn.wq"), wq0 = plain.weight("layers.0.attn.wq");
  CHECK(std::memcmp(wq.data, wq0.data, wq.nbytes()) == 0);
  const Tensor a = store.weight("layers.0.attn.wq.lora_a"), b = store.weight("layers.0.attn.wq.lora_b");
  double amax = 0, bmax = 0;
  for (int64_t i = 0; i < a.numel(); ++i) amax = std::max(amax, std::abs(get(a, i)));
  for (int64_t i = 0; i < b.numel(); ++i) bmax = std::max(bmax, std::abs(get(b, i)));
  CHECK(amax > 0.5 / std::sqrt(c.hidden_size));
  CHECK(amax <= 1.0 / std::sqrt(c.hidden_size));
  CHECK(bmax == 0);
}

TEST_CASE("lora layer gradients: attention (q, k, v, o; with qkv biases and q/k norms frozen)") {
  for (ModelFamily f : {ModelFamily::Llama, ModelFamily::Qwen2, ModelFamily::Qwen3, ModelFamily::GPT2}) {
    for (const std::vector<std::string>& targets : {std::vector<std::string>{"q", "k", "v", "o"},
                                                    std::vector<std::string>{"k", "o"},
                                                    std::vector<std::string>{"v"}}) {
      const ModelConfig c = with_lora(tiny_model(f), targets);
      CAPTURE(family_name(f));
      CAPTURE(targets.size());
      ParamStore store = lora_store([&](ParamTable& t) { layers::Attention::declare(t, "a", c); }, c, "lora-attn");
      layers::Attention attn(store, "a", c);
      Sample s0 = make_sample({1, 5}, c.vocab_size, "seq0"), s1 = make_sample({6}, c.vocab_size, "seq1");
      MicroBatch mb = make_micro_batch({&s0, &s1}, 6, false, Device::CPU);
      layers::AttentionSaved saved;
      Tensor xin;
      const Shape shape{mb.num_tokens, c.hidden_size};
      check_layer(store, shape, shape, "lora attention",
                  [&](const Tensor& x, const Tensor& y) { attn.forward(kEnv, x, mb.segments(), y, saved); xin = x; },
                  [&](const Tensor& dy, const Tensor& dx) { attn.backward(kEnv, dy, xin, mb.segments(), saved, dx); });
    }
  }
}

TEST_CASE("lora layer gradients: SwiGLU MLP (gate, up, down) and blocks") {
  for (const std::vector<std::string>& targets :
       {std::vector<std::string>{"gate", "up", "down"}, std::vector<std::string>{"up"}, std::vector<std::string>{"down"}}) {
    const ModelConfig c = with_lora(tiny_model(ModelFamily::Llama), targets, 2, 3);
    ParamStore store = lora_store([&](ParamTable& t) { layers::Mlp::declare(t, "m", c); }, c, "lora-mlp");
    layers::Mlp mlp(store, "m", c);
    layers::MlpSaved saved;
    Tensor xin;
    check_layer(store, {9, c.hidden_size}, {9, c.hidden_size}, "lora mlp",
                [&](const Tensor& x, const Tensor& y) { mlp.forward(kEnv, x, y, saved); xin = x; },
                [&](const Tensor& dy, const Tensor& dx) { mlp.backward(kEnv, dy, xin, saved, dx); });
  }
  // Blocks: the frozen norms' (and GPT-2's frozen biases') gradients go nowhere.
  for (ModelFamily f : {ModelFamily::Llama, ModelFamily::GPT2, ModelFamily::Qwen3}) {
    const ModelConfig c = with_lora(tiny_model(f), f == ModelFamily::GPT2 ? std::vector<std::string>{"q", "o"} : kAll);
    CAPTURE(family_name(f));
    ParamStore store = lora_store([&](ParamTable& t) { layers::Block::declare(t, 0, c); }, c, "lora-block");
    layers::Block block(store, 0, c);
    Sample s0 = make_sample({1, 5}, c.vocab_size, "seq0"), s1 = make_sample({6}, c.vocab_size, "seq1");
    MicroBatch mb = make_micro_batch({&s0, &s1}, 6, false, Device::CPU);
    layers::BlockSaved saved;
    Tensor xin;
    const Shape shape{mb.num_tokens, c.hidden_size};
    check_layer(store, shape, shape, "lora block",
                [&](const Tensor& x, const Tensor& y) { block.forward(kEnv, x, mb.segments(), saved); xin = x; copy_tensor(y, saved.y); },
                [&](const Tensor& dy, const Tensor& dx) { block.backward(kEnv, dy, xin, mb.segments(), saved, dx); });
  }
}

TEST_CASE("lora model gradients match finite differences (fp64, every base parameter frozen)") {
  for (ModelFamily f : {ModelFamily::Llama, ModelFamily::Qwen3, ModelFamily::GPT2}) {
    const ModelConfig c = with_lora(tiny_model(f), f == ModelFamily::GPT2 ? std::vector<std::string>{"q", "k", "v", "o"} : kAll);
    CAPTURE(family_name(f));
    auto model = make_model(c, Device::CPU, DType::F64);
    randomize_weights(model->params(), "lora-model");
    Sample s0 = make_sample({3, 1, 4}, c.vocab_size, "m0"), s1 = make_sample({8}, c.vocab_size, "m1");
    MicroBatch mb = make_micro_batch({&s0, &s1}, 8, false, Device::CPU);
    const float scale = 1.f / static_cast<float>(mb.loss_tokens);
    auto saved = model->new_saved();
    auto loss = [&] { return scale * model->forward(mb, *saved, true, scale); };
    model->params().zero_grads();
    model->forward(mb, *saved, true, scale);
    model->backward(mb, *saved);
    Owned grads = empty(model->params().grads_flat().shape, DType::F64, Device::CPU);
    copy_tensor(grads, model->params().grads_flat());
    auto cmp = finite_difference_check(loss, model->params().weights_flat(), grads, "lora model", 600, 1e-6);
    INFO(cmp.report);
    CHECK(cmp.rel_rms < 1e-6);
  }
}

TEST_CASE("lora at init (B = 0): the adapted model's logits are the base model's, bitwise") {
  const ModelConfig base = tiny_model(ModelFamily::Llama);
  const ModelConfig c = with_lora(base, kAll);
  auto a = make_model(base, Device::CPU, DType::F32), b = make_model(c, Device::CPU, DType::F32);
  a->params().init(3);
  b->params().init(3);
  Sample s = make_sample({5, 4}, c.vocab_size, "init");
  MicroBatch mb = make_micro_batch({&s}, 9, false, Device::CPU);
  Owned la = empty({mb.num_tokens, c.vocab_size}, DType::F32, Device::CPU), lb = empty(la->shape, DType::F32, Device::CPU);
  a->logits(mb, la);
  b->logits(mb, lb);
  CHECK(std::memcmp(la->data, lb->data, la->nbytes()) == 0);
  // ... and a nonzero B changes them.
  Tensor bq = b->params().weight("layers.0.attn.wq.lora_b");
  set(bq, 0, 0.5);
  b->logits(mb, lb);
  CHECK(std::memcmp(la->data, lb->data, la->nbytes()) != 0);
}
