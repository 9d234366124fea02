#include "checkpoint/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>
#include <tuple>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "comm/mpi_comm.h"
#include "core/log.h"
#include "ops/elementwise.h"

namespace engine::checkpoint {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kChunk = int64_t{4} << 20;  // elements per staging copy (16 MiB of f32)

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

std::string shard_file_name(int rank) { return "rank_" + std::to_string(rank) + ".safetensors"; }
std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// One rank contributes `v`, the others 0: every rank gets v.
int64_t share(Comm& comm, int from, int64_t v) { return comm.all_reduce_sum(comm.rank() == from ? v : int64_t{0}); }
uint64_t share_u64(Comm& comm, int from, uint64_t v) {
  int64_t s;
  std::memcpy(&s, &v, 8);
  s = share(comm, from, s);
  std::memcpy(&v, &s, 8);
  return v;
}

// One pipeline rank's parameter table as the metadata records it (offsets in its buffers).
struct StageTable {
  std::vector<Metadata::Param> params;
  int64_t elements = 0, capacity = 0;
  bool found = false;
};

int pp_rank_of(const AdamW& opt) { return opt.pp() ? opt.pp()->rank() : 0; }
int pp_size_of(const AdamW& opt) { return opt.pp() ? opt.pp()->size() : 1; }

std::vector<Metadata::Param> table_params(const ParamTable& t, int pp_rank) {
  std::vector<Metadata::Param> out;
  for (const ParamSpec& p : t.entries()) {
    if (p.frozen) continue;  // LoRA's frozen base is no state: init_from or the seed gives it again
    out.push_back({p.name, std::vector<int64_t>(p.full_shape.d.begin(), p.full_shape.d.begin() + p.full_shape.ndim),
                   p.offset, p.split_dim, pp_rank});
  }
  return out;
}

// Every pipeline rank's table, learned over `comm` (every rank of the run): the first data-
// parallel rank of each (pipeline, tensor-parallel) rank sends its table, and the first one
// received for a pipeline rank is kept (its tensor-parallel ranks' tables differ only in their
// blocks, which the full shapes do not show). Indexed by pp rank; pipeline ranks outside `comm`
// stay !found.
std::vector<StageTable> gather_tables(Comm& comm, const AdamW& opt) {
  using json = nlohmann::json;
  const int pp_rank = pp_rank_of(opt);
  std::string mine;
  if (opt.comm().rank() == 0) {
    json ps = json::array();
    for (const Metadata::Param& p : table_params(opt.store().table(), pp_rank))
      ps.push_back(json::array({p.name, p.shape, p.split_dim, p.offset}));
    mine = json{{"pp_rank", pp_rank},
                {"elements", opt.store().table().total_elements()},
                {"capacity", opt.store().capacity()},
                {"params", ps}}
               .dump();
  }
  std::vector<StageTable> tables(static_cast<size_t>(pp_size_of(opt)));
  for (const std::string& bytes : all_gather_strings(comm, mine)) {
    if (bytes.empty()) continue;
    const json j = json::parse(bytes);
    const int q = j.at("pp_rank").get<int>();
    ENSURE(q >= 0 && q < static_cast<int>(tables.size()), "checkpoint: a table from pipeline rank ", q);
    StageTable& t = tables[static_cast<size_t>(q)];
    if (t.found) continue;
    t.found = true;
    t.elements = j.at("elements").get<int64_t>();
    t.capacity = j.at("capacity").get<int64_t>();
    for (const json& p : j.at("params"))
      t.params.push_back({p.at(0).get<std::string>(), p.at(1).get<std::vector<int64_t>>(), p.at(3).get<int64_t>(),
                          p.at(2).get<int>(), q});
  }
  return tables;
}

// The shard's state tensor of one kind.
Tensor shard_tensor(const AdamW& opt, int kind) {
  const AdamW::ShardState st = opt.shard_state();
  return kind == 0 ? st.master : kind == 1 ? st.exp_avg : st.exp_avg_sq;
}

FileDigest write_shard(const std::string& dir, int rank, const AdamW& opt, int step) {
  SafetensorsWriter w;
  const int64_t len = opt.shard_end() - opt.shard_begin();
  w.set_metadata({{"format", "engine-checkpoint-shard"},
                  {"rank", std::to_string(rank)},
                  {"begin", std::to_string(opt.shard_begin())},
                  {"end", std::to_string(opt.shard_end())},
                  {"step", std::to_string(step)}});
  for (int k = 0; k < 3; ++k) {
    const Tensor t = shard_tensor(opt, k);
    ENSURE(t.dtype == DType::F32 && t.numel() == len, "optimizer state ", kTensorKinds[k], " is not an f32 shard");
    w.add(kTensorKinds[k], "F32", {len}, [t](OutFile& f) {
      if (t.device == Device::CPU) return f.write(t.data, t.nbytes());
      std::vector<float> host(static_cast<size_t>(std::min(kChunk, t.numel())));
      for (int64_t off = 0; off < t.numel(); off += kChunk) {
        const int64_t n = std::min(kChunk, t.numel() - off);
        copy_bytes(host.data(), Device::CPU, static_cast<const float*>(t.data) + off, t.device,
                   static_cast<size_t>(n) * 4);
        f.write(host.data(), static_cast<size_t>(n) * 4);
      }
    });
  }
  return w.write(join(dir, shard_file_name(rank)));
}

// Folders left by saves that died: step_<N>.tmp-<pid> (incomplete, removed) and
// step_<N>.old-<pid> (a complete checkpoint moved aside for a replacement that never landed:
// renamed back when step_<N> is missing, else removed).
void remove_stale(const std::string& root) {
  static const std::regex stale(R"((step_[0-9]+)\.(tmp|old)-[0-9]+)");
  std::error_code ec;
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(root, ec)) found.push_back(e.path());
  for (const fs::path& p : found) {
    std::smatch m;
    const std::string name = p.filename().string();
    if (!std::regex_match(name, m, stale)) continue;
    const fs::path final_dir = p.parent_path() / m[1].str();
    if (m[2] == "old" && !fs::exists(final_dir, ec)) {
      log_warn("restoring ", final_dir.string(), " from ", p.string(), " (left by an interrupted save)");
      rename_path(p.string(), final_dir.string());
      continue;
    }
    log_info("removing ", p.string(), " (left by an interrupted save)");
    remove_tree(p.string());
  }
}

