// Tensor and pipeline parallelism against one rank: on every rank a single-process reference
// run (its own group of one) and a run over the world with distributed.tensor_parallel = t and/or
// pipeline_parallel = p (data parallel over the rest) must give the same losses and gradient
// norms step by step, and the same gradients and weights: each rank's block of every parameter
// it holds equals the matching block of the reference's full parameter (init is layout
// independent, so they start equal).
// Tensor-parallel layouts by world size: 2 ranks tp2 (plain, sequence parallel, cross-entropy
// splits, q/k norms); 3 ranks tp3 with sequence parallelism; 4 ranks dp2 x tp2 (ZeRO 1, sequence parallel)
// and tp4. Pipeline layouts: 2 ranks pp2 with 1 and 2 stages per rank, breadth- and depth-first,
// 4 micro-batches, tied embeddings across stages, micro-sequences (against whole sequences); 3 ranks pp3; 4 ranks dp2 x pp2 and tp2 x pp2;
// 8 ranks dp2 x tp2 x pp2 with 2 stages per rank.
#include <doctest/doctest.h>

#include <cmath>

#include <unistd.h>

#include <filesystem>

#include "checkpoint/tools.h"
#include "comm/mpi_comm.h"
#include "comm/nccl_comm.h"
#include "core/log.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"


using namespace engine;
using namespace engine::testing;

