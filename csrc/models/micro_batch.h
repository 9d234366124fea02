// A micro-batch on the compute device: B sequences of S positions packed as T = B * S rows,
// with the varlen layout (data/varlen.h) the attention needs.
#pragma once
#include <memory>
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
  // Micro-sequences: this is chunk `chunk` of `chunks` of one micro-batch, rows [row_begin,
  // row_begin + T) of it; its queries also see the keys of rows [key_begin, row_begin) (the
  // starts of its segments in earlier chunks). The chunks of a micro-batch share `kv`.
  int chunk = 0, chunks = 1;
  int64_t row_begin = 0, key_begin = 0;
  Owned cu_seqlens_k;  // (segments + 1) i32 offsets into rows [key_begin, row_begin + T)
  int max_seqlen_k = 0;
  std::shared_ptr<layers::KvChunks> kv;
  // Multi-token prediction (models/prediction_targets.h): entry j - 1 holds extra head j's (T)
  // labels (i32) and loss mask (u8), and its loss tokens in this micro-batch. grad_scale: 1 / the
  // global batch's loss tokens of head j, set by the caller before a forward with gradients (as
  // the forward's grad_scale is for head 0).
  std::vector<Owned> mtp_labels, mtp_mask;
  std::vector<int64_t> mtp_loss_tokens;
  std::vector<float> mtp_grad_scale;
  uint64_t jitter_seed = 0;  // the MoE router jitter of this micro-batch (chunk) in training; 0: none
  // Images of a vision-language model (ModelConfig::vision; undefined: none). patches (P, C p p)
  // the activations' dtype: every image's patches in raster order, images one after another, each
  // flattened as layers/vision.h says; image_cu (images + 1) i32: where each image's patches
  // start; patch_positions (P, 2) i32: a patch's row and column in its image; image_rows (P, 1)
  // i32: the token row whose input embedding the patch's feature replaces (an image token of the
  // same sequence). The images are the micro-batch's whole (micro-sequences do not split them).
  Owned patches, image_cu, patch_positions, image_rows;
  int max_image_patches = 0;
  int64_t num_patches() const { return patches.t.data ? patches->size(0) : 0; }

  // forward_only: no backward follows (evaluation, a teacher): the last chunk releases the
  // micro-batch's keys and values as it goes.
  layers::SegmentInfo segments(bool forward_only = false) const {
    return {cu_seqlens, positions,    max_seqlen, kv.get(),
            cu_seqlens_k, max_seqlen_k, row_begin, key_begin, forward_only && chunk + 1 == chunks};
  }
};

// prediction_heads: the extra heads of multi-token prediction whose targets to build (0: none).
MicroBatch make_micro_batch(const std::vector<const Sample*>& sequences, int sequence_length,
                            bool cross_document_attention, Device device, int prediction_heads = 0);

// The same micro-batch as consecutive chunks of `chunk_rows` token rows each (micro-sequences;
// chunk_rows divides the B * S rows), to run forward in order and backward in reverse.
// chunk_rows >= B * S gives the one whole micro-batch.
std::vector<MicroBatch> make_micro_sequences(const std::vector<const Sample*>& sequences, int sequence_length,
                                             bool cross_document_attention, Device device, int64_t chunk_rows,
                                             int prediction_heads = 0);

// The MoE router jitter of a training micro-batch (chunk `chunk` of the samples from
// first_sample on): a pure function of (seed, first sample, chunk), so any layout and a resumed
// run draw the same noise for the same tokens; never 0 (0 means no jitter).
uint64_t router_jitter_seed(uint64_t seed, int64_t first_sample, int chunk);

}  // namespace engine
