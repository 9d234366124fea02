// The Megatron / Fast-LLM .bin/.idx reader (versions 1-3). The input is split in two: a u16
// little-endian length n, then n bytes of .bin, then the .idx (the reader requires the .bin to
// hold exactly the documents the .idx describes, so both come from the fuzzer). Every document
// and its spans are read back after a successful open.
#include <algorithm>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t n = std::min<size_t>(data[0] | (size_t{data[1]} << 8), size - 2);
  const std::string prefix = fuzz::temp_dir() + "/ds";
  fuzz::write_file(prefix + ".bin", data + 2, n);
  fuzz::write_file(prefix + ".idx", data + 2 + n, size - 2 - n);
  fuzz::expect_ok_or_error([&] {
    auto ds = engine::open_token_dataset(prefix);
    const int64_t docs = std::min<int64_t>(ds->num_documents(), 4096);
    for (int64_t d = 0; d < docs; ++d) {
      std::vector<int32_t> tokens = ds->read(d, 0, std::min<int64_t>(ds->document_size(d), 1024));
      (void)ds->loss_masking_spans(d);
    }
  });
  return 0;
}
