// Mamba mixer kernels at training sizes: Di = 4096 channels, N = 16 states, K = 4, bf16, over
// 8 sequences of 4096 tokens and 1 of 32768 (32768 tokens each), laid out as the layer hands
// them over (x and z the halves of in_proj's (T, 2 Di) output, B and C of a (T, 2N) block).
// Bytes that must move (read + written once, bf16):
//   conv fwd: x, y                      conv bwd: x, dy, dx            (+ the (Di, K) weights)
//   scan fwd: x, dt, z, y, B, C         scan bwd: x, dt, z, dy, dx, ddt, dz, B, C, dB, dC
// (parameters and their f32 gradients are a few hundred KB; the scan's chunk states, which the
// design adds, are in the note). The scan is bound by exp and instruction issue: one ex2 per
// (token, channel, state) per pass, two passes forward, three backward (see cuda/mamba/scan.cu),
// at 16 ex2 per clock and multiprocessor. The last case is the whole layer (C = 2048, its GEMMs
// included) forward + backward, for scale. Figures, and PyTorch's on the same shapes
// (scripts/bench_torch_mamba.py): docs/PERF.md.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench.h"

#ifdef ENGINE_CUDA
#include "core/buffer.h"
#include "core/params.h"
#include "cuda/common/device.cuh"
#include "layers/mamba.h"
#include "ops/mamba.h"
#endif

namespace engine::bench {
namespace {

#ifdef ENGINE_CUDA

// A (rows, cols) bf16 device tensor whose element (i, j) is f(i, j).
template <typename F>
Owned device_filled(int64_t rows, int64_t cols, F&& f) {
  Owned h = empty({rows, cols}, DType::BF16, Device::CPU);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) h.ptr<bf16>()[i * cols + j] = bf16(static_cast<float>(f(i, j)));
  Owned d = empty({rows, cols}, DType::BF16, Device::CUDA);
  copy_tensor(d, h);
  return d;
}

std::string label(const char* op, int64_t seqs, int64_t len, int64_t di) {
  return std::string(op) + " " + std::to_string(seqs) + "x" + std::to_string(len) + " Di=" + std::to_string(di) +
         " N=16";
}

#endif

}  // namespace

