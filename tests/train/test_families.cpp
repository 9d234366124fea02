// The block kinds beyond attention + MLP, end to end through the trainer: tiny Mixtral (mixture
// of experts), Mamba and hybrid (Mamba + MoE + attention) models learn the tiny data (Qwen2-MoE's
// training runs are the layout tests' of tests/dist); on a GPU
// the hybrid model follows its CPU loss curve and learns; the [model] keys of these kinds (and
// qwen2_moe's presets) are checked and named in errors.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>

#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/plan.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;

namespace {
const std::vector<std::string> kMixtral = {"model.num_experts=4", "model.moe_aux_loss_coef=0.01",
                                           "model.moe_z_loss_coef=0.001"};
const std::vector<std::string> kMamba = {"model.mamba_d_state=8"};
const std::vector<std::string> kHybrid = {"model.hybrid_layout=\"MEA\"", "model.num_layers=3",
                                          "model.num_experts=4", "model.mamba_d_state=8"};
}  // namespace

TEST_CASE("tiny mixtral, mamba and hybrid models learn: the loss falls well below ln(V)") {
  for (const auto& [family, o] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"mixtral", kMixtral}, {"mamba", kMamba}, {"hybrid", kHybrid}}) {
    CAPTURE(family);
    std::vector<std::string> overrides = o;
    overrides.push_back("training.steps=30");
    Trainer t(tiny_run_config(family, overrides), false);
    std::vector<double> l;
    for (int i = 0; i < 30; ++i) l.push_back(t.train_step().loss);
    const double last = std::accumulate(l.end() - 5, l.end(), 0.0) / 5;
    INFO("first " << l.front() << ", mean of last five " << last);
    CHECK(l.front() == doctest::Approx(std::log(37.0)).epsilon(0.15));
    CHECK(last < 0.75 * l.front());
  }
}

namespace {
// A tiny hybrid on the CPU and on the GPU, step by step: the GPU's losses within 3% of the CPU's
// for 4 steps, the gradient norms within 5% for 2, and its loss falling.
void gpu_follows_cpu(const std::vector<std::string>& o) {
  std::vector<std::string> cpu_o = o, gpu_o = o;
  cpu_o.push_back("run.device=\"cpu\"");
  gpu_o.push_back("run.device=\"cuda\"");
  Trainer cpu(tiny_run_config("hybrid", cpu_o), false), gpu(tiny_run_config("hybrid", gpu_o), false);
  double first = 0, last = 0;
  for (int s = 0; s < 12; ++s) {
    StepResult a = cpu.train_step(), b = gpu.train_step();
    INFO("step " << s + 1 << ": cpu " << a.loss << ", gpu " << b.loss);
    CHECK(std::isfinite(b.loss));
    if (s < 4) CHECK(std::fabs(a.loss - b.loss) <= 0.03 * a.loss);
    if (s < 2) CHECK(std::fabs(a.grad_norm - b.grad_norm) <= 0.05 * a.grad_norm);
    if (s == 0) first = b.loss;
    last = b.loss;
  }
  CHECK(last < 0.9 * first);
}
}  // namespace

TEST_CASE("GPU: a hybrid model (Mamba, MoE, attention) follows its CPU loss curve and learns" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // head_dim 64: the flash kernels; Di 256 over the Mamba kernels; 4 experts, top 2.
  gpu_follows_cpu({"model.hybrid_layout=\"MEAM\"", "model.num_layers=4", "model.hidden_size=128", "model.num_heads=2",
                   "model.ffn_hidden_size=96", "model.num_experts=4", "model.moe_aux_loss_coef=0.01",
                   "model.mamba_d_state=16", "training.steps=12"});
}

TEST_CASE("GPU: a Mamba-2 hybrid (S and attention blocks) follows its CPU loss curve and learns" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // 4 heads of 64 channels over the SSD kernels, 2 groups of 64 states, the delta clamp.
  gpu_follows_cpu({"model.hybrid_layout=\"SAS\"", "model.num_layers=3", "model.hidden_size=128", "model.num_heads=2",
                   "model.ffn_hidden_size=96", "model.mamba_d_state=64", "model.mamba_n_groups=2",
                   "model.mamba_dt_limit_min=0.001", "training.steps=12"});
}

