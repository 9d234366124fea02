#include "tests/train/train_fixture.h"

#include <unistd.h>

#include <filesystem>
#include <vector>

#include "core/rng.h"
#include "data/dataset_writer.h"

namespace engine::testing {

std::string learnable_dataset() {
  static const std::string prefix = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("engine_train_tests." + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    std::vector<std::vector<int32_t>> docs;
    PhiloxKey key = philox_key(99, "learnable");  // fixed: the data is the same in every run
    for (uint64_t d = 0; d < 300; ++d) {
      const int len = 5 + static_cast<int>(philox_below(key, 3 * d, 40));
      int32_t t = static_cast<int32_t>(philox_below(key, 3 * d + 1, 37));
      const int32_t step = 1 + static_cast<int32_t>(philox_below(key, 3 * d + 2, 3));
      std::vector<int32_t> doc;
      for (int i = 0; i < len; ++i, t = (t + step) % 37) doc.push_back(t);
      docs.push_back(doc);
    }
    const std::string p = (dir / "learnable").string();
    write_token_dataset(p, docs, 37);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                      ("engine_train_tests." + std::to_string(getpid())), ec);
    });
    return p;
  }();
  return prefix;
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::unique_ptr<Trainer> resumed_after(const Config& config, int steps) {
  std::filesystem::remove_all(std::filesystem::path(config.run.output_dir) / config.run.name);
  {
    Trainer first(config, false);
    for (int i = 0; i < steps; ++i) first.train_step();
    first.save_checkpoint();
  }
  Config again = config;
  again.training.resume = "auto";
  return std::make_unique<Trainer>(again, false);
}

Config tiny_run_config(const std::string& family, const std::vector<std::string>& overrides) {
  const std::string text = R"(
[run]
name = "test"
output_dir = ")" + (std::filesystem::path(learnable_dataset()).parent_path() / "runs").string() + R"("
seed = 5
device = "cpu"
[model]
family = ")" + family + R"("
vocab_size = 37
hidden_size = 24
num_layers = 2
num_heads = 3
ffn_hidden_size = 40
[data]
train = [{ path = ")" + learnable_dataset() + R"(" }]
sequence_length = 20
valid_fraction = 0.1
[batch]
micro_batch_size = 4
global_batch_size = 8
[optimizer]
lr = 1e-2
warmup_steps = 3
[training]
steps = 40
)";
  return parse_config(text, "tiny-run.toml", overrides);
}

}  // namespace engine::testing