void apply_retention(const std::string& root, const std::string& current, int keep) {
  const auto all = list_checkpoints(root);
  int kept = 0;
  for (const auto& [step, path] : all) {
    if (path == current || keep == 0 || kept < keep) {
      ++kept;
      continue;
    }
    log_info("removing checkpoint ", path, " (training.keep_checkpoints = ", keep, ")");
    remove_tree(path);
  }
}

// rank 0, after every shard file is complete: metadata last, then the rename into place.
void commit(const std::string& tmp, const std::string& final_dir, const std::string& root, const Metadata& m,
            int keep, int64_t pid) {
  write_file(join(tmp, kMetadataFile), m.serialize());
  fsync_dir(tmp);
  std::error_code ec;
  std::string aside;
  if (fs::exists(final_dir, ec)) {  // saving a step again (a resumed run): replace it only now
    aside = final_dir + ".old-" + std::to_string(pid);
    rename_path(final_dir, aside);
  }
  try {
    rename_path(tmp, final_dir);
  } catch (...) {
    if (!aside.empty()) std::rename(aside.c_str(), final_dir.c_str());
    throw;
  }
  fsync_dir(root);
  if (!aside.empty()) remove_tree(aside);
  apply_retention(root, final_dir, keep);
  for (const auto& [step, path] : list_checkpoints(root))
    if (step > m.state.step)
      log_warn(path, " is from a later step than this run's checkpoint (step ", m.state.step,
               "): training.resume = \"auto\" picks the highest step; remove it to continue from this run");
}

