// Mamba and Mamba-2 in Hugging Face form. Mamba: MambaForCausalLM, model_type "mamba",
// MambaConfig's keys (time_step_rank "auto" = ceil(hidden_size / 16); intermediate_size must be
// expand x hidden_size).
// Mamba-2: Mamba2ForCausalLM, model_type "mamba2", Mamba2Config's keys;
// num_heads x head_dim must be expand x hidden_size (the mixer's reshapes need it), rms_norm
// true (the gated norm), hidden_act silu; time_step_limit (min, max) is the delta clamp, max
// Infinity (as Python's json writes float("inf"); transformers 5's save_pretrained writes
// {"__float__": "Infinity"}, also read) when there is none. Keys that do not change the
// model (chunk_size: the kernels' chunks; time_step_rank: unused by the mixer; residual_in_fp32;
// the dt init range) are read as the engine does them or not at all; keys with values it cannot
// represent are refused, naming the key. transformers' gated norm spans the whole inner width;
// mamba_ssm's Mamba2 (with which the published n_groups > 1 checkpoints were trained) normalises
// each group: importing one of those, set model.mamba_norm_per_group = true (config.json has no
// key for it, so the import cannot tell); an export with it and n_groups > 1 is refused.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace engine::hf {

// config.json text with the bare tokens Infinity, -Infinity and NaN outside strings (Python's
// json writes them; JSON has no such numbers) turned into the strings "Infinity", "-Infinity",
// "NaN", so that the file parses and a reader can refuse or take them by name.
std::string json_nonfinite_as_strings(const std::string& text);
// The strings back into bare tokens after a dump (of what mamba2_config_to_hf wrote).
std::string json_nonfinite_as_tokens(const std::string& text);

// MambaConfig's keys of c (family mamba) into j; a mamba config.json into c.
void mamba_config_to_hf(const ModelConfig& c, nlohmann::ordered_json& j);
void mamba_config_from_hf(const nlohmann::ordered_json& j, const std::string& path, ModelConfig& c);
// Mamba2Config's keys of c (family mamba2) into j.
void mamba2_config_to_hf(const ModelConfig& c, nlohmann::ordered_json& j);
// A mamba2 config.json (j, read from path) into c.
void mamba2_config_from_hf(const nlohmann::ordered_json& j, const std::string& path, ModelConfig& c);

}  // namespace engine::hf