namespace {

// A tiny model that tp in {2, 3, 4} divides: 12 query heads of dim 8 and 4 kv heads (3 for
// tp 3: grouped-query attention either way), ffn 48, vocabulary 48 (the data uses 37 ids), 24
// tokens per sequence. `model_tp` picks the model, `tp` the layout (1: the reference).
std::vector<std::string> tp_layout(int model_tp, int tp, const std::string& device, std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.num_heads=12", "model.head_dim=8", "model.ffn_hidden_size=48",
                                "model.num_kv_heads=" + std::to_string(model_tp == 3 ? 3 : 4),
                                "model.vocab_size=48", "data.sequence_length=24", "batch.global_batch_size=8",
                                "batch.micro_batch_size=2", "training.steps=3",
                                "distributed.tensor_parallel=" + std::to_string(tp),
                                "run.device=\"" + device + "\""};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// For each parameter of the parallel table: this rank's block (from `parallel`, a flat buffer of
// that table) against the same elements of the reference's full parameter (`single`, a flat
// buffer of the one-rank table): rms(error) <= tol * rms(reference block), or for a block whose
// rms is below floor = 1e-3 rms(all), rms(error) <= floor. The floor covers parameters whose
// exact gradient is 0 (the key bias: softmax ignores a shift of all scores), where both runs
// hold rounding noise that AdamW then scales to ~lr * 1e-4.
void compare_blocks(const ParamTable& st, const Tensor& single, const ParamTable& pt, const Tensor& parallel,
                    double tol, const std::string& what) {
  Owned a = to_host(single, DType::F64), b = to_host(parallel, DType::F64);
  double all = 0;
  for (int64_t i = 0; i < st.total_elements(); ++i) all += get(a, i) * get(a, i);
  const double floor = 1e-3 * std::sqrt(all / static_cast<double>(st.num_parameters()));
  for (const ParamSpec& p : pt.entries()) {
    if (p.frozen) continue;  // LoRA's base: not in the trainable buffers (core/params.h)
    // The key bias's exact gradient is 0 (softmax ignores a shift of all scores): its gradient
    // is rounding noise, which AdamW scales to steps of ~lr once the noise exceeds eps (bf16 on
    // GPUs), so its weights are noise in any two runs that round differently.
    if (what == "weight" && p.name.size() > 8 && p.name.compare(p.name.size() - 8, 8, ".attn.bk") == 0) continue;
    const ParamSpec& s = st.get(p.name);
    REQUIRE(s.shape == p.full_shape);
    double err = 0, ref = 0;
    const int64_t n = p.shape.numel();
    for (int64_t i = 0; i < n; ++i) {
      const double want = get(a, s.offset + full_index(p, i)), got = get(b, p.offset + i);
      err += (got - want) * (got - want);
      ref += want * want;
    }
    err = std::sqrt(err / static_cast<double>(n));
    ref = std::sqrt(ref / static_cast<double>(n));
    INFO(what << " of " << p.name << " (block at " << p.split_begin << " of dim " << p.split_dim << "): rms error "
              << err << ", rms " << ref << ", floor " << floor);
    CHECK(err <= (ref < floor ? floor : tol * ref));
  }
}

struct Case {
  std::string family;
  int tp;
  std::vector<std::string> extra;  // sequence parallel, splits, ZeRO
};

// exact_steps: the steps whose losses, gradient norms and gradients are held to tol; later steps
// (and the validation after them) hold the loss to loose_tol only, and the weights are compared
// only when every step was exact (FP8, fp8() below).
void compare_runs(const Case& c, Comm& group, const std::string& device = "cpu", double tol = 1e-5,
                  int exact_steps = 3, double loose_tol = 0) {
  SelfComm self;
  CAPTURE(c.family);
  CAPTURE(c.tp);
  std::string layout;
  for (const auto& e : c.extra) layout += e + " ";
  CAPTURE(layout);
  std::vector<std::string> model_keys;  // e.g. a sliding window, a teacher: both runs
  for (const auto& e : c.extra)
    // (micro-sequences only in the parallel run: the reference runs whole sequences)
    if ((e.rfind("model.", 0) == 0 || e.rfind("distillation.", 0) == 0 || e.rfind("batch.", 0) == 0 ||
         e.rfind("lora.", 0) == 0 || e.rfind("optimizer.", 0) == 0 || e.rfind("training.fp8", 0) == 0) &&
        e.rfind("batch.micro_sequence_length", 0) != 0)
      model_keys.push_back(e);
  Trainer single(tiny_run_config(c.family, tp_layout(c.tp, 1, device, model_keys)), false, &self);
  Trainer parallel(tiny_run_config(c.family, tp_layout(c.tp, c.tp, device, c.extra)), false, &group);
  REQUIRE(parallel.mesh().tp_size() == c.tp);
  REQUIRE(parallel.mesh().pp_size() == parallel.model().num_stages() / tiny_run_config(c.family, tp_layout(c.tp, c.tp, device, c.extra)).distributed.stages_per_rank);
  CAPTURE(parallel.mesh().describe());
  const ParamTable& st = single.model().params().table();
  const ParamTable& pt = parallel.model().params().table();
  const bool full_grads = parallel.optimizer().zero_stage() == 0;  // else only the shard is reduced
  for (int s = 0; s < 3; ++s) {
    StepResult a = single.train_step(), b = parallel.train_step();
    INFO("step " << s + 1 << ": single " << a.loss << " / " << a.grad_norm << ", parallel " << b.loss << " / "
                 << b.grad_norm);
    if (s >= exact_steps) {
      CHECK(b.loss == doctest::Approx(a.loss).epsilon(loose_tol));
      continue;
    }
    CHECK(b.loss == doctest::Approx(a.loss).epsilon(tol));
    CHECK(b.grad_norm == doctest::Approx(a.grad_norm).epsilon(10 * tol));
    if (full_grads)
      compare_blocks(st, single.model().params().grads_flat(), pt, parallel.model().params().grads_flat(),
                     100 * tol, "gradient");
  }
  if (exact_steps < 3) {
    CHECK(parallel.evaluate() == doctest::Approx(single.evaluate()).epsilon(loose_tol));
    return;
  }
  Owned wa = single.optimizer().gather_master(), wb = parallel.optimizer().gather_master();
  compare_blocks(st, wa, pt, wb, 10 * tol, "weight");
  CHECK(parallel.evaluate() == doctest::Approx(single.evaluate()).epsilon(tol));
}

// Qwen2-MoE's experts: a shared expert beside the routed ones (their sizes differ from the dense
// MLP's), top-k weights not renormalised; with hybrid_layout, dense and sparse layers mixed.
std::vector<std::string> qwen2_moe(const char* layout, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.num_experts=4", "model.experts_per_token=2", "model.moe_ffn_hidden_size=16",
                                "model.moe_shared_expert_ffn_size=20", "model.moe_aux_loss_coef=0.01",
                                std::string("model.hybrid_layout=\"") + layout + "\""};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

// Qwen3-MoE: q/k norms (replicated under tp, their gradients summed over it) and routed experts
// with renormalised top-k weights, no shared expert; dense and sparse layers mixed.
std::vector<std::string> qwen3_moe(const char* layout, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.num_experts=4", "model.experts_per_token=2", "model.moe_ffn_hidden_size=16",
                                "model.moe_aux_loss_coef=0.01", std::string("model.hybrid_layout=\"") + layout + "\""};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

// Mamba-2 blocks at hidden 24: 6 heads of 8 in 2 groups of 8 states (tp2: 3 heads, a group).
std::vector<std::string> mamba2(std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.mamba_head_dim=8", "model.mamba_n_groups=2", "model.mamba_d_state=8",
                                "model.mamba_d_conv=3", "model.mamba_dt_limit_min=0.001"};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

// Gated DeltaNet blocks: 4 value heads of 6 over 2 key heads of 4 (tp2: a key head each).
std::vector<std::string> gdn(std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.gdn_num_key_heads=2", "model.gdn_num_value_heads=4", "model.gdn_key_head_dim=4",
                                "model.gdn_value_head_dim=6", "model.gdn_conv_kernel=3"};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

// Pipeline layouts: 4 blocks, global batch 8 in micro-batches of 2 (4 per dp rank at dp 1).
const std::vector<std::string> kFourLayers = {"model.num_layers=4"};
std::vector<std::string> pp(int p, int per_rank, const char* schedule, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.num_layers=4", "distributed.pipeline_parallel=" + std::to_string(p),
                                "distributed.stages_per_rank=" + std::to_string(per_rank),
                                std::string("distributed.pipeline_schedule=\"") + schedule + "\""};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

std::vector<Case> pipeline_cases_for(int n) {
  switch (n) {
    case 2:
      return {{"llama", 1, pp(2, 1, "breadth_first")},
              {"qwen3", 1, pp(2, 1, "breadth_first", {"model.tie_embeddings=true"})},
              {"gpt2", 1, pp(2, 2, "breadth_first")},  // tied embeddings: stage 0 on rank 0, stage 3 on rank 1
              {"llama", 1, pp(2, 2, "depth_first")},
              {"gpt2", 1, pp(2, 1, "depth_first", {"distributed.zero_stage=0"})},
              // micro-sequences: 3 chunks of 8 tokens, and 4 of 6 with a sliding window
              {"llama", 1, pp(2, 1, "breadth_first", {"batch.micro_sequence_length=8"})},
              {"mistral", 1, pp(2, 2, "depth_first", {"model.sliding_window=7", "batch.micro_sequence_length=6"})},
              {"hybrid", 1, pp(2, 1, "breadth_first", {"model.hybrid_layout=\"MEAM\"", "model.num_experts=3",
                                                       "model.moe_aux_loss_coef=0.01"})},
              {"qwen2_moe", 1, pp(2, 1, "breadth_first", qwen2_moe("EAEE"))},
              {"mamba2", 1, pp(2, 2, "breadth_first", mamba2())},
              {"hybrid", 1, pp(2, 1, "breadth_first", gdn(mamba2({"model.hybrid_layout=\"GSAG\""})))},
              {"qwen3_moe", 1, pp(2, 2, "breadth_first", qwen3_moe("EEAE"))},
              // activation recomputation with interleaved stages and micro-sequences
              {"llama", 1, pp(2, 2, "breadth_first", {"training.recompute_activations=true",
                                                      "batch.micro_sequence_length=12"})},
              // one forward, one backward: tied embeddings, and micro-sequences alternating whole
              // micro-batches
              {"gpt2", 1, pp(2, 1, "1f1b")},
              {"mistral", 1, pp(2, 1, "1f1b", {"model.sliding_window=7", "batch.micro_sequence_length=6"})},
              // interleaved 1f1b: 4 stages on 2 ranks, tied embeddings on stages 0 and 3
              {"gpt2", 1, pp(2, 2, "1f1b")},
              {"llama", 1, pp(2, 2, "1f1b", {"batch.micro_sequence_length=8"})}};
    case 3:
      return {{"gpt2", 1, pp(3, 1, "breadth_first", {"model.num_layers=3"})}};
    case 4:
      return {{"llama", 1, pp(2, 2, "breadth_first", {"distributed.zero_stage=1"})},       // dp2 x pp2
              // tied embeddings under ZeRO 2: their sum over the pipeline comes before the reduction
              {"gpt2", 1, pp(2, 2, "breadth_first", {"distributed.zero_stage=2"})},
              {"gpt2", 2, pp(2, 1, "breadth_first", {"distributed.sequence_parallel=true"})},  // tp2 x pp2
              {"mistral", 1, pp(4, 1, "depth_first", {"model.sliding_window=7"})},
              {"llama", 1, pp(4, 1, "1f1b")},  // 4 micro-batches over 4 stages: warm-up 3, 2, 1, 0
              {"llama", 1, pp(2, 2, "1f1b", {"distributed.zero_stage=1"})}};  // dp2 x pp2, interleaved
    case 8:  // dp2 x tp2 x pp2, 2 stages per rank, 4 micro-batches per data-parallel rank
      return {{"gpt2", 2, pp(2, 2, "breadth_first", {"distributed.zero_stage=1", "batch.global_batch_size=16"})},
              {"llama", 2, pp(2, 2, "breadth_first", {"distributed.sequence_parallel=true", "batch.global_batch_size=16"})}};
    default:
      return {};
  }
}

std::vector<Case> cases_for(int n) {
  const std::vector<std::string> sp = {"distributed.sequence_parallel=true"};
  switch (n) {
    case 2:
      return {{"gpt2", 2, {}},
              {"llama", 2, {}},
              {"mistral", 2, {"model.sliding_window=7"}},
              {"gpt2", 2, sp},
              {"llama", 2, sp},
              {"qwen2", 2, sp},
              // q/k norms: replicated weights whose gradients each rank has for its heads only
              {"qwen3", 2, {}},  // (under sequence parallelism they are summed as every replicated one)
              {"llama", 2, {"distributed.cross_entropy_splits=3"}},
              {"llama", 2, {"model.z_loss=0.01", "model.label_smoothing=0.1"}},  // vocab-parallel vs fused
              {"gpt2", 2, {"model.z_loss=0.001", "distributed.sequence_parallel=true"}},
              {"gpt2", 2, {"distributed.sequence_parallel=true", "distributed.cross_entropy_splits=5"}},
              {"llama", 2, {"distributed.sequence_parallel=true", "batch.micro_sequence_length=8"}},
              // each collective in line with its GEMM (the path without overlap)
              {"llama", 2, {"distributed.sequence_parallel=true", "distributed.tp_overlap=false"}},
              {"gpt2", 2, {"distributed.tp_overlap=false"}},
              // mixture of experts (experts' F split) and Mamba (d_inner split) blocks
              {"mixtral", 2, {"model.num_experts=4", "model.moe_aux_loss_coef=0.01", "model.moe_z_loss_coef=0.001"}},
              {"hybrid", 2, {"model.hybrid_layout=\"MEA\"", "model.num_layers=3", "model.num_experts=3",
                             "model.mamba_d_state=4", "distributed.sequence_parallel=true"}},
              // the shared expert split as the dense MLP, its gate replicated (without sequence
              // parallelism: tests/dist/test_moe_parallel.cpp)
              {"qwen2_moe", 2, qwen2_moe("AE", {"distributed.sequence_parallel=true"})},
              {"qwen3_moe", 2, qwen3_moe("EA", {"distributed.sequence_parallel=true"})},
              // Mamba-2: heads and groups split, the gated norm's row sums reduced over the group
              {"mamba2", 2, mamba2({"distributed.sequence_parallel=true"})},
              {"mamba2", 2, mamba2({"model.mamba_norm_per_group=true"})},  // a group a rank: nothing reduced
              {"hybrid", 2, mamba2({"model.hybrid_layout=\"SAS\"", "model.num_layers=3", "model.mamba_proj_bias=true"})},
              // Gated DeltaNet: key and value heads split, the shared head-norm weight's gradient summed
              {"hybrid", 2, gdn({"model.hybrid_layout=\"GAG\"", "model.num_layers=3", "distributed.sequence_parallel=true"})},
              {"hybrid", 2, gdn({"model.hybrid_layout=\"GG\""})}};
    case 3:
      return {{"llama", 3, sp}, {"gpt2", 3, {}}};
    case 4:
      return {{"llama", 2, {"distributed.sequence_parallel=true", "distributed.zero_stage=1"}},
              {"gpt2", 2, {"distributed.zero_stage=0"}},
              {"mistral", 4, {"distributed.sequence_parallel=true", "model.sliding_window=5"}}};
    default:
      return {};
  }
}

}  // namespace

