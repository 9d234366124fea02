#include "bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/buffer.h"
#include "core/check.h"
#include "core/rng.h"
#include "bench/kernel_profile.h"

#ifdef ENGINE_CUDA
#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "cuda/common/device.cuh"
#endif

namespace engine::bench {

double time_ms(const std::function<void()>& fn, int warmup, int reps, Timing timing) {
  ENSURE(reps > 0, "time_ms needs at least one repeat");
  if (const char* r = std::getenv("BENCH_REPS"); r && *r) {  // more (or fewer) timed repeats
    char* end = nullptr;
    const long n = std::strtol(r, &end, 10);
    ENSURE(*end == '\0' && n > 0 && n <= 100000, "BENCH_REPS=", r, ": expected a count of repeats (1-100000)");
    reps = static_cast<int>(n);
  }
  if (const char* t = std::getenv("BENCH_TIMING"); t && *t) {
    const std::string v = t;
    ENSURE(v == "per-call" || v == "stream", "BENCH_TIMING=", v, ": expected per-call or stream");
    timing = v == "stream" ? Timing::Stream : Timing::PerCall;
  }
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  static int timed = 0;  // timed cases so far, numbering the optional printouts below
  ++timed;
#ifdef ENGINE_CUDA
  // Every repeat is queued behind the one before (no host wait between them), each between its
  // own pair of events, so an event pair brackets fn's GPU work only: with a wait after each
  // repeat the GPU would drain, and a kernel of ~10 us would be timed with the host's launch
  // latency (several us) in front of it.
  // Stream: a pair of events per group of `reps` calls (see Timing in bench.h).
  cudaStream_t s = static_cast<cudaStream_t>(cuda::compute_stream());
  const bool stream_mode = timing == Timing::Stream;
  const int pairs = stream_mode ? kStreamGroups : reps, per_pair = stream_mode ? reps : 1;
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(pairs));
  for (cudaEvent_t& e : events) CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < pairs; ++i) {
    CUDA_CHECK(cudaEventRecord(events[2 * i], s));
    for (int j = 0; j < per_pair; ++j) fn();
    CUDA_CHECK(cudaEventRecord(events[2 * i + 1], s));
  }
  CUDA_CHECK(cudaEventSynchronize(events.back()));
  for (int i = 0; i < pairs; ++i) {
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]));
    ms.push_back(t / per_pair);
  }
  for (cudaEvent_t& e : events) CUDA_CHECK(cudaEventDestroy(e));
  // BENCH_KERNELS=1: what the timed calls are made of, a per-kernel table of `reps` more calls
  // (times per call), numbered in the order the area times its cases (its results' order).
  if (const char* k = std::getenv("BENCH_KERNELS"); k && *k && std::string(k) != "0") {
    KernelProfile prof;
    std::string why;
    if (prof.start(&why)) {
      for (int i = 0; i < reps; ++i) fn();
      prof.stop();
      std::printf("-- kernels of timed case %d (per call):\n%s", timed, prof.table(reps, 12).c_str());
    } else {
      std::printf("-- kernels of timed case %d: no profile (%s)\n", timed, why.c_str());
    }
    std::fflush(stdout);
  }
#else
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
#endif
  // BENCH_TIMES=1: every repeat in the order run (a median hides a timing with two modes); in
  // the Stream mode every group's time per call.
  if (const char* t = std::getenv("BENCH_TIMES"); t && *t && std::string(t) != "0") {
    std::printf("-- repeats of timed case %d (ms):", timed);
    for (double m : ms) std::printf(" %.3f", m);
    std::printf("\n");
    std::fflush(stdout);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void fill_random(const Tensor& t, const std::string& name, double std) {
  const int64_t n = t.numel(), tile = std::min<int64_t>(n, 1 << 20);
  if (n == 0) return;
  Owned host = empty({tile}, t.dtype, Device::CPU);
  const PhiloxKey key = philox_key(4321, name);
  for (int64_t i = 0; i < tile; ++i) {
    const float v = static_cast<float>(std * philox_normal(key, static_cast<uint64_t>(i)));
    if (t.dtype == DType::BF16) host.ptr<bf16>()[i] = bf16(v);
    else host.ptr<float>()[i] = v;
  }
  const Tensor flat = t.view({n});
  copy_tensor(flat.slice(0, tile), host);
  for (int64_t done = tile; done < n;) {
    const int64_t len = std::min(done, n - done);
    copy_tensor(flat.slice(done, done + len), flat.slice(0, len));
    done += len;
  }
}

static std::vector<Registered>& registry() {
  static std::vector<Registered> r;
  return r;
}

Owned packed_cu_seqlens(int64_t sequences, int64_t length) {
  Owned h = empty({sequences + 1}, DType::I32, Device::CPU);
  for (int64_t s = 0; s <= sequences; ++s) h.ptr<int32_t>()[s] = static_cast<int32_t>(s * length);
  Owned d = empty({sequences + 1}, DType::I32, Device::CUDA);
  copy_tensor(d, h);
  return d;
}

bool register_cases(const std::string& area, Case c) {
  registry().push_back({area, std::move(c)});
  return true;
}

const std::vector<Registered>& registered_cases() { return registry(); }

std::string format(const Result& r) {
  char buf[512];
  std::string perf;
  if (r.flops > 0) {
    const double tflops = r.flops / (r.ms * 1e-3) / 1e12;
    std::snprintf(buf, sizeof buf, "%8.1f TFLOP/s (%5.1f%% of %.0f)", tflops, 100 * tflops / kPeakGemmTflops,
                  kPeakGemmTflops);
    perf += buf;
  }
  if (r.bytes > 0) {
    const double tbps = r.bytes / (r.ms * 1e-3) / 1e12;
    std::snprintf(buf, sizeof buf, "%s%7.0f GB/s (%5.1f%% of copy)", perf.empty() ? "" : "  ", tbps * 1e3,
                  100 * tbps / kCopyTBps);
    perf += buf;
  }
  std::snprintf(buf, sizeof buf, "%-58s %9.3f ms  %s%s%s", r.name.c_str(), r.ms, perf.c_str(),
                r.note.empty() ? "" : "  ", r.note.c_str());
  return buf;
}

}  // namespace engine::bench
