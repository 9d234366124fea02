// Ranks that disagree are stopped at start (train/agreement.h), every rank with the same message
// naming the first difference: rank 1 with another optimizer.lr; a dataset whose index differs on
// rank 1 (each rank's copy in its own folder); a model.init_from folder holding other files on
// rank 1; a resume where each rank sees another checkpoint (per-rank paths, and "auto" over
// per-rank run folders). Locations spelled differently per rank that hold the same contents agree.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/tools.h"
#include "comm/mpi_comm.h"
#include "core/log.h"
#include "data/dataset_writer.h"
#include "data/token_scan.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {


Config small(const std::vector<std::string>& more = {}) {
  std::vector<std::string> o = {"training.steps=3", "batch.global_batch_size=24", "batch.micro_batch_size=2",
                                "data.sequence_length=16"};
  o.insert(o.end(), more.begin(), more.end());
  return tiny_run_config("llama", o);
}

// The error constructing a trainer over every rank gives ("" when none), checked to be the same
// text on every rank.
std::string start_error(const Config& c) {
  std::string error;
  try {
    Trainer t(c, false, &world());
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::vector<std::string> all = all_gather_strings(world(), error);
  for (const std::string& e : all) CHECK(e == all[0]);
  return error;
}

bool two_ranks_or_more() {
  if (world().size() >= 2) return true;
  skip_test("needs 2 ranks or more");
  return false;
}


}  // namespace

TEST_CASE("ranks that disagree: another optimizer.lr on rank 1 ends every rank, naming the key") {
  if (!two_ranks_or_more()) return;
  // Locations differ per rank (each process writes its own copy of the dataset): same contents, agree.
  const Config same = small();
  const std::vector<std::string> paths = all_gather_strings(world(), same.data.train[0].path);
  CHECK(paths[0] != paths[1]);
  CHECK(start_error(same).empty());

  const Config other = small({world().rank() == 1 ? "optimizer.lr=0.02" : "optimizer.lr=0.01"});
  const std::string error = start_error(other);
  INFO(error);
  CHECK(error.find("the ranks disagree at optimizer.lr: 0.02 (<command line>) on rank 1, "
                   "0.01 (<command line>) on rank 0") != std::string::npos);
  // A default against a set value, in another section.
  const std::string seed = start_error(world().rank() == 1 ? small({"run.seed=9"}) : small());
  INFO(seed);
  CHECK(seed.find("the ranks disagree at run.seed: 9 (<command line>) on rank 1, 5 (tiny-run.toml:") !=
        std::string::npos);
}

TEST_CASE("ranks that disagree: a dataset whose index differs on rank 1 ends every rank, naming the files") {
  if (!two_ranks_or_more()) return;
  QuietLogs quiet;
  SharedDir d("agree", "data");
  // Each rank's copy in its own folder, as a .bin/.idx prefix and as a .fast_llm_dataset.
  for (const std::string name : {"docs", "docs.fast_llm_dataset"}) {
    CAPTURE(name);
    const std::string path = d.rank_dir() + "/" + name;
    std::vector<std::vector<int32_t>> docs;
    for (int i = 0; i < 40; ++i) docs.push_back({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, i % 30});
    Config c = small();
    c.data.train[0].path = path;
    write_token_dataset(path, docs, 37);
    CHECK(start_error(c).empty());  // the same documents: agree
    if (world().rank() == 1) docs[3].push_back(4);  // one document one token longer: another index
    write_token_dataset(path, docs, 37);
    const std::string error = start_error(c);
    INFO(error);
    const std::string file = name == "docs" ? "docs.idx" : name;
    CHECK(error.find("the ranks disagree at data.train[0] (index): " + d.path + "/rank1/" + file + " (") !=
          std::string::npos);
    CHECK(error.find(") on rank 1, " + d.path + "/rank0/" + file + " (") != std::string::npos);
  }
}

TEST_CASE("ranks that disagree: a model.init_from folder with other files on rank 1") {
  if (!two_ranks_or_more()) return;
  QuietLogs quiet;
  SharedDir d("agree", "init");
  const std::string dir = d.rank_dir() + "/hf";
  hf::ExportOptions o;
  if (world().rank() == 1) o.dtype = "BF16";  // the same structure, other weights and config.json
  checkpoint::export_hf_from_config(small(), dir, o);
  const std::string error = start_error(small({"model.init_from=\"" + dir + "\""}));
  INFO(error);
  CHECK(error.find("the ranks disagree at model.init_from (config.json): " + d.path + "/rank1/hf/config.json (") !=
        std::string::npos);
}

