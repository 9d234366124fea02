// The pre-tokenizer pattern matcher (tokenizer/regex.h): Oniguruma's semantics on the constructs
// it supports, refusal of the rest, and the backtracking budget.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/check.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

using engine::PretokRegex;

namespace {

std::vector<std::string> pieces(const std::string& pattern, const std::string& text) {
  const PretokRegex re(pattern);
  const auto d = engine::unicode::decode(text);
  std::vector<std::string> out;
  for (auto [a, b] : re.find_all(d.cps.data(), d.cps.size()))
    out.push_back(text.substr(d.offsets[a], d.offsets[b] - d.offsets[a]));
  return out;
}

using V = std::vector<std::string>;

}  // namespace

TEST_CASE("tokenizer regex: GPT-2's and Llama 3's patterns split as tokenizers does") {
  const std::string gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  CHECK(pieces(gpt2, "Hello world's 12345  x\n\n") == V{"Hello", " world", "'s", " 12345", " ", " x", "\n\n"});
  const std::string llama3 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  CHECK(pieces(llama3, "I'LL pay 12345!!\n\n  ok") == V{"I", "'LL", " pay", " ", "123", "45", "!!\n\n", " ", " ok"});
  CHECK(pieces(llama3, "x'\xC5\xBFt") == V{"x", "'\xC5\xBF", "t"});  // U+017F folds to s under (?i:)
  CHECK(pieces(R"(\s+)", "a\xC2\xA0\x1C b") == V{"\xC2\xA0", " "});  // \s is White_Space: U+001C is not
  CHECK(pieces(R"([a-c]+|\d)", "abcd12") == V{"abc", "1", "2"});
  CHECK(pieces(R"(x(?=y)|.)", "xyx") == V{"x", "y", "x"});
}

TEST_CASE("tokenizer regex: constructs outside regex.h are refused, runaway backtracking is an error") {
  for (const char* p : {"(?<=a)b", "a*?", "a++", "\\bword", "(ab)+", "[[:alpha:]]", "^a", "a$", "\\1", "(?x)a",
                        "[a&&b]", "\\p{Greek}", "(?i:\xC3\xA9)", "a{3,2}", "[z-a]", "(a", "a)", "*a"}) {
    INFO(p);
    CHECK_THROWS_AS(PretokRegex{p}, engine::Error);
  }
  const PretokRegex re(R"(\s*\s*\s*\s*\s*\s*x)");
  const std::u32string spaces(3000, U' ');
  CHECK_THROWS_WITH_AS(re.find_all(spaces.data(), spaces.size()), doctest::Contains("backtracking exceeded"),
                       engine::Error);
}
