// The one place where document boundaries of a packed micro-batch become what the layers need.
// A micro-batch is B sequences of S positions, packed as T = B * S token rows. Attention
// segments are the documents (data.cross_document_attention = false) or whole sequences (true);
// positions restart at each segment start, so no token sees or is placed relative to another
// document. Padding is a segment of its own and carries no loss.
#pragma once
#include <cstdint>
#include <vector>

#include "data/sampler.h"

namespace engine {

struct VarlenLayout {
  std::vector<int32_t> cu_seqlens;    // (num_segments + 1) offsets into the T rows
  int32_t max_seqlen = 0;             // longest segment
  std::vector<int32_t> position_ids;  // (T) position of each token within its segment
  std::vector<int32_t> segment;       // (T) segment index of each token
};

VarlenLayout build_varlen(const std::vector<const Sample*>& sequences, int sequence_length,
                          bool cross_document_attention);

// Rows [begin, end) of a micro-batch as the queries of one chunk (micro-sequences, sequence-
// parallel shards). A query's keys are the rows of its segment up to itself, which may lie in
// earlier chunks: keys of the chunk are rows [key_begin, end) of the whole batch, and within
// each segment the queries are the last rows of its keys (causal attention aligned at the end).
struct VarlenSlice {
  int64_t begin = 0, end = 0;         // query rows of the whole batch
  int64_t key_begin = 0;              // first key row: start of the first segment touched
  std::vector<int32_t> cu_seqlens_q;  // (n + 1) offsets into the chunk's rows [begin, end)
  std::vector<int32_t> cu_seqlens_k;  // (n + 1) offsets into the rows [key_begin, end)
  int32_t max_seqlen_q = 0, max_seqlen_k = 0;
  std::vector<int32_t> position_ids;  // (end - begin) the whole batch's positions of these rows
  std::vector<int32_t> segment;       // (end - begin) segment index within this slice
};

VarlenSlice slice_varlen(const VarlenLayout& layout, int64_t begin, int64_t end);

}  // namespace engine
