// Multi-token prediction end to end: a tiny Llama with two extra heads learns (the main loss and
// every head's fall), its run writes each head's loss to metrics.jsonl for training and
// validation, and ./train runs it from a config file.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "tests/common/process.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {
const std::vector<std::string> kMtp = {"model.num_layers=3", "model.prediction_heads=2",
                                       "model.prediction_loss_weights=[1.0, 0.5, 0.5]"};
std::vector<std::string> with(std::vector<std::string> o) {
  o.insert(o.end(), kMtp.begin(), kMtp.end());
  return o;
}
}  // namespace

TEST_CASE("multi-token prediction: a tiny llama learns, the next-token loss and every head's loss fall") {
  Trainer t(tiny_run_config("llama", with({"training.steps=30"})), false);
  std::vector<StepResult> r;
  for (int i = 0; i < 30; ++i) r.push_back(t.train_step());
  auto last_mean = [&](auto get) {
    double s = 0;
    for (size_t i = r.size() - 5; i < r.size(); ++i) s += get(r[i]);
    return s / 5;
  };
  const double last = last_mean([](const StepResult& x) { return x.loss; });
  INFO("loss: first " << r.front().loss << ", mean of last five " << last);
  CHECK(r.front().loss == doctest::Approx(std::log(37.0)).epsilon(0.15));
  CHECK(last < 0.75 * r.front().loss);
  for (size_t j = 0; j < 2; ++j) {
    CAPTURE(j + 1);
    REQUIRE(r.front().head_losses.size() == 2);
    const double head_last = last_mean([&](const StepResult& x) { return x.head_losses[j]; });
    INFO("head: first " << r.front().head_losses[j] << ", mean of last five " << head_last);
    CHECK(r.front().head_losses[j] == doctest::Approx(std::log(37.0)).epsilon(0.15));
    // The data's rule makes token t + 1 + j a function of the document's start and step too.
    CHECK(head_last < 0.8 * r.front().head_losses[j]);
  }
}

TEST_CASE("multi-token prediction: metrics.jsonl has every head's training and validation loss") {
  Config c = tiny_run_config("llama", with({"training.steps=4", "training.eval_every=2", "run.name=mtp-metrics"}));
  fs::remove_all(fs::path(c.run.output_dir) / "mtp-metrics");
  Trainer t(c);
  REQUIRE(t.run() == 0);
  std::ifstream f(t.run_dir() + "/metrics.jsonl");
  int steps = 0, evals = 0;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    const bool valid = j.contains("valid_loss");
    (valid ? evals : steps)++;
    for (const char* k : {"loss_head1", "loss_head2"}) {
      const std::string key = valid ? std::string("valid_") + k : std::string(k);
      INFO(line);
      REQUIRE(j.contains(key));
      CHECK(std::isfinite(j[key].get<double>()));
    }
    CHECK(!j.contains(valid ? "valid_loss_head3" : "loss_head3"));
  }
  CHECK(steps == 4);
  CHECK(evals == 2);
  CHECK(load_config(t.run_dir() + "/config.toml") == c);
}

TEST_CASE("./train: a config with prediction heads runs and logs each head's loss") {
  if (!has_train_binary()) return;
  Config c = tiny_run_config("llama", with({"training.steps=3", "run.name=cli-mtp", "run.overwrite=true"}));
  const fs::path dir = fs::path(learnable_dataset()).parent_path() / "cli";
  fs::create_directories(dir);
  const std::string path = (dir / "cli-mtp.toml").string();
  std::ofstream(path) << config_to_toml(c);
  ProcessResult r = run_command(train_binary() + " " + path);
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("| head 1 ") != std::string::npos);
  CHECK(r.output.find("| head 2 ") != std::string::npos);
  CHECK(fs::exists(fs::path(c.run.output_dir) / "cli-mtp" / "metrics.jsonl"));
}

TEST_CASE("GPU: multi-token prediction follows its CPU loss curve, every head, and learns" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // head_dim 64: the flash kernels; vocabulary 50 (not a multiple of 8: the padded head path)
  // shared by three heads; sequence parallelism is the dist tests' (CPU).
  const std::vector<std::string> o =
      with({"model.hidden_size=128", "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=64",
            "model.ffn_hidden_size=96", "model.vocab_size=50", "training.steps=12"});
  std::vector<std::string> cpu_o = o, gpu_o = o;
  cpu_o.push_back("run.device=\"cpu\"");
  gpu_o.push_back("run.device=\"cuda\"");
  Trainer cpu(tiny_run_config("llama", cpu_o), false), gpu(tiny_run_config("llama", gpu_o), false);
  StepResult first, last;
  for (int s = 0; s < 12; ++s) {
    StepResult a = cpu.train_step(), b = gpu.train_step();
    INFO("step " << s + 1 << ": cpu " << a.loss << ", gpu " << b.loss);
    REQUIRE(b.head_losses.size() == 2);
    CHECK(std::isfinite(b.loss));
    if (s < 4) {
      CHECK(std::fabs(a.loss - b.loss) <= 0.03 * a.loss);
      for (size_t j = 0; j < 2; ++j) CHECK(std::fabs(a.head_losses[j] - b.head_losses[j]) <= 0.03 * a.head_losses[j]);
    }
    if (s < 2) CHECK(std::fabs(a.grad_norm - b.grad_norm) <= 0.05 * a.grad_norm);
    if (s == 0) first = b;
    last = b;
  }
  CHECK(last.loss < 0.9 * first.loss);
  for (size_t j = 0; j < 2; ++j) CHECK(last.head_losses[j] < 0.95 * first.head_losses[j]);
  // Validation: every head's forward without gradients.
  CHECK(std::isfinite(gpu.evaluate()));
}
