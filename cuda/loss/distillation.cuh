// The CUDA-only entry points of the fused distillation loss (cuda/loss/distillation.cu), beside
// cuda::distillation_loss of ops/loss.h (declared there; it runs the Auto plan): the plan a row
// takes, and the path the tests and benchmarks force. The contract and formulas are
// ops/loss.h's; on CUDA, logits and teacher bf16 or f32, losses and distill_losses f32. Per
// masked-in row: one pass of statistics over the student's and the teacher's row together
// (online maxima and sums of exponentials of x / tau and y / tau, the kind's weighted sum, and
// for a label term the untempered sum and the label's logit), the loss, and (with_grad) one
// pass writing the gradient in place in the logits' dtype. With a label term, a label outside
// [0, V) at a masked-in token raises engine::Error after the kernel ran (the call then
// synchronises the compute stream once, to read the flag back); without one the call does not
// synchronise. No scratch but that 8-byte flag: memory is O(1) beyond the tensors.
//
// Paths (distillation.cu says how each one moves the bytes):
//   WarpRows   one warp per row, 8 rows per block: small vocabularies (rows of a few KB)
//   BlockRows  one block per row, both rows streamed twice from global memory (any V, any
//              alignment of the teacher relative to the logits)
//   Cluster    a cluster of 1-8 blocks per row, each holding its slice of both rows in shared
//              memory: both rows are read once and the gradient written once (the bytes floor);
//              needs the two rows at the same 16-byte alignment (always so for tensors from the
//              allocator) and thread-block clusters (compute capability 9 and code for sm_90 or
//              later: cuda/common/arch.h); elsewhere Auto takes WarpRows or BlockRows
// Auto picks by the row size (Cluster up to 4 blocks per row, else BlockRows, which is faster
// than 8-block clusters; figures: docs/PERF.md); tests and benchmarks may force a path and a
// cluster size.
// Plain C++ declarations: includable from g++-built files.
#pragma once
#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "ops/loss.h"

namespace engine::cuda {

enum class DistillPath { Auto, WarpRows, BlockRows, Cluster };

struct DistillPlan {
  DistillPath path = DistillPath::Auto;  // resolved: never Auto
  int cluster = 1;                       // blocks per row (Cluster), else 1
  int64_t slice_bytes = 0;               // shared memory per block for both slices (Cluster)
};

// The plan distillation_loss runs for this vocabulary and dtype; coaligned: the logits' and
// the teacher's rows start at the same offset modulo 16 bytes. nullopt when a forced path or
// cluster size cannot hold the row (as cross_entropy_plan). cluster = 0: choose.
std::optional<DistillPlan> distillation_plan(int64_t vocab, DType dtype, bool coaligned,
                                             DistillPath path = DistillPath::Auto, int cluster = 0);

// cuda::distillation_loss on a forced path and cluster size (0: choose), on stream(). It
// checks only what the kernels need (dtype, alignment, a plan that holds the row); the shared
// preconditions of ops/loss.cpp are the caller's (ops::distillation_loss runs them; tests and
// benchmarks pass valid arguments).
void distillation_loss(const Tensor& logits, const Tensor& teacher, const Tensor& labels,
                       const Tensor& mask, const ops::DistillParams& p, const Tensor& losses,
                       const Tensor& distill_losses, bool with_grad, float grad_scale,
                       DistillPath path, int cluster = 0);

}  // namespace engine::cuda
