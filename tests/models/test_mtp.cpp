// Multi-token prediction (model.prediction_heads): the extra heads' targets stay inside
// documents; fp64 finite differences of the whole weighted loss (k = 2) for attention, MoE and
// Mamba last blocks; activation recomputation gives the same gradients; the logits of head j
// (prediction_logits, what --dump-logits writes for each head) give the loss the forward reports.
#include <doctest/doctest.h>

#include <cmath>

#include "models/model.h"
#include "models/prediction_targets.h"
#include "ops/loss.h"
#include "tests/common/gradcheck.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

// The training loss: sum_j w_j (head j's loss sum) / (head j's loss tokens), one micro-batch.
struct Loss {
  Model& model;
  const MicroBatch& mb;
  std::vector<double> w;
  double operator()(Model::Saved& saved, bool with_grad) const {
    const float s0 = 1.f / static_cast<float>(mb.loss_tokens);
    double loss = w[0] * s0 * model.forward(mb, saved, with_grad, s0);
    const std::vector<double> sums = model.take_prediction_losses();
    for (size_t j = 0; j < sums.size(); ++j) loss += w[j + 1] * mb.mtp_grad_scale[j] * sums[j];
    return loss;
  }
};

// As the trainer (train/trainer_batch.cpp): a head with no trained target (its few positions all
// masked: 1 seed in 25 for the third head of short documents) has scale 0, not 1/0.
void set_scales(MicroBatch& mb) {
  mb.mtp_grad_scale.clear();
  for (int64_t n : mb.mtp_loss_tokens) mb.mtp_grad_scale.push_back(n > 0 ? 1.f / static_cast<float>(n) : 0.f);
}

}  // namespace

TEST_CASE("prediction targets: head j predicts t + 1 + j inside the document, where that token trains") {
  Sample s;
  s.tokens = {10, 11, 12, 13, 14, 15, 16, 17, 18};  // S = 8
  s.loss_mask = {1, 1, 1, 1, 0, 1, 1, 1};            // the label of position 4 (token 15) does not train
  s.doc_lengths = {3, 5};                             // documents [0, 3) and [3, 8)
  std::vector<int32_t> labels;
  std::vector<uint8_t> mask;
  prediction_targets(s, 1, labels, mask);
  // t = 0 -> token 12 (same document); t = 1, 2 -> tokens 13, 14 are in the next document;
  // t = 3 -> 15 masked (loss_mask[4]); t = 4, 5 -> 16, 17; t = 6 -> index 8 is past the inputs.
  CHECK(mask == std::vector<uint8_t>{1, 0, 0, 0, 1, 1, 0, 0});
  CHECK(labels[0] == 12);
  CHECK(labels[4] == 16);
  CHECK(labels[5] == 17);
  CHECK(prediction_loss_tokens(s, 1) == 3);
  prediction_targets(s, 2, labels, mask);
  CHECK(mask == std::vector<uint8_t>{0, 0, 0, 1, 1, 0, 0, 0});
  CHECK(labels[3] == 16);
  CHECK(labels[4] == 17);
  CHECK(prediction_loss_tokens(s, 0) == 7);
}

TEST_CASE("multi-token prediction: gradients match finite differences (fp64, k = 2, weighted heads)") {
  struct Case {
    ModelFamily family;
    bool tied;
  };
  // llama (attention last block), mixtral (MoE last block, auxiliary losses on), mamba (Mamba
  // last block, tied embeddings), gpt2 (biases: the trunk's output bias gradient sums every
  // head's share).
  for (Case k : std::vector<Case>{{ModelFamily::Llama, false},
                                  {ModelFamily::Mixtral, false},
                                  {ModelFamily::Mamba, true},
                                  {ModelFamily::GPT2, true}}) {
    ModelConfig c = tiny_model(k.family);
    c.num_layers = 3;
    c.tie_embeddings = k.tied;
    c.prediction_heads = 2;
    c.prediction_loss_weights = {1.0, 0.5, 0.25};
    if (k.family == ModelFamily::Mixtral) c.moe_aux_loss_coef = 0.01;
    CAPTURE(std::string(family_name(k.family)));
    auto model = make_model(c, Device::CPU, DType::F64);
    randomize_weights(model->params(), "mtp");
    Sample s0 = make_sample({3, 1, 4}, c.vocab_size, "t0"), s1 = make_sample({8}, c.vocab_size, "t1");
    MicroBatch mb = make_micro_batch({&s0, &s1}, 8, false, Device::CPU, 2);
    REQUIRE(mb.mtp_loss_tokens.size() == 2);
    REQUIRE(mb.mtp_loss_tokens[1] > 0);
    set_scales(mb);
    auto saved = model->new_saved();
    const Loss total{*model, mb, c.prediction_loss_weights};
    model->params().zero_grads();
    total(*saved, true);
    model->backward(mb, *saved);
    Owned grads = empty(model->params().grads_flat().shape, DType::F64, Device::CPU);
    copy_tensor(grads, model->params().grads_flat());
    auto cmp = finite_difference_check([&] { return total(*saved, true); }, model->params().weights_flat(), grads,
                                       "mtp model", 600, 1e-6);
    INFO(cmp.report);
    CHECK(cmp.rel_rms < 1e-6);
  }
}

