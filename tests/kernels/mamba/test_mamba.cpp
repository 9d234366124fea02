// GPU tests of cuda/mamba (causal conv1d, selective scan) against the f64 CPU reference
// (csrc/ref/mamba.cpp) on fresh random inputs: odd document lengths, many documents, documents
// of length 1 and far longer than a chunk, kernels longer than a document, channel counts that
// are not multiples of 32 or 128, every activation a column block of a wider tensor placed one
// element past an aligned address (the layer's in_proj halves and B|C blocks), poisoned outputs
// whose neighbouring columns must keep their poison, parameter gradients accumulated into
// random prefills, bitwise reproducibility, row strides the kernels reject. A CPU case checks the
// polynomial log1p of the scan's softplus (cuda/mamba/poly_math.h).
// Tolerances: bf16 outputs within twice the error of rounding the exact result to bf16 plus 1e-4
// (the reference runs on the same bf16-rounded inputs; the kernels compute in f32 and round
// once). f32 outputs: chunk_states 1e-4 (f32 recurrences with ex2.approx over up to thousands of
// tokens), conv parameter gradients 1e-4, scan parameter gradients 1e-3 (the backward splits
// the dA and ddelta sums into forward and backward parts that cancel: f32 error grows with the
// chunk length).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/mamba/poly_math.h"
#include "ops/mamba.h"
#include "tests/common/gpu_testing.h"
#include "tests/kernels/mamba/scan_testing.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::testing::scan_testing;
using ops::ColumnBlock;

namespace {

// ---- conv ----

struct ConvCase {
  std::string name;
  std::vector<int32_t> docs;
  int64_t di, k;
  bool bias, silu;
  // Aligned tensors and Di % 4 == 0: the forward's wide path (4 channels a thread, 8-byte
  // accesses); else every tensor starts one element into its allocation, x and dx from column 1
  // (one channel a thread).
  bool wide = false;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"docs 1,2,7,3,200 Di50 K4", {1, 2, 7, 3, 200}, 50, 4, true, true},
      {"60 docs up to 30 Di129 K4", random_docs(60, 30, "conv.docs"), 129, 4, true, true},
      {"one doc 1000 Di33 K3 no bias", {1000}, 33, 3, false, true},
      {"docs 5000,1,1,17 Di300 K4 linear", {5000, 1, 1, 17}, 300, 4, true, false},
      {"K2 Di7", {3, 1, 40}, 7, 2, true, true},
      {"K1 Di5", {9, 2}, 5, 1, true, true},
      {"one token", {1}, 3, 4, true, true},
      {"wide: docs 1,2,7,3,200 Di64 K4", {1, 2, 7, 3, 200}, 64, 4, true, true, true},
      {"wide: 60 docs up to 30 Di136 K3", random_docs(60, 30, "conv.docs.wide"), 136, 3, true, true, true},
      {"wide: docs 700,1,300 Di8 K4 linear no bias", {700, 1, 300}, 8, 4, false, false, true},
      {"wide: K1 Di16", {9, 2, 33}, 16, 1, true, true, true},
      // Model widths: 1024 threads of 4 channels a token forward (8 blocks of channels; 32 in
      // the backward, a channel a thread).
      {"wide: docs 90,1,7 Di4096 K4", {90, 1, 7}, 4096, 4, true, true, true},
      {"docs 20,3 Di4100 K3", {20, 3}, 4100, 3, true, true},
  };
}

// The gpu-slow tier: model widths over 8192 tokens, where the runs grow past 32 tokens
// (conv_params' thread target: 64 forward, 256 backward).
std::vector<ConvCase> conv_cases_large() {
  return {
      {"wide: docs 9000,1,700 Di4096 K4", {9000, 1, 700}, 4096, 4, true, true, true},
      {"docs 2000,3 Di4100 K3", {2000, 3}, 4100, 3, true, true},
  };
}

