#include "bench/kernel_profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>

#include "core/check.h"

#if defined(ENGINE_CUDA) && __has_include(<cupti_activity.h>)
#define ENGINE_CUPTI 1
#include <cuda_runtime.h>
#include <cupti_activity.h>
#include <dlfcn.h>

#include "cuda/common/check.cuh"
#endif

namespace engine::bench {

#ifdef ENGINE_CUPTI
namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace
#endif

std::string short_kernel_name(const std::string& demangled) {
  std::string s = demangled;
  // The argument list: the first '(' outside template brackets (a "(anonymous namespace)" inside
  // the qualified name is a namespace, not arguments).
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    else if (c == '>') depth = std::max(0, depth - 1);
    else if (c == '(' && depth == 0) {
      if (s.compare(i, 21, "(anonymous namespace)") == 0) {
        i += 20;
        continue;
      }
      s.resize(i);
      break;
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  for (const char* prefix : {"engine::cuda::(anonymous namespace)::", "engine::cuda::", "engine::"}) {
    for (size_t at; (at = s.find(prefix)) != std::string::npos;) s.erase(at, std::char_traits<char>::length(prefix));
  }
  return s;
}

#ifdef ENGINE_CUPTI
namespace {

// The CUPTI entry points, resolved from libcupti at run time.
struct Cupti {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  std::string error;  // why it could not be opened, or empty

  static const Cupti& get() {
    static const Cupti c = open();
    return c;
  }

 private:
  static Cupti open() {
    Cupti c;
    void* lib = nullptr;
    std::string tried;
    std::vector<std::string> names = {"libcupti.so", "libcupti.so.13", "libcupti.so.12"};
    if (const char* home = std::getenv("CUDA_HOME")) {
      names.push_back(std::string(home) + "/lib64/libcupti.so");
      names.push_back(std::string(home) + "/extras/CUPTI/lib64/libcupti.so");
    }
    names.push_back("/usr/local/cuda/lib64/libcupti.so");
    names.push_back("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so");
    for (const std::string& n : names) {
      if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
      tried += (tried.empty() ? "" : ", ") + n;
    }
    if (lib == nullptr) {
      c.error = "libcupti not found (tried " + tried + ")";
      return c;
    }
    auto sym = [&](const char* name, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && c.error.empty()) c.error = std::string("libcupti lacks ") + name;
    };
    sym("cuptiActivityRegisterCallbacks", c.register_callbacks);
    sym("cuptiActivityEnable", c.enable);
    sym("cuptiActivityDisable", c.disable);
    sym("cuptiActivityFlushAll", c.flush_all);
    sym("cuptiActivityGetNextRecord", c.next_record);
    sym("cuptiGetResultString", c.result_string);
    return c;
  }
};

void cupti_check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = "unknown error";
  Cupti::get().result_string(r, &s);
  RAISE("CUPTI ", what, ": ", s);
}

std::mutex g_mutex;
std::vector<KernelRecord>* g_sink = nullptr;  // the recording profile's records

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;  // no memory: CUPTI drops the records
  *max_records = 0;  // as many as fit
}

std::string demangle(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  return s;
}

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

// Record layouts only grow at their ends between CUPTI versions, so the fields read here sit at
// the same offsets in the library's (possibly newer) records.
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  const Cupti& c = Cupti::get();
  CUpti_Activity* rec = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    while (g_sink != nullptr && c.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        g_sink->push_back({short_kernel_name(demangle(k->name ? k->name : "?")), k->start, k->end});
      } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        g_sink->push_back({std::string("[memcpy ") + copy_kind(m->copyKind) + "]", m->start, m->end});
      } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        g_sink->push_back({"[memset]", m->start, m->end});
      }
    }
  }
  std::free(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

bool KernelProfile::start(std::string* why) {
  const Cupti& c = Cupti::get();
  if (!c.error.empty()) {
    *why = c.error;
    return false;
  }
  ENSURE(!active_, "KernelProfile::start: already recording");
  static const bool registered = [&] {
    cupti_check(c.register_callbacks(buffer_requested, buffer_completed), "register callbacks");
    return true;
  }();
  (void)registered;
  records_.clear();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    ENSURE(g_sink == nullptr, "KernelProfile::start: another profile is recording");
    g_sink = &records_;
  }
  try {
    CUDA_CHECK(cudaDeviceSynchronize());
    for (CUpti_ActivityKind k : kKinds) cupti_check(c.enable(k), "enable activity");
  } catch (...) {  // leave nothing recording into this object
    for (CUpti_ActivityKind k : kKinds) c.disable(k);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_sink = nullptr;
    throw;
  }
  active_ = true;
  start_time_ = now();
  return true;
}