TEST_CASE("GPU: a Gated DeltaNet hybrid (G and attention blocks) follows its CPU loss curve and learns" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // 2 key heads of 64 over 4 value heads of 64 (two a key head) through the chunked kernels.
  gpu_follows_cpu({"model.hybrid_layout=\"GAG\"", "model.num_layers=3", "model.hidden_size=128", "model.num_heads=2",
                   "model.ffn_hidden_size=96", "model.gdn_num_key_heads=2", "model.gdn_num_value_heads=4",
                   "model.gdn_key_head_dim=64", "model.gdn_value_head_dim=64", "training.steps=12"});
}

TEST_CASE("what the CUDA kernels cannot run is named before a GPU run starts (cuda_unsupported)") {
  CHECK(cuda_unsupported(tiny_run_config("hybrid", kHybrid).model).empty());
  const std::vector<std::string> s = {"model.hybrid_layout=\"SA\"", "model.num_layers=2", "model.mamba_head_dim=24"};
  CHECK(cuda_unsupported(tiny_run_config("hybrid", s).model).empty());
  std::vector<std::string> wide = s;
  wide.push_back("model.mamba_d_state=256");
  CHECK(cuda_unsupported(tiny_run_config("hybrid", wide).model).find("model.mamba_head_dim and model.mamba_d_state up to 128, got 24 and 256") !=
        std::string::npos);
  std::vector<std::string> g = {"model.hybrid_layout=\"GA\"", "model.num_layers=2"};
  CHECK(cuda_unsupported(tiny_run_config("hybrid", g).model).empty());
  g.push_back("model.gdn_value_head_dim=192");
  CHECK(cuda_unsupported(tiny_run_config("hybrid", g).model)
            .find("model.gdn_key_head_dim and model.gdn_value_head_dim up to 128, got ") != std::string::npos);
}

