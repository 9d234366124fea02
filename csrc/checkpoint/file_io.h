// File primitives of the checkpoint writers and readers: every error names the path and the
// system's reason. Writes go through OutFile, which counts bytes and hashes them (XXH64) as they
// pass, so a file's checksum costs no second read; sync_and_close() fsyncs before the caller
// renames anything into place. inject_write_failure() makes OutFile writes fail with ENOSPC
// after a number of bytes (tests of the atomic-save guarantees; off by default).
// The run directory's files (metrics.jsonl, debug_stats.jsonl, config.toml) go through the same
// primitives: OutFile in Append or Truncate mode for the line files, replace_file for whole files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint/xxhash.h"

namespace engine::checkpoint {

struct FileDigest {
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

class OutFile {
 public:
  // Create: a new file (it must not exist: O_EXCL). Truncate: created or emptied. Append: created
  // when absent, every write goes to its end.
  enum class Mode { Create, Truncate, Append };
  OutFile() = default;
  explicit OutFile(const std::string& path, Mode mode = Mode::Create);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  // Writes all `bytes` straight to the file (no user-space buffer: a reader of the file sees them
  // once this returns), or raises naming the file, the byte offset and the system's reason.
  void write(const void* data, size_t bytes);
  void write(const std::string& s) { write(s.data(), s.size()); }
  // fsync; the file stays open. Files that cannot be synchronised (EINVAL: a pipe, a device)
  // are accepted.
  void sync();
  // fsync + close; returns the size and checksum of everything written (by this object).
  FileDigest sync_and_close();
  const std::string& path() const { return path_; }
  uint64_t written() const { return written_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t start_ = 0;  // the file's size when opened (Append), for the offsets in errors
  uint64_t written_ = 0;
  Xxh64 hash_;
};

// Writes a whole small file (metadata, JSON) through OutFile; returns its digest.
FileDigest write_file(const std::string& path, const std::string& contents);
// Replaces `path` (or creates it) with `contents` atomically: written and fsynced under a
// temporary name next to it (<path>.tmp-<pid>), renamed over it, the folder fsynced. On an error
// the old file is untouched and the temporary removed.
void replace_file(const std::string& path, const std::string& contents);
// The same with the file written by `write` (given the temporary path; e.g. a SafetensorsWriter).
void replace_file(const std::string& path, const std::function<void(const std::string& tmp)>& write);
// The whole file as a string (small files), or an error naming it.
std::string read_small_file(const std::string& path, uint64_t max_bytes = uint64_t{1} << 30);
// Size and XXH64 of a whole file, read in large blocks.
FileDigest digest_file(const std::string& path);

// fsync of a folder (so a rename or a new entry in it is durable). File systems that cannot
// fsync folders (EINVAL) are accepted; other errors are raised.
void fsync_dir(const std::string& path);
// rename(2) with an error naming both paths.
void rename_path(const std::string& from, const std::string& to);
// Removes a folder tree; returns false (and logs a warning) when that fails.
bool remove_tree(const std::string& path);

// Test hook: after `bytes` more bytes, OutFile::write fails as if the disk were full (ENOSPC);
// a negative value turns the fault off.
void inject_write_failure(int64_t bytes);
// Test hook: after `bytes` more bytes, the process kills itself (SIGKILL) inside OutFile::write.
void inject_write_kill(int64_t bytes);

}  // namespace engine::checkpoint
