// Mamba-2 mixer (SSD: multi-head scalar-decay state space), as Hugging Face Mamba2Mixer, over
// packed varlen batches (documents never exchange state):
//   [z | x | B | C | dt] = xn W_in^T (+ b)          one GEMM over the adjacent in_proj_z, _x, _B, _C, _dt
//   [x | B | C] = silu(causal_conv1d([x | B | C]))  depthwise, kernel K, per document (ops/mamba.h)
//   y_ssm = ssd_scan(x, dt, A_log, B, C, D, dt_bias)  (softplus, the delta clamp, D skip; ops/ssd.h)
//   y_n = gated_rmsnorm(y_ssm, z) = norm v / rms(v), v = y_ssm silu(z), over all Di channels
//         (transformers' Mamba2Mixer), or with norm_per_group over each group's Di / G channels
//         (mamba_ssm's Mamba2 module, which the published n_groups > 1 checkpoints were trained with)
//   y = y_n W_out^T (+ b_out)
// H = Di / P heads of P channels, G groups of N states (heads h of group h / (H / G)).
// Parameters under the prefix (full shapes; HF names in brackets):
//   in_proj_z, in_proj_x (Di, C), in_proj_B, in_proj_C (G N, C), in_proj_dt (H, C)
//   [in_proj.weight = their concatenation along dim 0, in this order], and with proj_bias their
//   biases in_proj_*_bias [in_proj.bias] and out_proj_bias (C) [out_proj.bias];
//   conv_x (Di, K), conv_B, conv_C (G N, K) [conv1d.weight (Di + 2 G N, 1, K)] and with conv_bias
//   conv_x_bias, conv_B_bias, conv_C_bias [conv1d.bias]; dt_bias, A_log, D (H); norm (Di)
//   [norm.weight]; out_proj (C, Di).
// Init (layout independent, core/params.h): in_proj normal(init_std), out_proj
// normal(init_std / sqrt(num_layers)); conv weights U(+-1/sqrt(K)) (HF's kaiming_uniform(sqrt 5)),
// conv biases 0 (HF Mamba2's init); dt_bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max]
// floored at dt_init_floor; A_log[h] = log(h + 1); D = 1; norm = 1; biases 0. No weight decay on
// A_log, D, dt_bias, the norm and biases.
// Saved: the in_proj output (T, 2 Di + 2 G N + H), y_ssm (T, Di), the norm's row sums of squares
// (T) and the scan's chunk states; the conv output and y_n are recomputed by backward. xn is kept
// by the caller. Gradients: dxn written (=); parameter gradients accumulated (+=).
// Tensor parallelism (parallel/tensor_parallel.h): heads and groups are split (G divisible by
// the tensor-parallel size; every rank's heads read its own groups). in_proj is column-parallel
// (each of z, x, B, C, dt split, adjacent per rank), conv, dt_bias, A_log, D and the norm weight
// split along their channels, out_proj row-parallel. Over the whole row, the norm's row
// statistics (sum of squares forward, sum of dout weight v backward) are all-reduced over the
// group, so every rank normalises by the whole row; per group each rank holds whole groups and
// reduces nothing. With sequence parallelism xn, y, dy, dxn are the rank's token
// shard; the mixer itself runs on all tokens.
#pragma once
#include <string>

#include "layers/attention.h"
#include "layers/common.h"
#include "ops/ssd.h"

