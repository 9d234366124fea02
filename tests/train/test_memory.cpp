// The run's memory estimate (models/memory_estimate.h): a lower bound of what a run allocates,
// so it never refuses a run that fits (the tiny runs here, the bench configs on one H200), and a
// refusal of a run that cannot fit that names the key behind it.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "checkpoint/tools.h"
#include "config/config.h"
#include "core/buffer.h"
#include "core/host_memory.h"
#include "models/memory_estimate.h"
#include "models/model.h"
#include "ops/gemm.h"
#include "ops/ssd.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;

namespace {

const std::vector<std::string> kMixtral = {"model.num_experts=4"};
const std::vector<std::string> kMamba = {"model.mamba_d_state=8"};
const std::vector<std::string> kHybrid = {"model.hybrid_layout=\"MEA\"", "model.num_layers=3", "model.num_experts=4",
                                          "model.mamba_d_state=8"};

MemoryPool pool(const char* name, double available, int sharing = 1) {
  return {true, available, available, sharing, name, "test"};
}

constexpr double kGiB = 1024.0 * 1024 * 1024;

}  // namespace

TEST_CASE("memory estimate: a lower bound of what a CPU run allocates (every family, recompute, schedules)") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"gpt2", {}},
      {"llama", {}},
      {"llama", {"training.recompute_activations=true"}},
      {"llama", {"distributed.pipeline_schedule=\"depth_first\""}},
      {"llama", {"batch.micro_sequence_length=10", "distributed.cross_entropy_splits=2"}},
      {"llama", {"distributed.zero_stage=3"}},
      {"mixtral", kMixtral},
      {"mamba", kMamba},
      {"hybrid", kHybrid},
  };
  for (const auto& [family, overrides] : cases) {
    CAPTURE(family);
    CAPTURE(overrides.empty() ? std::string() : overrides.front());
    const Config c = tiny_run_config(family, plus(overrides, {"training.steps=2", "optimizer.warmup_steps=1"}));
    const size_t before = memory_stats(Device::CPU).in_use;
    reset_peak_memory(Device::CPU);
    {
      Trainer t(c, false);
      t.train_step();
    }
    const double peak = static_cast<double>(memory_stats(Device::CPU).peak_in_use - before);
    const MemoryEstimate e = estimate_memory(c, RankPlacement{});
    INFO("estimate " << e.device_bytes() << " bytes, peak allocated " << peak);
    CHECK(e.device_bytes() > 0);
    CHECK(e.device_bytes() <= peak);
    CHECK(e.host_bytes() > 0);  // the sample plan
  }
}

TEST_CASE("memory estimate: the tiny configs and the tests' runs pass the check against this host") {
  const HostMemory host = host_memory();
  REQUIRE(host.known);
  CHECK(host.available > 0);
  CHECK(host.capacity >= host.available / 2);
  const MemoryPool h{true, static_cast<double>(host.available), static_cast<double>(host.capacity), 1, "host memory",
                     host.source};
  for (const char* family : {"gpt2", "llama", "mistral", "qwen2", "qwen3"})
    CHECK_NOTHROW(check_memory(tiny_run_config(family), RankPlacement{}, {h}, 0));
  CHECK_NOTHROW(check_memory(tiny_run_config("hybrid", kHybrid), RankPlacement{}, {h}, 0));
  // The repository's tiny configs as `make demo` and the README run them.
  for (const char* name : {"tiny-gpt2", "tiny-llama", "tiny-mistral", "tiny-qwen3", "tiny-mixtral", "tiny-qwen2-moe",
                           "tiny-qwen3-moe", "tiny-mamba", "tiny-mamba2", "tiny-linear-hybrid",
                           "tiny-hybrid"}) {
    CAPTURE(name);
    const Config c = load_config(std::string("configs/") + name + ".toml", {"run.device=\"cpu\""});
    CHECK_NOTHROW(check_memory(c, RankPlacement{}, {h}, 0));
  }
}

