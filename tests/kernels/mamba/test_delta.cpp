// GPU tests of the Gated DeltaNet chunked kernels (cuda/mamba/delta.cu, delta_backward.cu) against
// the f64 CPU reference (csrc/ref/delta.cpp, token by token) on the same bf16-rounded inputs: odd
// document lengths, many short documents, empty documents, documents of one token, of exactly a
// chunk and far longer than one, head dims below, at and between the kernels' paddings (64, 128),
// several value heads a key head, decays from slow to fast; every activation a column block of a
// wider tensor one element past an aligned address, outputs poisoned around their block,
// parameter gradients accumulated into random prefills, bitwise reproducibility.
// Tolerance: the products take bf16 operands (q^, k^, the deltas, T, the states, the decay
// matrices) with f32 accumulation: outputs and gradients within kDeltaTol relative RMS (seen on an
// H200: 1.2e-3 to 5.3e-3), the parameter gradients (sums over the tokens) within kDeltaTol of the
// sum of their terms' sizes (TEST_VERBOSE=1 prints each).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/delta.h"
#include "tests/common/gpu_testing.h"
#include "tests/kernels/mamba/scan_testing.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::testing::scan_testing;
using ops::ColumnBlock;

namespace {

constexpr double kDeltaTol = 1.5e-2;

// The parameter gradients: scan_testing::close_sums against the sizes of their per-token terms.
void sums(const Tensor& got, const Tensor& ref, const Tensor& l1, const std::string& what) {
  Comparison c = close_sums(got, ref, l1, kDeltaTol);
  if (std::getenv("TEST_VERBOSE")) MESSAGE(what << ": error / sum of |terms| " << c.rel_rms);
  INFO(what << ": " << c.report);
  CHECK(c.nonfinite == 0);
  CHECK(c.rel_rms <= kDeltaTol);
}

struct DeltaCase {
  std::string name;
  std::vector<int32_t> docs;
  int64_t hk, hv, dk, dv;
  bool aligned = false;  // the blocks at 16-byte aligned rows (the kernels' vector loads), as a layer's
};

std::vector<DeltaCase> delta_cases() {
  return {
      {"docs 1,4,37,2,300 Hk2 Hv4 dk32 dv48", {1, 4, 37, 2, 300}, 2, 4, 32, 48},
      {"60 docs up to 40 Hk1 Hv2 dk128 dv128", random_docs(60, 40, "delta.docs"), 1, 2, 128, 128},
      {"one doc 1000 Hk2 Hv2 dk128 dv64", {1000}, 2, 2, 128, 64},
      {"docs 64,128,65,63 Hk2 Hv4 dk64 dv128 (chunk edges)", {64, 128, 65, 63}, 2, 4, 64, 128},
      {"empty docs 0,5,0,0,70,3,0 Hk1 Hv3 dk16 dv16", {0, 5, 0, 0, 70, 3, 0}, 1, 3, 16, 16},
      {"one token Hk1 Hv1 dk8 dv8", {1}, 1, 1, 8, 8},
      {"aligned docs 200,77 Hk2 Hv4 dk64 dv128", {200, 77}, 2, 4, 64, 128, true},
  };
}
std::vector<DeltaCase> delta_cases_large() {
  return {{"docs 3000,17,1100 Hk4 Hv8 dk128 dv128", {3000, 17, 1100}, 4, 8, 128, 128},
          {"300 docs up to 30 Hk2 Hv4 dk64 dv64", random_docs(300, 30, "delta.docs.large"), 2, 4, 64, 64}};
}

// q, k, v: blocks of a conv output (T, 2 Hk dk + Hv dv + 1) from column 1; a, b: columns [2, Hv + 2)
// and [Hv + 2, 2 Hv + 2) of (T, 2 Hv + 3); every tensor one element into its allocation. Aligned:
// q, k, v from column 0 of (T, 2 Hk dk + Hv dv), the tensors at their allocations' start.
struct DeltaProblem {
  DeltaCase c;
  int64_t t, width, col0, offset;
  DeviceInput qkv, ab, alog, bias;
  Owned cu;
  DeviceTensor gcu;
  int64_t qk() const { return c.hk * c.dk; }
  ops::DeltaArgs args(bool gpu) const {
    ops::DeltaArgs a;
    const Tensor& x = gpu ? qkv.dev.t : qkv.f64.t;
    const Tensor& g = gpu ? ab.dev.t : ab.f64.t;
    a.q = ColumnBlock(x, col0, qk());
    a.k = ColumnBlock(x, col0 + qk(), qk());
    a.v = ColumnBlock(x, col0 + 2 * qk(), c.hv * c.dv);
    a.a = ColumnBlock(g, 2, c.hv);
    a.b = ColumnBlock(g, 2 + c.hv, c.hv);
    a.A_log = gpu ? alog.dev.t : alog.f64.t;
    a.dt_bias = gpu ? bias.dev.t : bias.f64.t;
    a.cu_seqlens = gpu ? gcu.t : cu.t;
    a.key_heads = c.hk;
    return a;
  }
};

DeltaProblem delta_problem(const DeltaCase& c) {
  const int64_t t = total(c.docs), h = c.hv, col0 = c.aligned ? 0 : 1, width = 2 * c.hk * c.dk + h * c.dv + col0;
  const int64_t offset = c.aligned ? 0 : kOffset;
  Owned alog = empty({h}, DType::F32, Device::CPU), bias = empty({h}, DType::F32, Device::CPU);
  for (int64_t i = 0; i < h; ++i) {  // A from 0.02 (slow decay) to 8 (fast), log-spaced
    const double f = h > 1 ? static_cast<double>(i) / static_cast<double>(h - 1) : 0.0;
    set(alog, i, std::log(0.02) + f * (std::log(8.0) - std::log(0.02)));
    set(bias, i, -1.0 + f);
  }
  Owned cu = cu_from(c.docs);
  DeviceTensor gcu = to_gpu(cu);
  return DeltaProblem{c,
                      t,
                      width,
                      col0,
                      offset,
                      device_input(randn({t, width}, DType::F32, "delta.qkv"), DType::BF16, offset),
                      device_input(randn({t, 2 * h + 3}, DType::F32, "delta.ab"), DType::BF16, kOffset),
                      device_input(alog, DType::BF16, kOffset),
                      device_input(bias, DType::BF16, kOffset),
                      std::move(cu),
                      std::move(gcu)};
}

void delta_sweep(const std::vector<DeltaCase>& cases) {
  if (!gpu_available_or_skip()) return;
  for (const DeltaCase& c : cases) {
    SUBCASE(c.name.c_str()) {
      DeltaProblem pb = delta_problem(c);
      const int64_t t = pb.t, h = c.hv, hd = h * c.dv, qk = pb.qk(), c0 = pb.col0;
      // Forward: o in columns [1, Hv dv + 1) of (T, Hv dv + 2).
      Owned o64 = empty({t, hd}, DType::F64, Device::CPU);
      ops::gated_delta_forward(pb.args(false), o64);
      DeviceTensor go = gpu_poisoned({t, hd + 2}, DType::BF16, kOffset);
      ops::gated_delta_forward(pb.args(true), ColumnBlock(go.t, 1, hd));
      close(block_host(go.t, 1, hd).t, o64.t, kDeltaTol, "o");
      CHECK(outside_poisoned(go.t, 1, hd));

      // Backward: dq, dk, dv in their columns of a poisoned (T, width); da, db in theirs of
      // (T, 2 Hv + 3); dA_log and ddt_bias onto random prefills.
      DeviceInput gdo = device_input(randn({t, hd}, DType::F32, "delta.do"), DType::BF16, pb.offset);
      Owned dx64 = zeros({t, pb.width}, DType::F64, Device::CPU), dab64 = zeros({t, 2 * h + 3}, DType::F64, Device::CPU);
      Owned dal64 = zeros({h}, DType::F64, Device::CPU), dbi64 = zeros({h}, DType::F64, Device::CPU);
      auto grads = [&](const Tensor& dx, const Tensor& dab, const Tensor& dal, const Tensor& dbi) {
        return ops::DeltaGrads{ColumnBlock(dx, c0, qk), ColumnBlock(dx, c0 + qk, qk), ColumnBlock(dx, c0 + 2 * qk, hd),
                               ColumnBlock(dab, 2, h), ColumnBlock(dab, 2 + h, h), dal, dbi};
      };
      ops::gated_delta_backward(pb.args(false), gdo.f64, grads(dx64, dab64, dal64, dbi64));
      Owned p0 = randn({2, h}, DType::F32, "delta.prefill");
      auto run = [&](DeviceTensor& gdx, DeviceTensor& gdab, DeviceTensor& gp) {
        gdx = gpu_poisoned({t, pb.width}, DType::BF16, pb.offset);
        gdab = gpu_poisoned({t, 2 * h + 3}, DType::BF16, kOffset);
        gp = to_gpu(p0, DType::F32, kOffset);
        ops::gated_delta_backward(pb.args(true), gdo.dev.t,
                                  grads(gdx.t, gdab.t, gp.t.slice(0, 1).view({h}), gp.t.slice(1, 2).view({h})));
      };
      DeviceTensor gdx, gdab, gp;
      run(gdx, gdab, gp);
      close(block_host(gdx.t, c0, qk).t, block_host(dx64.t, c0, qk).t, kDeltaTol, "dq");
      close(block_host(gdx.t, c0 + qk, qk).t, block_host(dx64.t, c0 + qk, qk).t, kDeltaTol, "dk");
      close(block_host(gdx.t, c0 + 2 * qk, hd).t, block_host(dx64.t, c0 + 2 * qk, hd).t, kDeltaTol, "dv");
      CHECK(outside_poisoned(gdx.t, c0, 2 * qk + hd));
      close(block_host(gdab.t, 2, h).t, block_host(dab64.t, 2, h).t, kDeltaTol, "da");
      close(block_host(gdab.t, 2 + h, h).t, block_host(dab64.t, 2 + h, h).t, kDeltaTol, "db");
      CHECK(outside_poisoned(gdab.t, 2, 2 * h));
      // dt_bias's gradient sums da over the tokens; A_log's sums dg g = da softplus(pre) / sigmoid(pre).
      Owned pg = f64_from(gp.t, p0);
      const Tensor& ab = pb.ab.f64.t;
      auto gate = [&](int64_t r, int64_t i) {
        const double pre = get(ab, r * ab.size(1) + 2 + i) + get(pb.bias.f64, i);
        return std::log1p(std::exp(pre)) * (1 + std::exp(-pre));
      };
      sums(pg.t.slice(0, 1).view({h}), dal64, column_l1(dab64, 2, h, gate), "dA_log");
      sums(pg.t.slice(1, 2).view({h}), dbi64, column_l1(dab64, 2, h, [](int64_t, int64_t) { return 1.0; }), "ddt_bias");
      // Bitwise reproducible.
      DeviceTensor gdx2, gdab2, gp2;
      run(gdx2, gdab2, gp2);
      CHECK(bitwise_equal(block_host(gdx.t, c0, 2 * qk + hd), block_host(gdx2.t, c0, 2 * qk + hd)));
      CHECK(bitwise_equal(block_host(gdab.t, 2, 2 * h), block_host(gdab2.t, 2, 2 * h)));
      CHECK(bitwise_equal(gp.t, gp2.t));
    }
  }
}

}  // namespace

GPU_TEST_SWEEP("cuda gated deltanet forward and backward match the f64 reference", delta_sweep, delta_cases(),
               delta_cases_large())
