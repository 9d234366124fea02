// Checkpoints and the Hugging Face tools through ./train as a user runs them: 6 steps with
// checkpoint_every = 3 against 3 steps then a resumed 3 (bitwise losses, metrics.jsonl continued),
// a checkpoint on SIGTERM, auto-resume falling back over a corrupted checkpoint with a warning that
// names the file, --export-hf / model.init_from / --dump-logits, and scripts/hf_check.py on the CPU
// when torch and transformers are installed.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/process.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {

using Result = ProcessResult;

std::string train_bin() { return train_binary(); }

Result run(const std::string& args) { return run_command(train_bin() + " " + args); }

// A config file for the learnable dataset; `name` is the run name; runs go to a scratch folder.
std::string write_config(const std::string& name, const std::string& family, std::vector<std::string> overrides) {
  const std::string dir = (fs::path(learnable_dataset()).parent_path() / "cli-ckpt").string();
  fs::create_directories(dir);
  overrides.push_back("run.name=" + name);
  overrides.push_back("run.output_dir=\"" + dir + "/runs\"");
  fs::remove_all(fs::path(dir) / "runs" / name);
  const Config c = tiny_run_config(family, overrides);
  const std::string path = dir + "/" + name + ".toml";
  write_text(path, config_to_toml(c));
  return path;
}

std::string run_dir(const std::string& name) {
  return (fs::path(learnable_dataset()).parent_path() / "cli-ckpt" / "runs" / name).string();
}

// step -> loss of a run's metrics.jsonl (training lines only).
std::map<int, double> metrics(const std::string& name) {
  std::map<int, double> out;
  std::ifstream f(run_dir(name) + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) {
      CHECK(out.count(j["step"].get<int>()) == 0);  // no step twice
      out[j["step"].get<int>()] = j["loss"].get<double>();
    }
  }
  return out;
}

const std::vector<std::string> kSchedule = {"training.steps=6", "optimizer.warmup_steps=2", "optimizer.decay_steps=4",
                                            "data.sequence_length=12"};

}  // namespace

TEST_CASE("./train: 6 steps with checkpoint_every=3 equal 3 steps + resume 3, bitwise" * doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  std::vector<std::string> o = kSchedule;
  o.push_back("training.checkpoint_every=3");
  const std::string whole = write_config("whole", "llama", o);
  Result a = run(whole);
  INFO(a.output);
  REQUIRE(a.code == 0);
  CHECK(fs::exists(run_dir("whole") + "/checkpoints/step_3/metadata.json"));
  CHECK(fs::exists(run_dir("whole") + "/checkpoints/step_6/metadata.json"));

  // The same run cut in two: 3 steps (the schedule is fixed by decay_steps), then resume = auto
  // with 6 steps in the same run folder.
  const std::string split = write_config("split", "llama", o);
  Result b1 = run(split + " training.steps=3");
  INFO(b1.output);
  REQUIRE(b1.code == 0);
  Result b2 = run(split + " training.resume=auto");
  INFO(b2.output);
  REQUIRE(b2.code == 0);
  CHECK(b2.output.find("resumed from") != std::string::npos);
  CHECK(b2.output.find("training.steps: 3 -> 6") != std::string::npos);  // the change is reported
  const auto want = metrics("whole"), got = metrics("split");
  REQUIRE(want.size() == 6);
  REQUIRE(got.size() == 6);
  for (const auto& [step, loss] : want) {
    INFO("step " << step);
    CHECK(got.at(step) == loss);
  }
  // Resuming a finished run does nothing and says so.
  Result again = run(split + " training.resume=auto");
  CHECK(again.code == 0);
  CHECK(metrics("split").size() == 6);
}

TEST_CASE("./train: SIGTERM writes a checkpoint after the current step; resume = auto continues it" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  const std::string cfg = write_config("sigterm", "llama", {"training.steps=100000", "optimizer.warmup_steps=1",
                                                            "training.checkpoint_every=1000000", "data.max_epochs=0"});
  Result r = run("--help >/dev/null; exec timeout --preserve-status -s TERM 1 " + train_bin() + " " + cfg);
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("stopped cleanly after step") != std::string::npos);
  int saved = -1;
  for (const auto& e : fs::directory_iterator(run_dir("sigterm") + "/checkpoints")) {
    const std::string n = e.path().filename().string();
    REQUIRE(n.rfind("step_", 0) == 0);
    saved = std::stoi(n.substr(5));
  }
  REQUIRE(saved > 0);
  Result again = run(cfg + " training.resume=auto training.steps=" + std::to_string(saved + 2));
  INFO(again.output);
  CHECK(again.code == 0);
  CHECK(again.output.find("resumed from " + run_dir("sigterm") + "/checkpoints/step_" + std::to_string(saved)) !=
        std::string::npos);
  const auto m = metrics("sigterm");
  CHECK(m.rbegin()->first == saved + 2);
}

