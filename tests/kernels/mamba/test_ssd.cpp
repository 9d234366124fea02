// GPU tests of the Mamba-2 kernels (cuda/mamba/ssd.cu, ssd_backward.cu, gated_norm.cu) against
// the f64 CPU reference (csrc/ref/ssd.cpp) on the same bf16-rounded inputs: odd document lengths,
// many short documents, empty documents, documents of one token and far longer than a chunk,
// head dims and state counts below, at and between the kernels' paddings (64, 128), groups
// shared by several heads, the delta clamp; every activation a column block of a wider tensor
// one element past an aligned address, outputs poisoned around their block, parameter gradients
// accumulated into random prefills, bitwise reproducibility, the one-token step over a document,
// the gated norm's four ops on a tensor-parallel share of a row.
// Tolerances: the scan's products take bf16 operands (the inputs, u = delta x, the masked decay
// matrices, the states rounded for C S^T) with f32 accumulation: outputs and gradients within
// kScanTol relative RMS (seen on an H200: 0.7e-3 to 7.5e-3 over these cases), chunk_states (f32 sums of bf16
// products) the same; the norm computes in f32 and rounds once: bf16_tol.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/ssd.h"
#include "tests/common/gpu_testing.h"
#include "tests/kernels/mamba/scan_testing.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::testing::scan_testing;
using ops::ColumnBlock;

