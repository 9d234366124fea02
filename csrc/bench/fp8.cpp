// Benchmarks of the FP8 ops (ops/fp8.h) beside bf16 in the same run: the scaled e4m3 product
// through cuBLASLt at 8192^3 and on the 0.89B Llama's linears (T = 16384, hidden 2048), per
// tensor and per row, each against the bf16 GEMM of the same shape; and the scaling kernels
// (amax, quantise, quantise transposed, both layouts at once) on one activation (16384, 2048) in GB/s.
// The three products of a linear (T, in) -> (T, out), weight W (out, in), as FP8 runs them (both
// operands K-contiguous): fwd Y = X W^T (a = X, b = W), dgrad dX = dY (W^T)^T (b = W^T, the
// transposed copy), wgrad dW = dY^T (X^T)^T (a = dY^T, b = X^T), all e4m3 here.
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "core/buffer.h"
#include "ops/fp8.h"
#include "ops/gemm.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#endif

namespace engine::bench {
namespace {

#ifdef ENGINE_CUDA
using ops::Fp8Format;

// A random (rows, cols) e4m3 operand with its per-tensor and per-row inverse scales (the bytes
// are the per-tensor quantisation: the timing does not depend on which).
struct Fp8Operand {
  Owned q, scale1, scale_rows;
};
Fp8Operand operand(int64_t rows, int64_t cols, const std::string& name) {
  Owned x = empty({rows, cols}, DType::BF16, Device::CUDA);
  fill_random(x, name, 1.0);
  Fp8Operand o{empty({rows, cols}, DType::U8, Device::CUDA), empty({1}, DType::F32, Device::CUDA),
               empty({rows}, DType::F32, Device::CUDA)};
  Owned amax = empty({rows}, DType::F32, Device::CUDA), amax1 = empty({1}, DType::F32, Device::CUDA);
  ops::fp8_amax(x, false, amax);
  ops::fp8_quantize(x, false, amax, Fp8Format::E4M3, o.q, o.scale_rows);
  ops::fp8_amax(x, false, amax1);
  ops::fp8_quantize(x, false, amax1, Fp8Format::E4M3, o.q, o.scale1);
  return o;
}

void products(std::vector<Result>& out, const std::string& base, int64_t m, int64_t n, int64_t k) {
  const Fp8Operand a = operand(m, k, "fp8.a"), b = operand(n, k, "fp8.b");
  Owned c = empty({m, n}, DType::BF16, Device::CUDA);
  Owned ab = empty({m, k}, DType::BF16, Device::CUDA), bb = empty({n, k}, DType::BF16, Device::CUDA);
  fill_random(ab, "fp8.a16", 1.0);
  fill_random(bb, "fp8.b16", 1.0);
  const double flops = 2.0 * m * n * k;
  const double bf16 = time_ms([&] { ops::matmul(ab, false, bb, true, c, {}); });
  out.push_back({base + " bf16 NT", bf16, flops, 0, ""});
  const double t1 = time_ms([&] { ops::fp8_matmul(a.q, Fp8Format::E4M3, a.scale1, b.q, Fp8Format::E4M3, b.scale1, c, 0.f); });
  out.push_back({base + " e4m3 per tensor", t1, flops, 0, std::to_string(bf16 / t1).substr(0, 4) + "x bf16"});
  const double tr = time_ms([&] {
    ops::fp8_matmul(a.q, Fp8Format::E4M3, a.scale_rows, b.q, Fp8Format::E4M3, b.scale_rows, c, 0.f);
  });
  out.push_back({base + " e4m3 per row", tr, flops, 0, std::to_string(bf16 / tr).substr(0, 4) + "x bf16"});
}
#endif

}  // namespace

BENCH_CASES("fp8") {
  std::vector<Result> out;
#ifdef ENGINE_CUDA
  if (device::count() == 0) return out;
  products(out, "8192^3", 8192, 8192, 8192);
  struct Shape3 {
    const char* name;
    int64_t m, n, k;
  };
  const int64_t t = 16384;
  const Shape3 shapes[] = {
      {"llama-0.89B gate_up fwd", t, 11264, 2048}, {"llama-0.89B gate_up dgrad", t, 2048, 11264},
      {"llama-0.89B gate_up wgrad", 11264, 2048, t}, {"llama-0.89B down fwd", t, 2048, 5632},
      {"llama-0.89B qkv fwd", t, 4096, 2048},       {"llama-0.89B o fwd", t, 2048, 2048},
  };
  for (const Shape3& s : shapes) products(out, s.name, s.m, s.n, s.k);
  Owned x = empty({t, 2048}, DType::BF16, Device::CUDA), q = empty({t, 2048}, DType::U8, Device::CUDA);
  Owned qt = empty({2048, t}, DType::U8, Device::CUDA), amax = empty({1}, DType::F32, Device::CUDA);
  Owned amax_rows = empty({t}, DType::F32, Device::CUDA), amax_cols = empty({2048}, DType::F32, Device::CUDA);
  Owned inv = empty({1}, DType::F32, Device::CUDA), inv_rows = empty({t}, DType::F32, Device::CUDA);
  fill_random(x, "fp8.x", 1.0);
  const double in_bytes = 2.0 * t * 2048, out_bytes = 1.0 * t * 2048;
  out.push_back({"amax per tensor (16384, 2048) bf16", time_ms([&] { ops::fp8_amax(x, false, amax); }, 3, 20, Timing::Stream),
                 0, in_bytes, ""});
  out.push_back({"amax per row", time_ms([&] { ops::fp8_amax(x, false, amax_rows); }, 3, 20, Timing::Stream), 0, in_bytes, ""});
  out.push_back({"amax per column", time_ms([&] { ops::fp8_amax(x, true, amax_cols); }, 3, 20, Timing::Stream), 0, in_bytes, ""});
  out.push_back({"quantize e4m3 per tensor",
                 time_ms([&] { ops::fp8_quantize(x, false, amax, Fp8Format::E4M3, q, inv); }, 3, 20, Timing::Stream), 0,
                 in_bytes + out_bytes, ""});
  out.push_back({"quantize e4m3 per row",
                 time_ms([&] { ops::fp8_quantize(x, false, amax_rows, Fp8Format::E4M3, q, inv_rows); }, 3, 20, Timing::Stream),
                 0, in_bytes + out_bytes, ""});
  out.push_back({"quantize e4m3 transposed",
                 time_ms([&] { ops::fp8_quantize(x, true, amax, Fp8Format::E4M3, qt, inv); }, 3, 20, Timing::Stream), 0,
                 in_bytes + out_bytes, ""});
  Owned inv_t = empty({1}, DType::F32, Device::CUDA);
  out.push_back({"quantize e4m3 pair (x and x^T, one read)",
                 time_ms([&] { ops::fp8_quantize_pair(x, amax, amax, Fp8Format::E4M3, q, inv, qt, inv_t); }, 3, 20,
                         Timing::Stream),
                 0, in_bytes + 2 * out_bytes, ""});
#endif
  return out;
}

}  // namespace engine::bench
