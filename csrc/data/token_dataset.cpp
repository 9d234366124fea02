#include "data/token_dataset.h"

#include <algorithm>
#include <limits>

#include "data/fast_llm_dataset.h"
#include "data/manifest_dataset.h"
#include "data/memmap_dataset.h"

namespace engine {

int token_type_size(TokenType t) {
  switch (t) {
    case TokenType::U8:
    case TokenType::I8: return 1;
    case TokenType::I16:
    case TokenType::U16: return 2;
    case TokenType::I32:
    case TokenType::U32: return 4;
    case TokenType::I64: return 8;
  }
  return 0;
}

const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::U8: return "uint8";
    case TokenType::I8: return "int8";
    case TokenType::I16: return "int16";
    case TokenType::U16: return "uint16";
    case TokenType::I32: return "int32";
    case TokenType::U32: return "uint32";
    case TokenType::I64: return "int64";
  }
  return "?";
}

TokenType token_type_for_vocab(int64_t vocab_size) {
  ENSURE(vocab_size > 0 && vocab_size <= std::numeric_limits<int32_t>::max(),
         "vocab_size must be in [1, 2^31), got ", vocab_size);
  return vocab_size < 65536 ? TokenType::U16 : TokenType::I32;
}

namespace {

template <typename T>
void decode(const unsigned char* p, int64_t count, int32_t* out, const std::string& file,
            int64_t doc, int64_t offset) {
  for (int64_t i = 0; i < count; ++i) {
    T v = load_le<T>(p, static_cast<uint64_t>(i));
    if constexpr (std::is_signed_v<T> || sizeof(T) >= 4) {
      if (v < 0 || static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
        RAISE(file, ": document ", doc, ", token offset ", offset + i, ": token id ",
              static_cast<int64_t>(v), " is outside [0, 2^31)");
    }
    out[i] = static_cast<int32_t>(v);
  }
}

}  // namespace

void TokenDataset::read(int64_t doc, int64_t offset, int64_t count, int32_t* out) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range [0, ",
         num_documents_, ")");
  int64_t size = document_size(doc);
  ENSURE(offset >= 0 && count >= 0 && offset <= size && count <= size - offset, path_,
         ": document ", doc, ": read of [", offset, ", ", offset + count, ") outside its ", size,
         " tokens");
  if (count == 0) return;
  const unsigned char* p = document_data(doc) + offset * token_type_size(type_);
  const std::string& f = token_file();
  switch (type_) {
    case TokenType::U8: decode<uint8_t>(p, count, out, f, doc, offset); break;
    case TokenType::I8: decode<int8_t>(p, count, out, f, doc, offset); break;
    case TokenType::I16: decode<int16_t>(p, count, out, f, doc, offset); break;
    case TokenType::U16: decode<uint16_t>(p, count, out, f, doc, offset); break;
    case TokenType::I32: decode<int32_t>(p, count, out, f, doc, offset); break;
    case TokenType::U32: decode<uint32_t>(p, count, out, f, doc, offset); break;
    case TokenType::I64: decode<int64_t>(p, count, out, f, doc, offset); break;
  }
}

std::vector<int32_t> TokenDataset::read(int64_t doc, int64_t offset, int64_t count) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range [0, ",
         num_documents_, ")");
  if (count < 0) count = document_size(doc) - offset;
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(count, 0)));
  read(doc, offset, count, out.data());
  return out;
}

namespace {

// Tokens [offset, offset + count) of documents [doc_begin, doc_end): several whole documents,
// or (doc_end = doc_begin + 1) a part of one long document.
struct ScanPiece {
  int64_t doc_begin, doc_end, offset, count;
};
constexpr int64_t kScanPiece = int64_t{1} << 20;

template <typename T>
void range_of(const unsigned char* p, int64_t n, int64_t* lo, int64_t* hi) {
  T mn = std::numeric_limits<T>::max(), mx = std::numeric_limits<T>::lowest();
  for (int64_t i = 0; i < n; ++i) {
    const T v = load_le<T>(p, static_cast<uint64_t>(i));
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  if (n > 0) {
    *lo = std::min(*lo, static_cast<int64_t>(mn));
    *hi = std::max(*hi, static_cast<int64_t>(mx));
  }
}

template <typename T>
int64_t first_outside(const unsigned char* p, int64_t n, int64_t limit, int64_t* value) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = load_le<T>(p, static_cast<uint64_t>(i));
    bool negative = false;
    if constexpr (std::is_signed_v<T>) negative = v < 0;
    if (negative || static_cast<uint64_t>(v) >= static_cast<uint64_t>(limit)) {
      *value = static_cast<int64_t>(v);
      return i;
    }
  }
  return -1;
}