// Every rank must see the same checkpoint: a node-local folder or a per-rank path may hold
// another one (the files' checks below, one file per rank, would then compare against different
// lists). The bytes of metadata.json decide; a difference is an error on every rank naming both
// folders, never a fallback to an older checkpoint.
void agree_on_metadata(const std::string& dir, const Metadata& m, const FileDigest& meta, Comm& comm) {
  // "<step> <xxh64>" (what must agree), then a line with this rank's folder (for the message).
  const std::vector<std::string> all =
      all_gather_strings(comm, str_cat(m.state.step, " ", hex64(meta.xxh64), "\n", dir));
  auto what = [&](int r) { return all[static_cast<size_t>(r)].substr(0, all[static_cast<size_t>(r)].find('\n')); };
  auto describe = [&](int r) {
    const std::string& s = all[static_cast<size_t>(r)];
    const std::string w = what(r);
    return str_cat(join(s.substr(w.size() + 1), kMetadataFile), " on rank ", r, " (step ", w.substr(0, w.find(' ')),
                   ", xxh64 ", w.substr(w.find(' ') + 1), ")");
  };
  for (int r = 1; r < comm.size(); ++r)
    if (what(r) != what(0))
      RAISE("the ranks see different checkpoints: ", describe(r), " differs from ", describe(0),
            "; every rank must load the same checkpoint");
}

}  // namespace

void agree(Comm& comm, const std::function<void()>& f, const std::function<void()>& on_fail) {
  std::string error;
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int n = comm.size();
  const auto first = static_cast<int>(comm.all_reduce_max(error.empty() ? 0.0 : static_cast<double>(n - comm.rank())));
  if (first == 0) return;
  if (on_fail) on_fail();
  if (!error.empty()) throw Error(error);
  RAISE("rank ", n - first, " of the group failed (its error is reported by that rank)");
}

std::string save(const SaveOptions& o, AdamW& opt, Comm* group) {
  Comm& comm = group ? *group : opt.comm();
  const int rank = comm.rank(), n = comm.size();
  const int tp_rank = opt.tp() ? opt.tp()->rank() : 0, tp_size = opt.tp() ? opt.tp()->size() : 1;
  const int pp_rank = pp_rank_of(opt), pp_size = pp_size_of(opt);
  ENSURE(n == opt.comm().size() * tp_size * pp_size, "checkpoint: a group of ", n, " ranks for ", opt.comm().size(),
         " data-parallel x ", tp_size, " tensor-parallel x ", pp_size, " pipeline-parallel");
  const std::vector<StageTable> tables = gather_tables(comm, opt);
  const ParamStore& store = opt.store();
  const int64_t cap = store.capacity();
  const bool sharded = opt.shard_end() - opt.shard_begin() != cap;
  const std::string final_dir = join(o.root, step_dir_name(o.state.step));
  std::string tmp;
  auto cleanup = [&] {
    if (rank == 0 && !tmp.empty()) remove_tree(tmp);
  };
  int64_t pid = 0;
  agree(comm, [&] {
    if (rank != 0) return;
    std::error_code ec;
    fs::create_directories(o.root, ec);
    if (ec || !fs::is_directory(o.root)) RAISE("cannot create the checkpoint folder ", o.root, ": ", ec.message());
    pid = ::getpid();
    tmp = final_dir + ".tmp-" + std::to_string(pid);
    remove_stale(o.root);
    if (!fs::create_directory(tmp, ec) || ec) RAISE("cannot create ", tmp, ": ", ec.message());
  }, cleanup);
  pid = share(comm, 0, pid);
  tmp = final_dir + ".tmp-" + std::to_string(pid);

  FileDigest mine;
  const bool writer = sharded || opt.comm().rank() == 0;  // one file per dp shard of each tp rank
  agree(comm, [&] {
    if (writer) mine = write_shard(tmp, rank, opt, o.state.step);
  }, cleanup);

  // Sizes, checksums and ranges of every file (the collectives also order every write before
  // the metadata).
  Metadata m;
  m.state = o.state;
  m.config_toml = o.config_toml;
  // The union of the pipeline ranks' tables, in pipeline-rank order: a parameter held by two
  // (a tied embedding) is recorded once, from the lowest pipeline rank.
  std::unordered_set<std::string> seen;
  for (const StageTable& t : tables) {
    ENSURE(t.found, "checkpoint: no parameter table from a pipeline rank");
    for (const Metadata::Param& p : t.params) {
      if (seen.insert(p.name).second) {
        m.params.push_back(p);
        continue;
      }
      const Metadata::Param* first = m.find_param(p.name);
      ENSURE(first->shape == p.shape && first->split_dim == p.split_dim, "checkpoint: ", p.name,
             " is held by pipeline ranks ", first->pp_rank, " and ", p.pp_rank, " with different shapes");
    }
    m.table_elements.push_back(t.elements);
    m.layout.capacity.push_back(t.capacity);
  }
  m.layout.world_size = world().size();
  m.layout.data_parallel = opt.comm().size();
  m.layout.tensor_parallel = tp_size;
  m.layout.pipeline_parallel = pp_size;
  m.layout.zero_stage = opt.zero_stage();
  m.layout.compute_dtype = dtype_name(store.compute_dtype());
  m.layout.device = device_name(store.device());
  for (int r = 0; r < n; ++r) {
    if (share(comm, r, writer ? 1 : 0) == 0) continue;
    Metadata::Shard s;
    s.file = shard_file_name(r);
    s.rank = r;
    s.pp_rank = static_cast<int>(share(comm, r, pp_rank));
    s.tp_rank = static_cast<int>(share(comm, r, tp_rank));
    s.begin = share(comm, r, opt.shard_begin());
    s.end = share(comm, r, opt.shard_end());
    Metadata::File f{s.file, share_u64(comm, r, mine.bytes), share_u64(comm, r, mine.xxh64)};
    m.shards.push_back(s);
    m.files.push_back(f);
  }
  std::sort(m.shards.begin(), m.shards.end(), [](const Metadata::Shard& a, const Metadata::Shard& b) {
    return a.pp_rank != b.pp_rank ? a.pp_rank < b.pp_rank : a.tp_rank != b.tp_rank ? a.tp_rank < b.tp_rank
                                                                                   : a.begin < b.begin;
  });
  agree(comm, [&] {
    if (rank == 0) commit(tmp, final_dir, o.root, m, o.keep, pid);
  }, cleanup);
  return final_dir;
}

