// Pre-norm transformer block on the residual stream:
//   h = x + attn(norm1(x));   y = h + mlp(norm2(h))
// Saved: everything attention, MLP and the norms need, plus h and y (y is the next block's x).
// The block's input x is a view of the previous block's saved output (or the embedding's), so
// a micro-batch's Saved structs must stay alive together until its backward.
// Gradients: dx written (=) (the residual stream adds both branches' input gradients to dy);
// parameter gradients accumulated (+=).
#pragma once
#include "layers/attention.h"
#include "layers/mlp.h"
#include "layers/norm.h"

namespace engine::layers {

struct BlockSaved {
  NormSaved norm1, norm2;
  Owned xn1, h, xn2, y;  // (T, C) each
  AttentionSaved attn;
  MlpSaved mlp;
};

class Block {
 public:
  Block() = default;
  Block(const ParamStore& store, int index, const ModelConfig& c);
  static void declare(ParamTable& t, int index, const ModelConfig& c);

  void forward(const Env& env, const Tensor& x, const SegmentInfo& seg, BlockSaved& s) const;
  void backward(const Env& env, const Tensor& dy, const Tensor& x, const SegmentInfo& seg,
                const BlockSaved& s, const Tensor& dx) const;

 private:
  Norm norm1_, norm2_;
  Attention attn_;
  Mlp mlp_;
};

}  // namespace engine::layers
