// The process mesh of a run: its ranks form data_parallel x tensor_parallel, tensor-parallel
// ranks adjacent (rank = dp_rank * tp + tp_rank), so that a tensor-parallel group, which talks
// in every layer, sits on one node's fastest links (consecutive ranks share a node under mpirun).
//   tp group: the ranks holding the blocks of one model replica (same dp_rank)
//   dp group: the ranks holding the same blocks (same tp_rank); gradients are summed over it
// The groups are splits of the run's group, so they use its backend (MPI, or NCCL on GPUs).
#pragma once
#include <memory>

#include "comm/comm.h"
#include "config/config.h"

namespace engine {

class Mesh {
 public:
  // group: every rank of the run; tensor_parallel must divide its size.
  Mesh(Comm& group, const Config& config);

  Comm& all() const { return *all_; }  // every rank of the run
  Comm& dp() const { return *dp_; }
  Comm* tp() const { return tp_.get(); }  // nullptr without tensor parallelism
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  std::string describe() const;

 private:
  Comm* all_ = nullptr;
  Comm* dp_ = nullptr;
  std::unique_ptr<Comm> dp_owned_, tp_;
};

}  // namespace engine
