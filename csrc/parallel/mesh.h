// The process mesh of a run: its ranks form pipeline_parallel x data_parallel x tensor_parallel,
// tensor-parallel ranks adjacent and pipeline stages outermost:
//   rank = (pp_rank * dp + dp_rank) * tp + tp_rank
// so that a tensor-parallel group, which talks in every layer, sits on one node's fastest links
// (consecutive ranks share a node under mpirun), and the pipeline, which talks least, spans nodes.
//   tp group: the ranks holding the blocks of one stage of one replica (same pp, dp rank)
//   dp group: the ranks holding the same parameters (same pp, tp rank); gradients summed over it
//   pp group: the stages of one replica (same dp, tp rank); activations pass along it
// The groups are splits of the run's group, so they use its backend (MPI, or NCCL on GPUs).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"

namespace engine {

class Mesh {
 public:
  // group: every rank of the run; tensor_parallel x pipeline_parallel must divide its size.
  Mesh(Comm& group, const Config& config);

  Comm& all() const { return *all_; }  // every rank of the run
  Comm& dp() const { return *dp_; }
  Comm* tp() const { return tp_.get(); }  // nullptr without tensor parallelism
  Comm* pp() const { return pp_.get(); }  // nullptr without pipeline parallelism
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  int pp_size() const { return pp_ ? pp_->size() : 1; }
  int pp_rank() const { return pp_ ? pp_->rank() : 0; }
  std::string describe() const;

 private:
  Comm* all_ = nullptr;
  Comm* dp_ = nullptr;
  std::unique_ptr<Comm> dp_owned_, tp_, pp_;
};

// The tensor-parallel groups (tp consecutive ranks) that span more than one host, one line each
// naming the ranks and their hosts ("" when every group sits on one host). hosts: one name per
// rank of the run, in rank order.
std::string tensor_parallel_host_report(const std::vector<std::string>& hosts, int tp);

}  // namespace engine
