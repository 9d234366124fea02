// A sharded token dataset: a manifest `NAME.manifest.json` (written by scripts/prepare_data.py)
// listing shards, each a Megatron `.bin` + `.idx` pair, read as ONE dataset whose documents are
// the shards' documents in manifest order (document d of shard k is document
// sum(documents of shards < k) + d). Layout (README, "Preparing data"):
//   {"format": "engine-token-manifest", "version": 1, "complete": true,
//    "dtype": "uint16" | "int32", "vocab_size": V, "loss_masking_spans": bool,
//    "documents": N, "tokens": T, "tokenizer": {...}, "options": {...}, "inputs": [...],
//    "shards": [{"prefix": "NAME-00000", "documents": n, "tokens": t, "bin_bytes": b,
//                "idx_bytes": i, "bin_sha256": "...", "idx_sha256": "..."}, ...]}
// Shard prefixes are relative to the manifest's folder (or absolute). Opening checks that the
// manifest is complete (a preparation still running or killed writes "complete": false), that
// every shard's files exist with the recorded sizes, and that each shard's header agrees with its
// entry (documents, tokens, dtype, spans) and the totals with the sum; anything else is an
// engine::Error naming the manifest and the key, or the shard file. The sha256 fields are for
// the preparation's own resume check and are not recomputed here (a full read of every shard at
// every start); tokenizer, options and inputs describe provenance and are not interpreted.
#pragma once
#include <memory>
#include <vector>

#include "data/memmap_dataset.h"

namespace engine {

class ManifestDataset : public TokenDataset {
 public:
  explicit ManifestDataset(const std::string& path);

  int64_t document_size(int64_t doc) const override;
  std::vector<TokenSpan> loss_masking_spans(int64_t doc) const override;
  // The manifest, then every shard's .idx and .bin.
  std::vector<const MappedFile*> files() const override;
  std::vector<const TokenDataset*> parts() const override;
  // Searched shard by shard; `doc` is the manifest's document, `byte` the offset in its shard.
  TokenLocation first_token_outside(int64_t limit) const override;
  int64_t vocab_size() const { return vocab_size_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  const MemmapDataset& shard(int64_t k) const { return *shards_[static_cast<size_t>(k)]; }

 protected:
  const unsigned char* document_data(int64_t doc) const override;
  const std::string& token_file() const override { return manifest_.path(); }

 private:
  // The shard holding global document `doc` (checked), and the document's index inside it.
  std::pair<const MemmapDataset*, int64_t> locate(int64_t doc) const;

  MappedFile manifest_;
  int64_t vocab_size_ = 0;
  std::vector<std::unique_ptr<MemmapDataset>> shards_;
  std::vector<int64_t> doc_start_;  // (shards + 1) prefix sums of the shards' document counts
};

// True for a path open_token_dataset reads as a manifest (ends in "manifest.json").
bool is_manifest_path(const std::string& path);

}  // namespace engine
