// The token-id cache entry (<dataset>.token_ids.json, read by check_token_ids before training):
// the input is the entry's text, with every "@FILES@" replaced by the real key of the harness's
// small dataset (its files as mapped), so mutations reach past the key comparison to the range
// fields. The findings here are crashes,
// sanitizer reports and hangs in reading it. The scan's own results are never written back
// (settle_seconds is huge), so each input meets the same files.
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "data/dataset_writer.h"
#include "data/token_scan.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

struct Harness {
  std::string prefix = fuzz::temp_dir() + "/ds";
  std::unique_ptr<engine::TokenDataset> ds;
  std::string files_key;
  Harness() {
    engine::write_token_dataset(prefix, {{1, 2, 3}, {4, 300, 6}, {7}}, 1000);
    ds = engine::open_token_dataset(prefix);
    // A scan with no settling time writes the entry; its "files" value is the key.
    engine::TokenScanOptions write_now;
    write_now.cache_dir = fuzz::temp_dir() + "/cache";
    write_now.settle_seconds = 0;
    const engine::TokenScan scan = engine::scan_token_ids_cached(*ds, write_now);
    if (scan.cache_file.empty()) std::abort();
    files_key = nlohmann::json::parse(engine::checkpoint::read_small_file(scan.cache_file, 1 << 20))["files"].dump();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness h;
  std::string text(reinterpret_cast<const char*>(data), size);
  for (size_t at = text.find("@FILES@"); at != std::string::npos; at = text.find("@FILES@", at + h.files_key.size()))
    text.replace(at, 7, h.files_key);
  fuzz::write_file(h.prefix + ".token_ids.json", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  engine::TokenScanOptions read_only;
  read_only.cache_dir = fuzz::temp_dir() + "/none";
  read_only.settle_seconds = 1e9;
  fuzz::expect_ok_or_error([&] {
    const engine::TokenScan scan = engine::scan_token_ids_cached(*h.ds, read_only);
    if (!scan.from_cache && (scan.range.min != 1 || scan.range.max != 300)) std::abort();
    // The dataset holds 300: an error from the scan, or from an entry whose range says so; an
    // entry with the right key and a narrower range is trusted (the key is what guards it).
    engine::check_token_ids(*h.ds, 257, read_only);
  });
  return 0;
}
