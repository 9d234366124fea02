// Distributed checkpoints in one process: exact resume (bitwise losses), the saved state, atomic
// saves under injected write failures, the corruption matrix (each case names the file, and
// "auto" falls back to the previous checkpoint), retention, and a changed buffer capacity.
// The multi-rank layouts are in tests/dist/test_checkpoint.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_io.h"
#include "checkpoint/tools.h"
#include "comm/mpi_comm.h"
#include "models/model.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;
namespace ck = engine::checkpoint;

namespace {

std::string runs_dir() { return (fs::path(learnable_dataset()).parent_path() / "ckpt-runs").string(); }

// A tiny run whose checkpoints go to <runs_dir>/<name>/checkpoints (emptied first when fresh).
Config run_config(const std::string& name, std::vector<std::string> extra = {}, const std::string& family = "llama",
                  bool fresh = false) {
  if (fresh) fs::remove_all(fs::path(runs_dir()) / name);
  std::vector<std::string> o = {"run.name=" + name, "run.output_dir=\"" + runs_dir() + "\"", "training.steps=6",
                                "data.sequence_length=12", "optimizer.warmup_steps=2"};
  o.insert(o.end(), extra.begin(), extra.end());
  return tiny_run_config(family, o);
}

std::vector<double> losses(Trainer& t, int steps) {
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) out.push_back(t.train_step().loss);
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.dtype == b.dtype && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Unique names per test run: the suites may share the temp folder's parent.
std::string step_path(const Config& c, int step) { return ck::checkpoint_root(c) + "/step_" + std::to_string(step); }

}  // namespace

TEST_CASE("checkpoint: stop after step k, resume = auto: the losses equal the uninterrupted run's, bitwise") {
  // (mixtral and hybrid with router jitter: its noise is a function of the data, not of the process)
  const std::vector<std::string> moe = {"model.num_experts=4", "model.moe_jitter=0.2", "model.moe_aux_loss_coef=0.01"};
  const std::vector<std::string> hybrid = {"model.hybrid_layout=\"MEA\"", "model.num_layers=3", "model.num_experts=3",
                                           "model.moe_jitter=0.1", "model.mamba_d_state=4"};
  for (const auto& [family, extra] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"gpt2", {}}, {"llama", {}}, {"qwen2", {}}, {"mixtral", moe}, {"hybrid", hybrid},
           {"llama", {"model.num_layers=3", "model.prediction_heads=2"}}}) {  // (multi-token prediction)
    CAPTURE(family);
    Trainer ref(run_config("ref", extra, family), false);
    const std::vector<double> want = losses(ref, 6);

    std::vector<std::string> stop_o = extra;
    stop_o.push_back("training.checkpoint_every=100");
    Config stop_cfg = run_config("resume-" + family, stop_o, family, true);
    {
      Trainer first(stop_cfg, false);
      losses(first, 2);
      Trainer::request_stop();  // as SIGTERM would: stop after the current step, with a checkpoint
      CHECK(first.run() == 0);
      CHECK(first.step() == 3);
      CHECK(fs::exists(step_path(stop_cfg, 3) + "/metadata.json"));
    }
    Config again = stop_cfg;
    again.training.resume = "auto";
    Trainer second(again, false);
    CHECK(second.resumed_from() == step_path(stop_cfg, 3));
    CHECK(second.step() == 3);
    CHECK(second.consumed_samples() == 3 * stop_cfg.batch.global_batch_size);
    const std::vector<double> got = losses(second, 3);
    for (int i = 0; i < 3; ++i) {
      INFO("step " << i + 4 << ": resumed " << got[static_cast<size_t>(i)] << ", uninterrupted " << want[static_cast<size_t>(i + 3)]);
      CHECK(got[static_cast<size_t>(i)] == want[static_cast<size_t>(i + 3)]);
    }
    CHECK(same_bits(second.optimizer().shard_state().master, ref.optimizer().shard_state().master));
    CHECK(same_bits(second.optimizer().shard_state().exp_avg_sq, ref.optimizer().shard_state().exp_avg_sq));
  }
}