TEST_CASE("tensor parallel (and dp x tp) reproduces one rank: losses, gradients, weights") {
  const std::vector<Case> cases = cases_for(world().size());
  if (cases.empty()) {
    skip_test("tensor-parallel layouts are defined for 2, 3 and 4 ranks");
    return;
  }
  for (const Case& c : cases) compare_runs(c, world());
}

TEST_CASE("tensor parallel with distillation (vocab-parallel KL) reproduces one rank") {
  if (world().size() != 2 && world().size() != 4) {
    skip_test("runs on 2 and 4 ranks");
    return;
  }
  // The teacher: another init (seed 11, peaked outputs) of the same shapes, written by rank 0.
  const int64_t pid = world().all_reduce_sum(int64_t{world().rank() == 0 ? ::getpid() : 0});
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("engine_tp_teacher." + std::to_string(pid))).string();
  if (world().rank() == 0)
    checkpoint::export_hf_from_config(
        tiny_run_config("llama", tp_layout(2, 1, "cpu", {"run.seed=11", "model.init_std=0.3", "run.name=tp-teacher"})),
        dir, {});
  world().barrier();
  const std::string teacher = "distillation.teacher=\"" + dir + "\"";
  for (const Case& c : std::vector<Case>{
           {"llama", 2, {teacher, "distillation.kind=\"reverse_kl\"", "distillation.temperature=2",
                         "distillation.label_weight=0.5", "model.z_loss=0.01"}},
           {"llama", 2, {teacher, "distillation.kind=\"soft_ce\"", "distributed.sequence_parallel=true",
                         "distributed.cross_entropy_splits=3"}},
           {"llama", 2, {teacher, "distillation.kind=\"forward_kl\"", "distillation.temperature=0.7"}}})
    compare_runs(c, world());
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("debug statistics (run.debug_level = 2) are layout independent: tp, sp, pp, dp vs one rank") {
  std::vector<Case> cases;
  const std::vector<std::string> dbg = {"run.debug_level=2", "run.debug_steps=\"1-2\""};
  auto with = [&](std::vector<std::string> o) {
    o.insert(o.end(), dbg.begin(), dbg.end());
    return o;
  };
  if (world().size() == 2) cases = {{"llama", 2, with({"distributed.sequence_parallel=true"})}, {"gpt2", 1, with(pp(2, 2, "breadth_first"))}};
  if (world().size() == 4) cases = {{"llama", 2, with(pp(2, 1, "breadth_first", {"distributed.sequence_parallel=true"}))}};
  if (cases.empty()) {
    skip_test("runs on 2 and 4 ranks");
    return;
  }
  log_set_level(LogLevel::Warn);  // debug_level turns on debug lines
  for (const Case& c : cases) {
    std::vector<std::string> model_keys;
    for (const auto& e : c.extra)
      if (e.rfind("model.", 0) == 0 || e.rfind("run.", 0) == 0) model_keys.push_back(e);
    SelfComm self;
    Trainer single(tiny_run_config(c.family, tp_layout(c.tp, 1, "cpu", model_keys)), false, &self);
    Trainer parallel(tiny_run_config(c.family, tp_layout(c.tp, c.tp, "cpu", c.extra)), false, &world());
    log_set_level(LogLevel::Warn);
    for (int step = 1; step <= 2; ++step) {
      single.train_step();
      parallel.train_step();
      const StatsRecorder& a = *single.debug_stats();
      const StatsRecorder& b = *parallel.debug_stats();
      for (const std::string& n : a.names()) {
        INFO(c.family << " step " << step << " " << n << ": mean " << a.at(n).mean() << " / " << b.at(n).mean()
                      << ", std " << a.at(n).std() << " / " << b.at(n).std());
        CHECK(b.at(n).count == a.at(n).count);
        CHECK(b.at(n).count > 0);
        CHECK(b.at(n).nan == 0);
        CHECK(b.at(n).std() == doctest::Approx(a.at(n).std()).epsilon(1e-4));
        CHECK(b.at(n).max_abs == doctest::Approx(a.at(n).max_abs).epsilon(1e-4));
        CHECK(std::abs(b.at(n).mean() - a.at(n).mean()) <= 1e-4 * a.at(n).std() + 1e-12);
      }
    }
  }
  log_set_level(LogLevel::Info);
}