TEST_CASE("memory estimate: the bench configs fit one H200 and stay below their measured peaks") {
  // One H200 (139 GiB free at most); bf16 compute. The peaks are those docs/PERF.md reports for
  // one GPU (./bench train: Llama 0.89B 32.2 GiB, GPT-2 162M 15.5 GiB).
  RankPlacement gpu;
  gpu.device = Device::CUDA;
  gpu.compute = DType::BF16;
  const std::vector<MemoryPool> pools = {pool("GPU 0 memory", 139 * kGiB), pool("host memory", 64 * kGiB)};
  for (const char* name :
       {"bench-gpt2-162m", "bench-llama-0.9b", "bench-mixtral-small", "bench-hybrid-1b", "bench-linear-hybrid-1b"}) {
    CAPTURE(name);
    const Config c = load_config(std::string("configs/") + name + ".toml", {});
    CHECK_NOTHROW(check_memory(c, gpu, pools, 0));
    const double bytes = estimate_memory(c, gpu).device_bytes();
    INFO("estimate " << bytes / kGiB << " GiB");
    if (std::string(name) == "bench-llama-0.9b") CHECK(bytes <= 32.2 * kGiB);
    if (std::string(name) == "bench-gpt2-162m") CHECK(bytes <= 15.5 * kGiB);
  }
  // Data parallel over two GPUs at ZeRO 1: the optimizer state halves.
  const Config llama = load_config("configs/bench-llama-0.9b.toml", {"distributed.zero_stage=1", "batch.global_batch_size=8"});
  RankPlacement dp2 = gpu;
  dp2.dp = 2;
  CHECK(estimate_memory(llama, dp2).device_bytes() < estimate_memory(llama, gpu).device_bytes());
  CHECK_NOTHROW(check_memory(llama, dp2, pools, 1));
}

TEST_CASE("memory estimate: a GPU run with Mamba-2 blocks counts one layer's scan backward workspaces") {
  RankPlacement gpu;
  gpu.device = Device::CUDA;
  gpu.compute = DType::BF16;
  // 1024 tokens; 4 heads of 32, 2 groups of 64 states (one chunk of 256 is 4 chunks here).
  const Config c = tiny_run_config("hybrid", {"model.hybrid_layout=\"SA\"", "model.num_layers=2", "model.hidden_size=64",
                                              "model.num_heads=2", "model.mamba_head_dim=32", "model.mamba_n_groups=2",
                                              "model.mamba_d_state=64", "data.sequence_length=256",
                                              "batch.micro_batch_size=4", "batch.global_batch_size=4"});
  const MemoryEstimate e = estimate_memory(c, gpu);
  const auto part = std::find_if(e.parts.begin(), e.parts.end(),
                                 [](const MemoryPart& m) { return m.name == "Mamba-2 scan backward"; });
  REQUIRE(part != e.parts.end());
  // 4 chunks x 4 heads of a padded 64 x 64 dS_end, 4 x 2 groups x 2 slices x 8 sub-chunks of entering
  // states, 2 x 2 slices x 1024 tokens x 128 dB / dC partials, 4 x 4 x 4 parameter partials and factors.
  CHECK(ops::ssd_backward_slices(4, 2, 2) == 2);
  CHECK(part->bytes == 4.0 * (4 * 4 * 4096 + 4 * 2 * 2 * 8 * 4096 + 2 * 2 * 1024 * 128 + 4 * 4 * 4));
  // None on the CPU, none without S blocks.
  const MemoryEstimate cpu = estimate_memory(c, RankPlacement{});
  CHECK(std::none_of(cpu.parts.begin(), cpu.parts.end(), [](const MemoryPart& m) { return m.name == "Mamba-2 scan backward"; }));
}

