// ./train end to end as a user runs it: good runs, and bad input that must fail with a message
// naming the problem (file, line, key, offset) and a non-zero exit code, leaving data intact.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>

#include <nlohmann/json.hpp>

#include "data/dataset_writer.h"
#include "tests/common/process.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {

using Result = ProcessResult;

Result run(const std::string& args) { return run_command(train_binary() + " " + args); }

std::string write_config(const std::string& name, const std::string& text) {
  const fs::path dir = fs::path(learnable_dataset()).parent_path() / "cli";
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

// A valid config file for the learnable dataset (the trainer fixture's settings as TOML).
std::string good_config(const std::string& name, const std::string& data_path = "") {
  Config c = tiny_run_config("llama", {"training.steps=3", "run.name=" + name});
  if (!data_path.empty()) c.data.train[0].path = data_path;
  return write_config(name + ".toml", config_to_toml(c));
}

// ./train on two ranks under mpirun with `env` (NAME=value ...) exported to both; a hang fails
// by the 120 s timeout (exit 124), never blocks the suite.
Result mpirun2(const std::string& env, const std::string& args) {
  std::string exports;
  for (size_t at = 0; at < env.size();) {
    const size_t end = std::min(env.find(' ', at), env.size());
    const std::string kv = env.substr(at, end - at);
    if (!kv.empty()) exports += " -x " + kv.substr(0, kv.find('='));
    at = end + 1;
  }
  return run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                     "OMPI_MCA_btl_vader_single_copy_mechanism=none " + env +
                     " timeout 120 mpirun -n 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1" + exports + " " +
                     train_binary() + " " + args);
}

bool has_mpirun() {
  if (std::system("command -v mpirun >/dev/null 2>&1") == 0) return true;
  skip_test("no mpirun");
  return false;
}

}  // namespace

TEST_CASE("./train: a short run succeeds and writes its run directory") {
  if (!has_train_binary()) return;
  Result r = run(good_config("cli-ok"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("step 3/3") != std::string::npos);
  Config c = tiny_run_config("llama", {"run.name=cli-ok"});
  CHECK(fs::exists(fs::path(c.run.output_dir) / "cli-ok" / "metrics.jsonl"));
  CHECK(fs::exists(fs::path(c.run.output_dir) / "cli-ok" / "config.toml"));
  CHECK(run("--help").code == 0);
  // The same run name again: refused before anything is written, unless run.overwrite is set.
  const std::string metrics = (fs::path(c.run.output_dir) / "cli-ok" / "metrics.jsonl").string();
  const auto size = fs::file_size(metrics);
  Result again = run(good_config("cli-ok"));
  INFO(again.output);
  CHECK(again.code != 0);
  CHECK(again.output.find("already holds an earlier run's metrics.jsonl") != std::string::npos);
  CHECK(again.output.find("run.overwrite = true") != std::string::npos);
  CHECK(fs::file_size(metrics) == size);
  Result replaced = run(good_config("cli-ok") + " run.overwrite=true training.steps=2 optimizer.warmup_steps=1");
  INFO(replaced.output);
  CHECK(replaced.code == 0);
  CHECK(replaced.output.find("removed the earlier run's metrics.jsonl") != std::string::npos);
  CHECK(fs::file_size(metrics) < size);
  Result sched = run(good_config("cli-sched") + " distributed.pipeline_parallel=2 --print-schedule");
  INFO(sched.output);
  CHECK(sched.code == 0);
  CHECK(sched.output.find("rank 1: F1.0<r0 F1.1<r0 B1.0 B1.1") != std::string::npos);
}

TEST_CASE("./train: bad input fails with a message that names the problem") {
  if (!has_train_binary()) return;
  const std::string good = good_config("cli-bad");
  // A truncated copy of the dataset's index (the original stays intact).
  const fs::path dir = fs::path(learnable_dataset()).parent_path();
  fs::copy_file(learnable_dataset() + ".bin", dir / "cut.bin", fs::copy_options::overwrite_existing);
  fs::copy_file(learnable_dataset() + ".idx", dir / "cut.idx", fs::copy_options::overwrite_existing);
  fs::resize_file(dir / "cut.idx", 40);
  const auto idx_size = fs::file_size(learnable_dataset() + ".idx");

  struct Case {
    std::string name, args;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"no such config", "/nonexistent/run.toml", {"/nonexistent/run.toml"}},
      {"unknown key", write_config("typo.toml", "[model]\nfamily = \"llama\"\nhiden_size = 3\n"),
       {"typo.toml:3", "model.hiden_size", "unknown key", "hidden_size"}},
      {"syntax error", write_config("syntax.toml", "[model\nfamily = 1\n"), {"syntax.toml:1", "syntax"}},
      {"wrong type", write_config("type.toml", "[model]\nnum_layers = \"two\"\n"), {"type.toml:2", "model.num_layers"}},
      {"bad override", good + " model.num_heads=0", {"<command line>", "model.num_heads"}},
      {"unknown override", good + " optimizer.learning_rate=1", {"<command line>", "optimizer.learning_rate"}},
      {"inconsistent", good + " model.num_kv_heads=2", {"model.num_kv_heads"}},
      {"missing data", good_config("cli-missing", (dir / "absent").string()), {"absent"}},
      {"truncated index", good_config("cli-cut", (dir / "cut").string()), {"cut.idx", "offset"}},
      {"unknown option", good + " --frobnicate", {"--frobnicate"}},
      {"too many stages", good + " distributed.pipeline_parallel=2 distributed.stages_per_rank=2",
       {"distributed.stages_per_rank", "model.num_layers (2)"}},
      {"bad schedule", good + " distributed.pipeline_schedule=\"zigzag\"", {"distributed.pipeline_schedule"}},
      {"bad debug steps", good + " run.debug_steps=\"3-1\"", {"run.debug_steps", "3-1"}},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    Result r = run(k.args);
    INFO(r.output);
    CHECK(r.code != 0);
    for (const std::string& e : k.expect) CHECK(r.output.find(e) != std::string::npos);
  }
  CHECK(fs::file_size(learnable_dataset() + ".idx") == idx_size);
  // A token id past the vocabulary stops the run before its first step, wherever it is.
  Result vocab = run(good + " model.vocab_size=30");
  INFO(vocab.output);
  CHECK(vocab.code != 0);
  CHECK(vocab.output.find(learnable_dataset() + ".bin: document ") != std::string::npos);
  CHECK(vocab.output.find(">= model.vocab_size (30)") != std::string::npos);
  CHECK(vocab.output.find("step 1/") == std::string::npos);
}

