// The Gated DeltaNet ops (ops/delta.h) in a CUDA build: no GPU kernels yet. The run plan refuses
// models with Gated DeltaNet (G) blocks on the GPU before anything is allocated (train/plan.cpp),
// so these are reached only by a direct call; each names the op and where the mixer runs.
#include "ops/delta.h"

namespace engine::cuda {
namespace {

[[noreturn]] void no_kernel(const char* op) {
  RAISE(op, ": no CUDA kernel yet; Gated DeltaNet (G) blocks run on the CPU (run.device = \"cpu\")");
}

}  // namespace

void gated_delta_forward(const ops::DeltaArgs&, const ops::ColumnBlock&) { no_kernel("gated_delta_forward"); }
void gated_delta_backward(const ops::DeltaArgs&, const ops::ColumnBlock&, const ops::DeltaGrads&) {
  no_kernel("gated_delta_backward");
}
void gated_delta_step(const ops::DeltaArgs&, const Tensor&, const ops::ColumnBlock&) { no_kernel("gated_delta_step"); }
void head_rmsnorm_gated_forward(const ops::ColumnBlock&, const ops::ColumnBlock&, const Tensor&, float,
                                const ops::ColumnBlock&, const Tensor&) {
  no_kernel("head_rmsnorm_gated_forward");
}
void head_rmsnorm_gated_backward(const ops::ColumnBlock&, const ops::ColumnBlock&, const ops::ColumnBlock&,
                                 const Tensor&, const Tensor&, const ops::ColumnBlock&, const ops::ColumnBlock&,
                                 const Tensor&) {
  no_kernel("head_rmsnorm_gated_backward");
}

}  // namespace engine::cuda
