// Logging: one line per call, prefixed with the time since start; by default only rank 0
// prints info lines, every rank prints warnings and errors (with its rank).
#pragma once
#include <string>

#include "core/check.h"

namespace engine {

enum class LogLevel { Debug, Info, Warn, Error };

void log_set_rank(int rank, int world);
void log_set_level(LogLevel level);
void log_line(LogLevel level, const std::string& msg);

template <typename... A> void log_info(A&&... a) { log_line(LogLevel::Info, str_cat(std::forward<A>(a)...)); }
template <typename... A> void log_warn(A&&... a) { log_line(LogLevel::Warn, str_cat(std::forward<A>(a)...)); }
template <typename... A> void log_debug(A&&... a) { log_line(LogLevel::Debug, str_cat(std::forward<A>(a)...)); }
template <typename... A> void log_error(A&&... a) { log_line(LogLevel::Error, str_cat(std::forward<A>(a)...)); }

// A log line that could not be written (stdout or stderr on a full disk, a closed pipe) is
// remembered, the first one with its reason; check_log_output() flushes stdout and raises, naming
// the stream, the file it goes to and the reason, when any write to stdout or stderr failed.
// The train program calls it after every step and before it exits.
void check_log_output();

// Seconds since the first call (monotonic clock).
double wall_seconds();
// "1h02m03s" style.
std::string format_duration(double seconds);
// "1.50 GiB" style.
std::string format_bytes(double bytes);

}  // namespace engine
