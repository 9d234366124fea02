// Training and validation samples, defined independently of ranks and micro-batching: sample i
// of a split is a pure function of (datasets, config, seed, split, i). The trainer takes global
// batch k as samples [k * global_batch, (k + 1) * global_batch) and each data-parallel rank reads
// only its own part, so any layout sees the same global batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/token_scan.h"

namespace engine {

// One training sequence of S = data.sequence_length input positions.
struct Sample {
  std::vector<int32_t> tokens;       // S + 1 tokens: inputs are [0, S), labels are [1, S + 1)
  std::vector<uint8_t> loss_mask;    // S: 1 where the label of position i trains; 0 on padding and
                                     // on labels inside a loss-masking span
  std::vector<int32_t> doc_lengths;  // lengths of the document pieces covering the S input
                                     // positions in order (sum = S); trailing padding, if any, is
                                     // one more piece
  int32_t padding = 0;               // trailing padding positions (truncate_documents = false)
};

enum class Split { Train, Valid };

// How a split uses one of its datasets.
struct DatasetUse {
  std::string where;                  // "run.toml:12: data.train[0]: " (the config entry)
  std::string path;
  int64_t documents = 0, tokens = 0;  // in this split
  int64_t samples = 0;                // samples the source takes from it
  double epochs = 0;                  // passes over its documents those samples make
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Sample `index` (0 <= index < num_samples()); thread-safe, deterministic.
  virtual Sample get(int64_t index) const = 0;
  virtual int64_t num_samples() const = 0;
  // One line per dataset: path, documents, tokens, weight, samples taken from it.
  virtual std::string describe() const = 0;
  virtual std::vector<DatasetUse> usage() const = 0;
  // Throws unless every stored token of every dataset is below model.vocab_size, naming the
  // config entry, the token file, the document, offsets and the id (data/token_scan.h: one
  // parallel scan a file, cached). Reading a sample checks its own tokens in any case.
  void check_token_ids() const { check_token_ids(scan_token_ids()); }
  // The same in two halves, so that the ranks of a run scan once: the scans of every part of every
  // dataset in order (TokenDataset::parts: a manifest's shards), and the check given scans of the
  // same files (made on another rank).
  virtual std::vector<TokenScan> scan_token_ids() const = 0;
  virtual void check_token_ids(const std::vector<TokenScan>& scans) const = 0;
};

// Opens the datasets of `split` and plans `num_samples` samples (more epochs when one is not
// enough). Token ids >= model.vocab_size are an error naming the dataset, document and offset
// (when a sample holding one is read, or for the whole dataset by check_token_ids()).
// Returns nullptr for Split::Valid when the config defines no validation data.
std::unique_ptr<SampleSource> make_sample_source(const Config& config, Split split,
                                                 int64_t num_samples);

}  // namespace engine
