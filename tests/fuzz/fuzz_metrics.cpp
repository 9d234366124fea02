// metrics.jsonl brought back to a resumed step (trim_metrics_for_resume): the first input byte
// is the step, the rest the file. Whatever the file holds, the trim must leave a file of whole
// JSON lines, each with an integer "step" not after the resumed step, as many as it says it kept;
// every line of the input is counted once (kept, later or damaged); and trimming that result again
// changes nothing.
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "core/log.h"
#include "tests/fuzz/fuzz_common.h"
#include "train/metrics_file.h"

static int count_lines(const std::string& text) {
  int n = 0;
  for (size_t at = 0; at < text.size(); ++n) {
    const size_t nl = text.find('\n', at);
    at = nl == std::string::npos ? text.size() : nl + 1;
  }
  return n;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (engine::log_set_level(engine::LogLevel::Error), true);
  (void)quiet;
  if (size < 1) return 0;
  const int step = data[0];
  const std::string path = fuzz::temp_dir() + "/metrics.jsonl";
  fuzz::write_file(path, data + 1, size - 1);
  const std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  fuzz::expect_ok_or_error([&] {
    const engine::MetricsTrim r = engine::trim_metrics_for_resume(path, step);
    if (r.kept + r.later + static_cast<int>(r.damaged.size()) != count_lines(input)) std::abort();
    const std::string text = engine::checkpoint::read_small_file(path, uint64_t{1} << 30);
    if (r.rewritten == (text == input)) std::abort();
    if (count_lines(text) != r.kept || (!text.empty() && text.back() != '\n')) std::abort();
    for (size_t at = 0; at < text.size();) {
      const size_t nl = text.find('\n', at);
      auto j = nlohmann::json::parse(text.substr(at, nl - at));  // throws: not JSON
      if (!j.is_object() || !j["step"].is_number_integer() || j["step"].get<int64_t>() > step) std::abort();
      at = nl + 1;
    }
    const engine::MetricsTrim again = engine::trim_metrics_for_resume(path, step);
    if (again.rewritten || !again.damaged.empty() || again.later != 0 || again.kept != r.kept) std::abort();
  });
  return 0;
}