std::string check(const std::string& dir, Comm& comm) {
  Metadata m;
  FileDigest meta;
  std::string error;
  try {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) RAISE(dir, ": no such checkpoint folder");
    m = read_metadata(dir);
    meta = digest_file(join(dir, kMetadataFile));
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (comm.all_reduce_sum(int64_t{error.empty() ? 0 : 1}) > 0)
    return error.empty() ? join(dir, kMetadataFile) + ": unreadable on another rank" : error;
  if (comm.size() > 1) agree_on_metadata(dir, m, meta, comm);
  // Each file is checked by one rank, all ranks at once (code 0 ok, 1 missing, 2 wrong size, 3
  // wrong checksum); then the results are shared.
  const int n = comm.size();
  auto owner = [n](size_t i) { return static_cast<int>(i % static_cast<size_t>(n)); };
  std::vector<int64_t> codes(m.files.size(), 0);
  std::vector<FileDigest> found(m.files.size());
  for (size_t i = 0; i < m.files.size(); ++i) {
    if (owner(i) != comm.rank()) continue;
    const Metadata::File& f = m.files[i];
    const std::string path = join(dir, f.name);
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) {
      codes[i] = 1;
    } else if (size != f.bytes) {
      codes[i] = 2;
      found[i].bytes = size;
    } else {
      try {
        found[i] = digest_file(path);
        codes[i] = found[i].bytes != f.bytes ? 2 : found[i].xxh64 != f.xxh64 ? 3 : 0;
      } catch (const std::exception&) {
        codes[i] = 1;
      }
    }
  }
  for (size_t i = 0; i < m.files.size(); ++i) {
    const int64_t code = share(comm, owner(i), codes[i]);
    if (code == 0) continue;
    const Metadata::File& f = m.files[i];
    const std::string path = join(dir, f.name);
    const uint64_t bytes = share_u64(comm, owner(i), found[i].bytes);
    const uint64_t hash = share_u64(comm, owner(i), found[i].xxh64);
    if (code == 1) return path + ": missing or unreadable (listed in " + kMetadataFile + ")";
    if (code == 2)
      return str_cat(path, ": size mismatch: ", kMetadataFile, " records ", f.bytes, " bytes, the file has ", bytes,
                     bytes < f.bytes ? " (truncated)" : "");
    return str_cat(path, ": checksum mismatch: ", kMetadataFile, " records xxh64 ", hex64(f.xxh64),
                   ", the file hashes to ", hex64(hash), " (corrupted)");
  }
  return "";
}