TEST_CASE("memory estimate: a GPU run with Gated DeltaNet blocks counts one layer's backward workspaces") {
  RankPlacement gpu;
  gpu.device = Device::CUDA;
  gpu.compute = DType::BF16;
  // 1024 tokens (16 chunks of 64, at most 1024 documents); 2 key heads of 32, 4 value heads of 16.
  const Config c = tiny_run_config("hybrid", {"model.hybrid_layout=\"GA\"", "model.num_layers=2", "model.hidden_size=64",
                                              "model.num_heads=2", "model.gdn_num_key_heads=2",
                                              "model.gdn_num_value_heads=4", "model.gdn_key_head_dim=32",
                                              "model.gdn_value_head_dim=16", "data.sequence_length=256",
                                              "batch.micro_batch_size=4", "batch.global_batch_size=4"});
  const MemoryEstimate e = estimate_memory(c, gpu);
  const auto part = std::find_if(e.parts.begin(), e.parts.end(),
                                 [](const MemoryPart& m) { return m.name == "Gated DeltaNet backward"; });
  REQUIRE(part != e.parts.end());
  // The chunk table (1024 documents + 1, 3 x (16 + 1024) chunks); bf16: q^, k^ (1024 x 64 each),
  // U, D, dU (1024 x 64 each), W, dW (1024 x 128 each), 16 slots x 4 heads x 32 x 16 of states and
  // their gradients; f32: dq^, dk^ (1024 x 128 each), d gc (1024 x 4), 1040 x 4 x 2 partials.
  const double table = 4.0 * (1025 + 3 * 1040), states = 16.0 * 4 * 32 * 16;
  CHECK(part->bytes == table + 2.0 * (2 * 1024 * 64 + 3 * 1024 * 64 + 2 * 1024 * 128 + 2 * states) +
                           4.0 * (2 * 1024 * 128 + 1024 * 4 + 1040 * 4 * 2));
  const MemoryEstimate cpu = estimate_memory(c, RankPlacement{});
  CHECK(std::none_of(cpu.parts.begin(), cpu.parts.end(), [](const MemoryPart& m) { return m.name == "Gated DeltaNet backward"; }));
}

TEST_CASE("memory estimate: a distillation teacher's weights are counted, and the bound still holds") {
  const std::string dir = (std::filesystem::path(learnable_dataset()).parent_path() / "memory-teacher-hf").string();
  const Config src = tiny_run_config("llama", {"run.name=memory-teacher", "model.num_layers=3", "model.hidden_size=48"});
  checkpoint::export_hf_from_config(src, dir, {});
  const Config c = tiny_run_config("llama", {"distillation.teacher=\"" + dir + "\"", "training.steps=2",
                                             "optimizer.warmup_steps=1"});
  const ModelConfig teacher = checkpoint::folder_model_config(dir);
  CHECK(teacher.num_layers == 3);
  const MemoryEstimate without = estimate_memory(c, RankPlacement{}), with = estimate_memory(c, RankPlacement{}, &teacher);
  const double teacher_params = static_cast<double>(model_param_table(teacher).num_parameters());
  CHECK(with.device_bytes() - without.device_bytes() == doctest::Approx(4 * teacher_params));  // f32 on the CPU
  CHECK(with.parts.size() == without.parts.size() + 1);
  const size_t before = memory_stats(Device::CPU).in_use;
  reset_peak_memory(Device::CPU);
  {
    Trainer t(c, false);
    t.train_step();
  }
  const double peak = static_cast<double>(memory_stats(Device::CPU).peak_in_use - before);
  INFO("estimate " << with.device_bytes() << " bytes, peak allocated " << peak);
  CHECK(with.device_bytes() <= peak);
  // A refusal lists the teacher's part.
  std::string message;
  try {
    check_memory(c, RankPlacement{}, {pool("host memory", 1e5)}, 0, &teacher);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("teacher") != std::string::npos);
  CHECK(message.find(dir) != std::string::npos);
  // On a GPU the GEMM workspace is part of the estimate.
  RankPlacement gpu;
  gpu.device = Device::CUDA;
  gpu.compute = DType::BF16;
  const MemoryEstimate on_gpu = estimate_memory(c, gpu);
  CHECK(std::any_of(on_gpu.parts.begin(), on_gpu.parts.end(), [](const MemoryPart& p) { return p.name == "workspaces"; }));
}

