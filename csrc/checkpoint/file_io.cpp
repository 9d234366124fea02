#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/check.h"
#include "core/log.h"

namespace engine::checkpoint {

namespace {
std::atomic<int64_t> g_fail_after{-1};  // bytes left before an injected ENOSPC; -1: off
std::atomic<bool> g_fail_kills{false};   // the injected fault is SIGKILL instead of ENOSPC

// Bytes of this write that may go through before the injected fault, and whether it fires.
size_t fault_budget(size_t bytes, bool* fire) {
  *fire = false;
  int64_t left = g_fail_after.load();
  if (left < 0) return bytes;
  if (static_cast<uint64_t>(left) >= bytes) {
    g_fail_after.fetch_sub(static_cast<int64_t>(bytes));
    return bytes;
  }
  g_fail_after.store(0);
  *fire = true;
  return static_cast<size_t>(left);
}
}  // namespace

void inject_write_failure(int64_t bytes) {
  g_fail_kills.store(false);
  g_fail_after.store(bytes < 0 ? -1 : bytes);
}

void inject_write_kill(int64_t bytes) {
  g_fail_kills.store(true);
  g_fail_after.store(bytes < 0 ? -1 : bytes);
}

OutFile::OutFile(const std::string& path, Mode mode) : path_(path) {
  const int how = mode == Mode::Create ? O_EXCL : mode == Mode::Truncate ? O_TRUNC : O_APPEND;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | how, 0644);
  if (fd_ < 0) RAISE("cannot ", mode == Mode::Create ? "create " : "open for writing ", path, ": ", std::strerror(errno));
  if (mode == Mode::Append) {
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode)) start_ = static_cast<uint64_t>(st.st_size);
  }
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::write(const void* data, size_t bytes) {
  ENSURE(fd_ >= 0, "write to ", path_, " after close");
  bool fire = false;
  const size_t allowed = fault_budget(bytes, &fire);
  const auto* p = static_cast<const unsigned char*>(data);
  size_t done = 0;
  while (done < allowed) {
    ssize_t n = ::write(fd_, p + done, allowed - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) RAISE("write ", path_, " (at byte ", start_ + written_ + done, "): ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  hash_.update(p, done);
  written_ += done;
  if (fire && g_fail_kills.load()) std::raise(SIGKILL);  // as kill -9 mid-write: no cleanup at all
  if (fire) RAISE("write ", path_, " (at byte ", start_ + written_, "): ", std::strerror(ENOSPC), " (injected fault)");
}

void OutFile::sync() {
  ENSURE(fd_ >= 0, "fsync of ", path_, " after close");
  if (::fsync(fd_) != 0 && errno != EINVAL) RAISE("fsync ", path_, ": ", std::strerror(errno));
}

FileDigest OutFile::sync_and_close() {
  ENSURE(fd_ >= 0, "close of ", path_, " twice");
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int e = errno;
    ::close(fd);
    RAISE("fsync ", path_, ": ", std::strerror(e));
  }
  if (::close(fd) != 0) RAISE("close ", path_, ": ", std::strerror(errno));
  return {written_, hash_.digest()};
}

FileDigest write_file(const std::string& path, const std::string& contents) {
  OutFile f(path);
  f.write(contents.data(), contents.size());
  return f.sync_and_close();
}

void replace_file(const std::string& path, const std::string& contents) {
  replace_file(path, [&contents](const std::string& tmp) { write_file(tmp, contents); });
}

void replace_file(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
  const std::string tmp = str_cat(path, ".tmp-", static_cast<long>(::getpid()));
  std::error_code ec;
  std::filesystem::remove(tmp, ec);  // a leftover of a process with the same id
  try {
    write(tmp);
    rename_path(tmp, path);
  } catch (...) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
  const std::string parent = std::filesystem::path(path).parent_path().string();
  fsync_dir(parent.empty() ? "." : parent);
}

namespace {
struct InFd {
  int fd = -1;
  explicit InFd(const std::string& path) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) RAISE("cannot open ", path, ": ", std::strerror(errno));
  }
  ~InFd() { ::close(fd); }
};
}  // namespace

std::string read_small_file(const std::string& path, uint64_t max_bytes) {
  InFd f(path);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) RAISE("cannot stat ", path, ": ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) RAISE(path, ": not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    RAISE(path, ": ", st.st_size, " bytes, more than the ", max_bytes, " expected");
  std::string s(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::read(f.fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) RAISE("read ", path, ": ", std::strerror(errno));
    if (n == 0) break;  // shrank meanwhile
    done += static_cast<size_t>(n);
  }
  s.resize(done);
  return s;
}

FileDigest digest_file(const std::string& path) {
  InFd f(path);
  std::vector<unsigned char> buf(size_t{8} << 20);
  Xxh64 h;
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(f.fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) RAISE("read ", path, ": ", std::strerror(errno));
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  return {total, h.digest()};
}

void fsync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) RAISE("cannot open folder ", path, " to fsync it: ", std::strerror(errno));
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int e = errno;
    ::close(fd);
    RAISE("fsync folder ", path, ": ", std::strerror(e));
  }
  ::close(fd);
}

void rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) RAISE("rename ", from, " -> ", to, ": ", std::strerror(errno));
}

bool remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) log_warn("could not remove ", path, ": ", ec.message());
  return !ec;
}

}  // namespace engine::checkpoint
