// The warning for tensor-parallel groups that span hosts (parallel/mesh.h): each group of tp
// consecutive ranks is named with its ranks' hosts when they differ.
#include <doctest/doctest.h>

#include "parallel/mesh.h"

using namespace engine;

TEST_CASE("mesh: tensor-parallel groups that span hosts are named with their ranks and hosts") {
  // Two hosts of four ranks: tp 2 and 4 stay inside a host, tp 8 spans both.
  const std::vector<std::string> two_by_four = {"a", "a", "a", "a", "b", "b", "b", "b"};
  CHECK(tensor_parallel_host_report(two_by_four, 1).empty());
  CHECK(tensor_parallel_host_report(two_by_four, 2).empty());
  CHECK(tensor_parallel_host_report(two_by_four, 4).empty());
  CHECK(tensor_parallel_host_report(two_by_four, 8) ==
        "  ranks 0-7: rank 0 on a, rank 1 on a, rank 2 on a, rank 3 on a, rank 4 on b, rank 5 on b, rank 6 on b, "
        "rank 7 on b");
  // Three ranks a host (a launcher placing ranks round-robin, or an odd count per host): groups 1
  // and 2 of tp 2 cross.
  const std::vector<std::string> threes = {"a", "a", "a", "b", "b", "b"};
  CHECK(tensor_parallel_host_report(threes, 2) == "  ranks 2-3: rank 2 on a, rank 3 on b");
  const std::vector<std::string> round_robin = {"a", "b", "a", "b"};
  CHECK(tensor_parallel_host_report(round_robin, 2) ==
        "  ranks 0-1: rank 0 on a, rank 1 on b\n  ranks 2-3: rank 2 on a, rank 3 on b");
}