TEST_CASE("memory estimate: a run that cannot fit is refused with every part and the key that drives it") {
  const MemoryPool host = pool("host memory", 64 * kGiB);
  struct Case {
    std::vector<std::string> overrides;
    std::string key;
  };
  const std::vector<Case> cases = {
      {{"model.hidden_size=1000000000", "model.num_heads=4"}, "model.hidden_size"},
      {{"model.num_layers=2000000000"}, "model.num_layers"},
      {{"model.vocab_size=2000000000"}, "model.vocab_size"},
      // (one logits chunk: its size grows with the sequence too, which makes this key the largest)
      {{"data.sequence_length=500000000", "distributed.cross_entropy_splits=1"}, "data.sequence_length"},
      {{"batch.micro_batch_size=100000000", "batch.global_batch_size=100000000"}, "data.sequence_length"},
      {{"batch.global_batch_size=2000000000", "training.steps=1000"}, "batch.global_batch_size"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.overrides.front());
    const Config c = tiny_run_config("llama", plus(k.overrides, {"training.eval_every=0"}));
    std::string message;
    try {
      check_memory(c, RankPlacement{}, {host}, 0);
    } catch (const Error& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find(": " + k.key + ": this run needs at least") != std::string::npos);
    CHECK(message.find("halving " + k.key + " saves the most") != std::string::npos);
    for (const char* part : {"parameters", "gradients", "optimizer state", "activations", "logits", "sample plan",
                             "lower bound", "64.00 GiB are available"})
      CHECK(message.find(part) != std::string::npos);
  }
  // The GPU's memory is checked apart from the host's: a model that fits the host but not the GPU.
  RankPlacement gpu;
  gpu.device = Device::CUDA;
  gpu.compute = DType::BF16;
  const Config big = tiny_run_config("llama", {"model.hidden_size=24000", "model.num_heads=24"});
  CHECK_NOTHROW(check_memory(big, gpu, {pool("GPU 0 memory", 139 * kGiB), host}, 0));
  CHECK_THROWS_WITH_AS(check_memory(big, gpu, {pool("GPU 0 memory", 8 * kGiB), host}, 0),
                       doctest::Contains("of GPU 0 memory on rank 0"), Error);
  // Ranks sharing a pool: each fits alone, together they exceed its capacity.
  const double one = estimate_memory(big, gpu).device_bytes();
  CHECK_NOTHROW(check_memory(big, gpu, {pool("GPU 0 memory", 1.5 * one, 1), host}, 0));
  CHECK_THROWS_WITH_AS(check_memory(big, gpu, {pool("GPU 0 memory", 1.5 * one, 2), host}, 1),
                       doctest::Contains("on each of the 2 or more ranks sharing it"), Error);
  // Sizes whose parameter count does not fit 64 bits are named, not wrapped.
  CHECK_THROWS_WITH_AS(
      estimate_memory(tiny_run_config("llama", {"model.hidden_size=2000000000", "model.num_heads=2",
                                                "model.ffn_hidden_size=2000000000"}),
                      RankPlacement{}),
      doctest::Contains("model.hidden_size: this model's parameters cannot be counted in 64-bit integers"), Error);
}

TEST_CASE("memory estimate: layouts split the parts as the run does") {
  const Config c = tiny_run_config("llama", {"model.num_layers=4", "distributed.zero_stage=1"});
  const MemoryEstimate one = estimate_memory(c, RankPlacement{});
  RankPlacement tp2;
  tp2.tp = 2;
  const Config ct = tiny_run_config("llama", {"model.num_layers=4", "model.vocab_size=38", "model.num_heads=2",
                                              "distributed.tensor_parallel=2", "distributed.sequence_parallel=true"});
  const MemoryEstimate split = estimate_memory(ct, tp2), whole = estimate_memory(ct, RankPlacement{});
  CHECK(split.parts[0].bytes < 0.6 * whole.parts[0].bytes);  // parameters: about half on each rank
  CHECK(split.parts[3].bytes < 0.6 * whole.parts[3].bytes);  // activations, with sequence parallelism
  // Pipeline: rank 0 holds the embedding and half the blocks, rank 1 the other half and the head.
  RankPlacement pp0, pp1;
  pp0.pp = pp1.pp = 2;
  pp1.pp_rank = 1;
  const Config cp = tiny_run_config("llama", {"model.num_layers=4", "distributed.pipeline_parallel=2"});
  const MemoryEstimate r0 = estimate_memory(cp, pp0), r1 = estimate_memory(cp, pp1);
  CHECK(r0.parts[0].bytes + r1.parts[0].bytes == doctest::Approx(one.parts[0].bytes));
  CHECK(r0.parts.size() == one.parts.size() - 1);  // no logits on rank 0
  // ZeRO 1 over 4 data-parallel ranks: a quarter of the optimizer state.
  RankPlacement dp4;
  dp4.dp = 4;
  CHECK(estimate_memory(c, dp4).parts[2].bytes == doctest::Approx(one.parts[2].bytes / 4));
}

