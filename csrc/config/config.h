// The run config: TOML (toml++) -> typed structs with defaults, validated as a whole.
// Every error names the file, the line and the key path, e.g.
//   run.toml:12: model.num_heads: must divide hidden_size (768), got 10
// Overrides `section.key=value` from the command line are applied before validation and are
// reported as coming from "<command line>". See README.md for the reference of every key.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ops/rope_params.h"

namespace engine {

enum class ModelFamily { GPT2, Llama, Mistral, Qwen2, Qwen3, Mixtral, Mamba, Hybrid, Qwen2Moe, Qwen3Moe, Mamba2 };
enum class NormKind { LayerNorm, RMSNorm };
enum class ActivationKind { GELU, SwiGLU };
enum class PositionKind { Learned, Rope };
enum class AttentionBackendKind { Flash, Cudnn };
enum class DeviceChoice { Auto, CPU, CUDA };
enum class DecayKind { Cosine, Linear, Constant };
enum class ScheduleKind { BreadthFirst, DepthFirst, OneFOneB };
// training.fp8: the linear layers' GEMMs in FP8 (layers/linear.h): off; tensorwise (one scale a
// tensor, e4m3 forward, e5m2 gradients); rowwise (one scale a row of each operand, e4m3 throughout).
enum class Fp8Recipe { Off, Tensorwise, Rowwise };
enum class DistillationKind { ForwardKL, ReverseKL, SoftCE };

struct RunConfig {
  std::string name = "run";
  std::string output_dir = "runs";  // the run directory is output_dir/name
  uint64_t seed = 1234;
  DeviceChoice device = DeviceChoice::Auto;
  int log_every = 1;                 // steps between log lines (metrics.jsonl gets every step)
  int debug_level = 0;               // 1: debug log lines; 2: also per-layer tensor statistics
  std::string debug_steps = "1";     // steps with statistics (debug_level 2): "1,5,10-12"
  // A fresh run (training.resume = "none") whose run directory holds an earlier run's
  // metrics.jsonl, debug_stats.jsonl or checkpoints is refused unless this is set; then those
  // files are removed before the run writes its own.
  bool overwrite = false;
  bool operator==(const RunConfig&) const = default;
};

// model.rope_scaling (a [model.rope_scaling] table, or rope_scaling.KEY = ... under [model]): the
// RoPE frequency scalings of transformers' rope_scaling / rope_parameters (ops/rope_params.h has
// the formulas). Keys a type does not use must keep their defaults.
struct RopeScalingConfig {
  RopeScalingKind type = RopeScalingKind::None;  // "none", "linear", "llama3", "yarn"
  double factor = 1.0;                    // context extension (linear, llama3, yarn)
  double low_freq_factor = 1.0;           // llama3
  double high_freq_factor = 4.0;          // llama3
  int original_max_position_embeddings = 0;  // the pretraining context (llama3, yarn; required)
  double beta_fast = 32.0;                // yarn
  double beta_slow = 1.0;                 // yarn
  double attention_factor = 1.0;          // yarn: default 0.1 ln(factor) + 1 (1 when factor <= 1)
  bool truncate = true;                   // yarn: integer correction range (transformers' default)
  bool operator==(const RopeScalingConfig&) const = default;
};

// Family presets fill the unset keys: gpt2 = layernorm, gelu, learned positions, biases, tied
// embeddings; llama = rmsnorm, swiglu, rope, no biases, untied; mistral = llama + sliding window;
// qwen2 = llama + biases on q, k and v only, norm_eps 1e-6; qwen3 = llama + qk_norm, norm_eps 1e-6,
// rope_theta 1e6 (the released Qwen3 models' base); mixtral = llama whose MLPs are
// mixtures of experts (8 experts, top 2, rope_theta 1e6); mamba = Mamba blocks only (tied
// embeddings); mamba2 = Mamba-2 blocks only (untied, mamba_d_state 128: Mamba2Config's defaults);
// hybrid = the per-layer mix that hybrid_layout spells (A, E, M, S, G as below);
// qwen2_moe = qwen2 whose MLPs are mixtures of experts with a shared expert (60 experts, top 4,
// weights not renormalised, shared expert of ffn_hidden_size features: Qwen2MoeConfig's
// defaults), every layer E unless hybrid_layout (A and E letters) says otherwise; qwen3_moe =
// qwen3 whose MLPs are mixtures of experts without a shared expert (128 experts, top 8, weights
// renormalised: the released Qwen3-MoE models' routing), layers as qwen2_moe's.
// [lora]: low-rank adapters on the named linears (layers/lora.h); rank 0 is off. With rank > 0
// every other parameter is frozen. Read from the [lora] section, held here because the layers
// declare the adapters.
struct LoraConfig {
  int rank = 0;
  double alpha = 8.0;  // scale = alpha / rank
  std::vector<std::string> targets = {"q", "v"};  // of q, k, v, o, gate, up, down (PEFT's Llama default)
  bool operator==(const LoraConfig&) const = default;
};

// init_from: a Hugging Face folder (config.json + safetensors): its config fills the unset keys
// (and must agree with the set ones) and its weights replace the random init.
// A vision encoder and its projector (layers/vision.h), for a vision-language model: the
// encoder's own sizes, independent of the text model's. layers == 0: none. Not config keys yet:
// set by the code that builds a vision-language model (the data path carries no images yet).
struct VisionConfig {
  int channels = 3, patch_size = 16;
  int width = 0, layers = 0, heads = 0, ffn = 0;  // the encoder's hidden size, blocks, heads, MLP features
  int text_width = 0;                             // the projector's output (the text model's hidden size)
  double norm_eps = 1e-5, rope_theta = 10000.0, init_std = 0.02;
  bool projector_bias = true;
  bool operator==(const VisionConfig&) const = default;
};

struct ModelConfig {
  ModelFamily family = ModelFamily::Llama;
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;       // default num_heads
  int head_dim = 0;           // default hidden_size / num_heads
  int ffn_hidden_size = 0;    // default 4 * hidden (gelu) or the Llama rule (swiglu)
  NormKind norm = NormKind::RMSNorm;
  double norm_eps = 1e-5;
  ActivationKind activation = ActivationKind::SwiGLU;
  PositionKind positions = PositionKind::Rope;
  int max_position_embeddings = 0;  // learned positions: table size (default sequence_length)
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;
  int sliding_window = 0;     // 0 = full causal attention
  // Not a config key: false for blocks whose attention sees every token of its sequence (an
  // image's patches in a vision encoder's blocks, set by the code that builds them).
  bool causal = true;
  // Not a config key yet: the vision encoder of a vision-language model (its features replace
  // the embeddings of the image tokens, models/transformer.h).
  VisionConfig vision;
  // CUDA attention kernels: the engine's flash kernels (cuda/attention/flash*) or cuDNN's fused
  // attention (cuda/attention/cudnn_sdpa, builds with cuDNN only). CPU tensors always run the
  // reference (ref/attention), whatever this says.
  AttentionBackendKind attention_backend = AttentionBackendKind::Flash;
  bool bias = false;          // biases in linear layers (and LayerNorm)
  bool qkv_bias = false;      // biases on the q, k, v projections only (Qwen2); implied by bias
  bool qk_norm = false;       // RMSNorm of each q and k head before RoPE (Qwen3, OLMo-2; ops/qk_norm.h)
  bool tie_embeddings = false;
  double init_std = 0.02;     // output projections get init_std / sqrt(2 * num_layers)
  double z_loss = 0.0;          // coefficient of lse^2 added to each token's loss (0: off)
  double label_smoothing = 0.0; // target (1 - eps) one-hot + eps / vocab_size (0: off)
  std::string init_from;      // Hugging Face folder to start from ("" = random init)
  // Block kinds, one letter per layer (family hybrid; qwen2_moe, qwen3_moe optionally, A and E; other
  // families imply it, block_layout()):
  //   A attention + MLP,  E attention + mixture of experts,  M Mamba mixer (no MLP, as HF Mamba),
  //   S Mamba-2 mixer (SSD, no MLP, as HF Mamba2),  G Gated DeltaNet + MLP (Qwen3-Next's
  //   linear-attention layer)
  std::string hybrid_layout;
  // Mixture of experts (E blocks); ffn_hidden_size is the A blocks' MLP.
  int num_experts = 0;           // default 8 where the layout has E blocks
  int experts_per_token = 2;     // top-k
  double moe_aux_loss_coef = 0.0;  // load balancing: coef * E * sum_e f_e P_e (layers/moe.h)
  double moe_z_loss_coef = 0.0;    // router z-loss: coef * mean lse^2
  double moe_jitter = 0.0;         // router input jitter in training (0 = off)
  int moe_ffn_hidden_size = 0;     // one routed expert's features (default ffn_hidden_size)
  int moe_shared_expert_ffn_size = 0;  // a dense SwiGLU expert on every token, gated by
                                       // sigmoid(x w), beside the routed ones (0 = none)
  bool moe_norm_topk_prob = true;  // top-k weights renormalised to sum 1 (Mixtral); false: the
                                   // softmax probabilities themselves (Qwen2-MoE)
  // Mamba (M blocks).
  int mamba_d_state = 16;
  int mamba_d_conv = 4;
  int mamba_expand = 2;        // d_inner = expand * hidden_size
  int mamba_dt_rank = 0;       // default ceil(hidden_size / 16)
  bool mamba_conv_bias = true;
  bool mamba_proj_bias = false;
  // Mamba-2 (S blocks; mamba_d_state, mamba_d_conv, mamba_expand and the two biases as above).
  int mamba_head_dim = 64;         // P: heads = expand x hidden_size / P
  int mamba_n_groups = 1;          // G groups of B and C, each read by heads / G heads
  double mamba_dt_limit_min = 0.0;  // the clamp of softplus(dt + dt_bias) (HF time_step_limit)
  double mamba_dt_limit_max = 0.0;  // 0: no upper limit
  bool mamba_norm_per_group = false;  // the gated norm over each group's channels (mamba_ssm's
                                      // Mamba2), not the whole inner width (transformers')
  // Gated DeltaNet (G blocks; Qwen3NextConfig's linear_* defaults).
  int gdn_num_key_heads = 16;     // Hk heads of q and k
  int gdn_num_value_heads = 32;   // Hv heads of v (a multiple of Hk)
  int gdn_key_head_dim = 128;     // dk
  int gdn_value_head_dim = 128;   // dv
  int gdn_conv_kernel = 4;        // the short causal conv over q, k, v
  LoraConfig lora;  // the [lora] section
  // Multi-token prediction (models/transformer.h, README "Multi-token prediction"): extra heads
  // j = 1..prediction_heads, each a block of the last block's kind on the trunk (the input of
  // the last block), its own final norm and the shared output projection, predicting the token
  // at t + 1 + j. prediction_loss_weights: w_0 (the next-token head) .. w_k; default all 1.
  int prediction_heads = 0;
  std::vector<double> prediction_loss_weights;
  bool operator==(const ModelConfig&) const = default;
};

struct DatasetRef {
  std::string path;     // prefix of .bin/.idx, a .fast_llm_dataset file, or a NAME.manifest.json of shards
  double weight = 1.0;  // blending weight (normalised over the list)
  int line = 0;         // source line, for error messages (0: from the command line)
  // The source line is not part of the value.
  bool operator==(const DatasetRef& o) const { return path == o.path && weight == o.weight; }
};

struct DataConfig {
  std::vector<DatasetRef> train;
  std::vector<DatasetRef> valid;     // empty: valid_fraction of train's documents, if > 0
  double valid_fraction = 0.0;
  int sequence_length = 0;
  bool truncate_documents = true;    // false: documents kept whole, sequences padded
  bool cross_document_attention = false;
  // Passes over a training dataset the run may make: more is refused before the first step
  // (a dataset shorter than a sequence, the wrong file); 0 = no limit. Over 1 is a warning.
  int max_epochs = 1000;
  // Text in and out of generation (--generate, training.sample_every; train/generate.h): "bytes"
  // (the byte-level ids of scripts/prepare_data.py), "ids" (prompts and output as token ids), a
  // tokenizer.json or a folder holding one; "" picks: model.init_from's tokenizer.json when there
  // is one, else bytes when vocab_size is 257, else ids.
  std::string tokenizer;
  bool operator==(const DataConfig&) const = default;
};

struct BatchConfig {
  int micro_batch_size = 1;   // sequences per micro-batch
  int global_batch_size = 1;  // sequences per optimizer step
  int accumulation_steps = 1; // derived: global / (micro * data_parallel), set at launch
  int micro_sequence_length = 0;  // tokens per micro-sequence (chunk of a sequence); 0: whole sequences
  bool operator==(const BatchConfig&) const = default;
};

// optimizer.lr_scale: an array of { pattern = "layers.*.attn.*", scale = 0.5 } tables; a
// parameter's learning rate is lr x the scale of the LAST pattern matching its name (glob, `*`
// any run of characters; optim/lr_scale.h), 1 where none matches. Scale 0 leaves it unchanged.
struct LrScale {
  std::string pattern;
  double scale = 1.0;
  bool operator==(const LrScale&) const = default;
};

struct OptimizerConfig {
  double lr = 3e-4;
  double min_lr = 0.0;
  int warmup_steps = 0;
  DecayKind decay = DecayKind::Cosine;
  int decay_steps = 0;  // steps from the end of warmup to min_lr; default training.steps - warmup
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
  std::vector<LrScale> lr_scale;  // per-parameter learning-rate scales (above)
  bool operator==(const OptimizerConfig&) const = default;
};

struct TrainingConfig {
  int steps = 0;
  int max_bad_steps = 3;  // consecutive steps with a non-finite loss or gradient norm (each one
                          // skipped, no update) after which the run stops with an error
  int eval_every = 0;  // 0 = no periodic validation
  int eval_steps = 1;  // global batches per validation
  int checkpoint_every = 0;  // steps between checkpoints (also one at the end and on SIGINT/SIGTERM); 0 = none
  int keep_checkpoints = 3;  // newest checkpoints kept; 0 = all
  std::string resume = "none";  // "none", "auto" (newest usable checkpoint of this run) or a path
  bool recompute_activations = false;  // keep only block outputs; recompute each block in backward
  Fp8Recipe fp8 = Fp8Recipe::Off;      // the linear layers' products in FP8 (above; README "FP8 training")
  // Every sample_every steps and at the last (0: never) rank 0 prints the greedy continuation of sample_prompt
  // (sample_tokens new tokens at most) with the current weights (train/generate.h).
  int sample_every = 0;
  std::string sample_prompt;
  int sample_tokens = 32;
  bool operator==(const TrainingConfig&) const = default;
};

// Parallel layout. data_parallel = world size / (tensor_parallel x pipeline_parallel) is derived
// at launch (the world size is not in the file).
struct DistributedConfig {
  int zero_stage = 0;  // 0: replicated; 1: optimizer state and master weights sharded over dp;
                       // 2: also gradients reduced onto their owners only; 3: also weights sharded, gathered per step
  // f32 gradient MiB per data-parallel reduction bucket (the weight gather's buckets: as many elements)
  double reduce_bucket_mb = 64.0;
  int tensor_parallel = 1;         // ranks splitting each layer (heads, ffn and vocabulary) Megatron style
  bool sequence_parallel = false;  // with tensor_parallel > 1: activations outside attention and MLP
                                   // sharded along tokens over the tensor-parallel group
  bool tp_overlap = true;          // tensor-parallel collectives beside the GEMMs (parallel/tensor_parallel.h)
  int cross_entropy_splits = 0;    // token chunks the LM head and loss run in (logits memory / N);
                                   // 0: the fewest keeping a chunk's logits within 1 GiB (below)
  int pipeline_parallel = 1;       // ranks the layers are split over (stages in sequence)
  int stages_per_rank = 1;         // pipeline stages per rank (interleaved: stage s on rank s % pp)
  ScheduleKind pipeline_schedule = ScheduleKind::BreadthFirst;  // micro-batch order (parallel/schedule.h)
  double timeout_s = 600;          // a step, validation or checkpoint save running longer ends the job (0: off)
  bool operator==(const DistributedConfig&) const = default;
};

// Knowledge distillation: a teacher model, run forward only, whose logits (at a temperature) are
// the student's targets (ops/loss.h has the formulas). teacher = "" is off.
struct DistillationConfig {
  std::string teacher;  // a Hugging Face folder (config.json) or a checkpoint folder (metadata.json)
  DistillationKind kind = DistillationKind::ForwardKL;
  double temperature = 1.0;   // divides the student's and the teacher's logits
  double weight = 1.0;        // of the distillation term
  double label_weight = 0.0;  // of the usual next-token cross-entropy (with model.z_loss)
  bool operator==(const DistillationConfig&) const = default;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  BatchConfig batch;
  OptimizerConfig optimizer;
  TrainingConfig training;
  DistributedConfig distributed;
  DistillationConfig distillation;

