// A tokenized dataset on disk, memory-mapped read-only: N documents of int tokens, optionally
// with loss-masking spans. Two formats (FORMATS.md): Megatron / Fast-LLM `prefix.bin` +
// `prefix.idx` (versions 1-3) and Fast-LLM's single-file `.fast_llm_dataset`, plus a manifest of
// .bin/.idx shards read as one dataset (data/manifest_dataset.h). Opening validates
// every header field and every size and offset against the file sizes, so that afterwards no
// read can leave the mapping; any problem is an engine::Error "<file>: at offset <n>: <what>".
// Tokens are returned as int32; a stored value outside [0, 2^31) is an error naming the file,
// document and offset. Thread-safe after construction (all methods const, no mutable state).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/mapped_file.h"

namespace engine {

enum class TokenType { U8, I8, I16, U16, I32, U32, I64 };

int token_type_size(TokenType t);
const char* token_type_name(TokenType t);  // numpy spelling: "uint16", "int32", ...
// The type a writer uses for a vocabulary: uint16 below 65536, else int32.
TokenType token_type_for_vocab(int64_t vocab_size);

// The smallest and largest stored token value of a dataset (raw values: negative ones and ones
// past 2^31 included); min > max when it holds no tokens.
struct TokenIdRange {
  int64_t min = 0, max = -1;
  bool operator==(const TokenIdRange&) const = default;
};

// Where a stored token is: document, token offset in it, byte offset in the token file.
struct TokenLocation {
  int64_t doc = -1, offset = 0;
  uint64_t byte = 0;
  int64_t value = 0;
};

// A token range [begin, end) relative to the start of its document.
struct TokenSpan {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const TokenSpan&) const = default;
};

// A document's images (Fast-LLM's "patch" section, FORMATS.md): `count` patches in document
// order, their pixels (count x patch size bytes, uint8) at `pixels`, each patch's token index in
// the document and its position in its image's grid (grid dims values a patch), and the images as
// runs of consecutive patches (image_lengths, summing to count).
struct DocumentPatches {
  int64_t count = 0;
  const unsigned char* pixels = nullptr;
  std::vector<int32_t> token_index, positions, image_lengths;
};

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;

  const std::string& path() const { return path_; }  // prefix or .fast_llm_dataset path
  TokenType token_type() const { return type_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }
  virtual int64_t document_size(int64_t doc) const = 0;
  bool has_loss_masking_spans() const { return has_spans_; }
  // Loss-masking spans of `doc`, [begin, end) relative to the document, within its size (empty
  // when the dataset has none).
  virtual std::vector<TokenSpan> loss_masking_spans(int64_t doc) const = 0;
  // Image patches (a .fast_llm_dataset's image_patches section): their shape (channels, then
  // the grid's dims, e.g. (3, 16, 16)), empty when the dataset has none; and a document's.
  const std::vector<int64_t>& patch_shape() const { return patch_shape_; }
  bool has_image_patches() const { return !patch_shape_.empty(); }
  virtual DocumentPatches image_patches(int64_t doc) const;

  // Tokens [offset, offset + count) of `doc` into out[0, count); bounds-checked.
  void read(int64_t doc, int64_t offset, int64_t count, int32_t* out) const;
  std::vector<int32_t> read(int64_t doc, int64_t offset = 0, int64_t count = -1) const;

  // The file that holds the tokens (the .bin, or the .fast_llm_dataset itself).
  const std::string& tokens_path() const { return token_file(); }
  // The mapped files whose contents define the tokens (the .idx and .bin, or the one file); the
  // last one holds the tokens.
  virtual std::vector<const MappedFile*> files() const = 0;
  // The datasets whose files hold the tokens: this one, or a manifest's shards in order.
  virtual std::vector<const TokenDataset*> parts() const { return {this}; }
  // Every stored token's range, scanned in parallel (OpenMP) over pieces of about 1M tokens.
  TokenIdRange scan_token_ids() const;
  // The first stored token outside [0, limit) in document order (doc = -1 when there is none);
  // `byte` is its offset in the file that holds it (for a manifest: the shard's .bin).
  virtual TokenLocation first_token_outside(int64_t limit) const;

 protected:
  friend class ManifestDataset;  // serves its documents from its shards' mappings
  // First byte of the tokens of `doc` inside the mapping (validated at open).
  virtual const unsigned char* document_data(int64_t doc) const = 0;
  // The file that holds the tokens (for error messages).
  virtual const std::string& token_file() const = 0;

  std::string path_;
  std::vector<int64_t> patch_shape_;
  TokenType type_ = TokenType::U16;
  int64_t num_documents_ = 0;
  int64_t num_tokens_ = 0;
  bool has_spans_ = false;
};

// Opens `path`: a file ending in ".fast_llm_dataset", a manifest (ending in "manifest.json"),
// else the prefix of `path.bin` + `path.idx`
// (a trailing ".bin" or ".idx" is accepted and stripped).
std::unique_ptr<TokenDataset> open_token_dataset(const std::string& path);

}  // namespace engine