void conv_sweep(const std::vector<ConvCase>& cases) {
  if (!gpu_available_or_skip()) return;
  for (const ConvCase& c : cases) {
    SUBCASE(c.name.c_str()) {
      const int64_t t = total(c.docs), di = c.di, k = c.k;
      // x: the first half of an in_proj-like (T, 2 Di + 1) output, from column 1 (wide: (T, 2 Di)
      // from column 0); y in columns [2, Di + 2) of (T, Di + 2) (wide: [8, Di + 8) of (T, Di + 16));
      // dx in x's columns of a tensor of x's shape.
      const int64_t off = c.wide ? 0 : kOffset, xcol = c.wide ? 0 : 1, xld = c.wide ? 2 * di : 2 * di + 1;
      const int64_t ycol = c.wide ? 8 : 2, yld = c.wide ? di + 16 : di + 2;
      auto [gxz, xz64] = device_input(randn({t, xld}, DType::F32, "conv.xz"), DType::BF16, off);
      auto [gw, w64] = device_input(randn({di, k}, DType::F32, "conv.w", 0.5), DType::BF16, kOffset);
      auto [gb, b64] = device_input(randn({di}, DType::F32, "conv.b", 0.5), DType::BF16, kOffset);
      auto [gdy, dy64] = device_input(randn({t, di}, DType::F32, "conv.dy"), DType::BF16, off);
      Owned cu = cu_from(c.docs);
      DeviceTensor gcu = to_gpu(cu);
      const Tensor bias64 = c.bias ? b64.t : Tensor(), gbias = c.bias ? gb.t : Tensor();

      Owned y64 = empty({t, di}, DType::F64, Device::CPU);
      ops::causal_conv1d_forward(ColumnBlock(xz64, xcol, di), w64, bias64, cu, c.silu, y64);
      DeviceTensor gy = gpu_poisoned({t, yld}, DType::BF16, off);
      ops::causal_conv1d_forward(ColumnBlock(gxz.t, xcol, di), gw.t, gbias, gcu.t, c.silu,
                                 ColumnBlock(gy.t, ycol, di));
      CHECK_CLOSE(block_host(gy.t, ycol, di).t, y64.t, bf16_tol(y64));
      CHECK(outside_poisoned(gy.t, ycol, di));

      Owned dx64 = zeros({t, di}, DType::F64, Device::CPU), dw64 = zeros({di, k}, DType::F64, Device::CPU),
            db64 = zeros({di}, DType::F64, Device::CPU);
      ops::causal_conv1d_backward(dy64, ColumnBlock(xz64, xcol, di), w64, bias64, cu, c.silu, dx64, dw64,
                                  c.bias ? db64.t : Tensor());
      Owned dw0 = randn({di, k}, DType::F32, "conv.dw0"), db0 = randn({di}, DType::F32, "conv.db0");
      DeviceTensor gdw = to_gpu(dw0, DType::F32), gdb = to_gpu(db0, DType::F32);
      DeviceTensor gdx = gpu_poisoned({t, xld}, DType::BF16, off);
      ops::causal_conv1d_backward(gdy.t, ColumnBlock(gxz.t, xcol, di), gw.t, gbias, gcu.t, c.silu,
                                  ColumnBlock(gdx.t, xcol, di), gdw.t, c.bias ? gdb.t : Tensor());
      CHECK_CLOSE(block_host(gdx.t, xcol, di).t, dx64.t, bf16_tol(dx64));
      CHECK(outside_poisoned(gdx.t, xcol, di));
      CHECK_CLOSE(f64_from(gdw.t, dw0).t, dw64.t, 1e-4);
      if (c.bias)
        CHECK_CLOSE(f64_from(gdb.t, db0).t, db64.t, 1e-4);
      else
        CHECK(bitwise_equal(gdb.t, to_gpu(db0, DType::F32).t));

      // Bitwise reproducible.
      DeviceTensor gdw2 = to_gpu(dw0, DType::F32), gdx2 = gpu_poisoned({t, xld}, DType::BF16, off);
      ops::causal_conv1d_backward(gdy.t, ColumnBlock(gxz.t, xcol, di), gw.t, gbias, gcu.t, c.silu,
                                  ColumnBlock(gdx2.t, xcol, di), gdw2.t, Tensor());
      CHECK(bitwise_equal(gdw.t, gdw2.t));
      CHECK(bitwise_equal(block_host(gdx.t, xcol, di), block_host(gdx2.t, xcol, di)));
    }
  }
}

}  // namespace

