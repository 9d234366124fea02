// Checkpoints across layouts under mpirun (2, 3 and 4 ranks): a checkpoint saved by the data-
// parallel run over every rank with ZeRO 1 resumes on one rank and on every rank with ZeRO 3,
// a one-rank checkpoint resumes on every rank with ZeRO 3, and the same layout resumes bitwise.
// Each continues like the uninterrupted single-rank run (to f32 rounding: the reduction order
// differs between layouts). Also: one rank's corrupt file is reported identically on every
// rank, and one rank's failed write fails the save everywhere without touching the previous one.
// Tensor- and pipeline-parallel checkpoints re-shard the same way (tp2 <-> tp1 / tp4; pp2 with
// two stages per rank, pp3 on 3 ranks, dp2 x pp2 on 4 <-> one rank; pp2 x tp2 -> pp4 and -> one
// rank), and --export-hf from a pipeline-parallel checkpoint equals the one-rank export.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tools.h"
#include "comm/mpi_comm.h"
#include "comm/nccl_comm.h"
#include "core/log.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;
namespace ck = engine::checkpoint;

namespace {



// Global batch 24 splits over 1-4 ranks; micro-batches of 2.
Config config(const SharedDir& d, const std::string& name, int zero, const std::string& resume = "none") {
  return tiny_run_config("llama", {"batch.global_batch_size=24", "batch.micro_batch_size=2", "training.steps=6",
                                   "data.sequence_length=16", "distributed.zero_stage=" + std::to_string(zero),
                                   "run.output_dir=\"" + d.path + "\"", "run.name=" + name,
                                   "training.resume=\"" + resume + "\"", "distributed.reduce_bucket_mb=0.01"});
}

std::vector<double> losses(Trainer& t, int steps) {
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) out.push_back(t.train_step().loss);
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, size_t from, const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << " step " << from + i + 1 << ": " << got[i] << " vs " << want[from + i]);
    CHECK(got[i] == doctest::Approx(want[from + i]).epsilon(1e-5));
  }
}

void check_weights(Trainer& a, Trainer& b, double tol) {
  const int64_t n = a.model().params().table().total_elements();
  Owned wa = to_host(a.optimizer().gather_master(), DType::F64);
  Owned wb = to_host(b.optimizer().gather_master(), DType::F64);
  CHECK_CLOSE(wb->slice(0, n), wa->slice(0, n), tol);
}

}  // namespace

TEST_CASE("checkpoint across layouts: dp=all ZeRO 1 -> 1 rank, -> all ranks ZeRO 3; 1 rank -> all ranks ZeRO 3") {
  QuietLogs quiet;
  SharedDir d("ckpt", "layouts");
  SelfComm self;
  Trainer ref(config(d, "ref", 0), false, &self);
  const std::vector<double> want = losses(ref, 6);

  Trainer a(config(d, "dp-z1", 1), false, &world());
  std::vector<double> la = losses(a, 3);
  const std::string saved = a.save_checkpoint();
  const ck::Metadata m = ck::read_metadata(saved);
  CHECK(m.layout.data_parallel == world().size());
  CHECK(m.layout.zero_stage == 1);
  CHECK(static_cast<int>(m.shards.size()) == world().size());
  for (double l : losses(a, 3)) la.push_back(l);
  check_close(la, want, 0, "dp ZeRO 1");

  {  // the same layout: bitwise
    Trainer b(config(d, "dp-z1-again", 1, saved), false, &world());
    const std::vector<double> lb = losses(b, 3);
    for (int i = 0; i < 3; ++i) CHECK(lb[static_cast<size_t>(i)] == la[static_cast<size_t>(i + 3)]);
    check_weights(a, b, 0.0);
  }
  {  // one rank
    Trainer s(config(d, "one", 0, saved), false, &self);
    check_close(losses(s, 3), want, 3, "one rank from dp ZeRO 1");
    check_weights(ref, s, 1e-5);
  }
  {  // all ranks, ZeRO 3
    Trainer z(config(d, "dp-z3", 3, saved), false, &world());
    CHECK(z.step() == 3);
    check_close(losses(z, 3), want, 3, "dp ZeRO 3 from dp ZeRO 1");
    check_weights(ref, z, 1e-5);
  }
  {  // the reverse: one rank's checkpoint on all ranks, ZeRO 3 and ZeRO 2
    // Every rank runs its own one-rank trainer into its own folder; rank 0's is loaded.
    Trainer s(config(d, "single-" + std::to_string(world().rank()), 0), false, &self);
    losses(s, 3);
    s.save_checkpoint();
    world().barrier();
    const std::string dir0 = ck::checkpoint_root(config(d, "single-0", 0)) + "/step_3";
    for (int zero : {3, 2}) {
      CAPTURE(zero);
      Trainer z(config(d, "from-one-z" + std::to_string(zero), zero, dir0), false, &world());
      check_close(losses(z, 3), want, 3, "dp from one rank");
      check_weights(ref, z, 1e-5);
    }
  }
}

