// Benchmark harness shared by the `bench` program's cases: timing with CUDA events (warm-up,
// median of repeats), results as time plus the useful work (FLOPs, bytes that must move), and
// a registry so each area's cases live in their own file (csrc/bench/<area>.cpp).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"

namespace engine::bench {

// Ceilings measured on one H200 (../shared/DEVICE.md): the figures results are judged against.
constexpr double kPeakGemmTflops = 774.0;  // bf16 GEMM 8192^3 through PyTorch
constexpr double kCopyTBps = 4.28;         // device copy, bytes read + written

struct Result {
  std::string name;     // e.g. "rmsnorm fwd T=16384 C=4096"
  double ms = 0;        // median time of one call
  double flops = 0;     // useful floating-point work of one call (0: memory-bound case)
  double bytes = 0;     // bytes one call must read + write at least (0: compute-bound case)
  std::string note;     // anything else worth printing (a peer's figure, memory)
};

// How time_ms brackets the calls with CUDA events. Either way the calls are queued back to back
// on the compute stream (no host wait between them), so the figure is fn's GPU time without the
// host's launch latency (which a wait after every call would put in front of each kernel).
//   PerCall: an event pair around every call; the median of `reps` calls. An event between two
//     kernels makes the second start only after the first has finished and drained, so each
//     call also pays the gap between kernels.
//   Stream: kStreamGroups groups of `reps` calls with no event inside a group; the median over
//     the groups of (group time / reps). Consecutive kernels run as in a training step, where a
//     kernel launched as a programmatic dependent (cuda/common/launch.cuh) is resident before
//     the one ahead has finished. The memory-bound cases use it.
// BENCH_TIMING=per-call or =stream overrides the mode of every case (for comparisons).
enum class Timing { PerCall, Stream };
constexpr int kStreamGroups = 5;

// Median milliseconds of one fn() call over the timed calls (see Timing) after `warmup` untimed
// ones, measured with CUDA events on the compute stream (requires a GPU).
double time_ms(const std::function<void()>& fn, int warmup = 3, int reps = 10,
               Timing timing = Timing::PerCall);

// Fills a bf16 or f32 tensor (any device) with N(0, std^2) values keyed by `name`: a tile of up
// to 1M elements made on the host, copied over the tensor in doubling copies (cheap at any size;
// GEMM power, hence clocks, depends on the data, so it must not be constant).
void fill_random(const Tensor& t, const std::string& name, double std = 1.0);

// cu_seqlens (sequences + 1) i32 on the GPU of `sequences` packed documents of `length` tokens.
Owned packed_cu_seqlens(int64_t sequences, int64_t length);

using Case = std::function<std::vector<Result>()>;
// Registers a named group of cases ("gemm", "attention", ...); returns true (for static init).
bool register_cases(const std::string& area, Case c);
struct Registered {
  std::string area;
  Case run;
};
const std::vector<Registered>& registered_cases();

// One formatted line: name, ms, TFLOP/s and % of the GEMM peak, GB/s and % of copy bandwidth.
std::string format(const Result& r);

}  // namespace engine::bench

// In a bench case file: BENCH_CASES("area") { ... return results; }
#define BENCH_CONCAT_(a, b) a##b
#define BENCH_CONCAT(a, b) BENCH_CONCAT_(a, b)
#define BENCH_CASES(area)                                                                 \
  static std::vector<::engine::bench::Result> BENCH_CONCAT(bench_fn_, __LINE__)();        \
  static const bool BENCH_CONCAT(bench_reg_, __LINE__) =                                  \
      ::engine::bench::register_cases(area, BENCH_CONCAT(bench_fn_, __LINE__));           \
  static std::vector<::engine::bench::Result> BENCH_CONCAT(bench_fn_, __LINE__)()
