// Writes that fail (a full disk, the file size limit, a stream that takes no writes) end the run
// or the tool with an error naming the file and the system's reason and a non-zero exit, never a
// silent loss: metrics.jsonl, debug_stats.jsonl, the effective config.toml, the log on stdout,
// --dump-logits, --export-hf and the dataset writers. A damaged metrics.jsonl is reported line by
// line on resume before it is repaired. Without a full disk: the size limit (ulimit -f, EFBIG),
// /dev/full (ENOSPC) and the injected write failure of checkpoint/file_io.h.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "checkpoint/hf.h"
#include "checkpoint/tools.h"
#include "data/dataset_writer.h"
#include "models/model.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/process.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/metrics_file.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;
namespace ck = engine::checkpoint;

namespace {

// A config file over the learnable dataset whose run `name` starts afresh in a scratch folder.
std::string write_config(const std::string& name, std::vector<std::string> overrides) {
  const fs::path dir = fs::path(learnable_dataset()).parent_path() / "writes";
  fs::create_directories(dir);
  overrides.push_back("run.name=" + name);
  overrides.push_back("run.output_dir=\"" + (dir / "runs").string() + "\"");
  fs::remove_all(dir / "runs" / name);
  const std::string path = (dir / (name + ".toml")).string();
  write_text(path, config_to_toml(tiny_run_config("llama", overrides)));
  return path;
}

std::string run_dir(const std::string& name) {
  return (fs::path(learnable_dataset()).parent_path() / "writes" / "runs" / name).string();
}

// ./train with `args`, its files limited to `kib` KiB (bash's ulimit -f: writes past it fail
// with EFBIG); 0: no limit.
ProcessResult train(const std::string& args, int kib = 0) {
  const std::string cmd = train_binary() + " " + args;
  return run_command(kib > 0 ? "bash -c 'ulimit -f " + std::to_string(kib) + " && exec " + cmd + "'" : cmd);
}

// step -> loss of the training lines of a metrics.jsonl (every line must be a whole JSON object).
std::map<int, double> losses(const std::string& path) {
  std::map<int, double> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

}  // namespace

TEST_CASE("metrics.jsonl on resume: damaged lines reported by number and reason, later steps dropped, rewritten") {
  QuietLogs quiet;
  const std::string path = scratch_dir("metrics-trim") + "/metrics.jsonl";
  const std::string good = "{\"loss\":2.5,\"step\":1}\n{\"loss\":2.4,\"step\":2}\n{\"step\":2,\"valid_loss\":2.6}\n"
                           "{\"loss\":2.3,\"step\":3}\n";
  write_text(path, good + "{\"loss\":2.2,\"step\":4}\nnot json\n[1,2]\n{\"step\":1.5}\n\n{\"loss\":2.1,\"st");
  const MetricsTrim r = trim_metrics_for_resume(path, 3);
  CHECK(r.kept == 4);
  CHECK(r.later == 1);
  CHECK(r.last_step == 3);
  CHECK(r.rewritten);
  REQUIRE(r.damaged.size() == 5);
  check_mentions(r.damaged[0], {"line 6 ", "not JSON"});
  check_mentions(r.damaged[1], {"line 7 ", "integer \"step\""});
  check_mentions(r.damaged[2], {"line 8 ", "integer \"step\""});
  check_mentions(r.damaged[3], {"line 9 ", "empty"});
  check_mentions(r.damaged[4], {"line 10 ", "cut short", "no end of line"});
  CHECK(read_text(path) == good);
  // A whole file is left alone; a missing end of line on a whole last line is added.
  const MetricsTrim again = trim_metrics_for_resume(path, 3);
  CHECK(!again.rewritten);
  CHECK(again.damaged.empty());
  write_text(path, good + "{\"loss\":2.2,\"step\":4}");
  CHECK(trim_metrics_for_resume(path, 4).damaged.empty());
  CHECK(read_text(path) == good + "{\"loss\":2.2,\"step\":4}\n");
  // Lines missing before the checkpoint's step are reported (last_step), the file kept.
  CHECK(trim_metrics_for_resume(path, 6).last_step == 4);
  CHECK(trim_metrics_for_resume(scratch_dir("metrics-absent") + "/metrics.jsonl", 3).kept == 0);
}

TEST_CASE("./train: a write that fails ends the run non-zero with an error naming the file and the reason") {
  if (!has_train_binary()) return;
  // metrics.jsonl past the size limit: before, the run printed `done` and exited 0 with a torn line.
  const std::string cfg = write_config("writes-metrics", {"training.steps=30"});
  ProcessResult m = train(cfg, 4);
  INFO(m.output);
  CHECK(m.code != 0);
  check_mentions(m.output, {"error: write " + run_dir("writes-metrics") + "/metrics.jsonl", "File too large"});
  CHECK(m.output.find("done:") == std::string::npos);
  // The effective config (~2 KiB).
  ProcessResult c = train(write_config("writes-config", {}), 1);
  INFO(c.output);
  CHECK(c.code != 0);
  check_mentions(c.output, {run_dir("writes-config") + "/config.toml", "File too large"});
  CHECK(!fs::exists(run_dir("writes-config") + "/config.toml"));
  // The per-layer statistics of run.debug_level = 2.
  ProcessResult s = train(write_config("writes-stats", {"run.debug_level=2", "run.debug_steps=\"1-30\"", "training.steps=30"}), 4);
  INFO(s.output);
  CHECK(s.code != 0);
  check_mentions(s.output, {run_dir("writes-stats") + "/debug_stats.jsonl", "File too large"});
  // The log, on a stdout that takes no writes; and --print-config.
  const std::string quick = write_config("writes-log", {"training.steps=3"});
  ProcessResult l = run_command("{ " + train_binary() + " " + quick + " 2>&1 >/dev/full; }");
  INFO(l.output);
  CHECK(l.code != 0);
  check_mentions(l.output, {"cannot write the log to stdout (/dev/full)", "No space left on device"});
  ProcessResult p = run_command("{ " + train_binary() + " " + quick + " --print-config 2>&1 >/dev/full; }");
  INFO(p.output);
  CHECK(p.code != 0);
  check_mentions(p.output, {"stdout (/dev/full)", "No space left on device"});
}

TEST_CASE("./train: metrics.jsonl cut mid-line with garbage after it: the resume names the lines and why, then "
          "repairs it" * doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  const std::vector<std::string> o = {"training.steps=8", "training.checkpoint_every=4", "optimizer.warmup_steps=2",
                                      "optimizer.decay_steps=4", "data.sequence_length=12"};
  const std::string whole = write_config("writes-whole", o);
  REQUIRE(train(whole).code == 0);
  const std::string cfg = write_config("writes-torn", o);
  REQUIRE(train(cfg + " training.steps=6").code == 0);  // checkpoints at steps 4 and 6
  // A crash in the middle of line 5, then junk: lines 5 (cut), 6 (not JSON).
  const std::string path = run_dir("writes-torn") + "/metrics.jsonl";
  const std::string text = read_text(path);
  size_t cut = 0;
  for (int i = 0; i < 4; ++i) cut = text.find('\n', cut) + 1;
  write_text(path, text.substr(0, cut + 20) + "\n\x01garbage\n");
  fs::remove_all(run_dir("writes-torn") + "/checkpoints/step_6");
  ProcessResult r = train(cfg + " training.resume=auto");
  INFO(r.output);
  REQUIRE(r.code == 0);
  check_mentions(r.output, {"resumed from", path, "2 damaged line(s)", "line 5 (byte " + std::to_string(cut) + "): not JSON",
                            "line 6 ", "rewritten"});
  // Repaired: whole lines only, every step once, the losses of the run that never stopped.
  const auto want = losses(run_dir("writes-whole") + "/metrics.jsonl"), got = losses(path);
  REQUIRE(want.size() == 8);
  CHECK(got == want);
}

TEST_CASE("mpirun ./train: a failed metrics write on rank 0 ends both ranks with the message" *
          doctest::test_suite("full")) {
  if (!has_train_binary()) return;
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    skip_test("no mpirun");
    return;
  }
  // config.toml (~2 KiB) is written; metrics.jsonl fails a few lines later.
  const std::string cfg = write_config("writes-mpi", {"training.steps=30"});
  ProcessResult r = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
      "ENGINE_TEST_FULL_DISK=0:3000 timeout 120 mpirun -n 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "
      "-x ENGINE_TEST_FULL_DISK " + train_binary() + " " + cfg);
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.code != 124);  // no hang
  check_mentions(r.output, {"rank 0", run_dir("writes-mpi") + "/metrics.jsonl", "No space left on device"});
}

