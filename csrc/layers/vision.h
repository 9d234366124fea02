// Pixtral's vision encoder and the Llava projector (transformers' PixtralVisionModel and
// LlavaMultiModalProjector), over the patches of packed images:
//   x = patches W_patch^T        patches (N, C p p): each image's p x p patches in raster order,
//                                each flattened (channel, row, column) as the Conv2d weight
//                                (width, C, p, p) is: the patch convolution as a GEMM, no bias
//   x = rmsnorm(x)               ln_pre
//   x = blocks(x)                A blocks (layers/block.h): RMSNorm, attention bidirectional within
//                                each image with a 2-D RoPE over the patches' rows and columns,
//                                RMSNorm, SwiGLU MLP; heads of width / heads
//   f = gelu_erf(x W1^T + b1) W2^T + b2    the projector, to the text model's width
// The images are segments: SegmentInfo's cu_seqlens over the images, positions (N, 2) i32 each
// patch's row and column in its image. Saved: what each step's backward needs. Built on one rank
// so far: the blocks would split over tensor-parallel ranks as the text model's do, the patch
// GEMM and the projector run replicated, and none of it has run under tensor parallelism yet.
// Gradients: parameter gradients accumulated (+=); no gradient for the pixels.
#pragma once
#include <string>
#include <vector>

#include "layers/block.h"

namespace engine::layers {

using engine::VisionConfig;  // (config/config.h)

// The ModelConfig of the encoder's blocks: Llama-style (RMSNorm, SwiGLU, RoPE, no biases) with
// full attention within each image.
ModelConfig vision_block_config(const VisionConfig& v);

struct VisionSaved {
  Owned x0;                        // (N, width) patch embeddings
  NormSaved ln;
  Owned xn;                        // (N, width) after ln_pre: the first block's input
  std::vector<BlockSaved> blocks;  // blocks[i].y: block i's output
  Owned h, a;                      // (N, text_width) the projector's first linear, and gelu_erf of it
};

class VisionEncoder {
 public:
  VisionEncoder() = default;
  VisionEncoder(const ParamStore& store, const std::string& prefix, const VisionConfig& v);
  // prefix.patch_conv (width, C p p), prefix.ln_pre, prefix.layers.{i}.*, prefix.projector.w1
  // (text_width, width), .b1, .w2 (text_width, text_width), .b2.
  static void declare(ParamTable& t, const std::string& prefix, const VisionConfig& v);

  // features (N, text_width) from patches (N, C p p).
  void forward(const Env& env, const Tensor& patches, const SegmentInfo& images, VisionSaved& s,
               const Tensor& features) const;
  void backward(const Env& env, const Tensor& dfeatures, const Tensor& patches, const SegmentInfo& images,
                const VisionSaved& s) const;

 private:
  VisionConfig v_;
  Param patch_, w1_, b1_, w2_, b2_;
  Norm ln_pre_;
  std::vector<Block> blocks_;
};

}  // namespace engine::layers
