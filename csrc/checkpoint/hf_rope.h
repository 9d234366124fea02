// config.json's RoPE keys <-> model.rope_theta and model.rope_scaling (internal to
// csrc/checkpoint; hf_config.cpp calls these). transformers 4.x writes rope_theta at the top and
// the scaling as rope_scaling {rope_type (or the legacy "type"), factor, ...}; 5.x writes
// rope_parameters {rope_type, rope_theta, factor, ...}. Both are read (where both are given they
// must agree) and both are written.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace engine::hf {

struct HfRope {
  double theta = 10000.0;
  RopeScalingConfig scaling;
};

// The RoPE of config.json `j` (read from `path`, named in errors): `theta` when no key gives it;
// max_position_embeddings stands in for yarn's original_max_position_embeddings when that is
// missing (as transformers does). Scalings other than default, linear, llama3 and yarn, and keys
// the engine cannot represent, are refused naming the key.
HfRope rope_from_hf(const nlohmann::ordered_json& j, const std::string& path, double theta,
                    int64_t max_position_embeddings);
// Writes rope_theta, rope_parameters and (scaled RoPE) rope_scaling of `c` into `j`.
void rope_to_hf(nlohmann::ordered_json& j, const ModelConfig& c);

}  // namespace engine::hf
