// STAND-IN for the tokenizer another change brings (same path, same interface): text <-> token
// ids. This version has only the byte-level tokenizer of scripts/prepare_data.py (token = UTF-8
// byte 0..255, end-of-document 256, vocabulary 257); load() refuses every path, naming it. The
// generation code (train/generate.h) is written against exactly this interface.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace engine {

class Tokenizer {
 public:
  static Tokenizer byte_level();
  // A tokenizer.json file, or a folder holding one (this stand-in: always an error).
  static Tokenizer load(const std::string& path);

  std::vector<int32_t> encode(std::string_view text) const;
  // Ids that are not text (the end-of-document id) decode to nothing.
  std::string decode(std::span<const int32_t> ids) const;
  int64_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> bos_id() const { return bos_; }
  std::optional<int32_t> eos_id() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  std::string describe() const;

 private:
  int64_t vocab_size_ = 0;
  std::optional<int32_t> bos_, eos_;
  bool add_bos_ = false;
};

}  // namespace engine
