// Mixture-of-experts feed-forward block (Mixtral's and Qwen2-MoE's sparse MoE blocks, dropless):
//   logits = x_r W_r^T   (x_r = xn, or xn * jitter noise in training with jitter > 0)     (T, E)
//   p = softmax(logits); the top_k experts of each token; w = p[top_k] / sum p[top_k]
//   (norm_topk_prob; Mixtral's softmax over the top-k logits is the same) or w = p[top_k]
//   y_t = sum_{j in top_k(t)} w_tj expert_j(xn_t),  expert_e(x) = (silu(x Wg_e^T) * (x Wu_e^T)) Wo_e^T
//       + sigmoid(xn_t . w_sg) shared(xn_t)   with a shared expert (shared_ffn_size > 0, Qwen2-MoE:
//         shared a SwiGLU Mlp (layers/mlp.h) of shared_ffn_size features, w_sg (1, C) its gate)
// plus the auxiliary losses (ops/moe.h has the formulas), returned in MoeSaved::losses:
//   aux = aux_loss_coef * E * sum_e f_e P_e  (f_e: fraction of the T k assignments to e,
//         P_e: mean router probability of e). Hugging Face's Mixtral load_balancing_loss_func
//         sums its f over the k slots, so its value is top_k times this one: HF coefficient c
//         corresponds to aux_loss_coef = c * top_k here.
//   z   = z_loss_coef * mean_t logsumexp(logits_t)^2
// How they join the training loss is the caller's choice, stated to backward() as
// aux_grad_scale = d(total loss) / d(aux + z of this call): 1 when the two values are added to
// the loss as they are; 1 / n when the loss takes the mean of the values of n micro-batches
// (or of n micro-batches x dp ranks). The layer applies that gradient itself (through the
// router); the values are only reported (MoeSaved::losses, aux_loss()).
//
// Work: route (ops::moe_route_forward), dispatch (ops::moe_dispatch: rows grouped by expert,
// each expert padded to the grouped GEMM's tile, R = ops::moe_permuted_rows(T, k, E) rows, no
// host sync), permute xn, one grouped GEMM over the adjacent gate and up weights (h = [gate |
// up], (R, 2F)), swiglu, one grouped GEMM by W_out (yo, (R, C)), and the weighted sum back to
// tokens (ops::moe_unpermute).
// Parameters (prefix.): router (E, C); w_gate (E, F, C) and w_up (E, F, C), adjacent (one GEMM
// sees them as w (2, E, F, C)); w_out (E, C, F). Init normal(init_std), w_out
// init_std / sqrt(2 num_layers) (as Mlp). With a shared expert: shared.{w_gate, w_up, w_out}
// (Mlp's) and shared_gate (1, C).
// The shared expert's gate: l = xn w_sg^T (a GEMM, (T, 1)), then ops::moe_shared_gate_forward
// adds sigmoid(l) shared(xn) to the routed output; its backward gives d shared and dl, and two
// rank-1 GEMMs give dxn += dl w_sg and d w_sg += dl^T xn.
// Saved: probs, lse, expert choice and weights, the dispatch (counts, offsets, row_of), h, a and
// yo (the experts' outputs, for the routing weights' gradient); the shared expert's MlpSaved,
// its output and the gate's logits. xn is kept by the caller; the
// permuted input is gathered again in backward rather than kept.
// Gradients: dxn written (=); parameter gradients accumulated (+=).
// Jitter (Switch Transformer's multiplicative router noise, uniform in [1 - jitter, 1 + jitter])
// applies to the router input only (Hugging Face's Mixtral also jitters the experts' input),
// and only when forward() gets a non-zero jitter_seed: the caller passes a value unique per
// (step, micro-batch) (the layer mixes its prefix in), and 0 in evaluation.
// Tensor parallelism: each rank holds F / tp features of every expert (w_gate, w_up split along
// dim 1, w_out along dim 2) and the row-parallel output is reduced through parallel/tensor_parallel.h;
// the router is replicated and every rank routes all (gathered) tokens identically. The routing
// weights' gradient, a sum over the F features, is all-reduced over tp (T x k floats). The
// router's input gradient is added on tp rank 0 only (the column-parallel input reduction then
// counts it once); under sequence parallelism the router's weight gradient is taken over this
// rank's token shard (a partial sum, as the other replicated parameters').
// The shared expert is split as the dense MLP (gate and up column-parallel, w_out row-parallel:
// its output comes back reduced, on this rank's rows). Its gate is replicated and runs on this
// rank's rows after that reduction: its input gradient is added after the shared expert's
// input reduction (every rank adds its own rows), its weight gradient is a partial sum under
// sequence parallelism (summed over tp with the other replicated parameters') and the same on
// every rank otherwise.
#pragma once
#include <cstdint>
#include <string>

