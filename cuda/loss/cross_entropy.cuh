// The CUDA-only entry points of the fused cross-entropy (cuda/loss/cross_entropy.cu), beside
// cuda::cross_entropy of ops/loss.h (declared there; it runs the Auto plan): the plan a row
// takes, and the kernel choice the tests and benchmarks force. The contract is ops/loss.h's;
// on CUDA, logits bf16 or f32 (T, V), losses f32 (T). A label outside [0, V) at a masked-in
// token raises engine::Error naming the position and the label, after the kernel ran (the
// logits may then already hold gradients; the losses are unspecified). The call synchronises
// the compute stream once (the bad-label flag is read back).
//
// Paths (cross_entropy.cu says how each one moves the bytes):
//   WarpRows   one warp per row, 8 rows per block: small vocabularies (rows of a few KB)
//   BlockRows  one block per row, the row streamed twice from global memory (any V)
//   Cluster    a cluster of 1-8 blocks per row, each holding its slice of the row in shared
//              memory: the row is read once and written once (the bytes floor)
// Auto picks by the row size (clusters of more than one block exchange by Push where the slice
// fits, else Barrier); tests and benchmarks may force a path, a cluster size and the exchange.
// Plain C++ declarations: includable from g++-built files.
#pragma once
#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "ops/loss.h"

namespace engine::cuda {

enum class CrossEntropyPath { Auto, WarpRows, BlockRows, Cluster };

// How the blocks of a row's cluster (Cluster, C > 1) share their row statistics.
enum class ClusterExchange {
  Barrier,  // each block writes its own shared memory, a cluster barrier with release/acquire
            // (a GPU-scope fence), every block reads all others' (distributed shared memory)
  Push,     // each block pushes its statistics into every block's shared memory (st.async),
            // completing on an mbarrier there: no fence, relaxed cluster barriers only
};

struct CrossEntropyPlan {
  CrossEntropyPath path = CrossEntropyPath::Auto;  // resolved: never Auto
  int cluster = 1;          // blocks per row (Cluster), else 1
  int64_t slice_bytes = 0;  // dynamic shared memory per block (Cluster: its slice), else 0
  ClusterExchange exchange = ClusterExchange::Barrier;  // Cluster
};

// What a test or benchmark forces (0: choose).
struct CrossEntropyChoice {
  CrossEntropyPath path = CrossEntropyPath::Auto;
  int cluster = 0;
  ClusterExchange exchange = ClusterExchange::Barrier;  // Cluster (Auto: Barrier)
};

// The plan cross_entropy runs for this vocabulary and dtype; nullopt when a forced path or
// cluster size cannot hold the row (a slice over the shared-memory limit, a cluster size
// outside {1, 2, 4, 8}, an exchange given to a path without one, or a cluster the device cannot
// schedule).
std::optional<CrossEntropyPlan> cross_entropy_plan(int64_t vocab, DType dtype,
                                                   const CrossEntropyChoice& choice);
inline std::optional<CrossEntropyPlan> cross_entropy_plan(
    int64_t vocab, DType dtype, CrossEntropyPath path = CrossEntropyPath::Auto, int cluster = 0) {
  return cross_entropy_plan(vocab, dtype, CrossEntropyChoice{path, cluster});
}

// cuda::cross_entropy with a forced choice, on stream(). It checks only what the kernels need
// (dtype, alignment, a plan that holds the row); the shared preconditions of ops/loss.cpp are
// the caller's (ops::cross_entropy runs them; tests and benchmarks pass valid arguments).
void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale,
                   const CrossEntropyChoice& choice, float z_loss = 0.f,
                   float label_smoothing = 0.f, int64_t columns = 0);
inline void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                          const Tensor& losses, bool with_grad, float grad_scale,
                          CrossEntropyPath path, int cluster = 0, float z_loss = 0.f,
                          float label_smoothing = 0.f, int64_t columns = 0) {
  cross_entropy(logits, labels, mask, losses, with_grad, grad_scale,
                CrossEntropyChoice{path, cluster}, z_loss, label_smoothing, columns);
}

}  // namespace engine::cuda