template <typename F>
auto with_type(TokenType t, F&& f) {
  switch (t) {
    case TokenType::U8: return f(uint8_t{});
    case TokenType::I8: return f(int8_t{});
    case TokenType::I16: return f(int16_t{});
    case TokenType::U16: return f(uint16_t{});
    case TokenType::I32: return f(int32_t{});
    case TokenType::U32: return f(uint32_t{});
    case TokenType::I64: return f(int64_t{});
  }
  return f(int64_t{});
}

std::vector<ScanPiece> scan_pieces(const TokenDataset& ds) {
  std::vector<ScanPiece> out;
  int64_t start = 0, tokens = 0;
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    const int64_t size = ds.document_size(d);
    if (size <= kScanPiece) {
      tokens += size;
      if (tokens >= kScanPiece) {
        out.push_back({start, d + 1, 0, tokens});
        start = d + 1;
        tokens = 0;
      }
      continue;
    }
    if (d > start) out.push_back({start, d, 0, tokens});
    for (int64_t o = 0; o < size; o += kScanPiece) out.push_back({d, d + 1, o, std::min(kScanPiece, size - o)});
    start = d + 1;
    tokens = 0;
  }
  if (start < ds.num_documents()) out.push_back({start, ds.num_documents(), 0, tokens});
  return out;
}

}  // namespace

TokenIdRange TokenDataset::scan_token_ids() const {
  const std::vector<ScanPiece> pieces = scan_pieces(*this);
  const int64_t n = static_cast<int64_t>(pieces.size()), item = token_type_size(type_);
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::lowest();
#pragma omp parallel for schedule(dynamic, 1) reduction(min : lo) reduction(max : hi)
  for (int64_t i = 0; i < n; ++i) {
    const ScanPiece& p = pieces[static_cast<size_t>(i)];
    with_type(type_, [&](auto tag) {
      using T = decltype(tag);
      if (p.doc_end == p.doc_begin + 1) {
        range_of<T>(document_data(p.doc_begin) + p.offset * item, p.count, &lo, &hi);
        return;
      }
      for (int64_t d = p.doc_begin; d < p.doc_end; ++d) range_of<T>(document_data(d), document_size(d), &lo, &hi);
    });
  }
  if (lo > hi) return {};
  return {lo, hi};
}

TokenLocation TokenDataset::first_token_outside(int64_t limit) const {
  const std::vector<ScanPiece> pieces = scan_pieces(*this);
  const int64_t n = static_cast<int64_t>(pieces.size()), item = token_type_size(type_);
  std::vector<TokenLocation> found(pieces.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    const ScanPiece& p = pieces[static_cast<size_t>(i)];
    TokenLocation& at = found[static_cast<size_t>(i)];
    with_type(type_, [&](auto tag) {
      using T = decltype(tag);
      const bool part = p.doc_end == p.doc_begin + 1;
      for (int64_t d = p.doc_begin; d < p.doc_end && at.doc < 0; ++d) {
        const int64_t off = part ? p.offset : 0, count = part ? p.count : document_size(d);
        const unsigned char* data = document_data(d) + off * item;
        if (int64_t k = first_outside<T>(data, count, limit, &at.value); k >= 0) {
          at.doc = d;
          at.offset = off + k;
          at.byte = static_cast<uint64_t>(data + k * item - files().back()->data());
        }
      }
    });
  }
  for (const TokenLocation& at : found)
    if (at.doc >= 0) return at;
  return {};
}

static bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<TokenDataset> open_token_dataset(const std::string& path) {
  if (ends_with(path, ".fast_llm_dataset")) return std::make_unique<FastLLMDataset>(path);
  if (is_manifest_path(path)) return std::make_unique<ManifestDataset>(path);
  std::string prefix = path;
  if (ends_with(prefix, ".bin") || ends_with(prefix, ".idx")) prefix.resize(prefix.size() - 4);
  return std::make_unique<MemmapDataset>(prefix);
}

DocumentPatches TokenDataset::image_patches(int64_t doc) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range [0, ", num_documents_, ")");
  return {};
}

}  // namespace engine
