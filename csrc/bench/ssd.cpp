// The Mamba-2 scan (ops/ssd.h) at the size of a 2048-wide layer: 64 heads of 64 channels
// (expand 2), one group of 128 states, bf16, over 8 sequences of 4096 tokens and 1 of 32768, laid
// out as the layer hands them over (x, B, C blocks of the conv's (T, H P + 2 N) output, dt a block
// of in_proj's). FLOPs counted: the chunked form's matrix products at the kernels' sub-chunk of
// 32 tokens (C B^T and the masked decays times U: 2 L (N + P) per token and head, each halved by
// causality; C S^T and U^T B: 4 P N per token and head), 2x forward for the backward's five
// products of the same sizes (they count 2.5x); the chunk states in the note.
// scripts/bench_torch_ssd.py times flash-linear-attention's chunk_simple_gla (the same
// recurrence: q = C, k = B, v = delta x, g = delta A) on the same shapes; docs/PERF.md has both.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench.h"

#ifdef ENGINE_CUDA
#include "core/buffer.h"
#include "cuda/common/device.cuh"
#include "ops/ssd.h"
#endif

namespace engine::bench {

BENCH_CASES("ssd") {
  std::vector<Result> results;
#ifdef ENGINE_CUDA
  if (device::count() == 0) {
    std::printf("  (no CUDA device: skipped)\n");
    return results;
  }
  constexpr int64_t kH = 64, kP = 64, kN = 128, kW = kH * kP + 2 * kN;
  const DType bf = DType::BF16;
  for (auto [seqs, len] : {std::pair<int64_t, int64_t>{8, 4096}, {1, 32768}}) {
    const int64_t T = seqs * len;
    Owned cu = packed_cu_seqlens(seqs, len);
    Owned xbc = empty({T, kW}, bf, Device::CUDA), dt = empty({T, kH}, bf, Device::CUDA), dy = empty({T, kH * kP}, bf, Device::CUDA);
    fill_random(xbc, "ssd.xbc");
    fill_random(dt, "ssd.dt", 0.5);
    fill_random(dy, "ssd.dy");
    Owned ph = empty({3, kH}, bf, Device::CPU);
    for (int64_t h = 0; h < kH; ++h) {
      ph.ptr<bf16>()[h] = bf16(static_cast<float>(std::log(1.0 + 15.0 * h / (kH - 1))));  // A_log
      ph.ptr<bf16>()[kH + h] = bf16(1.f);                                                  // D
      ph.ptr<bf16>()[2 * kH + h] = bf16(static_cast<float>(std::log(std::expm1(0.001 + 0.1 * h / (kH - 1)))));
    }
    Owned params = empty({3, kH}, bf, Device::CUDA);
    copy_tensor(params, ph);
    ops::SsdArgs a;
    a.x = ops::ColumnBlock(xbc, 0, kH * kP);
    a.B = ops::ColumnBlock(xbc, kH * kP, kN);
    a.C = ops::ColumnBlock(xbc, kH * kP + kN, kN);
    a.dt = dt;
    a.A_log = params.t.slice(0, 1).view({kH});
    a.D = params.t.slice(1, 2).view({kH});
    a.dt_bias = params.t.slice(2, 3).view({kH});
    a.cu_seqlens = cu;
    a.head_dim = kP;
    const int64_t chunks = ops::scan_num_chunks(T, a.chunk_len);
    Owned states = empty({chunks, kH, kP, kN}, DType::F32, Device::CUDA), y = empty({T, kH * kP}, bf, Device::CUDA);
    Owned dxbc = empty({T, kW}, bf, Device::CUDA), ddt = empty({T, kH}, bf, Device::CUDA);
    Owned pg = zeros({3, kH}, DType::F32, Device::CUDA);
    const double tokens_heads = static_cast<double>(T) * kH;
    const double fwd_flops = tokens_heads * (2.0 * 32 * (kN + kP) / 2 + 4.0 * kP * kN);
    const double act = static_cast<double>(T) * (kW + kH + kH * kP) * 2;
    char note[160];
    std::snprintf(note, sizeof note, "chunk states %.0f MB", static_cast<double>(states.t.nbytes()) / 1e6);
    double ms = time_ms([&] { ops::ssd_scan_forward(a, y, states); });
    const std::string shape = std::to_string(seqs) + "x" + std::to_string(len) + " H=64 P=64 N=128";
    results.push_back({"ssd scan fwd " + shape, ms, fwd_flops, act, note});
    ms = time_ms([&] {
      ops::ssd_scan_backward(a, dy, states,
                             {ops::ColumnBlock(dxbc, 0, kH * kP), ddt, ops::ColumnBlock(dxbc, kH * kP, kN),
                              ops::ColumnBlock(dxbc, kH * kP + kN, kN), pg.t.slice(0, 1).view({kH}),
                              pg.t.slice(1, 2).view({kH}), pg.t.slice(2, 3).view({kH})});
    });
    results.push_back({"ssd scan bwd " + shape, ms, 2.5 * fwd_flops, 2 * act, note});
  }
#endif
  return results;
}

}  // namespace engine::bench
