// Collective bandwidth over the world (run under mpirun with one GPU per rank): all-reduce,
// reduce-scatter, all-gather, and reduces onto / broadcasts from each rank's range (ZeRO's
// gradient and weight paths) of large buffers through NCCL,
// reported as bus bandwidth (nccl-tests' convention: all-reduce moves 2 (n-1)/n of the buffer per
// rank, the others (n-1)/n).
#include <cstdio>

#include "bench/bench.h"
#include "comm/comm.h"
#include "comm/nccl_comm.h"
#include "core/buffer.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#endif

namespace engine::bench {

BENCH_CASES("comm") {
  std::vector<Result> out;
#ifdef ENGINE_CUDA
  const int n = world().size();
  if (n < 2 || device::count() == 0) {
    out.push_back({"comm: needs mpirun with >= 2 ranks and GPUs (skipped)", 0, 0, 0, ""});
    return out;
  }
  auto comm = make_nccl_comm(world());
  for (int64_t mib : {64, 256, 1024}) {
    const int64_t elems = mib * (1 << 20) / 4;
    Owned buf = zeros({elems}, DType::F32, Device::CUDA);
    Owned shard = zeros({elems / n}, DType::F32, Device::CUDA);
    const double bytes = static_cast<double>(elems) * 4;
    auto report = [&](const char* what, double ms, double factor) {
      Result r;
      r.name = std::string("nccl ") + what + " f32 " + std::to_string(mib) + " MiB, " + std::to_string(n) + " ranks";
      r.ms = ms;
      char note[96];
      std::snprintf(note, sizeof note, "bus bandwidth %.0f GB/s", factor * bytes / (ms * 1e-3) / 1e9);
      r.note = note;
      out.push_back(r);
    };
    report("all_reduce", time_ms([&] { comm->all_reduce(buf); }), 2.0 * (n - 1) / n);
    report("reduce_scatter", time_ms([&] { comm->reduce_scatter(buf, shard); }), (n - 1.0) / n);
    report("all_gather", time_ms([&] { comm->all_gather(shard, buf); }), (n - 1.0) / n);
    // ZeRO 2/3's gradient path: each rank's range reduced onto it alone (as a reduce-scatter).
    const int64_t k = elems / n;
    report("reduce onto each owner", time_ms([&] {
             for (int r = 0; r < n; ++r) comm->reduce_async(buf->slice(r * k, (r + 1) * k), r);
             comm->wait_async();
           }), (n - 1.0) / n);
    // ZeRO's weight path: each rank's range broadcast from it (as an all-gather).
    report("broadcast from each owner", time_ms([&] {
             for (int r = 0; r < n; ++r) comm->broadcast_async(buf->slice(r * k, (r + 1) * k), r);
             comm->wait_async();
           }), (n - 1.0) / n);
  }
#else
  out.push_back({"comm: built without CUDA (skipped)", 0, 0, 0, ""});
#endif
  return out;
}

}  // namespace engine::bench
