// Multi-token prediction targets (model.prediction_heads, models/transformer.h): head j >= 1 at
// input position t of a sample predicts the token at t + 1 + j of the same document. A position
// trains head j only if
//   - t + 1 + j is one of the sample's S input positions and lies in the same document piece as t
//     (Sample::doc_lengths), so no head looks across a document boundary, whatever
//     data.cross_document_attention says about attention; the sample's extra token S (the last
//     label of head 0) is not used by the extra heads, since a sample does not record whether it
//     continues the last piece's document;
//   - the target token trains at all: loss_mask[t + j] (the mask of the position whose next
//     token it is), which is 0 on padding and inside loss-masking spans.
// Head 0 is the ordinary next-token label and loss mask (data/sampler.h), unchanged.
#pragma once
#include <cstdint>
#include <vector>

#include "data/sampler.h"

namespace engine {

// Head j's labels and mask over the sample's S positions (j >= 1); masked positions get label 0.
void prediction_targets(const Sample& s, int j, std::vector<int32_t>& labels, std::vector<uint8_t>& mask);
// The positions of the sample that train head j (the ones of the mask above; j = 0: loss_mask).
int64_t prediction_loss_tokens(const Sample& s, int j);

}  // namespace engine
