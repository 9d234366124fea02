// Normalizers, pre-tokenizers and decoders of tokenizer.json (pipeline.h).
#include "tokenizer/pipeline.h"

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/unicode.h"

namespace engine::tok {

using json = nlohmann::json;

namespace {

// The pattern of tokenizers' ByteLevel pre-tokenizer with use_regex (GPT-2's).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteTable {
  std::string to_char[256];
  int from_char[512];
  ByteTable() {
    // Printable Latin-1 bytes stand for themselves; the others, in byte order, for 256, 257, ...
    std::fill(std::begin(from_char), std::end(from_char), -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      unicode::append_utf8(to_char[b], c);
      from_char[c] = b;
    }
  }
};
const ByteTable& bytes() {
  static const ByteTable t;
  return t;
}

// Typed access to one object of the file, errors naming the key path.
struct Obj {
  const json& j;
  std::string path;  // e.g. "tok.json: pre_tokenizer.pretokenizers[1]"
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    RAISE(path, ".", key, ": ", what);
  }
  const json* get(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  bool boolean(const char* key, bool def) const {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_boolean()) bad(key, "expected true or false, got " + v->dump());
    return v->get<bool>();
  }
  std::string string(const char* key) const {
    const json* v = get(key);
    if (!v || !v->is_string()) bad(key, "expected a string, got " + (v ? v->dump() : std::string("nothing")));
    return v->get<std::string>();
  }
  size_t count(const char* key) const {
    const json* v = get(key);
    if (!v || !v->is_number_unsigned() || v->get<uint64_t>() > 1'000'000)
      bad(key, "expected a count, got " + (v ? v->dump() : std::string("nothing")));
    return v->get<size_t>();
  }
  std::string type() const {
    if (!j.is_object()) RAISE(path, ": expected an object, got ", j.dump());
    return string("type");
  }
  // One character (the replacement of Metaspace, the content of Strip).
  std::string character(const char* key) const {
    const std::string s = string(key);
    size_t i = 0;
    if (s.empty() || unicode::decode_one(s, i) == unicode::kInvalid || i != s.size())
      bad(key, "expected one character, got \"" + s + "\"");
    return s;
  }
  // {"String": s} (regex=false) or {"Regex": r}.
  std::pair<std::string, bool> pattern() const {
    const json* p = get("pattern");
    if (!p || !p->is_object() || p->size() != 1) bad("pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
    const auto first = p->begin();  // (a named iterator: the value is not a temporary's)
    const std::string k = first.key();
    const json& v = first.value();
    if (!v.is_string() || (k != "String" && k != "Regex")) bad("pattern", "expected {\"String\": ...} or {\"Regex\": ...}, got " + p->dump());
    return {v.get<std::string>(), k == "Regex"};
  }
  PrependScheme prepend_scheme() const {
    PrependScheme s = PrependScheme::Always;
    if (const json* v = get("prepend_scheme")) {
      const std::string n = v->is_string() ? v->get<std::string>() : "";
      if (n == "first") s = PrependScheme::First;
      else if (n == "never") s = PrependScheme::Never;
      else if (n == "always") s = PrependScheme::Always;
      else bad("prepend_scheme", "expected \"first\", \"never\" or \"always\", got " + v->dump());
    }
    if (const json* v = get("add_prefix_space")) {
      if (!v->is_boolean()) bad("add_prefix_space", "expected true or false, got " + v->dump());
      if (!v->get<bool>()) {
        if (get("prepend_scheme") && s != PrependScheme::Never)
          bad("add_prefix_space", "false contradicts prepend_scheme");
        s = PrependScheme::Never;
      }
    }
    return s;
  }
};

// Calls f(object, path) for each step of a possibly nested Sequence stored under `list_key`.
template <typename F>
void for_each_step(const json& j, const std::string& path, const char* list_key, F&& f) {
  Obj o{j, path};
  if (o.type() == "Sequence") {
    const json* list = o.get(list_key);
    if (!list || !list->is_array()) o.bad(list_key, "expected an array");
    for (size_t i = 0; i < list->size(); ++i)
      for_each_step((*list)[i], str_cat(path, ".", list_key, "[", i, "]"), list_key, f);
    return;
  }
  f(o);
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t i = 0;
  for (size_t k; (k = s.find(from, i)) != std::string::npos; i = k + from.size()) out.append(s, i, k - i).append(to);
  out.append(s, i, std::string::npos);
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Matches of a Split pattern over `text` as byte ranges with is_match, covering the text
// (tokenizers' Pattern::find_matches).
std::vector<std::pair<std::pair<size_t, size_t>, bool>> find_matches(const PreTokenizerStep& st, const std::string& text) {
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> out;
  if (text.empty()) {
    out.push_back({{0, 0}, false});
    return out;
  }
  std::vector<std::pair<size_t, size_t>> m;
  if (st.regex) {
    const unicode::Decoded d = unicode::decode(text);
    for (auto [a, b] : st.regex->find_all(d.cps.data(), d.cps.size())) m.emplace_back(d.offsets[a], d.offsets[b]);
  } else if (!st.literal.empty()) {
    for (size_t i = 0; (i = text.find(st.literal, i)) != std::string::npos; i += st.literal.size())
      m.emplace_back(i, i + st.literal.size());
  }
  size_t prev = 0;
  for (auto [a, b] : m) {
    if (prev != a) out.push_back({{prev, a}, false});
    out.push_back({{a, b}, true});
    prev = b;
  }
  if (prev != text.size()) out.push_back({{prev, text.size()}, false});
  return out;
}

// tokenizers' NormalizedString::split: which ranges become pieces under a behavior.
std::vector<std::pair<size_t, size_t>> split_ranges(std::vector<std::pair<std::pair<size_t, size_t>, bool>> m,
                                                    SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (auto& [r, is] : m) out.push_back(r);
      break;
    case SplitBehavior::Removed:
      for (auto& [r, is] : m)
        if (!is) out.push_back(r);
      break;
    case SplitBehavior::Contiguous:
      for (auto& [r, is] : m) {
        if (is == prev_match && !out.empty()) out.back().second = r.second;
        else out.push_back(r);
        prev_match = is;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (auto& [r, is] : m) {
        if (is && !prev_match && !out.empty()) out.back().second = r.second;
        else out.push_back(r);
        prev_match = is;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (size_t k = m.size(); k-- > 0;) {
        auto& [r, is] = m[k];
        if (is && !prev_match && !out.empty()) out.back().first = r.first;
        else out.push_back(r);
        prev_match = is;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

void split_piece(const PreTokenizerStep& st, const Piece& p, std::vector<Piece>& out) {
  auto m = find_matches(st, p.text);
  if (st.invert)
    for (auto& [r, is] : m) is = !is;
  for (auto [a, b] : split_ranges(std::move(m), st.behavior))
    out.push_back(Piece{p.text.substr(a, b - a), p.at_origin && a == 0});
}

}  // namespace

const std::string& byte_to_char(uint8_t b) { return bytes().to_char[b]; }
int char_to_byte(char32_t c) { return c < 512 ? bytes().from_char[c] : -1; }

std::vector<NormalizerStep> read_normalizer(const json* j, const std::string& where) {
  std::vector<NormalizerStep> steps;
  if (!j || j->is_null()) return steps;
  for_each_step(*j, where + ": normalizer", "normalizers", [&](const Obj& o) {
    const std::string t = o.type();
    if (t == "Prepend") {
      steps.push_back({NormalizerStep::Prepend, o.string("prepend"), ""});
    } else if (t == "Replace") {
      auto [pat, is_regex] = o.pattern();
      if (is_regex) o.bad("pattern", "a Regex pattern in the Replace normalizer is not supported (only String)");
      steps.push_back({NormalizerStep::Replace, pat, o.string("content")});
    } else if (t == "NFC") {
      steps.push_back({NormalizerStep::NFC, "", ""});
    } else {
      o.bad("type", "normalizer \"" + t + "\" is not supported (Sequence, Prepend, Replace, NFC)");
    }
  });
  return steps;
}

std::vector<PreTokenizerStep> read_pre_tokenizer(const json* j, const std::string& where) {
  std::vector<PreTokenizerStep> steps;
  if (!j || j->is_null()) return steps;
  for_each_step(*j, where + ": pre_tokenizer", "pretokenizers", [&](const Obj& o) {
    const std::string t = o.type();
    PreTokenizerStep st{};
    if (t == "ByteLevel") {
      st.kind = PreTokenizerStep::ByteLevel;
      st.add_prefix_space = o.boolean("add_prefix_space", true);
      st.use_regex = o.boolean("use_regex", true);
      (void)o.boolean("trim_offsets", true);  // offsets only
      if (st.use_regex) st.regex = std::make_shared<PretokRegex>(kGpt2Pattern);
    } else if (t == "Split") {
      st.kind = PreTokenizerStep::Split;
      auto [pat, is_regex] = o.pattern();
      if (is_regex) {
        try {
          st.regex = std::make_shared<PretokRegex>(pat);
        } catch (const Error& e) {
          o.bad("pattern", e.what());
        }
      } else {
        st.literal = pat;
      }
      const std::string b = o.string("behavior");
      if (b == "Removed") st.behavior = SplitBehavior::Removed;
      else if (b == "Isolated") st.behavior = SplitBehavior::Isolated;
      else if (b == "MergedWithPrevious") st.behavior = SplitBehavior::MergedWithPrevious;
      else if (b == "MergedWithNext") st.behavior = SplitBehavior::MergedWithNext;
      else if (b == "Contiguous") st.behavior = SplitBehavior::Contiguous;
      else o.bad("behavior", "unknown split behavior \"" + b + "\"");
      st.invert = o.boolean("invert", false);
    } else if (t == "Metaspace") {
      st.kind = PreTokenizerStep::Metaspace;
      st.replacement = o.character("replacement");
      st.prepend = o.prepend_scheme();
      st.split = o.boolean("split", true);
    } else {
      o.bad("type", "pre-tokenizer \"" + t + "\" is not supported (Sequence, ByteLevel, Split, Metaspace)");
    }
    steps.push_back(std::move(st));
  });
  return steps;
}

std::vector<DecoderStep> read_decoder(const json* j, const std::string& where) {
  std::vector<DecoderStep> steps;
  if (!j || j->is_null()) return steps;
  for_each_step(*j, where + ": decoder", "decoders", [&](const Obj& o) {
    const std::string t = o.type();
    DecoderStep st{};
    if (t == "ByteLevel") {
      st.kind = DecoderStep::ByteLevel;
    } else if (t == "Metaspace") {
      st.kind = DecoderStep::Metaspace;
      st.a = o.character("replacement");
      st.prepend = o.prepend_scheme();
    } else if (t == "Replace") {
      st.kind = DecoderStep::Replace;
      auto [pat, is_regex] = o.pattern();
      if (is_regex) o.bad("pattern", "a Regex pattern in the Replace decoder is not supported (only String)");
      st.a = pat;
      st.b = o.string("content");
    } else if (t == "ByteFallback") {
      st.kind = DecoderStep::ByteFallback;
    } else if (t == "Fuse") {
      st.kind = DecoderStep::Fuse;
    } else if (t == "Strip") {
      st.kind = DecoderStep::Strip;
      st.a = o.character("content");
      st.start = o.count("start");
      st.stop = o.count("stop");
    } else {
      o.bad("type", "decoder \"" + t + "\" is not supported (Sequence, ByteLevel, Metaspace, Replace, "
            "ByteFallback, Fuse, Strip)");
    }
    steps.push_back(std::move(st));
  });
  return steps;
}

std::string normalize(const std::vector<NormalizerStep>& steps, std::string text) {
  for (const NormalizerStep& st : steps) {
    switch (st.kind) {
      case NormalizerStep::Prepend:
        if (!text.empty()) text = st.a + text;
        break;
      case NormalizerStep::Replace: text = replace_all(text, st.a, st.b); break;
      case NormalizerStep::NFC: text = unicode::nfc(text); break;
    }
  }
  return text;
}

std::vector<Piece> pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::vector<Piece> pieces) {
  for (const PreTokenizerStep& st : steps) {
    std::vector<Piece> next;
    next.reserve(pieces.size());
    for (Piece& p : pieces) {
      if (st.kind == PreTokenizerStep::ByteLevel) {
        if (st.add_prefix_space && !p.text.empty() && p.text[0] != ' ') p.text.insert(0, 1, ' ');
        std::vector<Piece> parts;
        if (st.regex) {
          split_piece(st, p, parts);
        } else {
          parts.push_back(std::move(p));
        }
        const ByteTable& table = bytes();
        for (Piece& q : parts) {
          std::string mapped;
          mapped.reserve(q.text.size() * 2);
          for (char c : q.text) mapped += table.to_char[static_cast<uint8_t>(c)];
          next.push_back(Piece{std::move(mapped), q.at_origin});
        }
      } else if (st.kind == PreTokenizerStep::Split) {
        split_piece(st, p, next);
      } else {
        std::string t = replace_all(p.text, " ", st.replacement);
        const bool prepend = !t.empty() && !starts_with(t, st.replacement) &&
                             (st.prepend == PrependScheme::Always || (st.prepend == PrependScheme::First && p.at_origin));
        if (prepend) t = st.replacement + t;
        if (!st.split) {
          next.push_back(Piece{std::move(t), p.at_origin});
          continue;
        }
        PreTokenizerStep lit{};
        lit.kind = PreTokenizerStep::Split;
        lit.literal = st.replacement;
        lit.behavior = SplitBehavior::MergedWithNext;
        split_piece(lit, Piece{std::move(t), p.at_origin}, next);
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

std::string decode_tokens(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens) {
  if (steps.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const DecoderStep& st : steps) {
    std::vector<std::string> next;
    switch (st.kind) {
      case DecoderStep::ByteLevel: {
        std::string raw;
        for (const std::string& t : tokens) {
          std::string b;
          bool all = true;
          for (size_t i = 0; i < t.size() && all;) {
            const int v = char_to_byte(unicode::decode_one(t, i));
            if (v < 0) all = false;
            else b.push_back(static_cast<char>(v));
          }
          raw += all ? b : t;
        }
        next.push_back(unicode::from_utf8_lossy(raw));
        break;
      }
      case DecoderStep::Metaspace:
        for (size_t k = 0; k < tokens.size(); ++k) {
          const bool drop = k == 0 && st.prepend != PrependScheme::Never;
          next.push_back(replace_all(tokens[k], st.a, drop ? "" : " "));
        }
        break;
      case DecoderStep::Replace:
        for (const std::string& t : tokens) next.push_back(replace_all(t, st.a, st.b));
        break;
      case DecoderStep::ByteFallback: {
        std::string group;
        size_t group_len = 0;
        auto flush = [&] {
          if (group_len == 0) return;
          if (unicode::find_invalid_utf8(group) == std::string::npos) {
            next.push_back(group);
          } else {
            for (size_t k = 0; k < group_len; ++k) next.push_back("\xEF\xBF\xBD");
          }
          group.clear();
          group_len = 0;
        };
        for (const std::string& t : tokens) {
          int v = -1;
          if (t.size() == 6 && starts_with(t, "<0x") && t[5] == '>') {
            // Rust's u8::from_str_radix(_, 16): an optional '+' then hex digits.
            auto hexv = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                            : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
            const int h = hexv(t[3]), l = hexv(t[4]);
            if (h >= 0 && l >= 0) v = h * 16 + l;
            else if (t[3] == '+' && l >= 0) v = l;
          }
          if (v >= 0) {
            group.push_back(static_cast<char>(v));
            ++group_len;
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case DecoderStep::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case DecoderStep::Strip:
        for (const std::string& t : tokens) {
          const unicode::Decoded d = unicode::decode(t);
          const char32_t c = unicode::decode(st.a).cps[0];
          size_t a = 0, b = d.cps.size();
          while (a < st.start && a < d.cps.size() && d.cps[a] == c) ++a;
          for (size_t k = 0; k < st.stop && b > a && d.cps[b - 1] == c; ++k) --b;
          next.push_back(t.substr(d.offsets[a], d.offsets[b] - d.offsets[a]));
        }
        break;
    }
    tokens = std::move(next);
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace engine::tok