TEST_CASE("checkpoint across world sizes: 2 ranks ZeRO 1 -> all ranks ZeRO 3, and all ranks ZeRO 3 -> 2 ranks ZeRO 1") {
  QuietLogs quiet;
  SharedDir d("ckpt", "sizes");
  SelfComm self;
  Trainer ref(config(d, "ref", 0), false, &self);
  const std::vector<double> want = losses(ref, 6);
  const int rank = world().rank();
  // Ranks 0 and 1 form a data-parallel group of two (with 2 ranks in all it is the world).
  std::unique_ptr<Comm> pair = world().split(rank < 2 ? 0 : 1, rank);
  const std::string from_pair = ck::checkpoint_root(config(d, "pair", 1)) + "/step_3";
  if (rank < 2) {
    Trainer p(config(d, "pair", 1), false, pair.get());
    check_close(losses(p, 3), want, 0, "2 ranks ZeRO 1");
    p.save_checkpoint();
  }
  world().barrier();
  {
    Trainer all(config(d, "all-z3", 3, from_pair), false, &world());
    CHECK(ck::read_metadata(from_pair).layout.data_parallel == 2);
    check_close(losses(all, 3), want, 3, "all ranks ZeRO 3 from 2 ranks ZeRO 1");
    check_weights(ref, all, 1e-5);
  }
  // The reverse: every rank saves with ZeRO 3 after 3 steps; the pair resumes with ZeRO 1.
  Trainer all(config(d, "all", 3), false, &world());
  losses(all, 3);
  const std::string from_all = all.save_checkpoint();
  CHECK(static_cast<int>(ck::read_metadata(from_all).shards.size()) == world().size());
  if (rank < 2) {
    Trainer p(config(d, "pair-again", 1, from_all), false, pair.get());
    check_close(losses(p, 3), want, 3, "2 ranks ZeRO 1 from all ranks ZeRO 3");
  }
  world().barrier();
}

TEST_CASE("checkpoint under mpirun: a corrupt file found by the rank hashing it is reported on every rank") {
  QuietLogs quiet;
  SharedDir d("ckpt", "corrupt");
  const int n = world().size();
  Trainer t(config(d, "run", 2), false, &world());
  losses(t, 1);
  const std::string first = t.save_checkpoint();
  losses(t, 1);
  const std::string second = t.save_checkpoint();
  const std::string victim = second + "/rank_" + std::to_string(n - 1) + ".safetensors";  // hashed by rank n-1
  if (world().rank() == 0) {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  world().barrier();
  const std::string error = ck::check(second, world());
  INFO(error);
  CHECK(error.find(victim) != std::string::npos);
  CHECK(error.find("checksum mismatch") != std::string::npos);
  CHECK(world().all_reduce_sum(int64_t{error.size() == ck::check(second, world()).size() ? 0 : 1}) == 0);
  CHECK(ck::resolve_resume("auto", ck::checkpoint_root(config(d, "run", 2)), world()) == first);
  Trainer u(config(d, "run", 1, "auto"), false, &world());
  CHECK(u.step() == 1);
}

TEST_CASE("checkpoint under mpirun: a failed write on one rank fails the save on every rank, the previous one stays") {
  QuietLogs quiet;
  SharedDir d("ckpt", "enospc");
  const int n = world().size();
  Trainer t(config(d, "run", 1), false, &world());
  losses(t, 1);
  const std::string first = t.save_checkpoint();
  losses(t, 1);
  if (world().rank() == n - 1) ck::inject_write_failure(10);
  std::string error;
  try {
    t.save_checkpoint();
  } catch (const std::exception& e) {
    error = e.what();
  }
  ck::inject_write_failure(-1);
  INFO(error);
  CHECK(!error.empty());
  if (world().rank() == n - 1)
    CHECK(error.find("No space left on device") != std::string::npos);
  else
    CHECK(error.find("rank " + std::to_string(n - 1)) != std::string::npos);
  world().barrier();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ck::checkpoint_root(config(d, "run", 1))))
    names.push_back(e.path().filename().string());
  CHECK(names == std::vector<std::string>{"step_1"});
  CHECK(ck::check(first, world()).empty());
  // The run continues and saves again.
  losses(t, 1);
  CHECK(t.save_checkpoint().find("step_3") != std::string::npos);
}

