// Encode and decode (tokenizer.h), as tokenizers' TokenizerImpl: added tokens are split out of
// the raw text first (those with normalized=false), each remaining piece is normalized and split
// again on the normalized added tokens, then pre-tokenized into words the BPE model encodes one
// by one. Decode maps ids to token strings (added tokens, then the model vocab) and runs the
// decoder over the list.
#include "tokenizer/tokenizer_impl.h"

#include "core/check.h"
#include "tokenizer/unicode.h"

namespace engine {

namespace {

constexpr int32_t kByteEos = 256;

// One piece of an added-token split: a token (id >= 0) or text to process further.
struct Span {
  int32_t token;  // index into Impl::added, or -1
  size_t begin, end;
};

// Length of the White_Space run that ends text (tokenizers' `\s*$`).
size_t trailing_space(std::string_view text) {
  size_t i = text.size();
  while (i > 0) {
    size_t k = i - 1;
    while (k > 0 && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
    size_t j = k;
    if (!unicode::is_white_space(unicode::decode_one(text, j))) break;
    i = k;
  }
  return text.size() - i;
}

size_t leading_space(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    const char32_t c = unicode::decode_one(text, j);
    if (c == unicode::kInvalid || !unicode::is_white_space(c)) break;
    i = j;
  }
  return i;
}

// tokenizers' AddedVocabulary::find_matches.
std::vector<Span> split_added(std::string_view text, const TokenTrie& trie, const std::vector<AddedToken>& added) {
  std::vector<Span> out;
  size_t offset = 0;  // end of the last token
  if (!trie.empty()) {
    for (size_t pos = 0; pos < text.size();) {
      if (!trie.may_start(static_cast<uint8_t>(text[pos]))) {
        ++pos;
        continue;
      }
      auto [index, len] = trie.longest_at(text, pos);
      if (index < 0) {
        ++pos;
        continue;
      }
      const AddedToken& t = added[static_cast<size_t>(index)];
      size_t start = pos, stop = pos + len;
      if (t.lstrip) start = std::max(start - trailing_space(text.substr(0, start)), offset);
      if (t.rstrip) stop += leading_space(text.substr(stop));
      if (offset < start) out.push_back(Span{-1, offset, start});
      out.push_back(Span{index, start, stop});
      offset = stop;
      pos = pos + len;
    }
  }
  if (offset != text.size() || out.empty()) out.push_back(Span{-1, offset, text.size()});
  return out;
}

}  // namespace

void TokenTrie::add(const std::string& s, int32_t token_index) {
  int32_t node = 0;
  for (char ch : s) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(ch);
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      it = edges_.emplace(key, static_cast<int32_t>(terminal_.size())).first;
      terminal_.push_back(-1);
    }
    node = it->second;
  }
  terminal_[static_cast<size_t>(node)] = token_index;
  if (!s.empty()) first_[static_cast<uint8_t>(s[0])] = true;
}

std::pair<int32_t, size_t> TokenTrie::longest_at(std::string_view text, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[static_cast<size_t>(node)] >= 0) best = {terminal_[static_cast<size_t>(node)], i + 1 - pos};
  }
  return best;
}

std::optional<int32_t> Tokenizer::Impl::token_to_id(std::string_view token) const {
  for (const AddedToken& t : added)
    if (t.content == token) return t.id;
  return model->token_to_id(token);
}

std::vector<int32_t> Tokenizer::Impl::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  const size_t bad = unicode::find_invalid_utf8(text);
  if (bad != std::string_view::npos) RAISE("encode: the text is not valid UTF-8 at byte ", bad, " (", path, ")");
  for (const Span& s : split_added(text, raw_trie, added)) {
    if (s.token >= 0) {
      ids.push_back(added[static_cast<size_t>(s.token)].id);
      continue;
    }
    const std::string norm = tok::normalize(normalizer, std::string(text.substr(s.begin, s.end - s.begin)));
    for (const Span& n : split_added(norm, normalized_trie, added)) {
      if (n.token >= 0) {
        ids.push_back(added[static_cast<size_t>(n.token)].id);
        continue;
      }
      std::vector<tok::Piece> pieces;
      pieces.push_back(tok::Piece{norm.substr(n.begin, n.end - n.begin), s.begin == 0 && n.begin == 0});
      for (const tok::Piece& p : tok::pre_tokenize(pre_tokenizer, std::move(pieces))) model->tokenize(p.text, ids);
    }
  }
  return ids;
}

std::string Tokenizer::Impl::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = added_by_id.find(id);
    if (it != added_by_id.end()) {
      tokens.push_back(added[it->second].content);
    } else if (const std::string* t = model->id_to_token(id)) {
      tokens.push_back(*t);
    }
  }
  return tok::decode_tokens(decoder, std::move(tokens));
}

Tokenizer Tokenizer::byte_level() {
  auto impl = std::make_shared<Impl>();
  impl->byte_level = true;
  impl->eos = kByteEos;
  impl->eos_ids = {kByteEos};
  impl->vocab_size = kByteEos + 1;
  impl->config_source = "built in";
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (!impl_->byte_level) return impl_->encode(text);
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  if (!impl_->byte_level) return impl_->decode(ids);
  // The end-of-document id 256 has no text; other ids outside 0..255 are skipped like unknown ids.
  std::string bytes;
  bytes.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && id < 256) bytes.push_back(static_cast<char>(id));
  return unicode::from_utf8_lossy(bytes);
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
std::optional<int32_t> Tokenizer::template_bos_id() const { return impl_->template_bos; }
std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos_ids; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (impl_->byte_level) return std::nullopt;
  return impl_->token_to_id(token);
}

std::string Tokenizer::describe() const {
  const Impl& t = *impl_;
  auto name = [&](std::optional<int32_t> id) -> std::string {
    if (!id) return "none";
    if (t.byte_level) return std::to_string(*id);
    std::string s = std::to_string(*id);
    auto it = t.added_by_id.find(*id);
    const std::string* tok = it != t.added_by_id.end() ? &t.added[it->second].content : t.model->id_to_token(*id);
    if (tok) s += " " + *tok;
    return s;
  };
  std::string kind;
  if (t.byte_level) {
    kind = "byte level (id = UTF-8 byte, 256 = end of document)";
  } else {
    bool byte_level_pre = false;
    for (const auto& st : t.pre_tokenizer) byte_level_pre = byte_level_pre || st.kind == tok::PreTokenizerStep::ByteLevel;
    kind = str_cat(byte_level_pre ? "byte-level BPE" : "BPE", t.model->byte_fallback() ? " with byte fallback" : "",
                   " from ", t.path, " (", t.model->vocab_entries(), " tokens, ", t.model->merge_count(), " merges, ",
                   t.added.size(), " added)");
  }
  std::string eos = name(t.eos);
  if (t.eos_ids.size() > 1) eos += str_cat(" (+", t.eos_ids.size() - 1, " more stop ids)");
  return str_cat("tokenizer: ", kind, ", vocab ", t.vocab_size, ", bos ", name(t.bos),
                 t.add_bos ? " (prepended)" : "", ", eos ", eos, "; bos/eos from ", t.config_source);
}

}  // namespace engine