TEST_CASE("interleaved 1f1b refuses micro-batches that do not fill whole groups of the pipeline ranks") {
  if (world().size() != 2) {
    skip_test("runs on 2 ranks");
    return;
  }
  // 3 micro-batches (of 4 sequences) over 2 pipeline ranks with 2 stages each.
  std::string what = "no error";
  try {
    Trainer t(tiny_run_config("llama", pp(2, 2, "1f1b", {"batch.global_batch_size=12"})), false, &world());
  } catch (const std::exception& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("distributed.pipeline_schedule") != std::string::npos);
  CHECK(what.find("groups of pipeline_parallel (2), got 3") != std::string::npos);
}

TEST_CASE("pipeline parallel (with dp and tp) reproduces one rank: losses, gradients, weights") {
  const std::vector<Case> cases = pipeline_cases_for(world().size());
  if (cases.empty()) {
    skip_test("pipeline layouts are defined for 2, 3, 4 and 8 ranks");
    return;
  }
  for (const Case& c : cases) compare_runs(c, world());
}

// LoRA: adapters on every linear of a block, the base frozen (layers/lora.h). Column-parallel
// targets split B on out (A replicated, its gradient summed over tp), row-parallel ones A on in
// (B replicated, summed); under sequence parallelism every replicated factor is summed.
const std::vector<std::string> kLora = {"lora.rank=4", "lora.alpha=6",
                                        "lora.targets=[\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]"};

