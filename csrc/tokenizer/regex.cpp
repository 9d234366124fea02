// Backtracking matcher of the pre-tokenizer patterns (regex.h). The pattern is parsed into nodes:
// a character-class node with a repeat count {min, max} (a plain character is a class of one),
// a group of alternatives, or a lookahead. Matching runs leftmost-first like Oniguruma: a repeat
// takes as many characters as it can and gives them back one at a time; the rest of the pattern
// after a node is passed down as an explicit continuation chain, so recursion depth follows the
// pattern's nesting, never the input's length. Each character class keeps a bitmap of the ASCII
// characters it holds, and each top-level alternative the ASCII characters it can start with, so
// the search skips, at a position, the alternatives that cannot match there without running them.
#include "tokenizer/regex.h"

#include <algorithm>

#include "core/check.h"
#include "tokenizer/unicode.h"

namespace engine {

namespace {

using unicode::Category;

// One predicate of a class; a class matches when any of its items does (then `negated` flips).
struct Item {
  enum Kind : uint8_t { Range, Categories, Space, Word, Digit, Dot } kind;
  bool negated = false;
  char32_t lo = 0, hi = 0;  // Range
  uint32_t mask = 0;        // Categories: bit (1 << Category)
};

struct CharSet {
  bool negated = false;
  std::vector<Item> items;
  // Bit c: whether code point c < 128 is in the set, filled from the items once the pattern is
  // parsed (set_matches reads it instead of the items for ASCII, most of any corpus).
  uint64_t ascii[2] = {0, 0};
};

bool is_connector_punctuation(char32_t c) {
  return c == '_' || c == 0x203F || c == 0x2040 || c == 0x2054 || c == 0xFE33 || c == 0xFE34 ||
         (c >= 0xFE4D && c <= 0xFE4F) || c == 0xFF3F;
}

bool item_matches(const Item& it, char32_t c) {
  bool r = false;
  switch (it.kind) {
    case Item::Range: r = c >= it.lo && c <= it.hi; break;
    case Item::Categories: r = (it.mask >> static_cast<unsigned>(unicode::category(c))) & 1u; break;
    case Item::Space: r = unicode::is_white_space(c); break;
    case Item::Digit: r = unicode::category(c) == Category::Nd; break;
    case Item::Word: {
      const Category k = unicode::category(c);
      r = k <= Category::Nd || is_connector_punctuation(c);  // L*, M*, Nd, Pc
      break;
    }
    case Item::Dot: r = c != '\n'; break;
  }
  return r != it.negated;
}

bool set_matches_items(const CharSet& s, char32_t c) {
  bool any = false;
  for (const Item& it : s.items) {
    if (item_matches(it, c)) {
      any = true;
      break;
    }
  }
  return any != s.negated;
}

bool set_matches(const CharSet& s, char32_t c) {
  if (c < 128) return (s.ascii[c >> 6] >> (c & 63)) & 1u;
  return set_matches_items(s, c);
}

struct Node {
  enum Kind : uint8_t { Chars, Group, Lookahead } kind = Chars;
  int set = -1;                // Chars: index into sets
  size_t min = 1, max = 1;     // Chars: repeat count
  bool negative = false;       // Lookahead: (?! ) rather than (?= )
  std::vector<std::vector<Node>> alts;  // Group, Lookahead
};

constexpr size_t kUnbounded = SIZE_MAX;

uint32_t bit(Category c) { return 1u << static_cast<unsigned>(c); }

class Parser {
 public:
  Parser(const std::string& pattern, std::vector<CharSet>& sets) : pattern_(pattern), sets_(sets) {
    size_t i = 0;
    while (i < pattern.size()) {
      const char32_t c = unicode::decode_one(pattern, i);
      ENSURE(c != unicode::kInvalid, "pattern is not valid UTF-8");
      cps_.push_back(c);
    }
  }

