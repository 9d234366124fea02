// Cached one-token decode (models/model.h decode_step, layers/decode.cpp, ops/decode.h) against
// the full forward: for every family, every position's next-token logits from the cache equal
// the full forward's logits of the same sequence (f64: to rounding; f32: to f32 rounding).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "models/model.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

struct DecodeCase {
  const char* name;
  ModelFamily family;
  void (*tweak)(ModelConfig&) = nullptr;
};

const DecodeCase kCases[] = {
    {"gpt2", ModelFamily::GPT2},
    {"llama", ModelFamily::Llama},
    {"llama, one kv head", ModelFamily::Llama, [](ModelConfig& c) { c.num_kv_heads = 1; }},
    {"llama, llama3 rope scaling", ModelFamily::Llama,
     [](ModelConfig& c) {
       c.rope_scaling.type = RopeScalingKind::Llama3;
       c.rope_scaling.factor = 4;
       c.rope_scaling.original_max_position_embeddings = 8;
     }},
    {"llama, yarn rope scaling", ModelFamily::Llama,
     [](ModelConfig& c) {
       c.rope_scaling.type = RopeScalingKind::Yarn;
       c.rope_scaling.factor = 4;
       c.rope_scaling.original_max_position_embeddings = 8;
       c.rope_scaling.attention_factor = 1.3;
     }},
    {"mistral (window 3)", ModelFamily::Mistral},
    {"qwen2 (qkv biases)", ModelFamily::Qwen2, [](ModelConfig& c) { c.qkv_bias = true; }},
    {"qwen3 (q/k norms, head_dim 6 x 6 heads != hidden 14)", ModelFamily::Qwen3},
    {"mixtral", ModelFamily::Mixtral},
    {"qwen2_moe (AE, shared expert)", ModelFamily::Qwen2Moe},
    {"qwen3_moe (EA, q/k norms, renormalised top-k)", ModelFamily::Qwen3Moe},
    {"mamba", ModelFamily::Mamba},
    {"mamba, biases, conv 4", ModelFamily::Mamba,
     [](ModelConfig& c) {
       c.mamba_proj_bias = true;
       c.mamba_d_conv = 4;
     }},
    {"mamba, conv 1, no conv bias", ModelFamily::Mamba,
     [](ModelConfig& c) {
       c.mamba_d_conv = 1;
       c.mamba_conv_bias = false;
     }},
    {"hybrid (MEA)", ModelFamily::Hybrid},
    {"mamba2 (2 groups)", ModelFamily::Mamba2},
    {"mamba2, per-group norm, biases, delta clamp", ModelFamily::Mamba2,
     [](ModelConfig& c) {
       c.mamba_norm_per_group = true;
       c.mamba_proj_bias = true;
       c.mamba_dt_limit_min = 0.05;
       c.mamba_dt_limit_max = 0.8;
     }},
    {"hybrid (GSAG: Gated DeltaNet, Mamba-2, attention)", ModelFamily::Hybrid,
     [](ModelConfig& c) { set_tiny_layout(c, "GSAG"); }},
    {"llama with LoRA on every linear (frozen base)", ModelFamily::Llama,
     [](ModelConfig& c) {
       c.lora.rank = 3;
       c.lora.alpha = 5;
       c.lora.targets = {"q", "k", "v", "o", "gate", "up", "down"};
     }},
    // multi-token prediction: decoding runs the next-token head only (the extra heads are unused)
    {"llama, two extra prediction heads", ModelFamily::Llama,
     [](ModelConfig& c) {
       c.num_layers = 3;
       c.prediction_heads = 2;
       c.prediction_loss_weights = {1.0, 1.0, 1.0};
     }},
};

// Largest |a - b| over the largest |b| of the full forward's logits.
double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

