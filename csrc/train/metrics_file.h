// metrics.jsonl of a run directory: one JSON object per line, {"step": n, ...}. The trainer writes
// each line whole with one write(2) (checkpoint::OutFile, in append mode), so a reader sees only
// whole lines; a crash or a full disk can still leave the last line cut short.
// On resume the file is brought back to the checkpoint's step before lines are appended: lines of
// later steps are dropped (those steps are trained again), and so are damaged lines (cut short,
// not JSON, no integer "step"), each reported by its line number and what is wrong with it
// before the file is rewritten (atomically: checkpoint::replace_file).
#pragma once
#include <string>
#include <vector>

namespace engine {

struct MetricsTrim {
  int kept = 0;                      // lines kept
  int later = 0;                     // lines of steps after the resumed step, dropped
  std::vector<std::string> damaged;  // "line 18 (byte 3012): cut short ...", dropped
  int last_step = 0;                 // the last training step with a line among the kept ones
  bool rewritten = false;            // the file changed
};

// Trims the metrics file at `path` for a resume at `step` as described above, logging what it
// drops and why; nothing to do when the file does not exist.
MetricsTrim trim_metrics_for_resume(const std::string& path, int step);

}  // namespace engine
