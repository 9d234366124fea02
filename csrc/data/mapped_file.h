// Read-only memory-mapped files and bounds-checked decoding of the integers inside them.
// Every format error goes through file_error(), which names the file, the byte offset and what
// was expected: "<path>: at offset <n>: <what>". Loads go through memcpy, so unaligned fields
// (the .fast_llm_dataset arrays start at odd offsets) are fine. Hosts are little-endian.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/check.h"

namespace engine {

static_assert(std::endian::native == std::endian::little, "the data readers assume little-endian");

[[noreturn]] void file_error(const std::string& path, uint64_t offset, const std::string& what);

// What identifies a file's contents for caches of facts about it (data/token_scan.h): size,
// modification and status-change times (nanoseconds), device and inode.
struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  uint64_t dev = 0, ino = 0;
  bool operator==(const FileStamp&) const = default;
};
// The stamp of `path` now (stat); throws naming the file when it cannot be read.
FileStamp file_stamp(const std::string& path);

// A whole file mapped read-only (MAP_SHARED, PROT_READ). Move-only; unmaps on destruction.
// An empty file maps to size() == 0 and data() == nullptr.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The file's stamp when it was opened (the mapped contents).
  const FileStamp& stamp() const { return stamp_; }

  // Throws (file, offset, "truncated: need N bytes for <what>") unless [offset, offset + bytes)
  // lies inside the file; overflow-safe.
  void require(uint64_t offset, uint64_t bytes, const std::string& what) const;
  // Bounds-checked little-endian / big-endian loads.
  template <typename T>
  T le(uint64_t offset, const char* what) const {
    require(offset, sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + offset, sizeof(T));
    return v;
  }
  template <typename T>
  T be(uint64_t offset, const char* what) const {
    T v = le<T>(offset, what);
    T r = 0;
    for (size_t i = 0; i < sizeof(T); ++i) r = static_cast<T>((r << 8) | ((v >> (8 * i)) & 0xff));
    return r;
  }
  // Checks that the bytes at `offset` equal `marker` (bounds-checked).
  void expect_marker(uint64_t offset, std::string_view marker) const;

 private:
  void release();
  std::string path_;
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
  FileStamp stamp_;
};

// Unchecked little-endian load of element `i` of an array at `p` (after validation).
template <typename T>
inline T load_le(const unsigned char* p, uint64_t i = 0) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// a * b + c in uint64 or a file_error naming `what` when it overflows.
uint64_t checked_mad(uint64_t a, uint64_t b, uint64_t c, const std::string& path, uint64_t offset,
                     const char* what);

// Atomic writes (the dataset writers): write to temp_name(path), fsync, rename, fsync the folder.
std::string temp_name(const std::string& path);
void fsync_file(int fd, const std::string& path);
void fsync_parent_dir(const std::string& path);

}  // namespace engine
