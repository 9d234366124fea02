// metadata.json of a distributed checkpoint folder <run_dir>/checkpoints/step_<N>/:
//   format, version       "engine-checkpoint", 1
//   step                  optimizer steps taken (the next step is step + 1)
//   trainer               consumed_samples (the data position: samples [0, consumed) of the
//                         training split were used), tokens_seen, train_seconds
//   config                the effective config (TOML text) the run had when it saved
//   params                the parameter table: name, shape (the full tensor), split_dim (the
//                         tensor-parallel split dimension, -1: replicated), offset (element
//                         offset in the flat buffers, the same on every tensor-parallel rank,
//                         which holds its block of split_dim there); table_elements = the
//                         table's extent (padding excluded)
//   layout                world_size, data_parallel, tensor_parallel, zero_stage, capacity (flat
//                         buffer length, padded to split over data_parallel), compute_dtype, device
//   tensors               the flat f32 tensors every shard file holds: master, exp_avg, exp_avg_sq
//   shards                file, rank, tp_rank, [begin, end): the flat elements (coordinates of
//                         tensor-parallel rank tp_rank's buffers) that file holds; the shards of
//                         each tp_rank tile [0, capacity)
//   files                 name, bytes, xxh64 of every data file
//   metadata_xxh64        XXH64 of this file's bytes before the line holding this field
// Loading maps parameters by name and by index in the full tensor: element i of parameter p is
// found in the block of the saved tensor-parallel rank that held it, wherever the new layout
// puts it, so dp and tp sizes, ZeRO stage and padding may all change. Version 1 (before tensor
// parallelism: no split_dim, tensor_parallel or tp_rank) is read as tensor_parallel = 1.
// Parsing is strict: any missing or mistyped field is an error naming the file and the field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace engine::checkpoint {

inline constexpr int kFormatVersion = 2;
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
    std::vector<int64_t> shape;  // full
    int64_t offset = 0;
    int split_dim = -1;
    int64_t numel() const;  // of the full tensor
  };
  struct Layout {
    int world_size = 1, data_parallel = 1, tensor_parallel = 1, zero_stage = 0;
    int64_t capacity = 0;
    std::string compute_dtype, device;
  };
  struct Shard {
    std::string file;
    int rank = 0, tp_rank = 0;
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
  std::vector<Shard> shards;  // sorted by (tp_rank, begin)
  std::vector<File> files;

  const Param* find_param(const std::string& name) const;
  // Elements of a parameter's block on each tensor-parallel rank.
  int64_t block_numel(const Param& p) const { return p.split_dim < 0 ? p.numel() : p.numel() / layout.tensor_parallel; }
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
