#include "train/agreement.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "checkpoint/file_io.h"
#include "checkpoint/xxhash.h"
#include "core/check.h"
#include "data/manifest_dataset.h"

namespace engine {

namespace {

namespace fs = std::filesystem;
using checkpoint::hex64;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// An error's text without the " at file.cpp:line" that RAISE appends (it goes into another message).
std::string reason(const std::string& what) {
  const size_t at = what.rfind(" at ");
  const size_t colon = what.rfind(':');
  if (at == std::string::npos || colon == std::string::npos || colon < at || colon + 1 == what.size() ||
      what.find_first_not_of("0123456789", colon + 1) != std::string::npos)
    return what;
  return what.substr(0, at);
}

// "N bytes, xxh64 H" of a whole file, or "N bytes" alone; "missing" or "unreadable" (the reason in
// *why).
std::string file_summary(const std::string& path, bool hash, std::string* why) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    *why = ec ? ec.message() : "no such file";
    return "missing";
  }
  try {
    if (!hash) {
      const auto bytes = fs::file_size(path, ec);
      if (ec) RAISE(ec.message());
      return str_cat(bytes, " bytes");
    }
    const checkpoint::FileDigest d = checkpoint::digest_file(path);
    return str_cat(d.bytes, " bytes, xxh64 ", hex64(d.xxh64));
  } catch (const std::exception& e) {
    *why = reason(e.what());
    return "unreadable";
  }
}

// A .fast_llm_dataset: its size and the XXH64 of its first and last MiB.
std::string ends_summary(const std::string& path, std::string* why) {
  constexpr int64_t kPart = int64_t{1} << 20;
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    *why = ec ? ec.message() : "no such file";
    return "missing";
  }
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  if (!in || ec) {
    *why = ec ? ec.message() : "cannot open";
    return "unreadable";
  }
  std::string head(static_cast<size_t>(std::min(size, kPart)), '\0'), tail(head.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  in.seekg(size - static_cast<int64_t>(tail.size()));
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  if (!in) {
    *why = "read failed";
    return "unreadable";
  }
  checkpoint::Xxh64 h;
  h.update(head.data(), head.size());
  h.update(tail.data(), tail.size());
  return str_cat(size, " bytes, xxh64 of the first and last MiB ", hex64(h.digest()));
}

void add(std::vector<AgreementEntry>& out, const std::string& key, const std::string& path, const std::string& value,
         const std::string& why) {
  out.push_back({key, value, str_cat(path, " (", value, why.empty() ? "" : ": " + why, ")")});
}

// One dataset (a .bin/.idx prefix, or a .fast_llm_dataset file), as open_token_dataset reads it:
// "<key> (index)" (the .idx, or the single file) and, for a prefix, "<key> (tokens)" (the .bin).
void add_dataset(std::vector<AgreementEntry>& out, const std::string& key, const std::string& path) {
  std::string why;
  if (ends_with(path, ".fast_llm_dataset")) {
    const std::string v = ends_summary(path, &why);
    return add(out, key + " (index)", path, v, why);
  }
  if (is_manifest_path(path)) {  // a sharded dataset: the manifest lists every shard's size and sha256
    const std::string v = file_summary(path, true, &why);
    return add(out, key + " (manifest)", path, v, why);
  }
  std::string prefix = path;
  if (ends_with(prefix, ".bin") || ends_with(prefix, ".idx")) prefix.resize(prefix.size() - 4);
  const std::string idx = file_summary(prefix + ".idx", true, &why);
  add(out, key + " (index)", prefix + ".idx", idx, why);
  why.clear();
  const std::string bin = file_summary(prefix + ".bin", false, &why);
  add(out, key + " (tokens)", prefix + ".bin", bin, why);
}

// A model folder (Hugging Face or checkpoint): its files' names and sizes, and the .json files'
// hashes (config, index, metadata), not the weights (too large to hash at start).
void add_folder(std::vector<AgreementEntry>& out, const std::string& key, const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file()) names.push_back(it->path().filename().string());
  if (ec) {
    out.push_back({key + " (files)", "no readable folder", str_cat(dir, " (no readable folder: ", ec.message(), ")")});
    return;
  }
  std::sort(names.begin(), names.end());
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  out.push_back({key + " (files)", list, str_cat(dir, " (", list.empty() ? "no files" : list, ")")});
  for (const std::string& n : names) {
    std::string why;
    const std::string path = (fs::path(dir) / n).string();
    const std::string v = file_summary(path, ends_with(n, ".json"), &why);
    add(out, str_cat(key, " (", n, ")"), path, v, why);
  }
}

// Length-prefixed fields: any bytes survive the trip to the other ranks.
void put(std::string& s, const std::string& field) { s += std::to_string(field.size()) + ":" + field; }

std::vector<AgreementEntry> decode(const std::string& s) {
  std::vector<AgreementEntry> out;
  size_t at = 0;
  auto field = [&] {
    const size_t colon = s.find(':', at);
    ENSURE(colon != std::string::npos, "check_ranks_agree: malformed entries");
    const size_t n = std::stoul(s.substr(at, colon - at));
    ENSURE(colon + 1 + n <= s.size(), "check_ranks_agree: malformed entries");
    std::string f = s.substr(colon + 1, n);
    at = colon + 1 + n;
    return f;
  };
  while (at < s.size()) {
    AgreementEntry e;
    e.key = field();
    e.value = field();
    e.shown = field();
    out.push_back(std::move(e));
  }
  return out;
}