  std::vector<std::vector<Node>> parse() {
    auto alts = alternatives(false);
    if (pos_ != cps_.size()) fail("unbalanced ')'");
    return alts;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    RAISE("pattern ", pattern_, ": ", what, " at character ", pos_, " (the tokenizer's pattern matcher supports "
          "the constructs of regex.h)");
  }
  bool at_end() const { return pos_ >= cps_.size(); }
  char32_t peek(size_t k = 0) const { return pos_ + k < cps_.size() ? cps_[pos_ + k] : 0; }

  std::vector<std::vector<Node>> alternatives(bool icase) {
    std::vector<std::vector<Node>> alts(1);
    while (!at_end() && peek() != ')') {
      if (peek() == '|') {
        ++pos_;
        alts.emplace_back();
        continue;
      }
      alts.back().push_back(atom(icase));
    }
    return alts;
  }

  Node atom(bool icase) {
    const char32_t c = peek();
    Node n;
    if (c == '(') {
      ++pos_;
      bool inner_icase = icase;
      if (peek() == '?') {
        if (peek(1) == ':') {
          pos_ += 2;
        } else if (peek(1) == 'i' && peek(2) == ':') {
          pos_ += 3;
          inner_icase = true;
        } else if (peek(1) == '!' || peek(1) == '=') {
          n.kind = Node::Lookahead;
          n.negative = peek(1) == '!';
          pos_ += 2;
        } else {
          fail("group kind (?" + std::string(1, static_cast<char>(peek(1) < 128 ? peek(1) : '?')) + " not supported");
        }
      }
      if (n.kind != Node::Lookahead) n.kind = Node::Group;
      n.alts = alternatives(inner_icase);
      if (peek() != ')') fail("missing ')'");
      ++pos_;
      if (is_quantifier(peek())) fail("a quantified group is not supported");
      return n;
    }
    CharSet set;
    if (c == '[') {
      set = char_class(icase);
    } else if (c == '\\') {
      ++pos_;
      set.items.push_back(escape(icase));
    } else if (c == '.') {
      ++pos_;
      set.items.push_back(Item{Item::Dot});
    } else if (c == '^' || c == '$') {
      fail("anchors are not supported");
    } else if (is_quantifier(c)) {
      fail("nothing to repeat");
    } else {
      ++pos_;
      add_char(set, c, icase);
    }
    n.set = static_cast<int>(sets_.size());
    sets_.push_back(std::move(set));
    quantifier(n);
    return n;
  }

  static bool is_quantifier(char32_t c) { return c == '?' || c == '*' || c == '+' || c == '{'; }

  size_t number() {
    if (!(peek() >= '0' && peek() <= '9')) fail("expected a number in {m,n}");
    size_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 100000) fail("repeat count too large");
      ++pos_;
    }
    return v;
  }

  void quantifier(Node& n) {
    const char32_t c = peek();
    if (c == '?') n.min = 0, n.max = 1;
    else if (c == '*') n.min = 0, n.max = kUnbounded;
    else if (c == '+') n.min = 1, n.max = kUnbounded;
    if (c == '?' || c == '*' || c == '+') {
      ++pos_;
    } else if (c == '{') {
      ++pos_;
      n.min = n.max = number();
      if (peek() == ',') {
        ++pos_;
        n.max = peek() == '}' ? kUnbounded : number();
      }
      if (peek() != '}') fail("expected '}'");
      ++pos_;
      if (n.max < n.min) fail("{m,n} with n < m");
    } else {
      return;
    }
    if (peek() == '?' || peek() == '+') fail("lazy and possessive quantifiers are not supported");
    if (is_quantifier(peek())) fail("a repeated quantifier is not supported");
  }

