// The AdamW op (ops/adamw.h): the preconditions both backends share, and the dispatch. Both
// take the same dtypes (f32 state, a bf16 or f32 copy), so every check is here.
#include "ops/adamw.h"

#include <cmath>

namespace engine::ops {
namespace {

// `runs` (when not empty) end in increasing order at n.
void check_decay_runs(const std::vector<DecayRun>& runs, int64_t n, const char* op) {
  int64_t begin = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    ENSURE(runs[k].end > begin, op, ": decay run ", k, " ends at ", runs[k].end,
           ", not after the previous end ", begin);
    ENSURE(std::isfinite(runs[k].lr_scale) && runs[k].lr_scale >= 0, op, ": decay run ", k, " has learning-rate scale ",
           runs[k].lr_scale, " (must be finite and >= 0)");
    begin = runs[k].end;
  }
  ENSURE(runs.empty() || begin == n, op, ": the decay runs end at ", begin, ", the buffer at ", n);
}

void check_adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                      const Tensor& exp_avg_sq, const AdamWParams& p,
                      const Tensor& compute_copy) {
  const char* op = "adamw_step";
  expect_defined(param, op, "param");
  ENSURE(param.dtype == DType::F32 || param.dtype == DType::U16, op, ": param is ", dtype_name(param.dtype),
         ", expected f32 (the master) or u16 (the low half of a split master)");
  const int64_t n = param.numel();
  if (param.dtype == DType::U16)
    ENSURE(compute_copy.data && compute_copy.dtype == DType::BF16, op,
           ": a split master (u16 param) needs its high half, the bf16 compute_copy");
  auto same_length = [&](const Tensor& t, const char* name) {
    expect_defined(t, op, name);
    expect_dtype(t, DType::F32, op, name);
    ENSURE(t.numel() == n, op, ": ", name, " has ", t.numel(), " elements ", t.shape.str(),
           ", param has ", n);
  };
  same_length(grad, "grad");
  same_length(exp_avg, "exp_avg");
  same_length(exp_avg_sq, "exp_avg_sq");
  if (compute_copy.data) {
    ENSURE(compute_copy.dtype == DType::BF16 || compute_copy.dtype == DType::F32, op,
           ": compute_copy is ", dtype_name(compute_copy.dtype), ", expected bf16 or f32");
    ENSURE(compute_copy.numel() == n, op, ": compute_copy has ", compute_copy.numel(),
           " elements, param has ", n);
  }
  ENSURE(p.step >= 1, op, ": step = ", p.step, " (counted from 1)");
  ENSURE(p.eps > 0.f, op, ": eps = ", p.eps, " must be positive");
  ENSURE(p.beta1 >= 0.f && p.beta1 < 1.f && p.beta2 >= 0.f && p.beta2 < 1.f, op, ": beta1 = ",
         p.beta1, ", beta2 = ", p.beta2, " must be in [0, 1)");
  check_decay_runs(p.decay_runs, n, op);
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_ADAMW_OPS)

}  // namespace engine::ops