// The first entry where `theirs` (rank r) differs from rank 0's, as the error message.
std::string difference(const std::vector<AgreementEntry>& first, const std::vector<AgreementEntry>& theirs, int r,
                       int more) {
  std::map<std::string, const AgreementEntry*> by_key;
  for (const AgreementEntry& e : theirs) by_key[e.key] = &e;
  std::map<std::string, const AgreementEntry*> first_by_key;
  for (const AgreementEntry& e : first) first_by_key[e.key] = &e;
  const std::string also = more > 0 ? str_cat(" (and ", more, " more rank(s) differ from rank 0)") : "";
  const std::string tail = "; every rank must have the same config, data and checkpoint";
  for (const AgreementEntry& e : first) {
    auto it = by_key.find(e.key);
    if (it != by_key.end() && it->second->value == e.value) continue;
    return str_cat("the ranks disagree at ", e.key, ": ", it == by_key.end() ? "(absent)" : it->second->shown,
                   " on rank ", r, ", ", e.shown, " on rank 0", also, tail);
  }
  for (const AgreementEntry& e : theirs)
    if (!first_by_key.count(e.key))
      return str_cat("the ranks disagree at ", e.key, ": ", e.shown, " on rank ", r, ", (absent) on rank 0", also,
                     tail);
  return str_cat("the ranks disagree: rank ", r, "'s config or data differs from rank 0's", also, tail);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> config_entries(const std::string& toml) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(toml);
  std::string section, line;
  bool multi_line = false;  // inside a multi-line array: its lines join the last entry
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (multi_line) {
      out.back().second += line;
      if (line == "]") multi_line = false;
      continue;
    }
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    out.emplace_back(section + "." + line.substr(0, eq), line.substr(eq + 3));
    multi_line = out.back().second == "[";
  }
  return out;
}

std::vector<AgreementEntry> agreement_entries(const Config& c) {
  // The locations, taken out of the text that compares.
  Config bare = c;
  bare.run.output_dir.clear();
  for (auto* refs : {&bare.data.train, &bare.data.valid})
    for (DatasetRef& r : *refs) r.path.clear();
  if (!bare.model.init_from.empty()) bare.model.init_from = "(a folder)";
  if (!bare.distillation.teacher.empty()) bare.distillation.teacher = "(a folder)";
  std::string& resume = bare.training.resume;
  if (resume != "none" && resume != "auto" && !resume.empty()) resume = "(a path)";
  std::string& tokenizer = bare.data.tokenizer;  // only rank 0 reads it (samples, --generate)
  if (!tokenizer.empty() && tokenizer != "bytes" && tokenizer != "ids") tokenizer = "(a path)";

  const auto shown = config_entries(config_to_toml(c));
  const auto compared = config_entries(config_to_toml(bare));
  ENSURE(shown.size() == compared.size(), "check_ranks_agree: ", shown.size(), " config keys, ", compared.size(),
         " without the locations");
  std::vector<AgreementEntry> out;
  for (size_t i = 0; i < shown.size(); ++i) {
    const std::string& key = shown[i].first;
    auto it = c.origin.find(key);
    out.push_back({key, compared[i].second,
                   str_cat(shown[i].second, " (", it == c.origin.end() ? "default" : it->second, ")")});
  }
  for (const char* split : {"train", "valid"}) {
    const auto& refs = std::string(split) == "train" ? c.data.train : c.data.valid;
    for (size_t i = 0; i < refs.size(); ++i) add_dataset(out, str_cat("data.", split, "[", i, "]"), refs[i].path);
  }
  if (!c.model.init_from.empty()) add_folder(out, "model.init_from", c.model.init_from);
  if (!c.distillation.teacher.empty()) add_folder(out, "distillation.teacher", c.distillation.teacher);
  return out;
}

void check_ranks_agree(const Config& c, Comm& comm) {
  if (comm.size() <= 1) return;
  std::string compared, full;
  for (const AgreementEntry& e : agreement_entries(c)) {
    put(compared, e.key);
    put(compared, e.value);
    put(full, e.key);
    put(full, e.value);
    put(full, e.shown);
  }
  // Hashes first (a few bytes a rank); the entries of rank 0 and of the lowest rank that differs
  // only when some rank differs.
  const std::vector<std::string> hashes =
      all_gather_strings(comm, hex64(checkpoint::xxh64(compared.data(), compared.size())));
  int r = 0, more = 0;
  for (int i = 1; i < comm.size(); ++i) {
    if (hashes[static_cast<size_t>(i)] == hashes[0]) continue;
    if (r == 0) r = i;
    else ++more;
  }
  if (r == 0) return;
  const std::vector<std::string> both = all_gather_strings(comm, comm.rank() == 0 || comm.rank() == r ? full : "");
  RAISE(difference(decode(both[0]), decode(both[static_cast<size_t>(r)]), r, more));
}

}  // namespace engine
