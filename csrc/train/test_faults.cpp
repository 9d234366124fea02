#include "train/test_faults.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "checkpoint/file_io.h"
#include "comm/launch.h"
#include "core/faults.h"
#include "core/log.h"

namespace engine {
namespace {

struct Request {
  int rank = -1, step = -1;
  std::string what;  // ENGINE_TEST_KILL: "step" or "checkpoint"
};

class EnvFaults final : public faults::Hooks {
 public:
  Request kill, stall;
  int missing_data_rank = -1;

  void at(faults::Point point, const faults::Site& s) override {
    using faults::Point;
    switch (point) {
      case Point::StepStart:
        if (s.rank == stall.rank && s.step == stall.step) {
          log_warn("ENGINE_TEST_STALL: rank ", s.rank, " stalls at step ", s.step);
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        break;
      case Point::StepEnd:
        if (hit(kill, s, "step")) std::raise(SIGKILL);
        break;
      case Point::CheckpointWrite:
        if (hit(kill, s, "checkpoint")) checkpoint::inject_write_kill(4096);
        break;
      case Point::TrainData:
        if (s.rank == missing_data_rank && s.path) *s.path += ".missing-on-this-rank";
        break;
    }
  }

 private:
  static bool hit(const Request& r, const faults::Site& s, const char* what) {
    return r.rank == s.rank && r.step == s.step && r.what == what;
  }
};

}  // namespace

void install_test_faults_from_env() {
  auto hooks = std::make_unique<EnvFaults>();
  bool any = false;
  if (const char* spec = std::getenv("ENGINE_TEST_KILL")) {
    char what[16] = {0};
    if (std::sscanf(spec, "%d:%d:%15s", &hooks->kill.rank, &hooks->kill.step, what) == 3) {
      hooks->kill.what = what;
      any = true;
    }
  }
  if (const char* spec = std::getenv("ENGINE_TEST_STALL"))
    any |= std::sscanf(spec, "%d:%d", &hooks->stall.rank, &hooks->stall.step) == 2;
  if (const char* r = std::getenv("ENGINE_TEST_MISSING_DATA")) {
    hooks->missing_data_rank = std::atoi(r);
    any = true;
  }
  if (const char* spec = std::getenv("ENGINE_TEST_FULL_DISK")) {
    int rank = -1;
    long long bytes = -1;
    if (std::sscanf(spec, "%d:%lld", &rank, &bytes) == 2 && rank == launch_info().rank)
      checkpoint::inject_write_failure(bytes);
  }
  if (any) faults::install(std::move(hooks));
}

}  // namespace engine
