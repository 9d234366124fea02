// Checkpoint metadata.json: Metadata::parse on arbitrary text; what parses must serialize (as
// the current version) and parse back. So that mutations reach the JSON fields behind the checksum, the harness rewrites
// the "metadata_xxh64" value to the hash of the text before its line when the input has that
// line (the checksum check itself is covered by tests/checkpoint).
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/metadata.h"
#include "checkpoint/xxhash.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  const std::string marker = " \"metadata_xxh64\": \"";
  const size_t at = text.rfind(marker);
  if (at != std::string::npos && at + marker.size() + 16 <= text.size()) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016" PRIx64, engine::checkpoint::xxh64(text.data(), at));
    text.replace(at + marker.size(), 16, hex);
  }
  fuzz::expect_ok_or_error([&] {
    const auto m = engine::checkpoint::Metadata::parse(text, "metadata.json");
    for (const auto& p : m.params) (void)m.find_param(p.name);
    // serialize() writes the current layout (what the checkpoint writer makes): versions 1 and 2
    // read back as version 3.
    auto current = m;
    current.version = engine::checkpoint::kFormatVersion;
    const auto again = engine::checkpoint::Metadata::parse(current.serialize(), "metadata.json");
    if (again.params.size() != m.params.size() || again.shards.size() != m.shards.size()) std::abort();
  });
  return 0;
}