namespace {

constexpr double kScanTol = 1.5e-2;
// dA_log sums per-token terms that cancel (its terms are not among the outputs, so no sum of their
// sizes to hold it to, as ddt_bias is): seen 2.1e-2 relative RMS over 791 tokens of one seed.
constexpr double kSumTol = 3e-2;

struct SsdCase {
  std::string name;
  std::vector<int32_t> docs;
  int64_t heads, p, groups, n, chunk;
  double dt_min = 0, dt_max = 0;
};

std::vector<SsdCase> ssd_cases() {
  return {
      {"docs 1,4,37,2,300 H4 P16 G2 N8 chunk32", {1, 4, 37, 2, 300}, 4, 16, 2, 8, 32},
      {"60 docs up to 40 H4 P64 G1 N128 chunk256", random_docs(60, 40, "ssd.docs"), 4, 64, 1, 128, 256},
      {"one doc 1000 H4 P128 G2 N64 chunk64", {1000}, 4, 128, 2, 64, 64},
      {"docs 700,1,90 H2 P128 G1 N128 chunk256 clamp", {700, 1, 90}, 2, 128, 1, 128, 256, 0.01, 0.08},
      {"empty docs 0,5,0,0,70,3,0 H3 P40 G3 N24 chunk32", {0, 5, 0, 0, 70, 3, 0}, 3, 40, 3, 24, 32},
      {"one token H2 P8 G1 N4", {1}, 2, 8, 1, 4, 256},
      {"exactly a chunk H8 P64 G2 N128 (4 heads a group)", {256}, 8, 64, 2, 128, 256},
      // Several heads a backward slice (ops::ssd_backward_slices: 35 chunks, 8 slices of 12 heads),
      // and documents ending on sub-chunk and chunk boundaries with only an upper clamp.
      {"docs 700,400 H12 P16 G1 N16 chunk32 (1-2 heads a slice)", {700, 400}, 12, 16, 1, 16, 32},
      {"docs 256,256,32,33 H32 P16 G1 N16 chunk32 dt_max only", {256, 256, 32, 33}, 32, 16, 1, 16, 32, 0, 0.05},
  };
}
std::vector<SsdCase> ssd_cases_large() {
  return {{"docs 3000,17,1100 H16 P64 G1 N128 chunk256", {3000, 17, 1100}, 16, 64, 1, 128, 256},
          {"300 docs up to 30 H6 P128 G2 N128 chunk256", random_docs(300, 30, "ssd.docs.large"), 6, 128, 2, 128, 256}};
}

// x, B, C: blocks of a conv output (T, H P + 2 G N + 1) from column 1; dt: columns [2, H + 2) of
// (T, H + 3); every tensor one element into its allocation.
struct SsdProblem {
  SsdCase c;
  int64_t t, width;
  DeviceInput xbc, dt, alog, D, bias;
  Owned cu;
  DeviceTensor gcu;
  int64_t gn() const { return c.groups * c.n; }
  ops::SsdArgs args(bool gpu) const {
    ops::SsdArgs a;
    const Tensor& xt = gpu ? xbc.dev.t : xbc.f64.t;
    const int64_t hp = c.heads * c.p;
    a.x = ColumnBlock(xt, 1, hp);
    a.B = ColumnBlock(xt, 1 + hp, gn());
    a.C = ColumnBlock(xt, 1 + hp + gn(), gn());
    a.dt = ColumnBlock(gpu ? dt.dev.t : dt.f64.t, 2, c.heads);
    a.A_log = gpu ? alog.dev.t : alog.f64.t;
    a.D = gpu ? D.dev.t : D.f64.t;
    a.dt_bias = gpu ? bias.dev.t : bias.f64.t;
    a.cu_seqlens = gpu ? gcu.t : cu.t;
    a.head_dim = c.p;
    a.groups = c.groups;
    a.dt_min = c.dt_min;
    a.dt_max = c.dt_max;
    a.chunk_len = c.chunk;
    return a;
  }
};

SsdProblem ssd_problem(const SsdCase& c) {
  const int64_t t = total(c.docs), h = c.heads, width = h * c.p + 2 * c.groups * c.n + 1;
  Owned alog = empty({h}, DType::F32, Device::CPU), bias = empty({h}, DType::F32, Device::CPU);
  for (int64_t i = 0; i < h; ++i) {
    set(alog, i, std::log(1.0 + 15.0 * i / std::max<int64_t>(h - 1, 1)));  // A from -1 to -16
    set(bias, i, std::log(std::expm1(0.005 + 0.06 * i / std::max<int64_t>(h - 1, 1))));  // delta ~ 0.005..0.07
  }
  Owned cu = cu_from(c.docs);
  DeviceTensor gcu = to_gpu(cu);
  return SsdProblem{c,
                    t,
                    width,
                    device_input(randn({t, width}, DType::F32, "ssd.xbc"), DType::BF16, kOffset),
                    device_input(randn({t, h + 3}, DType::F32, "ssd.dt", 0.5), DType::BF16, kOffset),
                    device_input(alog, DType::BF16, kOffset),
                    device_input(randn({h}, DType::F32, "ssd.D"), DType::BF16, kOffset),
                    device_input(bias, DType::BF16, kOffset),
                    std::move(cu),
                    std::move(gcu)};
}

void ssd_sweep(const std::vector<SsdCase>& cases) {
  if (!gpu_available_or_skip()) return;
  for (const SsdCase& c : cases) {
    SUBCASE(c.name.c_str()) {
      SsdProblem pb = ssd_problem(c);
      const int64_t t = pb.t, h = c.heads, hp = h * c.p, chunks = ops::scan_num_chunks(t, c.chunk);
      // Forward: y in columns [1, HP + 1) of (T, HP + 2).
      Owned y64 = empty({t, hp}, DType::F64, Device::CPU), s64 = empty({chunks, h, c.p, c.n}, DType::F64, Device::CPU);
      ops::ssd_scan_forward(pb.args(false), y64, s64);
      DeviceTensor gy = gpu_poisoned({t, hp + 2}, DType::BF16, kOffset);
      DeviceTensor gs = gpu_poisoned({chunks, h, c.p, c.n}, DType::F32, kOffset);
      ops::ssd_scan_forward(pb.args(true), ColumnBlock(gy.t, 1, hp), gs.t);
      close(block_host(gy.t, 1, hp).t, y64.t, kScanTol, "y");
      CHECK(outside_poisoned(gy.t, 1, hp));
      close(gs.t, s64.t, kScanTol, "chunk_states");

      // Backward: dx, dB, dC in their columns of a poisoned (T, width); ddt in [2, H + 2) of
      // (T, H + 3); the parameter gradients onto random prefills.
      Owned dy = randn({t, hp}, DType::F32, "ssd.dy");
      DeviceInput gdy = device_input(dy, DType::BF16, kOffset);
      Owned dxbc64 = zeros({t, pb.width}, DType::F64, Device::CPU), ddt64 = zeros({t, h + 3}, DType::F64, Device::CPU);
      Owned da64 = zeros({h}, DType::F64, Device::CPU), dd64 = zeros({h}, DType::F64, Device::CPU),
            db64 = zeros({h}, DType::F64, Device::CPU);
      const int64_t gn = pb.gn();
      auto grads = [&](const Tensor& dxbc, const Tensor& ddt, const Tensor& da, const Tensor& dd, const Tensor& db) {
        return ops::SsdGrads{ColumnBlock(dxbc, 1, hp), ColumnBlock(ddt, 2, h), ColumnBlock(dxbc, 1 + hp, gn),
                             ColumnBlock(dxbc, 1 + hp + gn, gn), da, dd, db};
      };
      ops::ssd_scan_backward(pb.args(false), gdy.f64, s64, grads(dxbc64, ddt64, da64, dd64, db64));
      Owned p0 = randn({3, h}, DType::F32, "ssd.prefill");
      auto run = [&](DeviceTensor& gdxbc, DeviceTensor& gddt, DeviceTensor& gp) {
        gdxbc = gpu_poisoned({t, pb.width}, DType::BF16, kOffset);
        gddt = gpu_poisoned({t, h + 3}, DType::BF16, kOffset);
        gp = to_gpu(p0, DType::F32, kOffset);
        ops::ssd_scan_backward(pb.args(true), gdy.dev.t, gs.t,
                               grads(gdxbc.t, gddt.t, gp.t.slice(0, 1).view({h}), gp.t.slice(1, 2).view({h}),
                                     gp.t.slice(2, 3).view({h})));
      };
      DeviceTensor gdxbc, gddt, gp;
      run(gdxbc, gddt, gp);
      close(block_host(gdxbc.t, 1, hp).t, block_host(dxbc64.t, 1, hp).t, kScanTol, "dx");
      close(block_host(gdxbc.t, 1 + hp, gn).t, block_host(dxbc64.t, 1 + hp, gn).t, kScanTol, "dB");
      close(block_host(gdxbc.t, 1 + hp + gn, gn).t, block_host(dxbc64.t, 1 + hp + gn, gn).t, kScanTol, "dC");
      CHECK(outside_poisoned(gdxbc.t, 1, hp + 2 * gn));
      close(block_host(gddt.t, 2, h).t, block_host(ddt64.t, 2, h).t, kScanTol, "ddt");
      CHECK(outside_poisoned(gddt.t, 2, h));
      Owned pg = f64_from(gp.t, p0);
      close(pg.t.slice(0, 1).view({h}), da64, kSumTol, "dA_log");
      close(pg.t.slice(1, 2).view({h}), dd64, kScanTol, "dD");
      // dt_bias's gradient sums ddt over the tokens: its error against the sum of their sizes.
      const Comparison sum = close_sums(pg.t.slice(2, 3).view({h}), db64,
                                        column_l1(ddt64, 2, h, [](int64_t, int64_t) { return 1.0; }), kScanTol);
      if (std::getenv("TEST_VERBOSE")) MESSAGE("ddt_bias: error / sum of |ddt| " << sum.rel_rms);
      INFO(sum.report);
      CHECK(sum.nonfinite == 0);
      CHECK(sum.rel_rms <= kScanTol);
      // Bitwise reproducible.
      DeviceTensor gdxbc2, gddt2, gp2;
      run(gdxbc2, gddt2, gp2);
      CHECK(bitwise_equal(block_host(gdxbc.t, 1, hp + 2 * gn), block_host(gdxbc2.t, 1, hp + 2 * gn)));
      CHECK(bitwise_equal(block_host(gddt.t, 2, h), block_host(gddt2.t, 2, h)));
      CHECK(bitwise_equal(gp.t, gp2.t));
    }
  }
}

}  // namespace

