#include "train/metrics_file.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "core/log.h"

namespace engine {

namespace {

// What is wrong with one line of metrics.jsonl ("" when nothing); its step in *step.
std::string line_problem(const std::string& line, bool has_end, int64_t* step, bool* is_eval) {
  if (line.empty()) return "an empty line";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    std::string why = e.what();
    const size_t at = why.find("] ");  // "[json.exception.parse_error.101] parse error at ..."
    if (at != std::string::npos) why = why.substr(at + 2);
    return has_end ? "not JSON (" + why + ")"
                   : "cut short: no end of line and not a whole JSON object (" + why + ")";
  }
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
    return "not a JSON object with an integer \"step\"";
  *step = j["step"].get<int64_t>();
  *is_eval = j.contains("valid_loss");
  return "";
}

}  // namespace

MetricsTrim trim_metrics_for_resume(const std::string& path, int step) {
  MetricsTrim r;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return r;
  const std::string text = checkpoint::read_small_file(path, uint64_t{1} << 40);
  std::string kept;
  int number = 0;
  for (size_t at = 0; at < text.size();) {
    ++number;
    const size_t nl = text.find('\n', at);
    const bool has_end = nl != std::string::npos;
    const std::string line = text.substr(at, (has_end ? nl : text.size()) - at);
    const size_t offset = at;
    at = has_end ? nl + 1 : text.size();
    int64_t s = 0;
    bool is_eval = false;
    const std::string why = line_problem(line, has_end, &s, &is_eval);
    if (!why.empty()) {
      r.damaged.push_back(str_cat("line ", number, " (byte ", offset, "): ", why));
      continue;
    }
    if (s > step) {
      ++r.later;
      continue;
    }
    kept += line;
    kept += '\n';
    ++r.kept;
    if (!is_eval) r.last_step = static_cast<int>(std::max<int64_t>(r.last_step, s));
  }
  // The report comes first: should the rewrite fail, what was wrong with the file is known.
  if (!r.damaged.empty()) {
    std::string list;
    const size_t shown = std::min<size_t>(r.damaged.size(), 10);
    for (size_t i = 0; i < shown; ++i) list += "\n  " + r.damaged[i];
    if (shown < r.damaged.size()) list += str_cat("\n  (and ", r.damaged.size() - shown, " more)");
    log_warn(path, ": ", r.damaged.size(), " damaged line(s), dropped on resume (a crash or a full disk cuts a ",
             "line short; other lines were not written by the engine):", list);
  }
  if (r.later > 0)
    log_info(path, ": ", r.later, " line(s) of steps after the checkpoint's step ", step,
             " dropped: those steps are trained again");
  if (r.last_step < step)
    log_warn(path, ": no line for step(s) ", r.last_step + 1, " to ", step, " of the checkpoint (lost: never on disk), ",
             "the new lines follow from step ", step + 1);
  if (kept != text) {
    checkpoint::replace_file(path, kept);
    r.rewritten = true;
    log_info(path, ": rewritten with its ", r.kept, " line(s) up to step ", step);
  }
  return r;
}

}  // namespace engine
