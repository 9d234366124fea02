// Gated DeltaNet mixer, as Hugging Face's Qwen3NextGatedDeltaNet, over packed varlen batches
// (documents never exchange state):
//   [q | k | v | z | b | a] = xn W_in^T              one GEMM over the adjacent in_proj_{q,k,v,z,b,a}
//   [q | k | v] = silu(causal_conv1d([q | k | v]))   depthwise, kernel K, no bias, per document
//   o = gated_delta(q, k, v, a, b, A_log, dt_bias)   l2-normed q and k, the gated delta rule (ops/delta.h)
//   y_n = weight rmsnorm_head(o) silu(z)             per value head of dv channels (norm before gate)
//   y = y_n W_out^T
// Hk key heads of dk channels (q and k), Hv value heads of dv channels (v, z, o), Hv a multiple of
// Hk; b and a one column per value head.
// Parameters under the prefix (full shapes): in_proj_q, in_proj_k (Hk dk, C), in_proj_v,
// in_proj_z (Hv dv, C), in_proj_b, in_proj_a (Hv, C); conv_q, conv_k (Hk dk, K), conv_v (Hv dv, K);
// dt_bias, A_log (Hv); norm (dv), shared by the heads; out_proj (C, Hv dv). (Qwen3-Next's
// in_proj_qkvz and in_proj_ba interleave these per key head; a converter reorders them.)
// Init (layout independent, core/params.h): in_proj normal(init_std), out_proj
// normal(init_std / sqrt(num_layers)); conv U(+-1/sqrt(K)); dt_bias = 1 (Qwen3-Next's);
// A_log[h] = log(h + 1); norm = 1. No weight decay on A_log, dt_bias and the norm.
// Saved: the in_proj output (T, 2 Hk dk + 2 Hv dv + 2 Hv), o (T, Hv dv) and the norm's rstd (T,
// Hv); the conv output and y_n are recomputed by backward. xn is kept by the caller. Gradients:
// dxn written (=); parameter gradients accumulated (+=).
// Tensor parallelism (parallel/tensor_parallel.h): key and value heads split (each rank's value
// heads read its own key heads); in_proj column-parallel (each of q, k, v, z, b, a split,
// adjacent per rank), conv, dt_bias and A_log split along their channels, out_proj row-parallel;
// the norm weight replicated, its gradient summed over the group (each rank's covers its heads).
// With sequence parallelism xn, y, dy, dxn are the rank's token shard; the mixer runs on all tokens.
#pragma once
#include <string>

#include "layers/attention.h"
#include "layers/common.h"
#include "ops/delta.h"

namespace engine::layers {

struct DeltaNetConfig {
  int64_t hidden = 0;      // C
  int64_t key_heads = 16;  // Hk
  int64_t value_heads = 32;  // Hv
  int64_t key_dim = 128;   // dk
  int64_t value_dim = 128;  // dv
  int64_t d_conv = 4;      // K
  double norm_eps = 1e-6;
  double init_std = 0.02;
  int num_layers = 1;
};

// Text generation: the state one sequence's earlier tokens left (ops/decode.h, ops/delta.h).
struct DeltaNetCache {
  Owned conv;   // (K - 1, 2 Hk dk + Hv dv) the conv inputs [q | k | v] of the previous K - 1 tokens
  Owned state;  // (Hv, dk, dv) statistics dtype: S after the previous token
};

struct DeltaNetSaved {
  Owned proj;  // (T, 2 Hk dk + 2 Hv dv + 2 Hv): the in_proj output
  Owned o;     // (T, Hv dv) the delta rule's output
  Owned rstd;  // (T, Hv) the head norm's
};

class DeltaNet {
 public:
  DeltaNet() = default;
  DeltaNet(const ParamStore& store, const std::string& prefix, const DeltaNetConfig& c);
  static void declare(ParamTable& t, const std::string& prefix, const DeltaNetConfig& c);

  void forward(const Env& env, const Tensor& xn, const Tensor& y, const SegmentInfo& seg,
               DeltaNetSaved& s) const;
  // The gradients of the input and of every parameter (no output bias: nothing to leave to the
  // caller, so backward is the whole layer's).
  void backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                const DeltaNetSaved& s, const Tensor& dxn) const;

  // One-token decode (layers/decode.cpp), as Mamba2::decode.
  void decode(const Env& env, const Tensor& xn, DeltaNetCache& cache, const Tensor& y) const;
  DeltaNetCache new_cache(const Env& env) const;

 private:
  int64_t qk_width() const { return hk_ * dk_; }
  int64_t v_width() const { return hv_ * dv_; }
  int64_t conv_width() const { return 2 * qk_width() + v_width(); }
  int64_t width() const { return conv_width() + v_width() + 2 * hv_; }
  ops::ColumnBlock z(const Tensor& proj) const { return {proj, conv_width(), v_width()}; }
  ops::DeltaArgs delta_args(const DeltaNetSaved& s, const Tensor& conv, const SegmentInfo& seg) const;
  void normed(const DeltaNetSaved& s, const Tensor& out, const Tensor& rstd) const;
  int64_t hk_ = 0, hv_ = 0, dk_ = 0, dv_ = 0;  // this tensor-parallel rank's heads; head dims
  float eps_ = 1e-6f;
  Param w_in_, conv_w_, dt_bias_, a_log_, norm_, w_out_;
};

}  // namespace engine::layers