TEST_CASE("checkpoint: metadata and shard hold the optimizer's state; loading restores it bitwise") {
  Config c = run_config("state", {}, "gpt2", true);
  Trainer t(c, false);
  losses(t, 3);
  const std::string dir = t.save_checkpoint();
  CHECK(dir == step_path(c, 3));
  CHECK(entries(dir) == std::vector<std::string>{"metadata.json", "rank_0.safetensors"});
  CHECK(entries(ck::checkpoint_root(c)) == std::vector<std::string>{"step_3"});
  const ck::Metadata m = ck::read_metadata(dir);
  CHECK(m.state.step == 3);
  CHECK(m.state.consumed_samples == 3 * c.batch.global_batch_size);
  CHECK(m.layout.data_parallel == 1);
  CHECK(m.layout.pipeline_parallel == 1);
  CHECK(m.layout.capacity == std::vector<int64_t>{t.model().params().capacity()});
  CHECK(m.table_elements == std::vector<int64_t>{t.model().params().table().total_elements()});
  CHECK(m.params.size() == t.model().params().table().entries().size());
  REQUIRE(m.files.size() == 1);
  CHECK(m.files[0].bytes == fs::file_size(dir + "/rank_0.safetensors"));
  CHECK(m.config_toml == config_to_toml(c));

  ck::Reader r(dir);
  const auto st = t.optimizer().shard_state();
  for (const ParamSpec& p : t.model().params().table().entries()) {
    const int64_t n = p.shape.numel();
    std::vector<float> v(static_cast<size_t>(n));
    for (int k = 0; k < 3; ++k) {
      r.read(k, p.name, 0, n, v.data());
      const Tensor src = k == 0 ? st.master : k == 1 ? st.exp_avg : st.exp_avg_sq;
      CHECK(std::memcmp(v.data(), static_cast<const float*>(src.data) + p.offset, static_cast<size_t>(n) * 4) == 0);
    }
  }
  Config again = c;
  again.training.resume = dir;
  Trainer u(again, false);
  const auto su = u.optimizer().shard_state();
  CHECK(same_bits(su.master, st.master));
  CHECK(same_bits(su.exp_avg, st.exp_avg));
  CHECK(same_bits(su.exp_avg_sq, st.exp_avg_sq));
  CHECK(same_bits(u.model().params().weights_flat(), t.model().params().weights_flat()));
}

TEST_CASE("checkpoint: metadata versions 1 and 2 (before pipeline parallelism) still load") {
  Config c = run_config("old-versions", {}, "llama", true);
  Trainer t(c, false);
  losses(t, 2);
  const std::string dir = t.save_checkpoint(), meta = dir + "/metadata.json";
  const std::string v3 = read_text(meta);
  for (int version : {2, 1}) {
    CAPTURE(version);
    // The same checkpoint as the older versions wrote it.
    auto j = nlohmann::ordered_json::parse(v3);
    j.erase("metadata_xxh64");
    j["version"] = version;
    j["layout"].erase("pipeline_parallel");
    if (version == 1) j["layout"].erase("tensor_parallel");
    j["layout"]["capacity"] = j["layout"]["capacity"][0];
    j["table_elements"] = j["table_elements"][0];
    for (auto& p : j["params"]) {
      p.erase("pp_rank");
      if (version == 1) p.erase("split_dim");
    }
    for (auto& s : j["shards"]) {
      s.erase("pp_rank");
      if (version == 1) s.erase("tp_rank");
    }
    std::string body = j.dump(1);
    body.resize(body.size() - 2);  // "\n}"
    body += ",\n";
    write_text(meta, body + " \"metadata_xxh64\": \"" + ck::hex64(ck::xxh64(body.data(), body.size())) + "\"\n}\n");
    const ck::Metadata m = ck::read_metadata(dir);
    CHECK(m.version == version);
    CHECK(m.layout.pipeline_parallel == 1);
    CHECK(m.layout.capacity == std::vector<int64_t>{t.model().params().capacity()});
    CHECK(m.params.front().pp_rank == 0);
    Config again = c;
    again.training.resume = dir;
    Trainer u(again, false);
    CHECK(u.step() == 2);
    CHECK(same_bits(u.optimizer().shard_state().master, t.optimizer().shard_state().master));
    CHECK(same_bits(u.optimizer().shard_state().exp_avg_sq, t.optimizer().shard_state().exp_avg_sq));
  }
}

