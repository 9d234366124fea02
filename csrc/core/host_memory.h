// How much host memory this process may still take, for the run's memory check before anything
// is allocated (models/memory_estimate.h). Read from /proc/meminfo (MemAvailable and SwapFree;
// MemTotal and SwapTotal for the capacity) and capped by the memory cgroup the process runs in
// (v2: memory.max, v1: memory.limit_in_bytes), whose use is counted without its page cache (which
// the kernel reclaims). Figures err on the generous side: the check must never refuse a run that
// would fit.
#pragma once
#include <cstdint>
#include <string>

namespace engine {

struct HostMemory {
  bool known = false;     // false where /proc/meminfo cannot be read: no check
  uint64_t available = 0;  // bytes free for this process now
  uint64_t capacity = 0;   // bytes the processes of this host (or cgroup) can hold at all
  std::string source;      // where the figures come from, for messages
};

HostMemory host_memory();

}  // namespace engine
