// Micro-sequences (batch.micro_sequence_length): each micro-batch runs as consecutive token
// chunks, forward in order and backward in reverse, a chunk's queries attending to the keys and
// values of its documents' rows in earlier chunks. The same run with whole sequences must give
// the same losses, gradients and weights (documents cross the chunk boundaries: the tiny data's
// documents are 5-44 tokens packed into sequences of 20).
#include <doctest/doctest.h>

#include <cmath>

#include "core/buffer.h"
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
}

TEST_CASE("batch.micro_sequence_length: bad values are config errors naming the key") {
  CHECK_THROWS_WITH(tiny_run_config("llama", {"batch.micro_sequence_length=7"}),
                    doctest::Contains("batch.micro_sequence_length: must divide data.sequence_length (20), got 7"));
  CHECK_THROWS_WITH(tiny_run_config("llama", {"batch.micro_sequence_length=-1"}),
                    doctest::Contains("batch.micro_sequence_length"));
}