void verify(const std::string& dir) {
  SelfComm self;
  const std::string error = check(dir, self);
  if (!error.empty()) RAISE("corrupt checkpoint: ", error);
}

std::string resolve_resume(const std::string& spec_in, const std::string& root, Comm& comm) {
  if (spec_in.empty() || spec_in == "none") return "";
  std::string spec = spec_in;
  while (spec.size() > 1 && spec.back() == '/') spec.pop_back();
  std::string search = root;
  if (spec != "auto") {
    std::error_code ec;
    // Rank 0's view decides whether the path is a checkpoint (the collectives of the two ways
    // differ; a rank that sees something else at the path fails in check()).
    const bool checkpoint =
        fs::exists(join(spec, kMetadataFile), ec) || parse_step_dir_name(fs::path(spec).filename().string());
    if (share(comm, 0, checkpoint ? 1 : 0) != 0) {
      const std::string error = check(spec, comm);
      if (!error.empty()) RAISE("training.resume: corrupt checkpoint: ", error);
      return spec;
    }
    if (!fs::is_directory(spec, ec)) RAISE("training.resume: ", spec, ": no such checkpoint or folder");
    search = fs::is_directory(join(spec, "checkpoints"), ec) ? join(spec, "checkpoints") : spec;
  }
  // Rank 0's listing decides (ranks of a shared file system may see it at different moments).
  const auto mine = list_checkpoints(search);
  const int64_t count = share(comm, 0, static_cast<int64_t>(mine.size()));
  for (int64_t i = 0; i < count; ++i) {
    const int step = static_cast<int>(share(comm, 0, comm.rank() == 0 ? mine[static_cast<size_t>(i)].first : 0));
    const std::string dir = join(search, step_dir_name(step));
    const std::string error = check(dir, comm);
    if (error.empty()) {
      if (i > 0 && comm.rank() == 0) log_warn("resuming from ", dir, ", the newest usable checkpoint");
      return dir;
    }
    if (comm.rank() == 0)
      log_warn("checkpoint ", dir, " is unusable, trying the previous one: ", error);
  }
  if (count > 0)
    RAISE("training.resume = \"", spec, "\": none of the ", count, " checkpoints under ", search,
          " is usable (see the warnings above); remove them or set training.resume = \"none\"");
  if (spec != "auto") RAISE("training.resume: ", spec, ": no checkpoint (step_<N> folder) in it");
  return "";
}

Reader::Reader(const std::string& dir) : dir_(dir), meta_(read_metadata(dir)) { files_.resize(meta_.shards.size()); }

const SafetensorsFile& Reader::shard_file(size_t i) const {
  if (!files_[i]) {
    const Metadata::Shard& s = meta_.shards[i];
    auto f = std::make_unique<SafetensorsFile>(join(dir_, s.file));
    for (const char* kind : kTensorKinds) {
      const StTensor& t = f->at(kind);
      if (t.dtype != "F32" || t.shape.size() != 1 || t.numel != s.end - s.begin)
        RAISE(f->path(), ": tensor ", kind, " is ", t.dtype, " of ", t.numel, " elements, ", kMetadataFile,
              " says F32 of ", s.end - s.begin);
    }
    auto it_b = f->metadata().find("begin"), it_e = f->metadata().find("end");
    if (it_b == f->metadata().end() || it_e == f->metadata().end() || it_b->second != std::to_string(s.begin) ||
        it_e->second != std::to_string(s.end))
      RAISE(f->path(), ": its range does not match ", kMetadataFile, " ([", s.begin, ", ", s.end, "))");
    files_[i] = std::move(f);
  }
  return *files_[i];
}

