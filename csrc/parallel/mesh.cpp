#include "parallel/mesh.h"

namespace engine {

Mesh::Mesh(Comm& group, const Config& config) : all_(&group), dp_(&group) {
  const int tp = config.distributed.tensor_parallel, n = group.size(), r = group.rank();
  if (n % tp != 0)
    RAISE(config.where("distributed.tensor_parallel"), "must divide the number of ranks (", n, "), got ", tp);
  if (tp == 1) return;
  tp_ = group.split(r / tp, r % tp);
  dp_owned_ = group.split(r % tp, r / tp);
  dp_ = dp_owned_.get();
}

std::string Mesh::describe() const {
  return str_cat(dp_->size(), " data-parallel x ", tp_size(), " tensor-parallel rank(s)");
}

}  // namespace engine
