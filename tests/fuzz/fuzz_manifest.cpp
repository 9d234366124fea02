// The sharded dataset manifest reader (data/manifest_dataset.h). The input is split in three: a
// u16 little-endian length n, n bytes of s.bin, a u16 length m, m bytes of s.idx, then the
// manifest JSON (written as m.manifest.json next to them, so a manifest naming the shard "s"
// finds it). Every document and its spans are read back after a successful open.
#include <algorithm>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t at = 0;
  auto piece = [&](const std::string& path) {
    if (size - at < 2) return false;
    const size_t n = std::min<size_t>(data[at] | (size_t{data[at + 1]} << 8), size - at - 2);
    fuzz::write_file(path, data + at + 2, n);
    at += 2 + n;
    return true;
  };
  const std::string dir = fuzz::temp_dir();
  if (!piece(dir + "/s.bin") || !piece(dir + "/s.idx")) return 0;
  fuzz::write_file(dir + "/m.manifest.json", data + at, size - at);
  fuzz::expect_ok_or_error([&] {
    auto ds = engine::open_token_dataset(dir + "/m.manifest.json");
    const int64_t docs = std::min<int64_t>(ds->num_documents(), 4096);
    for (int64_t d = 0; d < docs; ++d) {
      std::vector<int32_t> tokens = ds->read(d, 0, std::min<int64_t>(ds->document_size(d), 1024));
      (void)ds->loss_masking_spans(d);
    }
    (void)ds->first_token_outside(5);
  });
  return 0;
}
