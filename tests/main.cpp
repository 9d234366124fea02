// Test runner: doctest plus a listener that times every test case, counts skips (GPU cases on a
// machine without a GPU), prints the slowest tests and one summary line
//   tests: N passed, N failed, N skipped
// Tiers (test suites): the default fast tier runs every case outside the "full" and "slow"
// suites; --all (or TEST_TIER=full) adds the "full" suite (what `make test` and CI run); --slow
// (or TEST_TIER=slow) adds the "slow" suite too: long sweeps whose smaller versions are in the
// other tiers. GPU cases are in the "gpu" suite, in every tier (skipped without a GPU):
// `-ts=gpu` runs the GPU tier alone. The GPU's long sweeps are the "gpu-slow" suite, run by the
// slow tier or when named (`-ts=gpu-slow`). Other doctest flags pass through (-tc=, -ts=, ...).
// TEST_SLOWEST=N lists the N slowest cases (default 10).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/log.h"
#include "tests/common/testing.h"

#ifdef ENGINE_DIST_TESTS
// The multi-rank suite (tests/dist) runs this same runner under mpirun: every rank runs every
// test case; a case passes only if it passes on all ranks, and rank 0 prints the report.
#include <mpi.h>

#include "comm/launch.h"
static int dist_all_min(int v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return v;
}
static bool report_rank() { return engine::launch_info().rank == 0; }
#else
static int dist_all_min(int v) { return v; }
static bool report_rank() { return true; }
#endif

namespace {

std::mutex g_mu;
std::set<std::string> g_skipped;
std::string g_current;

struct TimingListener : public doctest::IReporter {
  struct Entry {
    std::string name;
    double seconds;
  };
  std::vector<Entry> entries;
  int passed = 0, failed = 0, skipped = 0;

  explicit TimingListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {
    if (!report_rank()) return;
    std::printf("test seed: %llu (set TEST_SEED to replay)\n",
                static_cast<unsigned long long>(engine::testing::test_seed()));
  }
  void test_run_end(const doctest::TestRunStats&) override {
    if (!report_rank()) return;
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
    double total = 0;
    for (auto& e : entries) total += e.seconds;
    std::printf("slowest tests (of %zu, %.2f s in all):\n", entries.size(), total);
    const char* n = std::getenv("TEST_SLOWEST");
    const size_t shown = n && std::atoi(n) > 0 ? static_cast<size_t>(std::atoi(n)) : 10;
    for (size_t i = 0; i < std::min(shown, entries.size()); ++i)
      std::printf("  %8.3f s  %s\n", entries[i].seconds, entries[i].name.c_str());
    std::printf("tests: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    std::fflush(stdout);
  }
  void test_case_start(const doctest::TestCaseData& tc) override {
    std::lock_guard<std::mutex> lock(g_mu);
    g_current = tc.m_name;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& st) override {
    const bool ok = dist_all_min(st.testCaseSuccess ? 1 : 0) != 0;
    std::lock_guard<std::mutex> lock(g_mu);
    entries.push_back({g_current, st.seconds});
    if (!ok) {
      failed++;
      std::printf("FAILED (TEST_SEED=%llu): %s\n",
                  static_cast<unsigned long long>(engine::testing::test_seed()), g_current.c_str());
    } else if (g_skipped.count(g_current)) {
      skipped++;
    } else {
      passed++;
    }
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

REGISTER_LISTENER("timing", 1, TimingListener);

namespace engine::testing {
void skip_test(const std::string& reason) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_skipped.insert(g_current).second && report_rank())
    std::printf("skipped: %s: %s\n", g_current.c_str(), reason.c_str());
}
}  // namespace engine::testing

int main(int argc, char** argv) {
#ifdef ENGINE_DIST_TESTS
  engine::launch_init(&argc, &argv);
  {  // every rank draws from rank 0's seed
    unsigned long long seed = engine::launch_info().rank == 0 ? engine::testing::test_seed() : 0;
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    if (engine::launch_info().rank != 0) setenv("TEST_SEED", std::to_string(seed).c_str(), 1);
  }
#endif
  int tier = 0;  // 0 fast, 1 full, 2 slow
  if (const char* t = std::getenv("TEST_TIER")) tier = std::strcmp(t, "slow") == 0 ? 2 : std::strcmp(t, "full") == 0;
  std::vector<char*> args;
  bool names_gpu_slow = false;
  for (int i = 0; i < argc; ++i) {
    names_gpu_slow |= std::strstr(argv[i], "gpu-slow") != nullptr;
    if (std::strcmp(argv[i], "--all") == 0 || std::strcmp(argv[i], "--slow") == 0) {
      tier = std::max(tier, argv[i][2] == 's' ? 2 : 1);
      continue;
    }
    args.push_back(argv[i]);
  }
  // Trainer logs stay quiet unless asked for (TEST_VERBOSE=1).
  if (!std::getenv("TEST_VERBOSE")) engine::log_set_level(engine::LogLevel::Warn);
  doctest::Context context;
  if (tier < 1) context.addFilter("test-suite-exclude", "full");
  if (tier < 2) context.addFilter("test-suite-exclude", "slow");
  if (tier < 2 && !names_gpu_slow) context.addFilter("test-suite-exclude", "gpu-slow");
  context.setOption("no-intro", true);
  context.applyCommandLine(static_cast<int>(args.size()), args.data());
  // Only the reporting rank prints doctest's own summary; the others report failures alone.
  if (!report_rank()) context.setOption("minimal", true);
  int code = context.run();
#ifdef ENGINE_DIST_TESTS
  code = dist_all_min(code == 0 ? 1 : 0) ? 0 : 1;
  engine::launch_finalize();
#endif
  return code;
}