namespace engine::layers {

struct Mamba2Config {
  int64_t hidden = 0;     // C
  int64_t d_inner = 0;    // Di = H P
  int64_t head_dim = 64;  // P
  int64_t n_groups = 1;   // G
  int64_t d_state = 128;  // N
  int64_t d_conv = 4;     // K
  bool conv_bias = true;
  bool proj_bias = false;
  double norm_eps = 1e-5;
  bool norm_per_group = false;
  double dt_limit_min = 0.0, dt_limit_max = 0.0;  // the delta clamp (max 0: none above)
  double init_std = 0.02;
  double dt_min = 0.001, dt_max = 0.1, dt_init_floor = 1e-4;
  int num_layers = 1;
  int64_t chunk_len = ops::kSsdChunk;
  int64_t heads() const { return head_dim > 0 ? d_inner / head_dim : 0; }
};

// Text generation: the state one sequence's earlier tokens left (ops/decode.h, ops/ssd.h).
struct Mamba2Cache {
  Owned conv;  // (K - 1, Di + 2 G N) the conv inputs [x | B | C] of the previous K - 1 tokens
  Owned ssm;   // (H, P, N) statistics dtype: S after the previous token
};

struct Mamba2Saved {
  Owned zxbcdt;  // (T, 2 Di + 2 G N + H): the in_proj output
  Owned y;       // (T, Di) the scan's output
  Owned sumsq;   // (norm parts x T) the gated norm's sums of squares (over the whole row or a group)
  Owned states;  // (chunks, H, P, N)
};

class Mamba2 {
 public:
  Mamba2() = default;
  Mamba2(const ParamStore& store, const std::string& prefix, const Mamba2Config& c);
  static void declare(ParamTable& t, const std::string& prefix, const Mamba2Config& c);

  void forward(const Env& env, const Tensor& xn, const Tensor& y, const SegmentInfo& seg,
               Mamba2Saved& s) const;
  void backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                const Mamba2Saved& s, const Tensor& dxn) const;
  // backward but for the output bias, whose gradient (sum_t dy, out_bias_grad()) the caller adds
  // (layers/block.h).
  void backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& xn,
                                const SegmentInfo& seg, const Mamba2Saved& s,
                                const Tensor& dxn) const;
  Tensor out_bias_grad() const { return b_out_ ? b_out_.g() : Tensor{}; }

  // One-token decode (layers/decode.cpp): xn (1, C) the next token of the sequence whose state
  // `cache` holds; the cache moves on by this token. One rank: no tensor parallelism.
  void decode(const Env& env, const Tensor& xn, Mamba2Cache& cache, const Tensor& y) const;
  Mamba2Cache new_cache(const Env& env) const;

 private:
  // Columns of the in_proj output (this rank's share).
  ops::ColumnBlock z(const Tensor& zxbcdt) const { return {zxbcdt, 0, di_}; }
  ops::ColumnBlock xbc(const Tensor& zxbcdt) const { return {zxbcdt, di_, di_ + 2 * gn_}; }
  ops::ColumnBlock dt(const Tensor& zxbcdt) const { return {zxbcdt, 2 * di_ + 2 * gn_, h_}; }
  int64_t width() const { return 2 * di_ + 2 * gn_ + h_; }
  ops::SsdArgs scan_args(const Mamba2Saved& s, const Tensor& xbc, const SegmentInfo& seg) const;
  // The gated norm's parts of a row: the rank's Di channels (normalised by the whole row's sum),
  // or per group one part per local group; part j's statistic is row j of a (parts, T) buffer.
  int64_t norm_parts() const { return norm_per_group_ ? groups_ : 1; }
  int64_t norm_width() const { return di_ / norm_parts(); }
  int64_t norm_total() const { return norm_per_group_ ? norm_width() : di_total_; }
  ops::ColumnBlock part(const Tensor& t, int64_t j) const { return {t, j * norm_width(), norm_width()}; }
  static Tensor stat_row(const Tensor& stats, int64_t j) { return stats.slice(j, j + 1).view({stats.size(1)}); }
  // y_n = gated_rmsnorm(y_ssm, z) from the saved sums.
  void normed(const Mamba2Saved& s, const Tensor& out) const;
  int64_t di_ = 0, gn_ = 0, h_ = 0;  // this tensor-parallel rank's channels, group states, heads
  int64_t di_total_ = 0, p_ = 64, groups_ = 1, chunk_ = ops::kSsdChunk;
  float eps_ = 1e-5f;
  bool norm_per_group_ = false;
  double dt_lo_ = 0, dt_hi_ = 0;
  Param w_in_, b_in_, conv_w_, conv_b_, dt_bias_, a_log_, d_, norm_, w_out_, b_out_;
};

}  // namespace engine::layers
