// Forced into every test object by the Makefile (-include). doctest 2.4.9 prints a `const char*`
// handed to INFO or CAPTURE as a pointer (only arrays of char print as text), so a failure's
// context built from dname(dt) or from a ternary of literals read "logged: 0x55a5...". This
// prints such pointers as the strings they point to. Only for the versions known to need it and
// to take it (2.4.9, the Debian package CI uses): a later doctest that specialises the same
// template itself would otherwise not compile. Being included before tests/main.cpp's
// `#define DOCTEST_CONFIG_IMPLEMENT` is fine (doctest guards its implementation apart from its
// interface); DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN would not be (its define sits in the guarded
// part), so the runner keeps the plain IMPLEMENT and its own main.
#pragma once
#include <doctest/doctest.h>

#if defined(DOCTEST_VERSION) && DOCTEST_VERSION <= 20409
namespace doctest {
template <>
struct StringMaker<const char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
}  // namespace doctest
#endif
