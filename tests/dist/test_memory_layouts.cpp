// The memory estimate (models/memory_estimate.h) stays a lower bound of what each rank allocates
// in the parallel layouts: tensor parallelism with sequence parallelism, pipeline stages under
// each schedule, data parallelism at ZeRO 1 and 3. On two ranks (CPU).
#include <doctest/doctest.h>

#include "comm/comm.h"
#include "core/buffer.h"
#include "models/memory_estimate.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;

TEST_CASE("memory estimate: a lower bound of each rank's allocations in tp, pp and ZeRO layouts") {
  if (world().size() != 2) {
    skip_test("needs 2 ranks");
    return;
  }
  const std::vector<std::string> base = {"model.num_heads=4",     "model.head_dim=6",        "model.vocab_size=38",
                                         "model.num_layers=4",    "batch.micro_batch_size=2", "training.steps=2",
                                         "optimizer.warmup_steps=1"};
  const std::vector<std::vector<std::string>> layouts = {
      {"distributed.tensor_parallel=2", "distributed.sequence_parallel=true"},
      {"distributed.pipeline_parallel=2", "distributed.pipeline_schedule=\"1f1b\""},
      {"distributed.pipeline_parallel=2", "distributed.pipeline_schedule=\"breadth_first\""},
      {"distributed.pipeline_parallel=2", "distributed.stages_per_rank=2", "distributed.pipeline_schedule=\"1f1b\""},
      {"distributed.zero_stage=1"},
      {"distributed.zero_stage=3"},
  };
  for (const auto& layout : layouts) {
    std::vector<std::string> o = base;
    o.insert(o.end(), layout.begin(), layout.end());
    CAPTURE(o.back());
    const Config c = tiny_run_config("llama", o);
    const size_t before = memory_stats(Device::CPU).in_use;
    reset_peak_memory(Device::CPU);
    RankPlacement p;
    {
      Trainer t(c, false);
      t.train_step();
      p.dp = t.mesh().dp().size();
      p.tp = t.mesh().tp_size();
      p.pp = t.mesh().pp_size();
      p.pp_rank = t.mesh().pp_rank();
    }
    const double peak = static_cast<double>(memory_stats(Device::CPU).peak_in_use - before);
    const double estimate = estimate_memory(c, p).device_bytes();
    INFO("rank " << world().rank() << ": estimate " << estimate << " bytes, peak allocated " << peak);
    CHECK(estimate > 0);
    CHECK(estimate <= peak);
  }
}
