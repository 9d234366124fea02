// Benchmarks of the memory-bound whole-tensor ops (cuda/elementwise, cuda/optim) on 256M
// elements, in GB/s of the bytes each op must move (read + written) against the H200's measured
// copy bandwidth (4.28 TB/s, ../shared/DEVICE.md; the goal is >= 70%). The reductions include
// their read-back to the host (one stream synchronisation, microseconds).
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "core/buffer.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#endif

namespace engine::bench {

BENCH_CASES("elementwise") {
  std::vector<Result> out;
#ifdef ENGINE_CUDA
  if (device::count() == 0) return out;
  const int64_t n = int64_t{256} << 20;
  const double dn = static_cast<double>(n);
  const std::string sz = " n=256M";
  {
    Owned a = empty({n}, DType::F32, Device::CUDA), b = empty({n}, DType::F32, Device::CUDA);
    Owned c = empty({n}, DType::F32, Device::CUDA), h = empty({n}, DType::BF16, Device::CUDA);
    Owned h2 = empty({n}, DType::BF16, Device::CUDA), h3 = empty({n}, DType::BF16, Device::CUDA);
    fill_random(a, "ew.a");
    fill_random(b, "ew.b");
    fill_random(h, "ew.h");
    fill_random(h2, "ew.h2");
    out.push_back({"add f32" + sz, time_ms([&] { ops::add(a, b, c); }), 0, 12 * dn, ""});
    out.push_back({"add bf16" + sz, time_ms([&] { ops::add(h, h2, h3); }), 0, 6 * dn, ""});
    out.push_back({"add_inplace f32" + sz, time_ms([&] { ops::add_inplace(c, b); }), 0, 12 * dn, ""});
    out.push_back({"scale_inplace f32" + sz, time_ms([&] { ops::scale_inplace(c, 0.999); }), 0, 8 * dn, ""});
    out.push_back({"cast f32->bf16" + sz, time_ms([&] { ops::cast(a, h3); }), 0, 6 * dn, ""});
    out.push_back({"cast bf16->f32" + sz, time_ms([&] { ops::cast(h, c); }), 0, 6 * dn, ""});
    out.push_back({"sum_squares f32" + sz, time_ms([&] { (void)ops::sum_squares(a); }), 0, 4 * dn, ""});
    out.push_back({"sum_squares bf16" + sz, time_ms([&] { (void)ops::sum_squares(h); }), 0, 2 * dn, ""});
    out.push_back({"sum f32" + sz, time_ms([&] { (void)ops::sum(a); }), 0, 4 * dn, ""});
    out.push_back({"count_nonfinite f32" + sz, time_ms([&] { (void)ops::count_nonfinite(a); }), 0, 4 * dn, ""});
  }
  {
    Owned p = empty({n}, DType::F32, Device::CUDA), g = empty({n}, DType::F32, Device::CUDA);
    Owned m = zeros({n}, DType::F32, Device::CUDA), v = zeros({n}, DType::F32, Device::CUDA);
    Owned copy = empty({n}, DType::BF16, Device::CUDA);
    fill_random(p, "ew.p");
    fill_random(g, "ew.g");
    ops::AdamWParams o;
    o.lr = 1e-4f;
    o.weight_decay = 0.1f;
    int64_t step = 0;
    auto run = [&](const Tensor& c) {
      o.step = ++step;
      ops::adamw_step(p, g, m, v, o, c);
    };
    out.push_back({"adamw_step f32 + bf16 copy" + sz, time_ms([&] { run(copy); }), 0, 30 * dn, ""});
    out.push_back({"adamw_step f32, no copy" + sz, time_ms([&] { run({}); }), 0, 28 * dn, ""});
  }
#endif
  return out;
}

}  // namespace engine::bench
