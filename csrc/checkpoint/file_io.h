// File primitives of the checkpoint writers and readers: every error names the path and the
// system's reason. Writes go through OutFile, which counts bytes and hashes them (XXH64) as they
// pass, so a file's checksum costs no second read; sync_and_close() fsyncs before the caller
// renames anything into place. inject_write_failure() makes OutFile writes fail with ENOSPC
// after a number of bytes (tests of the atomic-save guarantees; off by default).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/xxhash.h"

namespace engine::checkpoint {

struct FileDigest {
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

class OutFile {
 public:
  OutFile() = default;
  // Creates `path` (it must not exist: O_EXCL), for writing.
  explicit OutFile(const std::string& path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* data, size_t bytes);
  // fsync + close; returns the size and checksum of everything written.
  FileDigest sync_and_close();
  const std::string& path() const { return path_; }
  uint64_t written() const { return written_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  Xxh64 hash_;
};

// Writes a whole small file (metadata, JSON) through OutFile; returns its digest.
FileDigest write_file(const std::string& path, const std::string& contents);
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
