// A micro-batch on the compute device: B sequences of S positions packed as T = B * S rows,
// with the varlen layout (data/varlen.h) the attention needs.
#pragma once
#include <vector>

#include "core/buffer.h"
#include "data/sampler.h"
#include "data/varlen.h"
#include "layers/attention.h"

namespace engine {

struct MicroBatch {
  Owned tokens;      // (T) i32 inputs
  Owned labels;      // (T) i32 next tokens
  Owned loss_mask;   // (T) u8
  Owned positions;   // (T) i32, restarting per segment
  Owned cu_seqlens;  // (segments + 1) i32
  int max_seqlen = 0;
  int64_t num_tokens = 0;   // T
  int64_t loss_tokens = 0;  // tokens with loss_mask set

  layers::SegmentInfo segments() const { return {cu_seqlens, positions, max_seqlen}; }
};

MicroBatch make_micro_batch(const std::vector<const Sample*>& sequences, int sequence_length,
                            bool cross_document_attention, Device device);

}  // namespace engine