  // Case-insensitive matching of the ASCII letters; U+017F (long s) and U+212A (Kelvin sign)
  // fold to s and k as in Oniguruma. Other letters in (?i: ) are refused.
  void add_char(CharSet& set, char32_t c, bool icase) { add_range(set, c, c, icase); }
  void add_range(CharSet& set, char32_t lo, char32_t hi, bool icase) {
    set.items.push_back(Item{Item::Range, false, lo, hi});
    if (!icase) return;
    for (char32_t c = std::max<char32_t>(lo, 0x80); c <= hi && c < 0x250; ++c)
      if (unicode::is_letter(c) && c != 0x17F) fail("(?i: ) with a non-ASCII letter is not supported");
    if (hi >= 0x250 && unicode::is_letter(hi)) fail("(?i: ) with a non-ASCII letter is not supported");
    auto add = [&](char32_t a, char32_t b) { set.items.push_back(Item{Item::Range, false, a, b}); };
    const char32_t llo = std::max<char32_t>(lo, 'a'), lhi = std::min<char32_t>(hi, 'z');
    if (llo <= lhi) add(llo - 32, lhi - 32);
    const char32_t ulo = std::max<char32_t>(lo, 'A'), uhi = std::min<char32_t>(hi, 'Z');
    if (ulo <= uhi) add(ulo + 32, uhi + 32);
    auto covers = [&](char32_t c) { return c >= lo && c <= hi; };
    if (covers('s') || covers('S')) add(0x17F, 0x17F);
    if (covers('k') || covers('K')) add(0x212A, 0x212A);
    if (covers(0x17F)) add('s', 's'), add('S', 'S');
    if (covers(0x212A)) add('k', 'k'), add('K', 'K');
  }

  uint32_t category_mask(const std::string& name) {
    static const std::pair<const char*, uint32_t> kNames[] = {
        {"L", bit(Category::Lu) | bit(Category::Ll) | bit(Category::Lt) | bit(Category::Lm) | bit(Category::Lo)},
        {"Lu", bit(Category::Lu)}, {"Ll", bit(Category::Ll)}, {"Lt", bit(Category::Lt)},
        {"Lm", bit(Category::Lm)}, {"Lo", bit(Category::Lo)},
        {"M", bit(Category::Mn) | bit(Category::Mc) | bit(Category::Me)},
        {"Mn", bit(Category::Mn)}, {"Mc", bit(Category::Mc)}, {"Me", bit(Category::Me)},
        {"N", bit(Category::Nd) | bit(Category::Nl) | bit(Category::No)},
        {"Nd", bit(Category::Nd)}, {"Nl", bit(Category::Nl)}, {"No", bit(Category::No)}};
    for (const auto& [n, m] : kNames)
      if (name == n) return m;
    fail("unsupported property \\p{" + name + "}");
  }

  char32_t hex(size_t digits_min, size_t digits_max) {
    char32_t v = 0;
    size_t k = 0;
    for (; k < digits_max; ++k) {
      const char32_t d = peek();
      int x = d >= '0' && d <= '9' ? int(d - '0') : d >= 'a' && d <= 'f' ? int(d - 'a' + 10)
              : d >= 'A' && d <= 'F' ? int(d - 'A' + 10) : -1;
      if (x < 0) break;
      v = v * 16 + static_cast<char32_t>(x);
      ++pos_;
    }
    if (k < digits_min || v > 0x10FFFF) fail("bad hexadecimal escape");
    return v;
  }

