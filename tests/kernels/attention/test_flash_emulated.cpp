// The flash-attention kernels (mma.sync: flash_fwd.cuh, flash_bwd.cuh; f32 fallback:
// flash_fallback.cuh), compiled for the CPU and run by the emulator in flash_emu.h, against the
// f64 reference: tile loops, masks, online softmax, cp.async pipelining and barriers, fragment
// layouts, GQA accumulation, dQ bulk reductions, the backward's launch order (sections of 2
// pairs here), separate keys (kv: queries at the end of longer key sequences, dk and dv into
// their own buffer, qkv's k and v heads of dqkv left alone). Runs without a GPU (CI). Each case
// runs twice, with cp.async copies and bulk reductions landing at issue and at the wait, threads in
// random order between barriers. The launcher's small kernels (dsum, dq conversion) are replayed on
// the host here; test_flash.cpp covers the real launchers on the GPU. Tolerances as in
// test_flash.cpp.
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
  // Separate keys (ops::AttentionParams::kv) when not empty: the key count of each sequence
  // (>= its length in lens; the queries are the last positions).
  std::vector<int> lens_k = {};
  std::string name() const {
    std::string s = "lens";
    for (int l : lens) s += " " + std::to_string(l);
    if (!lens_k.empty()) {
      s += ", keys";
      for (int l : lens_k) s += " " + std::to_string(l);
    }
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

Owned offsets(const std::vector<int>& lens) {
  Owned cu = empty({static_cast<int64_t>(lens.size()) + 1}, DType::I32, Device::CPU);
  cu.ptr<int32_t>()[0] = 0;
  for (size_t s = 0; s < lens.size(); ++s)
    cu.ptr<int32_t>()[s + 1] = cu.ptr<int32_t>()[s] + lens[s];
  return cu;
}

// The mma kernels for D = kD, or the fallback kernels for kD = 0 (D = c.dim).
template <int kD>
void run_case(const EmuCase& c, emu::CopyMode mode) {
  const int D = kD ? kD : c.dim;
  const bool separate = !c.lens_k.empty();
  const std::vector<int>& lens_k = separate ? c.lens_k : c.lens;
  const int64_t t = std::accumulate(c.lens.begin(), c.lens.end(), int64_t{0});
  const int64_t tk = std::accumulate(lens_k.begin(), lens_k.end(), int64_t{0});
  const int64_t h = c.heads, hkv = c.kv_heads, nh = h + 2 * hkv;
  const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
  const int max_len_k = *std::max_element(lens_k.begin(), lens_k.end());
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  Owned qkv = randn({t, nh, D}, DType::BF16, "flash_emu.qkv");
  Owned dout = randn({t, h, D}, DType::BF16, "flash_emu.dout");
  Owned kv = randn({separate ? tk : 0, 2 * hkv, D}, DType::BF16, "flash_emu.kv");
  Owned cu = offsets(c.lens), cu_k = offsets(lens_k);

  // Reference, f64 on the same bf16 values.
  Owned qkv64 = to_f64(qkv), dout64 = to_f64(dout), kv64 = to_f64(kv);
  Owned out_ref = empty({t, h, D}, DType::F64, Device::CPU);
  Owned lse_ref = empty({t, h}, DType::F64, Device::CPU);
  Owned dqkv_ref = empty({t, nh, D}, DType::F64, Device::CPU);
  Owned dkv_ref = empty(kv->shape, DType::F64, Device::CPU);
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
  if (separate) {
    rp.kv = kv64;
    rp.cu_seqlens_k = cu_k;
    rp.max_seqlen_k = max_len_k;
  }
  ops::attention_forward(rp);
  ops::attention_backward({rp, dout64, dqkv_ref, separate ? dkv_ref.t : Tensor{}});

  // Emulated kernels.
  Owned out = empty({t, h, D}, DType::BF16, Device::CPU), lse = empty({t, h}, DType::F32, Device::CPU);
  Owned dqkv = empty({t, nh, D}, DType::BF16, Device::CPU),
        dkv = empty(kv->shape, DType::BF16, Device::CPU);
  Owned dsum = empty({t, h}, DType::F32, Device::CPU), dq_accum = zeros({t, h, D}, DType::F32, Device::CPU);
  poison(out);
  poison(lse);
  poison(dqkv);
  poison(dkv);
  fl::Params k{};
  k.q = as<const fl::bf16, bf16>(qkv);
  k.k = separate ? as<const fl::bf16, bf16>(kv) : k.q + h * D;
  k.out = as<fl::bf16, bf16>(out);
  k.lse = lse.ptr<float>();
  k.cu_seqlens_q = cu.ptr<int32_t>();
  k.cu_seqlens_k = cu_k.ptr<int32_t>();
  k.dout = as<const fl::bf16, bf16>(dout);
  k.dq = as<fl::bf16, bf16>(dqkv);
  k.dk = separate ? as<fl::bf16, bf16>(dkv) : k.dq + h * D;
  k.dq_accum = dq_accum.ptr<float>();
  k.dsum = dsum.ptr<float>();
  k.q_row = static_cast<int>(nh * D);
  k.kv_row = separate ? static_cast<int>(2 * hkv * D) : k.q_row;
  k.num_tokens = static_cast<int>(t);
  k.bwd_section = 2;  // sections of 2 (kv head, sequence) pairs, the last one shorter when odd
  k.num_heads = c.heads;
  k.num_kv_heads = c.kv_heads;
  k.head_dim = D;
  k.scale = scale;
  k.causal = c.causal;
  k.window = c.window;

  emu::st().global.clear();
  for (const Owned* o : {&qkv, &dout, &lse, &dsum, &dq_accum, &kv})
    emu::allow_global(o->t.data, o->t.nbytes());
  const unsigned seqs = static_cast<unsigned>(c.lens.size());
  auto grid = [&](int len, int rows_per_block, int64_t heads) {
    return emu::Dim3{static_cast<unsigned>((len + rows_per_block - 1) / rows_per_block),
                     static_cast<unsigned>(heads), seqs};
  };
  namespace fb = fl::fallback;
  if constexpr (kD > 0) {
    using F = fl::FwdConfig<kD>;
    emu::launch(
        grid(max_len, F::kBlockM, h), F::kThreads, F::kSmemBytes,
        [&] { fl::flash_fwd_kernel<kD>(k); }, mode);
  } else {
    emu::launch(
        grid(max_len, fb::kWarps, h), fb::kWarps * 32, 0, [&] { fb::fallback_fwd_kernel(k); },
        mode);
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
    emu::launch(
        grid(max_len_k, B::kBlockN, hkv), B::kThreads, B::kSmemBytes,
        [&] { fl::flash_bwd_kernel<kD>(k); }, mode);
    for (int64_t tok = 0; tok < t; ++tok)  // dq conversion, as the launcher's kernel does it
      for (int hd = 0; hd < h; ++hd)
        for (int d = 0; d < D; ++d)
          dqkv.ptr<bf16>()[(tok * nh + hd) * D + d] =
              bf16(scale * dq_accum.ptr<float>()[fl::dq_accum_index(hd, tok, d, t, D)]);
  } else {
    emu::launch(
        grid(max_len, fb::kWarps, h), fb::kWarps * 32, 0, [&] { fb::fallback_bwd_dq_kernel(k); },
        mode);
    emu::launch(
        grid(max_len_k, fb::kWarps, hkv), fb::kWarps * 32, 0,
        [&] { fb::fallback_bwd_dkv_kernel(k); }, mode);
  }
  CHECK_CLOSE(heads_of(dqkv, 0, h).t, heads_of(dqkv_ref, 0, h).t, 2e-2);
  if (separate) {
    CHECK_CLOSE(heads_of(dkv, 0, hkv).t, heads_of(dkv_ref, 0, hkv).t, 2e-2);
    CHECK_CLOSE(heads_of(dkv, hkv, hkv).t, heads_of(dkv_ref, hkv, hkv).t, 2e-2);
    // qkv's k and v heads are not gradients of anything here: dqkv keeps its poison there.
    Owned kv_part = heads_of(dqkv, h, 2 * hkv);
    int64_t written = 0;
    for (int64_t i = 0; i < kv_part->numel(); ++i) written += !std::isnan(kv_part.ptr<double>()[i]);
    CHECK(written == 0);
  } else {
    CHECK_CLOSE(heads_of(dqkv, h, hkv).t, heads_of(dqkv_ref, h, hkv).t, 2e-2);
    CHECK_CLOSE(heads_of(dqkv, h + hkv, hkv).t, heads_of(dqkv_ref, h + hkv, hkv).t, 2e-2);
  }
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
    {{{1, 17, 130}, 2, 1, 128, true, 0}, emu::CopyMode::kAtWait},   // 2 q tiles, 3 key tiles
    {{{130, 0, 65}, 3, 1, 64, true, 50}, emu::CopyMode::kAtIssue},  // GQA 3, empty sequence
    {{{40, 0, 9}, 6, 3, 6, true, 35}, emu::CopyMode::kAtWait},      // fallback, 2 key chunks
    {{{70, 0, 130}, 2, 1, 128, true, 0, {200, 40, 131}}, emu::CopyMode::kAtIssue},  // separate keys
};
const std::vector<EmuCase> kSlowCases = {
    // Separate keys (micro-sequences): queries the last positions of longer key sequences,
    // a sequence with keys and no queries (dK = dV = 0), key tiles wholly older than a window.
    {{70, 0, 130}, 2, 1, 128, true, 0, {200, 40, 131}},
    {{1, 65, 3}, 3, 1, 64, true, 50, {260, 65, 140}},
    {{30, 2}, 2, 2, 64, false, 0, {150, 2}},
    {{9, 0, 17}, 4, 2, 16, true, 20, {80, 5, 17}},  // fallback
    {{12, 4}, 3, 3, 40, false, 7, {50, 4}},         // fallback, window without causality
    {{1, 17, 200}, 4, 2, 128, true, 0},             // 2 q tiles, 4 key tiles (forward), GQA 2
    {{150, 70}, 3, 3, 128, false, 40},              // window without causality
    {{130, 0, 65}, 3, 1, 64, true, 50},             // GQA 3, empty sequence, window
    {{257}, 2, 2, 64, false, 0},                    // 3 key tiles of 128
    {{70, 1, 33}, 4, 1, 16, false, 20},             // fallback: full with window
    {{65}, 2, 2, 40, true, 0},                      // fallback: D > 32 (two dims per lane)
};

}  // namespace

TEST_CASE("flash kernels emulated on the CPU match the f64 reference" * doctest::test_suite("full")) {
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
