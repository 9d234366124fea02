// ./train run.toml [section.key=value ...]
// Trains the model the config describes; see README.md for the config reference.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/launch.h"
#include "config/config.h"
#include "core/log.h"
#include "train/trainer.h"

static void usage() {
  std::printf(
      "usage: train CONFIG.toml [section.key=value ...]\n"
      "  Trains the model described by CONFIG.toml; every key can be overridden on the command\n"
      "  line, e.g. train configs/tiny-llama.toml training.steps=50 optimizer.lr=1e-3\n"
      "  --print-config   print the effective config (defaults and overrides applied) and exit\n");
}

int main(int argc, char** argv) {
  engine::launch_init(&argc, &argv);
  std::vector<std::string> overrides;
  std::string path;
  bool print_config = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      usage();
      return 0;
    }
    if (!std::strcmp(argv[i], "--print-config")) {
      print_config = true;
    } else if (path.empty() && std::strchr(argv[i], '=') == nullptr) {
      path = argv[i];
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "error: unknown option %s (see --help)\n", argv[i]);
      return 2;
    } else {
      overrides.emplace_back(argv[i]);
    }
  }
  if (path.empty()) {
    usage();
    return 2;
  }
  engine::Trainer::install_signal_handlers();
  try {
    engine::Config config = engine::load_config(path, overrides);
    if (print_config) {
      std::fputs(engine::config_to_toml(config).c_str(), stdout);
      return 0;
    }
    int code = 0;
    {
      engine::Trainer trainer(config);
      code = trainer.run();
    }
    engine::launch_finalize();
    return code;
  } catch (const std::exception& e) {
    // Ends every rank (MPI_Abort) so none waits in a collective for this one.
    engine::fatal_error(e.what());
  }
}
