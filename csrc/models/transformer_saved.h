// Internal to csrc/models: what a Transformer keeps of one stage's forward for its backward
// (transformer.cpp, and the extra heads of multi-token prediction in mtp.cpp).
#pragma once
#include "layers/vision.h"
#include "models/transformer.h"

namespace engine {

// One stage's activations for one micro-batch (the whole-model forward keeps one per stage).
struct Transformer::TSaved : Model::Saved {
  Tensor input;                           // the stage's input (stage > 0), owned by the caller
  Owned x0;                               // embedding output (stage 0), with the image features placed
  layers::VisionSaved vision;             // the vision encoder's activations (stage 0, with images)
  std::vector<layers::BlockSaved> blocks;
  layers::HeadSaved head;
  std::vector<layers::BlockSaved> mtp;    // multi-token prediction: extra head j's block at j - 1
  std::vector<layers::HeadSaved> mtp_head;
  Owned input_grad;                       // the gradient of `input` after backward (stage > 0)
  float aux_grad_scale = 0.f;             // d(loss) / d(MoE auxiliary losses) of this micro-batch
  uint64_t jitter_seed = 0;               // the MoE jitter of the forward (recomputed alike)
  std::vector<std::unique_ptr<TSaved>> stages;  // forward()/backward(): every stage's
};

}  // namespace engine