TEST_CASE("checkpoint: a different buffer capacity (padding) loads by parameter name and offset") {
  Config c = run_config("capacity", {}, "llama", true);
  Trainer t(c, false);
  losses(t, 2);
  const std::string dir = t.save_checkpoint();
  const ParamTable table = model_param_table(c.model);
  SelfComm self;
  for (int64_t extra : {int64_t{640}, int64_t{64 * 7}}) {
    CAPTURE(extra);
    auto model = make_model(c.model, Device::CPU, DType::F32, table.total_elements() + extra);
    model->params().init(c.run.seed + 1);  // other values: the load must replace them
    DataParallel dp(model->params(), self, 1);
    AdamW opt(c.optimizer, dp, c.run.seed + 1);
    const ck::TrainerState s = ck::load(dir, opt);
    CHECK(s.step == 2);
    const auto a = opt.shard_state(), b = t.optimizer().shard_state();
    for (const ParamSpec& p : table.entries()) {
      const size_t bytes = static_cast<size_t>(p.shape.numel()) * 4;
      CHECK(std::memcmp(static_cast<float*>(a.master.data) + p.offset, static_cast<float*>(b.master.data) + p.offset, bytes) == 0);
      CHECK(std::memcmp(static_cast<float*>(a.exp_avg.data) + p.offset, static_cast<float*>(b.exp_avg.data) + p.offset, bytes) == 0);
    }
    double tail = 0;  // the padding stays zero
    for (int64_t i = table.total_elements(); i < a.master.numel(); ++i) tail += std::abs(get(a.master, i));
    CHECK(tail == 0.0);
  }
}

TEST_CASE("checkpoint: an injected write failure (ENOSPC) anywhere keeps the previous checkpoint and leaves nothing auto picks") {
  QuietLogs quiet;
  Config c = run_config("enospc", {}, "llama", true);
  Trainer t(c, false);
  losses(t, 2);
  const std::string good = t.save_checkpoint();
  const uint64_t shard = fs::file_size(good + "/rank_0.safetensors");
  losses(t, 1);
  // Bytes written before the fault: in the shard's header, in its data, in the metadata.
  for (int64_t after : {int64_t{0}, int64_t{100}, static_cast<int64_t>(shard / 2), static_cast<int64_t>(shard + 50)}) {
    CAPTURE(after);
    ck::inject_write_failure(after);
    const std::string error = error_of([&] { t.save_checkpoint(); });
    ck::inject_write_failure(-1);
    check_mentions(error, {"No space left on device", ".tmp-"});
    CHECK(entries(ck::checkpoint_root(c)) == std::vector<std::string>{"step_2"});
    CHECK(error_of([&] { ck::verify(good); }).empty());
    SelfComm self;
    CHECK(ck::resolve_resume("auto", ck::checkpoint_root(c), self) == good);
  }
  // The run goes on and the next save succeeds.
  losses(t, 1);
  CHECK(t.save_checkpoint() == step_path(c, 4));
  CHECK(entries(ck::checkpoint_root(c)) == std::vector<std::string>{"step_2", "step_4"});
}

TEST_CASE("checkpoint: a folder that cannot be created fails the save naming it; training goes on") {
  Config c = run_config("blocked", {}, "llama", true);
  fs::create_directories(fs::path(runs_dir()) / "blocked");
  write_text(ck::checkpoint_root(c), "a file where the checkpoints folder should be");
  Trainer t(c, false);
  losses(t, 1);
  check_mentions(error_of([&] { t.save_checkpoint(); }), {ck::checkpoint_root(c)});
  CHECK(std::isfinite(t.train_step().loss));
}

