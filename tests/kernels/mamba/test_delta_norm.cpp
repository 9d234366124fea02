// GPU tests of the Gated DeltaNet kernels of cuda/mamba/delta_norm.cu against the f64 CPU
// reference (csrc/ref/delta.cpp) on the same bf16-rounded inputs:
//   head_rmsnorm_gated forward and backward: head dims 128 (Qwen3-Next's; 4 heads, odd token
//     counts 37 and 1000), 64 (3 heads), 256, one below a warp (7) and one not a multiple of it
//     (40, 5 heads); rows past one backward group (64 rows) and within one;
//   gated_delta_step: token by token through a 50-token document (2 key heads, 4 value heads:
//     two value heads a key head), each token's o against the f64 forward of the document and
//     the final state against the f64 step's, head dims 64, 128 and the odd pair 32 / 48;
//   the launchers naming an argument of the wrong dtype.
// Every activation a column block of a wider tensor one element past an aligned address,
// outputs poisoned around their block, dweight accumulated onto a random prefill, bitwise
// reproducibility of a second run.
// Tolerances: the kernels compute in f32 from the bf16 inputs and round each bf16 output once:
// out, dy, dz and the step's o within bf16_tol (twice the error of rounding the reference to
// bf16); the f32 results (rstd, dweight: f32 sums of up to 4000 terms; the step's state) within
// 1e-5. An f32 emulation of the step's order on the CPU (50 tokens, these head dims and 256)
// measured the state at 1.7e-7 to 2.7e-7 relative RMS and o before rounding at 2e-7 to 4e-7,
// so o's error is its rounding (1.7e-3 against bf16_tol's 3.4e-3).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/delta.h"
#include "tests/common/gpu_testing.h"
#include "tests/kernels/mamba/scan_testing.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::testing::scan_testing;
using ops::ColumnBlock;

