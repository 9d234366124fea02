// GPU tests of the one-token decode kernels (cuda/attention/decode.cu, cuda/mamba/decode_step.cu)
// against the f64 CPU reference (csrc/ref/decode.cpp) on fresh random bf16-rounded inputs:
// grouped-query heads (1, 3 and 4 q heads a kv head), head dims below, at and between the
// lanes' multiples of 32 up to 256, one cached position, a window shorter and longer than the
// cache, hundreds of keys; the Mamba steps over several tokens in a row (the caches carried from
// step to step on both sides), kernel sizes 1 to 4, channel counts that are not multiples of 128,
// x and z as column blocks of a wider in_proj-like row one element into their allocation,
// poisoned outputs. Tolerances: bf16 outputs twice the error of rounding the exact result to bf16
// plus 1e-4 (testing::bf16_tol); the f32 attention path and the f32 scan state 1e-5 and 1e-4.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ops/decode.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;
using ops::ColumnBlock;

namespace {

struct AttnCase {
  int heads, kv_heads, head_dim, len, window;
};

}  // namespace

TEST_CASE("cuda attention_decode matches the f64 reference (GQA, windows, head dims)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const std::vector<AttnCase> cases = {{8, 2, 64, 1, 0},    {8, 8, 128, 300, 0}, {6, 2, 40, 77, 16},
                                       {4, 1, 256, 1000, 0}, {12, 4, 96, 513, 100}, {3, 3, 5, 9, 0},
                                       {4, 2, 33, 50, 60},   {2, 1, 128, 4096, 1024}};
  for (const AttnCase& c : cases) {
    for (DType dtype : {DType::BF16, DType::F32}) {
      const std::string name = "H" + std::to_string(c.heads) + " Hkv" + std::to_string(c.kv_heads) + " D" +
                               std::to_string(c.head_dim) + " L" + std::to_string(c.len) + " window " +
                               std::to_string(c.window) + " " + dtype_name(dtype);
      CAPTURE(name);
      const int64_t H = c.heads, Hkv = c.kv_heads, D = c.head_dim, L = c.len;
      auto [gqkv, qkv64] = device_input(randn({1, H + 2 * Hkv, D}, DType::F32, "decode.qkv"), dtype, 1);
      auto [gcache, cache64] = device_input(randn({L, 2 * Hkv, D}, DType::F32, "decode.cache"), dtype, 1);
      ops::DecodeAttentionParams p;
      p.num_heads = c.heads;
      p.num_kv_heads = c.kv_heads;
      p.head_dim = c.head_dim;
      p.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
      p.window = c.window;
      Owned out64 = empty({1, H, D}, DType::F64, Device::CPU);
      p.qkv = qkv64;
      p.cache = cache64;
      p.out = out64;
      ops::attention_decode(p);
      DeviceTensor gout = gpu_poisoned({1, H, D}, dtype, 1);
      p.qkv = gqkv.t;
      p.cache = gcache.t;
      p.out = gout.t;
      ops::attention_decode(p);
      CHECK_CLOSE(gout.t, out64.t, output_tol(dtype, out64, 1e-5));
    }
  }
}

