// Shared helpers of the libFuzzer targets (tests/fuzz/*.cpp, built by `make fuzz`, run by
// scripts/fuzz.sh). Errors the readers raise on purpose (engine::Error, any std::exception with
// a message) are the expected outcome for bad input and are swallowed; crashes, sanitizer
// reports, timeouts and leaks are the findings. FUZZ_VERBOSE=1 prints each rejection (to check
// that a seed is valid: build-fuzz/fuzz_<target> <seed file>).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

namespace fuzz {

// A per-process temporary folder (removed at exit).
inline const std::string& temp_dir() {
  static const std::string dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "engine-fuzz-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    static const std::string keep = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return tmpl;
  }();
  return dir;
}

inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) {
    std::perror(path.c_str());
    std::abort();
  }
}

// Runs `body`; an exception with a non-empty message is the reader rejecting the input.
template <typename F>
void expect_ok_or_error(F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    if (e.what() == nullptr || e.what()[0] == '\0') std::abort();  // an error must say what
    static const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "rejected: %s\n", e.what());
  }
}

}  // namespace fuzz
