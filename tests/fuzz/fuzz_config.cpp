// parse_config on arbitrary TOML text (the run config), plus a round trip through
// config_to_toml for inputs that parse: the written config must parse back to the same Config.
#include <cstdlib>
#include <string>

#include "config/config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_ok_or_error([&] {
    engine::Config c = engine::parse_config(text, "fuzz.toml");
    const std::string again = engine::config_to_toml(c);
    engine::Config c2 = engine::parse_config(again, "fuzz.toml");
    if (!(c2 == c)) std::abort();  // config_to_toml must load back to the same Config
  });
  return 0;
}