TEST_CASE("./train: a dataset the run repeats is a warning with the epoch count, past data.max_epochs an error") {
  if (!has_train_binary()) return;
  const fs::path dir = fs::path(learnable_dataset()).parent_path() / "cli-short";
  fs::create_directories(dir);
  write_token_dataset((dir / "tiny").string(), {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {11, 12, 13, 14, 15}}, 37);
  const std::string cfg = good_config("cli-short", (dir / "tiny").string()) + " data.valid_fraction=0";
  Result warn = run(cfg);
  INFO(warn.output);
  CHECK(warn.code == 0);
  // 3 steps x 8 sequences x 20 tokens from 15 tokens: (480 + 1) / 15 = 32.1 epochs.
  CHECK(warn.output.find("15 tokens (3 documents): 32.1 epochs: the data repeats") != std::string::npos);
  Result refused = run(cfg + " data.max_epochs=30 run.name=cli-short-2");
  INFO(refused.output);
  CHECK(refused.code != 0);
  CHECK(refused.output.find("32.1 epochs, more than data.max_epochs = 30") != std::string::npos);
}

TEST_CASE("mpirun ./train --print-config and --help: rank 0 prints, every rank exits 0" * doctest::test_suite("full")) {
  if (!has_train_binary() || !has_mpirun()) return;
  Result p = mpirun2("", good_config("cli-print") + " --print-config");
  INFO(p.output);
  CHECK(p.code == 0);
  size_t runs = 0;
  for (size_t at = p.output.find("[run]"); at != std::string::npos; at = p.output.find("[run]", at + 1)) ++runs;
  CHECK(runs == 1);
  Result h = mpirun2("", "--help");
  INFO(h.output);
  CHECK(h.code == 0);
  CHECK(h.output.find("usage:") == h.output.rfind("usage:"));
}

TEST_CASE("./train: SIGINT stops the run cleanly after the current step" * doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  const std::string cfg = good_config("cli-signal");
  Result r = run("--help >/dev/null; exec timeout --preserve-status -s INT 1 " + std::string(std::getenv("TRAIN_BIN") ? std::getenv("TRAIN_BIN") : "./train") +
                 " " + cfg + " training.steps=100000 optimizer.warmup_steps=1 data.max_epochs=0");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("stopped cleanly after step") != std::string::npos);
}

