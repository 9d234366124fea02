// Packed training equals training each document alone: a packed micro-batch gives the same
// per-document losses and the same parameter gradients as running every document piece as its
// own sequence (fp64, CPU; attention, Mamba, Mamba-2, Gated DeltaNet and hybrid Mamba + MoE + attention models: the
// conv window and the scan state restart at each document). Cases: 1-token documents, a document filling a whole sequence, a
// document cut at the sequence end (its continuation starts the next sequence), many documents.
#include <doctest/doctest.h>

#include "models/model.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

struct Run {
  double loss = 0;
  Owned grads;
};

Run run_model(Model& m, const std::vector<const Sample*>& seqs, int S, bool cross_document) {
  MicroBatch mb = make_micro_batch(seqs, S, cross_document, Device::CPU);
  auto saved = m.new_saved();
  m.params().zero_grads();
  Run r;
  r.loss = m.forward(mb, *saved, true, 1.f);
  m.backward(mb, *saved);
  r.grads = to_host(m.params().grads_flat(), DType::F64);
  return r;
}

// Sequence `s` restricted to positions [a, b) as a sequence of its own (same inputs, labels, mask).
Sample piece(const Sample& s, int a, int b) {
  Sample p;
  p.tokens.assign(s.tokens.begin() + a, s.tokens.begin() + b + 1);
  p.loss_mask.assign(s.loss_mask.begin() + a, s.loss_mask.begin() + b);
  p.doc_lengths = {b - a};
  return p;
}

}  // namespace

TEST_CASE("packed documents train exactly like documents alone (per-document losses and gradients)") {
  const int S = 12;
  struct Case {
    ModelFamily family;
    const char* layout = nullptr;  // a hybrid layout in place of tiny_model's
  };
  for (const Case k : std::vector<Case>{{ModelFamily::GPT2}, {ModelFamily::Llama}, {ModelFamily::Mistral},
                                        {ModelFamily::Qwen3}, {ModelFamily::Mamba}, {ModelFamily::Mamba2},
                                        {ModelFamily::Hybrid}, {ModelFamily::Hybrid, "GSG"}, {ModelFamily::Qwen2Moe},
                                        {ModelFamily::Qwen3Moe}}) {
    const ModelFamily f = k.family;
    CAPTURE(std::string(family_name(f)));
    CAPTURE(k.layout ? k.layout : "");
    ModelConfig c = tiny_model(f);
    if (k.layout) set_tiny_layout(c, k.layout);
    // (the MoE blocks without auxiliary losses: load balancing is a statistic of the whole
    // batch, not of each document; the routing and the shared expert are per token)
    c.moe_aux_loss_coef = c.moe_z_loss_coef = 0;
    auto model = make_model(c, Device::CPU, DType::F64);
    randomize_weights(model->params(), "packing");
    // seq0: 1-token documents, a longer one, and a document cut at the end; seq1: one document
    // filling the sequence; seq2: many documents.
    Sample s0 = make_sample({1, 1, 4, 6}, c.vocab_size, "p0"), s1 = make_sample({12}, c.vocab_size, "p1"),
           s2 = make_sample({2, 3, 1, 2, 4}, c.vocab_size, "p2");
    const std::vector<const Sample*> seqs = {&s0, &s1, &s2};
    Run packed = run_model(*model, seqs, S, false);

    double loss_sum = 0;
    Owned grad_sum = zeros(packed.grads->shape, DType::F64, Device::CPU);
    for (const Sample* s : seqs) {
      int a = 0;
      for (int32_t len : s->doc_lengths) {
        Sample alone = piece(*s, a, a + len);
        Run r = run_model(*model, {&alone}, len, false);
        // The same document inside the packed batch, with the loss mask reduced to it.
        Sample masked0 = s0, masked1 = s1, masked2 = s2;
        for (Sample* m : {&masked0, &masked1, &masked2})
          for (int i = 0; i < S; ++i)
            if (m->tokens != s->tokens || i < a || i >= a + len) m->loss_mask[static_cast<size_t>(i)] = 0;
        Run in_pack = run_model(*model, {&masked0, &masked1, &masked2}, S, false);
        CHECK(in_pack.loss == doctest::Approx(r.loss).epsilon(1e-12));
        CHECK_CLOSE(in_pack.grads, r.grads, 1e-12);
        loss_sum += r.loss;
        for (int64_t i = 0; i < grad_sum->numel(); ++i) grad_sum.ptr<double>()[i] += r.grads.ptr<double>()[i];
        a += len;
      }
    }
    CHECK(packed.loss == doctest::Approx(loss_sum).epsilon(1e-12));
    CHECK_CLOSE(packed.grads, grad_sum, 1e-12);
    // Attention across documents is a different model: the check above can fail.
    Run crossed = run_model(*model, seqs, S, true);
    CHECK(std::fabs(crossed.loss - packed.loss) > 1e-6 * std::fabs(packed.loss));
  }
}

