// The flash-attention kernels (mma.sync: flash_fwd.cuh, flash_bwd.cuh; f32 fallback:
// flash_fallback.cuh), compiled for the CPU and run by the emulator in flash_emu.h, against the
// f64 reference: tile loops, masks, online softmax, cp.async pipelining and barriers, fragment
// layouts, GQA accumulation, dQ bulk reductions, the backward's launch order (sections of 2
// pairs here). Runs without a GPU (CI). Each case runs twice, with cp.async copies and bulk
// reductions landing at issue and at the wait, threads in random order between barriers. The
// launcher's small kernels (dsum, dq conversion) are replayed on the host here; test_flash.cpp
// covers the real launchers on the GPU. Tolerances as in test_flash.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "tests/common/testing.h"
// The emulator must come before the kernel headers.
#include "tests/kernels/attention/flash_emu.h"
#include "cuda/attention/flash_bwd.cuh"
#include "cuda/attention/flash_fallback.cuh"
#include "cuda/attention/flash_fwd.cuh"

using namespace engine;
using namespace engine::testing;
namespace fl = engine::cuda::flash;

namespace {

struct EmuCase {
  std::vector<int> lens;
  int heads, kv_heads, dim;
  bool causal;
  int window;
  std::string name() const {
    std::string s = "lens";
    for (int l : lens) s += " " + std::to_string(l);
    return s + ", H" + std::to_string(heads) + " Hkv" + std::to_string(kv_heads) + " D" +
           std::to_string(dim) + (causal ? " causal" : " full") + " window " +
           std::to_string(window);
  }
};

Owned to_f64(const Tensor& t) {
  Owned o = empty(t.shape, DType::F64, Device::CPU);
  for (int64_t i = 0; i < t.numel(); ++i) o.ptr<double>()[i] = get(t, i);
  return o;
}

// Heads [h0, h0 + n) of a CPU (T, NH, D) tensor as f64 (T, n, D).
Owned heads_of(const Tensor& x, int64_t h0, int64_t n) {
  const int64_t t = x.size(0), nh = x.size(1), d = x.size(2);
  Owned part = empty({t, n, d}, DType::F64, Device::CPU);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t e = 0; e < n * d; ++e) part.ptr<double>()[i * n * d + e] = get(x, (i * nh + h0) * d + e);
  return part;
}

template <typename T, typename U>
T* as(const Owned& o) {
  return reinterpret_cast<T*>(o.ptr<U>());
}

