// Internal state of engine::Tokenizer (tokenizer.h), shared by tokenizer.cpp (encode, decode)
// and tokenizer_load.cpp (reading tokenizer.json and the config files beside it).
#pragma once
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace engine {

// tokenizer.json "added_tokens": matched in the text before the model sees it, leftmost first,
// longest on ties; `normalized` ones on the normalized text (their content normalized too).
struct AddedToken {
  int32_t id;
  std::string content;  // what decode gives back (the normalized form for normalized ones)
  std::string match;    // what encode looks for
  bool lstrip = false, rstrip = false, normalized = false, special = false;
};

// A byte trie of added-token strings with leftmost-longest search.
class TokenTrie {
 public:
  void add(const std::string& s, int32_t token_index);
  bool empty() const { return terminal_.size() <= 1; }
  // The longest string starting at text[pos]: (token index, length), or token index -1.
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const;
  bool may_start(uint8_t b) const { return first_[b]; }

 private:
  std::unordered_map<uint64_t, int32_t> edges_;  // node << 8 | byte -> child node
  std::vector<int32_t> terminal_{-1};            // per node: token index or -1
  bool first_[256] = {};
};

struct Tokenizer::Impl {
  bool byte_level = false;  // Tokenizer::byte_level(): none of the members below are used
  std::string path;         // the tokenizer.json read
  std::optional<BpeModel> model;
  std::vector<tok::NormalizerStep> normalizer;
  std::vector<tok::PreTokenizerStep> pre_tokenizer;
  std::vector<tok::DecoderStep> decoder;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index into added
  TokenTrie raw_trie, normalized_trie;
  std::optional<int32_t> bos, eos;
  std::vector<int32_t> eos_ids;
  bool add_bos = false;
  std::optional<int32_t> template_bos;  // what the post_processor prepends
  std::string config_source;  // where bos/eos/add_bos came from, for describe()
  int64_t vocab_size = 0;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids) const;
};

}  // namespace engine
