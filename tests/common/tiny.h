// Tiny model configs and batches for tests: distinct, non-round sizes for every dimension
// (hidden != ffn != vocab != heads x head_dim) so a swapped dimension fails instead of hiding.
#pragma once
#include <vector>

#include "config/config.h"
#include "core/params.h"
#include "data/sampler.h"
#include "layers/attention.h"

namespace engine::testing {

// family presets as the config parser applies them, with tiny sizes.
ModelConfig tiny_model(ModelFamily family);
// The Mamba-2 keys of tiny_model(Mamba2): 4 heads of 7 in 2 groups of 3 states (for hybrid
// layouts with S blocks too).
void set_tiny_mamba2(ModelConfig& c);
// The Gated DeltaNet keys of a tiny model with G blocks: 2 value heads of 4 over a key head of 3.
void set_tiny_gdn(ModelConfig& c);
// A hybrid layout in place of tiny_model(Hybrid)'s (num_layers its length), with the tiny
// Mamba-2 and Gated DeltaNet keys.
void set_tiny_layout(ModelConfig& c, const std::string& layout);

// Overwrites every weight with normal(0, std) from the test seed (so biases and norm weights are
// generic, not 0 and 1, in gradient checks).
void randomize_weights(ParamStore& store, const std::string& name, double std = 0.3);

// A sample of S positions made of the given document lengths (sum = S), random tokens below
// vocab, the loss mask with a few zeros.
Sample make_sample(const std::vector<int32_t>& doc_lengths, int vocab, const std::string& name);

// Two images of 2 x 3 and 1 x 2 patches in raster order as the segments of a vision encoder's
// blocks: cu_seqlens {0, 6, 8} and each patch's (row, column), on the CPU (seg views them).
struct TwoImages {
  Owned cu, pos;
  layers::SegmentInfo seg;
};
TwoImages two_images();

}  // namespace engine::testing
