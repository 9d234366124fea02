// Shared test helpers: the run's seed (TEST_SEED to replay), random tensors, a comparison that
// reports the relative RMS error, its scale and the worst elements, and GPU/slow-tier skips.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/rng.h"

namespace engine::testing {

// The seed of this test run: TEST_SEED from the environment, else fresh from the clock. Printed
// once at start and on every failure so the failing run can be replayed exactly.
uint64_t test_seed();
// A key for one purpose within one test: philox_key(test_seed(), name).
PhiloxKey test_key(const std::string& name);

// Tensors on the CPU filled from the test seed: normal(0, std) or uniform ints in [lo, hi).
Owned randn(Shape s, DType dtype, const std::string& name, double std = 1.0);
Owned randint(Shape s, int64_t lo, int64_t hi, const std::string& name);
// Poison: fills with NaN (floats) or 0x7f bytes so unwritten outputs fail the comparison.
void poison(const Tensor& t);

// A copy of a CPU tensor on `device` in `dtype` (floats converted with ops::cast; ints copied).
Owned to_device(const Tensor& host, Device device, DType dtype);
Owned to_device(const Tensor& host, Device device);  // same dtype
// A CPU copy of any tensor in `dtype` (f64 for comparisons).
Owned to_host(const Tensor& t, DType dtype);

// Element i of a float tensor on the CPU as double.
double get(const Tensor& t, int64_t i);
void set(const Tensor& t, int64_t i, double v);
std::vector<double> to_vector(const Tensor& t);  // any device, float dtypes
// cu_seqlens (S + 1) i32 on the CPU of documents of these lengths.
Owned cu_from(const std::vector<int32_t>& lengths);

struct Comparison {
  double rel_rms = 0;  // rms(a - b) / rms(ref)
  double scale = 0;    // rms(ref)
  int64_t nonfinite = 0;
  std::string report;  // shape, error, scale and the worst elements with their indices
};
// Compares `got` against `ref` (same numel, any float dtypes, either device).
Comparison compare(const Tensor& got, const Tensor& ref, const std::string& what = "");

// CHECK that got matches ref to a relative RMS error of at most tol (and no NaN/inf in got).
#define CHECK_CLOSE(got, ref, tol)                                                         \
  do {                                                                                     \
    auto cmp_ = ::engine::testing::compare((got), (ref), #got " vs " #ref);                \
    INFO(cmp_.report);                                                                     \
    CHECK(cmp_.nonfinite == 0);                                                            \
    CHECK(cmp_.rel_rms <= (tol));                                                          \
  } while (0)

// Per-row values (losses, log-sum-exps) compared row by row: the worst |got - ref| / max(|ref|,
// floor). For values whose rounding error scales with the terms that made them rather than with
// the value itself (a log-sum-exp of terms near 1 rounds at ~1e-7 absolute, however close to 0
// it lands), where a relative RMS over the tensor fails on rows near 0.
struct RowComparison {
  double worst = 0;  // a NaN or inf in got or ref (or 0 / 0 with floor 0): inf
  int64_t row = 0;
  std::string report;
};
RowComparison compare_rows(const Tensor& got, const Tensor& ref, double floor,
                           const std::string& what = "");

// CHECK that every row of got is within tol max(|ref|, floor) of ref.
#define CHECK_ROWS_CLOSE(got, ref, tol, floor)                                             \
  do {                                                                                     \
    auto rows_ = ::engine::testing::compare_rows((got), (ref), (floor), #got " vs " #ref); \
    INFO(rows_.report);                                                                    \
    CHECK(rows_.worst <= (tol));                                                           \
  } while (0)

// True when a CUDA device is usable; otherwise records a skip with the reason and returns false.
bool gpu_available_or_skip();
// For multi-rank GPU cases: a GPU per rank (ranks = the world's size) and, with required > 0,
// exactly that many ranks; otherwise records the skip and returns false.
bool gpus_for_ranks_or_skip(int ranks, int required = 0);
// Records that the current test case was skipped, with a reason (counted in the summary).
void skip_test(const std::string& reason);

// The message f throws ("" when it does not throw).
std::string error_of(const std::function<void()>& f);

// Silences the expected warnings (fallbacks, config changes) while alive, unless TEST_VERBOSE;
// then back to the runner's level (Warn, or Info with TEST_VERBOSE).
struct QuietLogs {
  QuietLogs();
  ~QuietLogs();
};

// For the multi-rank suite: a fresh folder every rank of the world sees,
// <temp>/engine_dist_<group>.<rank 0's pid>/<name>, removed with its parent at the end.
struct SharedDir {
  std::string path;
  SharedDir(const std::string& group, const std::string& name);
  ~SharedDir();
  std::string rank_dir() const;  // this rank's own folder inside (made on first call)
};

}  // namespace engine::testing
