#include "layers/lora.h"

#include <algorithm>
#include <cmath>

#include "ops/elementwise.h"
#include "ops/gemm.h"

namespace engine::layers {

const std::vector<LoraTarget>& lora_targets() {
  static const std::vector<LoraTarget> t = {
      {"q", "attn", "wq", "q_proj", false},        {"k", "attn", "wk", "k_proj", false},
      {"v", "attn", "wv", "v_proj", false},        {"o", "attn", "wo", "o_proj", true},
      {"gate", "mlp", "w_gate", "gate_proj", false}, {"up", "mlp", "w_up", "up_proj", false},
      {"down", "mlp", "w_out", "down_proj", true}};
  return t;
}

bool lora_targets_weight(const ModelConfig& c, const std::string& weight) {
  if (c.lora.rank <= 0) return false;
  for (const LoraTarget& t : lora_targets())
    if (weight == t.weight)
      return std::find(c.lora.targets.begin(), c.lora.targets.end(), t.name) != c.lora.targets.end();
  return false;
}

namespace {
bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
// "layers.3.attn.wq" -> "wq"
std::string last_part(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}
}  // namespace

bool is_lora_param(const std::string& name) { return ends_with(name, ".lora_a") || ends_with(name, ".lora_b"); }

void set_lora_freezing(ParamTable& t, const ModelConfig& c) {
  if (c.lora.rank > 0) t.set_frozen_rule([](const std::string& name) { return !is_lora_param(name); });
}

void Lora::declare(ParamTable& t, const std::string& weight, int64_t out, int64_t in, bool row_parallel,
                   const ModelConfig& c) {
  const int64_t r = c.lora.rank;
  t.add({.name = weight + ".lora_a", .shape = {r, in}, .split_dim = row_parallel ? 1 : -1, .init = InitKind::Uniform,
         .init_std = 1.0 / std::sqrt(static_cast<double>(in)), .tp_partial_grad = !row_parallel});
  t.add({.name = weight + ".lora_b", .shape = {out, r}, .split_dim = row_parallel ? -1 : 0, .init = InitKind::Zeros,
         .tp_partial_grad = row_parallel});
}

Lora::Lora(const ParamStore& store, const std::string& weight, const ModelConfig& c) {
  if (!lora_targets_weight(c, last_part(weight))) return;
  a_ = Param(store, weight + ".lora_a");
  b_ = Param(store, weight + ".lora_b");
  scale_ = static_cast<float>(c.lora.alpha / c.lora.rank);
  out_ = b_.shape[0];
}

void Lora::forward(const Tensor& x, const Tensor& y, int64_t col) const {
  const Tensor x2 = x.rows(), y2 = y.rows();
  const int64_t T = x2.size(0), r = a_.shape[0];
  Owned z = empty({T, r}, x2.dtype, x2.device);
  ops::matmul(x2, false, a_.w(), true, z, {});  // z = x A^T
  if (col == 0 && y2.size(1) == out_) {
    ops::matmul(z, false, b_.w(), true, y2, {scale_, 1.f});  // y += s z B^T
    return;
  }
  Owned u = empty({T, out_}, y2.dtype, y2.device);  // this target's columns of a fused output
  ops::matmul(z, false, b_.w(), true, u, {scale_, 0.f});
  ops::copy_columns(u, 0, y2, col, out_, true);
}

void Lora::backward(const Tensor& dy, const Tensor& x, const Tensor& dx, int64_t col) const {
  const Tensor dy2 = dy.rows(), x2 = x.rows();
  const int64_t T = x2.size(0), r = a_.shape[0];
  Owned dy_cols;
  Tensor d = dy2;
  if (col != 0 || dy2.size(1) != out_) {  // this target's columns of a fused gradient
    dy_cols = empty({T, out_}, dy2.dtype, dy2.device);
    ops::copy_columns(dy2, col, dy_cols, 0, out_, false);
    d = dy_cols;
  }
  Owned dz = empty({T, r}, dy2.dtype, dy2.device);
  ops::matmul(d, false, b_.w(), false, dz, {scale_, 0.f});          // dz = s dy B
  if (dx.data) ops::matmul(dz, false, a_.w(), false, dx.rows(), {1.f, 1.f});  // dx += dz A
  ops::matmul(dz, true, x2, false, a_.g(), {1.f, 1.f});             // dA += dz^T x
  Owned zs = empty({T, r}, x2.dtype, x2.device);
  ops::matmul(x2, false, a_.w(), true, zs, {scale_, 0.f});          // s x A^T
  ops::matmul(d, true, zs, false, b_.g(), {1.f, 1.f});              // dB += dy^T (s x A^T)
}

}  // namespace engine::layers