TEST_CASE("multi-token prediction: packed documents train exactly like documents alone (k = 2)") {
  // Every head's loss of a packed micro-batch is the sum of the documents' own, and so are the
  // gradients: no head's target crosses a document boundary (models/prediction_targets.h).
  const int S = 12;
  for (ModelFamily f : {ModelFamily::Llama, ModelFamily::Mamba, ModelFamily::Mamba2}) {
    CAPTURE(std::string(family_name(f)));
    ModelConfig c = tiny_model(f);
    c.num_layers = 3;
    c.prediction_heads = 2;
    c.prediction_loss_weights = {1.0, 1.0, 1.0};
    auto model = make_model(c, Device::CPU, DType::F64);
    randomize_weights(model->params(), "mtp-packing");
    auto run = [&](const std::vector<const Sample*>& seqs, int len) {
      MicroBatch mb = make_micro_batch(seqs, len, false, Device::CPU, 2);
      mb.mtp_grad_scale = {1.f, 1.f};
      auto saved = model->new_saved();
      model->params().zero_grads();
      Run r;
      r.loss = model->forward(mb, *saved, true, 1.f);
      for (double l : model->take_prediction_losses()) r.loss += l;
      model->backward(mb, *saved);
      r.grads = to_host(model->params().grads_flat(), DType::F64);
      return r;
    };
    Sample s0 = make_sample({1, 1, 4, 6}, c.vocab_size, "mp0"), s1 = make_sample({12}, c.vocab_size, "mp1"),
           s2 = make_sample({2, 3, 1, 2, 4}, c.vocab_size, "mp2");
    const std::vector<const Sample*> seqs = {&s0, &s1, &s2};
    Run packed = run(seqs, S);
    double loss_sum = 0;
    Owned grad_sum = zeros(packed.grads->shape, DType::F64, Device::CPU);
    for (const Sample* s : seqs) {
      int a = 0;
      for (int32_t len : s->doc_lengths) {
        Sample alone = piece(*s, a, a + len);
        Run r = run({&alone}, len);
        loss_sum += r.loss;
        for (int64_t i = 0; i < grad_sum->numel(); ++i) grad_sum.ptr<double>()[i] += r.grads.ptr<double>()[i];
        a += len;
      }
    }
    CHECK(packed.loss == doctest::Approx(loss_sum).epsilon(1e-12));
    CHECK_CLOSE(packed.grads, grad_sum, 1e-12);
  }
}

TEST_CASE("GPU: packed documents train like documents alone (bf16, flash attention path)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // head_dim 64 takes the tensor-core flash kernels; documents of 1, 17, 46 and 64 tokens.
  ModelConfig c = tiny_model(ModelFamily::Llama);
  c.hidden_size = 96;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.init_std = 0.05;
  auto model = make_model(c, Device::CUDA, DType::BF16);
  model->params().init(11);
  const int S = 64;
  Sample s0 = make_sample({1, 17, 46}, c.vocab_size, "g0"), s1 = make_sample({64}, c.vocab_size, "g1");
  auto run_gpu = [&](const std::vector<const Sample*>& seqs, int len) {
    MicroBatch mb = make_micro_batch(seqs, len, false, Device::CUDA);
    auto saved = model->new_saved();
    model->params().zero_grads();
    Run r;
    r.loss = model->forward(mb, *saved, true, 1.f);
    model->backward(mb, *saved);
    r.grads = to_host(model->params().grads_flat(), DType::F64);
    return r;
  };
  Run packed = run_gpu({&s0, &s1}, S);
  double loss_sum = 0;
  Owned grad_sum = zeros(packed.grads->shape, DType::F64, Device::CPU);
  for (const Sample* s : {&s0, &s1}) {
    int a = 0;
    for (int32_t len : s->doc_lengths) {
      Sample alone = piece(*s, a, a + len);
      Run r = run_gpu({&alone}, len);
      loss_sum += r.loss;
      for (int64_t i = 0; i < grad_sum->numel(); ++i) grad_sum.ptr<double>()[i] += r.grads.ptr<double>()[i];
      a += len;
    }
  }
  // bf16 activations: the packed and the separate runs round differently, nothing more.
  CHECK(packed.loss == doctest::Approx(loss_sum).epsilon(5e-3));
  CHECK_CLOSE(packed.grads, grad_sum, 3e-2);
}