GPU_TEST_SWEEP("cuda mamba conv1d forward and backward match the f64 reference", conv_sweep,
               conv_cases(), conv_cases_large())

// ---- the polynomial log1p of the scan's softplus ----

TEST_CASE("mamba log1p_q: u log1p_q(u) within 2e-7 of log1p(u) on (0, 1]; the softplus built on it") {
  using cuda::mamba::log1p_q;
  double worst = 0;
  float worst_u = 0;
  auto check = [&](float u) {
    const double exact = std::log1p(static_cast<double>(u)), rel = std::fabs(u * log1p_q(u) - exact) / exact;
    if (rel > worst) worst = rel, worst_u = u;
  };
  for (int i = 1; i <= 1 << 20; ++i) check(static_cast<float>(i) / (1 << 20));
  for (float u = 1e-38f; u < 1e-3f; u *= 1.01f) check(u);
  CAPTURE(worst_u);
  CHECK(worst < 2e-7);
  // softplus(v) = max(v, 0) + u log1p_q(u), u = e^-|v| (scan_impl.cuh's softplus_fast; here the
  // exp rounded once instead of ex2.approx's 2 ulp) against log1p(e^v) in f64.
  double worst_sp = 0;
  for (float v = -85.f; v <= 40.f; v += 1.f / 1024) {
    const float u = static_cast<float>(std::exp(-std::fabs(static_cast<double>(v))));
    const float sp = std::fma(u, log1p_q(u), std::max(v, 0.f));
    const double exact = v > 0 ? v + std::log1p(std::exp(-static_cast<double>(v))) : std::log1p(std::exp(static_cast<double>(v)));
    worst_sp = std::max(worst_sp, std::fabs(sp - exact) / exact);
  }
  CHECK(worst_sp < 4e-7);
}

// ---- scan ----

namespace {

struct ScanCase {
  std::string name;
  std::vector<int32_t> docs;
  int64_t di, n, chunk;
};

std::vector<ScanCase> scan_cases() {
  return {
      {"docs 1,4,7,2,9 Di5 N3 chunk4", {1, 4, 7, 2, 9}, 5, 3, 4},
      {"60 docs up to 40 Di130 N16 chunk64", random_docs(60, 40, "scan.docs"), 130, 16, 64},
      {"one doc 3000 Di33 N16 chunk64", {3000}, 33, 16, 64},
      {"one doc 2000 Di40 N16 chunk128", {2000}, 40, 16, 128},
      {"docs 1,1,1,500,1 Di257 N7 chunk13", {1, 1, 1, 500, 1}, 257, 7, 13},
      {"one token Di3 N2", {1}, 3, 2, 64},
      {"one chunk exactly Di40 N16", {64}, 40, 16, 64},
      {"docs 100,3,77 Di64 N16 chunk1", {100, 3, 77}, 64, 16, 1},
      {"empty docs 0,5,0,0,70,3,0 Di37 N16 chunk16", {0, 5, 0, 0, 70, 3, 0}, 37, 16, 16},
  };
}

// The device and reference sides of one scan problem. x and z are the two halves of an in_proj
// output (T, 2 Di + 1) from column 1; B and C the halves of a (T, 2N + 1) block from column 1.
struct ScanProblem {
  int64_t t, di, n, chunk;
  DeviceInput xz, dt, alog, bc, D, bias;
  Owned cu;
  DeviceTensor gcu;
  ops::ScanArgs args(bool gpu) const {
    ops::ScanArgs a;
    const Tensor& xzt = gpu ? xz.dev.t : xz.f64.t;
    const Tensor& bct = gpu ? bc.dev.t : bc.f64.t;
    a.x = ColumnBlock(xzt, 1, di);
    a.z = ColumnBlock(xzt, 1 + di, di);
    a.dt = gpu ? dt.dev.t : dt.f64.t;
    a.A_log = gpu ? alog.dev.t : alog.f64.t;
    a.B = ColumnBlock(bct, 1, n);
    a.C = ColumnBlock(bct, 1 + n, n);
    a.D = gpu ? D.dev.t : D.f64.t;
    a.dt_bias = gpu ? bias.dev.t : bias.f64.t;
    a.cu_seqlens = gpu ? gcu.t : cu.t;
    a.chunk_len = chunk;
    return a;
  }
};

ScanProblem scan_problem(const ScanCase& c) {
  const int64_t t = total(c.docs), di = c.di, n = c.n;
  Owned alog = randn({di, n}, DType::F32, "scan.alog", 0.1);
  for (int64_t d = 0; d < di; ++d)
    for (int64_t j = 0; j < n; ++j) set(alog, d * n + j, get(alog, d * n + j) + std::log(j + 1.0));
  Owned bias = randn({di}, DType::F32, "scan.bias", 0.5);
  for (int64_t d = 0; d < di; ++d) set(bias, d, get(bias, d) - 2.0);  // delta around 0.1
  Owned cu = cu_from(c.docs);
  DeviceTensor gcu = to_gpu(cu);
  return ScanProblem{t,
                     di,
                     n,
                     c.chunk,
                     device_input(randn({t, 2 * di + 1}, DType::F32, "scan.xz"), DType::BF16, kOffset),
                     device_input(randn({t, di}, DType::F32, "scan.dt", 0.5), DType::BF16, kOffset),
                     device_input(alog, DType::BF16, kOffset),
                     device_input(randn({t, 2 * n + 1}, DType::F32, "scan.bc"), DType::BF16, kOffset),
                     device_input(randn({di}, DType::F32, "scan.D"), DType::BF16, kOffset),
                     device_input(bias, DType::BF16, kOffset),
                     std::move(cu),
                     std::move(gcu)};
}

}  // namespace