  std::string source;                       // file name the config came from
  std::map<std::string, std::string> origin;  // key path -> "file:line" or "<command line>"
  // "run.toml:12: model.num_heads: " for error messages about a key.
  // A key that was not set is reported at its section's header line (or the file alone).
  std::string where(const std::string& key) const;
  // True when the file or an override set the key (as opposed to a default or preset).
  bool is_set(const std::string& key) const { return origin.count(key) != 0; }
  // Compares the settings only (not source, origin or DatasetRef::line).
  bool operator==(const Config& o) const;
};

// Parses a TOML file plus overrides; throws engine::Error with file, line and key on any problem
// (syntax, unknown key, wrong type, out of range, inconsistent values). Relative dataset paths
// in the file are resolved against the config file's directory (load_config makes them
// absolute, so the effective config reloads from anywhere; parse_config leaves them as given
// when source_name has no directory); paths given as overrides stay relative to the cwd.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The checks that need the data-parallel size (known at launch): global_batch_size a multiple
// of micro_batch_size x data_parallel, and for the interleaved 1f1b schedule micro-batches per
// data-parallel rank in whole groups of pipeline_parallel. Throws naming the key; returns the
// micro-batches per data-parallel rank.
int micro_batches_per_rank(const Config& c, int data_parallel);
// distributed.cross_entropy_splits, or when 0 the fewest chunks of a micro-batch's (or
// micro-sequence's) tokens whose logits, in bf16 over this rank's vocabulary columns, fit
// 1 GiB: at a 128k vocabulary the whole micro-batch's logits would be several GiB at the peak
// of the step (the end of the forward, every activation still held).
int resolved_cross_entropy_splits(const Config& c);
// "1,5,10-12" -> {1, 5, 10, 11, 12}; throws on anything else (run.debug_steps).
std::set<int> parse_step_list(const std::string& text);
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});
// The effective config (defaults and derived values filled in), as TOML that loads back to the
// same Config.
std::string config_to_toml(const Config& c);

const char* family_name(ModelFamily f);
// The rope ops' parameters of a model (rope_theta and rope_scaling, validated).
ops::RopeParams rope_params(const ModelConfig& m);
// The families whose layout model.hybrid_layout spells: hybrid (A, E, M; required), qwen2_moe and
// qwen3_moe (A, E: dense layers among the sparse ones; empty = every layer E).
bool takes_hybrid_layout(ModelFamily f);
// One letter per layer (A, E or M, see ModelConfig::hybrid_layout) for any family.
std::string block_layout(const ModelConfig& m);
// The letter of one layer, and whether any layer is one of `letters` (e.g. "AE": any attention),
// without building the whole layout (num_layers may be anything a config says).
char block_letter(const ModelConfig& m, int layer);
bool has_block_kind(const ModelConfig& m, const char* letters);
// "" when every hybrid_layout letter is one the family takes, else the message naming the first other.
std::string layout_letters_error(const ModelConfig& m);

}  // namespace engine