void KernelProfile::stop() {
  if (!active_) return;
  const Cupti& c = Cupti::get();
  CUDA_CHECK(cudaDeviceSynchronize());
  wall_seconds_ = now() - start_time_;
  for (CUpti_ActivityKind k : kKinds) cupti_check(c.disable(k), "disable activity");
  cupti_check(c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sink = nullptr;
  active_ = false;
}

#else

bool KernelProfile::start(std::string* why) {
#ifdef ENGINE_CUDA
  *why = "this build found no CUPTI headers (cupti_activity.h)";
#else
  *why = "this build has no CUDA";
#endif
  return false;
}

void KernelProfile::stop() {}

#endif

KernelProfile::~KernelProfile() {
  try {
    stop();
  } catch (...) {
  }
}

std::string kernel_table(const std::vector<KernelRecord>& records, double wall_seconds, int units, int top) {
  struct Row {
    std::string name;
    int64_t calls = 0;
    double ns = 0;
    double idle_ns = 0;  // the GPU's idle time just before this kernel's calls started
  };
  std::map<std::string, Row> by_name;
  for (const KernelRecord& r : records) {
    Row& row = by_name[r.name];
    row.name = r.name;
    row.calls += 1;
    row.ns += static_cast<double>(r.end_ns - r.start_ns);
  }
  // Idle gaps, each charged to the record that ends it: in start order, a record starting after
  // every earlier record has ended found the GPU idle since the latest of those ends.
  std::vector<const KernelRecord*> by_start;
  by_start.reserve(records.size());
  for (const KernelRecord& r : records) by_start.push_back(&r);
  std::sort(by_start.begin(), by_start.end(),
            [](const KernelRecord* a, const KernelRecord* b) { return a->start_ns < b->start_ns; });
  struct Gap {
    uint64_t ns, at_ns;  // length; start, from the first record's start
    const KernelRecord *before, *after;
  };
  std::vector<Gap> gaps;
  uint64_t frontier = 0;
  const KernelRecord* last = nullptr;  // the record that ended last so far
  for (const KernelRecord* r : by_start) {
    if (frontier != 0 && r->start_ns > frontier) {
      by_name[r->name].idle_ns += static_cast<double>(r->start_ns - frontier);
      gaps.push_back({r->start_ns - frontier, frontier - by_start.front()->start_ns, last, r});
    }
    if (r->end_ns >= frontier) last = r;
    frontier = std::max(frontier, r->end_ns);
  }
  std::vector<Row> rows;
  double total_ns = 0;
  for (auto& [name, row] : by_name) {
    total_ns += row.ns;
    rows.push_back(row);
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ns > b.ns; });
  // Busy time: the union of the intervals.
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  iv.reserve(records.size());
  for (const KernelRecord& r : records) iv.emplace_back(r.start_ns, r.end_ns);
  std::sort(iv.begin(), iv.end());
  double busy_ns = 0;
  for (size_t i = 0; i < iv.size();) {
    uint64_t s = iv[i].first, e = iv[i].second;
    for (++i; i < iv.size() && iv[i].first <= e; ++i) e = std::max(e, iv[i].second);
    busy_ns += static_cast<double>(e - s);
  }
  const double u = std::max(units, 1);
  const double wall_ms = std::max(wall_seconds * 1e3 / u, 1e-9);
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-84s %8s %9s %6s %9s %9s\n", "kernel (per step)", "calls", "ms", "%wall", "us/call",
                "idle ms");
  out += buf;
  double shown_ns = 0;
  const size_t n = std::min(rows.size(), static_cast<size_t>(std::max(top, 0)));
  for (size_t i = 0; i < n; ++i) {
    const Row& r = rows[i];
    shown_ns += r.ns;
    std::string name = r.name.size() > 84 ? r.name.substr(0, 81) + "..." : r.name;
    std::snprintf(buf, sizeof buf, "  %-84s %8.1f %9.3f %6.1f %9.1f %9.3f\n", name.c_str(), r.calls / u,
                  r.ns / u / 1e6, 100.0 * r.ns / u / 1e6 / wall_ms, r.ns / r.calls / 1e3, r.idle_ns / u / 1e6);
    out += buf;
  }
  if (rows.size() > n) {
    int64_t calls = 0;
    for (size_t i = n; i < rows.size(); ++i) calls += rows[i].calls;
    std::snprintf(buf, sizeof buf, "  %-84s %8.1f %9.3f %6.1f\n",
                  ("(" + std::to_string(rows.size() - n) + " other kernels)").c_str(), calls / u,
                  (total_ns - shown_ns) / u / 1e6, 100.0 * (total_ns - shown_ns) / u / 1e6 / wall_ms);
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                "  per step: wall %.3f ms, kernels %.3f ms (sum), GPU busy %.3f ms (union), GPU idle %.3f ms (%.1f%%)\n",
                wall_ms, total_ns / u / 1e6, busy_ns / u / 1e6, wall_ms - busy_ns / u / 1e6,
                100.0 * (1.0 - busy_ns / u / 1e6 / wall_ms));
  out += buf;
  // Where the idle time is: the kernels that most often found the GPU waiting for them.
  std::vector<Row> idle = rows;
  std::sort(idle.begin(), idle.end(), [](const Row& a, const Row& b) { return a.idle_ns > b.idle_ns; });
  std::string list;
  for (size_t i = 0; i < idle.size() && i < 8 && idle[i].idle_ns > 0; ++i) {
    std::snprintf(buf, sizeof buf, "%s%s %.3f", list.empty() ? "" : ", ", idle[i].name.substr(0, 60).c_str(),
                  idle[i].idle_ns / u / 1e6);
    list += buf;
  }
  if (!list.empty()) out += "  idle ms per step before: " + list + "\n";
  // The longest single gaps, in time order: what ran before and after each.
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.ns > b.ns; });
  gaps.resize(std::min<size_t>(gaps.size(), 8));
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.at_ns < b.at_ns; });
  if (!gaps.empty()) out += "  longest gaps (all profiled steps; at ms from the first record):\n";
  for (const Gap& g : gaps) {
    std::snprintf(buf, sizeof buf, "    %8.3f ms at %9.3f: after %s, before %s\n", g.ns / 1e6, g.at_ns / 1e6,
                  g.before->name.substr(0, 60).c_str(), g.after->name.substr(0, 60).c_str());
    out += buf;
  }
  return out;
}

}  // namespace engine::bench
