// Multi-token prediction in Hugging Face form (model.prediction_heads > 0): Fast-LLM's MTP Llama
// (fast_llm_external_models/mtp_llama, MTPLlamaForCausalLM, model_type "mtp_llama"). config.json
// is LlamaConfig's keys plus "prediction_heads" = k + 1 (it counts the next-token head) and the
// auto_map of those modeling files; the tensors are llama's except that the final norm is
// model.mtp_norms.0 (there is no model.norm) and extra head j (1..k) is model.mtp_heads.{j-1}.*
// (a LlamaDecoderLayer's names: our mtp.{j}.*) with its norm model.mtp_norms.{j} (mtp.{j}.norm).
// Only the llama family has this format: other families with extra heads are refused naming
// model.prediction_heads. Imports take "prediction_heads" - 1 extra heads.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/hf.h"

namespace engine::hf {

inline constexpr const char* kMtpModelType = "mtp_llama";

// "MTPLlamaForCausalLM" after llama's checks (hf_config.cpp architecture) of the same model
// without extra heads; refuses any other family.
std::string mtp_architecture(const ModelConfig& c);
// model_type, prediction_heads and auto_map of an MTP Llama config.json (j has llama's keys).
void mtp_config_to_hf(const ModelConfig& c, nlohmann::ordered_json& j);
// config.json's prediction_heads (required, >= 2: a folder of one head is a llama folder) into c.
void mtp_config_from_hf(const nlohmann::ordered_json& j, const std::string& path, ModelConfig& c);
// llama's tensor map (out, of the model with c's extra heads) turned into MTP Llama's.
void mtp_tensor_map(const ModelConfig& c, std::vector<TensorMap>& out);

}  // namespace engine::hf
