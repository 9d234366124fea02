// Internal to csrc/config: the one list of config keys. visit_fields() walks every field of a
// Config in file order, calling the visitor once per key; the reader (config.cpp), the writer
// (config_write.cpp) and the key schema (unknown-key checks, suggestions) are visitors, so a
// field added here is parsed, written and known everywhere at once.
//
// Visitor interface (T& or const T& depending on the Config's constness):
//   section(name)                       starts a [section]
//   field(key, int | uint64_t | double | bool | std::string)
//   choice(key, enum, names)            a lowercase string naming one enum value
//   datasets(key, std::vector<DatasetRef>)
//   strings(key, std::vector<std::string>)  an array of strings
//   lr_scales(key, std::vector<LrScale>)    an array of { pattern, scale } tables
//   numbers(key, std::vector<double>)   a TOML array of numbers
//   derived(key, int, formula)          computed, never read; written as a comment
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"

namespace engine::config_detail {

template <typename E>
struct EnumName {
  const char* name;
  E value;
};

inline constexpr EnumName<ModelFamily> kFamilyNames[] = {
    {"gpt2", ModelFamily::GPT2}, {"llama", ModelFamily::Llama}, {"mistral", ModelFamily::Mistral},
    {"qwen2", ModelFamily::Qwen2}, {"qwen3", ModelFamily::Qwen3}, {"mixtral", ModelFamily::Mixtral},
    {"qwen2_moe", ModelFamily::Qwen2Moe}, {"qwen3_moe", ModelFamily::Qwen3Moe}, {"mamba", ModelFamily::Mamba},
    {"mamba2", ModelFamily::Mamba2}, {"hybrid", ModelFamily::Hybrid}};
inline constexpr EnumName<NormKind> kNormNames[] = {{"layernorm", NormKind::LayerNorm},
                                                    {"rmsnorm", NormKind::RMSNorm}};
inline constexpr EnumName<ActivationKind> kActivationNames[] = {{"gelu", ActivationKind::GELU},
                                                                {"swiglu", ActivationKind::SwiGLU}};
inline constexpr EnumName<PositionKind> kPositionNames[] = {{"learned", PositionKind::Learned},
                                                            {"rope", PositionKind::Rope}};
inline constexpr EnumName<RopeScalingKind> kRopeScalingNames[] = {
    {"none", RopeScalingKind::None}, {"linear", RopeScalingKind::Linear},
    {"llama3", RopeScalingKind::Llama3}, {"yarn", RopeScalingKind::Yarn}};
inline constexpr EnumName<AttentionBackendKind> kAttentionBackendNames[] = {
    {"flash", AttentionBackendKind::Flash}, {"cudnn", AttentionBackendKind::Cudnn}};
inline constexpr EnumName<DeviceChoice> kDeviceNames[] = {
    {"auto", DeviceChoice::Auto}, {"cpu", DeviceChoice::CPU}, {"cuda", DeviceChoice::CUDA}};
inline constexpr EnumName<DecayKind> kDecayNames[] = {{"cosine", DecayKind::Cosine},
                                                      {"linear", DecayKind::Linear},
                                                      {"constant", DecayKind::Constant}};

inline constexpr EnumName<DistillationKind> kDistillationNames[] = {{"forward_kl", DistillationKind::ForwardKL},
                                                                    {"reverse_kl", DistillationKind::ReverseKL},
                                                                    {"soft_ce", DistillationKind::SoftCE}};
inline constexpr EnumName<Fp8Recipe> kFp8Names[] = {
    {"off", Fp8Recipe::Off}, {"tensorwise", Fp8Recipe::Tensorwise}, {"rowwise", Fp8Recipe::Rowwise}};
inline constexpr EnumName<ScheduleKind> kScheduleNames[] = {{"breadth_first", ScheduleKind::BreadthFirst},
                                                            {"depth_first", ScheduleKind::DepthFirst},
                                                            {"1f1b", ScheduleKind::OneFOneB}};

template <typename E, size_t N>
constexpr std::span<const EnumName<E>> names_of(const EnumName<E> (&names)[N]) {
  return names;
}

template <typename E>
const char* enum_name(E value, std::span<const EnumName<E>> names) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "?";
}

// "a", "b" or "c" for error messages.
template <typename E>
std::string enum_choices(std::span<const EnumName<E>> names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) s += i + 1 == names.size() ? " or " : ", ";
    s += '"';
    s += names[i].name;
    s += '"';
  }
  return s;
}

