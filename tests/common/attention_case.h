// One attention test case: sequence lengths packed into a batch, heads, head dim, masking. Shared
// by the CPU reference tests and the CUDA kernel tests so both describe cases the same way; also
// the chunks of such a batch for the separate-keys path (micro-sequences, attention_chunks).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "data/varlen.h"

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

// One chunk of a batch run as a micro-sequence: its queries are rows [begin, end) of the batch,
// its keys rows [key_begin, end) (kv holds exactly those), sequence s of the chunk owning query
// rows [begin + cu_q[s], begin + cu_q[s+1]) and key rows [key_begin + cu_k[s], ...).
struct AttentionChunk {
  int64_t begin = 0, end = 0, key_begin = 0;
  std::vector<int32_t> cu_q, cu_k;
  int max_q = 0, max_k = 0;
};

// The chunks [cuts[c], cuts[c+1]) of a batch of documents `lens` (cuts from 0 to the row count),
// from slice_varlen. With prefix, the keys of each chunk are all rows [0, end) (kv = the prefix
// of the batch), and the documents that ended before the chunk are sequences without queries.
inline std::vector<AttentionChunk> attention_chunks(const std::vector<int>& lens,
                                                    const std::vector<int64_t>& cuts, bool prefix) {
  VarlenLayout v;
  v.cu_seqlens.push_back(0);
  for (int len : lens) {
    for (int i = 0; i < len; ++i) {
      v.position_ids.push_back(i);
      v.segment.push_back(static_cast<int32_t>(v.cu_seqlens.size()) - 1);
    }
    v.cu_seqlens.push_back(v.cu_seqlens.back() + len);
    v.max_seqlen = std::max(v.max_seqlen, len);
  }
  std::vector<AttentionChunk> chunks;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    const VarlenSlice sl = slice_varlen(v, cuts[c], cuts[c + 1]);
    AttentionChunk ch{sl.begin,        sl.end,          sl.key_begin,   sl.cu_seqlens_q,
                      sl.cu_seqlens_k, sl.max_seqlen_q, sl.max_seqlen_k};
    if (prefix) {
      ch.key_begin = 0;
      ch.cu_q = {0};
      ch.cu_k = {0};
      for (size_t s = 0; s + 1 < v.cu_seqlens.size() && v.cu_seqlens[s + 1] <= sl.key_begin; ++s) {
        ch.cu_q.push_back(0);
        ch.cu_k.push_back(v.cu_seqlens[s + 1]);
        ch.max_k = std::max(ch.max_k, v.cu_seqlens[s + 1] - v.cu_seqlens[s]);
      }
      for (size_t s = 1; s < sl.cu_seqlens_q.size(); ++s) {
        ch.cu_q.push_back(sl.cu_seqlens_q[s]);
        ch.cu_k.push_back(static_cast<int32_t>(sl.key_begin) + sl.cu_seqlens_k[s]);
      }
    }
    chunks.push_back(std::move(ch));
  }
  return chunks;
}

}  // namespace engine::testing
