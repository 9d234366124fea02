#include "checkpoint/metadata.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "checkpoint/xxhash.h"
#include "core/check.h"
#include "core/tensor.h"

namespace engine::checkpoint {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr const char* kChecksumKey = "metadata_xxh64";

// Typed, path-naming access to the fields of a parsed metadata.json.
struct Fields {
  const std::string& path;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    RAISE(path, ": field '", field, "': ", what);
  }
  const json& get(const json& obj, const std::string& key, const std::string& field) const {
    if (!obj.is_object()) fail(field, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(field, "missing");
    return *it;
  }
  int64_t integer(const json& obj, const std::string& key, const std::string& field, int64_t lo = 0,
                  int64_t hi = INT64_MAX) const {
    const json& v = get(obj, key, field);
    if (!v.is_number_integer()) fail(field, "expected an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(field, str_cat("out of range: ", x));
    return x;
  }
  std::string string(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = get(obj, key, field);
    if (!v.is_string()) fail(field, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  double number(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = get(obj, key, field);
    if (!v.is_number()) fail(field, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  const json& array(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = get(obj, key, field);
    if (!v.is_array()) fail(field, "expected an array");
    return v;
  }
};

}  // namespace

int64_t Metadata::Param::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const Metadata::Param* Metadata::find_param(const std::string& name) const {
  for (const Param& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

std::string Metadata::serialize() const {
  json j;
  j["format"] = kFormatName;
  j["version"] = version;
  j["step"] = state.step;
  j["trainer"] = {{"consumed_samples", state.consumed_samples},
                  {"tokens_seen", state.tokens_seen},
                  {"train_seconds", state.train_seconds}};
  j["layout"] = {{"world_size", layout.world_size},
                 {"data_parallel", layout.data_parallel},
                 {"tensor_parallel", layout.tensor_parallel},
                 {"pipeline_parallel", layout.pipeline_parallel},
                 {"zero_stage", layout.zero_stage},
                 {"capacity", layout.capacity},
                 {"compute_dtype", layout.compute_dtype},
                 {"device", layout.device}};
  j["tensors"] = json::array();
  for (const char* k : kTensorKinds) j["tensors"].push_back(k);
  j["table_elements"] = table_elements;
  j["params"] = json::array();
  for (const Param& p : params)
    j["params"].push_back({{"name", p.name},
                           {"shape", p.shape},
                           {"split_dim", p.split_dim},
                           {"pp_rank", p.pp_rank},
                           {"offset", p.offset}});
  j["shards"] = json::array();
  for (const Shard& s : shards)
    j["shards"].push_back(
        {{"file", s.file}, {"rank", s.rank}, {"pp_rank", s.pp_rank}, {"tp_rank", s.tp_rank}, {"begin", s.begin},
         {"end", s.end}});
  j["files"] = json::array();
  for (const File& f : files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}});
  j["config"] = config_toml;
  // The checksum covers every byte before its own line.
  std::string body = j.dump(1);
  ENSURE(body.size() >= 2 && body.back() == '}', "metadata serialisation");
  body.resize(body.size() - 2);  // drop "\n}"
  body += ",\n";
  const uint64_t h = xxh64(body.data(), body.size());
  return body + " \"" + kChecksumKey + "\": \"" + hex64(h) + "\"\n}\n";
}

Metadata Metadata::parse(const std::string& text, const std::string& path) {
  const std::string marker = std::string(" \"") + kChecksumKey + "\": \"";
  const size_t at = text.rfind(marker);
  if (at == std::string::npos || (at > 0 && text[at - 1] != '\n'))
    RAISE(path, ": no ", kChecksumKey, " line (not written by this engine, or cut short)");
  uint64_t recorded = 0;
  if (!parse_hex64(text.substr(at + marker.size(), 16), &recorded))
    RAISE(path, ": malformed ", kChecksumKey, " value");
  const uint64_t actual = xxh64(text.data(), at);
  if (actual != recorded)
    RAISE(path, ": checksum mismatch: ", kChecksumKey, " records ", hex64(recorded), ", the file's content hashes to ",
          hex64(actual), " (corrupted or edited)");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    RAISE(path, ": not valid JSON: ", e.what());
  }
  Fields f{path};
  if (!j.is_object()) RAISE(path, ": not a JSON object");
  if (f.string(j, "format", "format") != kFormatName) f.fail("format", "expected \"" + std::string(kFormatName) + "\"");
  Metadata m;
  // Checked as int64 before the narrowing (2^32 + 3 used to pass as version 3).
  const int64_t version = f.integer(j, "version", "version");
  if (version < 1 || version > kFormatVersion)
    f.fail("version", str_cat("format version ", version, " is not supported (this build reads 1 to ", kFormatVersion, ")"));
  m.version = static_cast<int>(version);
  const bool v1 = m.version == 1, before_pp = m.version < 3;
  m.state.step = static_cast<int>(f.integer(j, "step", "step", 0, INT32_MAX));
  const json& tr = f.get(j, "trainer", "trainer");
  m.state.consumed_samples = f.integer(tr, "consumed_samples", "trainer.consumed_samples");
  m.state.tokens_seen = f.integer(tr, "tokens_seen", "trainer.tokens_seen");
  m.state.train_seconds = f.number(tr, "train_seconds", "trainer.train_seconds");
  m.config_toml = f.string(j, "config", "config");

  const json& lay = f.get(j, "layout", "layout");
  m.layout.world_size = static_cast<int>(f.integer(lay, "world_size", "layout.world_size", 1, INT32_MAX));
  m.layout.data_parallel = static_cast<int>(f.integer(lay, "data_parallel", "layout.data_parallel", 1, INT32_MAX));
  if (!v1)
    m.layout.tensor_parallel = static_cast<int>(f.integer(lay, "tensor_parallel", "layout.tensor_parallel", 1, INT32_MAX));
  if (!before_pp)
    m.layout.pipeline_parallel =
        static_cast<int>(f.integer(lay, "pipeline_parallel", "layout.pipeline_parallel", 1, INT32_MAX));
  const int pp = m.layout.pipeline_parallel;
  m.layout.zero_stage = static_cast<int>(f.integer(lay, "zero_stage", "layout.zero_stage", 0, 3));
  // Versions 1 and 2: one number; version 3: one per pipeline rank.
  auto per_pp_rank = [&](const json& obj, const std::string& key, const std::string& field, const auto& hi) {
    std::vector<int64_t> out;
    if (before_pp) {
      out.push_back(f.integer(obj, key, field, 0, hi(0)));
      return out;
    }
    const json& a = f.array(obj, key, field);
    if (static_cast<int64_t>(a.size()) != pp) f.fail(field, str_cat("expected ", pp, " values (pipeline_parallel)"));
    for (size_t r = 0; r < a.size(); ++r) {
      if (!a[r].is_number_integer()) f.fail(field, "expected integers, got " + a[r].dump());
      const int64_t x = a[r].get<int64_t>();
      if (x < 0 || x > hi(r)) f.fail(field, str_cat("out of range: ", x));
      out.push_back(x);
    }
    return out;
  };
  m.layout.capacity = per_pp_rank(lay, "capacity", "layout.capacity", [](size_t) { return INT64_MAX; });
  m.layout.compute_dtype = f.string(lay, "compute_dtype", "layout.compute_dtype");
  m.layout.device = f.string(lay, "device", "layout.device");

  const json& kinds = f.array(j, "tensors", "tensors");
  std::vector<std::string> expect(std::begin(kTensorKinds), std::end(kTensorKinds));
  if (kinds != json(expect)) f.fail("tensors", "expected " + json(expect).dump() + ", got " + kinds.dump());

  m.table_elements = per_pp_rank(j, "table_elements", "table_elements", [&](size_t r) { return m.layout.capacity[r]; });
  const json& params = f.array(j, "params", "params");
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string at_p = str_cat("params[", i, "]");
    Param p;
    p.name = f.string(params[i], "name", at_p + ".name");
    p.offset = f.integer(params[i], "offset", at_p + ".offset");
    const json& shape = f.array(params[i], "shape", at_p + ".shape");
    int64_t numel = 1;  // bounded so that numel(), block_numel() and offset arithmetic cannot overflow
    for (const auto& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0) f.fail(at_p + ".shape", "expected positive sizes");
      if (__builtin_mul_overflow(numel, d.get<int64_t>(), &numel) || numel > (int64_t{1} << 62))
        f.fail(at_p + ".shape", str_cat(shape.dump(), " has more than 2^62 elements"));
      p.shape.push_back(d.get<int64_t>());
    }
    if (p.shape.size() > static_cast<size_t>(Shape::kMaxDims))
      f.fail(at_p + ".shape", str_cat(shape.dump(), " has more than ", Shape::kMaxDims, " dimensions"));
    if (!v1) {
      p.split_dim = static_cast<int>(f.integer(params[i], "split_dim", at_p + ".split_dim", -1, Shape::kMaxDims - 1));
      if (p.split_dim >= static_cast<int>(p.shape.size()) ||
          (p.split_dim >= 0 && p.shape[static_cast<size_t>(p.split_dim)] % m.layout.tensor_parallel != 0))
        f.fail(at_p + ".split_dim", str_cat(p.name, ": dimension ", p.split_dim, " of ", p.shape.size(),
                                            " does not split over tensor_parallel = ", m.layout.tensor_parallel));
    }
    if (!before_pp) p.pp_rank = static_cast<int>(f.integer(params[i], "pp_rank", at_p + ".pp_rank", 0, pp - 1));
    const int64_t extent = m.table_elements[static_cast<size_t>(p.pp_rank)];
    if (p.offset > extent - m.block_numel(p))  // offset + block > extent, without overflow
      f.fail(at_p, str_cat(p.name, " at offset ", p.offset, " with ", m.block_numel(p),
                           " elements runs past table_elements ", extent,
                           before_pp ? "" : str_cat(" of pp_rank ", p.pp_rank)));
    if (m.find_param(p.name)) f.fail(at_p + ".name", p.name + " appears twice");
    m.params.push_back(std::move(p));
  }

  const json& files = f.array(j, "files", "files");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string at_f = str_cat("files[", i, "]");
    File fl;
    fl.name = f.string(files[i], "name", at_f + ".name");
    if (fl.name.empty() || fl.name.find('/') != std::string::npos || fl.name == "." || fl.name == "..")
      f.fail(at_f + ".name", "not a plain file name: \"" + fl.name + "\"");
    fl.bytes = static_cast<uint64_t>(f.integer(files[i], "bytes", at_f + ".bytes"));
    if (!parse_hex64(f.string(files[i], "xxh64", at_f + ".xxh64"), &fl.xxh64))
      f.fail(at_f + ".xxh64", "expected 16 hex digits");
    m.files.push_back(std::move(fl));
  }

  const json& shards = f.array(j, "shards", "shards");
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string at_s = str_cat("shards[", i, "]");
    Shard s;
    s.file = f.string(shards[i], "file", at_s + ".file");
    s.rank = static_cast<int>(f.integer(shards[i], "rank", at_s + ".rank", 0, INT32_MAX));
    if (!before_pp) s.pp_rank = static_cast<int>(f.integer(shards[i], "pp_rank", at_s + ".pp_rank", 0, pp - 1));
    if (!v1)
      s.tp_rank = static_cast<int>(f.integer(shards[i], "tp_rank", at_s + ".tp_rank", 0, m.layout.tensor_parallel - 1));
    const int64_t capacity = m.layout.capacity[static_cast<size_t>(s.pp_rank)];
    s.begin = f.integer(shards[i], "begin", at_s + ".begin", 0, capacity);
    s.end = f.integer(shards[i], "end", at_s + ".end", s.begin, capacity);
    if (std::none_of(m.files.begin(), m.files.end(), [&](const File& x) { return x.name == s.file; }))
      f.fail(at_s + ".file", s.file + " is not listed in files");
    m.shards.push_back(std::move(s));
  }
  std::sort(m.shards.begin(), m.shards.end(), [](const Shard& a, const Shard& b) {
    return a.pp_rank != b.pp_rank ? a.pp_rank < b.pp_rank : a.tp_rank != b.tp_rank ? a.tp_rank < b.tp_rank
                                                                                   : a.begin < b.begin;
  });
  // The shards of each (pipeline, tensor-parallel) rank must tile [0, its capacity) exactly. The
  // walk is over the shards, not over every tp_rank: tensor_parallel may be up to 2^31 - 1 (a
  // loop over it hung), and a rank with no shard is only valid when its capacity is 0.
  size_t i = 0;
  for (int q = 0; q < pp; ++q) {
    const int64_t capacity = m.layout.capacity[static_cast<size_t>(q)];
    const std::string which = before_pp ? "" : str_cat("pp_rank ", q, ", ");
    auto uncovered = [&](int64_t covered, int t) {
      f.fail("shards", str_cat("cover [0, ", covered, ") for ", which, "tp_rank ", t, ", the layout's capacity is ",
                               capacity));
    };
    int next_t = 0;  // the lowest tp_rank not checked yet
    while (i < m.shards.size() && m.shards[i].pp_rank == q) {
      const int t = m.shards[i].tp_rank;
      if (t != next_t && capacity != 0) uncovered(0, next_t);  // tp ranks next_t .. t - 1 have no shard
      int64_t covered = 0;
      for (; i < m.shards.size() && m.shards[i].pp_rank == q && m.shards[i].tp_rank == t; ++i) {
        const Shard& s = m.shards[i];
        if (s.begin != covered)
          f.fail("shards", str_cat(s.file, " begins at ", s.begin, ", expected ", covered, " (gap or overlap) for ",
                                   which, "tp_rank ", t));
        covered = s.end;
      }
      if (covered != capacity) uncovered(covered, t);
      next_t = t + 1;
    }
    if (next_t != m.layout.tensor_parallel && capacity != 0) uncovered(0, next_t);
  }
  return m;
}

Metadata read_metadata(const std::string& dir) {
  const std::string path = (fs::path(dir) / kMetadataFile).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) RAISE(path, ": missing (not a complete checkpoint)");
  return Metadata::parse(read_small_file(path, uint64_t{1} << 30), path);
}

std::string step_dir_name(int step) { return "step_" + std::to_string(step); }

std::optional<int> parse_step_dir_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0 || name.size() > 5 + 9) return std::nullopt;
  int v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::vector<std::pair<int, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto step = parse_step_dir_name(e.path().filename().string());
    if (!step || !e.is_directory(ec)) continue;
    out.emplace_back(*step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace engine::checkpoint