namespace {
// The Python the scripts run with, if it can import `module` (empty string otherwise).
std::string python_with(const std::string& module) {
  const char* py = std::getenv("PYTHON");
  const std::string python = py ? py : "python3";
  if (std::system((python + " -c 'import " + module + "' >/dev/null 2>&1").c_str()) != 0) return "";
  return python;
}
}  // namespace

TEST_CASE("demo data: the tiny configs (gpt2, llama, mixtral, mamba, mamba2, linear-hybrid, hybrid) learn the demo corpus through ./train" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  const std::string python = python_with("json");
  if (python.empty()) {
    skip_test("no python to prepare the demo corpus");
    return;
  }
  const fs::path dir = fs::path(learnable_dataset()).parent_path() / "demo";
  fs::create_directories(dir);
  REQUIRE(std::system((python + " scripts/make_demo_corpus.py --documents 600 " + (dir / "corpus.jsonl").string() +
                       " >/dev/null && " + python + " scripts/prepare_data.py " + (dir / "corpus.jsonl").string() +
                       " --output " + (dir / "demo").string() + " >/dev/null").c_str()) == 0);
  // The seven runs at once, one thread each (the CPU Mamba blocks keep one core busy for seconds).
  const std::vector<std::string> names = {"tiny-gpt2", "tiny-llama", "tiny-mixtral", "tiny-mamba", "tiny-mamba2",
                                          "tiny-linear-hybrid", "tiny-hybrid"};
  const std::string out = (dir / "runs").string();
  std::vector<std::future<Result>> runs;
  for (const std::string& name : names)
    runs.push_back(std::async(std::launch::async, [&, name] {
      return run_command("OMP_NUM_THREADS=1 " + train_binary() + " configs/" + name + ".toml 'data.train=[\"" +
                         (dir / "demo").string() + "\"]' 'run.output_dir=\"" + out +
                         "\"' training.steps=20 training.eval_every=0 optimizer.warmup_steps=4 "
                         "data.sequence_length=32 batch.micro_batch_size=8 batch.global_batch_size=8");
    }));
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    CAPTURE(name);
    const Result r = runs[i].get();
    INFO(r.output);
    REQUIRE(r.code == 0);
    std::ifstream f(fs::path(out) / name / "metrics.jsonl");
    std::vector<double> losses;
    for (std::string line; std::getline(f, line);) {
      const auto at = line.find("\"loss\":");
      if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 7)));
    }
    REQUIRE(losses.size() == 20);
    INFO("first " << losses.front() << ", last " << losses.back());
    CHECK(losses.back() < 0.6 * losses.front());
  }
}

TEST_CASE("plot_metrics.py overlays runs into a PNG") {
  if (!has_train_binary()) return;
  const std::string python = python_with("matplotlib");
  if (python.empty()) {
    skip_test("no python with matplotlib (make deps installs python3-matplotlib)");
    return;
  }
  Result ok = run(good_config("plot-a"));
  REQUIRE(ok.code == 0);
  Config c = tiny_run_config("llama", {"run.name=plot-a"});
  const fs::path run_dir = fs::path(c.run.output_dir) / "plot-a", png = run_dir / "plot.png";
  const std::string cmd = python + " scripts/plot_metrics.py " + run_dir.string() + " " +
                          (run_dir / "metrics.jsonl").string() + " -o " + png.string() + " >/dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  REQUIRE(fs::exists(png));
  std::ifstream f(png, std::ios::binary);
  char magic[8] = {};
  f.read(magic, 8);
  CHECK(std::string(magic + 1, 3) == "PNG");
}

