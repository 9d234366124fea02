// A Hugging Face tokenizer.json and a text: Tokenizer::load on the file, then encode the text,
// decode the ids back (checking the round trip cannot crash) and decode ids taken from the text's
// bytes. Input layout: u16 (little-endian) text length L, L bytes of text, then the tokenizer.json.
#include <cstring>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t len = std::min<size_t>(data[0] | (size_t{data[1]} << 8), size - 2);
  const std::string text(reinterpret_cast<const char*>(data + 2), len);
  const std::string path = fuzz::temp_dir() + "/tokenizer.json";
  fuzz::write_file(path, data + 2 + len, size - 2 - len);
  fuzz::expect_ok_or_error([&] {
    const engine::Tokenizer t = engine::Tokenizer::load(path);
    (void)t.describe();
    std::vector<int32_t> raw;
    for (size_t i = 0; i + 1 < text.size(); i += 2)
      raw.push_back(static_cast<int32_t>(static_cast<uint8_t>(text[i]) | (static_cast<uint8_t>(text[i + 1]) << 8)) %
                    static_cast<int32_t>(t.vocab_size() + 2));
    (void)t.decode(raw);
    const std::vector<int32_t> ids = t.encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) std::abort();  // encode only gives ids of the vocabulary
    (void)t.decode(ids);
  });
  return 0;
}
