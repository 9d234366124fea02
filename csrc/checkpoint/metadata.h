// metadata.json of a distributed checkpoint folder <run_dir>/checkpoints/step_<N>/:
//   format, version       "engine-checkpoint", 1
//   step                  optimizer steps taken (the next step is step + 1)
//   trainer               consumed_samples (the data position: samples [0, consumed) of the
//                         training split were used), tokens_seen, train_seconds
//   config                the effective config (TOML text) the run had when it saved
//   params                the parameter table: name, shape, offset (element offset in the flat
//                         buffers); table_elements = the table's extent (padding excluded)
//   layout                world_size, data_parallel, zero_stage, capacity (flat buffer length,
//                         padded to split over data_parallel), compute_dtype, device
//   tensors               the flat f32 tensors every shard file holds: master, exp_avg, exp_avg_sq
//   shards                file, rank, [begin, end): the flat elements (global coordinates of the
//                         saved layout) that file holds
//   files                 name, bytes, xxh64 of every data file
//   metadata_xxh64        XXH64 of this file's bytes before the line holding this field
// Loading maps parameters by name: element i of parameter p is flat element offset(p) + i of
// the saved layout, wherever the new layout puts p, so dp size, ZeRO stage and padding may all
// change. Parsing is strict: any missing or mistyped field is an error naming the file and the
// field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace engine::checkpoint {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "engine-checkpoint";
inline constexpr const char* kMetadataFile = "metadata.json";
inline constexpr const char* kTensorKinds[] = {"master", "exp_avg", "exp_avg_sq"};

struct TrainerState {
  int step = 0;
  int64_t consumed_samples = 0;
  int64_t tokens_seen = 0;
  double train_seconds = 0;
};

struct Metadata {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0;
    int64_t numel() const;
  };
  struct Layout {
    int world_size = 1, data_parallel = 1, zero_stage = 0;
    int64_t capacity = 0;
    std::string compute_dtype, device;
  };
  struct Shard {
    std::string file;
    int rank = 0;
    int64_t begin = 0, end = 0;
  };
  struct File {
    std::string name;
    uint64_t bytes = 0, xxh64 = 0;
  };

  int version = kFormatVersion;
  TrainerState state;
  std::string config_toml;
  std::vector<Param> params;
  int64_t table_elements = 0;
  Layout layout;
  std::vector<Shard> shards;  // sorted by begin
  std::vector<File> files;

  const Param* find_param(const std::string& name) const;
  // The file's text, checksum line included.
  std::string serialize() const;
  // Strict parse; `path` names the file in errors.
  static Metadata parse(const std::string& text, const std::string& path);
};

// Reads and parses <dir>/metadata.json.
Metadata read_metadata(const std::string& dir);

std::string step_dir_name(int step);                              // "step_<N>"
std::optional<int> parse_step_dir_name(const std::string& name);  // "step_<digits>" only
// The step_<N> folders under root (complete or not: a folder without a valid metadata.json
// fails verification), highest step first. Temporary folders (step_<N>.tmp-<pid>) never match.
std::vector<std::pair<int, std::string>> list_checkpoints(const std::string& root);

}  // namespace engine::checkpoint