TEST_CASE("checkpoint: corruption matrix: each case names the file, auto falls back to the previous checkpoint") {
  QuietLogs quiet;
  Config c = run_config("corrupt", {"training.keep_checkpoints=0"}, "llama", true);
  const std::string pristine = scratch_dir("corrupt-pristine");
  {
    Trainer t(c, false);
    losses(t, 2);
    t.save_checkpoint();
    losses(t, 2);
    t.save_checkpoint();
    fs::copy(ck::checkpoint_root(c), pristine, fs::copy_options::recursive);
  }
  const std::string root = ck::checkpoint_root(c), dir = step_path(c, 4), shard = dir + "/rank_0.safetensors",
                    meta = dir + "/metadata.json";
  // metadata.json with content changed and its checksum line recomputed: only the JSON is wrong.
  auto rewrite_meta = [&](const std::function<std::string(std::string)>& edit) {
    std::string text = read_text(meta);
    const size_t at = text.rfind(" \"metadata_xxh64\"");
    std::string body = edit(text.substr(0, at));
    write_text(meta, body + " \"metadata_xxh64\": \"" + ck::hex64(ck::xxh64(body.data(), body.size())) + "\"\n}\n");
  };
  struct Case {
    const char* name;
    std::function<void()> damage;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"truncated shard", [&] { truncate_file(shard, fs::file_size(shard) / 2); }, {shard, "size mismatch", "truncated"}},
      {"shard grown", [&] { write_text(shard, read_text(shard) + "xx"); }, {shard, "size mismatch"}},
      {"byte flipped in the shard's data", [&] { flip_byte(shard, fs::file_size(shard) - 7); }, {shard, "checksum mismatch"}},
      {"byte flipped in the shard's header", [&] { flip_byte(shard, 20); }, {shard, "checksum mismatch"}},
      {"shard deleted", [&] { fs::remove(shard); }, {shard, "missing"}},
      {"metadata deleted", [&] { fs::remove(meta); }, {meta, "missing"}},
      {"byte flipped in the metadata", [&] { flip_byte(meta, 30); }, {meta, "checksum mismatch"}},
      {"metadata truncated", [&] { truncate_file(meta, fs::file_size(meta) / 2); }, {meta, "metadata_xxh64"}},
      {"metadata is not JSON", [&] { rewrite_meta([](std::string b) { return b.substr(0, 40) + ",\n"; }); }, {meta, "not valid JSON"}},
      {"metadata field missing",
       [&] {
         rewrite_meta([](std::string b) {
           const size_t at = b.find(" \"step\": 4,\n");
           return b.erase(at, std::string(" \"step\": 4,\n").size());
         });
       },
       {meta, "field 'step'", "missing"}},
      {"metadata lists a shard range that does not tile the buffers",
       [&] {
         rewrite_meta([](std::string b) {
           const size_t at = b.find("\"begin\": 0");
           return b.replace(at, 10, "\"begin\": 64");
         });
       },
       {meta, "shards"}},
  };
  // (A loop, not SUBCASEs: doctest would redo the training above for each.)
  for (const Case& k : cases) {
    CAPTURE(k.name);
    fs::remove_all(root);
    fs::copy(pristine, root, fs::copy_options::recursive);
    k.damage();
    check_mentions(error_of([&] { ck::verify(dir); }), k.expect);
    SelfComm self;
    CHECK(ck::resolve_resume("auto", root, self) == step_path(c, 2));
    // An explicit path to the broken checkpoint is an error, not a fallback.
    check_mentions(error_of([&] { ck::resolve_resume(dir, root, self); }), k.expect);
  }
  // A run with resume = auto continues from the previous checkpoint (the last case's damage).
  Config automatic = c;
  automatic.training.resume = "auto";
  {
    Trainer u(automatic, false);
    CHECK(u.step() == 2);
  }
  // Every checkpoint broken: auto is an error, not a silent fresh start.
  fs::remove_all(root);
  fs::copy(pristine, root, fs::copy_options::recursive);
  fs::remove(dir + "/metadata.json");
  fs::remove(step_path(c, 2) + "/rank_0.safetensors");
  SelfComm self;
  check_mentions(error_of([&] { ck::resolve_resume("auto", root, self); }), {"none of the 2 checkpoints", root});
  check_mentions(error_of([&] { Trainer u(automatic, false); }), {"none of the 2 checkpoints"});
}