TEST_CASE("mpirun ./train: an error on one rank ends every rank promptly, the message printed once" * doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    skip_test("no mpirun (make deps installs OpenMPI)");
    return;
  }
  const fs::path dir = fs::path(learnable_dataset()).parent_path();
  const std::string good = good_config("mpi-good");
  Config missing = tiny_run_config("llama", {"training.steps=3", "run.name=mpi-good"});
  missing.data.train[0].path = (dir / "missing-on-rank-1").string();
  const std::string bad = write_config("mpi-bad.toml", config_to_toml(missing));
  const char* bin = std::getenv("TRAIN_BIN");
  const std::string train = bin ? bin : "./train";
  // MPMD launch: rank 0 gets a valid config, rank 1 the same one but for a dataset that does not
  // exist (the ranks' check at start that they agree names it).
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                          "OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 60 mpirun --oversubscribe "
                          "--bind-to none -n 1 " + train + " " + good + " : -n 1 " + train + " " + bad;
  const auto t0 = std::chrono::steady_clock::now();
  Result r = run_command(cmd);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.code != 124);  // not the timeout: the ranks ended by themselves
  CHECK(seconds < 10.0);
  size_t count = 0;
  for (size_t at = r.output.find("error: [rank 1]"); at != std::string::npos; at = r.output.find("error: [rank 1]", at + 1)) ++count;
  CHECK(count == 1);
  CHECK(r.output.find("missing-on-rank-1") != std::string::npos);
}

TEST_CASE("./train: a data file missing on one rank ends every rank with that rank's message" *
          doctest::test_suite("full")) {
  if (!has_train_binary() || !has_mpirun()) return;
  const auto t0 = std::chrono::steady_clock::now();
  Result m = mpirun2("ENGINE_TEST_MISSING_DATA=1", good_config("cli-missing-rank"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(m.output);
  CHECK(m.code != 0);
  CHECK(m.code != 124);
  CHECK(m.output.find("[rank 1]") != std::string::npos);
  CHECK(m.output.find(".missing-on-this-rank") != std::string::npos);
  CHECK(seconds < 60);
}

TEST_CASE("./train: a stuck rank ends the run with a message within distributed.timeout_s, never a hang" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  const std::string cfg = good_config("cli-stall") + " training.steps=4 distributed.timeout_s=2";
  {  // one process stalls at step 2: the watchdog ends it
    const auto t0 = std::chrono::steady_clock::now();
    Result s = run_command("ENGINE_TEST_STALL=0:2 timeout 60 " + train_binary() + " " + cfg);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(s.output);
    CHECK(s.code == 3);
    CHECK(s.output.find("step 2 did not finish within 2 s (distributed.timeout_s)") != std::string::npos);
    CHECK(seconds < 30);
  }
  if (!has_mpirun()) return;
  // Two ranks, rank 1 stalls: rank 0 waits in a collective; both are ended with the message.
  const auto t0 = std::chrono::steady_clock::now();
  Result m = mpirun2("ENGINE_TEST_STALL=1:2", cfg + " run.name=cli-stall-mpi");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(m.output);
  CHECK(m.code != 0);
  CHECK(m.code != 124);  // not the test's own timeout
  CHECK(m.output.find("did not finish within 2 s (distributed.timeout_s)") != std::string::npos);
  CHECK(seconds < 60);
}

TEST_CASE("./train + scripts/compare_stats.py: per-layer statistics, the first divergence between two runs") {
  if (!has_train_binary()) return;
  if (std::system("python3 -c 'import json' >/dev/null 2>&1") != 0) {
    skip_test("no python3 for scripts/compare_stats.py");
    return;
  }
  const std::string dbg = " training.steps=3 run.debug_level=2 run.debug_steps=\"1-2\"";
  Config c = tiny_run_config("llama");
  const fs::path out = fs::path(c.run.output_dir);
  for (const char* name : {"stats-a", "stats-b", "stats-c"}) fs::remove_all(out / name);
  CHECK(run(good_config("stats-a") + dbg).code == 0);
  CHECK(run(good_config("stats-b") + dbg).code == 0);
  CHECK(run(good_config("stats-c") + dbg + " run.seed=77").code == 0);
  const std::string script = "python3 scripts/compare_stats.py ";
  Result same = run_command(script + (out / "stats-a").string() + " " + (out / "stats-b").string());
  INFO(same.output);
  CHECK(same.code == 0);
  CHECK(same.output.find("no divergence: 12 tensor statistics over step(s) 1, 2") != std::string::npos);
  Result other = run_command(script + (out / "stats-a").string() + " " + (out / "stats-c").string());
  INFO(other.output);
  CHECK(other.code == 1);
  CHECK(other.output.find("first divergence: step 1, embedding.out") != std::string::npos);
}

namespace {
// step -> loss of a run's metrics.jsonl.
std::map<int, double> metric_losses(const fs::path& run_dir) {
  std::map<int, double> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("loss")) out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}
}  // namespace

TEST_CASE("./train: kill -9 of a rank mid-step or mid-checkpoint-write loses nothing; resume reproduces the losses" *
          doctest::test_suite("full")) {
  if (!has_train_binary() || !has_mpirun()) return;
  auto mpirun = [](const std::string& kill, const std::string& args) {
    return mpirun2(kill.empty() ? "" : "ENGINE_TEST_KILL=" + kill, args);
  };
  const std::string steps = " training.steps=6 training.checkpoint_every=2";
  const fs::path out = fs::path(tiny_run_config("llama").run.output_dir);
  for (const char* name : {"kill-ref", "kill-step", "kill-ckpt"}) fs::remove_all(out / name);
  Result ref = mpirun("", good_config("kill-ref") + steps);
  INFO(ref.output);
  REQUIRE(ref.code == 0);
  const std::map<int, double> want = metric_losses(out / "kill-ref");
  REQUIRE(want.size() == 6);

  // Rank 1 killed after step 5's backward (checkpoints of steps 2 and 4 exist).
  const std::string a = good_config("kill-step") + steps;
  Result k = mpirun("1:5:step", a);
  INFO(k.output);
  CHECK(k.code != 0);
  CHECK(k.code != 124);
  CHECK(fs::exists(out / "kill-step" / "checkpoints" / "step_4" / "metadata.json"));
  Result r = mpirun("", a + " training.resume=auto");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("step_4: step 4") != std::string::npos);
  CHECK(metric_losses(out / "kill-step") == want);

  // Rank 0 killed 4 KiB into writing its file of step 4's checkpoint: step 2's stays usable.
  const std::string b = good_config("kill-ckpt") + steps;
  Result c = mpirun("0:4:checkpoint", b);
  INFO(c.output);
  CHECK(c.code != 0);
  CHECK(fs::exists(out / "kill-ckpt" / "checkpoints" / "step_2" / "metadata.json"));
  CHECK(!fs::exists(out / "kill-ckpt" / "checkpoints" / "step_4"));
  Result d = mpirun("", b + " training.resume=auto");
  INFO(d.output);
  CHECK(d.code == 0);
  CHECK(d.output.find("step_2: step 2") != std::string::npos);
  CHECK(metric_losses(out / "kill-ckpt") == want);
}

