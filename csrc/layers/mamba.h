// Mamba mixer (selective state space, S6), as Hugging Face MambaMixer's slow path, over packed
// varlen batches (documents never exchange state):
//   [xi | z] = xn [W_in_x; W_in_z]^T (+ b)     one GEMM over the adjacent in_proj_x, in_proj_z
//   xc = silu(causal_conv1d(xi))                depthwise, kernel K, per document (ops/mamba.h)
//   dt_low = xc W_x[:R]^T,  [B | C] = xc W_x[R:]^T   x_proj as two GEMMs on its row blocks, into
//                                               one buffer [dt_low (T, R) | B|C (T, 2N)] so the
//                                               dt_proj GEMM and the scan read them without copies
//   dt = dt_low W_dt^T                          dt_proj; its bias dt_bias is added inside the scan
//   y_ssm = selective_scan(xc, dt, A_log, B, C, D, dt_bias, z)   (softplus, D skip, silu(z) gate)
//   y = y_ssm W_out^T (+ b_out)
// Parameters under the prefix (full shapes; HF names in brackets where they differ):
//   in_proj_x, in_proj_z (Di, C) [in_proj.weight = their concatenation along dim 0],
//   in_proj_x_bias, in_proj_z_bias (Di) [in_proj.bias] and out_proj_bias (C) with proj_bias,
//   conv_weight (Di, K) [conv1d.weight (Di, 1, K)], conv_bias (Di) [conv1d.bias] with conv_bias,
//   x_proj (R + 2N, Di), dt_proj (Di, R) [dt_proj.weight], dt_bias (Di) [dt_proj.bias],
//   A_log (Di, N), D (Di), out_proj (C, Di).
// Init (layout independent, core/params.h): in_proj, x_proj normal(init_std); out_proj
// normal(init_std / sqrt(num_layers)) (HF rescales it by sqrt(layers)); conv weight and bias
// U(+-1/sqrt(K)) (PyTorch's Conv1d default, which HF keeps); dt_proj U(+-dt_scale / sqrt(R));
// dt_bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max] floored at dt_init_floor;
// A_log[d, n] = log(n + 1); D = 1; biases 0. No weight decay on A_log, D, dt_bias and biases.
// Saved: xz (T, 2 Di), the x_proj buffer (about T (R + 2N)), dt (T, Di), y_ssm (T, Di), the scan's
// chunk states ((T / chunk_len), N, Di), stat dtype); xc is recomputed by backward (one conv).
// xn is kept by the caller. Gradients: dxn written (=); parameter gradients accumulated (+=).
// Tensor parallelism (parallel/tensor_parallel.h, comm/mappings.h): Di is split. in_proj column-parallel
// (x and z rows each split, adjacent per rank as gate/up in Mlp); conv, dt_proj, dt_bias, A_log
// and D split along Di; x_proj row-parallel: its (T, R + 2N) output is a partial sum, all-reduced
// in forward (reduce_from_tp), and since every rank then consumes it for its own channels, the
// gradient of it is all-reduced in backward (copy_to_tp); out_proj row-parallel. With sequence
// parallelism xn, y, dy, dxn are the rank's token shard; the mixer itself runs on all tokens.
#pragma once
#include <string>

#include "layers/attention.h"
#include "layers/common.h"
#include "ops/mamba.h"

namespace engine::layers {

struct MambaConfig {
  int64_t hidden = 0;     // C
  int64_t d_inner = 0;    // Di; 0: 2 C
  int64_t d_state = 16;   // N
  int64_t d_conv = 4;     // K
  int64_t dt_rank = 0;    // R; 0: ceil(C / 16)
  bool conv_bias = true;
  bool proj_bias = false;  // in_proj and out_proj biases
  double init_std = 0.02;
  double dt_min = 0.001, dt_max = 0.1, dt_init_floor = 1e-4;
  double dt_scale = 1.0;
  int num_layers = 1;     // out_proj init std = init_std / sqrt(num_layers)
  int64_t chunk_len = ops::kScanChunk;  // tokens per scan chunk (ops/mamba.h)
  int64_t inner() const { return d_inner > 0 ? d_inner : 2 * hidden; }
  int64_t rank() const { return dt_rank > 0 ? dt_rank : (hidden + 15) / 16; }
};

// Text generation: the state one sequence's earlier tokens left (ops/decode.h).
struct MambaCache {
  Owned conv;  // (K - 1, Di) activations: the conv inputs of the previous K - 1 tokens, oldest first
  Owned ssm;   // (Di, N) statistics dtype: the scan state h after the previous token
};

struct MambaSaved {
  Owned xz;      // (T, 2 Di): [xi | z]
  Owned xproj;   // flat: dt_low (T, R), then (from a 64-element boundary) B|C (T, 2N)
  Owned dt;      // (T, Di)
  Owned y;       // (T, Di) the scan's output
  Owned states;  // (chunks, N, Di)
};

class Mamba {
 public:
  Mamba() = default;
  Mamba(const ParamStore& store, const std::string& prefix, const MambaConfig& c);
  static void declare(ParamTable& t, const std::string& prefix, const MambaConfig& c);

  void forward(const Env& env, const Tensor& xn, const Tensor& y, const SegmentInfo& seg,
               MambaSaved& s) const;
  // The gradients of the input and of every parameter (the layer on its own).
  void backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                const MambaSaved& s, const Tensor& dxn) const;
  // The same but for the output bias, whose gradient (sum_t dy, out_bias_grad()) the caller adds:
  // Block sums it in the norm backward that wrote dy (ops/norm.h dx_colsum; layers/block.h).
  void backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& xn,
                                const SegmentInfo& seg, const MambaSaved& s,
                                const Tensor& dxn) const;
  // The output bias's gradient (undefined without one): sum_t dy over this rank's rows.
  Tensor out_bias_grad() const { return b_out_ ? b_out_.g() : Tensor{}; }

  // One-token decode (layers/decode.cpp): xn (1, C) is the next token of the sequence whose state
  // `cache` holds (zeros: the first token); the cache moves on by this token, y (1, C) as forward
  // writes it. One rank: no tensor parallelism.
  void decode(const Env& env, const Tensor& xn, MambaCache& cache, const Tensor& y) const;
  MambaCache new_cache(const Env& env) const;

 private:
  int64_t bc_offset(int64_t tokens) const;
  int64_t xproj_numel(int64_t tokens) const;
  Tensor dt_low(const Tensor& xproj, int64_t tokens) const;  // (T, R) view of the buffer
  Tensor bc(const Tensor& xproj, int64_t tokens) const;      // (T, 2N) view of the buffer
  ops::ScanArgs scan_args(const MambaSaved& s, const Tensor& xc, const SegmentInfo& seg) const;
  int64_t di_ = 0;  // this tensor-parallel rank's channels
  int64_t n_ = 0, r_ = 0, chunk_ = ops::kScanChunk;
  Param w_in_, b_in_, conv_w_, conv_b_, x_proj_, dt_proj_, dt_bias_, a_log_, d_, w_out_, b_out_;
};

}  // namespace engine::layers
