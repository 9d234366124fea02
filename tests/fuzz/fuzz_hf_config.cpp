// A Hugging Face config.json: model_from_hf_config on arbitrary text (written to a file).
#include <string>

#include "checkpoint/hf.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::temp_dir() + "/config.json";
  fuzz::write_file(path, data, size);
  fuzz::expect_ok_or_error([&] { (void)engine::hf::model_from_hf_config(path); });
  return 0;
}
