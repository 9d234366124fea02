// The chunked Gated DeltaNet rule (ops/delta.h) in a CUDA build: no GPU kernels yet (the per-head
// gated norm and the one-token step are cuda/mamba/delta_norm.cu). The run plan refuses models
// with Gated DeltaNet (G) blocks on the GPU before anything is allocated (train/plan.cpp), so
// these are reached only by a direct call; each names the op and where the mixer runs.
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

}  // namespace engine::cuda