template <typename C, typename V>
void visit_fields(C& c, V& v) {
  v.section("run");
  v.field("name", c.run.name);
  v.field("output_dir", c.run.output_dir);
  v.field("seed", c.run.seed);
  v.choice("device", c.run.device, names_of(kDeviceNames));
  v.field("log_every", c.run.log_every);
  v.field("debug_level", c.run.debug_level);
  v.field("debug_steps", c.run.debug_steps);
  v.field("overwrite", c.run.overwrite);

  v.section("model");
  v.choice("family", c.model.family, names_of(kFamilyNames));
  v.field("vocab_size", c.model.vocab_size);
  v.field("hidden_size", c.model.hidden_size);
  v.field("num_layers", c.model.num_layers);
  v.field("num_heads", c.model.num_heads);
  v.field("num_kv_heads", c.model.num_kv_heads);
  v.field("head_dim", c.model.head_dim);
  v.field("ffn_hidden_size", c.model.ffn_hidden_size);
  v.choice("norm", c.model.norm, names_of(kNormNames));
  v.field("norm_eps", c.model.norm_eps);
  v.choice("activation", c.model.activation, names_of(kActivationNames));
  v.choice("positions", c.model.positions, names_of(kPositionNames));
  v.field("max_position_embeddings", c.model.max_position_embeddings);
  v.field("rope_theta", c.model.rope_theta);
  // A table [model.rope_scaling]: dotted keys of [model] (config.cpp reads both spellings).
  v.choice("rope_scaling.type", c.model.rope_scaling.type, names_of(kRopeScalingNames));
  v.field("rope_scaling.factor", c.model.rope_scaling.factor);
  v.field("rope_scaling.low_freq_factor", c.model.rope_scaling.low_freq_factor);
  v.field("rope_scaling.high_freq_factor", c.model.rope_scaling.high_freq_factor);
  v.field("rope_scaling.original_max_position_embeddings", c.model.rope_scaling.original_max_position_embeddings);
  v.field("rope_scaling.beta_fast", c.model.rope_scaling.beta_fast);
  v.field("rope_scaling.beta_slow", c.model.rope_scaling.beta_slow);
  v.field("rope_scaling.attention_factor", c.model.rope_scaling.attention_factor);
  v.field("rope_scaling.truncate", c.model.rope_scaling.truncate);
  v.field("sliding_window", c.model.sliding_window);
  v.choice("attention_backend", c.model.attention_backend, names_of(kAttentionBackendNames));
  v.field("bias", c.model.bias);
  v.field("qkv_bias", c.model.qkv_bias);
  v.field("qk_norm", c.model.qk_norm);
  v.field("tie_embeddings", c.model.tie_embeddings);
  v.field("init_std", c.model.init_std);
  v.field("z_loss", c.model.z_loss);
  v.field("label_smoothing", c.model.label_smoothing);
  v.field("init_from", c.model.init_from);
  v.field("hybrid_layout", c.model.hybrid_layout);
  v.field("num_experts", c.model.num_experts);
  v.field("experts_per_token", c.model.experts_per_token);
  v.field("moe_aux_loss_coef", c.model.moe_aux_loss_coef);
  v.field("moe_z_loss_coef", c.model.moe_z_loss_coef);
  v.field("moe_jitter", c.model.moe_jitter);
  v.field("moe_ffn_hidden_size", c.model.moe_ffn_hidden_size);
  v.field("moe_shared_expert_ffn_size", c.model.moe_shared_expert_ffn_size);
  v.field("moe_norm_topk_prob", c.model.moe_norm_topk_prob);
  v.field("mamba_d_state", c.model.mamba_d_state);
  v.field("mamba_d_conv", c.model.mamba_d_conv);
  v.field("mamba_expand", c.model.mamba_expand);
  v.field("mamba_dt_rank", c.model.mamba_dt_rank);
  v.field("mamba_conv_bias", c.model.mamba_conv_bias);
  v.field("mamba_proj_bias", c.model.mamba_proj_bias);
  v.field("mamba_head_dim", c.model.mamba_head_dim);
  v.field("mamba_n_groups", c.model.mamba_n_groups);
  v.field("mamba_dt_limit_min", c.model.mamba_dt_limit_min);
  v.field("mamba_dt_limit_max", c.model.mamba_dt_limit_max);
  v.field("mamba_norm_per_group", c.model.mamba_norm_per_group);
  v.field("gdn_num_key_heads", c.model.gdn_num_key_heads);
  v.field("gdn_num_value_heads", c.model.gdn_num_value_heads);
  v.field("gdn_key_head_dim", c.model.gdn_key_head_dim);
  v.field("gdn_value_head_dim", c.model.gdn_value_head_dim);
  v.field("gdn_conv_kernel", c.model.gdn_conv_kernel);
  v.field("prediction_heads", c.model.prediction_heads);
  v.numbers("prediction_loss_weights", c.model.prediction_loss_weights);

  v.section("data");
  v.datasets("train", c.data.train);
  v.datasets("valid", c.data.valid);
  v.field("valid_fraction", c.data.valid_fraction);
  v.field("sequence_length", c.data.sequence_length);
  v.field("truncate_documents", c.data.truncate_documents);
  v.field("cross_document_attention", c.data.cross_document_attention);
  v.field("max_epochs", c.data.max_epochs);
  v.field("tokenizer", c.data.tokenizer);

  v.section("batch");
  v.field("micro_batch_size", c.batch.micro_batch_size);
  v.field("global_batch_size", c.batch.global_batch_size);
  v.field("micro_sequence_length", c.batch.micro_sequence_length);
  v.derived("accumulation_steps", c.batch.accumulation_steps,
            "global_batch_size / (micro_batch_size x data_parallel)");

  v.section("optimizer");
  v.field("lr", c.optimizer.lr);
  v.field("min_lr", c.optimizer.min_lr);
  v.field("warmup_steps", c.optimizer.warmup_steps);
  v.choice("decay", c.optimizer.decay, names_of(kDecayNames));
  v.field("decay_steps", c.optimizer.decay_steps);
  v.field("weight_decay", c.optimizer.weight_decay);
  v.field("beta1", c.optimizer.beta1);
  v.field("beta2", c.optimizer.beta2);
  v.field("eps", c.optimizer.eps);
  v.field("grad_clip", c.optimizer.grad_clip);
  v.lr_scales("lr_scale", c.optimizer.lr_scale);

  v.section("training");
  v.field("steps", c.training.steps);
  v.field("max_bad_steps", c.training.max_bad_steps);
  v.field("eval_every", c.training.eval_every);
  v.field("eval_steps", c.training.eval_steps);
  v.field("checkpoint_every", c.training.checkpoint_every);
  v.field("keep_checkpoints", c.training.keep_checkpoints);
  v.field("resume", c.training.resume);
  v.field("recompute_activations", c.training.recompute_activations);
  v.choice("fp8", c.training.fp8, names_of(kFp8Names));
  v.field("sample_every", c.training.sample_every);
  v.field("sample_prompt", c.training.sample_prompt);
  v.field("sample_tokens", c.training.sample_tokens);

  v.section("distributed");
  v.field("zero_stage", c.distributed.zero_stage);
  v.field("reduce_bucket_mb", c.distributed.reduce_bucket_mb);
  v.field("tensor_parallel", c.distributed.tensor_parallel);
  v.field("sequence_parallel", c.distributed.sequence_parallel);
  v.field("tp_overlap", c.distributed.tp_overlap);
  v.field("cross_entropy_splits", c.distributed.cross_entropy_splits);
  v.field("pipeline_parallel", c.distributed.pipeline_parallel);
  v.field("stages_per_rank", c.distributed.stages_per_rank);
  v.choice("pipeline_schedule", c.distributed.pipeline_schedule, names_of(kScheduleNames));
  v.field("timeout_s", c.distributed.timeout_s);

  v.section("distillation");
  v.field("teacher", c.distillation.teacher);
  v.choice("kind", c.distillation.kind, names_of(kDistillationNames));
  v.field("temperature", c.distillation.temperature);
  v.field("weight", c.distillation.weight);
  v.field("label_weight", c.distillation.label_weight);

  v.section("lora");
  v.field("rank", c.model.lora.rank);
  v.field("alpha", c.model.lora.alpha);
  v.strings("targets", c.model.lora.targets);
}

