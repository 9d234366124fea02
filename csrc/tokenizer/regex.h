// The regular expressions of Hugging Face pre-tokenizers (Split, and ByteLevel's built-in GPT-2
// pattern), matched on code points with Oniguruma's leftmost-first backtracking semantics.
// Supported: literals and escapes (\r \n \t \f \v \\ \' ...), classes [...] and [^...] with ranges,
// \s \S \d \D \w \W, \p{L} \p{Lu} \p{Ll} \p{Lt} \p{Lm} \p{Lo} \p{M} \p{Mn} \p{Mc} \p{Me} \p{N}
// \p{Nd} \p{Nl} \p{No} and \P{..}, `.`, alternation, groups (?: ), (?i: ) with ASCII letters
// (and U+017F / U+212A, which fold to s / k), ( ) treated as non-capturing, the negative and
// positive lookaheads (?! ) (?= ), and greedy ? * + {m} {m,} {m,n} on a single character or class.
// Anything else (backreferences, lazy or possessive quantifiers, anchors, lookbehind, quantified
// groups) is refused with an error naming the construct. A search that backtracks more than
// kStepBudget steps per input character fails with an error rather than running for hours.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace engine {

class PretokRegex {
 public:
  explicit PretokRegex(const std::string& pattern);  // throws engine::Error on what it cannot match
  ~PretokRegex();
  PretokRegex(PretokRegex&&) noexcept;
  PretokRegex& operator=(PretokRegex&&) noexcept;

  // Non-overlapping matches over code points cps[0..n), as [begin, end) index pairs, leftmost
  // first; an empty match advances the search by one code point.
  std::vector<std::pair<size_t, size_t>> find_all(const char32_t* cps, size_t n) const;

  static constexpr int64_t kStepBudget = 4096;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace engine
