// CUDA launchers of Mamba's selective scan (contract: csrc/ops/mamba.h; kernels: scan.cu forward,
// scan_backward.cu backward). Activations, weights (A_log, D, dt_bias) and activation gradients
// bf16 (column blocks of row-major tensors, any alignment); chunk_states f32; dA_log, dD, ddt_bias
// f32, accumulated (+=) by deterministic reductions. N <= 16, chunk_len <= 128; the row strides of
// x, z, y, dy, dx and dz below 2^31 elements.
#pragma once
#include "ops/mamba.h"

namespace engine::cuda {

void selective_scan_forward(const ops::ScanArgs& a, const ops::ColumnBlock& y,
                            const Tensor& chunk_states);
void selective_scan_backward(const ops::ScanArgs& a, const ops::ColumnBlock& dy,
                             const Tensor& chunk_states, const ops::ScanGrads& g);

}  // namespace engine::cuda
