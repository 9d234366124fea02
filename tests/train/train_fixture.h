// A small learnable dataset and tiny run configs for trainer tests: documents follow
// t[i+1] = (t[i] + step) mod V with a per-document start and step, so a model that learns the
// rule drives the loss far below ln(V).
#pragma once
#include <memory>
#include <string>

#include "config/config.h"
#include "train/trainer.h"

namespace engine::testing {

// Writes (once per process) the dataset and returns its path prefix.
std::string learnable_dataset();
// A run config of `family` over learnable_dataset() on the CPU, parsed through the real parser,
// with `overrides` (section.key=value) applied.
Config tiny_run_config(const std::string& family, const std::vector<std::string>& overrides = {});
// a followed by b (override lists).
std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b);
// A fresh run of `config` (its run folder removed first) for `steps` steps, checkpointed, then a
// Trainer resumed from that checkpoint (training.resume = "auto"): exact-resume tests.
std::unique_ptr<Trainer> resumed_after(const Config& config, int steps);

}  // namespace engine::testing
