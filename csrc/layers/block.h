// Pre-norm blocks on the residual stream, one of three kinds per layer (config.h block_layout):
//   A (attention + MLP):               h = x + attn(norm1(x));   y = h + mlp(norm2(h))
//   E (attention + mixture of experts): h = x + attn(norm1(x));   y = h + moe(norm2(h))
//   M (Mamba, as HF MambaBlock):        y = x + mamba(norm1(x))
//   S (Mamba-2, as HF Mamba2Block):     y = x + mamba2(norm1(x))
//   G (Gated DeltaNet):                 h = x + gdn(norm1(x));    y = h + mlp(norm2(h))   (Qwen3-Next's
//                                       linear-attention layers, whose MLP is dense here)
// Saved: everything the branches and the norms need, plus h and y (y is the next block's x).
// The block's input x is a view of the previous block's saved output (or the embedding's), so
// a micro-batch's Saved structs must stay alive together until its backward.
// E blocks add their router's auxiliary losses (layers/moe.h) to the training loss: forward
// leaves their value in aux_loss(), and backward takes d(loss)/d(aux) as aux_grad_scale.
// Gradients: dx written (=) (the residual stream adds both branches' input gradients to dy);
// parameter gradients accumulated (+=).
#pragma once
#include "layers/attention.h"
#include "layers/delta.h"
#include "layers/mamba.h"
#include "layers/mamba2.h"
#include "layers/mlp.h"
#include "layers/moe.h"
#include "layers/norm.h"

namespace engine::layers {

enum class BlockKind { Attention, Experts, Mamba, Mamba2, DeltaNet };
BlockKind block_kind(const ModelConfig& c, int layer);
MoeConfig moe_config(const ModelConfig& c);
MambaConfig mamba_config(const ModelConfig& c);
Mamba2Config mamba2_config(const ModelConfig& c);
DeltaNetConfig deltanet_config(const ModelConfig& c);

struct BlockSaved {
  NormSaved norm1, norm2;
  Owned xn1, h, xn2, y;  // (T, C) each (M and S blocks: xn1 and y)
  AttentionSaved attn;
  MlpSaved mlp;
  MoeSaved moe;
  MambaSaved mamba;
  Mamba2Saved mamba2;
  DeltaNetSaved gdn;
};

// Text generation: a block's state for one sequence (the attention's or a mixer's).
struct BlockCache {
  AttentionCache attn;
  MambaCache mamba;
  Mamba2Cache mamba2;
  DeltaNetCache gdn;
};

class Block {
 public:
  Block() = default;
  Block(const ParamStore& store, int index, const ModelConfig& c);
  static void declare(ParamTable& t, int index, const ModelConfig& c);
  // A block of kind `kind` whose parameters are named under `prefix` ("layers.{i}" above; the
  // extra heads of multi-token prediction use "mtp.{j}", models/transformer.h).
  Block(const ParamStore& store, const std::string& prefix, BlockKind kind, const ModelConfig& c);
  static void declare(ParamTable& t, const std::string& prefix, BlockKind kind, const ModelConfig& c);

  BlockKind kind() const { return kind_; }
  // jitter_seed: the MoE router's input jitter (0: none, as in evaluation; see layers/moe.h).
  void forward(const Env& env, const Tensor& x, const SegmentInfo& seg, BlockSaved& s,
               uint64_t jitter_seed = 0) const;
  // Output-bias gradients without a pass of their own: the bias added at a branch's output has
  // gradient sum_t (the branch's output gradient), and that gradient is what a residual norm
  // backward writes, so the norm backward sums it as it writes it (ops/norm.h dx_colsum). Inside
  // the block, norm2's backward writes dh and sums it into the attention's output bias.
  //
  // backward writes dx and every parameter gradient of the block; dx_colsum (optional) is a
  // second output: += sum_t dx. Blocks in a stack pass it on: block i's dx is block i - 1's dy, so
  // block i's dx_colsum is block i - 1's out_bias_grad(), and block i - 1 then runs
  // backward_except_out_bias (models/transformer.cpp).
  void backward(const Env& env, const Tensor& dy, const Tensor& x, const SegmentInfo& seg,
                const BlockSaved& s, const Tensor& dx, float aux_grad_scale = 0.f,
                const Tensor& dx_colsum = {}) const;
  // backward but for out_bias_grad() += sum_t dy, which the caller already added.
  void backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& x,
                                const SegmentInfo& seg, const BlockSaved& s, const Tensor& dx,
                                float aux_grad_scale = 0.f, const Tensor& dx_colsum = {}) const;
  // The gradient of the bias added at the block's output (the MLP's or a Mamba mixer's output
  // projection), undefined where there is none (mixture of experts, no biases).
  Tensor out_bias_grad() const;
  // The auxiliary losses of a forward (E blocks; 0 otherwise), on the host (synchronises).
  double aux_loss(const BlockSaved& s) const;

  // One-token decode (layers/decode.cpp): y (1, C) = the block of x (1, C), the next token of the
  // sequence whose state `cache` holds, at position `position` ((1) i32 on the device); the
  // cache moves on by this token. MLPs and experts run their forward on the one row (no jitter).
  void decode(const Env& env, const Tensor& x, const Tensor& position, BlockCache& cache,
              const Tensor& y) const;
  BlockCache new_cache(const Env& env, int64_t capacity) const;

 private:
  BlockKind kind_ = BlockKind::Attention;
  Norm norm1_, norm2_;
  Attention attn_;
  Mlp mlp_;
  Moe moe_;
  Mamba mamba_;
  Mamba2 mamba2_;
  DeltaNet gdn_;
};

}  // namespace engine::layers
