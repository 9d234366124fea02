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

}  // namespace engine
