// Forced into every test object by the Makefile (-include). doctest 2.4.9 prints a `const char*`
// handed to INFO or CAPTURE as a pointer (only arrays of char print as text), so a failure's
// context built from dname(dt) or from a ternary of literals read "logged: 0x55a5...". This
// prints such pointers as the strings they point to.
#pragma once
#include <doctest/doctest.h>

namespace doctest {
template <>
struct StringMaker<const char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
}  // namespace doctest
