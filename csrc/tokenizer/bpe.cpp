// BPE model (bpe.h). Semantics follow Hugging Face tokenizers' BPE: a character missing from the
// vocab becomes its <0xNN> byte tokens when byte_fallback holds and all exist, else the unk token
// (consecutive ones fused into one with fuse_unk), else it is dropped; with ignore_merges a word
// that is itself in the vocab is one token. Duplicate merges keep the later rank.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/unicode.h"

namespace engine {

using json = nlohmann::json;

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

const json* optional_key(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

BpeModel::BpeModel(const json& m, const std::string& where) {
  const std::string at = where + ": model.";
  auto boolean = [&](const char* key, bool def) {
    const json* v = optional_key(m, key);
    if (!v) return def;
    if (!v->is_boolean()) RAISE(at, key, ": expected true or false, got ", v->dump());
    return v->get<bool>();
  };
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = optional_key(m, key);
    if (v && !(v->is_string() && v->get<std::string>().empty()))
      RAISE(at, key, " = ", v->dump(), " is not supported (only null)");
  }
  if (const json* d = optional_key(m, "dropout")) {
    if (!d->is_number() || d->get<double>() != 0.0)
      RAISE(at, "dropout = ", d->dump(), " is not supported (only null or 0: dropout samples at random)");
  }
  fuse_unk_ = boolean("fuse_unk", false);
  byte_fallback_ = boolean("byte_fallback", false);
  ignore_merges_ = boolean("ignore_merges", false);

  const json* vocab = optional_key(m, "vocab");
  if (!vocab || !vocab->is_object()) RAISE(at, "vocab: expected an object of token -> id");
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      RAISE(at, "vocab[\"", token, "\"]: expected an id in [0, 2^31), got ", id.dump());
    const int64_t v = id.get<int64_t>();
    if (v >= (int64_t{1} << 24)) RAISE(at, "vocab[\"", token, "\"]: id ", v, " is too large (at most 2^24 - 1)");
    vocab_[token] = static_cast<int32_t>(v);
    max_id = std::max(max_id, v);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab_) {
    if (has_id_[static_cast<size_t>(id)])
      RAISE(at, "vocab: id ", id, " is given to both \"", id_to_token_[static_cast<size_t>(id)], "\" and \"", token, "\"");
    id_to_token_[static_cast<size_t>(id)] = token;
    has_id_[static_cast<size_t>(id)] = true;
  }

  if (const json* unk = optional_key(m, "unk_token")) {
    if (!unk->is_string()) RAISE(at, "unk_token: expected a string or null, got ", unk->dump());
    auto id = token_to_id(unk->get<std::string>());
    if (!id) RAISE(at, "unk_token \"", unk->get<std::string>(), "\" is not in the vocab");
    unk_id_ = *id;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto id = token_to_id(name);
    byte_ids_[b] = id ? *id : -1;
  }

  const json* merges = optional_key(m, "merges");
  if (!merges || !merges->is_array()) RAISE(at, "merges: expected an array");
  int32_t rank = 0;
  std::vector<std::pair<uint64_t, Merge>> list;
  list.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& e = (*merges)[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;  // merges.txt's header line, skipped as HF does
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        RAISE(at, "merges[", i, "]: expected \"left right\" (two tokens, one space), got ", e.dump());
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      RAISE(at, "merges[", i, "]: expected \"left right\" or [\"left\", \"right\"], got ", e.dump());
    }
    const auto ia = token_to_id(a), ib = token_to_id(b), ic = token_to_id(a + b);
    if (!ia) RAISE(at, "merges[", i, "]: token \"", a, "\" is not in the vocab");
    if (!ib) RAISE(at, "merges[", i, "]: token \"", b, "\" is not in the vocab");
    if (!ic) RAISE(at, "merges[", i, "]: the merged token \"", a + b, "\" is not in the vocab");
    list.emplace_back(pair_key(*ia, *ib), Merge{rank++, *ic});
  }
  build_merge_table(list);
}

void BpeModel::build_merge_table(const std::vector<std::pair<uint64_t, Merge>>& merges) {
  size_t size = 16;
  merge_shift_ = 60;
  while (size < 2 * merges.size()) size *= 2, --merge_shift_;
  merge_table_.assign(size, MergeSlot{});
  for (const auto& [key, m] : merges) {
    size_t h = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> merge_shift_);
    while (merge_table_[h].key != kEmptySlot && merge_table_[h].key != key) h = (h + 1) & (size - 1);
    if (merge_table_[h].key == kEmptySlot) ++merge_count_;
    merge_table_[h] = MergeSlot{key, m};  // a duplicate pair keeps its later rank, as in tokenizers
  }
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  const size_t mask = merge_table_.size() - 1;
  for (size_t h = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> merge_shift_);; h = (h + 1) & mask) {
    const MergeSlot& s = merge_table_[h];
    if (s.key == key) return &s.merge;
    if (s.key == kEmptySlot) return nullptr;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[static_cast<size_t>(id)]) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < WordCache::kMaxWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.get(word, out)) return;
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    cache_.put(word, ids);
  }
}

