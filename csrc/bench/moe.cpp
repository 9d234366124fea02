// Benchmarks of the mixture-of-experts grouped GEMM on each of its kernels (ops::GroupedKernel:
// Portable, cuda/moe/grouped_gemm.cu's mma.sync; Hopper, on sm_90 the TMA wgmma kernel of
// grouped_gemm_sm90.cu) against a loop of cuBLASLt GEMMs over the experts (ops::matmul on each
// expert's rows, host-known row counts), in TFLOP/s of useful work (2 x rows x K x N, padding
// rows not counted), for the three products:
//   fwd   Y_e = X_e W_e^T             (rows, K) x (N, K)^T -> (rows, N) bf16
//   dgrad dX_e = dY_e W_e             (rows, N) x (N, K)   -> (rows, K) bf16 (mma.sync, and on
//         sm_90 the TMA wgmma kernel reading W_e MN-major)
//   wgrad dW_e += dY_e^T X_e          f32 accumulation into (E, N, K) (mma.sync, and on sm_90
//         the TMA wgmma kernel reading dY and X MN-major)
// Shapes (scripts/bench_torch_moe.py times torch._grouped_mm and a torch.matmul loop on the same):
//   balanced  8 experts sharing 32768 rows evenly (4096 each), 4096 -> 7168: the reading of
//             ../shared/DEVICE.md's "8 experts, 32768 tokens, 4096 -> 7168"
//   skewed    8 experts, 32768 rows, one expert with 24576 (75 %), the others 1168 or 1184
//   small     64 experts x 80 rows (5120 rows), 2048 -> 2816 (fine-grained experts, gate|up)
// And the whole layer (layers::Moe) forward and backward at T = 16384, C = 2048, F = 5632,
// E = 8, k = 2 (its GEMM FLOPs: 3 products of 2 T k C F each forward, twice that backward, plus
// the router).
//
// Figures: docs/PERF.md. BENCH_MOE_CASES=balanced,skewed,small,layer picks cases,
// BENCH_MOE_KERNELS=tma times the Hopper (TMA wgmma) kernel's three products alone.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "core/buffer.h"
#include "layers/moe.h"
#include "ops/gemm.h"
#include "ops/moe.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#include "cuda/moe/moe.cuh"
#endif