namespace {

constexpr float kEps = 1e-6f;      // Qwen3-Next's rms_norm_eps
constexpr double kF32Tol = 1e-5;   // the f32 results

struct NormCase {
  int64_t tokens, heads, d;
};

void norm_case(const NormCase& c) {
  const int64_t t = c.tokens, h = c.heads, w = h * c.d;
  // y, z: the two blocks of (T, 2 w + 1) from column 1 (o and the in_proj output's z in the
  // layer); dout (T, w); out, dy, dz poisoned around their columns [1, w + 1) of (T, w + 2).
  DeviceInput yz = device_input(randn({t, 2 * w + 1}, DType::F32, "gdn.norm.yz"), DType::BF16, kOffset);
  DeviceInput wt = device_input(randn({c.d}, DType::F32, "gdn.norm.w"), DType::BF16, kOffset);
  DeviceInput dout = device_input(randn({t, w}, DType::F32, "gdn.norm.dout"), DType::BF16, kOffset);
  const ColumnBlock y64(yz.f64.t, 1, w), z64(yz.f64.t, 1 + w, w), yg(yz.dev.t, 1, w), zg(yz.dev.t, 1 + w, w);
  Owned out64 = empty({t, w}, DType::F64, Device::CPU), r64 = empty({t, h}, DType::F64, Device::CPU);
  Owned dy64 = empty({t, w}, DType::F64, Device::CPU), dz64 = empty({t, w}, DType::F64, Device::CPU),
        dw64 = zeros({c.d}, DType::F64, Device::CPU);
  ops::head_rmsnorm_gated_forward(y64, z64, wt.f64, kEps, out64, r64);
  ops::head_rmsnorm_gated_backward(dout.f64, y64, z64, wt.f64, r64, dy64, dz64, dw64);

  auto forward = [&](DeviceTensor& out, DeviceTensor& rstd) {
    out = gpu_poisoned({t, w + 2}, DType::BF16, kOffset);
    rstd = gpu_poisoned({t, h}, DType::F32, kOffset);
    ops::head_rmsnorm_gated_forward(yg, zg, wt.dev.t, kEps, ColumnBlock(out.t, 1, w), rstd.t);
  };
  DeviceTensor out, rstd;
  forward(out, rstd);
  close(block_host(out.t, 1, w).t, out64, bf16_tol(out64), "out");
  CHECK(outside_poisoned(out.t, 1, w));
  close(rstd.t, r64, kF32Tol, "rstd");

  // Backward from the GPU's rstd (as the layer saves it); dweight onto a random prefill.
  Owned dw0 = randn({c.d}, DType::F32, "gdn.norm.dw0");
  auto backward = [&](DeviceTensor& dy, DeviceTensor& dz, DeviceTensor& dw) {
    dy = gpu_poisoned({t, w + 2}, DType::BF16, kOffset);
    dz = gpu_poisoned({t, w + 2}, DType::BF16, kOffset);
    dw = to_gpu(dw0, DType::F32, kOffset);
    ops::head_rmsnorm_gated_backward(dout.dev.t, yg, zg, wt.dev.t, rstd.t, ColumnBlock(dy.t, 1, w),
                                     ColumnBlock(dz.t, 1, w), dw.t);
  };
  DeviceTensor dy, dz, dw;
  backward(dy, dz, dw);
  close(block_host(dy.t, 1, w).t, dy64, bf16_tol(dy64), "dy");
  close(block_host(dz.t, 1, w).t, dz64, bf16_tol(dz64), "dz");
  CHECK(outside_poisoned(dy.t, 1, w));
  CHECK(outside_poisoned(dz.t, 1, w));
  close(f64_from(dw.t, dw0).t, dw64, kF32Tol, "dweight");

  // Bitwise reproducible.
  DeviceTensor out2, rstd2, dy2, dz2, dw2;
  forward(out2, rstd2);
  backward(dy2, dz2, dw2);
  CHECK(bitwise_equal(block_host(out.t, 1, w), block_host(out2.t, 1, w)));
  CHECK(bitwise_equal(rstd.t, rstd2.t));
  CHECK(bitwise_equal(block_host(dy.t, 1, w), block_host(dy2.t, 1, w)));
  CHECK(bitwise_equal(block_host(dz.t, 1, w), block_host(dz2.t, 1, w)));
  CHECK(bitwise_equal(dw.t, dw2.t));
}

// One document of `tokens` tokens: q, k, v the blocks of (T, 1 + 2 Hk dk + Hv dv) from column 1;
// b, a of (T, 2 Hv + 1) from column 1; A_log (A from 1 to 16) and dt_bias (dt about 0.005 to
// 0.065) spread over the heads, so the decay per token runs from about 0.99 to 0.4.
struct StepProblem {
  int64_t tokens, hk, hv, dk, dv;
  DeviceInput qkv, ba, alog, bias;
  Owned cu;
  int64_t qk() const { return hk * dk; }
  int64_t vw() const { return hv * dv; }
  // The whole document (cu_seqlens set on the CPU only) or its row i (one token, for the step).
  ops::DeltaArgs args(bool gpu) const {
    ops::DeltaArgs a;
    const Tensor& x = gpu ? qkv.dev.t : qkv.f64.t;
    const Tensor& g = gpu ? ba.dev.t : ba.f64.t;
    a.q = ColumnBlock(x, 1, qk());
    a.k = ColumnBlock(x, 1 + qk(), qk());
    a.v = ColumnBlock(x, 1 + 2 * qk(), vw());
    a.b = ColumnBlock(g, 1, hv);
    a.a = ColumnBlock(g, 1 + hv, hv);
    a.A_log = gpu ? alog.dev.t : alog.f64.t;
    a.dt_bias = gpu ? bias.dev.t : bias.f64.t;
    if (!gpu) a.cu_seqlens = cu.t;
    a.key_heads = hk;
    return a;
  }
  ops::DeltaArgs row(bool gpu, int64_t i) const {
    ops::DeltaArgs a = args(gpu);
    auto one = [&](const ColumnBlock& b) { return ColumnBlock(b.base.slice(i, i + 1), b.col, b.width); };
    a.q = one(a.q), a.k = one(a.k), a.v = one(a.v), a.a = one(a.a), a.b = one(a.b);
    a.cu_seqlens = Tensor{};
    return a;
  }
};

StepProblem step_problem(int64_t tokens, int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  Owned alog = empty({hv}, DType::F32, Device::CPU), bias = empty({hv}, DType::F32, Device::CPU);
  for (int64_t i = 0; i < hv; ++i) {
    const double f = static_cast<double>(i) / static_cast<double>(std::max<int64_t>(hv - 1, 1));
    set(alog, i, std::log(1.0 + 15.0 * f));
    set(bias, i, std::log(std::expm1(0.005 + 0.06 * f)));
  }
  const int64_t width = 1 + 2 * hk * dk + hv * dv;
  return StepProblem{tokens,
                     hk,
                     hv,
                     dk,
                     dv,
                     device_input(randn({tokens, width}, DType::F32, "gdn.step.qkv"), DType::BF16, kOffset),
                     device_input(randn({tokens, 2 * hv + 1}, DType::F32, "gdn.step.ba"), DType::BF16, kOffset),
                     device_input(alog, DType::BF16, kOffset),
                     device_input(bias, DType::BF16, kOffset),
                     cu_from({static_cast<int32_t>(tokens)})};
}

// The GPU's step over every token from a zero state: the outputs (T, Hv dv) in f64 and the state.
DeviceTensor gpu_steps(const StepProblem& pb, Owned& o) {
  DeviceTensor state = to_gpu(zeros({pb.hv, pb.dk, pb.dv}, DType::F32, Device::CPU), DType::F32, kOffset);
  const int64_t vw = pb.vw();
  o = empty({pb.tokens, vw}, DType::F64, Device::CPU);
  for (int64_t i = 0; i < pb.tokens; ++i) {
    DeviceTensor go = gpu_poisoned({1, vw + 2}, DType::BF16, kOffset);
    ops::gated_delta_step(pb.row(true, i), state.t, ColumnBlock(go.t, 1, vw));
    CHECK(outside_poisoned(go.t, 1, vw));
    Owned oh = block_host(go.t, 1, vw);
    for (int64_t j = 0; j < vw; ++j) set(o, i * vw + j, get(oh, j));
  }
  return state;
}

}  // namespace

