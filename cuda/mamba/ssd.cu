// The Mamba-2 ops (ops/ssd.h) in a CUDA build: no GPU kernels yet. The run plan refuses models
// with Mamba-2 (S) blocks on the GPU before anything is allocated (train/plan.cpp), so these are
// reached only by a direct call; each names the op and where the mixer runs.
#include "ops/ssd.h"

namespace engine::cuda {
namespace {

[[noreturn]] void no_kernel(const char* op) {
  RAISE(op, ": no CUDA kernel yet; Mamba-2 (S) blocks run on the CPU (run.device = \"cpu\")");
}

}  // namespace

void ssd_scan_forward(const ops::SsdArgs&, const ops::ColumnBlock&, const Tensor&) { no_kernel("ssd_scan_forward"); }
void ssd_scan_backward(const ops::SsdArgs&, const ops::ColumnBlock&, const Tensor&, const ops::SsdGrads&) {
  no_kernel("ssd_scan_backward");
}
void ssd_scan_step(const ops::SsdArgs&, const Tensor&, const ops::ColumnBlock&) { no_kernel("ssd_scan_step"); }
void gated_rmsnorm_sumsq(const ops::ColumnBlock&, const ops::ColumnBlock&, const Tensor&) {
  no_kernel("gated_rmsnorm_sumsq");
}
void gated_rmsnorm_forward(const ops::ColumnBlock&, const ops::ColumnBlock&, const Tensor&, const Tensor&, int64_t,
                           float, const ops::ColumnBlock&) {
  no_kernel("gated_rmsnorm_forward");
}
void gated_rmsnorm_dot(const ops::ColumnBlock&, const ops::ColumnBlock&, const ops::ColumnBlock&, const Tensor&,
                       const Tensor&) {
  no_kernel("gated_rmsnorm_dot");
}
void gated_rmsnorm_backward(const ops::ColumnBlock&, const ops::ColumnBlock&, const ops::ColumnBlock&, const Tensor&,
                            const Tensor&, const Tensor&, int64_t, float, const ops::ColumnBlock&,
                            const ops::ColumnBlock&, const Tensor&) {
  no_kernel("gated_rmsnorm_backward");
}

}  // namespace engine::cuda