TEST_CASE("checkpoint: retention keeps the newest keep_checkpoints (0: all), re-saving a step replaces it") {
  QuietLogs quiet;
  Config c = run_config("keep", {"training.keep_checkpoints=2"}, "llama", true);
  Trainer t(c, false);
  fs::create_directories(ck::checkpoint_root(c) + "/step_9.tmp-999999");  // left by a save that died
  for (int s = 0; s < 4; ++s) {
    losses(t, 1);
    t.save_checkpoint();
  }
  CHECK(entries(ck::checkpoint_root(c)) == std::vector<std::string>{"step_3", "step_4"});
  const uint64_t before = fs::file_size(step_path(c, 4) + "/metadata.json");
  t.save_checkpoint();  // step 4 again
  CHECK(entries(ck::checkpoint_root(c)) == std::vector<std::string>{"step_3", "step_4"});
  CHECK(fs::file_size(step_path(c, 4) + "/metadata.json") == before);
  CHECK(error_of([&] { ck::verify(step_path(c, 4)); }).empty());

  Config all = run_config("keep-all", {"training.keep_checkpoints=0"}, "llama", true);
  Trainer u(all, false);
  for (int s = 0; s < 4; ++s) {
    losses(u, 1);
    u.save_checkpoint();
  }
  CHECK(entries(ck::checkpoint_root(all)).size() == 4);
  // A save that died between moving step_2 aside and renaming its replacement into place left
  // step_2.old-<pid>, the only copy: the next save restores it. A set-aside copy whose step_3
  // exists is removed.
  const std::string root = ck::checkpoint_root(all);
  fs::rename(root + "/step_2", root + "/step_2.old-999999");
  fs::create_directories(root + "/step_3.old-999998");
  u.save_checkpoint();
  CHECK(entries(root) == std::vector<std::string>{"step_1", "step_2", "step_3", "step_4"});
  CHECK(error_of([&] { ck::verify(root + "/step_2"); }).empty());
}

TEST_CASE("checkpoint: resume errors name the problem") {
  QuietLogs quiet;
  Config c = run_config("mismatch", {}, "llama", true);
  {
    Trainer t(c, false);
    losses(t, 1);
    t.save_checkpoint();
  }
  SUBCASE("another model") {
    Config other = run_config("mismatch", {"model.ffn_hidden_size=44", "training.resume=auto"});
    check_mentions(error_of([&] { Trainer u(other, false); }),
                   {"do not match the model", "layers.0.mlp.w_gate", "(44, 24)", "(40, 24)"});
  }
  SUBCASE("a path that is no checkpoint") {
    Config other = run_config("mismatch", {"training.resume=\"" + runs_dir() + "/nowhere\""});
    check_mentions(error_of([&] { Trainer u(other, false); }), {"training.resume", "nowhere"});
  }
  SUBCASE("a run folder resumes from its newest checkpoint") {
    Config other = run_config("mismatch-2", {"training.resume=\"" + runs_dir() + "/mismatch\""}, "llama", true);
    Trainer u(other, false);
    CHECK(u.step() == 1);
  }
}

TEST_CASE("GPU: a checkpoint restores the device state exactly; the resumed run follows the uninterrupted one" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  QuietLogs quiet;
  Trainer ref(run_config("gpu-ref", {"run.device=\"cuda\""}), false);
  const std::vector<double> want = losses(ref, 6);
  Config c = run_config("gpu-resume", {"run.device=\"cuda\""}, "llama", true);
  Trainer first(c, false);
  losses(first, 3);
  const std::string dir = first.save_checkpoint();
  Config again = c;
  again.training.resume = "auto";
  Trainer second(again, false);
  for (int k = 0; k < 3; ++k) {  // the loaded device state equals the saved one, bit for bit
    const Tensor a = k == 0 ? first.optimizer().shard_state().master
                     : k == 1 ? first.optimizer().shard_state().exp_avg : first.optimizer().shard_state().exp_avg_sq;
    const Tensor b = k == 0 ? second.optimizer().shard_state().master
                     : k == 1 ? second.optimizer().shard_state().exp_avg : second.optimizer().shard_state().exp_avg_sq;
    Owned ha = to_host(a, DType::F32), hb = to_host(b, DType::F32);
    CHECK(same_bits(ha, hb));
  }
  Owned wa = to_host(first.model().params().weights_flat(), DType::F32);
  Owned wb = to_host(second.model().params().weights_flat(), DType::F32);
  CHECK(same_bits(wa, wb));  // bf16 weights: the same cast of the same master
  // Flash attention's dQ uses atomics: the continuation matches to bf16 tolerance, not bitwise.
  const std::vector<double> got = losses(second, 3);
  for (int i = 0; i < 3; ++i) CHECK(got[static_cast<size_t>(i)] == doctest::Approx(want[static_cast<size_t>(i + 3)]).epsilon(2e-2));
}
