// Per-layer tensor statistics for debugging runs (run.debug_level >= 2, on run.debug_steps):
// count, sum, sum of squares, max |x| and NaN count of each recorded tensor, accumulated over a
// step's micro-batches and merged over every rank of the run, so that any layout (dp, tp with or
// without sequence parallelism, pp, GPU or CPU) yields the statistics of the same full tensors.
// Recorded: the residual stream after the embedding and after each block (forward), and the
// gradients flowing back into the head's input and each block's input (backward), in the order
// they are computed. scripts/compare_stats.py compares two runs and names the first that diverge.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/tensor.h"

namespace engine {

struct TensorStats {
  double count = 0, sum = 0, sumsq = 0, max_abs = 0, nan = 0;  // nan: NaN or infinite elements
  void add(const Tensor& t);  // any float dtype, either device (copied to the host)
  double mean() const { return count - nan > 0 ? sum / (count - nan) : 0; }
  double std() const;
};

class StatsRecorder {
 public:
  // The tensors of a model with num_layers blocks, in computation order.
  explicit StatsRecorder(int num_layers);
  static std::string forward_name(int layer);   // -1: the embedding's output
  static std::string backward_name(int layer);  // the gradient into block `layer`'s input
  static constexpr const char* kHeadGrad = "head.in_grad";
  // Adds x to the statistics of `name` (one of the names above).
  void record(const std::string& name, const Tensor& x);
  // Sums counts, sums and NaNs and takes the max of max_abs over `all` (every rank calls it).
  void merge(Comm& all);
  const std::vector<std::string>& names() const { return names_; }
  const TensorStats& at(const std::string& name) const { return stats_.at(name); }
  void clear();

 private:
  std::vector<std::string> names_;
  std::map<std::string, TensorStats> stats_;
};

}  // namespace engine
