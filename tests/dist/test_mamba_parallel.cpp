// The Mamba mixer layer under tensor parallelism over the world (2, 3 or 4 ranks; CPU, MPI, f64)
// against the same layer on one rank: outputs, input gradients and every parameter gradient
// block, without and with sequence parallelism. Init is layout independent, so both start from
// the same weights; d_inner 12 and 12 tokens split over 2, 3 and 4 ranks.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "comm/comm.h"
#include "layers/mamba.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

Owned rows_of(const Tensor& t, int64_t begin, int64_t end) { return to_host(t.slice(begin, end), DType::F64); }

}  // namespace

TEST_CASE("mamba layer: tensor parallel (and sequence parallel) reproduces one rank") {
  Comm& tp = world();
  const int r = tp.rank(), n = tp.size();
  if (12 % n != 0) {
    skip_test("d_inner 12 and 12 tokens do not split over " + std::to_string(n) + " ranks");
    return;
  }
  layers::MambaConfig c;
  c.hidden = 6, c.d_inner = 12, c.d_state = 3, c.d_conv = 4, c.dt_rank = 2, c.conv_bias = true, c.proj_bias = true,
  c.chunk_len = 4, c.init_std = 0.3;
  const std::vector<int32_t> docs = {1, 5, 6};
  const int64_t T = 12, C = c.hidden;
  Owned cu = empty({4}, DType::I32, Device::CPU), pos = zeros({T}, DType::I32, Device::CPU);
  cu.ptr<int32_t>()[0] = 0, cu.ptr<int32_t>()[1] = 1, cu.ptr<int32_t>()[2] = 6, cu.ptr<int32_t>()[3] = 12;
  const layers::SegmentInfo seg{.cu_seqlens = cu, .positions = pos, .max_seqlen = 6};
  Owned x = randn({T, C}, DType::F64, "mp.x"), dy = randn({T, C}, DType::F64, "mp.dy");

  // One rank: its own full layer.
  ParamTable t1;
  layers::Mamba::declare(t1, "m", c);
  ParamStore s1(t1, Device::CPU, DType::F64);
  s1.init(7);
  layers::Mamba m1(s1, "m", c);
  const layers::Env e1{Device::CPU, DType::F64};
  layers::MambaSaved saved1;
  Owned y1 = empty({T, C}, DType::F64, Device::CPU), dx1 = empty({T, C}, DType::F64, Device::CPU);
  m1.forward(e1, x, y1, seg, saved1);
  m1.backward(e1, dy, x, seg, saved1, dx1);

  for (bool sp : {false, true}) {
    CAPTURE(sp);
    ParamTable tn(r, n);
    layers::Mamba::declare(tn, "m", c);
    ParamStore sn(tn, Device::CPU, DType::F64);
    sn.init(7);
    layers::Mamba mn(sn, "m", c);
    const layers::Env en{Device::CPU, DType::F64, &tp, sp};
    const int64_t rows = sp ? T / n : T, begin = sp ? r * rows : 0;
    Owned xin = rows_of(x, begin, begin + rows), dyin = rows_of(dy, begin, begin + rows);
    Owned y = empty({rows, C}, DType::F64, Device::CPU), dx = empty({rows, C}, DType::F64, Device::CPU);
    layers::MambaSaved saved;
    mn.forward(en, xin, y, seg, saved);
    mn.backward(en, dyin, xin, seg, saved, dx);
    CHECK_CLOSE(y.t, rows_of(y1, begin, begin + rows).t, 1e-12);
    CHECK_CLOSE(dx.t, rows_of(dx1, begin, begin + rows).t, 1e-12);
    for (const ParamSpec& p : tn.entries()) {
      CAPTURE(p.name);
      Owned g = to_host(sn.grad(p.name), DType::F64);
      // A replicated parameter under sequence parallelism holds its rows' part of the gradient
      // (the optimizer all-reduces those); here they are summed for the comparison.
      if (p.split_dim < 0 && sp) tp.all_reduce(g);
      const Tensor full = s1.grad(p.name);
      Owned want = empty(g->shape, DType::F64, Device::CPU);
      for (int64_t i = 0; i < g->numel(); ++i) set(want, i, get(full, full_index(p, i)));
      CHECK_CLOSE(g.t, want.t, 1e-12);
    }
  }
}