#include "layers/common.h"
#include "layers/mlp.h"
#include "ops/moe.h"

namespace engine::layers {

struct MoeConfig {
  int64_t hidden_size = 0;      // C
  int64_t ffn_hidden_size = 0;  // F: features of one expert (all tensor-parallel ranks)
  int64_t num_experts = 8;      // E
  int64_t top_k = 2;            // k
  bool norm_topk_prob = true;   // the top-k weights renormalised to sum 1
  int64_t shared_ffn_size = 0;  // the shared expert's features (all tp ranks); 0 = none
  float aux_loss_coef = 0.001f; // load balancing (HF MixtralConfig's router_aux_loss_coef
                                // default; see the scaling note above); 0 = off
  float z_loss_coef = 0.f;      // router z-loss (ST-MoE uses 1e-3); 0 = off
  float jitter = 0.f;           // router input jitter in training; 0 = off
  double init_std = 0.02;
  int num_layers = 1;           // for the output projection's init std
};

struct MoeSaved {
  Owned probs, lse;             // (T, E), (T): stat dtype
  Owned expert_idx, weights;    // (T, k) i32, (T, k) stat dtype
  Owned counts, offsets, row_of;  // (E), (E + 1), (T, k) i32
  Owned h, a, yo;               // (R, 2F), (R, F), (R, C): act dtype (F: this rank's)
  Owned losses;                 // (2) stat dtype on the layer's device: [aux, z], coefficients applied
  MlpSaved shared;              // the shared expert's (shared_ffn_size > 0)
  Owned shared_y;               // (T, C) act dtype: its output (this rank's rows)
  Owned gate_logits;            // (T, 1) stat dtype: xn w_sg^T
  uint64_t jitter_seed = 0;     // the seed the router input was jittered with (0: none)
};

class Moe {
 public:
  Moe() = default;
  Moe(const ParamStore& store, const std::string& prefix, const MoeConfig& c);
  static void declare(ParamTable& t, const std::string& prefix, const MoeConfig& c);

  // xn, y: (T, C) (this rank's token shard under sequence parallelism).
  void forward(const Env& env, const Tensor& xn, const Tensor& y, MoeSaved& s,
               uint64_t jitter_seed = 0) const;
  void backward(const Env& env, const Tensor& dy, const Tensor& xn, const MoeSaved& s,
                const Tensor& dxn, float aux_grad_scale) const;

  // aux + z of a forward, on the host (copies two numbers back: synchronises the stream).
  static double aux_loss(const MoeSaved& s);

 private:
  // x_r: the router's input (xn, or its jittered copy in `storage`).
  Tensor router_input(const Env& env, const Tensor& x, uint64_t seed, Owned& storage) const;
  // y += sigmoid(xn w_sg^T) shared(xn), and its backward (dxn +=).
  void shared_forward(const Env& env, const Tensor& xn, const Tensor& y, MoeSaved& s) const;
  void shared_backward(const Env& env, const Tensor& dy, const Tensor& xn, const MoeSaved& s,
                       const Tensor& dxn) const;

  MoeConfig cfg_;
  int64_t ffn_ = 0;  // this rank's F
  uint64_t prefix_hash_ = 0;
  Param router_, w_gate_up_, w_out_;
  bool shared_ = false;
  Mlp shared_mlp_;
  Param shared_gate_;
};

// The ModelConfig the shared expert's Mlp is declared and built from (SwiGLU, no biases).
ModelConfig shared_expert_config(const MoeConfig& c);

}  // namespace engine::layers
