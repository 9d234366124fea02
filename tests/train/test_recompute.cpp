// Activation recomputation (training.recompute_activations): forward keeps each block's output
// only and backward runs the block's forward again. The arithmetic is the same, so losses,
// gradients and weights equal the plain run's bit for bit (CPU), for attention, MoE (router
// jitter included: its noise is keyed by the micro-batch) and Mamba blocks and with
// micro-sequences, while the peak of activation memory falls.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "core/buffer.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;

namespace {
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.dtype == b.dtype && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}
}  // namespace

TEST_CASE("activation recomputation: bitwise the same training, less activation memory") {
  const std::vector<std::string> hybrid = {"model.hybrid_layout=\"MEAE\"", "model.num_layers=4", "model.num_experts=3",
                                           "model.moe_jitter=0.1", "model.moe_aux_loss_coef=0.01",
                                           "model.mamba_d_state=4"};
  for (const auto& [family, extra] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"llama", {"model.num_layers=4"}},
           {"hybrid", hybrid},
           {"mistral", {"model.num_layers=4", "model.sliding_window=6", "batch.micro_sequence_length=5"}}}) {
    CAPTURE(family);
    std::vector<std::string> o = extra;
    o.push_back("training.steps=3");
    Trainer plain(tiny_run_config(family, o), false);
    o.push_back("training.recompute_activations=true");
    Trainer again(tiny_run_config(family, o), false);
    size_t peak_plain = 0, peak_again = 0;
    for (int s = 0; s < 3; ++s) {
      reset_peak_memory(Device::CPU);
      const StepResult a = plain.train_step();
      peak_plain = memory_stats(Device::CPU).peak_in_use;
      reset_peak_memory(Device::CPU);
      const StepResult b = again.train_step();
      peak_again = memory_stats(Device::CPU).peak_in_use;
      CHECK(a.loss == b.loss);
      CHECK(a.grad_norm == b.grad_norm);
      if (s == 0) CHECK(same_bits(plain.model().params().grads_flat(), again.model().params().grads_flat()));
    }
    CHECK(same_bits(plain.optimizer().gather_master(), again.optimizer().gather_master()));
    INFO("peak in use: plain " << peak_plain << " B, recomputing " << peak_again << " B");
    CHECK(peak_again < peak_plain);
  }
}

TEST_CASE("GPU: activation recomputation trains like the plain run with less memory" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // head_dim 64 (flash kernels), MoE and Mamba blocks; the flash backward's dQ adds in any order,
  // so the runs agree to bf16 rounding, not bitwise.
  const std::vector<std::string> o = {"run.device=\"cuda\"", "model.hybrid_layout=\"MEAA\"", "model.num_layers=4",
                                      "model.hidden_size=128", "model.num_heads=2", "model.ffn_hidden_size=96",
                                      "model.num_experts=4", "model.mamba_d_state=16", "training.steps=3"};
  std::vector<std::string> r = o;
  r.push_back("training.recompute_activations=true");
  Trainer plain(tiny_run_config("hybrid", o), false), again(tiny_run_config("hybrid", r), false);
  size_t peak_plain = 0, peak_again = 0;
  for (int s = 0; s < 3; ++s) {
    reset_peak_memory(Device::CUDA);
    const StepResult a = plain.train_step();
    peak_plain = memory_stats(Device::CUDA).peak_in_use;
    reset_peak_memory(Device::CUDA);
    const StepResult b = again.train_step();
    peak_again = memory_stats(Device::CUDA).peak_in_use;
    INFO("step " << s + 1 << ": plain " << a.loss << ", recomputing " << b.loss);
    CHECK(std::fabs(a.loss - b.loss) <= 1e-2 * a.loss);
  }
  INFO("peak in use: plain " << peak_plain << " B, recomputing " << peak_again << " B");
  CHECK(peak_again < peak_plain);
}
