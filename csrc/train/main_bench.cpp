// ./bench [area ...]            kernel benchmarks (all areas, or the named ones)
// ./bench --list                the areas
// ./bench train CONFIG [k=v ...] [--profile]  end-to-end training throughput of a config on synthetic
//                                data; --profile adds the per-kernel time table of two more steps
// Kernel cases print time, TFLOP/s or GB/s and the share of the H200 ceilings (DEVICE.md).
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/train_bench.h"
#include "comm/launch.h"
#include "core/log.h"

int main(int argc, char** argv) {
  using namespace engine;
  const bool print = launch_init(&argc, &argv).rank == 0;  // under mpirun, rank 0 reports
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (!args.empty() && args[0] == "train") {
      ENSURE(args.size() >= 2, "usage: bench train CONFIG.toml [section.key=value ...] [--profile]");
      const int code = bench::run_train_bench(args[1], std::vector<std::string>(args.begin() + 2, args.end()));
      launch_finalize();
      return code;
    }
    if (!args.empty() && (args[0] == "--list" || args[0] == "-h" || args[0] == "--help")) {
      std::printf("usage: bench [area ...] | bench train CONFIG.toml [k=v ...] [--profile]\nareas:");
      std::set<std::string> areas;
      for (const auto& r : bench::registered_cases()) areas.insert(r.area);
      for (const auto& a : areas) std::printf(" %s", a.c_str());
      std::printf("\n");
      return 0;
    }
    const std::set<std::string> wanted(args.begin(), args.end());
    int ran = 0;
    for (const auto& r : bench::registered_cases()) {
      if (!wanted.empty() && !wanted.count(r.area)) continue;
      if (print) std::printf("== %s\n", r.area.c_str());
      std::fflush(stdout);
      for (const bench::Result& res : r.run())
        if (print) std::printf("%s\n", bench::format(res).c_str());
      std::fflush(stdout);
      ++ran;
    }
    ENSURE(ran > 0 || bench::registered_cases().empty(), "no benchmark area matches (see --list)");
    launch_finalize();
    return 0;
  } catch (const std::exception& e) {
    fatal_error(e.what());
  }
}
