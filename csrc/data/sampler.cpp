// make_sample_source: opens the datasets of a split, derives the validation split when asked,
// plans each dataset's samples (DatasetSampler) and blends them.
// Blending: with normalised weights w_d, global sample i comes from the dataset d maximising
// w_d * (i + 1) - taken_d (ties to the lowest d), as that dataset's next sample: every prefix
// of the global order is within one sample of the exact proportions, and the choice depends on
// i alone, never on ranks or access order.
// Validation split from data.valid_fraction (when data.valid is empty): in each train dataset
// a seeded subset of round(fraction * N) documents (at least 1, at most N - 1) is the valid
// split and the train split excludes it.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "data/dataset_sampler.h"
#include "data/permutation.h"
#include "data/sampler.h"
#include "data/token_scan.h"

namespace engine {

namespace {

// The two splits of a dataset's documents under valid_fraction.
void split_documents(const std::shared_ptr<const TokenDataset>& ds, double fraction, uint64_t seed,
                     size_t dataset_index, SplitDocuments* train, SplitDocuments* valid) {
  const int64_t n = ds->num_documents();
  ENSURE(n >= 2, ds->path(), ": data.valid_fraction needs at least 2 documents, the dataset has ", n);
  int64_t k = std::llround(fraction * static_cast<double>(n));
  k = std::clamp<int64_t>(k, 1, n - 1);
  IndexPermutation perm(philox_key(seed, "data/valid_split"), static_cast<uint64_t>(n), dataset_index);
  std::vector<uint8_t> in_valid(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < k; ++i) in_valid[perm(static_cast<uint64_t>(i))] = 1;
  *train = SplitDocuments{ds, false, {}};
  *valid = SplitDocuments{ds, false, {}};
  train->subset.reserve(static_cast<size_t>(n - k));
  valid->subset.reserve(static_cast<size_t>(k));
  for (int64_t d = 0; d < n; ++d) (in_valid[static_cast<size_t>(d)] ? valid : train)->subset.push_back(d);
}

// The blending rule's choice for sample i, given the counts taken before it.
size_t blend_choice(const std::vector<double>& w, const std::vector<int64_t>& taken, int64_t i) {
  size_t best = 0;
  double best_err = -INFINITY;
  for (size_t d = 0; d < w.size(); ++d) {
    double err = w[d] * static_cast<double>(i + 1) - static_cast<double>(taken[d]);
    if (err > best_err) {
      best_err = err;
      best = d;
    }
  }
  return best;
}

class BlendedSampleSource final : public SampleSource {
 public:
  // Counts taken from each dataset are kept every kStride samples (O(num_samples / kStride)
  // memory); get() replays the rule from the last snapshot, at most kStride cheap steps.
  static constexpr int64_t kStride = 256;

  BlendedSampleSource(std::vector<double> weights, int64_t num_samples, const DataConfig& data)
      : weights_(std::move(weights)), n_(num_samples), data_(data) {
    std::vector<int64_t> taken(weights_.size(), 0);
    for (int64_t i = 0; i < n_; ++i) {
      if (i % kStride == 0) snapshots_.insert(snapshots_.end(), taken.begin(), taken.end());
      taken[blend_choice(weights_, taken, i)]++;
    }
    taken_ = taken;
  }

  // Samples each dataset must provide.
  const std::vector<int64_t>& counts() const { return taken_; }
  void set_samplers(std::vector<std::unique_ptr<DatasetSampler>> samplers, std::vector<std::string> wheres,
                    int64_t vocab_size) {
    samplers_ = std::move(samplers);
    wheres_ = std::move(wheres);
    vocab_size_ = vocab_size;
  }

  Sample get(int64_t index) const override {
    ENSURE(index >= 0 && index < n_, "sample index ", index, " out of range [0, ", n_, ")");
    size_t d = 0;
    int64_t j = index;
    if (weights_.size() > 1) {
      const int64_t base = index / kStride * kStride;
      const size_t D = weights_.size();
      std::vector<int64_t> taken(snapshots_.begin() + static_cast<std::ptrdiff_t>(base / kStride * D),
                                 snapshots_.begin() + static_cast<std::ptrdiff_t>((base / kStride + 1) * D));
      for (int64_t i = base; i < index; ++i) taken[blend_choice(weights_, taken, i)]++;
      d = blend_choice(weights_, taken, index);
      j = taken[d];
    }
    Sample s;
    samplers_[d]->fill(j, &s);
    return s;
  }

  int64_t num_samples() const override { return n_; }

  std::string describe() const override {
    std::ostringstream os;
    for (size_t d = 0; d < samplers_.size(); ++d) {
      const DatasetSampler& s = *samplers_[d];
      if (d) os << "\n";
      os << s.dataset().path() << ": " << s.split_documents() << " documents, " << s.split_tokens()
         << " tokens, weight " << weights_[d] << ", " << taken_[d] << " samples (planned "
         << s.planned() << ", " << s.epochs() << " epochs)";
      if (!data_.truncate_documents && s.skipped_documents() > 0)
        os << ", skipped " << s.skipped_documents() << " documents longer than sequence_length + 1 = "
           << data_.sequence_length + 1 << " tokens";
    }
    return os.str();
  }

  std::vector<DatasetUse> usage() const override {
    std::vector<DatasetUse> out;
    for (size_t d = 0; d < samplers_.size(); ++d) {
      const DatasetSampler& s = *samplers_[d];
      out.push_back({wheres_[d], s.dataset().path(), s.split_documents(), s.split_tokens(), taken_[d],
                     s.epochs_for(taken_[d])});
    }
    return out;
  }

