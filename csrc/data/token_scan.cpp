#include "data/token_scan.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

namespace engine {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kCacheVersion = 1;

std::string absolute_path(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal().string() : c.string();
}

// The cache key: every file of the dataset as mapped. Not the device number, which differs
// between the hosts that mount one network file system (the inode number does not).
json files_key(const TokenDataset& ds) {
  json files = json::array();
  for (const MappedFile* f : ds.files()) {
    const FileStamp& s = f->stamp();
    files.push_back({{"path", absolute_path(f->path())}, {"size", s.size}, {"mtime_ns", s.mtime_ns},
                     {"ctime_ns", s.ctime_ns}, {"ino", s.ino}});
  }
  return files;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Where an entry for `ds` may be: next to it, then in the user cache.
std::vector<std::string> cache_files(const TokenDataset& ds, const TokenScanOptions& o) {
  std::vector<std::string> out{ds.path() + ".token_ids.json"};
  const std::string dir = o.cache_dir.empty() ? default_token_cache_dir() : o.cache_dir;
  if (!dir.empty()) {
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.json", static_cast<unsigned long long>(fnv1a(absolute_path(ds.path()))));
    out.push_back((fs::path(dir) / "token_ids" / name).string());
  }
  return out;
}

// The range an entry holds for `key`, if it is one (an unreadable or stale file is no entry).
bool read_entry(const std::string& path, const json& key, TokenIdRange* range) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > (1 << 20)) return false;
  std::ifstream in(path);
  json j = json::parse(in, nullptr, false);
  // Only the exact shape the writer makes is an entry; nothing in a damaged file throws.
  const auto integer = [&](const char* k) { return j.contains(k) && j[k].is_number_integer(); };
  if (j.is_discarded() || !j.is_object() || !integer("version") || j["version"] != kCacheVersion ||
      !j.contains("files") || j["files"] != key || !integer("min") || !integer("max"))
    return false;
  *range = {j["min"].get<int64_t>(), j["max"].get<int64_t>()};
  return true;
}

// Writes an entry atomically; false when the folder does not take it.
bool write_entry(const std::string& path, const json& key, const TokenIdRange& range) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  std::ostringstream tmp_name;
  tmp_name << path << ".tmp." << ::getpid() << "." << std::hex
           << std::chrono::steady_clock::now().time_since_epoch().count();
  const std::string tmp = tmp_name.str();
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return false;
    out << json{{"version", kCacheVersion}, {"files", key}, {"min", range.min}, {"max", range.max}}.dump() << "\n";
    out.close();
    if (!out) {
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The files still are as mapped, and were last changed `settle` ns or more before `start`.
bool settled(const TokenDataset& ds, int64_t start, int64_t settle) {
  for (const MappedFile* f : ds.files()) {
    FileStamp now;
    try {
      now = file_stamp(f->path());
    } catch (const Error&) {
      return false;
    }
    if (!(now == f->stamp()) || std::max(now.mtime_ns, now.ctime_ns) > start - settle) return false;
  }
  return true;
}

std::atomic<int64_t> g_scans{0};
std::mutex g_memo_mutex;
std::map<std::string, TokenIdRange> g_memo;  // this process's settled scans, by key

}  // namespace

std::string default_token_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "engine").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "engine").string();
  return "";
}

TokenScan scan_token_ids_cached(const TokenDataset& ds, const TokenScanOptions& o) {
  const json key = files_key(ds);
  const std::string key_text = key.dump();
  TokenScan out;
  const std::vector<std::string> places = cache_files(ds, o);
  for (const std::string& p : places)
    if (read_entry(p, key, &out.range)) {
      out.cache_file = p;
      out.from_cache = true;
      return out;
    }
  {  // a scan of this process whose entry could not be written
    std::lock_guard<std::mutex> lock(g_memo_mutex);
    if (auto it = g_memo.find(key_text); it != g_memo.end()) {
      out.range = it->second;
      out.from_cache = true;
      return out;
    }
  }
  const int64_t start = now_ns();
  out.range = ds.scan_token_ids();
  ++g_scans;
  if (!settled(ds, start, static_cast<int64_t>(o.settle_seconds * 1e9))) return out;
  {
    std::lock_guard<std::mutex> lock(g_memo_mutex);
    g_memo[key_text] = out.range;
  }
  for (const std::string& p : places)
    if (write_entry(p, key, out.range)) {
      out.cache_file = p;
      break;
    }
  return out;
}

int64_t token_scans_run() { return g_scans.load(); }

void check_token_range(const TokenDataset& ds, const TokenScan& scan, int64_t vocab_size) {
  const TokenIdRange r = scan.range;
  if (r.min > r.max || (r.min >= 0 && r.max < vocab_size)) return;
  const TokenLocation at = ds.first_token_outside(vocab_size);
  if (at.doc < 0)  // a cache entry that does not describe the files (edited by hand?)
    RAISE(ds.tokens_path(), ": the token-id cache ", scan.cache_file, " says the ids range over [", r.min, ", ", r.max,
          "] but every token is in [0, model.vocab_size = ", vocab_size, "): remove that file");
  RAISE(ds.tokens_path(), ": document ", at.doc, ", token offset ", at.offset, " (byte ", at.byte, "): token id ",
        at.value, at.value < 0 ? " is negative" : str_cat(" >= model.vocab_size (", vocab_size, ")"),
        " (found by the scan of every token before training)");
}

void check_token_ids(const TokenDataset& whole, int64_t vocab_size, const TokenScanOptions& o) {
  // Part by part (a manifest's shards): each has its own cache entry and names its own file.
  for (const TokenDataset* part : whole.parts()) check_token_range(*part, scan_token_ids_cached(*part, o), vocab_size);
}

}  // namespace engine
