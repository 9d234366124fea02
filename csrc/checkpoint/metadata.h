// metadata.json of a distributed checkpoint folder <run_dir>/checkpoints/step_<N>/:
//   format, version       "engine-checkpoint", 3
//   step                  optimizer steps taken (the next step is step + 1)
//   trainer               consumed_samples (the data position: samples [0, consumed) of the
//                         training split were used), tokens_seen, train_seconds
//   config                the effective config (TOML text) the run had when it saved
//   params                the parameter table, the union over pipeline ranks: name, shape (the
//                         full tensor), split_dim (the tensor-parallel split dimension, -1:
//                         replicated), pp_rank (the pipeline rank whose buffers hold it), offset
//                         (element offset in that pipeline rank's flat buffers, the same on each
//                         of its tensor-parallel ranks, which hold their block of split_dim
//                         there). A parameter two pipeline ranks hold (the tied embedding of a
//                         model whose head is on another rank than its embedding: the copies are
//                         equal after every step) is listed once, from the lowest pp rank.
//   table_elements        per pipeline rank: its table's extent (padding excluded)
//   layout                world_size, data_parallel, tensor_parallel, pipeline_parallel,
//                         zero_stage, capacity (per pipeline rank: flat buffer length, padded to
//                         split over data_parallel), compute_dtype, device
//   tensors               the flat f32 tensors every shard file holds: master, exp_avg, exp_avg_sq
//   shards                file, rank, pp_rank, tp_rank, [begin, end): the flat elements
//                         (coordinates of rank (pp_rank, tp_rank)'s buffers) that file holds; the
//                         shards of each (pp_rank, tp_rank) tile [0, capacity[pp_rank])
//   files                 name, bytes, xxh64 of every data file
//   metadata_xxh64        XXH64 of this file's bytes before the line holding this field
// Loading maps parameters by name and by index in the full tensor: element i of parameter p is
// found in the block of the saved (pipeline, tensor-parallel) rank that held it, wherever the new
// layout puts it, so dp, tp and pp sizes, ZeRO stage and padding may all change. Version 1
// (before tensor parallelism: no split_dim, tensor_parallel or tp_rank) is read as
// tensor_parallel = 1, versions 1 and 2 (before pipeline parallelism: no pp_rank or
// pipeline_parallel; capacity and table_elements single numbers) as pipeline_parallel = 1.
// Parsing is strict: any missing or mistyped field is an error naming the file and the field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace engine::checkpoint {

inline constexpr int kFormatVersion = 3;
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
    int64_t offset = 0;  // in pipeline rank pp_rank's flat buffers
    int split_dim = -1;
    int pp_rank = 0;
    int64_t numel() const;  // of the full tensor
  };
  struct Layout {
    int world_size = 1, data_parallel = 1, tensor_parallel = 1, pipeline_parallel = 1, zero_stage = 0;
    std::vector<int64_t> capacity;  // flat buffer length of each pipeline rank
    std::string compute_dtype, device;
  };
  struct Shard {
    std::string file;
    int rank = 0, pp_rank = 0, tp_rank = 0;
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
  std::vector<int64_t> table_elements;  // of each pipeline rank's table
  Layout layout;
  std::vector<Shard> shards;  // sorted by (pp_rank, tp_rank, begin)
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
