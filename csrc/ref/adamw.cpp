// AdamW, element by element in f32, exactly the formula of ops/adamw.h:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p = p - lr * (m / bc1 / (sqrt(v / bc2) + eps) + weight_decay * p)
// with the bias corrections bc1 = 1 - b1^t, bc2 = 1 - b2^t computed once in double and rounded
// to f32 (as a GPU launcher computes them on the host). compute_copy, when defined, receives
// the new p as bf16 (round to nearest even) or f32. A u16 param is a split master
// (ops/split_master.h): p is joined from compute_copy's bits and param, and split back after the
// update. Every precondition is checked before (ops/adamw.cpp).
#include "ops/adamw.h"

#include <cmath>
#include <cstring>

#include "ops/split_master.h"

namespace engine::ref {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const ops::AdamWParams& p, const Tensor& compute_copy) {
  const int64_t n = param.numel();
  const bool copy = compute_copy.data != nullptr;
  const float b1 = p.beta1, b2 = p.beta2, eps = p.eps;
  const float gs = p.grad_scale;
  const auto t = static_cast<double>(p.step);
  const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
  const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
  const bool split = param.dtype == DType::U16;
  float* pp = split ? nullptr : param.ptr<float>();
  uint16_t* lo = split ? param.ptr<uint16_t>() : nullptr;
  const float* pg = grad.ptr<float>();
  float* pm = exp_avg.ptr<float>();
  float* pv = exp_avg_sq.ptr<float>();
  bf16* copy_bf16 = copy && compute_copy.dtype == DType::BF16 ? compute_copy.ptr<bf16>() : nullptr;
  float* copy_f32 = copy && compute_copy.dtype == DType::F32 ? compute_copy.ptr<float>() : nullptr;
  auto update = [&](int64_t begin, int64_t end, float wd, float lr) {
#pragma omp parallel for schedule(static) if (end - begin > (1 << 16))
    for (int64_t i = begin; i < end; ++i) {
      float p0;
      if (split) {
        const uint32_t bits = split_master_join(copy_bf16[i].bits, lo[i]);
        std::memcpy(&p0, &bits, 4);
      } else {
        p0 = pp[i];
      }
      const float g = pg[i] * gs;
      const float m = b1 * pm[i] + (1.f - b1) * g;
      const float v = b2 * pv[i] + (1.f - b2) * g * g;
      const float w = p0 - lr * (m / bc1 / (std::sqrt(v / bc2) + eps) + wd * p0);
      pm[i] = m;
      pv[i] = v;
      if (split) {
        uint32_t bits;
        std::memcpy(&bits, &w, 4);
        copy_bf16[i].bits = split_master_hi(bits);
        lo[i] = split_master_lo(bits, copy_bf16[i].bits);
        continue;
      }
      pp[i] = w;
      if (copy_bf16) copy_bf16[i] = bf16(w);
      if (copy_f32) copy_f32[i] = w;
    }
  };
  if (p.decay_runs.empty()) return update(0, n, p.weight_decay, p.lr);
  int64_t begin = 0;
  for (const ops::DecayRun& r : p.decay_runs) {
    update(begin, r.end, r.weight_decay, ops::run_lr(p, r));
    begin = r.end;
  }
}

}  // namespace engine::ref