GPU_TEST_SWEEP("cuda mamba-2 scan forward and backward match the f64 reference", ssd_sweep, ssd_cases(),
               ssd_cases_large())

TEST_CASE("cuda mamba-2 scan step: token by token through a document, the full forward's outputs" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  SsdCase c{"", {40}, 4, 64, 2, 128, 256};
  SsdProblem pb = ssd_problem(c);
  const int64_t hp = c.heads * c.p;
  Owned y64 = empty({pb.t, hp}, DType::F64, Device::CPU),
        s64 = empty({1, c.heads, c.p, c.n}, DType::F64, Device::CPU);
  ops::ssd_scan_forward(pb.args(false), y64, s64);
  DeviceTensor state = to_gpu(zeros({c.heads, c.p, c.n}, DType::F32, Device::CPU), DType::F32, kOffset);
  Owned ys = empty({pb.t, hp}, DType::F64, Device::CPU);
  for (int64_t i = 0; i < pb.t; ++i) {
    ops::SsdArgs a = pb.args(true);
    auto row = [&](const ColumnBlock& b) { return ColumnBlock(b.base.slice(i, i + 1), b.col, b.width); };
    a.x = row(a.x), a.B = row(a.B), a.C = row(a.C), a.dt = row(a.dt);
    DeviceTensor gy = gpu_poisoned({1, hp + 1}, DType::BF16, kOffset);
    ops::ssd_scan_step(a, state.t, ColumnBlock(gy.t, 1, hp));
    Owned yh = block_host(gy.t, 1, hp);
    for (int64_t j = 0; j < hp; ++j) set(ys, i * hp + j, get(yh, j));
  }
  close(ys, y64, bf16_tol(y64), "step y");
}