namespace engine::bench {
namespace {

#ifdef ENGINE_CUDA
struct GroupedCase {
  std::string name;
  std::vector<int32_t> counts;
  int64_t k, n;
};

std::vector<Result> grouped_case(const GroupedCase& c) {
  const int64_t E = static_cast<int64_t>(c.counts.size());
  Owned counts = empty({E}, DType::I32, Device::CPU), offsets = empty({E + 1}, DType::I32, Device::CPU);
  int64_t rows = 0;
  offsets.ptr<int32_t>()[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    counts.ptr<int32_t>()[e] = c.counts[e];
    rows += c.counts[e];
    offsets.ptr<int32_t>()[e + 1] = static_cast<int32_t>(
        offsets.ptr<int32_t>()[e] +
        (c.counts[e] + ops::kMoeRowAlign - 1) / ops::kMoeRowAlign * ops::kMoeRowAlign);
  }
  const int64_t R = offsets.ptr<int32_t>()[E];
  Owned dcounts = empty({E}, DType::I32, Device::CUDA), doffsets = empty({E + 1}, DType::I32, Device::CUDA);
  copy_tensor(dcounts, counts);
  copy_tensor(doffsets, offsets);
  Owned x = empty({R, c.k}, DType::BF16, Device::CUDA), w = empty({E, c.n, c.k}, DType::BF16, Device::CUDA);
  Owned y = empty({R, c.n}, DType::BF16, Device::CUDA), dx = empty({R, c.k}, DType::BF16, Device::CUDA);
  Owned dw = zeros({E, c.n, c.k}, DType::F32, Device::CUDA);
  fill_random(x, "moe.x", 1.0);
  fill_random(w, "moe.w", 0.02);
  fill_random(y, "moe.dy", 1.0);  // dY of the backward cases
  const double flops = 2.0 * rows * c.k * c.n;
  auto loop = [&](auto&& gemm) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets.ptr<int32_t>()[e], n = c.counts[e];
      if (n) gemm(r0, n, w->slice(e, e + 1).view({c.n, c.k}), dw->slice(e, e + 1).view({c.n, c.k}));
    }
  };
  const std::string base = c.name + " E=" + std::to_string(E) + " rows=" + std::to_string(rows) +
                           " " + std::to_string(c.k) + "->" + std::to_string(c.n);
  std::vector<Result> out;
  const bool hopper = cuda::grouped_hopper_available();
  const ops::GroupedLinearOptions portable{ops::GroupedKernel::Portable}, tma{ops::GroupedKernel::Hopper};
  // BENCH_MOE_KERNELS=tma: the Hopper kernel's three products only (comparisons of its builds).
  const char* only_kernels = std::getenv("BENCH_MOE_KERNELS");
  if (only_kernels != nullptr && std::string(only_kernels) == "tma") {
    if (!hopper) return out;
    out.push_back({base + " fwd grouped wgmma TMA",
                   time_ms([&] { ops::grouped_linear_forward(x, w, doffsets, dcounts, y, tma); }), flops, 0, ""});
    out.push_back({base + " dgrad grouped wgmma TMA (W MN-major)",
                   time_ms([&] { ops::grouped_linear_backward_input(y, w, doffsets, dcounts, dx, tma); }), flops, 0, ""});
    out.push_back({base + " wgrad grouped wgmma TMA (dY, X MN-major) f32+=",
                   time_ms([&] { ops::grouped_linear_backward_weight(y, x, doffsets, dcounts, dw, tma); }), flops, 0, ""});
    return out;
  }
  out.push_back({base + " fwd grouped mma.sync",
                 time_ms([&] { ops::grouped_linear_forward(x, w, doffsets, dcounts, y, portable); }), flops, 0, ""});
  if (hopper)
    out.push_back({base + " fwd grouped wgmma TMA",
                   time_ms([&] { ops::grouped_linear_forward(x, w, doffsets, dcounts, y, tma); }), flops, 0, ""});
  out.push_back({base + " fwd cuBLASLt loop", time_ms([&] {
                   loop([&](int64_t r0, int64_t n, const Tensor& we, const Tensor&) {
                     ops::matmul(x->slice(r0, r0 + n), false, we, true, y->slice(r0, r0 + n), {});
                   });
                 }),
                 flops, 0, ""});
  out.push_back({base + " dgrad grouped mma.sync",
                 time_ms([&] { ops::grouped_linear_backward_input(y, w, doffsets, dcounts, dx, portable); }), flops, 0, ""});
  if (hopper)
    out.push_back({base + " dgrad grouped wgmma TMA (W MN-major)",
                   time_ms([&] { ops::grouped_linear_backward_input(y, w, doffsets, dcounts, dx, tma); }), flops, 0, ""});
  out.push_back({base + " dgrad cuBLASLt loop", time_ms([&] {
                   loop([&](int64_t r0, int64_t n, const Tensor& we, const Tensor&) {
                     ops::matmul(y->slice(r0, r0 + n), false, we, false, dx->slice(r0, r0 + n), {});
                   });
                 }),
                 flops, 0, ""});
  out.push_back({base + " wgrad grouped mma.sync f32+=",
                 time_ms([&] { ops::grouped_linear_backward_weight(y, x, doffsets, dcounts, dw, portable); }), flops, 0, ""});
  if (hopper)
    out.push_back({base + " wgrad grouped wgmma TMA (dY, X MN-major) f32+=",
                   time_ms([&] { ops::grouped_linear_backward_weight(y, x, doffsets, dcounts, dw, tma); }), flops, 0, ""});
  out.push_back({base + " wgrad cuBLASLt loop f32+=", time_ms([&] {
                   loop([&](int64_t r0, int64_t n, const Tensor&, const Tensor& dwe) {
                     ops::matmul(y->slice(r0, r0 + n), true, x->slice(r0, r0 + n), false, dwe, {1.f, 1.f, {}});
                   });
                 }),
                 flops, 0, ""});
  return out;
}

