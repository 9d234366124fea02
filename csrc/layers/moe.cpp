#include "layers/moe.h"

#include <cmath>

#include "core/rng.h"
#include "parallel/tensor_parallel.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"

namespace engine::layers {

namespace {

uint64_t hash_name(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

ModelConfig shared_expert_config(const MoeConfig& c) {
  ModelConfig m;
  m.hidden_size = static_cast<int>(c.hidden_size);
  m.ffn_hidden_size = static_cast<int>(c.shared_ffn_size);
  m.activation = ActivationKind::SwiGLU;
  m.bias = false;
  m.init_std = c.init_std;
  m.num_layers = c.num_layers;
  return m;
}

Moe::Moe(const ParamStore& store, const std::string& prefix, const MoeConfig& c)
    : cfg_(c), ffn_(c.ffn_hidden_size / store.table().tp_size()), prefix_hash_(hash_name(prefix)) {
  ENSURE(c.num_experts >= 1 && c.num_experts <= ops::kMoeMaxExperts, prefix, ": ", c.num_experts,
         " experts outside [1, ", ops::kMoeMaxExperts, "]");
  ENSURE(c.top_k >= 1 && c.top_k <= std::min<int64_t>(c.num_experts, ops::kMoeMaxTopK), prefix,
         ": top_k = ", c.top_k, " outside [1, min(E, ", ops::kMoeMaxTopK, ")]");
  router_ = Param(store, prefix + ".router");
  const ParamSpec& g = store.table().get(prefix + ".w_gate");
  const ParamSpec& u = store.table().get(prefix + ".w_up");
  ENSURE(u.offset == g.offset + g.shape.numel() && u.shape == g.shape, prefix,
         ".w_up must follow .w_gate without a gap (declared adjacent)");
  w_gate_up_.store = &store;
  w_gate_up_.offset = g.offset;
  w_gate_up_.shape = {2, c.num_experts, ffn_, c.hidden_size};
  w_out_ = Param(store, prefix + ".w_out");
  ENSURE(c.shared_ffn_size >= 0, prefix, ": shared expert of ", c.shared_ffn_size, " features");
  shared_ = c.shared_ffn_size > 0;
  if (shared_) {
    shared_mlp_ = Mlp(store, prefix + ".shared", shared_expert_config(c));
    shared_gate_ = Param(store, prefix + ".shared_gate");
  }
}

void Moe::declare(ParamTable& t, const std::string& prefix, const MoeConfig& c) {
  const int64_t C = c.hidden_size, F = c.ffn_hidden_size, E = c.num_experts;
  const double out_std = c.init_std / std::sqrt(2.0 * c.num_layers);
  t.add({.name = prefix + ".router", .shape = {E, C}, .init_std = c.init_std});
  t.add({.name = prefix + ".w_gate", .shape = {E, F, C}, .split_dim = 1, .init_std = c.init_std});
  t.add({.name = prefix + ".w_up", .shape = {E, F, C}, .split_dim = 1, .init_std = c.init_std,
         .adjacent = true});
  t.add({.name = prefix + ".w_out", .shape = {E, C, F}, .split_dim = 2, .init_std = out_std});
  if (c.shared_ffn_size > 0) {
    Mlp::declare(t, prefix + ".shared", shared_expert_config(c));
    t.add({.name = prefix + ".shared_gate", .shape = {1, C}, .init_std = c.init_std});
  }
}

Tensor Moe::router_input(const Env& env, const Tensor& x, uint64_t seed, Owned& storage) const {
  if (seed == 0) return x;
  storage = env.act_tensor(x.shape);
  ops::moe_jitter(x, storage, seed, cfg_.jitter);
  return storage;
}

void Moe::forward(const Env& env, const Tensor& xn, const Tensor& y, MoeSaved& s,
                  uint64_t jitter_seed) const {
  const int64_t C = cfg_.hidden_size, E = cfg_.num_experts, k = cfg_.top_k;
  const ops::MoeAuxCoefs coefs{cfg_.aux_loss_coef, cfg_.z_loss_coef};
  Owned gathered;
  const Tensor x = column_input_forward(env, xn, gathered);  // every token, on every tp rank
  const int64_t T = x.size(0), R = ops::moe_permuted_rows(T, k, E);
  s.jitter_seed = cfg_.jitter > 0 && jitter_seed != 0 ? splitmix64(jitter_seed ^ prefix_hash_) : 0;

  // Router: logits into probs (overwritten in place by the softmax), choice, dispatch, losses.
  s.probs = env.stat_tensor({T, E});
  {
    Owned jittered;
    ops::matmul(router_input(env, x, s.jitter_seed, jittered), false, router_.w(), true, s.probs, {});
  }
  s.lse = env.stat_tensor({T});
  s.expert_idx = empty({T, k}, DType::I32, env.device);
  s.weights = env.stat_tensor({T, k});
  ops::moe_route_forward(s.probs, s.probs, s.lse, s.expert_idx, s.weights, cfg_.norm_topk_prob);
  s.counts = empty({E}, DType::I32, env.device);
  s.offsets = empty({E + 1}, DType::I32, env.device);
  s.row_of = empty({T, k}, DType::I32, env.device);
  ops::moe_dispatch(s.expert_idx, s.counts, s.offsets, s.row_of);
  s.losses = env.stat_tensor({2});
  ops::moe_aux_losses(s.probs, s.lse, s.counts, coefs, s.losses);

  // Experts.
  Owned xp = env.act_tensor({R, C});
  ops::moe_permute(x, s.row_of, xp);
  gathered = Owned{};
  s.h = env.act_tensor({R, 2 * ffn_});
  ops::grouped_linear_forward(xp, w_gate_up_.w(), s.offsets, s.counts, s.h, {});
  xp = Owned{};
  s.a = env.act_tensor({R, ffn_});
  ops::swiglu_forward(s.h, s.a, {});
  s.yo = env.act_tensor({R, C});
  ops::grouped_linear_forward(s.a, w_out_.w(), s.offsets, s.counts, s.yo, {});
  if (env.sp()) {
    Owned partial = env.act_tensor({T, C});
    ops::moe_unpermute(s.yo, s.row_of, s.weights, partial);
    row_output_forward(env, partial, y);
  } else {
    ops::moe_unpermute(s.yo, s.row_of, s.weights, y);
    row_output_forward(env, y, y);
  }
  if (shared_) shared_forward(env, xn, y, s);
}

void Moe::shared_forward(const Env& env, const Tensor& xn, const Tensor& y, MoeSaved& s) const {
  s.shared_y = env.act_tensor(xn.shape);
  shared_mlp_.forward(env, xn, s.shared_y, s.shared);
  s.gate_logits = env.stat_tensor({xn.size(0), 1});
  ops::matmul(xn, false, shared_gate_.w(), true, s.gate_logits, {});
  ops::moe_shared_gate_forward(s.gate_logits, s.shared_y, y);
}

void Moe::shared_backward(const Env& env, const Tensor& dy, const Tensor& xn, const MoeSaved& s,
                          const Tensor& dxn) const {
  Owned dshared = env.act_tensor(xn.shape);
  Owned dlogits = env.act_tensor({xn.size(0), 1});
  ops::moe_shared_gate_backward(dy, s.gate_logits, s.shared_y, dshared, dlogits);
  Owned dx_shared = env.act_tensor(xn.shape);
  shared_mlp_.backward(env, dshared, xn, s.shared, dx_shared);
  ops::add_inplace(dxn, dx_shared);
  ops::matmul(dlogits, false, shared_gate_.w(), false, dxn, {1.f, 1.f, {}});
  ops::matmul(dlogits, true, xn, false, shared_gate_.g(), {1.f, 1.f, {}});
}

void Moe::backward(const Env& env, const Tensor& dy, const Tensor& xn, const MoeSaved& s,
                   const Tensor& dxn, float aux_grad_scale) const {
  const int64_t C = cfg_.hidden_size, E = cfg_.num_experts, k = cfg_.top_k;
  const int64_t T = s.probs->size(0), R = s.yo->size(0);
  const ops::MoeAuxCoefs coefs{cfg_.aux_loss_coef, cfg_.z_loss_coef};

  // Weighted sum back to tokens: the experts' output gradient and the routing weights'.
  Owned dy_storage;
  const Tensor dy_full = row_output_backward(env, dy, dy_storage);
  Owned dyo = env.act_tensor({R, C});
  Owned dweights = env.stat_tensor({T, k});
  ops::moe_unpermute_backward(dy_full, s.yo, s.row_of, s.weights, dyo, dweights);
  dy_storage = Owned{};
  if (env.tp_size() > 1) env.tp->all_reduce(dweights);  // each rank's yo is a partial sum over F

  // Experts, last GEMM first.
  Owned da = env.act_tensor({R, ffn_});
  ops::grouped_linear_backward_input(dyo, w_out_.w(), s.offsets, s.counts, da, {});
  ops::grouped_linear_backward_weight(dyo, s.a, s.offsets, s.counts, w_out_.g(), {});
  dyo = Owned{};
  Owned dh = env.act_tensor({R, 2 * ffn_});
  ops::swiglu_backward(da, s.h, dh, {});
  da = Owned{};
  Owned gathered;
  const Tensor x = column_input_forward(env, xn, gathered);
  Owned xp = env.act_tensor({R, C});
  ops::moe_permute(x, s.row_of, xp);
  Owned dxp = env.act_tensor({R, C});
  ops::grouped_linear_backward_input(dh, w_gate_up_.w(), s.offsets, s.counts, dxp, {});
  ops::grouped_linear_backward_weight(dh, xp, s.offsets, s.counts, w_gate_up_.g(), {});
  dh = Owned{};
  xp = Owned{};
  Owned dx_storage;
  const Tensor dx_full = env.sp() ? (dx_storage = env.act_tensor({T, C})).t : dxn;
  ops::moe_unpermute(dxp, s.row_of, Tensor{}, dx_full);  // the backward of the permute
  dxp = Owned{};

  // Router: the routing weights' gradient and the auxiliary losses' through the softmax.
  Owned dlogits = env.act_tensor({T, E});
  ops::moe_route_backward(dweights, s.probs, s.lse, s.expert_idx, s.weights, s.counts, coefs,
                          aux_grad_scale, cfg_.norm_topk_prob, dlogits);
  if (env.tp_rank() == 0) {  // replicated router: its input gradient joins the reduction once
    if (s.jitter_seed != 0) {
      Owned dxr = env.act_tensor({T, C});
      ops::matmul(dlogits, false, router_.w(), false, dxr, {});
      ops::moe_jitter(dxr, dxr, s.jitter_seed, cfg_.jitter);  // diagonal: its own adjoint
      ops::add_inplace(dx_full, dxr);
    } else {
      ops::matmul(dlogits, false, router_.w(), false, dx_full, {1.f, 1.f, {}});
    }
  }
  {
    Owned jittered;
    Tensor xr = router_input(env, x, s.jitter_seed, jittered);
    Tensor dl = dlogits;
    if (env.sp()) {  // this rank's tokens: a partial sum, as for every replicated parameter
      const int64_t rows = xn.size(0), r0 = env.tp_rank() * rows;
      xr = xr.slice(r0, r0 + rows);
      dl = dl.slice(r0, r0 + rows);
    }
    ops::matmul(dl, true, xr, false, router_.g(), {1.f, 1.f, {}});
  }
  gathered = Owned{};
  column_input_backward(env, dx_full, dxn);
  if (shared_) shared_backward(env, dy, xn, s, dxn);
}

double Moe::aux_loss(const MoeSaved& s) {
  Owned h = empty({2}, s.losses->dtype, Device::CPU);
  copy_tensor(h, s.losses);
  if (h->dtype == DType::F64) return h.ptr<double>()[0] + h.ptr<double>()[1];
  return static_cast<double>(h.ptr<float>()[0]) + h.ptr<float>()[1];
}

}  // namespace engine::layers
