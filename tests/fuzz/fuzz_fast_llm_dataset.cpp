// Fast-LLM's single-file .fast_llm_dataset reader: the input is the whole file; every document
// and its spans are read back after a successful open.
#include <algorithm>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::temp_dir() + "/ds.fast_llm_dataset";
  fuzz::write_file(path, data, size);
  fuzz::expect_ok_or_error([&] {
    auto ds = engine::open_token_dataset(path);
    const int64_t n = std::min<int64_t>(ds->num_documents(), 4096);
    for (int64_t d = 0; d < n; ++d) {
      std::vector<int32_t> tokens = ds->read(d, 0, std::min<int64_t>(ds->document_size(d), 1024));
      (void)ds->loss_masking_spans(d);
    }
  });
  return 0;
}
