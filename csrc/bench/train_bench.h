// End-to-end training throughput of a config: `bench train CONFIG [k=v ...]` trains it on a
// synthetic random-token dataset (written once to a temporary folder, so no data is needed),
// untimed warm-up steps first, then reports tokens/s, model FLOP utilisation and peak memory.
#pragma once
#include <string>
#include <vector>

namespace engine::bench {

// args: section.key=value overrides, and --profile: after the timed steps, two more steps under
// CUPTI print the per-kernel time table (bench/kernel_profile.h).
int run_train_bench(const std::string& config_path, const std::vector<std::string>& args);

}  // namespace engine::bench
