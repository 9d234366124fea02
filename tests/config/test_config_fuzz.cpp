// Config inputs tests/fuzz (fuzz_config) found to abort or reach undefined behaviour inside
// toml++ 3.3.0 before csrc/config/config.cpp guarded it: each is now an engine::Error naming the
// file, and valid non-ASCII text (strings, comments) still parses. The same inputs are in
// tests/fuzz/corpus/config/regress_*.
#include <doctest/doctest.h>

#include <string>

#include "config/config.h"
#include "core/check.h"

using namespace engine;

namespace {

const char* kBase =
    "[model]\nvocab_size = 256\nhidden_size = 64\nnum_layers = 2\nnum_heads = 4\n"
    "[data]\ntrain = [\"data/a\"]\nsequence_length = 32\n[training]\nsteps = 10\n";

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "f.toml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("config fuzz regressions: a table header not starting with a key is an error, not an assertion") {
  // toml++ asserted (abort) in parse_key on each of these.
  for (const std::string bad : {"[#", "[\x05", "[[ #\n", "[ \x01]\n"}) {
    CAPTURE(bad);
    const std::string e = error_of(bad);
    CHECK(e.rfind("f.toml", 0) == 0);
    CHECK(e.find("TOML syntax error") != std::string::npos);
  }
  CHECK(error_of(std::string(kBase) + "[#\n").find("f.toml: TOML syntax error: malformed input") == 0);
}

TEST_CASE("config fuzz regressions: non-ASCII outside strings is a syntax error, inside strings and comments it is text") {
  // U+0430, U+00E9, U+2D00, U+FC10: toml++'s whitespace test reached __builtin_unreachable.
  for (const char* bad : {"\xD0\xB0", "x = 1 \xC3\xA9\n", "\xE2\xB4\x80 = 1\n", "a = \xEF\xB0\x90\n",
                          "''=+s%eedN6'=\xD2\x80'r'5E'0#"}) {
    CAPTURE(bad);
    const std::string e = error_of(bad);
    CHECK(e.rfind("f.toml:", 0) == 0);
    CHECK(e.find("TOML syntax error") != std::string::npos);
  }
  // Non-ASCII whitespace toml++ knows (U+3000, U+00A0) is still a syntax error, not a crash.
  CHECK(error_of(std::string(kBase) + "steps\xE3\x80\x80= 1\n").find("TOML syntax error") != std::string::npos);
  // Valid: non-ASCII in a comment, a basic string and a literal string; an override with é.
  const Config c = parse_config(std::string("# caf\xC3\xA9 \xD0\xB0\n[run]\nname = \"caf\xC3\xA9\"\noutput_dir = '\xD0\xB0'\n") +
                                    kBase,
                                "f.toml");
  CHECK(c.run.name == "caf\xC3\xA9");
  CHECK(c.run.output_dir == "\xD0\xB0");
  CHECK(parse_config(kBase, "f.toml", {"run.name=\xC3\xA9t\xC3\xA9"}).run.name == "\xC3\xA9t\xC3\xA9");
}