TEST_CASE("./train: a full disk (a small tmpfs) during a checkpoint fails the run cleanly; the previous one stays" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  // How big one checkpoint of this run is, from a run on the normal disk.
  const std::string steps = " training.steps=4 training.checkpoint_every=2";
  const fs::path out = fs::path(tiny_run_config("llama").run.output_dir);
  fs::remove_all(out / "disk-probe");
  REQUIRE(run(good_config("disk-probe") + steps).code == 0);
  uintmax_t one = 0;
  for (const auto& e : fs::recursive_directory_iterator(out / "disk-probe" / "checkpoints" / "step_2"))
    if (e.is_regular_file()) one += e.file_size();
  // A tmpfs with room for the run directory and one checkpoint, not two.
  const fs::path mnt = fs::temp_directory_path() / ("engine_full_disk." + std::to_string(::getpid()));
  fs::create_directories(mnt);
  const uintmax_t size = (one * 3 / 2 + 64 * 1024 + 4095) / 4096 * 4096;
  if (std::system(("mount -t tmpfs -o size=" + std::to_string(size) + " tmpfs " + mnt.string() + " 2>/dev/null").c_str()) !=
      0) {
    fs::remove(mnt);
    skip_test("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)");
    return;
  }
  Result r = run(good_config("disk-full") + steps + " run.output_dir=\"" + mnt.string() + "\"");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.output.find("No space left on device") != std::string::npos);
  const fs::path ck = mnt / "disk-full" / "checkpoints";
  CHECK(fs::exists(ck / "step_2" / "metadata.json"));
  CHECK(!fs::exists(ck / "step_4"));
  for (const auto& e : fs::directory_iterator(ck)) CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
  // The previous checkpoint is intact: a resume from it runs to the end on the normal disk.
  Result resume = run(good_config("disk-resume") + steps + " training.resume=\"" + (ck / "step_2").string() + "\"");
  INFO(resume.output);
  CHECK(resume.code == 0);
  CHECK(resume.output.find("resumed from") != std::string::npos);
  if (std::system(("umount " + mnt.string()).c_str()) != 0) MESSAGE("could not unmount " << mnt.string());
  fs::remove_all(mnt);
}
