// Fast-LLM's single-file prepared dataset `name.fast_llm_dataset` (FORMATS.md):
//   0: "fast_llm_prepared_dataset", u64 big-endian config_offset
//   33: "lm begin" | "token begin" tokens[T] i64 size_cumsum[N+1] "token end"
//       | optional range sections "range begin" i32 ranges[R][2] i32 count_cumsum[N+1] "range end"
//         (loss-masking, chosen, rejected; [begin, end) relative to the document) | "lm end"
//   config_offset: u32 big-endian length, JSON {"type":"language_model","begin","end","tokens":
//         {"begin","end","num_documents","num_tokens","data_type"},"loss_masking_spans":...}
// Every section's begin/end comes from the JSON and is checked against its markers, its
// expected size and the file; cumulative arrays must start at 0, not decrease and end at the
// declared totals. Chosen/rejected spans are validated structurally and otherwise ignored.
// image_patches: absent, "none", or Fast-LLM's "patch" section (FORMATS.md): read and validated
// (every patch's token inside its document, grid positions non-negative, each document's images
// holding its patches), served by image_patches(). advantages and old_log_probabilities must be
// absent or "none": another type is refused, naming it.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include "data/token_dataset.h"

namespace engine {

namespace fast_llm_detail {
struct ConfigReader;
}

class FastLLMDataset : public TokenDataset {
 public:
  explicit FastLLMDataset(const std::string& path);

  int64_t document_size(int64_t doc) const override;
  std::vector<TokenSpan> loss_masking_spans(int64_t doc) const override;
  DocumentPatches image_patches(int64_t doc) const override;
  std::vector<const MappedFile*> files() const override { return {&file_}; }

 protected:
  const unsigned char* document_data(int64_t doc) const override;
  const std::string& token_file() const override { return file_.path(); }

 private:
  MappedFile file_;
  const unsigned char* tokens_ = nullptr;       // tokens[T]
  const unsigned char* size_cumsum_ = nullptr;  // i64[N + 1]
  const unsigned char* ranges_ = nullptr;       // i32[R][2] loss-masking spans
  const unsigned char* range_cumsum_ = nullptr; // i32[N + 1]
  // The image_patches section, where the file has one (patch_shape_ set).
  void read_image_patches(const fast_llm_detail::ConfigReader& cr, const nlohmann::json& cfg, uint64_t lo,
                          uint64_t hi);
  int64_t patch_bytes_ = 0;
  const unsigned char *patch_pixels_ = nullptr, *patch_token_map_ = nullptr, *patch_positions_ = nullptr;
  const unsigned char *patch_cumsum_ = nullptr, *group_lengths_ = nullptr, *group_cumsum_ = nullptr;
};

}  // namespace engine