// The mma kernels for D = kD, or the fallback kernels for kD = 0 (D = c.dim).
template <int kD>
void run_case(const EmuCase& c, emu::CopyMode mode) {
  const int D = kD ? kD : c.dim;
  const int64_t t = std::accumulate(c.lens.begin(), c.lens.end(), int64_t{0});
  const int64_t h = c.heads, hkv = c.kv_heads, nh = h + 2 * hkv;
  const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  Owned qkv = randn({t, nh, D}, DType::BF16, "flash_emu.qkv");
  Owned dout = randn({t, h, D}, DType::BF16, "flash_emu.dout");
  Owned cu = empty({static_cast<int64_t>(c.lens.size()) + 1}, DType::I32, Device::CPU);
  cu.ptr<int32_t>()[0] = 0;
  for (size_t s = 0; s < c.lens.size(); ++s) cu.ptr<int32_t>()[s + 1] = cu.ptr<int32_t>()[s] + c.lens[s];

  // Reference, f64 on the same bf16 values.
  Owned qkv64 = to_f64(qkv), dout64 = to_f64(dout);
  Owned out_ref = empty({t, h, D}, DType::F64, Device::CPU);
  Owned lse_ref = empty({t, h}, DType::F64, Device::CPU);
  Owned dqkv_ref = empty({t, nh, D}, DType::F64, Device::CPU);
  ops::AttentionParams rp;
  rp.qkv = qkv64;
  rp.out = out_ref;
  rp.lse = lse_ref;
  rp.cu_seqlens = cu;
  rp.max_seqlen = max_len;
  rp.num_heads = c.heads;
  rp.num_kv_heads = c.kv_heads;
  rp.head_dim = D;
  rp.softmax_scale = scale;
  rp.causal = c.causal;
  rp.window = c.window;
  ops::attention_forward(rp);
  ops::attention_backward({rp, dout64, dqkv_ref});

  // Emulated kernels.
  Owned out = empty({t, h, D}, DType::BF16, Device::CPU), lse = empty({t, h}, DType::F32, Device::CPU);
  Owned dqkv = empty({t, nh, D}, DType::BF16, Device::CPU);
  Owned dsum = empty({t, h}, DType::F32, Device::CPU), dq_accum = zeros({t, h, D}, DType::F32, Device::CPU);
  poison(out);
  poison(lse);
  poison(dqkv);
  fl::Params k{};
  k.qkv = as<const fl::bf16, bf16>(qkv);
  k.out = as<fl::bf16, bf16>(out);
  k.lse = lse.ptr<float>();
  k.cu_seqlens = cu.ptr<int32_t>();
  k.dout = as<const fl::bf16, bf16>(dout);
  k.dqkv = as<fl::bf16, bf16>(dqkv);
  k.dq_accum = dq_accum.ptr<float>();
  k.dsum = dsum.ptr<float>();
  k.qkv_row = nh * D;
  k.num_tokens = t;
  k.num_seqs = static_cast<int>(c.lens.size());
  k.bwd_section = 2;  // sections of 2 (kv head, sequence) pairs, the last one shorter when odd
  k.max_seqlen = max_len;
  k.num_heads = c.heads;
  k.num_kv_heads = c.kv_heads;
  k.head_dim = D;
  k.scale = scale;
  k.scale_log2 = scale * fl::kLog2e;
  k.causal = c.causal;
  k.window = c.window;

  emu::st().global.clear();
  for (const Owned* o : {&qkv, &dout, &lse, &dsum, &dq_accum}) emu::allow_global(o->t.data, o->t.nbytes());
  const unsigned seqs = static_cast<unsigned>(c.lens.size());
  auto grid = [&](int rows_per_block, int64_t heads) {
    return emu::Dim3{static_cast<unsigned>((max_len + rows_per_block - 1) / rows_per_block),
                     static_cast<unsigned>(heads), seqs};
  };
  namespace fb = fl::fallback;
  if constexpr (kD > 0) {
    using F = fl::FwdConfig<kD>;
    emu::launch(grid(F::kBlockM, h), F::kThreads, F::kSmemBytes,
                [&] { fl::flash_fwd_kernel<kD>(k); }, mode);
  } else {
    emu::launch(grid(fb::kWarps, h), fb::kWarps * 32, 0, [&] { fb::fallback_fwd_kernel(k); }, mode);
  }
  CHECK_CLOSE(out.t, out_ref.t, 1e-2);
  CHECK_CLOSE(lse.t, lse_ref.t, 1e-3);

  // dsum as the launcher's kernel computes it (f32, from the bf16 out).
  for (int64_t r = 0; r < t * h; ++r) {
    float acc = 0.f;
    for (int d = 0; d < D; ++d)
      acc += static_cast<float>(out.ptr<bf16>()[r * D + d]) * static_cast<float>(dout.ptr<bf16>()[r * D + d]);
    dsum.ptr<float>()[r] = acc;
  }
  if constexpr (kD > 0) {
    using B = fl::BwdConfig<kD>;
    emu::launch(grid(B::kBlockN, hkv), B::kThreads, B::kSmemBytes,
                [&] { fl::flash_bwd_kernel<kD>(k); }, mode);
    for (int64_t tok = 0; tok < t; ++tok)  // dq conversion, as the launcher's kernel does it
      for (int hd = 0; hd < h; ++hd)
        for (int d = 0; d < D; ++d)
          dqkv.ptr<bf16>()[(tok * nh + hd) * D + d] =
              bf16(scale * dq_accum.ptr<float>()[fl::dq_accum_index(hd, tok, d, t, D)]);
  } else {
    emu::launch(grid(fb::kWarps, h), fb::kWarps * 32, 0, [&] { fb::fallback_bwd_dq_kernel(k); }, mode);
    emu::launch(grid(fb::kWarps, hkv), fb::kWarps * 32, 0, [&] { fb::fallback_bwd_dkv_kernel(k); },
                mode);
  }
  CHECK_CLOSE(heads_of(dqkv, 0, h).t, heads_of(dqkv_ref, 0, h).t, 2e-2);
  CHECK_CLOSE(heads_of(dqkv, h, hkv).t, heads_of(dqkv_ref, h, hkv).t, 2e-2);
  CHECK_CLOSE(heads_of(dqkv, h + hkv, hkv).t, heads_of(dqkv_ref, h + hkv, hkv).t, 2e-2);
}

void run(const EmuCase& c, emu::CopyMode mode) {
  if (c.dim == 128)
    run_case<128>(c, mode);
  else if (c.dim == 64)
    run_case<64>(c, mode);
  else
    run_case<0>(c, mode);
}

const char* mode_name(emu::CopyMode m) {
  return m == emu::CopyMode::kAtWait ? ", copies at wait" : ", copies at issue";
}

// Fast tier: one case per kernel family (a couple of seconds); the slow tier runs all, both modes.
const std::vector<std::pair<EmuCase, emu::CopyMode>> kFastCases = {
    {{{1, 17, 130}, 2, 1, 128, true, 0}, emu::CopyMode::kAtWait},  // 2 q tiles, 3 key tiles
    {{{130, 0, 65}, 3, 1, 64, true, 50}, emu::CopyMode::kAtIssue},  // GQA 3, empty sequence
    {{{40, 0, 9}, 6, 3, 6, true, 35}, emu::CopyMode::kAtWait},  // fallback, 2 key chunks
};
const std::vector<EmuCase> kSlowCases = {
    {{1, 17, 200}, 4, 2, 128, true, 0},  // 2 q tiles, 4 key tiles (forward), GQA 2
    {{150, 70}, 3, 3, 128, false, 40},   // window without causality
    {{130, 0, 65}, 3, 1, 64, true, 50},  // GQA 3, empty sequence, window
    {{257}, 2, 2, 64, false, 0},         // 3 key tiles of 128
    {{70, 1, 33}, 4, 1, 16, false, 20},  // fallback: full with window
    {{65}, 2, 2, 40, true, 0},           // fallback: D > 32 (two dims per lane)
};

}  // namespace

TEST_CASE("flash kernels emulated on the CPU match the f64 reference" * doctest::test_suite("slow")) {
  for (const auto& [c, mode] : kFastCases) {
    SUBCASE((c.name() + mode_name(mode)).c_str()) { run(c, mode); }
  }
}

TEST_CASE("flash kernels emulated on the CPU: more shapes, both copy modes" *
          doctest::test_suite("slow")) {
  for (const EmuCase& c : kSlowCases)
    for (emu::CopyMode mode : {emu::CopyMode::kAtWait, emu::CopyMode::kAtIssue}) {
      SUBCASE((c.name() + mode_name(mode)).c_str()) { run(c, mode); }
    }
}