TEST_CASE("--dump-logits and --export-hf: a failed write names the file and leaves the previous output as it was") {
  QuietLogs quiet;
  const std::string dir = scratch_dir("writes-tools");
  Config c = tiny_run_config("llama", {"run.name=writes-tools", "run.output_dir=\"" + dir + "\""});
  const std::string tokens = dir + "/tokens.txt", out = dir + "/logits.safetensors";
  write_text(tokens, "1 2 3 4 5\n6 7\n");
  write_text(out, "the previous dump");
  for (int64_t after : {int64_t{0}, int64_t{200}}) {
    CAPTURE(after);
    ck::inject_write_failure(after);
    const std::string error = error_of([&] { ck::dump_logits(c, Device::CPU, tokens, out); });
    ck::inject_write_failure(-1);
    check_mentions(error, {out + ".tmp-", "No space left on device"});
    CHECK(read_text(out) == "the previous dump");
  }
  // Export: into a folder that holds an earlier export.
  const std::string hf = dir + "/hf";
  ck::export_hf_from_config(c, hf, {});
  const std::string config_json = read_text(hf + "/config.json");
  ck::inject_write_failure(3000);
  const std::string error = error_of([&] { ck::export_hf_from_config(c, hf, {}); });
  ck::inject_write_failure(-1);
  check_mentions(error, {hf + ".tmp-", "No space left on device"});
  CHECK(read_text(hf + "/config.json") == config_json);
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().string().find(".tmp-") == std::string::npos);
}

TEST_CASE("dataset writers: a write that fails names the file; the previous dataset stays, no temporary is left") {
  const std::string dir = scratch_dir("writes-dataset");
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {4, 5}};
  for (const std::string& path : {dir + "/ds", dir + "/ds.fast_llm_dataset"}) {
    CAPTURE(path);
    write_token_dataset(path, docs, 37);
    const bool memmap = path.find("fast_llm") == std::string::npos;
    const std::string file = memmap ? path + ".bin" : path;
    const std::string before = read_text(file);
    // The writer's temporary name leads to /dev/full: every write fails with ENOSPC.
    const std::string tmp = file + ".tmp." + std::to_string(::getpid());
    fs::create_symlink("/dev/full", tmp);
    check_mentions(error_of([&] { write_token_dataset(path, {{9, 9, 9}}, 37); }), {tmp, "No space left on device"});
    CHECK(read_text(file) == before);
    CHECK(!fs::exists(fs::symlink_status(tmp)));
  }
}