TEST_CASE("cuda mamba selective scan forward matches the f64 reference (outputs, chunk states)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const ScanCase& c : scan_cases()) {
    SUBCASE(c.name.c_str()) {
      ScanProblem pb = scan_problem(c);
      const int64_t chunks = ops::scan_num_chunks(pb.t, pb.chunk);
      Owned y64 = empty({pb.t, pb.di}, DType::F64, Device::CPU),
            s64 = empty({chunks, pb.n, pb.di}, DType::F64, Device::CPU);
      ops::selective_scan_forward(pb.args(false), y64, s64);
      DeviceTensor gy = gpu_poisoned({pb.t, pb.di + 1}, DType::BF16, kOffset);  // y in [1, di + 1)
      DeviceTensor gs = gpu_poisoned({chunks, pb.n, pb.di}, DType::F32, kOffset);
      ops::selective_scan_forward(pb.args(true), ColumnBlock(gy.t, 1, pb.di), gs.t);
      CHECK_CLOSE(block_host(gy.t, 1, pb.di).t, y64.t, bf16_tol(y64));
      CHECK(outside_poisoned(gy.t, 1, pb.di));
      CHECK_CLOSE(gs.t, s64.t, 1e-4);
      // Bitwise reproducible.
      DeviceTensor gy2 = gpu_poisoned({pb.t, pb.di + 1}, DType::BF16, kOffset);
      DeviceTensor gs2 = gpu_poisoned({chunks, pb.n, pb.di}, DType::F32, kOffset);
      ops::selective_scan_forward(pb.args(true), ColumnBlock(gy2.t, 1, pb.di), gs2.t);
      CHECK(bitwise_equal(block_host(gy.t, 1, pb.di), block_host(gy2.t, 1, pb.di)));
      CHECK(bitwise_equal(gs.t, gs2.t));
    }
  }
}

