// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}): vocab, merges
// by rank, byte fallback (<0xNN> tokens), unk / fuse_unk, ignore_merges, and a word cache.
// A word is split into its characters, then the adjacent pair of lowest merge rank (leftmost on
// ties) is merged until no pair has a merge; a priority queue over a linked list of symbols keeps
// this O(n log n) in the word's length.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace engine {

class BpeModel {
 public:
  // Reads the "model" object; `where` names the file for errors. Refuses options it does not
  // implement (dropout, continuing_subword_prefix, end_of_word_suffix) and merges naming tokens
  // outside the vocab.
  BpeModel(const nlohmann::json& model, const std::string& where);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the id is not in the vocab
  int64_t max_id_plus_one() const { return static_cast<int64_t>(id_to_token_.size()); }
  size_t vocab_entries() const { return vocab_.size(); }
  bool byte_fallback() const { return byte_fallback_; }
  size_t merge_count() const { return merge_count_; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  struct Merge {
    int32_t rank, new_id;
  };
  // (left id << 32 | right id) -> rank, result: an open-addressing table (linear probing, a
  // power-of-two size at least twice the merge count), the hot lookup of merge_word.
  struct MergeSlot {
    uint64_t key = kEmptySlot;
    Merge merge{};
  };
  static constexpr uint64_t kEmptySlot = ~uint64_t{0};
  std::vector<MergeSlot> merge_table_;
  size_t merge_count_ = 0;
  int merge_shift_ = 64;
  const Merge* find_merge(int32_t left, int32_t right) const;
  void build_merge_table(const std::vector<std::pair<uint64_t, Merge>>& merges);
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xNN> ids when byte_fallback (-1: absent)

  // A word -> ids memo in flat arrays (no allocation per entry): an open-addressing table
  // (linear probing) of slots that point into one arena of word bytes and one of ids. Words
  // shorter than kMaxWord bytes; emptied whole when it holds kEntries words.
  class WordCache {
   public:
    static constexpr size_t kMaxWord = 256, kEntries = 10000;
    // Appends the ids of `word` to out; false (out untouched) when it is not cached.
    bool get(std::string_view word, std::vector<int32_t>& out) const;
    void put(std::string_view word, const std::vector<int32_t>& ids);

   private:
    static constexpr size_t kSlots = 16384;  // a power of two; at most kEntries / kSlots full
    struct Slot {
      uint64_t hash = 0;
      uint32_t key = 0, ids = 0;          // offsets into keys_ and ids_
      uint16_t key_len = 0, id_count = 0;  // key_len 0: an empty slot (words are never empty)
    };
    std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
    std::string keys_;
    std::vector<int32_t> ids_;
    size_t count_ = 0;
  };
  mutable std::mutex cache_mutex_;
  mutable WordCache cache_;
};

}  // namespace engine
