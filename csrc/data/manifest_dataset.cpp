#include "data/manifest_dataset.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace engine {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormat = "engine-token-manifest";
constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;  // a manifest is a list, not data

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Key access on the manifest: every problem is an error "<manifest>: <key>: <what>".
struct Keys {
  const std::string& file;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const { RAISE(file, ": ", key, ": ", what); }
  // Refuses keys outside `known`: a key the reader does not know may change the meaning.
  void only(const json& j, const std::string& where, std::initializer_list<const char*> known) const {
    const std::set<std::string> k(known.begin(), known.end());
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!k.count(it.key()))
        fail(where.empty() ? it.key() : where + "." + it.key(), "unknown key (this engine reads manifest version 1)");
  }
  const json& get(const json& j, const char* key, const std::string& where) const {
    auto it = j.find(key);
    if (it == j.end()) fail(where, "missing");
    return *it;
  }
  int64_t count(const json& j, const char* key, const std::string& where) const {
    const json& v = get(j, key, where);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
        v.get<int64_t>() < 0)
      fail(where, str_cat("expected a non-negative integer, got ", v.dump()));
    return v.get<int64_t>();
  }
  std::string string(const json& j, const char* key, const std::string& where) const {
    const json& v = get(j, key, where);
    if (!v.is_string()) fail(where, str_cat("expected a string, got ", v.dump()));
    return v.get<std::string>();
  }
  bool boolean(const json& j, const char* key, const std::string& where) const {
    const json& v = get(j, key, where);
    if (!v.is_boolean()) fail(where, str_cat("expected true or false, got ", v.dump()));
    return v.get<bool>();
  }
};

bool is_hex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

bool is_manifest_path(const std::string& path) { return ends_with(path, "manifest.json"); }