TEST_CASE("cuda mamba selective scan backward matches the f64 reference and accumulates" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const ScanCase& c : scan_cases()) {
    SUBCASE(c.name.c_str()) {
      ScanProblem pb = scan_problem(c);
      const int64_t t = pb.t, di = pb.di, n = pb.n, chunks = ops::scan_num_chunks(t, pb.chunk);
      auto [gdy, dy64] = device_input(randn({t, di}, DType::F32, "scan.dy"), DType::BF16, kOffset);
      Owned y64 = empty({t, di}, DType::F64, Device::CPU), s64 = empty({chunks, n, di}, DType::F64, Device::CPU);
      ops::selective_scan_forward(pb.args(false), y64, s64);
      Owned dx64 = zeros({t, di}, DType::F64, Device::CPU), ddt64 = zeros({t, di}, DType::F64, Device::CPU),
            dbc64 = zeros({t, 2 * n}, DType::F64, Device::CPU), dz64 = zeros({t, di}, DType::F64, Device::CPU),
            dalog64 = zeros({di, n}, DType::F64, Device::CPU), dD64 = zeros({di}, DType::F64, Device::CPU),
            dbias64 = zeros({di}, DType::F64, Device::CPU);
      ops::selective_scan_backward(pb.args(false), dy64, s64,
                                   {dx64, ddt64, ColumnBlock(dbc64, 0, n), ColumnBlock(dbc64, n, n), dz64,
                                    dalog64, dD64, dbias64});

      // The states the kernels get are the reference's, rounded to f32.
      auto [gs, s_r] = device_input(s64, DType::F32, kOffset);
      DeviceTensor gdxz = gpu_poisoned({t, 2 * di + 1}, DType::BF16, kOffset);  // dx and dz halves
      DeviceTensor gddt = gpu_poisoned({t, di}, DType::BF16, kOffset);
      DeviceTensor gdbc = gpu_poisoned({t, 2 * n + 1}, DType::BF16, kOffset);
      Owned dalog0 = randn({di, n}, DType::F32, "scan.dalog0"), dD0 = randn({di}, DType::F32, "scan.dD0"),
            dbias0 = randn({di}, DType::F32, "scan.dbias0");
      DeviceTensor gdalog = to_gpu(dalog0, DType::F32), gdD = to_gpu(dD0, DType::F32),
                   gdbias = to_gpu(dbias0, DType::F32);
      const ops::ScanGrads grads{ColumnBlock(gdxz.t, 1, di),  gddt.t,   ColumnBlock(gdbc.t, 1, n),
                                 ColumnBlock(gdbc.t, 1 + n, n), ColumnBlock(gdxz.t, 1 + di, di),
                                 gdalog.t, gdD.t, gdbias.t};
      ops::selective_scan_backward(pb.args(true), gdy.t, gs.t, grads);
      CHECK_CLOSE(block_host(gdxz.t, 1, di).t, dx64.t, bf16_tol(dx64));
      CHECK_CLOSE(block_host(gdxz.t, 1 + di, di).t, dz64.t, bf16_tol(dz64));
      CHECK_CLOSE(gddt.t, ddt64.t, bf16_tol(ddt64));
      CHECK_CLOSE(block_host(gdbc.t, 1, 2 * n).t, dbc64.t, bf16_tol(dbc64));
      CHECK(outside_poisoned(gdbc.t, 1, 2 * n));
      {
        Owned h = to_host(gdxz.t, DType::F64);
        bool col0 = true;
        for (int64_t r = 0; r < t; ++r) col0 = col0 && std::isnan(get(h, r * (2 * di + 1)));
        CHECK(col0);
      }
      CHECK_CLOSE(f64_from(gdalog.t, dalog0).t, dalog64.t, 1e-3);
      CHECK_CLOSE(f64_from(gdD.t, dD0).t, dD64.t, 1e-3);
      CHECK_CLOSE(f64_from(gdbias.t, dbias0).t, dbias64.t, 1e-3);

      // Bitwise reproducible.
      DeviceTensor gdalog2 = to_gpu(dalog0, DType::F32), gdD2 = to_gpu(dD0, DType::F32),
                   gdbias2 = to_gpu(dbias0, DType::F32), gddt2 = gpu_poisoned({t, di}, DType::BF16, kOffset),
                   gdbc2 = gpu_poisoned({t, 2 * n + 1}, DType::BF16, kOffset),
                   gdxz2 = gpu_poisoned({t, 2 * di + 1}, DType::BF16, kOffset);
      ops::selective_scan_backward(pb.args(true), gdy.t, gs.t,
                                   {ColumnBlock(gdxz2.t, 1, di), gddt2.t, ColumnBlock(gdbc2.t, 1, n),
                                    ColumnBlock(gdbc2.t, 1 + n, n), ColumnBlock(gdxz2.t, 1 + di, di),
                                    gdalog2.t, gdD2.t, gdbias2.t});
      CHECK(bitwise_equal(gdalog.t, gdalog2.t));
      CHECK(bitwise_equal(gdbias.t, gdbias2.t));
      CHECK(bitwise_equal(gddt.t, gddt2.t));
      CHECK(bitwise_equal(block_host(gdbc.t, 1, 2 * n), block_host(gdbc2.t, 1, 2 * n)));
      CHECK(bitwise_equal(block_host(gdxz2.t, 1, 2 * di), block_host(gdxz.t, 1, 2 * di)));
      CHECK(bitwise_equal(gdD.t, gdD2.t));
    }
  }
}

