// Per-kernel GPU time of a region of work, for `bench train CONFIG --profile`: CUPTI's activity
// API records every kernel, memcpy and memset the process runs on the GPU with its start and
// end timestamps; the table groups them by kernel name (demangled, arguments dropped) and sets
// their total against the region's wall time. The time no kernel ran ("GPU idle": launch gaps,
// host synchronisation, the host falling behind) is the wall time minus the union of all the
// records' intervals, so overlapping streams (communication beside compute) are not counted twice.
//
// CUPTI is opened at run time (dlopen of libcupti), so neither the build nor a run without
// --profile depends on it; start() reports why it cannot profile (no CUDA build, no CUPTI
// headers at build time, libcupti not found) instead of failing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace engine::bench {

struct KernelRecord {
  std::string name;   // demangled, argument list removed
  uint64_t start_ns = 0, end_ns = 0;
};

// The table of `records` (see KernelProfile::table) over a region of wall_seconds.
std::string kernel_table(const std::vector<KernelRecord>& records, double wall_seconds, int units, int top = 30);

class KernelProfile {
 public:
  KernelProfile() = default;
  ~KernelProfile();
  KernelProfile(const KernelProfile&) = delete;
  KernelProfile& operator=(const KernelProfile&) = delete;

  // Waits for the device, then starts recording and the wall clock. False, with the reason in
  // *why, when profiling is unavailable.
  bool start(std::string* why);
  // Waits for the device (every record complete), stops the wall clock and the recording.
  void stop();
  const std::vector<KernelRecord>& records() const { return records_; }
  double wall_seconds() const { return wall_seconds_; }

  // The table: rows by total time, `top` of them, the rest summed in one row; times per unit
  // (a training step: units = number of steps profiled) against the recorded wall time. Each
  // row's "idle ms" is the GPU's idle time just before that kernel's calls (the GPU waited for
  // the host to launch them); a line names the kernels with the most idle time before them, and
  // the longest single gaps follow with what ran before and after each (a gap at the start of
  // the region is the profiler's own set-up when the first step's copies wait behind it).
  std::string table(int units, int top = 30) const { return kernel_table(records_, wall_seconds_, units, top); }

 private:
  bool active_ = false;
  double start_time_ = 0, wall_seconds_ = 0;
  std::vector<KernelRecord> records_;
};

// Shortens a (demangled) kernel name: drops the return type, the argument list and namespaces
// of the engine, keeps template arguments (they tell variants apart). Exposed for tests.
std::string short_kernel_name(const std::string& demangled);

}  // namespace engine::bench