TEST_CASE("cuda causal_conv1d_step and selective_scan_step match the f64 reference over several tokens" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t di, k, n;
    bool bias;
  };
  for (const Case& c : std::vector<Case>{{50, 4, 16, true}, {129, 3, 4, false}, {7, 1, 1, true}, {300, 2, 13, true},
                                         {4096, 4, 16, true}}) {
    const std::string name = "Di" + std::to_string(c.di) + " K" + std::to_string(c.k) + " N" + std::to_string(c.n);
    CAPTURE(name);
    const int64_t di = c.di, k = c.k, n = c.n;
    auto [gw, w64] = device_input(randn({di, k}, DType::F32, "step.w", 0.5), DType::BF16, 1);
    auto [gb, b64] = device_input(randn({di}, DType::F32, "step.b", 0.5), DType::BF16, 1);
    auto [galog, alog64] = device_input(randn({di, n}, DType::F32, "step.alog", 0.5), DType::BF16, 1);
    auto [gd, d64] = device_input(randn({di}, DType::F32, "step.D"), DType::BF16, 1);
    auto [gdtb, dtb64] = device_input(randn({di}, DType::F32, "step.dt_bias", 0.5), DType::BF16, 1);
    const Tensor bias64 = c.bias ? b64.t : Tensor(), gbias = c.bias ? gb.t : Tensor();
    Owned conv64 = zeros({k - 1, di}, DType::F64, Device::CPU), ssm64 = zeros({di, n}, DType::F64, Device::CPU);
    DeviceTensor gconv = to_gpu(zeros({k - 1, di}, DType::F32, Device::CPU), DType::BF16, 1);
    DeviceTensor gssm = to_gpu(zeros({di, n}, DType::F32, Device::CPU), DType::F32, 1);
    for (int step = 0; step < 5; ++step) {
      CAPTURE(step);
      const std::string s = std::to_string(step);
      // x and z: the two halves of an in_proj-like (1, 2 Di + 1) row, from column 1.
      auto [gxz, xz64] = device_input(randn({1, 2 * di + 1}, DType::F32, "step.xz" + s), DType::BF16, 1);
      Owned xc64 = empty({1, di}, DType::F64, Device::CPU);
      ops::causal_conv1d_step(ColumnBlock(xz64, 1, di), conv64, w64, bias64, true, xc64);
      DeviceTensor gxc = gpu_poisoned({1, di + 3}, DType::BF16, 1);
      ops::causal_conv1d_step(ColumnBlock(gxz.t, 1, di), gconv.t, gw.t, gbias, true, ColumnBlock(gxc.t, 2, di));
      Owned got_xc = empty({1, di}, DType::F64, Device::CPU);
      {
        Owned h = to_host(gxc.t, DType::F64);
        for (int64_t j = 0; j < di; ++j) set(got_xc, j, get(h, 2 + j));
      }
      CHECK_CLOSE(got_xc.t, xc64.t, bf16_tol(xc64));
      if (k > 1) CHECK_CLOSE(gconv.t, conv64.t, 0.0);  // the state holds copies of the bf16 inputs
      // The scan step on the GPU's conv output (rounded to bf16 as the GPU holds it) on both sides.
      auto [gxs, xs64] = device_input(got_xc, DType::BF16, 1);
      auto [gdt, dt64] = device_input(randn({1, di}, DType::F32, "step.dt" + s, 0.5), DType::BF16, 1);
      auto [gbc, bc64] = device_input(randn({1, 2 * n}, DType::F32, "step.bc" + s), DType::BF16, 1);
      ops::ScanArgs a64;
      a64.x = xs64;
      a64.dt = dt64;
      a64.A_log = alog64;
      a64.B = ColumnBlock(bc64, 0, n);
      a64.C = ColumnBlock(bc64, n, n);
      a64.D = d64;
      a64.dt_bias = dtb64;
      a64.z = ColumnBlock(xz64, 1 + di, di);
      Owned y64 = empty({1, di}, DType::F64, Device::CPU);
      ops::selective_scan_step(a64, ssm64, y64);
      ops::ScanArgs ag = a64;
      ag.x = gxs.t;
      ag.dt = gdt.t;
      ag.A_log = galog.t;
      ag.B = ColumnBlock(gbc.t, 0, n);
      ag.C = ColumnBlock(gbc.t, n, n);
      ag.D = gd.t;
      ag.dt_bias = gdtb.t;
      ag.z = ColumnBlock(gxz.t, 1 + di, di);
      DeviceTensor gy = gpu_poisoned({1, di}, DType::BF16, 1);
      ops::selective_scan_step(ag, gssm.t, gy.t);
      CHECK_CLOSE(gy.t, y64.t, bf16_tol(y64));
      CHECK_CLOSE(gssm.t, ssm64.t, 1e-4);
    }
  }
}
