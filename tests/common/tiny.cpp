#include "tests/common/tiny.h"

#include <algorithm>

#include "tests/common/testing.h"

namespace engine::testing {

void set_tiny_mamba2(ModelConfig& c) {
  c.mamba_d_state = 3;
  c.mamba_d_conv = 3;
  c.mamba_expand = 2;   // Di 28 at hidden 14
  c.mamba_head_dim = 7;  // 4 heads
  c.mamba_n_groups = 2;  // 2 heads a group
  c.mamba_conv_bias = true;
}

void set_tiny_gdn(ModelConfig& c) {
  c.gdn_num_key_heads = 1;
  c.gdn_num_value_heads = 2;
  c.gdn_key_head_dim = 3;
  c.gdn_value_head_dim = 4;
  c.gdn_conv_kernel = 3;
}

void set_tiny_layout(ModelConfig& c, const std::string& layout) {
  c.hybrid_layout = layout;
  c.num_layers = static_cast<int>(layout.size());
  set_tiny_mamba2(c);
  set_tiny_gdn(c);
}

ModelConfig tiny_model(ModelFamily family) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 29;
  c.hidden_size = 14;
  c.num_layers = 2;
  c.init_std = 0.3;
  if (family == ModelFamily::GPT2) {
    c.num_heads = 3;
    c.num_kv_heads = 3;
    c.head_dim = 5;
    c.ffn_hidden_size = 19;
    c.norm = NormKind::LayerNorm;
    c.activation = ActivationKind::GELU;
    c.positions = PositionKind::Learned;
    c.max_position_embeddings = 23;
    c.bias = true;
    c.tie_embeddings = true;
  } else {
    c.num_heads = 6;
    c.num_kv_heads = 2;
    c.head_dim = 4;
    c.ffn_hidden_size = 17;
    c.norm = NormKind::RMSNorm;
    c.activation = ActivationKind::SwiGLU;
    c.positions = PositionKind::Rope;
    c.rope_theta = 100.0;
    c.bias = false;
    c.tie_embeddings = false;
    if (family == ModelFamily::Mistral) c.sliding_window = 3;
    if (family == ModelFamily::Qwen3) {  // head_dim x num_heads (36) != hidden_size, tied as Qwen3-0.6B
      c.head_dim = 6;
      c.qk_norm = true;
      c.norm_eps = 1e-6;
      c.tie_embeddings = true;
    }
    if (family == ModelFamily::Qwen3Moe) {  // q/k norms, head_dim 2 x 6 heads != hidden_size
      c.head_dim = 2;
      c.qk_norm = true;
      c.norm_eps = 1e-6;
    }
  }
  if (family == ModelFamily::Mixtral || family == ModelFamily::Hybrid) {
    c.num_experts = 3;
    c.experts_per_token = 2;
    c.moe_aux_loss_coef = 0.05;
    c.moe_z_loss_coef = 0.01;
  }
  if (family == ModelFamily::Mamba || family == ModelFamily::Hybrid) {
    c.mamba_d_state = 4;
    c.mamba_d_conv = 3;
    c.mamba_expand = 2;
    c.mamba_dt_rank = 2;
  }
  if (family == ModelFamily::Mamba2) set_tiny_mamba2(c);
  if (family == ModelFamily::Qwen2Moe) {  // a dense and a sparse layer, a shared expert, raw weights
    c.qkv_bias = true;
    c.hybrid_layout = "AE";
    c.num_experts = 3;
    c.experts_per_token = 2;
    c.moe_aux_loss_coef = 0.05;
    c.moe_ffn_hidden_size = 11;
    c.moe_shared_expert_ffn_size = 9;
    c.moe_norm_topk_prob = false;
  }
  if (family == ModelFamily::Qwen3Moe) {  // a sparse and a dense layer, renormalised top-k weights
    c.hybrid_layout = "EA";
    c.num_experts = 4;
    c.experts_per_token = 2;
    c.moe_aux_loss_coef = 0.05;
    c.moe_ffn_hidden_size = 7;
  }
  if (family == ModelFamily::Mamba) c.tie_embeddings = true;
  if (family == ModelFamily::Hybrid) {
    c.num_layers = 3;
    c.hybrid_layout = "MEA";
  }
  return c;
}

void randomize_weights(ParamStore& store, const std::string& name, double std) {
  Tensor w = store.weights_flat();
  PhiloxKey key = test_key(name);
  for (int64_t i = 0; i < w.numel(); ++i) set(w, i, std * philox_normal(key, static_cast<uint64_t>(i)));
  if (store.table().frozen_elements() == 0) return;
  Tensor f = store.frozen_flat();  // frozen weights (LoRA's base), from a stream of their own
  PhiloxKey fkey = test_key(name + ":frozen");
  for (int64_t i = 0; i < f.numel(); ++i) set(f, i, std * philox_normal(fkey, static_cast<uint64_t>(i)));
}

Sample make_sample(const std::vector<int32_t>& doc_lengths, int vocab, const std::string& name) {
  Sample s;
  int32_t S = 0;
  for (int32_t l : doc_lengths) S += l;
  PhiloxKey key = test_key(name);
  for (int32_t i = 0; i <= S; ++i)
    s.tokens.push_back(static_cast<int32_t>(philox_below(key, static_cast<uint64_t>(i), static_cast<uint64_t>(vocab))));
  for (int32_t i = 0; i < S; ++i) s.loss_mask.push_back(philox_below(key, 1000 + static_cast<uint64_t>(i), 5) != 0);
  s.doc_lengths = doc_lengths;
  return s;
}

TwoImages two_images() {
  TwoImages im{empty({3}, DType::I32, Device::CPU), empty({8, 2}, DType::I32, Device::CPU), {}};
  const int32_t cu[] = {0, 6, 8}, pos[] = {0, 0, 0, 1, 0, 2, 1, 0, 1, 1, 1, 2, 0, 0, 0, 1};
  std::copy(cu, cu + 3, im.cu.ptr<int32_t>());
  std::copy(pos, pos + 16, im.pos.ptr<int32_t>());
  im.seg.cu_seqlens = im.cu;
  im.seg.positions = im.pos;
  im.seg.max_seqlen = 6;
  return im;
}

}  // namespace engine::testing