BENCH_CASES("mamba") {
  std::vector<Result> results;
#ifdef ENGINE_CUDA
  if (device::count() == 0) {
    std::printf("  (no CUDA device: skipped)\n");
    return results;
  }
  constexpr int64_t kDi = 4096, kN = 16, kK = 4;
  const DType bf = DType::BF16;
  for (auto [seqs, len] : {std::pair<int64_t, int64_t>{8, 4096}, {1, 32768}}) {
    const int64_t T = seqs * len;
    const double act = static_cast<double>(T) * kDi * 2, bcb = static_cast<double>(T) * kN * 2;
    Owned cu = packed_cu_seqlens(seqs, len);
    Owned xz = empty({T, 2 * kDi}, bf, Device::CUDA), dt = empty({T, kDi}, bf, Device::CUDA),
          bc = empty({T, 2 * kN}, bf, Device::CUDA), dy = empty({T, kDi}, bf, Device::CUDA);
    fill_random(xz, "mamba.xz");
    fill_random(dt, "mamba.dt", 0.5);
    fill_random(bc, "mamba.bc");
    fill_random(dy, "mamba.dy");
    Owned conv_w = device_filled(kDi, kK, [](int64_t i, int64_t j) { return 0.1 * ((i + 3 * j) % 7 - 3); });
    Owned conv_b = device_filled(kDi, 1, [](int64_t i, int64_t) { return 0.01 * (i % 5); });
    Owned a_log = device_filled(kDi, kN, [](int64_t, int64_t n) { return std::log(n + 1.0); });
    Owned d = device_filled(kDi, 1, [](int64_t, int64_t) { return 1.0; });
    Owned dt_bias = device_filled(kDi, 1, [](int64_t i, int64_t) { return -4.6 + 2.3 * (i % 3) / 2; });
    Owned xc = empty({T, kDi}, bf, Device::CUDA), y = empty({T, kDi}, bf, Device::CUDA);
    Owned dxz = empty({T, 2 * kDi}, bf, Device::CUDA), ddt = empty({T, kDi}, bf, Device::CUDA),
          dbc = empty({T, 2 * kN}, bf, Device::CUDA), dxc = empty({T, kDi}, bf, Device::CUDA);
    Owned dconv_w = zeros({kDi, kK}, DType::F32, Device::CUDA), dconv_b = zeros({kDi}, DType::F32, Device::CUDA);
    Owned da = zeros({kDi, kN}, DType::F32, Device::CUDA), dd = zeros({kDi}, DType::F32, Device::CUDA),
          dbias = zeros({kDi}, DType::F32, Device::CUDA);
    const ops::ColumnBlock x_in(xz, 0, kDi), z_in(xz, kDi, kDi);

    double ms = time_ms([&] { ops::causal_conv1d_forward(x_in, conv_w, conv_b.t.view({kDi}), cu, true, xc); });
    results.push_back({label("conv1d fwd", seqs, len, kDi) + " K=4", ms, 0, 2 * act, ""});
    ms = time_ms([&] {
      ops::causal_conv1d_backward(dy, x_in, conv_w, conv_b.t.view({kDi}), cu, true, ops::ColumnBlock(dxz, 0, kDi),
                                  dconv_w, dconv_b);
    });
    results.push_back({label("conv1d bwd", seqs, len, kDi) + " K=4", ms, 0, 3 * act, ""});

    ops::ScanArgs a;
    a.x = xc;
    a.dt = dt;
    a.A_log = a_log;
    a.B = ops::ColumnBlock(bc, 0, kN);
    a.C = ops::ColumnBlock(bc, kN, kN);
    a.D = d.t.view({kDi});
    a.dt_bias = dt_bias.t.view({kDi});
    a.z = z_in;
    a.cu_seqlens = cu;
    const int64_t chunks = ops::scan_num_chunks(T, a.chunk_len);
    Owned states = empty({chunks, kN, kDi}, DType::F32, Device::CUDA);
    const double state_bytes = static_cast<double>(chunks) * kN * kDi * 4;
    const double exps = static_cast<double>(T) * kDi * kN;
    char note[160];
    ms = time_ms([&] { ops::selective_scan_forward(a, y, states); });
    std::snprintf(note, sizeof note, "chunk states %.0f MB written; %.2f T exps/s (2 per element)",
                  state_bytes / 1e6, 2 * exps / (ms * 1e-3) / 1e12);
    results.push_back({label("scan fwd", seqs, len, kDi), ms, 0, 4 * act + 2 * bcb, note});
    ms = time_ms([&] {
      ops::selective_scan_backward(a, dy, states,
                                   {dxc, ddt, ops::ColumnBlock(dbc, 0, kN), ops::ColumnBlock(dbc, kN, kN),
                                    ops::ColumnBlock(dxz, kDi, kDi), da, dd, dbias});
    });
    std::snprintf(note, sizeof note, "chunk states %.0f MB read; %.2f T exps/s (3 per element)",
                  state_bytes / 1e6, 3 * exps / (ms * 1e-3) / 1e12);
    results.push_back({label("scan bwd", seqs, len, kDi), ms, 0, 7 * act + 4 * bcb, note});
  }
  {  // the whole layer, 8 x 4096 tokens, C = 2048 (Di 4096, R 128)
    constexpr int64_t kSeqs = 8, kLen = 4096, kT = kSeqs * kLen, kC = 2048;
    layers::MambaConfig c;
    c.hidden = kC;
    c.init_std = 0.02;
    ParamTable table;
    layers::Mamba::declare(table, "m", c);
    ParamStore store(table, Device::CUDA, bf);
    store.init(1);
    layers::Mamba layer(store, "m", c);
    Owned cu = packed_cu_seqlens(kSeqs, kLen), pos = empty({kT}, DType::I32, Device::CUDA);
    const layers::SegmentInfo seg{.cu_seqlens = cu, .positions = pos, .max_seqlen = static_cast<int>(kLen)};
    Owned x = empty({kT, kC}, bf, Device::CUDA), y = empty({kT, kC}, bf, Device::CUDA),
          dy = empty({kT, kC}, bf, Device::CUDA), dx = empty({kT, kC}, bf, Device::CUDA);
    fill_random(x, "layer.x");
    fill_random(dy, "layer.dy");
    const layers::Env env{Device::CUDA, bf};
    const double flops = 6.0 * kT * (2.0 * c.inner() * kC + (c.rank() + 2 * kN) * c.inner() +
                                     c.inner() * c.rank() + kC * c.inner());  // GEMMs fwd + bwd
    const double ms = time_ms([&] {
      layers::MambaSaved s;
      layer.forward(env, x, y, seg, s);
      layer.backward(env, dy, x, seg, s, dx);
    });
    char note[96];
    std::snprintf(note, sizeof note, "%.0f k tokens/s; FLOP/s counts the GEMMs only", kT / (ms * 1e-3) / 1e3);
    results.push_back({"mamba layer fwd+bwd 8x4096 C=2048 Di=4096 N=16 R=128", ms, flops, 0, note});
  }
#endif
  return results;
}

}  // namespace engine::bench