std::vector<std::string> with_lora(std::vector<std::string> o) {
  o.insert(o.end(), kLora.begin(), kLora.end());
  return o;
}

TEST_CASE("LoRA under tensor (+ sequence) and pipeline parallelism reproduces one rank") {
  if (world().size() != 2) {
    skip_test("the LoRA layouts are defined for 2 ranks");
    return;
  }
  const std::vector<Case> cases = {
      {"llama", 2, with_lora({"distributed.sequence_parallel=true"})},
      {"llama", 2, with_lora({"distributed.tp_overlap=false", "distributed.zero_stage=0"})},
      {"qwen3", 2, with_lora({"distributed.sequence_parallel=true"})},  // frozen q/k norms
      {"qwen2", 2, with_lora({})},                                       // frozen qkv biases
      {"llama", 1, with_lora(pp(2, 2, "breadth_first"))},
      {"gpt2", 1, pp(2, 2, "1f1b", {"lora.rank=3", "lora.targets=[\"q\", \"v\", \"o\"]"})},  // tied embeddings, frozen
  };
  for (const Case& c : cases) compare_runs(c, world());
}

// FP8 (training.fp8): widths of multiples of 16 (hidden 32, ffn 64). Each amax a split cuts is
// the group's maximum (layers/linear.h), so every rank quantises as one rank does: the first
// step's gradients agree to 2e-5 (measured; with each rank's own amax, 4e-2 to 1e-1, and the
// loss 2e-4 to 1.4e-3 apart). What is left is f32 summation order, which now and then moves a
// value across an FP8 rounding step; from the second step on such moves compound (gradients up
// to 7e-2 apart by step 3), so later steps hold the loss only, to 2e-3.
std::vector<std::string> fp8(const char* recipe, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.hidden_size=32", "model.ffn_hidden_size=64",
                                std::string("training.fp8=\"") + recipe + "\""};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