// The key schema, collected once by a visitor over a default Config.
enum class FieldKind { Int, UInt64, Double, Bool, String, Choice, Datasets, Numbers, Derived, Strings, LrScales };

struct FieldInfo {
  std::string section;
  std::string key;
  FieldKind kind;
  std::string note;  // the formula of a derived key
};

const std::vector<FieldInfo>& schema();
const FieldInfo* find_field(const std::string& section, const std::string& key);
bool is_section(const std::string& name);
// " (did you mean model.hidden_size?)" for the closest known key within edit distance 2, or "".
// section empty: `key` is a top-level name (an unknown section or a key outside any section).
std::string suggest_key(const std::string& section, const std::string& key);

// model.rope_scaling (config_rope.cpp): the yarn attention_factor default, then the ranges and
// the keys each type uses; after the model's and data's checks.
void check_rope_scaling(Config& c);
// [lora] (config_lora.cpp): rank, alpha, the target names and the layouts LoRA supports; after
// finish_config.
void check_lora(Config& c);
// optimizer.lr_scale's patterns and scales (config_lora.cpp); whether each pattern matches a
// parameter is checked against the model's table when the run starts (optim/lr_scale.h).
void check_lr_scale(Config& c);
// model.prediction_heads and prediction_loss_weights (config_mtp.cpp): the weights' default and
// length, and what multi-token prediction does not combine with; after the other checks.
void check_prediction_heads(Config& c);
// training.fp8 (config_fp8.cpp): the widths the FP8 products need.
void check_fp8(const Config& c);

// Fills presets, defaults and derived values into a Config read from TOML (origin tells which
// keys were set), then checks ranges and consistency. Throws engine::Error via Config::where.
void finish_config(Config& c);

}  // namespace engine::config_detail