TEST_CASE("ranks that disagree: a resume where each rank sees another checkpoint") {
  if (!two_ranks_or_more()) return;
  QuietLogs quiet;
  SharedDir d("agree", "resume");
  // Each rank's own one-rank run (rank 1 with another seed) saves step 1 in its own folder.
  const std::string mine = d.rank_dir();
  SelfComm self;
  {
    Trainer t(small({"run.output_dir=\"" + mine + "\"", "run.seed=" + std::to_string(5 + world().rank())}), false,
              &self);
    t.train_step();
    t.save_checkpoint();
  }
  const std::string step = checkpoint::checkpoint_root(small({"run.output_dir=\"" + mine + "\""})) + "/step_1";
  const std::string want = "the ranks see different checkpoints: " + d.path + "/rank1/";
  {  // training.resume: each rank's path
    const std::string error = start_error(small({"training.resume=\"" + step + "\""}));
    INFO(error);
    CHECK(error.find(want) != std::string::npos);
    CHECK(error.find(" on rank 1 (step 1, xxh64 ") != std::string::npos);
    CHECK(error.find(d.path + "/rank0/") != std::string::npos);
  }
  {  // "auto" in per-rank run folders: rank 0's listing picks step 1, which differs on rank 1
    const std::string error = start_error(small({"run.output_dir=\"" + mine + "\"", "training.resume=\"auto\""}));
    INFO(error);
    CHECK(error.find(want) != std::string::npos);
  }
  {  // the same checkpoint under another path on each rank: agree
    const std::string copy = d.rank_dir() + "/copy";
    const std::string from =
        checkpoint::checkpoint_root(small({"run.output_dir=\"" + d.path + "/rank0\""})) + "/step_1";
    fs::copy(from, copy, fs::copy_options::recursive);
    CHECK(start_error(small({"training.resume=\"" + copy + "\""})).empty());
  }
}

TEST_CASE("token ids: the ranks of a run scan once (rank 0), and every rank checks against that range") {
  if (!two_ranks_or_more()) return;
  QuietLogs quiet;
  SharedDir d("agree", "scan");
  const std::string path = d.path + "/docs";
  std::vector<std::vector<int32_t>> docs;
  for (int i = 0; i < 40; ++i) docs.push_back({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, i % 30});
  if (world().rank() == 0) write_token_dataset(path, docs, 37);
  world().barrier();
  Config c = small();
  c.data.train[0].path = path;
  // Freshly written files are not cached (token_scan.h): without the sharing every rank would scan.
  const int64_t before = token_scans_run();
  CHECK(start_error(c).empty());
  const int64_t scans = token_scans_run() - before;
  if (world().rank() == 0) CHECK(scans >= 1);  // (the training and the validation split's)
  else CHECK(scans == 0);
  // An id outside the vocabulary is found by rank 0's scan and reported by every rank with its place.
  docs[5][2] = 36;
  world().barrier();
  if (world().rank() == 0) write_token_dataset(path, docs, 37);
  world().barrier();
  c.model.vocab_size = 32;
  const std::string error = start_error(c);
  INFO(error);
  CHECK(error.find("document 5, token offset 2") != std::string::npos);
  CHECK(error.find("token id 36 >= model.vocab_size (32)") != std::string::npos);
}

TEST_CASE("ranks that disagree: a sharded dataset whose manifest differs on rank 1 ends every rank, naming it") {
  if (!two_ranks_or_more()) return;
  QuietLogs quiet;
  SharedDir d("agree", "manifest");
  const std::string dir = d.rank_dir();
  std::vector<std::vector<int32_t>> docs;
  for (int i = 0; i < 40; ++i) docs.push_back({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, i % 30});
  write_token_dataset(dir + "/s-0", docs, 37);
  auto manifest = [&](const std::string& input) {
    int64_t tokens = 0;
    for (const auto& x : docs) tokens += static_cast<int64_t>(x.size());
    const nlohmann::json m = {
        {"format", "engine-token-manifest"}, {"version", 1}, {"complete", true}, {"dtype", "uint16"},
        {"vocab_size", 37}, {"loss_masking_spans", false}, {"tokenizer", {{"kind", "byte-level"}}},
        {"options", nlohmann::json::object()}, {"inputs", {input}}, {"documents", docs.size()}, {"tokens", tokens},
        {"shards", {{{"prefix", "s-0"}, {"documents", docs.size()}, {"tokens", tokens},
                     {"bin_bytes", fs::file_size(dir + "/s-0.bin")}, {"idx_bytes", fs::file_size(dir + "/s-0.idx")}}}}};
    std::ofstream(dir + "/s.manifest.json") << m.dump(1);
  };
  Config c = small();
  c.data.train[0].path = dir + "/s.manifest.json";
  manifest("corpus.jsonl");
  CHECK(start_error(c).empty());  // each rank's own copy, the same manifest: agree
  manifest(world().rank() == 1 ? "other.jsonl" : "corpus.jsonl");
  const std::string error = start_error(c);
  INFO(error);
  CHECK(error.find("the ranks disagree at data.train[0] (manifest): " + d.path + "/rank1/s.manifest.json (") !=
        std::string::npos);
}
