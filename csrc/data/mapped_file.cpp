#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

namespace engine {

void file_error(const std::string& path, uint64_t offset, const std::string& what) {
  RAISE(path, ": at offset ", offset, ": ", what);
}

namespace {
FileStamp stamp_of(const struct stat& st) {
  FileStamp s;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  s.dev = static_cast<uint64_t>(st.st_dev);
  s.ino = static_cast<uint64_t>(st.st_ino);
  return s;
}
}  // namespace

FileStamp file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) RAISE("cannot stat ", path, ": ", std::strerror(errno));
  return stamp_of(st);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) RAISE("cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    RAISE("cannot stat ", path, ": ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    RAISE(path, ": not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  stamp_ = stamp_of(st);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      RAISE("cannot mmap ", path, " (", size_, " bytes): ", std::strerror(e));
    }
    data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping stays valid
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    stamp_ = o.stamp_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void MappedFile::require(uint64_t offset, uint64_t bytes, const std::string& what) const {
  if (offset > size_ || bytes > size_ - offset)
    file_error(path_, offset,
               str_cat("truncated: need ", bytes, " bytes for ", what, ", the file has ", size_));
}

void MappedFile::expect_marker(uint64_t offset, std::string_view marker) const {
  std::string what = str_cat("marker \"", marker, "\"");
  require(offset, marker.size(), what);
  if (std::memcmp(data_ + offset, marker.data(), marker.size()) != 0)
    file_error(path_, offset, str_cat("missing ", what));
}

uint64_t checked_mad(uint64_t a, uint64_t b, uint64_t c, const std::string& path, uint64_t offset,
                     const char* what) {
  uint64_t m, r;
  if (__builtin_mul_overflow(a, b, &m) || __builtin_add_overflow(m, c, &r))
    file_error(path, offset, str_cat(what, " overflows: ", a, " * ", b, " + ", c));
  return r;
}

std::string temp_name(const std::string& path) {
  return str_cat(path, ".tmp.", static_cast<long>(::getpid()));
}

void fsync_file(int fd, const std::string& path) {
  if (::fsync(fd) != 0) RAISE("fsync ", path, ": ", std::strerror(errno));
}

void fsync_parent_dir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems do not allow opening folders
  // ... nor fsyncing them (EINVAL); any other error means the rename may not be durable.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int e = errno;
    ::close(fd);
    RAISE("fsync folder ", parent.string(), " (after writing ", path, "): ", std::strerror(e));
  }
  ::close(fd);
}

}  // namespace engine
