#include "parallel/mesh.h"

namespace engine {

Mesh::Mesh(Comm& group, const Config& config) : all_(&group), dp_(&group) {
  const int tp = config.distributed.tensor_parallel, pp = config.distributed.pipeline_parallel;
  const int n = group.size(), r = group.rank();
  if (n % (int64_t{tp} * pp) != 0)  // (after this, tp x pp <= n fits an int)
    RAISE(config.where(pp > 1 ? "distributed.pipeline_parallel" : "distributed.tensor_parallel"),
          "tensor_parallel x pipeline_parallel = ", tp, " x ", pp, " must divide the number of ranks (", n, ")");
  if (tp == 1 && pp == 1) return;
  const int dp = n / (tp * pp);
  const int tp_rank = r % tp, dp_rank = r / tp % dp, pp_rank = r / (tp * dp);
  if (tp > 1) tp_ = group.split(pp_rank * dp + dp_rank, tp_rank);
  if (pp > 1) pp_ = group.split(dp_rank * tp + tp_rank, pp_rank);
  dp_owned_ = group.split(pp_rank * tp + tp_rank, dp_rank);
  dp_ = dp_owned_.get();
}

std::string Mesh::describe() const {
  std::string s = str_cat(dp_->size(), " data-parallel x ", tp_size(), " tensor-parallel");
  if (pp_size() > 1) s += str_cat(" x ", pp_size(), " pipeline");
  return s + " rank(s)";
}

}  // namespace engine
