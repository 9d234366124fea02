#include "parallel/mesh.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/log.h"

namespace engine {

std::string tensor_parallel_host_report(const std::vector<std::string>& hosts, int tp) {
  std::string out;
  const size_t t = static_cast<size_t>(std::max(1, tp));
  for (size_t first = 0; first + t <= hosts.size(); first += t) {
    bool split = false;
    for (size_t r = first + 1; r < first + t; ++r) split |= hosts[r] != hosts[first];
    if (!split) continue;
    std::string where;
    for (size_t r = first; r < first + t; ++r) where += str_cat(r == first ? "" : ", ", "rank ", r, " on ", hosts[r]);
    out += str_cat(out.empty() ? "" : "\n", "  ranks ", first, "-", first + t - 1, ": ", where);
  }
  return out;
}

Mesh::Mesh(Comm& group, const Config& config) : all_(&group), dp_(&group) {
  const int tp = config.distributed.tensor_parallel, pp = config.distributed.pipeline_parallel;
  const int n = group.size(), r = group.rank();
  if (n % (int64_t{tp} * pp) != 0)  // (after this, tp x pp <= n fits an int)
    RAISE(config.where(pp > 1 ? "distributed.pipeline_parallel" : "distributed.tensor_parallel"),
          "tensor_parallel x pipeline_parallel = ", tp, " x ", pp, " must divide the number of ranks (", n, ")");
  if (tp == 1 && pp == 1) return;
  const int dp = n / (tp * pp);
  const int tp_rank = r % tp, dp_rank = r / tp % dp, pp_rank = r / (tp * dp);
  if (tp > 1) {
    // A tensor-parallel group talks in every layer: across hosts it runs at the network's speed.
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "(unknown host)");
    const std::string report = tensor_parallel_host_report(all_gather_strings(group, host), tp);
    if (!report.empty() && r == 0)
      log_warn(config.where("distributed.tensor_parallel"), "tensor-parallel groups that span hosts (their ",
               "all-reduces in every layer cross the network):\n", report,
               "\n  place distributed.tensor_parallel = ", tp, " consecutive ranks on each host (mpirun: --map-by slot or ",
               "ppr:<ranks per host>:node; Slurm: --ntasks-per-node a multiple of ", tp, "; README: Across nodes)");
    tp_ = group.split(pp_rank * dp + dp_rank, tp_rank);
  }
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