void Reader::read(int kind, const std::string& name, int64_t lo, int64_t hi, float* out) const {
  ENSURE(kind >= 0 && kind < 3, "tensor kind ", kind);
  const Metadata::Param* p = meta_.find_param(name);
  if (!p) RAISE(join(dir_, kMetadataFile), ": no parameter ", name);
  ENSURE(0 <= lo && lo <= hi && hi <= p->numel(), "elements [", lo, ", ", hi, ") of ", name);
  const int tp = meta_.layout.tensor_parallel, pp = p->pp_rank;
  if (p->split_dim < 0 || tp == 1) return read_flat(kind, pp, 0, p->offset + lo, p->offset + hi, out, name);
  // Full index g -> (the saved tp rank holding it, its index in that rank's block), run by run.
  ENSURE(p->shape.size() <= static_cast<size_t>(Shape::kMaxDims), name, ": ", p->shape.size(), " dimensions");
  Shape full;
  for (int64_t d : p->shape) full.d[full.ndim++] = d;
  for (int64_t g = lo; g < hi;) {
    const BlockRun r = block_of_full(full, p->split_dim, tp, g, hi);
    read_flat(kind, pp, r.rank, p->offset + r.local, p->offset + r.local + r.count, out + (g - lo), name);
    g += r.count;
  }
}

void Reader::read_flat(int kind, int pp_rank, int tp_rank, int64_t g, int64_t g_end, float* out,
                       const std::string& name) const {
  const int64_t start = g;
  // Shards are sorted by (pp_rank, tp_rank, begin) and tile each (pp, tp) rank's buffers: start
  // at the first one of (pp_rank, tp_rank) ending after g.
  auto first = std::lower_bound(meta_.shards.begin(), meta_.shards.end(), std::make_tuple(pp_rank, tp_rank, g),
                                [](const Metadata::Shard& s, const std::tuple<int, int, int64_t>& v) {
                                  if (s.pp_rank != std::get<0>(v)) return s.pp_rank < std::get<0>(v);
                                  if (s.tp_rank != std::get<1>(v)) return s.tp_rank < std::get<1>(v);
                                  return s.end <= std::get<2>(v);
                                });
  for (auto i = static_cast<size_t>(first - meta_.shards.begin()); i < meta_.shards.size() &&
                                                                   meta_.shards[i].pp_rank == pp_rank &&
                                                                   meta_.shards[i].tp_rank == tp_rank && g < g_end;
       ++i) {
    const Metadata::Shard& s = meta_.shards[i];
    if (s.end <= g || s.begin >= g_end) continue;
    const int64_t a = std::max(g, s.begin), b = std::min(g_end, s.end);
    ENSURE(a == g, "shards leave elements of ", name, " uncovered");
    const SafetensorsFile& f = shard_file(i);
    f.read_f32(f.at(kTensorKinds[kind]), a - s.begin, b - s.begin, out + (a - start));
    g = b;
  }
  ENSURE(g == g_end, join(dir_, kMetadataFile), ": no shard of pp_rank ", pp_rank, ", tp_rank ", tp_rank,
         " holds elements [", g, ", ", g_end, ") (", name, ")");
}

namespace {
// fetch() (full-tensor indices) for local elements [lo, hi) of p's block, into out.
void fetch_block(const Fetch& fetch, const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
  for_each_full_run(p, lo, hi, [&](int64_t full, int64_t n, int64_t local) { fetch(p, full, full + n, out + (local - lo)); });
}
}  // namespace