  // After a backslash: one class item.
  Item escape(bool icase) {
    if (at_end()) fail("pattern ends with a backslash");
    const char32_t c = peek();
    ++pos_;
    switch (c) {
      case 's': return Item{Item::Space};
      case 'S': return Item{Item::Space, true};
      case 'd': return Item{Item::Digit};
      case 'D': return Item{Item::Digit, true};
      case 'w': return Item{Item::Word};
      case 'W': return Item{Item::Word, true};
      case 'p':
      case 'P': {
        if (peek() != '{') fail("expected \\p{...}");
        ++pos_;
        std::string name;
        while (!at_end() && peek() != '}' && name.size() < 32) name.push_back(static_cast<char>(peek() & 0x7F)), ++pos_;
        if (peek() != '}') fail("unterminated \\p{");
        ++pos_;
        return Item{Item::Categories, c == 'P', 0, 0, category_mask(name)};
      }
      case 'x': {
        char32_t v;
        if (peek() == '{') {
          ++pos_;
          v = hex(1, 8);
          if (peek() != '}') fail("unterminated \\x{");
          ++pos_;
        } else {
          v = hex(2, 2);
        }
        return literal(v, icase);
      }
      case 'u': return literal(hex(4, 4), icase);
      case 'r': return literal('\r', icase);
      case 'n': return literal('\n', icase);
      case 't': return literal('\t', icase);
      case 'f': return literal('\f', icase);
      case 'v': return literal('\v', icase);
      case 'a': return literal('\a', icase);
      case 'e': return literal(0x1B, icase);
      default: break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
      fail(std::string("escape \\") + static_cast<char>(c) + " is not supported");
    return literal(c, icase);
  }

  // A literal from an escape: case folding of letters does not arise (no escape yields one).
  Item literal(char32_t c, bool /*icase*/) { return Item{Item::Range, false, c, c}; }

  CharSet char_class(bool icase) {
    ++pos_;  // '['
    CharSet set;
    if (peek() == '^') set.negated = true, ++pos_;
    bool first = true;
    while (true) {
      if (at_end()) fail("unterminated character class");
      char32_t c = peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (c == '[') fail("nested character classes are not supported");
      if (c == '&' && peek(1) == '&') fail("class intersection && is not supported");
      char32_t lo;
      if (c == '\\') {
        ++pos_;
        Item it = escape(icase);
        if (it.kind != Item::Range) {
          set.items.push_back(it);
          continue;
        }
        lo = it.lo;
      } else {
        ++pos_;
        lo = c;
      }
      char32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != 0) {
        ++pos_;
        if (peek() == '\\') {
          ++pos_;
          Item it = escape(icase);
          if (it.kind != Item::Range) fail("a class range ends in a class escape");
          hi = it.lo;
        } else {
          hi = peek();
          ++pos_;
        }
        if (hi < lo) fail("class range out of order");
      }
      add_range(set, lo, hi, icase);
    }
    return set;
  }

  const std::string& pattern_;
  std::vector<CharSet>& sets_;
  std::vector<char32_t> cps_;
  size_t pos_ = 0;
};

// The ASCII code points a match of seq[i..] can start with; nullable: it can match empty;
// unknown: it starts with a lookahead, which this does not follow. A sequence that is neither
// cannot match at an ASCII character outside `ascii`, nor at the end of the input.
struct FirstChars {
  uint64_t ascii[2] = {0, 0};
  bool nullable = false, unknown = false;
};

FirstChars first_chars(const std::vector<Node>& seq, size_t i, const std::vector<CharSet>& sets) {
  FirstChars f;
  if (i == seq.size()) {
    f.nullable = true;
    return f;
  }
  const Node& node = seq[i];
  auto then_rest = [&]() {  // node may match empty: what follows it can start the match
    const FirstChars r = first_chars(seq, i + 1, sets);
    f.ascii[0] |= r.ascii[0], f.ascii[1] |= r.ascii[1];
    f.unknown = f.unknown || r.unknown;
    f.nullable = f.nullable || r.nullable;
  };
  if (node.kind == Node::Lookahead) {
    f.unknown = true;
  } else if (node.kind == Node::Group) {
    bool empty_alt = false;
    for (const auto& alt : node.alts) {
      const FirstChars g = first_chars(alt, 0, sets);
      f.ascii[0] |= g.ascii[0], f.ascii[1] |= g.ascii[1];
      f.unknown = f.unknown || g.unknown;
      empty_alt = empty_alt || g.nullable;
    }
    if (empty_alt) then_rest();
  } else {
    const CharSet& set = sets[static_cast<size_t>(node.set)];
    f.ascii[0] = set.ascii[0], f.ascii[1] = set.ascii[1];
    if (node.min == 0) then_rest();
  }
  return f;
}

// The rest of the pattern after a node: a chain of (sequence, index) frames.
struct Cont {
  const std::vector<Node>* seq;
  size_t index;
  const Cont* next;
};

}  // namespace

struct PretokRegex::Impl {
  std::string pattern;
  std::vector<CharSet> sets;
  std::vector<std::vector<Node>> alts;
  std::vector<FirstChars> alt_first;  // per top-level alternative