namespace {
// The tensor-parallel model of test_tensor_parallel.cpp (12 heads of 8, 4 kv heads, ffn 48,
// vocabulary 48: tp 1, 2 and 4 divide it), global batch 8 of 24 tokens.
Config tp_config(const SharedDir& d, const std::string& name, int tp, int zero, const std::string& resume = "none",
                 bool sp = false, const std::string& family = "llama", const std::vector<std::string>& more = {}) {
  std::vector<std::string> o = {"model.num_heads=12", "model.head_dim=8", "model.num_kv_heads=4",
                                "model.ffn_hidden_size=48", "model.vocab_size=48", "data.sequence_length=24",
                                "batch.global_batch_size=8", "batch.micro_batch_size=2", "training.steps=6",
                                "distributed.tensor_parallel=" + std::to_string(tp),
                                "distributed.sequence_parallel=" + std::string(sp ? "true" : "false"),
                                "distributed.zero_stage=" + std::to_string(zero),
                                "run.output_dir=\"" + d.path + "\"", "run.name=" + name,
                                "training.resume=\"" + resume + "\""};
  o.insert(o.end(), more.begin(), more.end());
  return tiny_run_config(family, o);
}

// That model with 4 blocks (every layout below, pp 1 included, so that the runs compare), split
// over pp pipeline ranks with per_rank stages each (breadth-first).
struct Pp {
  int pp = 1, per_rank = 1, tp = 1, zero = 0;
};
Config pp_config(const SharedDir& d, const std::string& family, const std::string& name, Pp l,
                 const std::string& resume = "none", const std::vector<std::string>& more = {}) {
  std::vector<std::string> o = {"model.num_layers=4", "distributed.pipeline_parallel=" + std::to_string(l.pp),
                                "distributed.stages_per_rank=" + std::to_string(l.per_rank),
                                "distributed.pipeline_schedule=\"breadth_first\""};
  o.insert(o.end(), more.begin(), more.end());
  return tp_config(d, name, l.tp, l.zero, resume, false, family, o);
}

// Every parameter `t` holds (its tensor-parallel block, on its pipeline rank) against the same
// elements of the one-rank run `ref`, by name.
void check_weights_by_name(Trainer& ref, Trainer& t, double tol) {
  Owned wr = to_host(ref.optimizer().gather_master(), DType::F64);
  Owned wt = to_host(t.optimizer().gather_master(), DType::F64);
  const ParamTable& rt = ref.model().params().table();
  double worst = 0;
  std::string where;
  for (const ParamSpec& p : t.model().params().table().entries()) {
    const ParamSpec& s = rt.get(p.name);
    for (int64_t i = 0; i < p.shape.numel(); ++i) {
      const double want = get(wr, s.offset + full_index(p, i)), got = get(wt, p.offset + i);
      const double err = std::abs(got - want) / std::max(1.0, std::abs(want));
      if (err > worst) {
        worst = err;
        where = p.name;
      }
    }
  }
  INFO("largest relative error " << worst << " in " << where);
  CHECK(worst <= tol);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A pipeline layout of every rank: pp2 with 2 stages per rank (dp n/2, ZeRO 1 when n = 4), or
// pp3 with one stage per rank on 3 ranks.
Pp pipeline_layout(int n) {
  if (n % 2 == 0) return {2, 2, 1, n > 2 ? 1 : 0};
  return {n, 1, 1, 0};
}
}  // namespace

TEST_CASE("checkpoint re-sharding across tensor-parallel sizes: tp2 -> tp2, 1 rank, tp4; 1 rank -> tp2") {
  const int n = world().size();
  if (n % 2 != 0) {
    skip_test("needs an even number of ranks");
    return;
  }
  QuietLogs quiet;
  SharedDir d("ckpt", "tp");
  SelfComm self;
  Trainer ref(tp_config(d, "ref", 1, 0), false, &self);
  const std::vector<double> want = losses(ref, 6);

  Trainer a(tp_config(d, "tp2", 2, 1, "none", true), false, &world());  // dp n/2 x tp2, ZeRO 1, sp
  std::vector<double> la = losses(a, 3);
  const std::string saved = a.save_checkpoint();
  const ck::Metadata m = ck::read_metadata(saved);
  CHECK(m.layout.tensor_parallel == 2);
  CHECK(m.layout.data_parallel == n / 2);
  CHECK(m.find_param("layers.0.attn.wq")->split_dim == 0);
  CHECK(m.find_param("layers.0.attn.wq")->shape == std::vector<int64_t>{96, 24});  // the full tensor
  CHECK(m.find_param("layers.0.mlp.w_out")->split_dim == 1);
  for (double l : losses(a, 3)) la.push_back(l);
  check_close(la, want, 0, "tp2");
  {  // the same layout: bitwise
    Trainer b(tp_config(d, "tp2-again", 2, 1, saved, true), false, &world());
    const std::vector<double> lb = losses(b, 3);
    for (int i = 0; i < 3; ++i) CHECK(lb[static_cast<size_t>(i)] == la[static_cast<size_t>(i + 3)]);
  }
  {  // one rank: every parameter assembled from the tp blocks
    Trainer s(tp_config(d, "one", 1, 0, saved), false, &self);
    check_close(losses(s, 3), want, 3, "one rank from tp2");
    check_weights(ref, s, 1e-5);
  }
  if (n >= 4) {  // tp4 (dp n/4), ZeRO 3: blocks of other boundaries
    Trainer t4(tp_config(d, "tp4", 4, 3, saved), false, &world());
    check_close(losses(t4, 3), want, 3, "tp4 from tp2");
  }
  {  // the reverse: a one-rank checkpoint (rank 0's) into tp2
    Trainer s(tp_config(d, "single-" + std::to_string(world().rank()), 1, 0), false, &self);
    losses(s, 3);
    s.save_checkpoint();
    world().barrier();
    const std::string dir0 = ck::checkpoint_root(tp_config(d, "single-0", 1, 0)) + "/step_3";
    Trainer t(tp_config(d, "from-one", 2, 0, dir0), false, &world());
    check_close(losses(t, 3), want, 3, "tp2 from one rank");
  }
}

TEST_CASE("checkpoint re-sharding of MoE and Mamba blocks: hybrid tp2 -> 1 rank, tp4 (3-D expert blocks split on dims 1 and 2)") {
  const int n = world().size();
  if (n % 2 != 0) {
    skip_test("needs an even number of ranks");
    return;
  }
  QuietLogs quiet;
  SharedDir d("ckpt", "tp-hybrid");
  SelfComm self;
  const std::vector<std::string> hybrid = {"model.hybrid_layout=\"MEA\"", "model.num_layers=3", "model.num_experts=3",
                                           "model.mamba_d_state=4", "model.moe_aux_loss_coef=0.01"};
  Trainer ref(tp_config(d, "ref", 1, 0, "none", false, "hybrid", hybrid), false, &self);
  const std::vector<double> want = losses(ref, 6);
  Trainer a(tp_config(d, "tp2", 2, 1, "none", false, "hybrid", hybrid), false, &world());
  std::vector<double> la = losses(a, 3);
  const std::string saved = a.save_checkpoint();
  const ck::Metadata m = ck::read_metadata(saved);
  CHECK(m.find_param("layers.1.moe.w_gate")->split_dim == 1);
  CHECK(m.find_param("layers.1.moe.w_out")->split_dim == 2);
  CHECK(m.find_param("layers.1.moe.w_out")->shape == std::vector<int64_t>{3, 24, 48});
  CHECK(m.find_param("layers.0.mamba.A_log")->split_dim == 0);
  for (double l : losses(a, 3)) la.push_back(l);
  check_close(la, want, 0, "hybrid tp2");
  {  // one rank: every expert and Mamba parameter assembled from the tp blocks
    Trainer s(tp_config(d, "one", 1, 0, saved, false, "hybrid", hybrid), false, &self);
    check_close(losses(s, 3), want, 3, "one rank from hybrid tp2");
    check_weights(ref, s, 1e-5);
  }
  if (n >= 4) {
    Trainer t4(tp_config(d, "tp4", 4, 3, saved, false, "hybrid", hybrid), false, &world());
    check_close(losses(t4, 3), want, 3, "hybrid tp4 from tp2");
  }
}

TEST_CASE("checkpoint re-sharding across pipeline layouts: pp -> pp (bitwise), 1 rank; 1 rank -> pp; pp2 x tp2 -> pp4, 1 rank") {
  const int n = world().size();
  if (n > 4) {
    skip_test("pipeline checkpoint layouts are defined for 2, 3 and 4 ranks");
    return;
  }
  QuietLogs quiet;
  SharedDir d("ckpt", "pp");
  SelfComm self;
  const Pp layout = pipeline_layout(n), one{};
  for (const std::string family : {"llama", "gpt2"}) {  // gpt2: tied embeddings, a copy on the head's rank
    CAPTURE(family);
    CAPTURE(layout.pp);
    Trainer ref(pp_config(d, family, family + "-ref", one), false, &self);
    const std::vector<double> want = losses(ref, 6);

    Trainer a(pp_config(d, family, family + "-pp", layout), false, &world());
    REQUIRE(a.mesh().pp_size() == layout.pp);
    std::vector<double> la = losses(a, 3);
    const std::string saved = a.save_checkpoint();
    const ck::Metadata m = ck::read_metadata(saved);
    CHECK(m.version == 3);
    CHECK(m.layout.pipeline_parallel == layout.pp);
    CHECK(m.layout.data_parallel == n / layout.pp);
    CHECK(m.layout.capacity.size() == static_cast<size_t>(layout.pp));
    CHECK(m.table_elements.size() == static_cast<size_t>(layout.pp));
    CHECK(static_cast<int>(m.shards.size()) == (layout.zero > 0 ? n : layout.pp));
    // Every parameter once (the tied embedding too), on the rank holding its stage.
    CHECK(m.params.size() == ref.model().params().table().entries().size());
    CHECK(m.find_param("embed.tokens")->pp_rank == 0);
    CHECK(m.find_param("layers.0.attn.wq")->pp_rank == 0);
    CHECK(m.find_param("layers.1.attn.wq")->pp_rank == 1);  // stage 1 (one block per stage)
    CHECK(m.find_param("final_norm.weight")->pp_rank == layout.pp - 1);
    if (family == "llama") CHECK(m.find_param("head.weight")->pp_rank == layout.pp - 1);
    check_compatible(m, ref.model().params().table(), saved);
    for (double l : losses(a, 3)) la.push_back(l);
    check_close(la, want, 0, "pipeline layout");
    {  // the same layout: bitwise
      Trainer b(pp_config(d, family, family + "-pp-again", layout, saved), false, &world());
      const std::vector<double> lb = losses(b, 3);
      for (int i = 0; i < 3; ++i) CHECK(lb[static_cast<size_t>(i)] == la[static_cast<size_t>(i + 3)]);
      check_weights(a, b, 0.0);
    }
    {  // one rank: every parameter from the pipeline rank that held it
      Trainer s(pp_config(d, family, family + "-one", one, saved), false, &self);
      CHECK(s.step() == 3);
      check_close(losses(s, 3), want, 3, "one rank from the pipeline layout");
      check_weights(ref, s, 1e-5);
    }
    {  // the reverse: a one-rank checkpoint (rank 0's) into the pipeline layout
      Trainer s(pp_config(d, family, family + "-single-" + std::to_string(world().rank()), one), false, &self);
      losses(s, 3);
      s.save_checkpoint();
      world().barrier();
      const std::string dir0 = ck::checkpoint_root(pp_config(d, family, family + "-single-0", one)) + "/step_3";
      Trainer t(pp_config(d, family, family + "-from-one", layout, dir0), false, &world());
      check_close(losses(t, 3), want, 3, "pipeline layout from one rank");
      check_weights_by_name(ref, t, 1e-5);
    }
  }
  if (n != 4) return;
  // pp2 x tp2 -> pp4 and -> one rank (gpt2: the vocab-parallel tied embedding on ranks 0 and 3).
  Trainer ref(pp_config(d, "gpt2", "tp-ref", one), false, &self);
  const std::vector<double> want = losses(ref, 6);
  Trainer a(pp_config(d, "gpt2", "pp2-tp2", {2, 1, 2, 0}), false, &world());
  REQUIRE(a.mesh().tp_size() == 2);
  check_close(losses(a, 3), want, 0, "pp2 x tp2");
  const std::string saved = a.save_checkpoint();
  const ck::Metadata m = ck::read_metadata(saved);
  CHECK(m.layout.tensor_parallel == 2);
  CHECK(m.layout.pipeline_parallel == 2);
  CHECK(m.shards.size() == 4);
  {
    Trainer p4(pp_config(d, "gpt2", "pp4", {4, 1, 1, 0}, saved), false, &world());
    check_close(losses(p4, 3), want, 3, "pp4 from pp2 x tp2");
    check_weights_by_name(ref, p4, 1e-5);
  }
  {
    Trainer dp(pp_config(d, "gpt2", "dp2-pp2-z3", {2, 2, 1, 3}, saved), false, &world());
    check_close(losses(dp, 3), want, 3, "dp2 x pp2 ZeRO 3 from pp2 x tp2");
    check_weights_by_name(ref, dp, 1e-5);
  }
  {
    Trainer s(pp_config(d, "gpt2", "tp-one", one, saved), false, &self);
    check_close(losses(s, 3), want, 3, "one rank from pp2 x tp2");
    check_weights(ref, s, 1e-5);
  }
}

TEST_CASE("checkpoint: --export-hf from a pipeline-parallel checkpoint equals the one-rank export; init_from into pp") {
  if (world().size() > 4) {
    skip_test("pipeline checkpoint layouts are defined for 2, 3 and 4 ranks");
    return;
  }
  QuietLogs quiet;
  SharedDir d("ckpt", "pp-export");
  SelfComm self;
  const Pp layout = pipeline_layout(world().size()), one{};
  for (const std::string family : {"gpt2", "llama"}) {  // tied embeddings, and an untied head
    CAPTURE(family);
    // gpt2 as Hugging Face has it: no grouped-query attention, 12 heads of 8 = hidden 96.
    const std::vector<std::string> hf_model =
        family == "gpt2" ? std::vector<std::string>{"model.num_kv_heads=12", "model.hidden_size=96"}
                         : std::vector<std::string>{};
    auto cfg = [&](const std::string& name, Pp l, const std::string& resume, std::vector<std::string> more) {
      more.insert(more.begin(), hf_model.begin(), hf_model.end());
      return pp_config(d, family, family + "-" + name, l, resume, more);
    };
    std::string saved;
    {
      Trainer a(cfg("pp", layout, "none", {}), false, &world());
      losses(a, 2);
      saved = a.save_checkpoint();
    }
    const std::string out_pp = d.path + "/" + family + "-hf-pp", out_one = d.path + "/" + family + "-hf-one";
    if (world().rank() == 0) {
      // The same state through one rank: resumed from the pipeline checkpoint and saved again.
      std::string one_dir;
      {
        Trainer s(cfg("one", one, saved, {}), false, &self);
        CHECK(s.step() == 2);
        one_dir = s.save_checkpoint();
      }
      // What ./train CONFIG --export-hf DIR runs, with training.resume naming the checkpoint.
      ck::export_hf_from_config(cfg("pp", layout, saved, {}), out_pp, {});
      ck::export_hf_from_config(cfg("one", one, one_dir, {}), out_one, {});
      const ck::SafetensorsFile fa(out_pp + "/model.safetensors"), fb(out_one + "/model.safetensors");
      CHECK(fa.tensors().size() == fb.tensors().size());
      CHECK(read_text(out_pp + "/config.json") == read_text(out_one + "/config.json"));
      for (const ck::StTensor& t : fa.tensors()) {
        CAPTURE(t.name);
        const ck::StTensor* u = fb.find(t.name);
        CHECK(u != nullptr);
        if (!u) continue;
        CHECK(u->shape == t.shape);
        CHECK(u->dtype == t.dtype);
        CHECK((u->end - u->begin == t.end - t.begin &&
               std::memcmp(fa.data(t), fb.data(*u), t.end - t.begin) == 0));
      }
    }
    world().barrier();
    // model.init_from that folder: each pipeline rank takes its parameters from it (the head's
    // rank its copy of the tied embedding), as one rank does.
    const std::vector<std::string> init = {"model.init_from=\"" + out_pp + "\""};
    Trainer io(cfg("init-one", one, "none", init), false, &self);
    Trainer ip(cfg("init-pp", layout, "none", init), false, &world());
    check_weights_by_name(io, ip, 0.0);
    check_close(losses(ip, 2), losses(io, 2), 0, "pipeline layout from model.init_from");
  }
}

TEST_CASE("GPUs with NCCL: pp2 and tp2 checkpoints save, and resume on the same layout and on one GPU" * doctest::test_suite("gpu")) {
  if (!gpus_for_ranks_or_skip(world().size(), 2)) return;
  QuietLogs quiet;
  SharedDir d("ckpt", "gpu");
  auto nccl = make_nccl_comm(world());
  SelfComm self;
  for (const Pp& l : {Pp{2, 2, 1, 1}, Pp{1, 1, 2, 0}}) {
    CAPTURE(l.pp);
    CAPTURE(l.tp);
    const std::string tag = "p" + std::to_string(l.pp) + "t" + std::to_string(l.tp);
    const std::vector<std::string> cuda = {"run.device=\"cuda\""};
    Trainer a(pp_config(d, "gpt2", "gpu-" + tag, l, "none", cuda), false, nccl.get());
    std::vector<double> la = losses(a, 3);
    const std::string saved = a.save_checkpoint();  // the table exchange runs on NCCL tensors
    const ck::Metadata m = ck::read_metadata(saved);
    CHECK(m.layout.tensor_parallel == l.tp);
    for (double x : losses(a, 3)) la.push_back(x);
    Trainer b(pp_config(d, "gpt2", "gpu-" + tag + "-again", l, saved, cuda), false, nccl.get());
    const std::vector<double> lb = losses(b, 3);
    for (int i = 0; i < 3; ++i) CHECK(lb[static_cast<size_t>(i)] == doctest::Approx(la[static_cast<size_t>(i + 3)]).epsilon(1e-3));
    // One GPU per rank, each resuming alone from the same checkpoint.
    Trainer s(pp_config(d, "gpt2", "gpu-" + tag + "-one-" + std::to_string(world().rank()), Pp{}, saved, cuda), false, &self);
    const std::vector<double> ls = losses(s, 3);
    for (int i = 0; i < 3; ++i) CHECK(ls[static_cast<size_t>(i)] == doctest::Approx(la[static_cast<size_t>(i + 3)]).epsilon(2e-2));
  }
}
