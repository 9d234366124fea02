#include "comm/watchdog.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "comm/launch.h"

namespace engine {

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::mutex mu;
  std::condition_variable cv;
  bool armed = false;
  std::string what;
  double seconds = 0;
  Clock::time_point deadline;
  bool started = false;
};

State& state() {
  static State* s = new State;  // never destroyed: the thread may outlive static destruction
  return *s;
}

[[noreturn]] void expire(const std::string& what, double seconds) {
  const LaunchInfo& info = launch_info();
  if (info.world_size > 1)
    std::fprintf(stderr,
                 "error: [rank %d] %s did not finish within %g s (distributed.timeout_s): a rank is stuck, died, or "
                 "waits in a collective another rank never reached; ending the job\n",
                 info.rank, what.c_str(), seconds);
  else
    std::fprintf(stderr, "error: %s did not finish within %g s (distributed.timeout_s); ending the run\n",
                 what.c_str(), seconds);
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(3);  // no MPI call from this thread: mpirun ends the other ranks when one exits non-zero
}

void watch() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    if (!s.armed) {
      s.cv.wait(lock);
      continue;
    }
    if (Clock::now() >= s.deadline) expire(s.what, s.seconds);
    s.cv.wait_until(lock, s.deadline);
  }
}

}  // namespace

void Watchdog::arm(const std::string& what, double seconds) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.armed = seconds > 0;
  if (!s.armed) return;
  s.what = what;
  s.seconds = seconds;
  s.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  if (!s.started) {
    std::thread(watch).detach();
    s.started = true;
  }
  s.cv.notify_all();
}

void Watchdog::disarm() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.armed = false;
  s.cv.notify_all();
}

}  // namespace engine