void check_decode(const DecodeCase& k, DType dtype, double tolerance) {
  ModelConfig c = tiny_model(k.family);
  if (k.tweak) k.tweak(c);
  const int T = 13;  // past mistral's window; within gpt2's 23 positions
  auto model = make_model(c, Device::CPU, dtype);
  randomize_weights(model->params(), "decode");
  Sample s = make_sample({T}, c.vocab_size, "decode tokens");
  const std::vector<int32_t> tokens(s.tokens.begin(), s.tokens.begin() + T);
  MicroBatch mb = make_micro_batch({&s}, T, false, Device::CPU);
  const int64_t V = c.vocab_size;
  Owned full = empty({T, V}, DType::F32, Device::CPU);
  // logits() writes f32; with f64 weights compare the f64 decode against an f64 forward instead.
  std::vector<double> want(static_cast<size_t>(T * V)), got(want.size());
  model->logits(mb, full);
  for (size_t i = 0; i < want.size(); ++i) want[i] = full.ptr<float>()[i];
  auto cache = model->new_decode_cache(T);
  Owned row = empty({1, V}, DType::F32, Device::CPU);
  for (int t = 0; t < T; ++t) {
    model->decode_step(*cache, tokens[static_cast<size_t>(t)], row);
    for (int64_t v = 0; v < V; ++v) got[static_cast<size_t>(t * V + v)] = row.ptr<float>()[v];
  }
  CHECK(cache->position == T);
  const double rel = max_rel(got, want);
  INFO(k.name, " ", dtype_name(dtype), ": max |decode - forward| / max |forward| = ", rel);
  CHECK(rel < tolerance);
  // The cache is full: one more step is an error.
  CHECK_THROWS_WITH_AS(model->decode_step(*cache, 0, row), doctest::Contains("is full"), Error);
}

}  // namespace

TEST_CASE("decode: cached one-token steps give the full forward's logits, every family") {
  for (const DecodeCase& k : kCases) {
    CAPTURE(std::string(k.name));
    // The logits come out as f32 either way: f64 weights leave only that final rounding.
    check_decode(k, DType::F64, 1e-6);
    check_decode(k, DType::F32, 2e-5);
  }
}

TEST_CASE("decode: a cache larger than learned positions hold is refused") {
  ModelConfig c = tiny_model(ModelFamily::GPT2);
  auto model = make_model(c, Device::CPU, DType::F32);
  CHECK_THROWS_WITH_AS(model->new_decode_cache(c.max_position_embeddings + 1),
                       doctest::Contains("max_position_embeddings"), Error);
}

TEST_CASE("GPU decode: cached bf16 steps give the bf16 full forward's logits, every family" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const DecodeCase& k : kCases) {
    CAPTURE(std::string(k.name));
    ModelConfig c = tiny_model(k.family);
    if (k.tweak) k.tweak(c);
    if (has_block_kind(c, "G")) continue;  // Gated DeltaNet: no CUDA kernels yet
    // Sizes the GPU kernels take at full speed (16-byte rows; the fallback attention at head dim 16).
    c.vocab_size = 64;
    c.hidden_size = 64;
    c.head_dim = 16;
    c.ffn_hidden_size = 96;
    if (c.moe_ffn_hidden_size > 0) c.moe_ffn_hidden_size = 48;  // the grouped GEMM's 16-byte rows
    if (c.moe_shared_expert_ffn_size > 0) c.moe_shared_expert_ffn_size = 80;
    c.mamba_d_state = 16;
    c.mamba_dt_rank = 0;
    c.mamba_expand = 2;
    c.mamba_head_dim = 16;  // Mamba-2: 8 heads in 2 groups
    c.init_std = 0.05;
    const int T = 13;
    auto cpu = make_model(c, Device::CPU, DType::F32);
    randomize_weights(cpu->params(), "decode");
    auto model = make_model(c, Device::CUDA, DType::BF16);
    Owned w = to_device(cpu->params().weights_flat(), Device::CUDA, DType::BF16);
    copy_tensor(model->params().weights_flat(), w);
    Sample s = make_sample({T}, c.vocab_size, "decode tokens");
    MicroBatch mb = make_micro_batch({&s}, T, false, Device::CUDA);
    const int64_t V = c.vocab_size;
    Owned full = empty({T, V}, DType::F32, Device::CUDA);
    model->logits(mb, full);
    auto cache = model->new_decode_cache(T);
    Owned rows = empty({T, V}, DType::F32, Device::CUDA);
    for (int t = 0; t < T; ++t) model->decode_step(*cache, s.tokens[static_cast<size_t>(t)], rows->slice(t, t + 1));
    // bf16 activations rounded in another order (the flash kernels and the scan against the
    // decode kernels): a bf16 tolerance over the logits.
    CHECK_CLOSE(rows.t, full.t, 2e-2);
  }
}
