// training.fp8 (layers/linear.h, README "FP8 training"): Hopper's FP8 products (ops/fp8.h) take
// K and N, the contracted and the output widths, in multiples of 16. Each linear layer that runs
// in FP8 contracts over its input width (forward), its output width (input gradient) and the
// micro-batch's tokens (weight gradient), so every one of those, per tensor-parallel rank, must
// be a multiple of 16. The check is the same on the CPU, so a config tried there runs on the GPU.
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_fields.h"
#include "core/check.h"

namespace engine {
namespace config_detail {

void check_fp8(const Config& c) {
  if (c.training.fp8 == Fp8Recipe::Off) return;
  const ModelConfig& m = c.model;
  const int64_t tp = c.distributed.tensor_parallel;
  const std::string layout = block_layout(m);
  const bool attention = layout.find_first_of("AE") != std::string::npos;
  const bool mlp = layout.find_first_of("AG") != std::string::npos;
  const bool mamba = layout.find_first_of("MS") != std::string::npos;
  struct Width {
    std::string what;
    int64_t value;
  };
  std::vector<Width> widths = {{"model.hidden_size", m.hidden_size}};
  if (attention) {
    widths.push_back({"model.num_heads x head_dim / tensor_parallel", int64_t{m.num_heads} * m.head_dim / tp});
    widths.push_back({"model.(num_heads + 2 x num_kv_heads) x head_dim / tensor_parallel",
                      (int64_t{m.num_heads} + 2 * int64_t{m.num_kv_heads}) * m.head_dim / tp});
  }
  if (mlp) widths.push_back({"model.ffn_hidden_size / tensor_parallel", m.ffn_hidden_size / tp});
  if (m.moe_shared_expert_ffn_size > 0 && layout.find('E') != std::string::npos)
    widths.push_back({"model.moe_shared_expert_ffn_size / tensor_parallel", m.moe_shared_expert_ffn_size / tp});
  if (mamba) widths.push_back({"model.mamba_expand x hidden_size / tensor_parallel", int64_t{m.mamba_expand} * m.hidden_size / tp});
  if (layout.find('S') != std::string::npos) {  // Mamba-2's in_proj writes [z | x | B | C | dt]
    const int64_t inner = int64_t{m.mamba_expand} * m.hidden_size;
    widths.push_back({"model.(2 x mamba_expand x hidden_size + 2 x mamba_n_groups x mamba_d_state + heads) / "
                      "tensor_parallel",
                      (2 * inner + 2 * int64_t{m.mamba_n_groups} * m.mamba_d_state + inner / m.mamba_head_dim) / tp});
  }
  if (layout.find('G') != std::string::npos) {  // Gated DeltaNet's in_proj writes [q | k | v | z | b | a]
    const int64_t qk = int64_t{m.gdn_num_key_heads} * m.gdn_key_head_dim, v = int64_t{m.gdn_num_value_heads} * m.gdn_value_head_dim;
    widths.push_back({"model.(2 x gdn_num_key_heads x gdn_key_head_dim + 2 x gdn_num_value_heads x "
                      "(gdn_value_head_dim + 1)) / tensor_parallel",
                      (2 * qk + 2 * v + 2 * int64_t{m.gdn_num_value_heads}) / tp});
    widths.push_back({"model.gdn_num_value_heads x gdn_value_head_dim / tensor_parallel", v / tp});
  }
  const int msl = c.batch.micro_sequence_length;
  widths.push_back(msl > 0 ? Width{"batch.micro_sequence_length", msl}
                           : Width{"batch.micro_batch_size x data.sequence_length",
                                   int64_t{c.batch.micro_batch_size} * c.data.sequence_length});
  for (const Width& w : widths)
    if (w.value % 16 != 0)
      RAISE(c.where("training.fp8"), "\"", c.training.fp8 == Fp8Recipe::Tensorwise ? "tensorwise" : "rowwise",
            "\" needs every width an FP8 product contracts or writes to be a multiple of 16 (the GPU's FP8 "
            "matrix product takes no other): ", w.what, " = ", w.value, "; use training.fp8 = \"off\" or change it");
}

}  // namespace config_detail
}  // namespace engine