TEST_CASE("cuda gated deltanet head rmsnorm gated: forward and backward match the f64 reference" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const NormCase& c : std::vector<NormCase>{
           {37, 4, 128}, {1000, 4, 128}, {50, 3, 64}, {21, 2, 256}, {3, 1, 7}, {29, 5, 40}}) {
    SUBCASE((std::to_string(c.tokens) + " tokens, " + std::to_string(c.heads) + " heads of " +
             std::to_string(c.d))
                .c_str()) {
      norm_case(c);
    }
  }
}

TEST_CASE("cuda gated deltanet step: token by token through a document, the f64 forward's outputs and state" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const auto& [dk, dv] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {128, 128}, {32, 48}}) {
    SUBCASE(("dk " + std::to_string(dk) + " dv " + std::to_string(dv)).c_str()) {
      const StepProblem pb = step_problem(50, 2, 4, dk, dv);
      Owned o64 = empty({pb.tokens, pb.vw()}, DType::F64, Device::CPU);
      ops::gated_delta_forward(pb.args(false), o64);
      Owned s64 = zeros({pb.hv, dk, dv}, DType::F64, Device::CPU), step_o = empty({1, pb.vw()}, DType::F64, Device::CPU);
      for (int64_t i = 0; i < pb.tokens; ++i) ops::gated_delta_step(pb.row(false, i), s64, step_o);
      Owned o;
      DeviceTensor state = gpu_steps(pb, o);
      close(o, o64, bf16_tol(o64), "step o");
      close(state.t, s64, kF32Tol, "final state");
      Owned o2;
      DeviceTensor state2 = gpu_steps(pb, o2);
      CHECK(bitwise_equal(o, o2));
      CHECK(bitwise_equal(state.t, state2.t));
    }
  }
}

TEST_CASE("cuda gated deltanet norm and step name an argument of the wrong dtype" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  DeviceTensor y = gpu_empty({2, 8}, DType::BF16), w = gpu_empty({4}, DType::BF16);
  DeviceTensor out = gpu_empty({2, 8}, DType::BF16), rstd = gpu_empty({2, 2}, DType::BF16);
  CHECK(error_of([&] { ops::head_rmsnorm_gated_forward(y.t, y.t, w.t, kEps, out.t, rstd.t); })
            .find("head_rmsnorm_gated_forward: rstd is bf16, expected f32") != std::string::npos);
  const StepProblem pb = step_problem(1, 1, 2, 8, 4);
  DeviceTensor state = gpu_empty({2, 8, 4}, DType::BF16), o = gpu_empty({1, 8}, DType::BF16);
  CHECK(error_of([&] { ops::gated_delta_step(pb.row(true, 0), state.t, o.t); })
            .find("gated_delta_step: state is bf16, expected f32") != std::string::npos);
}
