// ./train --generate and training.sample_every end to end, as a user runs them: weights from the
// run's checkpoint, greedy and seeded output that repeats, bad options refused with the option
// named, and a run with samples whose metrics equal the run without.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/common/process.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {

std::string config_file(const std::string& name, const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> o = {"training.steps=3", "run.name=" + name, "run.overwrite=true"};
  o.insert(o.end(), overrides.begin(), overrides.end());
  const Config c = tiny_run_config("llama", o);
  const fs::path dir = fs::path(learnable_dataset()).parent_path() / "cli";
  fs::create_directories(dir);
  const std::string path = (dir / (name + ".toml")).string();
  std::ofstream(path) << config_to_toml(c);
  return path;
}

ProcessResult train(const std::string& args) { return run_command(train_binary() + " " + args); }

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.find_last_of('\n') + 1);
}

// The metrics.jsonl of a run, without the timing fields (tokens_per_s, step_seconds, elapsed_s).
std::string losses(const std::string& run_name) {
  const Config c = tiny_run_config("llama");
  std::ifstream in(fs::path(c.run.output_dir) / run_name / "metrics.jsonl");
  std::string line, out;
  while (std::getline(in, line)) {
    for (const char* key : {"\"loss\":", "\"grad_norm\":", "\"valid_loss\":"}) {
      const size_t at = line.find(key);
      if (at != std::string::npos) out += line.substr(at, line.find_first_of(",}", at) - at) + " ";
    }
    out += "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("./train --generate: the run's checkpoint continues a prompt; greedy and seeded output repeat" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  const std::string cfg = config_file("gen-cli", {"training.checkpoint_every=3"});
  ProcessResult t = train(cfg);
  INFO(t.output);
  REQUIRE(t.code == 0);
  ProcessResult g1 = train(cfg + " --generate 1,2,3 --temperature 0 --max-new-tokens 6");
  ProcessResult g2 = train(cfg + " --generate '1 2 3' --temperature 0 --max-new-tokens 6");
  INFO(g1.output);
  CHECK(g1.code == 0);
  CHECK(g1.output.find("checkpoint") != std::string::npos);  // the weights' source is named
  CHECK(g1.output.find("token ids") != std::string::npos);   // vocab 37: prompts and output as ids
  const std::string out = last_line(g1.output);
  CHECK(out.rfind("1 2 3 ", 0) == 0);
  std::istringstream words(out);
  int n = 0;
  for (std::string w; words >> w;) ++n;
  CHECK(n == 9);
  CHECK(last_line(g2.output) == out);
  ProcessResult s1 = train(cfg + " --generate 1,2,3 --seed 11 --temperature 1.3 --top-k 20 --top-p 0.95");
  ProcessResult s2 = train(cfg + " --generate 1,2,3 --seed 11 --temperature 1.3 --top-k 20 --top-p 0.95");
  INFO(s1.output);
  CHECK(s1.code == 0);
  CHECK(last_line(s1.output) == last_line(s2.output));
}

TEST_CASE("./train --generate: bad options and prompts are refused, naming them") {
  if (!has_train_binary()) return;
  const std::string cfg = config_file("gen-bad");
  struct Case {
    std::string name, args, expect;
  };
  std::string long_prompt;
  for (int i = 0; i < 20; ++i) long_prompt += (i ? "," : "") + std::to_string(i % 30);
  const std::vector<Case> cases = {
      {"negative temperature", "--generate 1 --temperature -1", "--temperature must be >= 0"},
      {"top-p 0", "--generate 1 --top-p 0", "--top-p must be in (0, 1]"},
      {"top-p above 1", "--generate 1 --top-p 1.5", "--top-p must be in (0, 1]"},
      {"top-k not a number", "--generate 1 --top-k x", "--top-k must be a non-negative integer"},
      {"no new tokens", "--generate 1 --max-new-tokens 0", "--max-new-tokens must be >= 1"},
      {"unknown flag", "--generate 1 --top-q 3", "unknown option --top-q"},
      {"without --generate", "--temperature 0.5", "--temperature needs --generate"},
      {"prompt past the context", "--generate " + long_prompt, "no room for a new token"},
      {"id past the vocabulary", "--generate 1,40", "'40' is not a token id in [0, 37)"},
      {"empty prompt", "--generate ''", "the prompt is empty"},
      {"missing prompt", "--generate", "--generate needs a value"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    ProcessResult r = train(cfg + " " + k.args);
    INFO(r.output);
    CHECK(r.code != 0);
    CHECK(r.output.find(k.expect) != std::string::npos);
  }
}

TEST_CASE("./train training.sample_every: samples in the log, metrics bitwise those of the run without" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  ProcessResult plain = train(config_file("gen-plain", {"training.steps=4"}));
  ProcessResult sampled = train(config_file("gen-sampled", {"training.steps=4", "training.sample_every=2",
                                                            "training.sample_prompt=\"4,5\"",
                                                            "training.sample_tokens=6"}));
  INFO(sampled.output);
  REQUIRE(plain.code == 0);
  REQUIRE(sampled.code == 0);
  CHECK(sampled.output.find("step 2 | sample: 4 5 ") != std::string::npos);
  CHECK(sampled.output.find("step 4 | sample: 4 5 ") != std::string::npos);
  CHECK(plain.output.find("sample:") == std::string::npos);
  const std::string a = losses("gen-plain"), b = losses("gen-sampled");
  CHECK(a.find("\"loss\":") != std::string::npos);
  CHECK(a == b);
}

TEST_CASE("mpirun -n 2 ./train --generate: rank 0 generates and prints once" * doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  const std::string cfg = config_file("gen-mpi");
  ProcessResult one = train(cfg + " --generate 7,8 --temperature 0 --max-new-tokens 4");
  ProcessResult two = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
      "timeout 120 mpirun -n 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 " +
      train_binary() + " " + cfg + " --generate 7,8 --temperature 0 --max-new-tokens 4");
  INFO(two.output);
  CHECK(one.code == 0);
  CHECK(two.code == 0);
  const std::string line = last_line(one.output);
  size_t count = 0;
  for (size_t at = two.output.find(line); at != std::string::npos; at = two.output.find(line, at + 1)) ++count;
  CHECK(count == 1);
}
