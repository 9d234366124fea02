// CPU reference of the AdamW step (f32 state; compute_copy bf16 or f32), same signature as
// ops/adamw.h.
#pragma once
#include "ops/adamw.h"

namespace engine::ref {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const ops::AdamWParams& p,
                const Tensor& compute_copy = {});

}  // namespace engine::ref
