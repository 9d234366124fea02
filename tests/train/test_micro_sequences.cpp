// Micro-sequences (batch.micro_sequence_length): each micro-batch runs as consecutive token
// chunks, forward in order and backward in reverse, a chunk's queries attending to the keys and
// values of its documents' rows in earlier chunks. The same run with whole sequences must give
// the same losses, gradients and weights (documents cross the chunk boundaries: the tiny data's
// documents are 5-44 tokens packed into sequences of 20).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/tools.h"
#include "core/buffer.h"
#include "models/model.h"
#include "tests/common/tiny.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;

namespace {

void compare_chunked(const std::string& family, std::vector<std::string> overrides, const std::string& chunking,
                     double tol, int steps = 3) {
  CAPTURE(family);
  CAPTURE(chunking);
  Trainer whole(tiny_run_config(family, overrides), false);
  overrides.push_back(chunking);
  Trainer chunked(tiny_run_config(family, overrides), false);
  for (int s = 0; s < steps; ++s) {
    StepResult a = whole.train_step(), b = chunked.train_step();
    INFO("step " << s + 1 << ": whole " << a.loss << " / " << a.grad_norm << ", chunked " << b.loss << " / "
                 << b.grad_norm);
    CHECK(b.loss == doctest::Approx(a.loss).epsilon(tol));
    CHECK(b.grad_norm == doctest::Approx(a.grad_norm).epsilon(10 * tol));
    if (s == 0) {
      Owned ga = to_host(whole.model().params().grads_flat(), DType::F64);
      Owned gb = to_host(chunked.model().params().grads_flat(), DType::F64);
      CHECK_CLOSE(gb, ga, 100 * tol);
    }
  }
  Owned wa = to_host(whole.optimizer().gather_master(), DType::F64);
  Owned wb = to_host(chunked.optimizer().gather_master(), DType::F64);
  CHECK_CLOSE(wb, wa, 100 * tol);
  CHECK(chunked.evaluate() == doctest::Approx(whole.evaluate()).epsilon(tol));
}

}  // namespace

TEST_CASE("micro-sequences reproduce whole sequences: losses, gradients, weights (CPU)") {
  compare_chunked("llama", {}, "batch.micro_sequence_length=5", 1e-5);
  compare_chunked("gpt2", {"batch.micro_batch_size=2"}, "batch.micro_sequence_length=10", 1e-5);
  compare_chunked("mistral", {"model.sliding_window=7", "distributed.pipeline_schedule=\"depth_first\""},
                  "batch.micro_sequence_length=4", 1e-5);
  compare_chunked("qwen2", {"model.num_layers=3", "distributed.stages_per_rank=3"}, "batch.micro_sequence_length=5",
                  1e-5);  // three stages on one rank: chunks interleave with stages
  // the same on the 1f1b schedule (one rank: adjacent stages, the interleaved order)
  compare_chunked("qwen2",
                  {"model.num_layers=3", "distributed.stages_per_rank=3", "distributed.pipeline_schedule=\"1f1b\""},
                  "batch.micro_sequence_length=5", 1e-5);
  // multi-token prediction: the extra heads' attention blocks see earlier chunks' keys too, and
  // recomputation re-runs them per chunk
  compare_chunked("llama", {"model.num_layers=3", "model.prediction_heads=2"}, "batch.micro_sequence_length=5", 1e-5);
  compare_chunked("llama", {"model.num_layers=3", "model.prediction_heads=1", "training.recompute_activations=true"},
                  "batch.micro_sequence_length=4", 1e-5);
}

TEST_CASE("micro-sequences on the GPU reproduce whole sequences (flash and fallback attention)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // head_dim 64 takes the tensor-core kernels; 8 the fallback kernel.
  compare_chunked("llama",
                  {"run.device=\"cuda\"", "model.hidden_size=128", "model.num_heads=2", "model.num_kv_heads=1",
                   "model.ffn_hidden_size=200"},
                  "batch.micro_sequence_length=5", 2e-2, 2);
  compare_chunked("mistral", {"run.device=\"cuda\"", "model.sliding_window=6"}, "batch.micro_sequence_length=4",
                  2e-2, 2);
  compare_chunked("llama", {"run.device=\"cuda\"", "model.num_layers=3", "model.prediction_heads=2"},
                  "batch.micro_sequence_length=5", 2e-2, 2);
}

TEST_CASE("batch.micro_sequence_length: bad values are config errors naming the key") {
  CHECK_THROWS_WITH(tiny_run_config("llama", {"batch.micro_sequence_length=7"}),
                    doctest::Contains("batch.micro_sequence_length: must divide data.sequence_length (20), got 7"));
  CHECK_THROWS_WITH(tiny_run_config("llama", {"batch.micro_sequence_length=-1"}),
                    doctest::Contains("batch.micro_sequence_length"));
}

TEST_CASE("micro-sequences: key/value buffers are released after the first chunk's backward, or the last "
          "chunk's forward without gradients") {
  Config c = tiny_run_config("llama");
  auto model = make_model(c.model, Device::CPU, DType::F32);
  model->params().init(3);
  std::vector<Sample> samples;
  for (int i = 0; i < 2; ++i) samples.push_back(make_sample({7, 13}, c.model.vocab_size, "kv" + std::to_string(i)));
  const std::vector<const Sample*> seqs = {&samples[0], &samples[1]};
  std::vector<MicroBatch> chunks = make_micro_sequences(seqs, 20, false, Device::CPU, 5);
  REQUIRE(chunks.size() == 8);
  const layers::KvChunks& kv = *chunks.front().kv;
  // Without gradients: every layer drops its buffers during the last chunk's forward.
  for (const MicroBatch& mb : chunks) {
    auto saved = model->new_saved();
    model->forward(mb, *saved, false, 1.f);
    CHECK(kv.layers.size() == (mb.chunk + 1 < mb.chunks ? static_cast<size_t>(c.model.num_layers) : 0));
  }
  // With gradients: kept through the forwards, released by the first chunk's backward.
  std::vector<std::unique_ptr<Model::Saved>> saved;
  for (const MicroBatch& mb : chunks) {
    saved.push_back(model->new_saved());
    model->forward(mb, *saved.back(), true, 1.f);
  }
  CHECK(kv.layers.size() == static_cast<size_t>(c.model.num_layers));
  for (size_t i = chunks.size(); i-- > 0;) {
    model->backward(chunks[i], *saved[i]);
    CHECK(kv.layers.size() == (i > 0 ? static_cast<size_t>(c.model.num_layers) : 0));
  }
}

TEST_CASE("micro-sequences: a teacher with Mamba blocks is refused, naming the keys") {
  const std::string dir =
      (std::filesystem::path(learnable_dataset()).parent_path() / "mamba-teacher").string();
  checkpoint::export_hf_from_config(tiny_run_config("mamba", {"model.mamba_d_state=4", "run.name=mamba-teacher"}), dir,
                                    {});
  try {
    Trainer t(tiny_run_config("llama", {"batch.micro_sequence_length=5", "distillation.teacher=\"" + dir + "\""}),
              false);
    FAIL("no error");
  } catch (const std::exception& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("distillation.teacher") != std::string::npos);
    CHECK(m.find("micro-sequences (batch.micro_sequence_length = 5)") != std::string::npos);
  }
}
