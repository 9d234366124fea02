// CPU reference of the Mamba mixer ops (f32 or f64, every tensor one dtype), same signatures as
// ops/mamba.h. Plain loops over documents, channels and states in the tensors' own precision
// (exp, log1p in that precision); the scan backward recomputes each document's states from its
// first token and runs the reverse recurrence, ignoring chunk_states (checked for shape only).
// Forwards run channels in parallel (OpenMP); the backwards run channels in order, so dB, dC
// (sums over channels) and every result are reproducible bit for bit.
#pragma once
#include "ops/mamba.h"

namespace engine::ref {

void causal_conv1d_forward(const ops::ColumnBlock& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& cu_seqlens, bool silu, const ops::ColumnBlock& y);
void causal_conv1d_backward(const ops::ColumnBlock& dy, const ops::ColumnBlock& x,
                            const Tensor& weight, const Tensor& bias, const Tensor& cu_seqlens,
                            bool silu, const ops::ColumnBlock& dx, const Tensor& dweight,
                            const Tensor& dbias);

void selective_scan_forward(const ops::ScanArgs& a, const ops::ColumnBlock& y,
                            const Tensor& chunk_states);
void selective_scan_backward(const ops::ScanArgs& a, const ops::ColumnBlock& dy,
                             const Tensor& chunk_states, const ops::ScanGrads& g);

}  // namespace engine::ref
