// A per-process watchdog against hangs. arm(what, seconds) before work that must finish in time
// (a training step, a validation, a checkpoint save), disarm() after. When armed work outlasts
// its limit, the process prints
//   error: [rank r] <what> did not finish within N s (distributed.timeout_s): ...
// and exits with code 3; under mpirun the other ranks are then ended too, so a rank that died
// without an error, or waits in a collective that another rank never reaches, never leaves the
// job hanging. One background thread, started on the first arm; seconds <= 0 disarms.
#pragma once
#include <string>

namespace engine {

class Watchdog {
 public:
  static void arm(const std::string& what, double seconds);
  static void disarm();
};

struct WatchdogScope {
  WatchdogScope(const std::string& what, double seconds) { Watchdog::arm(what, seconds); }
  ~WatchdogScope() { Watchdog::disarm(); }
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;
};

}  // namespace engine
