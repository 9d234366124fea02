// Always-on checks. ENSURE(cond, msg...) throws engine::Error carrying file:line, the failing
// expression as text and the message (multi-rank runs prefix the rank where the error is
// reported: comm/launch.h fatal_error).
// Checks stay on in release builds: they guard user input and kernel launch preconditions.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace engine {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Concatenates its arguments with operator<< (an empty pack gives "").
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void fail_check(const char* file, int line, const char* expr, const std::string& msg);

}  // namespace engine

#define ENSURE(cond, ...)                                                                  \
  do {                                                                                     \
    if (!(cond)) [[unlikely]]                                                              \
      ::engine::fail_check(__FILE__, __LINE__, #cond, ::engine::str_cat(__VA_ARGS__));     \
  } while (0)

// ENSURE_EQ prints both values when they differ.
#define ENSURE_EQ(a, b, ...)                                                               \
  do {                                                                                     \
    const auto& ensure_a_ = (a);                                                           \
    const auto& ensure_b_ = (b);                                                           \
    if (!(ensure_a_ == ensure_b_)) [[unlikely]]                                            \
      ::engine::fail_check(__FILE__, __LINE__, #a " == " #b,                               \
                           ::engine::str_cat("(", ensure_a_, " vs ", ensure_b_, ") ",      \
                                             ##__VA_ARGS__));                              \
  } while (0)

// Throws unconditionally with a message (for unreachable branches and user errors).
#define RAISE(...) ::engine::fail_check(__FILE__, __LINE__, nullptr, ::engine::str_cat(__VA_ARGS__))