TEST_CASE("cuda mamba-2 gated rmsnorm: the four ops match the f64 reference on a share of a row" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const auto& [rows, w] : std::vector<std::pair<int64_t, int64_t>>{{1, 7}, {37, 300}, {130, 1024}, {9, 4100}}) {
    CAPTURE(rows);
    CAPTURE(w);
    const int64_t total_width = 3 * w;  // this share is a third of the row
    // y, z: the two blocks of (rows, 2 w + 1) from column 1; dout (rows, w); out, dy, dz poisoned
    // around their columns [1, w + 1) of (rows, w + 2).
    DeviceInput yz = device_input(randn({rows, 2 * w + 1}, DType::F32, "gn.yz"), DType::BF16, kOffset);
    DeviceInput wt = device_input(randn({w}, DType::F32, "gn.w"), DType::BF16, kOffset);
    DeviceInput dout = device_input(randn({rows, w}, DType::F32, "gn.dout"), DType::BF16, kOffset);
    const ColumnBlock y64(yz.f64.t, 1, w), z64(yz.f64.t, 1 + w, w), yg(yz.dev.t, 1, w), zg(yz.dev.t, 1 + w, w);
    Owned ss64 = empty({rows}, DType::F64, Device::CPU), dot64 = empty({rows}, DType::F64, Device::CPU);
    Owned out64 = empty({rows, w}, DType::F64, Device::CPU), dy64 = empty({rows, w}, DType::F64, Device::CPU),
          dz64 = empty({rows, w}, DType::F64, Device::CPU), dw64 = zeros({w}, DType::F64, Device::CPU);
    ops::gated_rmsnorm_sumsq(y64, z64, ss64);
    ops::gated_rmsnorm_forward(y64, z64, wt.f64, ss64, total_width, 1e-5f, out64);
    ops::gated_rmsnorm_dot(dout.f64, y64, z64, wt.f64, dot64);
    ops::gated_rmsnorm_backward(dout.f64, y64, z64, wt.f64, ss64, dot64, total_width, 1e-5f, dy64, dz64, dw64);

    DeviceTensor ss = gpu_poisoned({rows}, DType::F32, kOffset), dot = gpu_poisoned({rows}, DType::F32, kOffset);
    DeviceTensor out = gpu_poisoned({rows, w + 2}, DType::BF16, kOffset), dy = gpu_poisoned({rows, w + 2}, DType::BF16, kOffset),
                 dz = gpu_poisoned({rows, w + 2}, DType::BF16, kOffset);
    Owned dw0 = randn({w}, DType::F32, "gn.dw0");
    DeviceTensor dw = to_gpu(dw0, DType::F32, kOffset);
    // The statistics from the reference's (as the layer's all-reduce would hand them over).
    ops::gated_rmsnorm_sumsq(yg, zg, ss.t);
    close(ss.t, ss64, 1e-5, "sumsq");
    ops::gated_rmsnorm_dot(dout.dev.t, yg, zg, wt.dev.t, dot.t);
    close(dot.t, dot64, 1e-5, "dot");
    DeviceTensor ssr = to_gpu(ss64, DType::F32), dotr = to_gpu(dot64, DType::F32);
    ops::gated_rmsnorm_forward(yg, zg, wt.dev.t, ssr.t, total_width, 1e-5f, ColumnBlock(out.t, 1, w));
    close(block_host(out.t, 1, w).t, out64, bf16_tol(out64), "out");
    CHECK(outside_poisoned(out.t, 1, w));
    ops::gated_rmsnorm_backward(dout.dev.t, yg, zg, wt.dev.t, ssr.t, dotr.t, total_width, 1e-5f,
                                ColumnBlock(dy.t, 1, w), ColumnBlock(dz.t, 1, w), dw.t);
    close(block_host(dy.t, 1, w).t, dy64, bf16_tol(dy64), "dy");
    close(block_host(dz.t, 1, w).t, dz64, bf16_tol(dz64), "dz");
    CHECK(outside_poisoned(dy.t, 1, w));
    CHECK(outside_poisoned(dz.t, 1, w));
    close(f64_from(dw.t, dw0).t, dw64, 1e-5, "dweight");
  }
}