// One expert with 75 % of the rows; all counts multiples of 16 (torch._grouped_mm's alignment).
std::vector<int32_t> skewed_counts() { return {24576, 1168, 1168, 1168, 1168, 1168, 1168, 1184}; }

std::vector<Result> layer_case() {
  layers::MoeConfig c{.hidden_size = 2048, .ffn_hidden_size = 5632, .num_experts = 8, .top_k = 2,
                      .aux_loss_coef = 0.01f, .z_loss_coef = 0.001f, .num_layers = 16};
  const int64_t T = 16384;
  ParamTable t;
  layers::Moe::declare(t, "moe", c);
  ParamStore store(t, Device::CUDA, DType::BF16);
  fill_random(store.weights_flat(), "moe.layer.w", 0.02);
  layers::Moe moe(store, "moe", c);
  const layers::Env env{Device::CUDA, DType::BF16};
  Owned x = empty({T, c.hidden_size}, DType::BF16, Device::CUDA), y = empty(x->shape, DType::BF16, Device::CUDA);
  Owned dy = empty(x->shape, DType::BF16, Device::CUDA), dx = empty(x->shape, DType::BF16, Device::CUDA);
  fill_random(x, "moe.layer.x", 1.0);
  fill_random(dy, "moe.layer.dy", 1.0);
  layers::MoeSaved s;
  const double gemm = 2.0 * T * c.top_k * c.hidden_size * c.ffn_hidden_size * 3 + 2.0 * T * c.hidden_size * c.num_experts;
  const std::string base = "moe layer T=16384 C=2048 F=5632 E=8 k=2";
  std::vector<Result> out;
  out.push_back({base + " fwd", time_ms([&] { moe.forward(env, x, y, s); }), gemm, 0, ""});
  moe.forward(env, x, y, s);
  out.push_back({base + " bwd", time_ms([&] { moe.backward(env, dy, x, s, dx, 1.f); }), 2 * gemm, 0, ""});
  return out;
}
#endif

}  // namespace

BENCH_CASES("moe") {
  std::vector<Result> out;
#ifdef ENGINE_CUDA
  if (device::count() == 0) return out;
  const std::vector<GroupedCase> cases = {
      {"balanced", std::vector<int32_t>(8, 4096), 4096, 7168},
      {"skewed", skewed_counts(), 4096, 7168},
      {"small", std::vector<int32_t>(64, 80), 2048, 2816},
      // One expert: the GPT-2 162M MLP's dense products (fc1 768 -> 3072, fc2 3072 -> 768) at
      // 32 x 1024 tokens, beside cuBLASLt on the same shapes.
      {"gpt2-fc1", std::vector<int32_t>(1, 32768), 768, 3072},
      {"gpt2-fc2", std::vector<int32_t>(1, 32768), 3072, 768},
  };
  // BENCH_MOE_CASES: a comma-separated subset of balanced, skewed, small, gpt2-fc1, gpt2-fc2,
  // layer (default all).
  const char* only = std::getenv("BENCH_MOE_CASES");
  auto wanted = [&](const std::string& name) {
    return only == nullptr || ("," + std::string(only) + ",").find("," + name + ",") != std::string::npos;
  };
  for (const GroupedCase& c : cases)
    if (wanted(c.name))
      for (Result& r : grouped_case(c)) out.push_back(std::move(r));
  if (!out.empty()) out.front().note = "peer: torch._grouped_mm 760 TFLOP/s (DEVICE.md)";
  if (wanted("layer"))
    for (Result& r : layer_case()) out.push_back(std::move(r));
#endif
  return out;
}

}  // namespace engine::bench
