#include "tests/common/process.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/check.h"
#include "tests/common/testing.h"

namespace engine::testing {

ProcessResult run_command(const std::string& command) {
  ProcessResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  ENSURE(p != nullptr, "cannot run ", command);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string train_binary() {
  const char* bin = std::getenv("TRAIN_BIN");
  return bin ? bin : "./train";
}

bool has_train_binary() {
  if (std::filesystem::exists(train_binary())) return true;
  skip_test("no ./train binary in the working directory (run from the repository root)");
  return false;
}

}  // namespace engine::testing