TEST_CASE("training.fp8 under tensor (+ sequence), pipeline and ZeRO-3 data parallelism reproduces one rank") {
  if (world().size() != 2) {
    skip_test("the FP8 layouts are defined for 2 ranks");
    return;
  }
  const std::vector<Case> cases = {
      {"llama", 2, fp8("tensorwise", {"distributed.sequence_parallel=true"})},
      {"llama", 2, fp8("rowwise")},
      {"gpt2", 2, fp8("tensorwise")},  // biases, GELU, learned positions
      {"gpt2", 2, fp8("rowwise", {"distributed.tp_overlap=false"})},
      {"hybrid", 2, fp8("rowwise", {"model.hybrid_layout=\"MEA\"", "model.num_layers=3", "model.num_experts=3",
                                    "model.mamba_d_state=4", "distributed.sequence_parallel=true"})},
      {"llama", 1, fp8("rowwise", pp(2, 2, "breadth_first"))},
      {"llama", 1, fp8("tensorwise", {"distributed.zero_stage=3"})},
  };
  for (const Case& c : cases) compare_runs(c, world(), "cpu", 1e-5, 1, 2e-3);
}

TEST_CASE("GPUs with NCCL: tensor parallel reproduces one GPU, bf16 tolerance" * doctest::test_suite("gpu")) {
  if (!gpus_for_ranks_or_skip(world().size(), 2)) return;
  auto nccl = make_nccl_comm(world());
  for (const Case& c : std::vector<Case>{{"llama", 2, {}},
                                         {"llama", 2, {"distributed.sequence_parallel=true"}},
                                         {"llama", 2, {"distributed.sequence_parallel=true",
                                                       "distributed.tp_overlap=false"}},
                                         {"gpt2", 2, {"distributed.sequence_parallel=true",
                                                      "distributed.cross_entropy_splits=3"}},
                                         {"qwen3", 2, {}},
                                         // the experts' intermediate split (grouped GEMMs over
                                         // two weight stacks per rank) and Mamba beside them
                                         {"mixtral", 2, {"model.num_experts=4", "model.moe_aux_loss_coef=0.01"}},
                                         {"hybrid", 2, {"model.hybrid_layout=\"MEA\"", "model.num_layers=3",
                                                        "model.num_experts=3", "model.mamba_d_state=4",
                                                        "distributed.sequence_parallel=true"}},
                                         {"qwen2_moe", 2, qwen2_moe("AE", {"distributed.sequence_parallel=true"})},
                                         {"qwen3_moe", 2, qwen3_moe("EA", {"distributed.sequence_parallel=true"})}})
    compare_runs(c, *nccl, "cuda", 2e-2);
}

