#include "data/memmap_dataset.h"

#include <limits>

namespace engine {

namespace {

constexpr char kMagic[] = "MMIDIDX\x00\x00";
constexpr uint64_t kMagicSize = 9;

// The dtype codes of the .idx header (Megatron's numpy table). 6/7 are float32/float64: known,
// but not token types.
bool token_type_from_code(uint8_t code, TokenType* out) {
  switch (code) {
    case 1: *out = TokenType::U8; return true;
    case 2: *out = TokenType::I8; return true;
    case 3: *out = TokenType::I16; return true;
    case 4: *out = TokenType::I32; return true;
    case 5: *out = TokenType::I64; return true;
    case 8: *out = TokenType::U16; return true;
    default: return false;
  }
}

}  // namespace

MemmapDataset::MemmapDataset(const std::string& prefix)
    : idx_(prefix + ".idx"), bin_(prefix + ".bin") {
  path_ = prefix;
  parse_index();
}

void MemmapDataset::parse_index() {
  const std::string& f = idx_.path();
  idx_.require(0, kMagicSize, "the magic \"MMIDIDX\\x00\\x00\"");
  if (std::memcmp(idx_.data(), kMagic, kMagicSize) != 0)
    file_error(f, 0, "bad magic: expected \"MMIDIDX\\x00\\x00\" (not a Megatron .idx file)");
  uint64_t off = kMagicSize;
  uint64_t version = idx_.le<uint64_t>(off, "the version");
  if (version < 1 || version > 3)
    file_error(f, off, str_cat("unsupported version ", version, ": expected 1, 2 or 3"));
  version_ = static_cast<int>(version);
  off += 8;
  bool has_spans = false;
  if (version_ >= 2) {
    uint8_t flag = idx_.le<uint8_t>(off, "has_loss_masking_spans");
    if (flag > 1) file_error(f, off, str_cat("has_loss_masking_spans must be 0 or 1, got ", int(flag)));
    has_spans = flag == 1;
    off += 1;
  }
  if (version_ >= 3) {
    uint8_t flag = idx_.le<uint8_t>(off, "has_preference_spans");
    if (flag > 1) file_error(f, off, str_cat("has_preference_spans must be 0 or 1, got ", int(flag)));
    has_preference_spans_ = flag == 1;
    off += 1;
  }
  uint8_t code = idx_.le<uint8_t>(off, "the dtype code");
  if (code == 6 || code == 7)
    file_error(f, off, str_cat("dtype code ", int(code), " (", code == 6 ? "float32" : "float64",
                               ") is not a token type: expected an integer dtype"));
  if (!token_type_from_code(code, &type_))
    file_error(f, off, str_cat("unknown dtype code ", int(code), ": expected 1-5 or 8"));
  off += 1;
  uint64_t n = idx_.le<uint64_t>(off, "the document count");
  // Each document needs at least 12 bytes (size + pointer): bound n before any arithmetic.
  if (n > (idx_.size() - off) / 12 || n > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    file_error(f, off, str_cat("document count ", n, " does not fit in the ", idx_.size(),
                               "-byte file (12 bytes per document at least)"));
  num_documents_ = static_cast<int64_t>(n);
  off += 8;
  uint64_t doc_idx_len = idx_.le<uint64_t>(off, "the doc_idx length");
  if (doc_idx_len < 1 || doc_idx_len > n + 1)
    file_error(f, off, str_cat("doc_idx length ", doc_idx_len, ": expected 1 to N + 1 = ", n + 1));
  off += 8;

  uint64_t sizes_off = off;
  uint64_t pointers_off = checked_mad(n, 4, sizes_off, f, off, "the sizes array");
  off = checked_mad(n, 8, pointers_off, f, off, "the pointers array");
  idx_.require(sizes_off, off - sizes_off, "the sizes and pointers arrays");
  sizes_ = idx_.data() + sizes_off;
  pointers_ = idx_.data() + pointers_off;
  validate_documents(sizes_off, pointers_off);

  if (has_spans) {
    has_spans_ = true;
    uint64_t counts_off = off;
    idx_.require(counts_off, n * 4, "the span counts");
    uint64_t spans_off = counts_off + n * 4;
    // Prefix sums of the counts, bounded by the file so that the span array fits.
    span_start_.assign(n + 1, 0);
    for (uint64_t i = 0; i < n; ++i) {
      int32_t c = load_le<int32_t>(idx_.data() + counts_off, i);
      if (c < 0) file_error(f, counts_off + 4 * i, str_cat("span count of document ", i, " is negative (", c, ")"));
      span_start_[i + 1] = span_start_[i] + c;
      if (static_cast<uint64_t>(span_start_[i + 1]) > (idx_.size() - spans_off) / 8)
        file_error(f, counts_off + 4 * i,
                   str_cat("span counts up to document ", i, " (", span_start_[i + 1],
                           " spans) exceed the file"));
    }
    spans_ = idx_.data() + spans_off;
    validate_spans(spans_off);
    off = spans_off + static_cast<uint64_t>(span_start_[n]) * 8;
  }
  if (has_preference_spans_) {
    // chosen[N][2] then rejected[N][2] (inclusive ends): not used for training, only skipped.
    uint64_t pref_bytes = checked_mad(n, 16, 0, f, off, "the preference spans");
    idx_.require(off, pref_bytes, "the preference spans (chosen, rejected)");
    off += pref_bytes;
  }
  uint64_t doc_idx_bytes = checked_mad(doc_idx_len, 8, 0, f, off, "doc_idx");
  idx_.require(off, doc_idx_bytes, "doc_idx");
  validate_doc_idx(off, doc_idx_len);
  off += doc_idx_bytes;
  if (off != idx_.size())
    file_error(f, off, str_cat("unexpected trailing bytes: the index ends here but the file has ",
                               idx_.size(), " bytes"));
}

void MemmapDataset::validate_documents(uint64_t sizes_off, uint64_t pointers_off) {
  const std::string& f = idx_.path();
  const uint64_t item = static_cast<uint64_t>(token_type_size(type_));
  uint64_t end = 0;  // end of the previous document in .bin
  int64_t total = 0;
  for (int64_t i = 0; i < num_documents_; ++i) {
    int32_t size = load_le<int32_t>(sizes_, i);
    if (size < 0) file_error(f, sizes_off + 4 * i, str_cat("size of document ", i, " is negative (", size, ")"));
    int64_t ptr = load_le<int64_t>(pointers_, i);
    uint64_t at = pointers_off + 8 * i;
    if (ptr < 0) file_error(f, at, str_cat("pointer of document ", i, " is negative (", ptr, ")"));
    if (static_cast<uint64_t>(ptr) < end)
      file_error(f, at, str_cat("pointer of document ", i, " (", ptr,
                                ") is below the end of the previous document (", end,
                                "): pointers must be increasing"));
    uint64_t bytes = static_cast<uint64_t>(size) * item;
    if (static_cast<uint64_t>(ptr) > bin_.size() || bytes > bin_.size() - static_cast<uint64_t>(ptr))
      file_error(f, at, str_cat("pointer out of range: document ", i, " occupies bytes [", ptr, ", ",
                                static_cast<uint64_t>(ptr) + bytes, ") but ", bin_.path(), " has ",
                                bin_.size(), " bytes"));
    end = static_cast<uint64_t>(ptr) + bytes;
    total += size;
  }
  if (end != bin_.size())
    file_error(bin_.path(), std::min(end, bin_.size()),
               str_cat("size mismatch: ", f, " describes ", end, " bytes of ",
                       token_type_name(type_), " tokens, the .bin has ", bin_.size()));
  num_tokens_ = total;
}

void MemmapDataset::validate_spans(uint64_t spans_off) {
  const std::string& f = idx_.path();
  for (int64_t i = 0; i < num_documents_; ++i) {
    int64_t size = load_le<int32_t>(sizes_, i);
    for (int64_t s = span_start_[i]; s < span_start_[i + 1]; ++s) {
      int32_t b = load_le<int32_t>(spans_, 2 * s), e = load_le<int32_t>(spans_, 2 * s + 1);
      // Inclusive end: [b, e] with e = b - 1 is an empty span.
      if (b < 0 || static_cast<int64_t>(e) + 1 < b || static_cast<int64_t>(e) + 1 > size)
        file_error(f, spans_off + 8 * s,
                   str_cat("loss-masking span [", b, ", ", e, "] (inclusive) of document ", i,
                           " is outside the document's ", size, " tokens"));
    }
  }
}

void MemmapDataset::validate_doc_idx(uint64_t off, uint64_t count) {
  const std::string& f = idx_.path();
  const unsigned char* p = idx_.data() + off;
  int64_t prev = 0;
  for (uint64_t i = 0; i < count; ++i) {
    int64_t v = load_le<int64_t>(p, i);
    if ((i == 0 && v != 0) || v < prev || v > num_documents_)
      file_error(f, off + 8 * i,
                 str_cat("doc_idx[", i, "] = ", v, " is inconsistent: expected a non-decreasing ",
                         "sequence from 0 to N = ", num_documents_));
    prev = v;
  }
  if (prev != num_documents_)
    file_error(f, off + 8 * (count - 1),
               str_cat("doc_idx ends at ", prev, ": expected N = ", num_documents_));
}

int64_t MemmapDataset::document_size(int64_t doc) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range [0, ",
         num_documents_, ")");
  return load_le<int32_t>(sizes_, static_cast<uint64_t>(doc));
}

const unsigned char* MemmapDataset::document_data(int64_t doc) const {
  return bin_.data() + load_le<int64_t>(pointers_, static_cast<uint64_t>(doc));
}

std::vector<TokenSpan> MemmapDataset::loss_masking_spans(int64_t doc) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range");
  std::vector<TokenSpan> out;
  if (!has_spans_) return out;
  for (int64_t s = span_start_[doc]; s < span_start_[doc + 1]; ++s) {
    int64_t b = load_le<int32_t>(spans_, 2 * s), e = load_le<int32_t>(spans_, 2 * s + 1);
    if (e + 1 > b) out.push_back({b, e + 1});
  }
  return out;
}

}  // namespace engine