TEST_CASE("multi-token prediction: recomputed activations give the same gradients") {
  ModelConfig c = tiny_model(ModelFamily::Llama);
  c.num_layers = 3;
  c.prediction_heads = 2;
  c.prediction_loss_weights = {1.0, 1.0, 1.0};
  Sample s0 = make_sample({5, 3}, c.vocab_size, "r0");
  MicroBatch mb = make_micro_batch({&s0}, 8, false, Device::CPU, 2);
  set_scales(mb);
  auto run = [&](bool recompute) {
    ModelLayout layout;
    layout.recompute = recompute;
    auto model = make_model(c, Device::CPU, DType::F64, 0, layout);
    randomize_weights(model->params(), "mtp-recompute");
    auto saved = model->new_saved();
    model->params().zero_grads();
    const double loss = Loss{*model, mb, c.prediction_loss_weights}(*saved, true);
    model->backward(mb, *saved);
    return std::make_pair(loss, to_host(model->params().grads_flat(), DType::F64));
  };
  auto [loss_a, grads_a] = run(false);
  auto [loss_b, grads_b] = run(true);
  CHECK(loss_a == loss_b);
  CHECK_CLOSE(grads_a, grads_b, 0.0);
}

TEST_CASE("multi-token prediction: head j's logits give the loss the forward reports") {
  ModelConfig c = tiny_model(ModelFamily::Llama);
  c.num_layers = 3;
  c.prediction_heads = 2;
  c.prediction_loss_weights = {1.0, 1.0, 1.0};
  auto model = make_model(c, Device::CPU, DType::F64);
  randomize_weights(model->params(), "mtp-logits");
  Sample s0 = make_sample({2, 6}, c.vocab_size, "l0"), s1 = make_sample({8}, c.vocab_size, "l1");
  MicroBatch mb = make_micro_batch({&s0, &s1}, 8, false, Device::CPU, 2);
  auto saved = model->new_saved();
  const double head0 = model->forward(mb, *saved, false, 0.f);
  const std::vector<double> sums = model->take_prediction_losses();
  REQUIRE(sums.size() == 2);
  CHECK(model->take_prediction_losses() == std::vector<double>{0.0, 0.0});  // taken: reset
  const int64_t T = mb.num_tokens, V = c.vocab_size;
  for (int head = 0; head <= 2; ++head) {
    CAPTURE(head);
    Owned logits = empty({T, V}, DType::F32, Device::CPU);
    model->prediction_logits(mb, head, logits);
    const Tensor labels = head == 0 ? mb.labels.t : mb.mtp_labels[static_cast<size_t>(head - 1)].t;
    const Tensor mask = head == 0 ? mb.loss_mask.t : mb.mtp_mask[static_cast<size_t>(head - 1)].t;
    double sum = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (!mask.ptr<uint8_t>()[t]) continue;
      const float* row = logits->ptr<float>() + t * V;
      double mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double{row[v]});
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
      sum += std::log(z) + mx - row[labels.ptr<int32_t>()[t]];
    }
    CHECK(sum == doctest::Approx(head == 0 ? head0 : sums[static_cast<size_t>(head - 1)]).epsilon(1e-5));
  }
  // Head 0 is the ordinary logits.
  Owned a = empty({T, V}, DType::F32, Device::CPU), b = empty({T, V}, DType::F32, Device::CPU);
  model->logits(mb, a);
  model->prediction_logits(mb, 0, b);
  CHECK_CLOSE(a, b, 0.0);
}
