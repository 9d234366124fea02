#include "checkpoint/hf_mtp.h"

#include "core/check.h"

namespace engine::hf {

std::string mtp_architecture(const ModelConfig& c) {
  if (c.family != ModelFamily::Llama)
    RAISE("model.prediction_heads = ", c.prediction_heads, ": a model with extra prediction heads exports only as "
          "Fast-LLM's MTP Llama (model.family \"llama\"), not as family \"", family_name(c.family), "\"");
  ModelConfig plain = c;
  plain.prediction_heads = 0;
  plain.prediction_loss_weights.clear();
  architecture(plain);  // llama's checks of everything else
  return "MTPLlamaForCausalLM";
}

void mtp_config_to_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["model_type"] = kMtpModelType;
  j["prediction_heads"] = c.prediction_heads + 1;
  // Fast-LLM's modeling files for trust_remote_code (the folder does not carry them).
  j["auto_map"] = {{"AutoConfig", "configuration_mtp_llama.MTPLlamaConfig"},
                   {"AutoModel", "modeling_mtp_llama.MTPLlamaModel"},
                   {"AutoModelForCausalLM", "modeling_mtp_llama.MTPLlamaForCausalLM"}};
}

void mtp_config_from_hf(const nlohmann::ordered_json& j, const std::string& path, ModelConfig& c) {
  if (!j.contains("prediction_heads") || !j["prediction_heads"].is_number_integer())
    RAISE(path, ": prediction_heads: an mtp_llama config needs an integer (the heads, the next-token one included)");
  const int64_t heads = j["prediction_heads"].get<int64_t>();
  if (heads < 2 || heads > 1 << 20)
    RAISE(path, ": prediction_heads: must be >= 2 (one head is a plain llama model: export it as one), got ", heads);
  c.prediction_heads = static_cast<int>(heads - 1);
}

void mtp_tensor_map(const ModelConfig& c, std::vector<TensorMap>& out) {
  const std::string last = "model.layers." + std::to_string(c.num_layers - 1) + ".";
  const std::string ours = "layers." + std::to_string(c.num_layers - 1) + ".";
  std::vector<TensorMap> block;  // the last layer's entries: each extra head has the same
  TensorMap norm;
  bool found_norm = false;
  for (TensorMap& m : out) {
    if (m.hf_name == "model.norm.weight") {
      m.hf_name = "model.mtp_norms.0.weight";
      norm = m;
      found_norm = true;
    }
    if (m.hf_name.rfind(last, 0) == 0) block.push_back(m);
  }
  ENSURE(found_norm && !block.empty(), "MTP Llama tensor map: no final norm or last layer to copy");
  for (int j = 1; j <= c.prediction_heads; ++j) {
    const std::string hf = "model.mtp_heads." + std::to_string(j - 1) + ".", p = "mtp." + std::to_string(j) + ".";
    for (TensorMap m : block) {
      m.hf_name = hf + m.hf_name.substr(last.size());
      for (std::string& name : m.params) {
        ENSURE(name.rfind(ours, 0) == 0, "MTP Llama tensor map: ", name, " is not of ", ours);
        name = p + name.substr(ours.size());
      }
      out.push_back(std::move(m));
    }
    TensorMap n = norm;
    n.hf_name = "model.mtp_norms." + std::to_string(j) + ".weight";
    n.params = {p + "norm.weight"};
    out.push_back(std::move(n));
  }
}

}  // namespace engine::hf