TEST_CASE("GPUs with NCCL: LoRA under tensor (+ sequence) and pipeline parallelism reproduces one GPU, bf16 tolerance" *
          doctest::test_suite("gpu")) {
  if (!gpus_for_ranks_or_skip(world().size(), 2)) return;
  if (world().size() != 2) return skip_test("the LoRA layouts are defined for 2 ranks");
  auto nccl = make_nccl_comm(world());
  for (const Case& c : std::vector<Case>{{"llama", 2, with_lora({"distributed.sequence_parallel=true"})},
                                         {"llama", 2, with_lora({})},
                                         {"llama", 1, with_lora(pp(2, 2, "breadth_first"))}})
    compare_runs(c, *nccl, "cuda", 2e-2);
}

TEST_CASE("GPUs with NCCL: pipeline parallel reproduces one GPU, bf16 tolerance" * doctest::test_suite("gpu")) {
  if (!gpus_for_ranks_or_skip(world().size(), 2)) return;
  auto nccl = make_nccl_comm(world());
  for (const Case& c : std::vector<Case>{{"llama", 1, pp(2, 1, "breadth_first")},
                                         {"gpt2", 1, pp(2, 2, "breadth_first")},
                                         {"llama", 1, pp(2, 2, "depth_first")},
                                         {"llama", 1, pp(2, 1, "1f1b")},
                                         {"gpt2", 1, pp(2, 2, "1f1b")},
                                         {"llama", 1, pp(2, 1, "breadth_first", {"batch.micro_sequence_length=8"})}})
    compare_runs(c, *nccl, "cuda", 2e-2);
}

TEST_CASE("tensor_parallel must divide the ranks, heads, kv heads, ffn and vocabulary") {
  auto message = [](const std::vector<std::string>& o) {
    try {
      SelfComm self;
      Trainer t(tiny_run_config("llama", o), false, &self);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message({"distributed.tensor_parallel=2"}).find("model.num_heads (3)") != std::string::npos);
  CHECK(message(tp_layout(2, 3, "cpu", {})).find("model.num_kv_heads (4)") != std::string::npos);
  const std::string v = message({"model.num_heads=4", "model.head_dim=6", "model.ffn_hidden_size=48",
                                 "distributed.tensor_parallel=2"});
  CHECK(v.find("model.vocab_size (37)") != std::string::npos);
  CHECK(v.find("distributed.tensor_parallel") != std::string::npos);
  CHECK(message(tp_layout(2, 2, "cpu", {})).find("must divide the number of ranks (1)") != std::string::npos);
  CHECK(message(tp_layout(2, 2, "cpu", {"distributed.sequence_parallel=true", "data.sequence_length=15",
                                     "batch.micro_batch_size=1"}))
            .find("split evenly") != std::string::npos);
}
