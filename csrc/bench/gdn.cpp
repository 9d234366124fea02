// The Gated DeltaNet mixer (ops/delta.h) at the size of a 2048-wide layer: 16 key and 16 value
// heads of 128 channels, bf16, over 8 sequences of 4096 tokens and 1 of 32768, laid out as the
// layer hands them over (q, k, v blocks of the conv's (T, 2 Hk dk + Hv dv) output, a and b blocks
// of in_proj's). FLOPs counted: the chunked form's matrix products at the kernels' chunk of 64
// tokens, per token and value head: K K^T, W = T B_k and Q K^T (64 dk each, halved by causality),
// U = T B_v and the masked Q K^T times D (64 dv each, halved), W S0, Q S0 and the state update
// (2 dk dv each); 2.5x that for the backward. scripts/bench_torch_gdn.py times
// flash-linear-attention's chunk_gated_delta_rule on the same shapes; docs/PERF.md has both.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench.h"

#ifdef ENGINE_CUDA
#include "core/buffer.h"
#include "cuda/common/device.cuh"
#include "ops/delta.h"
#endif

namespace engine::bench {

BENCH_CASES("gdn") {
  std::vector<Result> results;
#ifdef ENGINE_CUDA
  if (device::count() == 0) {
    std::printf("  (no CUDA device: skipped)\n");
    return results;
  }
  constexpr int64_t kH = 16, kD = 128, kW = 3 * kH * kD;
  const DType bf = DType::BF16;
  for (auto [seqs, len] : {std::pair<int64_t, int64_t>{8, 4096}, {1, 32768}}) {
    const int64_t T = seqs * len;
    Owned cu = packed_cu_seqlens(seqs, len);
    Owned qkv = empty({T, kW}, bf, Device::CUDA), ab = empty({T, 2 * kH}, bf, Device::CUDA),
          dout = empty({T, kH * kD}, bf, Device::CUDA);
    fill_random(qkv, "gdn.qkv");
    fill_random(ab, "gdn.ab");
    fill_random(dout, "gdn.do");
    Owned ph = empty({2, kH}, bf, Device::CPU);
    for (int64_t h = 0; h < kH; ++h) {
      ph.ptr<bf16>()[h] = bf16(static_cast<float>(std::log(1.0 + 15.0 * h / (kH - 1))));  // A_log (the layer's init)
      ph.ptr<bf16>()[kH + h] = bf16(1.f);                                                  // dt_bias
    }
    Owned params = empty({2, kH}, bf, Device::CUDA);
    copy_tensor(params, ph);
    ops::DeltaArgs a;
    a.q = ops::ColumnBlock(qkv, 0, kH * kD);
    a.k = ops::ColumnBlock(qkv, kH * kD, kH * kD);
    a.v = ops::ColumnBlock(qkv, 2 * kH * kD, kH * kD);
    a.a = ops::ColumnBlock(ab, 0, kH);
    a.b = ops::ColumnBlock(ab, kH, kH);
    a.A_log = params.t.slice(0, 1).view({kH});
    a.dt_bias = params.t.slice(1, 2).view({kH});
    a.cu_seqlens = cu;
    a.key_heads = kH;
    Owned o = empty({T, kH * kD}, bf, Device::CUDA), dqkv = empty({T, kW}, bf, Device::CUDA),
          dab = empty({T, 2 * kH}, bf, Device::CUDA), pg = zeros({2, kH}, DType::F32, Device::CUDA);
    const double tokens_heads = static_cast<double>(T) * kH;
    const double fwd_flops = tokens_heads * (3.0 * 64 * kD / 2 * 2 + 2.0 * 64 * kD / 2 * 2 + 3 * 2.0 * kD * kD);
    const double act = static_cast<double>(T) * (kW + 2 * kH + kH * kD) * 2;
    char note[160];
    std::snprintf(note, sizeof note, "backward workspaces %.0f MB",
                  static_cast<double>(ops::gated_delta_workspace_bytes(T, seqs, kH, kH, kD, kD, true)) / 1e6);
    double ms = time_ms([&] { ops::gated_delta_forward(a, o); });
    const std::string shape = std::to_string(seqs) + "x" + std::to_string(len) + " H=16 D=128";
    results.push_back({"gdn fwd " + shape, ms, fwd_flops, act, ""});
    ms = time_ms([&] {
      ops::gated_delta_backward(a, dout,
                                {ops::ColumnBlock(dqkv, 0, kH * kD), ops::ColumnBlock(dqkv, kH * kD, kH * kD),
                                 ops::ColumnBlock(dqkv, 2 * kH * kD, kH * kD), ops::ColumnBlock(dab, 0, kH),
                                 ops::ColumnBlock(dab, kH, kH), pg.t.slice(0, 1).view({kH}), pg.t.slice(1, 2).view({kH})});
    });
    results.push_back({"gdn bwd " + shape, ms, 2.5 * fwd_flops, 2 * act, note});
  }
#endif
  return results;
}

}  // namespace engine::bench