void fill_shard(AdamW& opt, int kind, const Fetch& fetch) {
  const Tensor dst = shard_tensor(opt, kind);
  const int64_t sb = opt.shard_begin(), se = opt.shard_end();
  std::vector<float> host;
  for (const ParamSpec& p : opt.store().table().entries()) {
    if (p.frozen) continue;  // not in the shard (core/params.h)
    const int64_t b = std::max(sb, p.offset), e = std::min(se, p.offset + p.shape.numel());
    for (int64_t c = b; c < e; c += kChunk) {
      const int64_t ce = std::min(e, c + kChunk);
      float* at = static_cast<float*>(dst.data) + (c - sb);
      if (dst.device == Device::CPU) {
        fetch_block(fetch, p, c - p.offset, ce - p.offset, at);
        continue;
      }
      host.resize(static_cast<size_t>(ce - c));
      fetch_block(fetch, p, c - p.offset, ce - p.offset, host.data());
      copy_bytes(at, dst.device, host.data(), Device::CPU, host.size() * 4);
    }
  }
}

namespace {
void fill_store(ParamStore& store, const Fetch& fetch, bool frozen_only) {
  for (const ParamSpec& p : store.table().entries()) {
    if (frozen_only && !p.frozen) continue;
    const int64_t n = p.shape.numel();
    Owned host = empty({n}, DType::F32, Device::CPU);
    fetch_block(fetch, p, 0, n, host.ptr<float>());
    const Tensor w = store.weight(p.name).view({n});
    if (store.compute_dtype() == DType::F32) {
      copy_tensor(w, host);
    } else {
      Owned cast = empty({n}, store.compute_dtype(), Device::CPU);
      ops::cast(host, cast);
      copy_tensor(w, cast);
    }
  }
}

}  // namespace

void fill_weights(ParamStore& store, const Fetch& fetch) { fill_store(store, fetch, false); }
void fill_frozen(ParamStore& store, const Fetch& fetch) { fill_store(store, fetch, true); }

void check_compatible(const Metadata& m, const ParamTable& table, const std::string& dir) {
  check_compatible(m, table_params(table, 0), dir);
}

void check_compatible(const Metadata& m, const std::vector<Metadata::Param>& model, const std::string& dir) {
  std::string problems;
  std::unordered_set<std::string> names;
  for (const Metadata::Param& p : model) {
    if (!names.insert(p.name).second) continue;  // a tied copy on another pipeline rank
    const Metadata::Param* s = m.find_param(p.name);
    if (!s)
      problems += "\n  " + p.name + ": not in the checkpoint";
    else if (s->shape != p.shape)
      problems += str_cat("\n  ", p.name, ": shape ", shape_str(p.shape), " in the model, ", shape_str(s->shape),
                          " in the checkpoint");
  }
  for (const Metadata::Param& s : m.params)
    if (!names.count(s.name)) problems += "\n  " + s.name + ": in the checkpoint, not in the model";
  if (!problems.empty())
    RAISE(dir, ": the checkpoint's parameters do not match the model (the [model] config must be the same):",
          problems);
}

TrainerState load(const std::string& dir, AdamW& opt, Comm* group) {
  Comm& comm = group ? *group : opt.comm();
  const std::string error = check(dir, comm);
  if (!error.empty()) RAISE("corrupt checkpoint: ", error);
  // The model's parameters are the union of the pipeline ranks' tables: learn the others'.
  const std::vector<StageTable> tables = gather_tables(comm, opt);
  std::unique_ptr<Reader> reader;
  agree(comm, [&] {
    std::vector<Metadata::Param> model;
    for (const StageTable& t : tables) {
      if (!t.found)
        RAISE("checkpoint::load of a pipeline-parallel model is collective over every rank of the run (a group "
              "holding every pipeline rank)");
      model.insert(model.end(), t.params.begin(), t.params.end());
    }
    reader = std::make_unique<Reader>(dir);
    check_compatible(reader->metadata(), model, dir);
    for (int k = 0; k < 3; ++k)
      fill_shard(opt, k, [&](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
        reader->read(k, p.name, lo, hi, out);
        require_finite(out, hi - lo, lo, p.name, str_cat("checkpoint ", dir, ": ", kTensorKinds[k]));
      });
  });
  opt.weights_from_master();
  return reader->metadata().state;
}

}  // namespace engine::checkpoint
