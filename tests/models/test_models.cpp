// Whole-model checks: fp64 finite differences over all parameters of tiny gpt2, llama, mistral,
// mixtral, mamba, mamba2 and hybrid (Mamba, Mamba-2, Gated DeltaNet, MoE and attention blocks) models on packed documents; the parameter table's names, shapes and adjacency.
#include <doctest/doctest.h>

#include <cstring>

#include "models/model.h"
#include "tests/common/gradcheck.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

TEST_CASE("model gradients match finite differences (fp64, packed documents)") {
  struct Case {
    ModelFamily family;
    bool cross_document;
    bool mamba_proj_bias = false;  // the Mamba blocks' out_proj bias: its gradient is summed by
                                   // the next block's norm backward (layers/block.h)
    const char* layout = nullptr;  // a hybrid layout in place of tiny_model's
    bool norm_per_group = false;   // Mamba-2's gated norm per group of B and C
  };
  for (Case k : std::vector<Case>{{ModelFamily::GPT2, false},   {ModelFamily::Llama, false},
                                  {ModelFamily::Llama, true},    {ModelFamily::Mistral, false}, {ModelFamily::Qwen3, false},
                                  {ModelFamily::Mixtral, false}, {ModelFamily::Mamba, false},
                                  {ModelFamily::Hybrid, false},  {ModelFamily::Mamba, false, true},
                                  {ModelFamily::Hybrid, false, true}, {ModelFamily::Qwen2Moe, false},
                                  {ModelFamily::Qwen3Moe, false}, {ModelFamily::Mamba2, false},
                                  {ModelFamily::Mamba2, false, true}, {ModelFamily::Hybrid, false, false, "SAS"},
                                  {ModelFamily::Hybrid, false, false, "GAG"}, {ModelFamily::Hybrid, false, false, "SGE"},
                                  {ModelFamily::Mamba2, false, false, nullptr, true}}) {
    ModelConfig c = tiny_model(k.family);
    c.mamba_proj_bias = k.mamba_proj_bias;
    if (k.family == ModelFamily::Mamba2) c.mamba_conv_bias = !k.mamba_proj_bias;  // both conv bias states
    if (k.layout) set_tiny_layout(c, k.layout);
    c.mamba_norm_per_group = k.norm_per_group;
    CAPTURE(k.layout ? k.layout : "");
    CAPTURE(k.norm_per_group);
    CAPTURE(std::string(family_name(k.family)));
    CAPTURE(k.cross_document);
    CAPTURE(k.mamba_proj_bias);
    auto model = make_model(c, Device::CPU, DType::F64);
    randomize_weights(model->params(), "model");
    Sample s0 = make_sample({3, 1, 4}, c.vocab_size, "m0"), s1 = make_sample({8}, c.vocab_size, "m1");
    MicroBatch mb = make_micro_batch({&s0, &s1}, 8, k.cross_document, Device::CPU);
    const float scale = 1.f / static_cast<float>(mb.loss_tokens);
    auto saved = model->new_saved();
    // (with_grad: the training loss, which includes the mixture-of-experts auxiliary losses)
    auto loss = [&] { return scale * model->forward(mb, *saved, true, scale); };
    model->params().zero_grads();
    model->forward(mb, *saved, true, scale);
    model->backward(mb, *saved);
    // A copy: the loss evaluations with gradients run the head's backward (into the buffer).
    Owned grads = empty(model->params().grads_flat().shape, DType::F64, Device::CPU);
    copy_tensor(grads, model->params().grads_flat());
    // Step 1e-6 rather than the default 1e-5: the top-k routing of mixtral / hybrid is a step
    // function of the router logits, and a step that moves two near-tied logits past each other
    // measures a jump, not the gradient (TEST_SEED=94459678 did at 1e-5: five elements off by
    // ~0.39). A smaller step makes that ten times less likely; in f64 its rounding stays ~4e-8
    // of the gradients' scale, far inside the tolerance.
    auto cmp = finite_difference_check(loss, model->params().weights_flat(), grads, "model", 600,
                                       1e-6);
    INFO(cmp.report);
    CHECK(cmp.rel_rms < 1e-6);
  }
}

TEST_CASE("parameter table: names, shapes, adjacency and decay flags") {
  ModelConfig c = tiny_model(ModelFamily::Llama);
  ParamTable t = model_param_table(c);
  const auto& wq = t.get("layers.1.attn.wq");
  const auto& wk = t.get("layers.1.attn.wk");
  const auto& wv = t.get("layers.1.attn.wv");
  CHECK(wq.shape == Shape({c.num_heads * c.head_dim, c.hidden_size}));
  CHECK(wk.shape == Shape({c.num_kv_heads * c.head_dim, c.hidden_size}));
  CHECK(wk.offset == wq.offset + wq.shape.numel());
  CHECK(wv.offset == wk.offset + wk.shape.numel());
  CHECK(t.get("layers.0.mlp.w_up").offset == t.get("layers.0.mlp.w_gate").offset + c.ffn_hidden_size * c.hidden_size);
  CHECK_FALSE(t.get("final_norm.weight").weight_decay);
  CHECK(t.get("head.weight").weight_decay);
  CHECK_FALSE(t.contains("embed.positions"));
  ModelConfig g = tiny_model(ModelFamily::GPT2);
  ParamTable tg = model_param_table(g);
  CHECK(tg.contains("embed.positions"));
  CHECK_FALSE(tg.contains("head.weight"));  // tied to embed.tokens
  CHECK_FALSE(tg.get("layers.0.attn.bq").weight_decay);
  // gpt2: 2 layers x (2 norms w+b, qkv w+b, o w+b, mlp in/out w+b) + embeddings + final norm
  int64_t C = g.hidden_size, F = g.ffn_hidden_size, A = g.num_heads * g.head_dim;
  int64_t per_layer = 4 * C + (C * 3 * A + 3 * A) + (A * C + C) + (C * F + F) + (F * C + C);
  CHECK(tg.num_parameters() == g.vocab_size * C + g.max_position_embeddings * C + 2 * per_layer + 2 * C);
}

TEST_CASE("parameter init is layout independent: a value depends only on (seed, name, index)") {
  ModelConfig c = tiny_model(ModelFamily::Llama);
  ParamTable t = model_param_table(c);
  ParamStore a(t, Device::CPU, DType::F32), b(t, Device::CPU, DType::F32);
  a.init(7);
  b.init(7);
  Tensor wa = a.weight("layers.1.mlp.w_out"), wb = b.weight("layers.1.mlp.w_out");
  CHECK(std::memcmp(wa.data, wb.data, wa.nbytes()) == 0);
  // element i of a parameter = init_std * philox_normal(key(seed, name), i)
  const auto& spec = t.get("layers.1.mlp.w_out");
  PhiloxKey key = philox_key(7, "layers.1.mlp.w_out");
  for (int64_t i : {int64_t{0}, int64_t{5}, spec.shape.numel() - 1})
    CHECK(wa.ptr<float>()[i] == static_cast<float>(spec.init_std * philox_normal(key, static_cast<uint64_t>(i))));
  CHECK(a.weight("final_norm.weight").ptr<float>()[3] == 1.f);
  a.init(8);
  CHECK(std::memcmp(a.weight("layers.1.mlp.w_out").data, wb.data, wb.nbytes()) != 0);
}
