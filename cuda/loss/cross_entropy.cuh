// Fused cross-entropy over CUDA logits (T, V), the CUDA backend of ops::cross_entropy
// (csrc/ops/loss.h; CPU reference csrc/ref/loss.cpp). For every row t with mask(t) != 0:
//   m = max_v x_v,  s = sum_v exp(x_v - m),  lse = m + log s
//   losses(t) = lse - (1 - eps) x_label - eps mean_v x_v + z lse^2
//   with_grad: x_v <- grad_scale * ((1 + 2 z lse) exp(x_v - lse) - (1 - eps)[v == label] - eps / V)
//              in place, logits' dtype
// (z = z_loss, eps = label_smoothing; both 0: the plain cross-entropy and softmax - onehot).
// Masked rows: losses(t) = 0 and (with_grad) a zero gradient row; their labels are never read.
// logits bf16 or f32 (T, V); labels i32 (T); mask u8 (T); losses f32 (T). A label outside
// [0, V) at a masked-in token raises engine::Error naming the position and the label, after
// the kernel ran (the logits may then already hold gradients; the losses are unspecified).
// The call synchronises the compute stream once (the bad-label flag is read back).
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

// ops::cross_entropy for CUDA tensors (see the top of this file), on stream().
void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale,
                   const CrossEntropyChoice& choice, float z_loss = 0.f,
                   float label_smoothing = 0.f, int64_t columns = 0);
inline void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                          const Tensor& losses, bool with_grad, float grad_scale,
                          CrossEntropyPath path = CrossEntropyPath::Auto, int cluster = 0,
                          float z_loss = 0.f, float label_smoothing = 0.f, int64_t columns = 0) {
  cross_entropy(logits, labels, mask, losses, with_grad, grad_scale,
                CrossEntropyChoice{path, cluster}, z_loss, label_smoothing, columns);
}

}  // namespace engine::cuda
