// The shared expert's sigmoid gate on the GPU (cuda/moe/shared_gate.cu) against the f64
// reference: y += sigmoid(l) shared, and its backward (dshared, dlogits in bf16 and f32), bf16
// and f32 rows, odd widths and one-token inputs; outputs poisoned before the run.
#include <doctest/doctest.h>

#include <vector>

#include "ops/moe.h"
#include "tests/common/gpu_testing.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;

TEST_CASE("cuda moe shared gate forward and backward match the f64 reference" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t T, C;
  };
  for (const Case& c : std::vector<Case>{{37, 64}, {1, 8}, {300, 136}, {5, 33}}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      CAPTURE(c.T);
      CAPTURE(c.C);
      INFO(dtype_name(dt));
      Owned logits = randn({c.T, 1}, DType::F32, "sg.logits", 2.0);
      Owned shared = randn({c.T, c.C}, DType::F32, "sg.shared");
      Owned y0 = randn({c.T, c.C}, DType::F32, "sg.y");
      Owned dy = randn({c.T, c.C}, DType::F32, "sg.dy");
      auto [gl, l64] = device_input(logits, DType::F32);
      auto [gs, s64] = device_input(shared, dt);
      auto [gy, y64] = device_input(y0, dt);
      auto [gdy, dy64] = device_input(dy, dt);
      ref::moe_shared_gate_forward(l64, s64, y64);
      ops::moe_shared_gate_forward(gl.t, gs.t, gy.t);
      CHECK_CLOSE(gy.t, y64.t, output_tol(dt, y64, 1e-5));

      Owned ds64 = empty({c.T, c.C}, DType::F64, Device::CPU), dl64 = empty({c.T, 1}, DType::F64, Device::CPU);
      ref::moe_shared_gate_backward(dy64, l64, s64, ds64, dl64);
      for (DType dlt : {DType::F32, DType::BF16}) {
        INFO("dlogits ", dtype_name(dlt));
        DeviceTensor gds = gpu_poisoned({c.T, c.C}, dt), gdl = gpu_poisoned({c.T, 1}, dlt);
        ops::moe_shared_gate_backward(gdy.t, gl.t, gs.t, gds.t, gdl.t);
        CHECK_CLOSE(gds.t, ds64.t, output_tol(dt, ds64, 1e-5));
        CHECK_CLOSE(gdl.t, dl64.t, output_tol(dlt, dl64, 1e-4));
      }
    }
  }
}
