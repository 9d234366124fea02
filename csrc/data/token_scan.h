// Token ids checked against the vocabulary before training, for a corpus of any size: the range
// of a dataset's stored ids comes from one parallel scan of every token
// (TokenDataset::scan_token_ids), cached per dataset in a small JSON file so that later runs over
// the same files read it instead of scanning again.
//   where:  next to the dataset, <path>.token_ids.json (path: the .bin/.idx prefix or the
//           .fast_llm_dataset file) when that folder takes it; else <cache dir>/token_ids/
//           <hash of the path>.json with the cache dir $XDG_CACHE_HOME/engine, else
//           ~/.cache/engine; when neither can be written the scan runs every time.
//   key:    each file of the dataset (absolute path, size, modification and status-change times
//           in nanoseconds, inode) as it was when mapped; an entry is used only when the files
//           still match it.
//   writes: atomic (a temporary file renamed into place), and only of a scan that started at
//           least `settle_seconds` after the files last changed and saw them unchanged at its
//           end: a change after the scan then always moves a timestamp, even on a file system
//           whose timestamps advance in coarse steps.
#pragma once
#include <cstdint>
#include <string>

#include "data/token_dataset.h"

namespace engine {

struct TokenScanOptions {
  std::string cache_dir;        // "": default_token_cache_dir()
  double settle_seconds = 2.0;  // files changed more recently than this are scanned, not cached
};

// $XDG_CACHE_HOME/engine, else $HOME/.cache/engine, else "" (no user cache).
std::string default_token_cache_dir();

struct TokenScan {
  TokenIdRange range;
  std::string cache_file;  // the cache entry read or written ("" when none)
  bool from_cache = false;
};
TokenScan scan_token_ids_cached(const TokenDataset& ds, const TokenScanOptions& options = {});

// Throws unless every stored token of `ds` lies in [0, vocab_size), naming the token file (a
// manifest: the shard's, each shard scanned and cached on its own), the
// first offending token's document, token offset and byte offset, and its id.
void check_token_ids(const TokenDataset& ds, int64_t vocab_size, const TokenScanOptions& options = {});
// The same check of one part (TokenDataset::parts(): a dataset, or one shard of a manifest) with
// a scan made elsewhere (another rank's of the same files: the ranks of a run scan once,
// train/trainer.cpp).
void check_token_range(const TokenDataset& ds, const TokenScan& scan, int64_t vocab_size);

// How many full scans (TokenDataset::scan_token_ids) this process has run through
// scan_token_ids_cached: the cache and the sharing between ranks are tested by it.
int64_t token_scans_run();

}  // namespace engine