TEST_CASE("./train: a corrupted newest checkpoint: auto falls back naming the file; an explicit path fails" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  std::vector<std::string> o = kSchedule;
  o.push_back("training.checkpoint_every=2");
  const std::string cfg = write_config("fallback", "gpt2", o);
  REQUIRE(run(cfg + " training.steps=4").code == 0);
  const std::string bad = run_dir("fallback") + "/checkpoints/step_4/rank_0.safetensors";
  truncate_file(bad, 1000);
  Result e = run(cfg + " training.resume=" + run_dir("fallback") + "/checkpoints/step_4");
  CHECK(e.code != 0);
  check_mentions(e.output, {"error", bad, "size mismatch"});
  Result r = run(cfg + " training.resume=auto");
  INFO(r.output);
  CHECK(r.code == 0);
  check_mentions(r.output, {"warning", bad, "size mismatch", "resumed from " + run_dir("fallback") + "/checkpoints/step_2"});
  CHECK(metrics("fallback").size() == 6);
}

TEST_CASE("./train --export-hf, model.init_from and --dump-logits: the export starts a run with the same logits" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  std::vector<std::string> o = kSchedule;
  o.push_back("training.checkpoint_every=3");
  o.push_back("training.steps=3");
  o.push_back("model.sliding_window=5");
  const std::string cfg = write_config("export", "qwen2", o);
  REQUIRE(run(cfg).code == 0);
  const std::string out = run_dir("export") + "-hf";
  Result x = run(cfg + " --export-hf " + out + " --export-shard-mb 0.01");
  INFO(x.output);
  REQUIRE(x.code == 0);
  CHECK(x.output.find("checkpoints/step_3") != std::string::npos);
  CHECK(fs::exists(out + "/model.safetensors.index.json"));
  const std::string tokens = run_dir("export") + "-tokens.txt";
  write_text(tokens, "1 2 3 4 5 6 7 8 9 10 11\n30 0 7\n");
  const std::string ours = run_dir("export") + "-ours.safetensors", theirs = run_dir("export") + "-hf.safetensors";
  REQUIRE(run(cfg + " --dump-logits " + tokens + " " + ours).code == 0);
  // A new run from the export: [model] comes from its config.json.
  const std::string data = learnable_dataset();
  const std::string from = run_dir("export") + "-from.toml";
  write_text(from, "[run]\ndevice = \"cpu\"\noutput_dir = \"" + run_dir("export") + "-from\"\n[model]\ninit_from = \"" +
                       out + "\"\n[data]\ntrain = [\"" + data + "\"]\nsequence_length = 12\n[training]\nsteps = 2\n");
  Result d = run(from + " --dump-logits " + tokens + " " + theirs);
  INFO(d.output);
  REQUIRE(d.code == 0);
  CHECK(d.output.find("Hugging Face folder") != std::string::npos);
  checkpoint::SafetensorsFile a(ours), b(theirs);
  for (const char* name : {"logits.0", "logits.1", "tokens.1"}) {
    CAPTURE(name);
    const auto& ta = a.at(name);
    const auto& tb = b.at(name);
    REQUIRE(ta.shape == tb.shape);
    CHECK(std::memcmp(a.data(ta), b.data(tb), ta.end - ta.begin) == 0);
  }
  CHECK(a.at("logits.0").shape == std::vector<int64_t>{11, 37});
  // A run from the folder trains.
  Result t = run(from);
  INFO(t.output);
  CHECK(t.code == 0);
  // Bad input for the tools.
  write_text(tokens, "1 2 x\n");
  check_mentions(run(cfg + " --dump-logits " + tokens + " " + ours).output, {tokens + ":1", "'x'"});
  check_mentions(run(cfg + " model.sliding_window=0 model.family=\"llama\" model.qkv_bias=true --export-hf " + out).output,
                 {"model.", "qwen2"});
}

TEST_CASE("scripts/hf_check.py: our logits and greedy output equal transformers' (CPU, when torch and transformers "
          "are installed)" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  const char* py = std::getenv("HF_CHECK_PYTHON");
  const std::string python = py ? py : (std::getenv("PYTHON") ? std::getenv("PYTHON") : "python3");
  if (std::system((python + " -c 'import torch, transformers, numpy' >/dev/null 2>&1").c_str()) != 0) {
    skip_test("no python with torch and transformers (set HF_CHECK_PYTHON); scripts/hf_check.py runs on the GPU machine");
    return;
  }
  const std::string cmd = python + " scripts/hf_check.py --cpu-only --steps 2 --train " + train_bin() + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  r.code = pclose(p);
  INFO(r.output);
  CHECK(r.code == 0);
  for (const char* f : {"gpt2 ", "llama ", "mistral ", "qwen2 "}) CHECK(r.output.find(f) != std::string::npos);
  CHECK(r.output.find("generate cpu-f32 ") != std::string::npos);
}
