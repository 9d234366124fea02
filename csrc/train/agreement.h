// The ranks of one run must train the same thing, or their replicas silently diverge (a config
// file or a dataset that differs on one node). At start every rank compares with rank 0:
//   its effective config (config_to_toml, every key), the locations aside: the dataset paths,
//     model.init_from, distillation.teacher, training.resume and run.output_dir may be spelled
//     differently per rank (a node-local copy); for them only whether they are set (resume:
//     "none", "auto" or a path) and the datasets' count and weights compare;
//   what those locations hold: each dataset's .bin size and its .idx's size and XXH64 (a
//     .fast_llm_dataset: its size and the XXH64 of its first and last MiB, which hold its header,
//     its config and usually its document index; the tokens are too large to hash), and the files
//     of the model.init_from and distillation.teacher folders: names, sizes and the XXH64 of each
//     .json file (config, index, a checkpoint's metadata).
// The checkpoint a run resumes from (a path, or what "auto" finds under run.output_dir) is
// compared by checkpoint::check() (its metadata.json), which every way of resolving
// training.resume passes through.
// Nothing in the config differs per rank legitimately: rank, device and GPU come from the launch
// (run.device = "auto" is the same text on every rank).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"

namespace engine {

// "section.key" -> value of an effective config (config_to_toml text) in the file's order;
// multi-line values (dataset lists) joined into one line.
std::vector<std::pair<std::string, std::string>> config_entries(const std::string& toml);

struct AgreementEntry {
  std::string key;    // "optimizer.lr", "data.train[0] (index)", "model.init_from (config.json)"
  std::string value;  // what must be equal on every rank
  std::string shown;  // the rank's own view, for the message: the value as set and where, the file
};

// This rank's entries: the config's keys in order, then the locations' contents.
std::vector<AgreementEntry> agreement_entries(const Config& c);

// Collective over `comm` (nothing with one rank): throws on every rank the same error, naming the
// first entry where the lowest disagreeing rank differs from rank 0 with both ranks' views, unless
// every rank's entries equal rank 0's.
void check_ranks_agree(const Config& c, Comm& comm);

}  // namespace engine
