// The safetensors reader: the input is the whole file (u64 header size, JSON header, data);
// after a successful open every tensor is looked up by name and read as f32.
#include <algorithm>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::temp_dir() + "/model.safetensors";
  fuzz::write_file(path, data, size);
  fuzz::expect_ok_or_error([&] {
    engine::checkpoint::SafetensorsFile f(path);
    for (const auto& t : f.tensors()) {
      if (&f.at(t.name) != &t) std::abort();
      const std::string& d = t.dtype;
      if (d != "F32" && d != "BF16" && d != "F16" && d != "F64") continue;
      std::vector<float> out(static_cast<size_t>(std::min<int64_t>(t.numel, 4096)));
      f.read_f32(t, 0, static_cast<int64_t>(out.size()), out.data());
    }
    (void)f.metadata();
  });
  return 0;
}
