// Writers for the two token dataset formats the readers accept (FORMATS.md):
//   "prefix"                  -> prefix.bin + prefix.idx, version 1, or version 2 when the
//                                writer keeps loss-masking spans (stored with inclusive ends)
//   "name.fast_llm_dataset"   -> Fast-LLM's single file, with an optional loss-masking section
// Tokens are stored as uint16 when vocab_size < 65536, else int32. Writes are atomic: data goes
// to temporary names (<path>.tmp.<pid>), is fsynced and renamed into place by finish(); a writer
// destroyed without finish() removes its temporary files and leaves existing files untouched.
// Documents stream to disk as they are added; memory is O(documents + spans).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/token_dataset.h"

namespace engine {

class TokenDatasetWriter {
 public:
  virtual ~TokenDatasetWriter() = default;
  // Appends one document; tokens must be in [0, vocab_size), spans [begin, end) within the
  // document (only allowed when the writer keeps spans; empty spans are dropped).
  virtual void add_document(std::span<const int32_t> tokens,
                            std::span<const TokenSpan> spans = {}) = 0;
  // Completes the files (fsync + rename). Nothing may be added afterwards.
  virtual void finish() = 0;
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }

 protected:
  int64_t num_documents_ = 0;
  int64_t num_tokens_ = 0;
};

// Picks the format from the path (".fast_llm_dataset" suffix, else a .bin/.idx prefix).
std::unique_ptr<TokenDatasetWriter> make_token_dataset_writer(const std::string& path,
                                                              int64_t vocab_size,
                                                              bool with_loss_masking_spans = false);

// Writes a whole dataset at once; `spans` is empty or has one list per document.
void write_token_dataset(const std::string& path, const std::vector<std::vector<int32_t>>& documents,
                         int64_t vocab_size,
                         const std::vector<std::vector<TokenSpan>>& spans = {});

}  // namespace engine