TEST_CASE("cuda mamba ops reject what the kernels do not cover, naming it" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  ScanProblem pb = scan_problem({"small", {5, 3}, 4, 3, 4});
  DeviceTensor gy = gpu_empty({pb.t, pb.di}, DType::BF16);
  DeviceTensor gs = gpu_empty({2, pb.n, pb.di}, DType::F32);
  ops::ScanArgs a = pb.args(true);
  a.chunk_len = 200;
  DeviceTensor gs1 = gpu_empty({1, pb.n, pb.di}, DType::F32);
  CHECK_THROWS_WITH_AS(ops::selective_scan_forward(a, gy.t, gs1.t), doctest::Contains("chunk_len"), Error);
  DeviceTensor w = gpu_empty({pb.di, 5}, DType::BF16);
  CHECK_THROWS_WITH_AS(ops::causal_conv1d_forward(ColumnBlock(pb.xz.dev.t, 1, pb.di), w.t, Tensor(), pb.gcu.t,
                                                  true, gy.t),
                       doctest::Contains("kernel size"), Error);
  DeviceTensor gy32 = gpu_empty({pb.t, pb.di}, DType::F32);
  CHECK_THROWS_WITH_AS(ops::selective_scan_forward(pb.args(true), gy32.t, gs.t), doctest::Contains("y"), Error);

  // Row strides the scan kernels step in 32 bits: a (T, 2^31) view of a small buffer (only its
  // shape is read: the checks come before any kernel).
  const Tensor wide(pb.xz.dev.t.data, DType::BF16, Device::CUDA, {pb.t, int64_t{1} << 31});
  ops::ScanArgs aw = pb.args(true);
  aw.x = ColumnBlock(wide, 1, pb.di);
  CHECK_THROWS_WITH_AS(ops::selective_scan_forward(aw, gy.t, gs.t),
                       doctest::Contains("selective_scan_forward: x's row stride 2147483648 does not fit 32 bits"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::selective_scan_forward(pb.args(true), ColumnBlock(wide, 1, pb.di), gs.t),
                       doctest::Contains("selective_scan_forward: y's row stride 2147483648"), Error);
  DeviceTensor gdy = gpu_empty({pb.t, pb.di}, DType::BF16), gdx = gpu_empty({pb.t, pb.di}, DType::BF16),
               gddt = gpu_empty({pb.t, pb.di}, DType::BF16), gdbc = gpu_empty({pb.t, 2 * pb.n}, DType::BF16),
               gdalog = gpu_empty({pb.di, pb.n}, DType::F32), gdD = gpu_empty({pb.di}, DType::F32),
               gdbias = gpu_empty({pb.di}, DType::F32);
  const ops::ScanGrads gw{gdx.t, gddt.t, ColumnBlock(gdbc.t, 0, pb.n), ColumnBlock(gdbc.t, pb.n, pb.n),
                          ColumnBlock(wide, 1, pb.di), gdalog.t, gdD.t, gdbias.t};
  CHECK_THROWS_WITH_AS(ops::selective_scan_backward(pb.args(true), gdy.t, gs.t, gw),
                       doctest::Contains("selective_scan_backward: dz's row stride 2147483648 does not fit 32 bits"),
                       Error);
}
