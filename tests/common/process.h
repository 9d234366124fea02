// Runs a command line through the shell and captures its output (stdout and stderr together)
// and exit code; the end-to-end tests of ./train and mpirun use it.
#pragma once
#include <string>

namespace engine::testing {

struct ProcessResult {
  int code = -1;        // exit status, or 128 + signal
  std::string output;   // stdout and stderr
};

ProcessResult run_command(const std::string& command);
// The train program the tests run: $TRAIN_BIN, else ./train.
std::string train_binary();
// True when that program exists; otherwise records the test as skipped (run from the repository
// root) and returns false.
bool has_train_binary();

}  // namespace engine::testing
