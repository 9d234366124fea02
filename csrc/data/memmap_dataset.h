// Megatron / Fast-LLM legacy token dataset: `prefix.bin` (the raw tokens of all documents, back
// to back) + `prefix.idx` (little-endian index, versions 1-3; layout in FORMATS.md).
//   version >= 2: loss-masking spans (begin, end inclusive), converted here to [begin, end + 1)
//   version >= 3: preference spans (chosen, rejected), validated for size and skipped
// doc_idx (Megatron's sequence-to-document map) must start at 0, be non-decreasing and end at N.
// Documents must be stored in order without overlap; the .bin must end exactly at the end of
// the last document.
#pragma once
#include "data/token_dataset.h"

namespace engine {

class MemmapDataset : public TokenDataset {
 public:
  explicit MemmapDataset(const std::string& prefix);

  int64_t document_size(int64_t doc) const override;
  std::vector<TokenSpan> loss_masking_spans(int64_t doc) const override;
  std::vector<const MappedFile*> files() const override { return {&idx_, &bin_}; }
  int version() const { return version_; }
  bool has_preference_spans() const { return has_preference_spans_; }

 protected:
  const unsigned char* document_data(int64_t doc) const override;
  const std::string& token_file() const override { return bin_.path(); }

 private:
  void parse_index();
  void validate_documents(uint64_t sizes_off, uint64_t pointers_off);
  void validate_spans(uint64_t spans_off);
  void validate_doc_idx(uint64_t off, uint64_t count);

  MappedFile idx_, bin_;
  int version_ = 1;
  bool has_preference_spans_ = false;
  const unsigned char* sizes_ = nullptr;     // i32[N]
  const unsigned char* pointers_ = nullptr;  // i64[N], byte offsets into .bin
  const unsigned char* spans_ = nullptr;     // i32[total][2], inclusive ends
  std::vector<int64_t> span_start_;          // (N + 1) prefix sums of the span counts
};

}  // namespace engine
