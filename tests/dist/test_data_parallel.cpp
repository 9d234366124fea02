// Data parallelism against one rank: on every rank a single-process reference run (its own
// group of one) and the data-parallel run over the world must give the same losses, gradient
// norms and weights, step by step, for ZeRO stages 0-3 and for accumulation over micro-batches.
#include <doctest/doctest.h>

#include <cmath>

#include "comm/mpi_comm.h"
#include "comm/nccl_comm.h"
#include "tests/common/testing.h"

#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;

namespace {

// Global batch 24 splits over 1, 2, 3 and 4 ranks with micro-batches of one or two.
std::vector<std::string> layout(int zero_stage, int micro) {
  return {"batch.global_batch_size=24", "batch.micro_batch_size=" + std::to_string(micro),
          "distributed.zero_stage=" + std::to_string(zero_stage), "training.steps=4", "data.sequence_length=16",
          "distributed.reduce_bucket_mb=0.01"};  // ~2.6k gradients per bucket: several buckets per step
}

// tol: relative tolerance of losses (fp32 rounding on CPU; bf16 on GPU, where a different
// reduction order changes the rounding of bf16 activations).
void compare_runs(const std::string& family, int zero_stage, int micro, Comm& comm,
                  const std::string& device = "cpu", double tol = 1e-5,
                  const std::vector<std::string>& model_keys = {}) {
  SelfComm self;
  std::vector<std::string> one = layout(0, 24), many = layout(zero_stage, micro);
  one.insert(one.end(), model_keys.begin(), model_keys.end());
  many.insert(many.end(), model_keys.begin(), model_keys.end());
  one.push_back("run.device=\"" + device + "\"");
  many.push_back("run.device=\"" + device + "\"");
  Trainer single(tiny_run_config(family, one), false, &self);
  Trainer parallel(tiny_run_config(family, many), false, &comm);
  for (int s = 0; s < 4; ++s) {
    StepResult a = single.train_step(), b = parallel.train_step();
    INFO("step " << s + 1 << ": single " << a.loss << " / " << a.grad_norm << ", parallel " << b.loss << " / " << b.grad_norm);
    CHECK(b.loss == doctest::Approx(a.loss).epsilon(tol));
    CHECK(b.grad_norm == doctest::Approx(a.grad_norm).epsilon(10 * tol));
  }
  // The buffers' padding differs with the rank count: compare the parameters themselves.
  const int64_t n = single.model().params().table().total_elements();
  Owned wa = to_host(single.optimizer().gather_master(), DType::F64);
  Owned wb = to_host(parallel.optimizer().gather_master(), DType::F64);
  CHECK_CLOSE(wb->slice(0, n), wa->slice(0, n), tol);
  CHECK(std::isfinite(parallel.evaluate()));
  CHECK(parallel.evaluate() == doctest::Approx(single.evaluate()).epsilon(tol));
}

}  // namespace

TEST_CASE("data parallel over all ranks reproduces one rank (ZeRO 0, 1, 2, 3)") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    compare_runs("llama", stage, 2, world());
  }
}

TEST_CASE("GPUs with NCCL: data parallel reproduces one GPU (ZeRO 0-3), bf16 tolerance" * doctest::test_suite("gpu")) {
  if (!gpus_for_ranks_or_skip(world().size())) return;
  auto nccl = make_nccl_comm(world());
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    compare_runs("llama", stage, 2, *nccl, "cuda", 2e-2);
  }
}

TEST_CASE("data parallel under ZeRO 3 reproduces one rank with q/k norms (qwen3)") {
  compare_runs("qwen3", 3, 2, world());
}

// No aux loss: its f_e and P_e are statistics of each micro-batch, which the layouts cut
// differently (the one-rank run takes the batch whole).
TEST_CASE("data parallel ZeRO 3 reproduces one rank: Qwen2-MoE's shared expert and gate, dense and sparse layers") {
  compare_runs("qwen2_moe", 3, 2, world(), "cpu", 1e-5,
               {"model.num_experts=4", "model.experts_per_token=2", "model.moe_ffn_hidden_size=16",
                "model.moe_shared_expert_ffn_size=20", "model.hybrid_layout=\"AE\""});
}

TEST_CASE("data parallel ZeRO 3 reproduces one rank: Qwen3-MoE's q/k norms and renormalised experts") {
  compare_runs("qwen3_moe", 3, 2, world(), "cpu", 1e-5,
               {"model.num_experts=4", "model.experts_per_token=2", "model.moe_ffn_hidden_size=16",
                "model.hybrid_layout=\"EA\""});
}

TEST_CASE("data parallel ZeRO 3 reproduces one rank: Mamba-2 blocks (grouped B and C, the gated norm)") {
  compare_runs("mamba2", 3, 2, world(), "cpu", 1e-5,
               {"model.mamba_head_dim=8", "model.mamba_n_groups=2", "model.mamba_d_state=8", "model.mamba_d_conv=3"});
}

TEST_CASE("data parallel ZeRO 3 reproduces one rank: Gated DeltaNet blocks (value heads sharing key heads)") {
  compare_runs("hybrid", 3, 2, world(), "cpu", 1e-5,
               {"model.hybrid_layout=\"GAG\"", "model.num_layers=3", "model.gdn_num_key_heads=1",
                "model.gdn_num_value_heads=2", "model.gdn_key_head_dim=4", "model.gdn_value_head_dim=6"});
}

TEST_CASE("data parallel ZeRO 1 and 3 reproduce one rank with LoRA (frozen base, resident; adapters sharded)") {
  const std::vector<std::string> lora = {"lora.rank=4", "lora.alpha=6",
                                         "lora.targets=[\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]",
                                         "optimizer.lr_scale=[{ pattern = \"layers.1.*\", scale = 0.5 }]"};
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    compare_runs("llama", stage, 2, world(), "cpu", 1e-5, lora);
  }
}

TEST_CASE("data parallel with gradient accumulation (micro-batches of 1) reproduces one big batch") {
  compare_runs("gpt2", 1, 1, world());
}

TEST_CASE("ZeRO shards the optimizer state: each rank keeps 1/dp of it") {
  SelfComm self;
  const int n = world().size();
  Trainer z0(tiny_run_config("llama", layout(0, 1)), false, &world());
  Trainer z1(tiny_run_config("llama", layout(1, 1)), false, &world());
  Trainer z2(tiny_run_config("llama", layout(2, 1)), false, &world());
  CHECK(z1.optimizer().state_bytes() * n <= z0.optimizer().state_bytes() + 4096);
  // Stage 2 reduces each gradient onto its owner in place: no gradient copy beside the state.
  CHECK(z2.optimizer().state_bytes() == z1.optimizer().state_bytes());
  CHECK(z1.optimizer().shard_end() - z1.optimizer().shard_begin() ==
        z1.model().params().capacity() / n);
}
