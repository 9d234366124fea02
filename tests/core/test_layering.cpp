// The layering of the sources, checked by reading them (docs/ARCHITECTURE.md, "Layers"):
//   csrc/core includes nothing of the project above it;
//   outside csrc/ops (the dispatch to the backends) and csrc/bench, nothing in csrc/ includes a
//   cuda/ header: the rest of the engine reaches the GPU through ops/ and core/device.h;
//   no kernel code reads the environment: a kernel choice is a field of an op's parameters.
// The tests run from the repository root (scripts/run_tests.sh).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Include {
  std::string file;
  int line;
  std::string target;  // the quoted path
};

bool source_file(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".cpp" || e == ".h" || e == ".cu" || e == ".cuh";
}

std::vector<fs::path> sources(const std::string& dir) {
  REQUIRE_MESSAGE(fs::is_directory(dir), dir, " not found: run the tests from the repository root");
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && source_file(e.path())) out.push_back(e.path());
  return out;
}

// Every `#include "..."` of the files under dir.
std::vector<Include> includes(const std::string& dir) {
  static const std::regex re(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<Include> out;
  for (const fs::path& p : sources(dir)) {
    std::ifstream in(p);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (std::regex_search(line, m, re)) out.push_back({p.generic_string(), n, m[1]});
    }
  }
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_CASE("layering: csrc/core includes nothing above it") {
  int bad = 0;
  for (const Include& i : includes("csrc/core")) {
    if (starts_with(i.target, "core/")) continue;
    ++bad;
    MESSAGE(i.file, ":", i.line, " includes \"", i.target, "\" (core/ may include only core/)");
  }
  CHECK(bad == 0);
}

TEST_CASE("layering: only csrc/ops and csrc/bench include cuda/ headers") {
  int bad = 0;
  for (const Include& i : includes("csrc")) {
    if (!starts_with(i.target, "cuda/")) continue;
    if (starts_with(i.file, "csrc/ops/") || starts_with(i.file, "csrc/bench/")) continue;
    ++bad;
    MESSAGE(i.file, ":", i.line, " includes \"", i.target,
            "\" (reach the GPU through csrc/ops or core/device.h)");
  }
  CHECK(bad == 0);
}

TEST_CASE("layering: no getenv in cuda/") {
  int bad = 0;
  for (const fs::path& p : sources("cuda")) {
    std::ifstream in(p);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find("getenv") == std::string::npos) continue;
      ++bad;
      MESSAGE(p.generic_string(), ":", n, " reads the environment (a kernel choice is a field of the op's parameters)");
    }
  }
  CHECK(bad == 0);
}