  std::vector<TokenScan> scan_token_ids() const override {
    std::vector<TokenScan> out;
    for (size_t d = 0; d < samplers_.size(); ++d) {
      try {
        for (const TokenDataset* part : samplers_[d]->dataset().parts()) out.push_back(scan_token_ids_cached(*part));
      } catch (const Error& e) {
        throw Error(wheres_[d] + e.what());
      }
    }
    return out;
  }

  void check_token_ids(const std::vector<TokenScan>& scans) const override {
    size_t i = 0;
    for (size_t d = 0; d < samplers_.size(); ++d) {
      try {
        for (const TokenDataset* part : samplers_[d]->dataset().parts()) {
          ENSURE(i < scans.size(), "check_token_ids: ", scans.size(), " scans for more parts");
          check_token_range(*part, scans[i++], vocab_size_);
        }
      } catch (const Error& e) {
        throw Error(wheres_[d] + e.what());
      }
    }
    ENSURE(i == scans.size(), "check_token_ids: ", scans.size(), " scans for ", i, " parts");
  }

 private:
  std::vector<std::unique_ptr<DatasetSampler>> samplers_;
  std::vector<std::string> wheres_;  // "run.toml:12: data.train[0]: " per dataset
  int64_t vocab_size_ = 0;
  std::vector<double> weights_;
  int64_t n_;
  DataConfig data_;
  std::vector<int64_t> snapshots_;  // (ceil(n / kStride), datasets) counts before sample k * kStride
  std::vector<int64_t> taken_;      // samples taken from each dataset in all
};

}  // namespace

std::unique_ptr<SampleSource> make_sample_source(const Config& config, Split split, int64_t num_samples) {
  const DataConfig& data = config.data;
  ENSURE(data.sequence_length > 0, "data.sequence_length must be positive, got ", data.sequence_length);
  ENSURE(config.model.vocab_size > 0, "model.vocab_size must be positive, got ", config.model.vocab_size);
  ENSURE(num_samples >= 0, "num_samples must be >= 0, got ", num_samples);
  ENSURE(data.valid_fraction >= 0 && data.valid_fraction < 1,
         "data.valid_fraction must be in [0, 1), got ", data.valid_fraction);
  const bool derived_valid = data.valid.empty() && data.valid_fraction > 0;
  const char* split_name = split == Split::Train ? "train" : "valid";
  const std::vector<DatasetRef>* refs = &data.train;
  if (split == Split::Valid) {
    if (!data.valid.empty()) refs = &data.valid;
    else if (!derived_valid) return nullptr;
  }
  const char* refs_name = refs == &data.valid ? "valid" : "train";
  ENSURE(!refs->empty(), "data.", refs_name, ": no datasets configured");

  double total = 0;
  for (size_t i = 0; i < refs->size(); ++i) {
    double w = (*refs)[i].weight;
    ENSURE(std::isfinite(w) && w >= 0, "data.", refs_name, "[", i,
           "].weight must be finite and >= 0, got ", w);
    total += w;
  }
  ENSURE(total > 0, "data.", refs_name, ": the dataset weights sum to 0");
  std::vector<double> weights;
  for (const DatasetRef& r : *refs) weights.push_back(r.weight / total);

  auto source = std::make_unique<BlendedSampleSource>(weights, num_samples, data);
  const std::vector<int64_t>& counts = source->counts();

  std::vector<std::unique_ptr<DatasetSampler>> samplers;
  std::vector<std::string> wheres;
  for (size_t i = 0; i < refs->size(); ++i) {
    const DatasetRef& ref = (*refs)[i];
    // "run.toml:12: data.train[0]: " in front of the reader's message (file, offset, what).
    std::string where = str_cat(ref.line > 0 ? str_cat(config.source, ":", ref.line, ": ") : "",
                                "data.", refs_name, "[", i, "]: ");
    ENSURE(!ref.path.empty(), where, "path is empty");
    std::shared_ptr<const TokenDataset> ds;
    try {
      ds = open_token_dataset(ref.path);
    } catch (const Error& e) {
      throw Error(where + e.what());
    }
    // Images are read (data/fast_llm_dataset.h) but not yet carried into samples: training on
    // such a dataset as text alone would teach image tokens without their images.
    for (const TokenDataset* part : ds->parts())
      ENSURE(!part->has_image_patches(), where, part->path(), " holds image patches; training on images is not ",
             "supported yet (the vision encoder, layers/vision.h, has no data path): use a text-only dataset");
    SplitDocuments docs{ds, true, {}};
    if (derived_valid && refs == &data.train) {
      SplitDocuments train, valid;
      split_documents(ds, data.valid_fraction, config.run.seed, i, &train, &valid);
      docs = split == Split::Train ? std::move(train) : std::move(valid);
    }
    SamplingParams p;
    p.sequence_length = data.sequence_length;
    p.truncate_documents = data.truncate_documents;
    p.vocab_size = config.model.vocab_size;
    p.seed = config.run.seed;
    p.key_name = str_cat("data/", split_name, "/", i);
    samplers.push_back(std::make_unique<DatasetSampler>(std::move(docs), p, counts[i]));
    wheres.push_back(where);
  }
  source->set_samplers(std::move(samplers), std::move(wheres), config.model.vocab_size);
  return source;
}

}  // namespace engine