ManifestDataset::ManifestDataset(const std::string& path) : manifest_(path) {
  path_ = path;
  const std::string& f = manifest_.path();
  const Keys k{f};
  if (manifest_.size() > kMaxManifestBytes)
    RAISE(f, ": ", manifest_.size(), " bytes: not a manifest (at most ", kMaxManifestBytes, " bytes)");
  json m;
  try {
    const char* p = reinterpret_cast<const char*>(manifest_.data());
    m = json::parse(p, p + manifest_.size());
  } catch (const json::parse_error& e) {
    RAISE(f, ": not valid JSON: ", e.what());
  }
  if (!m.is_object()) RAISE(f, ": expected a JSON object (a token dataset manifest)");
  k.only(m, "", {"format", "version", "complete", "dtype", "vocab_size", "loss_masking_spans", "documents", "tokens",
                 "shards", "tokenizer", "options", "inputs"});
  if (k.string(m, "format", "format") != kFormat)
    k.fail("format", str_cat("expected \"", kFormat, "\", got ", m["format"].dump()));
  if (k.count(m, "version", "version") != 1) k.fail("version", str_cat("unsupported version ", m["version"].dump(), ": expected 1"));
  if (!k.boolean(m, "complete", "complete"))
    RAISE(f, ": the preparation that writes it has not finished (\"complete\": false): rerun scripts/prepare_data.py "
             "with the same arguments; it resumes after the last finished shard");
  const std::string dtype = k.string(m, "dtype", "dtype");
  if (dtype == "uint16") type_ = TokenType::U16;
  else if (dtype == "int32") type_ = TokenType::I32;
  else k.fail("dtype", str_cat("expected \"uint16\" or \"int32\", got \"", dtype, "\""));
  vocab_size_ = k.count(m, "vocab_size", "vocab_size");
  if (vocab_size_ < 1 || vocab_size_ > std::numeric_limits<int32_t>::max())
    k.fail("vocab_size", str_cat("must be in [1, 2^31), got ", vocab_size_));
  if (token_type_for_vocab(vocab_size_) != type_)
    k.fail("dtype", str_cat("\"", dtype, "\" does not match vocab_size ", vocab_size_, " (uint16 below 65536, else int32)"));
  has_spans_ = k.boolean(m, "loss_masking_spans", "loss_masking_spans");
  const int64_t want_docs = k.count(m, "documents", "documents"), want_tokens = k.count(m, "tokens", "tokens");
  const json& shards = k.get(m, "shards", "shards");
  if (!shards.is_array() || shards.empty()) k.fail("shards", "expected a non-empty list of shards");

  const fs::path folder = fs::path(f).parent_path();
  doc_start_.push_back(0);
  std::set<std::string> seen;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string w = str_cat("shards[", i, "]");
    const json& s = shards[i];
    if (!s.is_object()) k.fail(w, "expected an object");
    k.only(s, w, {"prefix", "documents", "tokens", "bin_bytes", "idx_bytes", "bin_sha256", "idx_sha256", "next"});
    const std::string rel = k.string(s, "prefix", w + ".prefix");
    if (rel.empty()) k.fail(w + ".prefix", "is empty");
    for (const char* h : {"bin_sha256", "idx_sha256"})
      if (s.contains(h) && !(s[h].is_string() && is_hex(s[h].get<std::string>(), 64)))
        k.fail(w + "." + h, "expected 64 lowercase hex digits");
    const std::string prefix = fs::path(rel).is_absolute() ? rel : (folder / rel).string();
    std::error_code canon_ec;
    const fs::path canon = fs::weakly_canonical(prefix, canon_ec);
    if (!seen.insert(canon_ec ? prefix : canon.string()).second) k.fail(w + ".prefix", str_cat("\"", rel, "\" is listed twice"));
    const int64_t docs = k.count(s, "documents", w + ".documents"), tokens = k.count(s, "tokens", w + ".tokens");
    const int64_t sizes[2] = {k.count(s, "bin_bytes", w + ".bin_bytes"), k.count(s, "idx_bytes", w + ".idx_bytes")};
    const char* exts[2] = {".bin", ".idx"};
    for (int e = 0; e < 2; ++e) {
      const std::string file = prefix + exts[e];
      std::error_code ec;
      const auto st = fs::status(file, ec);
      if (ec || !fs::exists(st)) RAISE(f, ": ", w, ": shard file ", file, " is missing");
      const uint64_t size = fs::file_size(file, ec);
      if (ec) RAISE(f, ": ", w, ": cannot read the size of ", file, ": ", ec.message());
      if (size != static_cast<uint64_t>(sizes[e]))
        RAISE(file, ": ", size, " bytes, but ", f, " records ", sizes[e], " (", w, ".", e ? "idx" : "bin",
              "_bytes): the shard was changed or not completely written; prepare it again");
    }
    std::unique_ptr<MemmapDataset> ds;
    try {
      ds = std::make_unique<MemmapDataset>(prefix);
    } catch (const Error& e) {
      RAISE(f, ": ", w, ": ", e.what());
    }
    auto mismatch = [&](const char* what, const std::string& got, const std::string& want) {
      RAISE(prefix, ".idx: ", what, " ", got, ", but ", f, " records ", want, " (", w, "): the shard does not belong "
            "to this manifest");
    };
    if (ds->num_documents() != docs) mismatch("documents", str_cat(ds->num_documents()), str_cat(docs));
    if (ds->num_tokens() != tokens) mismatch("tokens", str_cat(ds->num_tokens()), str_cat(tokens));
    if (ds->token_type() != type_) mismatch("dtype", token_type_name(ds->token_type()), dtype);
    if (ds->has_loss_masking_spans() != has_spans_)
      mismatch("loss-masking spans", ds->has_loss_masking_spans() ? "present" : "absent", has_spans_ ? "present" : "absent");
    num_tokens_ += tokens;
    doc_start_.push_back(doc_start_.back() + docs);
    shards_.push_back(std::move(ds));
  }
  num_documents_ = doc_start_.back();
  if (num_documents_ != want_docs)
    k.fail("documents", str_cat(want_docs, ", but the shards hold ", num_documents_));
  if (num_tokens_ != want_tokens) k.fail("tokens", str_cat(want_tokens, ", but the shards hold ", num_tokens_));
}

std::pair<const MemmapDataset*, int64_t> ManifestDataset::locate(int64_t doc) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range [0, ", num_documents_, ")");
  // The last shard starting at or before `doc` (empty shards share their start with the next).
  const auto it = std::upper_bound(doc_start_.begin(), doc_start_.end(), doc) - 1;
  const size_t k = static_cast<size_t>(it - doc_start_.begin());
  return {shards_[k].get(), doc - *it};
}

int64_t ManifestDataset::document_size(int64_t doc) const {
  auto [ds, d] = locate(doc);
  return ds->document_size(d);
}

std::vector<TokenSpan> ManifestDataset::loss_masking_spans(int64_t doc) const {
  auto [ds, d] = locate(doc);
  return ds->loss_masking_spans(d);
}

const unsigned char* ManifestDataset::document_data(int64_t doc) const {
  auto [ds, d] = locate(doc);
  return static_cast<const TokenDataset*>(ds)->document_data(d);
}

std::vector<const MappedFile*> ManifestDataset::files() const {
  std::vector<const MappedFile*> out{&manifest_};
  for (const auto& s : shards_)
    for (const MappedFile* m : s->files()) out.push_back(m);
  return out;
}

TokenLocation ManifestDataset::first_token_outside(int64_t limit) const {
  for (size_t k = 0; k < shards_.size(); ++k) {
    TokenLocation at = shards_[k]->first_token_outside(limit);
    if (at.doc >= 0) {
      at.doc += doc_start_[k];
      return at;
    }
  }
  return {};
}

std::vector<const TokenDataset*> ManifestDataset::parts() const {
  std::vector<const TokenDataset*> out;
  for (const auto& s : shards_) out.push_back(s.get());
  return out;
}

}  // namespace engine
