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

// Seconds since the first call (monotonic clock).
double wall_seconds();
// "1h02m03s" style.
std::string format_duration(double seconds);
// "1.50 GiB" style.
std::string format_bytes(double bytes);

}  // namespace engine
