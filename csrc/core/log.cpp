#include "core/log.h"

#include <chrono>
#include <cstdio>
#include <mutex>

namespace engine {
namespace {
int g_rank = 0, g_world = 1;
LogLevel g_level = LogLevel::Info;
std::mutex g_mu;
}  // namespace

void log_set_rank(int rank, int world) {
  g_rank = rank;
  g_world = world;
}
void log_set_level(LogLevel level) { g_level = level; }

double wall_seconds() {
  static const auto start = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void log_line(LogLevel level, const std::string& msg) {
  if (level < g_level) return;
  if (level <= LogLevel::Info && g_rank != 0) return;
  const char* tag = level == LogLevel::Warn ? "warning: " : level == LogLevel::Error ? "error: " : "";
  std::lock_guard<std::mutex> lock(g_mu);
  FILE* out = level >= LogLevel::Warn ? stderr : stdout;
  if (g_world > 1)
    std::fprintf(out, "[%8.2fs rank %d] %s%s\n", wall_seconds(), g_rank, tag, msg.c_str());
  else
    std::fprintf(out, "[%8.2fs] %s%s\n", wall_seconds(), tag, msg.c_str());
  std::fflush(out);
}

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

}  // namespace engine
