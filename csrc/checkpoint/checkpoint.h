// Distributed checkpoints: <run_dir>/checkpoints/step_<N>/ holds metadata.json (metadata.h) and
// one safetensors file per writing rank, rank_<r>.safetensors, with that rank's optimizer shard
// [begin, end) of its flat buffers as three 1-D f32 tensors: master, exp_avg, exp_avg_sq (one
// file per (pipeline, tensor-parallel) rank, from its first data-parallel rank, when the state
// is not sharded: ZeRO stage 0 or one dp rank). Under tensor parallelism each tp rank's buffers
// hold its blocks of the split parameters, under pipeline parallelism each pipeline rank's
// buffers its stages' parameters (metadata.h: the metadata lists the union of the pipeline
// ranks' tables, which rank 0 learns over the group). The compute weights are not saved: they
// are the master weights cast to the compute dtype.
//
// Saving is collective over every rank of the run and atomic:
//   1. rank 0 makes step_<N>.tmp-<pid>/ (a name "auto" never picks)
//   2. every writer writes and fsyncs its file, hashing it as it goes
//   3. sizes and checksums reach rank 0 (a collective: every file is complete past it), which
//      writes metadata.json last, fsyncs the folder, renames it to step_<N>/ (a previous
//      step_<N>/ is moved aside first and removed after) and fsyncs checkpoints/
//   4. rank 0 keeps the newest `keep` checkpoints and removes temporary folders of dead saves
// A failure on any rank at any point fails the save on every rank and removes the temporary
// folder; earlier checkpoints are never touched until the new one is complete.
// Loading checks integrity first (metadata checksum and fields; every file's size and XXH64,
// each file hashed by one rank), then each rank reads, for each parameter in its new shard,
// the saved elements by name and full-tensor index from whichever files hold them: any data-,
// tensor- and pipeline-parallel sizes, ZeRO stage and padding of the saved run load into any of
// the new run (a pipeline rank holding a copy of a tied embedding reads it where the checkpoint
// holds it).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "comm/comm.h"
#include "optim/adamw.h"

namespace engine::checkpoint {

struct SaveOptions {
  std::string root;         // <run_dir>/checkpoints
  int keep = 3;             // checkpoints kept after this one is complete (0: all)
  std::string config_toml;  // the effective config
  TrainerState state;
};

// Collective over `group`: every rank of the run (default opt.comm(), the data-parallel group,
// which is every rank without tensor or pipeline parallelism). Returns the checkpoint's folder.
std::string save(const SaveOptions& options, AdamW& opt, Comm* group = nullptr);

// "" when the checkpoint at `dir` is complete and intact, else what is wrong, naming the file.
// Collective over `comm` (files are hashed in parallel); every rank gets the same answer. Throws
// on every rank when the ranks see different checkpoints (metadata.json of another step or other
// bytes: a node-local folder, or `dir` differing per rank), naming both folders.
std::string check(const std::string& dir, Comm& comm);
// One process: throws the problem check() finds.
void verify(const std::string& dir);

// training.resume: "none" -> ""; "auto" -> the newest checkpoint under `root` that passes
// check(), falling back over broken ones with a warning ("" when there is none at all; an
// error when all of them are broken); a path -> that checkpoint (an error if it is broken), or
// for a run folder or a checkpoints folder the newest good one inside. Collective.
std::string resolve_resume(const std::string& spec, const std::string& root, Comm& comm);

// Loads the checkpoint into the optimizer's shard (any saved layout), rewrites the compute
// weights and returns the trainer state. The model's parameters (the union of its pipeline
// ranks' tables, learned over the group) must match the saved ones by names and (full) shapes.
// Collective over `group` (as for save; under pipeline parallelism it must hold every rank).
TrainerState load(const std::string& dir, AdamW& opt, Comm* group = nullptr);

// Throws unless the saved parameter table has exactly the table's names and shapes (offsets and
// padding may differ), listing every difference.
void check_compatible(const Metadata& m, const ParamTable& table, const std::string& dir);
// The same for a model described by name and full shape (a name listed twice, e.g. a tied copy
// on another pipeline rank, counts once).
void check_compatible(const Metadata& m, const std::vector<Metadata::Param>& model, const std::string& dir);

// Random access to a checkpoint's saved tensors by parameter name (tools and loaders).
class Reader {
 public:
  explicit Reader(const std::string& dir);
  const Metadata& metadata() const { return meta_; }
  const std::string& dir() const { return dir_; }
  // Elements [lo, hi) of parameter `name` (counted within the full tensor, whichever saved
  // pipeline and tensor-parallel ranks hold them) of tensor kind `kind` (0 master, 1 exp_avg,
  // 2 exp_avg_sq) into `out`.
  void read(int kind, const std::string& name, int64_t lo, int64_t hi, float* out) const;

 private:
  // Flat elements [g, g_end) of rank (pp_rank, tp_rank)'s saved buffers.
  void read_flat(int kind, int pp_rank, int tp_rank, int64_t g, int64_t g_end, float* out,
                 const std::string& name) const;
  const SafetensorsFile& shard_file(size_t i) const;  // opened and checked on first use
  std::string dir_;
  Metadata meta_;
  mutable std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

// Values of elements [lo, hi) of parameter p (counted within the full tensor, whatever block of
// it p describes), as f32.
using Fetch = std::function<void(const ParamSpec& p, int64_t lo, int64_t hi, float* out)>;
// Throws when values[0, n), elements [lo, lo + n) of parameter `param` counted in the full
// tensor, hold a NaN or an infinity, naming `source`, the parameter, the first such element and
// its value: weights imported or resumed must be finite (finite.cpp).
void require_finite(const float* values, int64_t n, int64_t lo, const std::string& param, const std::string& source);
// Overwrites the optimizer shard's tensor `kind` (0 master, 1 exp_avg, 2 exp_avg_sq) parameter
// by parameter from `fetch` (gaps and padding are left alone: they are zero).
void fill_shard(AdamW& opt, int kind, const Fetch& fetch);
// Overwrites every weight of a store (any compute dtype, any device) from `fetch`.
void fill_weights(ParamStore& store, const Fetch& fetch);
// Overwrites the frozen weights only (LoRA's base, core/params.h) from `fetch`.
void fill_frozen(ParamStore& store, const Fetch& fetch);

// Runs f on every rank of `comm`, then all ranks learn whether it succeeded everywhere; if not,
// on_fail runs and every rank throws (the failing rank its own error, the others one naming it).
void agree(Comm& comm, const std::function<void()>& f, const std::function<void()>& on_fail = {});

}  // namespace engine::checkpoint
