// Unicode tables and UTF-8 helpers of the tokenizer (unicode.h). Lookups binary-search sorted
// range tables; ASCII takes a shortcut.
#include "tokenizer/unicode.h"

#include <algorithm>

#include "core/check.h"

namespace engine::unicode {

namespace {

struct Range {
  char32_t first, last;
};
struct CategoryRange {
  char32_t first, last;
  uint8_t value;
};
struct Decomposition {
  char32_t cp;
  uint16_t offset;
  uint8_t length;
};
struct Composition {
  char32_t first, second, composite;
};

#include "tokenizer/unicode_tables.inc"

template <typename T, size_t N>
const T* find_range(const T (&table)[N], char32_t c) {
  const T* it = std::upper_bound(table, table + N, c, [](char32_t v, const T& r) { return v < r.first; });
  if (it == table) return nullptr;
  --it;
  return c <= it->last ? it : nullptr;
}

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const CategoryRange* r = find_range(kCombiningClass, c);
  return r ? r->value : 0;
}

// Hangul syllables decompose and compose algorithmically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* end = kDecomposition + std::size(kDecomposition);
  const Decomposition* it =
      std::lower_bound(kDecomposition, end, c, [](const Decomposition& d, char32_t v) { return d.cp < v; });
  if (it != end && it->cp == c) {
    out.insert(out.end(), kDecompositionData + it->offset, kDecompositionData + it->offset + it->length);
  } else {
    out.push_back(c);
  }
}

char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition* end = kComposition + std::size(kComposition);
  const Composition* it = std::lower_bound(kComposition, end, std::make_pair(a, b), [](const Composition& x, auto v) {
    return x.first != v.first ? x.first < v.first : x.second < v.second;
  });
  return it != end && it->first == a && it->second == b ? it->composite : kInvalid;
}

}  // namespace

const char* version() { return ENGINE_UNICODE_VERSION; }
const char* nfc_version() { return ENGINE_NFC_UNICODE_VERSION; }

Category category(char32_t c) {
  if (c < 0x80) {
    if (c >= 'a' && c <= 'z') return Category::Ll;
    if (c >= 'A' && c <= 'Z') return Category::Lu;
    if (c >= '0' && c <= '9') return Category::Nd;
    return Category::Other;
  }
  const CategoryRange* r = find_range(kCategoryRanges, c);
  return r ? static_cast<Category>(r->value) : Category::Other;
}

bool is_white_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return find_range(kWhiteSpace, c) != nullptr;
}

char32_t decode_one(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = b(i);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t c;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return kInvalid;
  }
  if (i + len > s.size()) return kInvalid;
  for (size_t k = 1; k < len; ++k) {
    const uint8_t x = b(i + k);
    if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) return kInvalid;
    c = (c << 6) | (x & 0x3F);
  }
  i += len;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

size_t find_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (decode_one(s, i) == kInvalid) return i;
  }
  return std::string_view::npos;
}

std::string from_utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    if (decode_one(s, i) != kInvalid) {
      out.append(s.substr(start, i - start));
      continue;
    }
    // The maximal prefix of a well-formed sequence is one replacement: the lead byte plus every
    // continuation byte that keeps the sequence a valid prefix.
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    size_t len = 1;
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
    if (b0 >= 0xE0 && b0 <= 0xEF) need = 2, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    if (b0 >= 0xF0 && b0 <= 0xF4) need = 3, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    for (size_t k = 1; k <= need && i + k < s.size(); ++k) {
      const uint8_t x = static_cast<uint8_t>(s[i + k]);
      if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) break;
      ++len;
    }
    out.append("\xEF\xBF\xBD");
    i += len;
  }
  return out;
}

Decoded decode(std::string_view s) {
  Decoded d;
  d.cps.reserve(s.size());
  d.offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    d.offsets.push_back(static_cast<uint32_t>(i));
    const char32_t c = decode_one(s, i);
    ENSURE(c != kInvalid, "text is not valid UTF-8 at byte ", i);
    d.cps.push_back(c);
  }
  d.offsets.push_back(static_cast<uint32_t>(s.size()));
  return d;
}

std::string nfc(std::string_view s) {
  // Fast path: text free of anything that decomposes, reorders or composes is its own NFC.
  size_t i = 0;
  for (; i < s.size();) {
    size_t j = i;
    const char32_t c = decode_one(s, j);
    ENSURE(c != kInvalid, "text is not valid UTF-8 at byte ", i);
    if (c >= 0x300 && ((c >= kSBase && c < kSBase + kSCount) || find_range(kNfcQcNo, c))) break;
    i = j;
  }
  if (i == s.size()) return std::string(s);
  std::vector<char32_t> d;
  for (size_t k = 0; k < s.size();) {
    const char32_t c = decode_one(s, k);
    ENSURE(c != kInvalid, "text is not valid UTF-8 at byte ", k);
    decompose(c, d);
  }
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t a = 0; a < d.size();) {
    if (combining_class(d[a]) == 0) {
      ++a;
      continue;
    }
    size_t b = a;
    while (b < d.size() && combining_class(d[b]) != 0) ++b;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(a), d.begin() + static_cast<std::ptrdiff_t>(b),
                     [](char32_t x, char32_t y) { return combining_class(x) < combining_class(y); });
    a = b;
  }
  // Canonical composition: each character joins the last starter unless blocked.
  std::vector<char32_t> out;
  out.reserve(d.size());
  size_t starter = SIZE_MAX;
  int last_ccc = -1;
  for (char32_t c : d) {
    const int ccc = combining_class(c);
    if (starter != SIZE_MAX && (last_ccc < ccc || (last_ccc == 0 && out.size() == starter + 1))) {
      const char32_t comp = compose(out[starter], c);
      if (comp != kInvalid) {
        out[starter] = comp;
        continue;
      }
    }
    if (ccc == 0) {
      starter = out.size();
      last_ccc = 0;
    } else {
      last_ccc = ccc;
    }
    out.push_back(c);
  }
  std::string r;
  r.reserve(s.size());
  for (char32_t c : out) append_utf8(r, c);
  return r;
}

}  // namespace engine::unicode
