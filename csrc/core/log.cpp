#include "core/log.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace engine {
namespace {
int g_rank = 0, g_world = 1;
LogLevel g_level = LogLevel::Info;
std::mutex g_mu;
int g_failed_fd = -1;  // the first stream a log write failed on (1 or 2), -1: none
int g_failed_errno = 0;

void remember_failure(FILE* out, int err) {  // under g_mu
  if (g_failed_fd >= 0) return;
  g_failed_fd = out == stderr ? 2 : 1;
  g_failed_errno = err != 0 ? err : EIO;
}

// What file descriptor fd refers to ("/dev/full", "/tmp/run.log", "pipe:[123]"), or "".
std::string fd_target(int fd) {
  char buf[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}
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
  errno = 0;
  const int n = g_world > 1 ? std::fprintf(out, "[%8.2fs rank %d] %s%s\n", wall_seconds(), g_rank, tag, msg.c_str())
                            : std::fprintf(out, "[%8.2fs] %s%s\n", wall_seconds(), tag, msg.c_str());
  if (n < 0) remember_failure(out, errno);
  if (std::fflush(out) != 0) remember_failure(out, errno);
}

void check_log_output() {
  std::lock_guard<std::mutex> lock(g_mu);
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) remember_failure(stdout, errno);
  if (g_failed_fd < 0) return;
  const std::string target = fd_target(g_failed_fd);
  RAISE("cannot write the log to ", g_failed_fd == 1 ? "stdout" : "stderr", target.empty() ? "" : " (" + target + ")",
        ": ", std::strerror(g_failed_errno));
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
