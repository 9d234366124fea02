// Checked integer arithmetic for sizes, counts and byte products computed from config or file
// values. A product or sum that does not fit its type raises engine::Error saying what was being
// computed, instead of wrapping to a small (or negative) number that would then be allocated,
// indexed or looped over. One place for the compiler builtins, so call sites stay one line:
//   const int64_t n = checked_mul<int64_t>(rows, cols, "tensor (", rows, ", ", cols, ")");
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/check.h"

namespace engine {

// a * b into *out; true when the exact result does not fit T (then *out is unspecified).
template <typename T>
bool mul_overflows(T a, T b, T* out) {
  static_assert(std::is_integral_v<T>);
  return __builtin_mul_overflow(a, b, out);
}
template <typename T>
bool add_overflows(T a, T b, T* out) {
  static_assert(std::is_integral_v<T>);
  return __builtin_add_overflow(a, b, out);
}

template <typename T>
constexpr const char* int_type_name() {
  if constexpr (std::is_signed_v<T>) return sizeof(T) == 8 ? "64-bit signed" : "32-bit signed";
  else return sizeof(T) == 8 ? "64-bit unsigned" : "32-bit unsigned";
}

// a * b, or Error "<what...>: a x b overflows <type>" (what: the pieces of a message, str_cat).
template <typename T, typename... What>
T checked_mul(T a, T b, const What&... what) {
  T r;
  if (mul_overflows(a, b, &r)) [[unlikely]]
    RAISE(str_cat("", what...), sizeof...(What) ? ": " : "", a, " x ", b, " overflows ", int_type_name<T>(),
          " integers");
  return r;
}

template <typename T, typename... What>
T checked_add(T a, T b, const What&... what) {
  T r;
  if (add_overflows(a, b, &r)) [[unlikely]]
    RAISE(str_cat("", what...), sizeof...(What) ? ": " : "", a, " + ", b, " overflows ", int_type_name<T>(),
          " integers");
  return r;
}

// A non-negative int64 element or byte count as size_t (raises when negative).
template <typename... What>
size_t checked_size(int64_t n, const What&... what) {
  if (n < 0) [[unlikely]]
    RAISE(str_cat("", what...), sizeof...(What) ? ": " : "", "negative size ", n);
  return static_cast<size_t>(n);
}

}  // namespace engine
