#include "core/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace engine {
namespace {

constexpr uint64_t kUnlimited = UINT64_MAX;

// "Key:   123 kB" lines of /proc/meminfo, in bytes (0 when absent).
uint64_t meminfo_field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    uint64_t kb = 0;
    std::istringstream(line.substr(key.size() + 1)) >> kb;
    return kb * 1024;
  }
  return 0;
}

bool read_text(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

// A number file of the cgroup ("max" or a value at or above 2^62: no limit).
uint64_t read_limit(const std::string& path) {
  std::string text;
  if (!read_text(path, &text)) return kUnlimited;
  if (text.rfind("max", 0) == 0) return kUnlimited;
  uint64_t v = kUnlimited;
  std::istringstream(text) >> v;
  return v >= (uint64_t{1} << 62) ? kUnlimited : v;
}

// A "key value" field of a cgroup's memory.stat (0 when absent).
uint64_t stat_field(const std::string& path, const std::string& key) {
  std::string text;
  if (!read_text(path, &text)) return 0;
  std::istringstream in(text);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

// The folder of this process's memory cgroup, v2 ("0::/path") or v1 ("N:memory:/path"); in a
// container the namespace's own root is mounted at the mount point itself.
std::string cgroup_dir(bool* v2) {
  std::string text;
  if (!read_text("/proc/self/cgroup", &text)) return "";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const bool is_v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    const bool is_v1 = controllers.find("memory") != std::string::npos;
    if (!is_v2 && !is_v1) continue;
    const std::string root = is_v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const std::string probe = is_v2 ? "/memory.max" : "/memory.limit_in_bytes";
    for (const std::string& dir : {root + path, root}) {
      std::string unused;
      if (read_text(dir + probe, &unused)) {
        *v2 = is_v2;
        return dir;
      }
    }
  }
  return "";
}

}  // namespace

HostMemory host_memory() {
  HostMemory m;
  std::string info;
  if (!read_text("/proc/meminfo", &info)) return m;
  const uint64_t avail = meminfo_field(info, "MemAvailable"), swap_free = meminfo_field(info, "SwapFree");
  const uint64_t total = meminfo_field(info, "MemTotal"), swap_total = meminfo_field(info, "SwapTotal");
  if (total == 0) return m;
  m.known = true;
  m.available = avail + swap_free;
  m.capacity = total + swap_total;
  m.source = "/proc/meminfo: MemAvailable + SwapFree";
  bool v2 = false;
  const std::string dir = cgroup_dir(&v2);
  if (dir.empty()) return m;
  const uint64_t limit = read_limit(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
  if (limit == kUnlimited) return m;
  const uint64_t used = read_limit(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
  const uint64_t cache = stat_field(dir + "/memory.stat", v2 ? "file" : "total_cache");
  const uint64_t own = used == kUnlimited ? 0 : used - std::min(used, cache);
  // Swap the cgroup may still use: v2 has its own limit; v1's limit covers memory only.
  uint64_t swap = swap_free;
  if (v2) {
    const uint64_t swap_max = read_limit(dir + "/memory.swap.max");
    if (swap_max != kUnlimited) {
      const uint64_t swap_used = read_limit(dir + "/memory.swap.current");
      swap = std::min(swap, swap_max - std::min(swap_max, swap_used == kUnlimited ? 0 : swap_used));
    }
  }
  const uint64_t cg_available = limit - std::min(limit, own) + swap, cg_capacity = limit + swap;
  if (cg_available < m.available) {
    m.available = cg_available;
    m.source = "memory cgroup " + dir + ": limit - use (page cache not counted) + swap";
  }
  m.capacity = std::min(m.capacity, cg_capacity);
  return m;
}

}  // namespace engine