bool BpeModel::WordCache::get(std::string_view word, std::vector<int32_t>& out) const {
  const uint64_t h = std::hash<std::string_view>{}(word);
  for (size_t i = h & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& s = slots_[i];
    if (s.key_len == 0) return false;
    if (s.hash == h && s.key_len == word.size() && std::memcmp(keys_.data() + s.key, word.data(), word.size()) == 0) {
      out.insert(out.end(), ids_.begin() + s.ids, ids_.begin() + s.ids + s.id_count);
      return true;
    }
  }
}

void BpeModel::WordCache::put(std::string_view word, const std::vector<int32_t>& ids) {
  // Only words shorter than kMaxWord bytes: their ids (at most one per byte) fit the uint16 count.
  if (word.empty() || word.size() >= kMaxWord || ids.size() >= kMaxWord) return;
  if (count_ >= kEntries) {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    count_ = 0;
  }
  const uint64_t h = std::hash<std::string_view>{}(word);
  size_t i = h & (kSlots - 1);
  while (slots_[i].key_len != 0) i = (i + 1) & (kSlots - 1);
  slots_[i] = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                   static_cast<uint16_t>(word.size()), static_cast<uint16_t>(ids.size())};
  keys_.append(word);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++count_;
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int64_t prev, next;  // -1: none
    bool alive;
  };
  std::vector<Symbol> sym;
  ENSURE(w.size() < static_cast<size_t>(INT32_MAX), "BPE: a word of ", w.size(), " bytes is too long");
  sym.reserve(w.size());
  auto push = [&](int32_t id) {
    const int64_t n = static_cast<int64_t>(sym.size());
    sym.push_back(Symbol{id, n - 1, -1, true});
    if (n > 0) sym[static_cast<size_t>(n - 1)].next = n;
  };
  int32_t pending_unk = -1;  // an unk not yet pushed (fused with the next ones)
  for (size_t i = 0; i < w.size();) {
    const size_t start = i;
    if (unicode::decode_one(w, i) == unicode::kInvalid) RAISE("BPE: word is not valid UTF-8 at byte ", start);
    const std::string_view ch = w.substr(start, i - start);
    if (auto id = token_to_id(ch)) {
      if (pending_unk >= 0) push(pending_unk), pending_unk = -1;
      push(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        // Like HF, byte tokens do not flush a pending unk: it lands after them.
        for (char c : ch) push(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) push(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) push(pending_unk);

  // Candidates in a 4-ary min-heap on (rank, position): the order tokenizers merges in.
  struct Candidate {
    uint64_t order;  // rank << 32 | position
    int32_t new_id;
  };
  std::vector<Candidate> heap;
  heap.reserve(sym.size());
  auto sift_down = [&](size_t i) {
    const Candidate c = heap[i];
    while (true) {
      const size_t first = 4 * i + 1;
      if (first >= heap.size()) break;
      size_t best = first;
      const size_t last = std::min(first + 4, heap.size());
      for (size_t k = first + 1; k < last; ++k)
        if (heap[k].order < heap[best].order) best = k;
      if (heap[best].order >= c.order) break;
      heap[i] = heap[best];
      i = best;
    }
    heap[i] = c;
  };
  auto push_heap = [&](Candidate c) {
    size_t i = heap.size();
    heap.push_back(c);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (heap[parent].order <= c.order) break;
      heap[i] = heap[parent];
      i = parent;
    }
    heap[i] = c;
  };
  auto candidate = [&](int64_t pos, const Merge& m) {
    return Candidate{(static_cast<uint64_t>(static_cast<uint32_t>(m.rank)) << 32) | static_cast<uint32_t>(pos), m.new_id};
  };
  auto consider = [&](int64_t pos) {
    if (pos < 0) return;
    const Symbol& s = sym[static_cast<size_t>(pos)];
    if (s.next < 0) return;
    if (const Merge* m = find_merge(s.id, sym[static_cast<size_t>(s.next)].id)) push_heap(candidate(pos, *m));
  };
  for (int64_t p = 0; p + 1 < static_cast<int64_t>(sym.size()); ++p)
    if (const Merge* m = find_merge(sym[static_cast<size_t>(p)].id, sym[static_cast<size_t>(p + 1)].id))
      heap.push_back(candidate(p, *m));
  for (size_t i = heap.size() / 4 + 1; i-- > 0;)
    if (i < heap.size()) sift_down(i);
  while (!heap.empty()) {
    const Candidate top = heap.front();
    heap.front() = heap.back();
    heap.pop_back();
    if (!heap.empty()) sift_down(0);
    const int64_t pos = static_cast<int64_t>(top.order & 0xFFFFFFFFu);
    Symbol& s = sym[static_cast<size_t>(pos)];
    if (!s.alive || s.next < 0) continue;
    Symbol& right = sym[static_cast<size_t>(s.next)];
    // A stale entry: the pair at this position changed since it was queued.
    const Merge* m = find_merge(s.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    s.id = top.new_id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) sym[static_cast<size_t>(s.next)].prev = pos;
    consider(s.prev);
    consider(pos);
  }
  for (const Symbol& s : sym)
    if (s.alive) out.push_back(s.id);
}

}  // namespace engine
