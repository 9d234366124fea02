// Samples of one dataset within one split. The split's documents form an endless stream of
// epochs, each in its own seeded order (IndexPermutation keyed by (seed, split, dataset index),
// stream = epoch). With S = sequence_length, every sample has S + 1 tokens:
//   truncate_documents = true:  the stream is cut Megatron-style, sample k = stream tokens
//     [k * S, k * S + S + 1) (consecutive samples share one token); documents are cut anywhere.
//   truncate_documents = false: documents stay whole and are packed greedily, in stream order,
//     into samples of at most S + 1 tokens; a document longer than S + 1 is skipped (counted);
//     the rest of a sample is padding (token 0, loss mask 0).
// Loss mask: mask[i] = 0 when label i (token i + 1) lies in a loss-masking span or is padding.
// The plan stores one start position per sample (O(tokens / S) memory, O(stream documents)
// time), never the tokens. Sample order is then shuffled within blocks of about one epoch
// (capped at kShuffleBlock samples), so sample j depends only on (seed, data, j), not on how
// many samples were asked for. fill() is const and thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/sampler.h"
#include "data/token_dataset.h"

namespace engine {

// The documents of one dataset that belong to one split (all of them, or a sorted subset).
struct SplitDocuments {
  std::shared_ptr<const TokenDataset> dataset;
  bool all = true;
  std::vector<int64_t> subset;  // ascending document ids when !all

  int64_t size() const { return all ? dataset->num_documents() : static_cast<int64_t>(subset.size()); }
  int64_t operator[](int64_t k) const { return all ? k : subset[static_cast<size_t>(k)]; }
};

struct SamplingParams {
  int sequence_length = 0;  // S
  bool truncate_documents = true;
  int64_t vocab_size = 0;   // token ids must be below
  uint64_t seed = 0;
  std::string key_name;     // e.g. "data/train/0": the randomness of this dataset in this split
};

class DatasetSampler {
 public:
  static constexpr int64_t kShuffleBlock = 4096;

  // Plans at least `num_samples` samples (whole shuffle blocks).
  DatasetSampler(SplitDocuments docs, const SamplingParams& params, int64_t num_samples);

  int64_t planned() const { return planned_; }
  // Local sample j (0 <= j < planned()).
  void fill(int64_t j, Sample* out) const;

  int64_t split_documents() const { return docs_.size(); }
  int64_t split_tokens() const { return split_tokens_; }
  int64_t skipped_documents() const { return too_long_; }  // per epoch (truncate = false)
  double epochs() const;  // stream epochs the plan covers
  // Stream epochs that local samples [0, samples) take: tokens consumed / tokens of the split
  // (truncate_documents = true), documents passed / documents of the split (false).
  double epochs_for(int64_t samples) const;
  const TokenDataset& dataset() const { return *docs_.dataset; }

 private:
  int64_t stream_document(int64_t g) const;  // document id at stream position g
  void plan_truncated(int64_t count);
  void plan_packed(int64_t count);
  // Appends tokens [offset, offset + count) of `doc` at sample position `pos`, checking the
  // vocabulary and clearing the mask of labels inside loss-masking spans.
  void put_piece(int64_t doc, int64_t offset, int64_t count, int64_t pos, Sample* out) const;

  SplitDocuments docs_;
  SamplingParams p_;
  PhiloxKey order_key_, shuffle_key_;
  int64_t split_tokens_ = 0, fitting_tokens_ = 0, too_long_ = 0;
  int64_t block_ = 1, planned_ = 0;
  // Per planned sample: the stream position of its first document (packed mode: one more entry,
  // the end of the last sample) and, in truncated mode, the token offset inside that document.
  std::vector<int64_t> start_;
  std::vector<int32_t> start_offset_;
};

}  // namespace engine