TEST_CASE("mixture-of-experts and Mamba keys: checked, and named in errors") {
  auto error = [](const std::string& family, const std::vector<std::string>& o) {
    try {
      tiny_run_config(family, o);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error("hybrid", {}).find("model.family: hybrid needs model.hybrid_layout") != std::string::npos);
  CHECK(error("hybrid", {"model.hybrid_layout=\"AM\"", "model.num_layers=3"}).find("has 2 letters") !=
        std::string::npos);
  CHECK(error("hybrid", {"model.hybrid_layout=\"AX\""}).find("letter 1 is 'X'") != std::string::npos);
  CHECK(error("llama", {"model.hybrid_layout=\"AA\""}).find("only with model.family hybrid") !=
        std::string::npos);
  CHECK(error("llama", {"model.num_experts=4"}).find("model.num_experts: set, but the model has no mixture") !=
        std::string::npos);
  CHECK(error("mixtral", {"model.num_experts=2", "model.experts_per_token=3"})
            .find("model.experts_per_token: must be at most model.num_experts (2), got 3") != std::string::npos);
  CHECK(error("mixtral", {"model.moe_jitter=1.5"}).find("model.moe_jitter") != std::string::npos);
  CHECK(error("llama", {"model.mamba_d_state=8"}).find("no Mamba (M) or Mamba-2 (S) blocks") != std::string::npos);
  CHECK(error("mamba", {"model.mamba_d_conv=0"}).find("model.mamba_d_conv") != std::string::npos);
  CHECK(error("mamba", {"batch.micro_sequence_length=5"}).find("not supported with Mamba") != std::string::npos);
  // Defaults: mixtral 8 experts top 2, rope_theta 1e6; mamba dt_rank ceil(C / 16), tied embeddings.
  Config m = tiny_run_config("mixtral");
  CHECK(m.model.num_experts == 8);
  CHECK(m.model.experts_per_token == 2);
  CHECK(m.model.rope_theta == 1e6);
  CHECK(m.model.moe_ffn_hidden_size == m.model.ffn_hidden_size);
  CHECK(m.model.moe_shared_expert_ffn_size == 0);
  CHECK(m.model.moe_norm_topk_prob);
  // qwen2_moe: Qwen2MoeConfig's 60 experts, top 4, raw top-k weights, a shared expert of the
  // dense MLP's size; qwen2's attention biases and norm_eps.
  Config q = tiny_run_config("qwen2_moe");
  CHECK(block_layout(q.model) == "EE");
  CHECK(q.model.num_experts == 60);
  CHECK(q.model.experts_per_token == 4);
  CHECK(!q.model.moe_norm_topk_prob);
  CHECK(q.model.moe_shared_expert_ffn_size == q.model.ffn_hidden_size);
  CHECK(q.model.moe_ffn_hidden_size == q.model.ffn_hidden_size);
  CHECK(q.model.qkv_bias);
  CHECK(q.model.norm_eps == 1e-6);
  // qwen3_moe: qwen3's attention (q/k norms, no biases, norm_eps, rope_theta) with the released
  // models' 128 experts, top 8, renormalised, and no shared expert; A/E layouts as qwen2_moe's.
  Config q3 = tiny_run_config("qwen3_moe");
  CHECK(block_layout(q3.model) == "EE");
  CHECK(q3.model.num_experts == 128);
  CHECK(q3.model.experts_per_token == 8);
  CHECK(q3.model.moe_norm_topk_prob);
  CHECK(q3.model.moe_shared_expert_ffn_size == 0);
  CHECK(q3.model.qk_norm);
  CHECK(!q3.model.qkv_bias);
  CHECK(q3.model.norm_eps == 1e-6);
  CHECK(q3.model.rope_theta == 1e6);
  CHECK(block_layout(tiny_run_config("qwen3_moe", {"model.hybrid_layout=\"AE\""}).model) == "AE");
  CHECK(error("qwen3_moe", {"model.hybrid_layout=\"EM\""}).find("letter 1 is 'M'; qwen3_moe takes A") !=
        std::string::npos);
  CHECK(error("qwen2_moe", {"model.hybrid_layout=\"AM\""}).find("letter 1 is 'M'; qwen2_moe takes A") !=
        std::string::npos);
  CHECK(error("qwen2_moe", {"model.hybrid_layout=\"AEE\""}).find("has 3 letters") != std::string::npos);
  CHECK(error("mixtral", {"model.hybrid_layout=\"AE\""}).find("model.hybrid_layout: only with") != std::string::npos);
  CHECK(error("llama", {"model.moe_shared_expert_ffn_size=8"})
            .find("model.moe_shared_expert_ffn_size: set, but the model has no mixture") != std::string::npos);
  CHECK(error("llama", {"model.moe_norm_topk_prob=false"}).find("model.moe_norm_topk_prob: set, but") !=
        std::string::npos);
  CHECK(error("qwen2_moe", {"model.moe_ffn_hidden_size=0"}).find("model.moe_ffn_hidden_size: must be > 0") !=
        std::string::npos);
  CHECK(error("qwen2_moe", {"model.moe_shared_expert_ffn_size=-1"}).find("model.moe_shared_expert_ffn_size") !=
        std::string::npos);
  CHECK(error("qwen2_moe", {"model.num_experts=4", "model.moe_shared_expert_ffn_size=15",
                            "model.num_heads=2", "distributed.tensor_parallel=2"})
            .find("must divide model.moe_shared_expert_ffn_size (15)") != std::string::npos);
  CHECK(error("qwen2_moe", {"model.num_experts=4", "model.moe_ffn_hidden_size=15", "model.num_heads=2",
                            "distributed.tensor_parallel=2"})
            .find("must divide model.moe_ffn_hidden_size (15)") != std::string::npos);
  Config b = tiny_run_config("mamba");
  CHECK(b.model.mamba_dt_rank == 2);
  CHECK(b.model.tie_embeddings);
}
