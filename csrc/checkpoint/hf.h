// Hugging Face conversion: a folder with config.json and model.safetensors (or
// model-0000i-of-0000n.safetensors + model.safetensors.index.json).
//   gpt2     GPT2LMHeadModel: transformer.wte / wpe, h.{i}.ln_1, attn.c_attn (q, k, v stacked),
//            attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, ln_f; lm_head tied. Its linears are Conv1D
//            modules whose weight is stored (in, out): transposed against ours (out, in).
//   llama    LlamaForCausalLM: model.embed_tokens, layers.{i}.input_layernorm,
//            self_attn.{q,k,v,o}_proj (+ biases with attention_bias), post_attention_layernorm,
//            mlp.{gate,up,down}_proj (+ biases with mlp_bias), model.norm, lm_head
//   mistral  MistralForCausalLM: llama's names, sliding_window
//   qwen2    Qwen2ForCausalLM: llama's names + q/k/v biases (never o), sliding window on all
//            layers or none
//   qwen3    Qwen3ForCausalLM: llama's names + self_attn.{q,k}_norm (D) = attn.q_norm, k_norm
//            (model.qk_norm), head_dim (default 128), no biases (attention_bias = true refused),
//            sliding window as qwen2
//   mixtral  MixtralForCausalLM: llama's names for embeddings, attention, norms and lm_head; per
//            layer block_sparse_moe.gate (E, C) = moe.router and, per expert j,
//            block_sparse_moe.experts.{j}.w1 (F, C) = moe.w_gate[j], w3 (F, C) = moe.w_up[j],
//            w2 (C, F) = moe.w_out[j] (each a contiguous block of our (E, ...) parameter).
//            router_aux_loss_coef c (counted when output_router_logits) is our
//            moe_aux_loss_coef / top_k (layers/moe.h); router_jitter_noise is moe_jitter (HF
//            also jitters the experts' input); the router z-loss has no key (export needs 0,
//            import gives 0).
//   qwen2_moe Qwen2MoeForCausalLM: qwen2's attention names; per E layer mlp.gate (E, C) =
//            moe.router, mlp.experts.{j}.{gate,up,down}_proj = moe.{w_gate,w_up,w_out}[j],
//            mlp.shared_expert.{gate,up,down}_proj = moe.shared.{w_gate,w_up,w_out},
//            mlp.shared_expert_gate (1, C) = moe.shared_gate; per A layer llama's mlp names.
//            The layer kinds: E where (i + 1) % decoder_sparse_step == 0 and i is not in
//            mlp_only_layers (model.hybrid_layout on import; exported as decoder_sparse_step 1
//            and the A layers as mlp_only_layers); moe_intermediate_size is
//            moe_ffn_hidden_size, shared_expert_intermediate_size moe_shared_expert_ffn_size
//            (> 0: HF always has the shared expert), norm_topk_prob moe_norm_topk_prob; the
//            aux loss as mixtral's (HF's load_balancing_loss_func is the same function); no
//            router jitter or z-loss (export needs 0).
//   qwen3_moe Qwen3MoeForCausalLM: qwen3's attention names (q_norm, k_norm, head_dim) and
//            qwen2_moe's MoE names and keys without the shared expert (a nonzero
//            shared_expert_intermediate_size is refused).
//   mamba    MambaForCausalLM: backbone.embeddings, layers.{i}.norm (= norm1), layers.{i}.mixer.
//            {in_proj (= [in_proj_x; in_proj_z]), conv1d (weight (Di, 1, K) = our (Di, K)),
//            x_proj, dt_proj (bias = dt_bias), A_log, D, out_proj} (+ in_proj / out_proj biases
//            with use_bias), backbone.norm_f, lm_head unless tied. RMSNorm, no norm biases.
//   hybrid   no Hugging Face architecture: export is an error naming model.family.
//   mtp_llama Fast-LLM's MTPLlamaForCausalLM (model.prediction_heads > 0, llama only): llama's
//            names, model.mtp_heads.{j-1}.* and model.mtp_norms.{j} for the extra heads,
//            model.mtp_norms.0 for the final norm (checkpoint/hf_mtp.h).
// Our RoPE pairs dimension i with i + D/2 ("rotate half"), as Hugging Face's Llama does, so q and
// k rows need no permutation. Linear weights are (out, in) on both sides except GPT-2's Conv1D.
// Export checks that the model is representable (e.g. llama has no sliding window, GPT-2 needs
// num_kv_heads = num_heads and head_dim x num_heads = hidden_size) and says which key is not.
// Import (model.init_from) takes the folder's structure; the training-only coefficients
// (init_std, moe_aux_loss_coef, moe_z_loss_coef, moe_jitter) fill unset keys but may be set to
// other values.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"

namespace engine::hf {

// "LlamaForCausalLM" etc., checking that the model can be written in that architecture.
std::string architecture(const ModelConfig& c);
// config.json text for a model; dtype "F32" or "BF16" (recorded as its torch name).
std::string hf_config_json(const ModelConfig& c, const std::string& dtype);
// model.init_from: reads <dir>/config.json into the unset [model] keys (recording the file as
// their origin) and checks that the set ones agree; throws naming the key and the file.
void apply_hf_config(Config& c);
// The ModelConfig a config.json describes (sizes and structure; everything else default).
ModelConfig model_from_hf_config(const std::string& config_json_path);

// One Hugging Face tensor and the parameters it holds: their rows stacked (dim 0) in order,
// transposed when `transpose` (GPT-2 Conv1D); or, with part_count > 0, elements
// [part_begin, part_begin + part_count) of the single parameter params[0] (Mixtral's experts).
// hf_shape may differ from ours where the elements are the same (Mamba's conv1d (Di, 1, K)).
// Each parameter is held exactly once: by one whole-parameter entry or by parts tiling it.
struct TensorMap {
  std::string hf_name;
  std::vector<std::string> params;
  bool transpose = false;
  std::vector<int64_t> hf_shape;
  int64_t part_begin = 0;
  int64_t part_count = 0;  // 0: whole parameters
};
std::vector<TensorMap> tensor_map(const ModelConfig& c);

struct ExportOptions {
  std::string dtype = "F32";                    // "F32" or "BF16"
  uint64_t shard_bytes = uint64_t{5} << 30;     // above this, sharded files and an index
};
// Writes the folder `out_dir` (atomically: a temporary sibling renamed into place; an existing
// export there is replaced, any other non-empty folder is an error). `fetch` gives parameter
// values by name (checkpoint::Fetch over `table`).
void export_hf(const ModelConfig& c, const ParamTable& table, const checkpoint::Fetch& fetch,
               const std::string& out_dir, const ExportOptions& options = {});

// The weights of a Hugging Face folder as parameter values of the model `c` describes: every
// expected tensor must be present with the expected shape, and nothing unexpected may be there
// (buffers such as rotary inv_freq and GPT-2's attn.bias masks are ignored).
class HfWeights {
 public:
  HfWeights(const std::string& dir, const ModelConfig& c);
  ~HfWeights();
  // Elements [lo, hi) of parameter p; a NaN or infinite value is an error naming the file, the
  // Hugging Face tensor, the parameter and the element.
  void fetch(const ParamSpec& p, int64_t lo, int64_t hi, float* out);
  checkpoint::Fetch fetcher() {
    return [this](const ParamSpec& p, int64_t lo, int64_t hi, float* out) { fetch(p, lo, hi, out); };
  }

 private:
  void read(const ParamSpec& p, int64_t lo, int64_t hi, float* out);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace engine::hf