TEST_CASE("config: a micro-batch's tokens must fit the 32-bit offsets its documents are addressed by") {
  CHECK_THROWS_WITH_AS(tiny_run_config("llama", {"batch.micro_batch_size=2", "batch.global_batch_size=2",
                                                 "data.sequence_length=1100000000"}),
                       doctest::Contains("<command line>: batch.micro_batch_size: micro_batch_size 2 x "
                                         "data.sequence_length 1100000000 = 2200000000 tokens per micro-batch"),
                       Error);
  CHECK_NOTHROW(tiny_run_config("llama", {"batch.micro_batch_size=2", "data.sequence_length=1000000000"}));
}

TEST_CASE("memory estimate: a lower bound of what a GPU run allocates (bf16; every block kind)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const std::vector<std::string> size = {"run.device=\"cuda\"",      "model.hidden_size=512", "model.num_heads=8",
                                         "model.num_kv_heads=4",     "model.ffn_hidden_size=1024",
                                         "data.sequence_length=256", "batch.micro_batch_size=4",
                                         "batch.global_batch_size=8", "training.steps=2", "optimizer.warmup_steps=1",
                                         "data.max_epochs=0"};
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"llama", {}}, {"gpt2", {}}, {"mixtral", kMixtral}, {"mamba", kMamba}, {"hybrid", kHybrid}};
  RankPlacement gpu;
  gpu.device = Device::CUDA;
  gpu.compute = DType::BF16;
  for (const auto& [family, overrides] : cases) {
    CAPTURE(family);
    const Config c = tiny_run_config(family, plus(plus(size, overrides), {}));
    const size_t before = memory_stats(Device::CUDA).in_use;
    reset_peak_memory(Device::CUDA);
    {
      Trainer t(c, false);
      t.train_step();
    }
    // The GEMM workspace is allocated once per process outside the caching allocator.
    const double peak = static_cast<double>(memory_stats(Device::CUDA).peak_in_use - before) +
                        static_cast<double>(ops::kGemmWorkspaceBytes);
    const MemoryEstimate e = estimate_memory(c, gpu);
    INFO("estimate " << e.device_bytes() << " bytes, peak allocated " << peak);
    CHECK(e.device_bytes() > 2 * static_cast<double>(ops::kGemmWorkspaceBytes));  // the model's parts dominate
    CHECK(e.device_bytes() <= peak);
  }
}

TEST_CASE("memory estimate: multi-token prediction's extra heads are counted, and the bound still holds") {
  for (const auto& [family, overrides] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"llama", {}}, {"llama", {"training.recompute_activations=true"}}, {"mixtral", kMixtral}}) {
    CAPTURE(family);
    const Config c = tiny_run_config(family, plus(overrides, {"model.num_layers=3", "model.prediction_heads=2",
                                                              "training.steps=2", "optimizer.warmup_steps=1"}));
    const Config plain = tiny_run_config(family, plus(overrides, {"model.num_layers=3", "training.steps=2",
                                                                  "optimizer.warmup_steps=1"}));
    const MemoryEstimate e = estimate_memory(c, RankPlacement{}), e0 = estimate_memory(plain, RankPlacement{});
    auto part = [](const MemoryEstimate& m, const std::string& name) {
      for (const MemoryPart& p : m.parts)
        if (p.name == name) return p;
      FAIL("no part " << name);
      return MemoryPart{};
    };
    // The parameters are exactly the model's: every block, the extra heads' blocks and norms.
    const double a = static_cast<double>(dtype_size(DType::F32));
    CHECK(part(e, "parameters").bytes == doctest::Approx(static_cast<double>(model_param_table(c.model).num_parameters()) * a));
    CHECK(part(e, "activations").bytes > part(e0, "activations").bytes);
    CHECK(part(e, "activations").detail.find("2 extra prediction head(s)") != std::string::npos);
    CHECK(part(e, "logits").detail.find("model.prediction_heads") != std::string::npos);
    const size_t before = memory_stats(Device::CPU).in_use;
    reset_peak_memory(Device::CPU);
    {
      Trainer t(c, false);
      t.train_step();
    }
    const double peak = static_cast<double>(memory_stats(Device::CPU).peak_in_use - before);
    INFO("estimate " << e.device_bytes() << " bytes, peak allocated " << peak);
    CHECK(e.device_bytes() <= peak);
  }
}