  struct Search {
    const char32_t* cps;
    size_t n;
    int64_t steps_left;
    size_t end;  // where the match that succeeded ended
  };

  bool match_alts(const std::vector<std::vector<Node>>& a, size_t pos, const Cont* cont, Search& s) const {
    for (const auto& seq : a)
      if (match_seq(seq, 0, pos, cont, s)) return true;
    return false;
  }

  bool match_seq(const std::vector<Node>& seq, size_t i, size_t pos, const Cont* cont, Search& s) const {
    if (--s.steps_left < 0)
      RAISE("pattern ", pattern, ": backtracking exceeded ", kStepBudget, " steps per character of the input");
    if (i == seq.size()) {
      if (cont == nullptr) {
        s.end = pos;
        return true;
      }
      return match_seq(*cont->seq, cont->index, pos, cont->next, s);
    }
    const Node& node = seq[i];
    if (node.kind == Node::Group) {
      const Cont c{&seq, i + 1, cont};
      return match_alts(node.alts, pos, &c, s);
    }
    if (node.kind == Node::Lookahead) {
      Search sub{s.cps, s.n, s.steps_left, 0};
      const bool found = match_alts(node.alts, pos, nullptr, sub);
      s.steps_left = sub.steps_left;
      if (found == node.negative) return false;
      return match_seq(seq, i + 1, pos, cont, s);
    }
    const CharSet& set = sets[static_cast<size_t>(node.set)];
    size_t count = 0;
    while (count < node.max && pos + count < s.n && set_matches(set, s.cps[pos + count])) ++count;
    s.steps_left -= static_cast<int64_t>(count);
    if (count < node.min) return false;
    for (size_t k = count + 1; k-- > node.min;) {
      if (match_seq(seq, i + 1, pos + k, cont, s)) return true;
    }
    return false;
  }

  // match_alts over the top-level alternatives, skipping those that cannot start at pos (an
  // ASCII character outside their first characters, or the end of the input).
  bool match_top(size_t pos, Search& s) const {
    const char32_t c = pos < s.n ? s.cps[pos] : 0;
    for (size_t k = 0; k < alts.size(); ++k) {
      const FirstChars& f = alt_first[k];
      if (!f.nullable && !f.unknown && (pos == s.n || (c < 128 && !((f.ascii[c >> 6] >> (c & 63)) & 1u)))) continue;
      if (match_seq(alts[k], 0, pos, nullptr, s)) return true;
    }
    return false;
  }
};

PretokRegex::PretokRegex(const std::string& pattern) : impl_(std::make_unique<Impl>()) {
  impl_->pattern = pattern;
  Parser p(pattern, impl_->sets);
  impl_->alts = p.parse();
  for (CharSet& set : impl_->sets)
    for (char32_t c = 0; c < 128; ++c)
      if (set_matches_items(set, c)) set.ascii[c >> 6] |= uint64_t{1} << (c & 63);
  for (const auto& alt : impl_->alts) impl_->alt_first.push_back(first_chars(alt, 0, impl_->sets));
}
PretokRegex::~PretokRegex() = default;
PretokRegex::PretokRegex(PretokRegex&&) noexcept = default;
PretokRegex& PretokRegex::operator=(PretokRegex&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> PretokRegex::find_all(const char32_t* cps, size_t n) const {
  std::vector<std::pair<size_t, size_t>> out;
  Impl::Search s{cps, n, kStepBudget * static_cast<int64_t>(n + 16), 0};
  size_t pos = 0;
  size_t last_end = SIZE_MAX;
  while (pos <= n) {
    size_t start = pos;
    bool found = false;
    for (; start <= n; ++start) {
      if (impl_->match_top(start, s)) {
        found = true;
        break;
      }
    }
    if (!found) break;
    if (s.end == start) {
      // An empty match right after the previous match is skipped (as Rust's regex iterators do).
      if (start != last_end) out.emplace_back(start, start);
      pos = start + 1;
    } else {
      out.emplace_back(start, s.end);
      pos = s.end;
    }
    last_end = s.end;
  }
  return out;
}

}  // namespace engine
