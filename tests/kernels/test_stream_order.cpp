// Stream order across the memory-bound kernels, which are launched as programmatic dependents of
// the kernel ahead (cuda/common/launch.cuh): each may be resident before that kernel has ended
// and must wait for it before touching memory. A chain of ops is queued with no host wait and
// compared bit for bit with the same chain run with the stream synchronised after every op
// (where no kernel has a predecessor still running). Every op in it is deterministic. The chain
// is built so that most ops read first what the op before them writes last: column sums (written
// by each tile's last block) feed the next op's first loads, parameter gradients (written by the
// norm backward's second kernel at its very end) feed AdamW, AdamW's updated parameters feed a
// norm's weight. A kernel that touched memory before its wait would read stale values there:
// with the wait taken out of the RoPE kernel, or out of AdamW's, every trial failed on an H200.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "tests/common/gpu_testing.h"

#ifdef ENGINE_CUDA
#include <cuda_runtime.h>

#include "cuda/common/device.cuh"
#endif

using namespace engine;
using namespace engine::testing;

TEST_CASE("cuda memory-bound kernels launched as dependents keep stream order" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
#ifdef ENGINE_CUDA
  constexpr int64_t kT = 4096, kC = 1024, kHeads = kC / 128;
  constexpr int kRounds = 3;
  constexpr float kEps = 1e-5f;
  const DType f32 = DType::F32;
  const Owned x0 = randn({kT, kC}, f32, "order.x"), b0 = randn({kC}, f32, "order.b", 0.2),
              gu0 = randn({kT, 2 * kC}, f32, "order.gu"), p0 = randn({kC}, f32, "order.p", 0.5);
  Owned ones = zeros({kC}, f32, Device::CPU), pos0 = zeros({1}, DType::I32, Device::CPU);
  for (int64_t i = 0; i < kC; ++i) ones.ptr<float>()[i] = 1.f;
  pos0.ptr<int32_t>()[0] = 77;
  ops::AdamWParams hp;
  hp.lr = 1e-2f;

  // The chain's outputs after kRounds rounds; sync: synchronise after every op.
  auto run = [&](bool sync) {
    DeviceTensor x = to_gpu(x0.t), b = to_gpu(b0.t), gu = to_gpu(gu0.t), param = to_gpu(p0.t),
                 one = to_gpu(ones.t), pos = to_gpu(pos0.t);
    DeviceTensor y = gpu_empty({kT, kC}, f32), h = gpu_empty({kT, kC}, f32),
                 mean = gpu_empty({kT}, f32), rstd = gpu_empty({kT}, f32);
    Owned col = zeros({kC}, f32, Device::CUDA), dw = zeros({kC}, f32, Device::CUDA),
          db = zeros({kC}, f32, Device::CUDA), m = zeros({kC}, f32, Device::CUDA),
          v = zeros({kC}, f32, Device::CUDA);
    const Tensor col_heads = col.t.view({1, kHeads, 128});
    const std::vector<std::function<void()>> chain = {
        [&] { ops::sum_rows(x.t, col.t, 0.f); },  // col <- column sums of x (at the end)
        [&] { ops::rope_forward(col_heads, pos.t, kHeads, ops::RopeParams{}); },  // col rotated in place
        [&] { ops::scale_inplace(col.t, 1.0 / kT); },
        [&] { ops::sum_rows(x.t, col.t, 1.f); },  // col += column sums of x (at the end)
        [&] { ops::scale_inplace(col.t, 1.0 / kT); },  // reads col first
        [&] { ops::add(col.t, one.t, col.t); },            // col <- 1 + col
        [&] { ops::layernorm_forward(x.t, col.t, b.t, kEps, y.t, mean.t, rstd.t, {}); },  // w = col
        [&] {  // y <- dx, dy = y in place; dw, db += (their second kernel, at the end)
          ops::layernorm_backward(y.t, x.t, col.t, mean.t, rstd.t, y.t, dw.t, db.t);
        },
        [&] { ops::adamw_step(param.t, dw.t, m.t, v.t, hp, Tensor{}); },  // reads dw first
        [&] { ops::rmsnorm_forward(y.t, param.t, kEps, h.t, rstd.t, {}); },  // w = AdamW's output
        [&] { ops::rmsnorm_backward(h.t, y.t, param.t, rstd.t, h.t, db.t); },  // db +=
        [&] { ops::adamw_step(param.t, db.t, m.t, v.t, hp, Tensor{}); },  // reads db first
        [&] { ops::swiglu_forward(gu.t, x.t, {}); },                         // x <- gate_up
        [&] { ops::add(x.t, h.t, x.t); },                                // x += h
        [&] { ops::gelu_forward(x.t, y.t); },                            // y <- gelu(x)
        [&] { ops::add(x.t, y.t, gu.t.view({2 * kT, kC}).slice(0, kT)); },  // gu's first half
    };
    for (int r = 0; r < kRounds; ++r)
      for (const auto& op : chain) {
        op();
        if (sync)
          REQUIRE(cudaStreamSynchronize(static_cast<cudaStream_t>(cuda::compute_stream())) ==
                  cudaSuccess);
      }
    std::vector<Owned> out;
    for (const Tensor* t : {&x.t, &y.t, &h.t, &gu.t, &col.t, &dw.t, &db.t, &param.t})
      out.push_back(to_host(*t, t->dtype));
    return out;
  };
  const std::vector<Owned> serial = run(true);
  for (int trial = 0; trial < 3; ++trial) {
    const std::vector<Owned> queued = run(false);
    for (size_t i = 0; i < serial.size(); ++i) {
      INFO("trial " << trial << ", output " << i);
      CHECK(bitwise_equal(serial[i].t, queued[i].t));
    }
  }
#endif
}
