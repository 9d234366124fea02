// One attention test case: sequence lengths packed into a batch, heads, head dim, masking. Shared
// by the CPU reference tests and the CUDA kernel tests so both describe cases the same way.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace engine::testing {

struct AttentionCase {
  std::vector<int> lens;  // sequence lengths packed into one batch
  int heads, kv_heads, dim;
  bool causal;
  int window;
  float scale = 0.f;  // 0: 1 / sqrt(dim)
  std::string name() const {
    std::string s = "lens";
    for (int l : lens) s += " " + std::to_string(l);
    return s + ", H" + std::to_string(heads) + " Hkv" + std::to_string(kv_heads) + " D" +
           std::to_string(dim) + (causal ? " causal" : " full") + " window " +
           std::to_string(window) + (scale > 0 ? " scale " + std::to_string(scale) : "");
  }
  int64_t rows() const { return std::accumulate(lens.begin(), lens.end(), int64_t{0}); }
  int max_len() const { return lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end()); }
  float softmax_scale() const { return scale > 0 ? scale : 1.f / std::sqrt(static_cast<float>(dim)); }
};

}  // namespace engine::testing
