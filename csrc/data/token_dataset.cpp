#include "data/token_dataset.h"

#include <limits>

#include "data/fast_llm_dataset.h"
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

static bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<TokenDataset> open_token_dataset(const std::string& path) {
  if (ends_with(path, ".fast_llm_dataset")) return std::make_unique<FastLLMDataset>(path);
  std::string prefix = path;
  if (ends_with(prefix, ".bin") || ends_with(prefix, ".idx")) prefix.resize(prefix.size() - 4);
  return std::make_unique<MemmapDataset>(prefix);
}

}  // namespace engine
