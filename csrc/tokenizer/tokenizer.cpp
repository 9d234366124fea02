// STAND-IN (see tokenizer.h): the byte-level tokenizer only.
#include "tokenizer/tokenizer.h"

#include "core/check.h"

namespace engine {

Tokenizer Tokenizer::byte_level() {
  Tokenizer t;
  t.vocab_size_ = 257;
  t.eos_ = 256;
  return t;
}

Tokenizer Tokenizer::load(const std::string& path) {
  RAISE(path, ": this build reads no tokenizer.json (byte level only); use data.tokenizer = \"bytes\" or \"ids\"");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char ch : text) ids.push_back(ch);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t id : ids)
    if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
  return s;
}

std::string Tokenizer::describe() const { return "byte level (257 ids: bytes 0-255, end of document 256)"; }

}  // namespace engine
