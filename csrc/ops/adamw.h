// AdamW (Loshchilov & Hutter) on a contiguous range of a flat parameter buffer, with decoupled
// weight decay. All f32, same length n:
//   g = grad * grad_scale                  (grad_scale folds in clipping)
//   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p = p - lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p)
// compute_copy (bf16 or f32), when defined (undefined: Tensor{}), receives p converted to its
// dtype (the bf16 weights used by the GPU's forward) in the same pass. The GPU's result equals
// the CPU's bit for bit (IEEE f32 operations in this order, no fused multiply-adds; the bias
// corrections 1 - b1^t and 1 - b2^t computed in double and rounded to f32).
// Split master (param u16): the f32 master p is not stored whole but as compute_copy's bf16
// bits and param's 16 low bits (ops/split_master.h); compute_copy (bf16, required) is then read
// and written, and p joined, updated and split again: the same f32 values as an f32 param, with
// the bf16 copy rounding ties toward zero rather than to even. It saves 2 bytes per parameter.
// decay_runs (optional) gives the weight decay by element ranges, so that one call (one launch
// on the GPU) updates a flat buffer whose parameters decay differently: run k covers [end of run
// k - 1, end) with its weight_decay and lr_scale (the run's learning rate is run_lr: lr x
// lr_scale in f32, the same product on both backends); the last run ends at n. Empty:
// weight_decay and lr everywhere.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ops {

struct DecayRun {
  int64_t end = 0;  // one past the run's last element
  float weight_decay = 0.f;
  float lr_scale = 1.f;  // optimizer.lr_scale (optim/lr_scale.h)
};

struct AdamWParams {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;        // t, counted from 1
  float grad_scale = 1.f;
  std::vector<DecayRun> decay_runs;  // see above; overrides weight_decay when not empty
};

inline float run_lr(const AdamWParams& p, const DecayRun& r) { return p.lr * r.lr_scale; }

}  // namespace engine::ops

#define ENGINE_ADAMW_OPS(OP)                                                                \
  OP(void, adamw_step,                                                                      \
     (const Tensor& param, const Tensor& grad, const Tensor& exp_avg,                       \
      const Tensor& exp_avg_sq, const ops::AdamWParams& p, const Tensor& compute_copy),     \
     (param, grad, exp_avg, exp_avg_sq, p, compute_copy))

ENGINE_DECLARE_OPS(ENGINE_ADAMW_OPS)
