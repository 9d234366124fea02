// CUDA AdamW against the CPU reference (ref::adamw_step through ops:: on host copies), several
// steps with fresh gradients, weight decay, grad_scale, bias correction, every compute copy kind
// (none, bf16, f32), sizes around the vector width, and buffers at odd element offsets (peeled
// head; buffers misaligned differently run element by element). The kernel performs the
// reference's IEEE f32 operations in its order without fused multiply-adds, so the results
// should be bit-identical: required to 1e-6 relative RMS, and any bit difference is reported.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ops/adamw.h"
#include "ops/split_master.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

int64_t differing_elements(const Tensor& device, const Tensor& host) {
  Owned got = to_host(device, device.dtype);
  const size_t e = dtype_size(host.dtype);
  int64_t d = 0;
  for (int64_t i = 0; i < host.numel(); ++i)
    d += std::memcmp(static_cast<const char*>(got.t.data) + i * e,
                     static_cast<const char*>(host.data) + i * e, e) != 0;
  return d;
}

struct Case {
  int64_t n;
  int64_t offset_state;  // element offset of param, grad, m, v
  int64_t offset_copy;   // element offset of the compute copy
};
const std::vector<Case> kCases = {{1, 0, 0},   {3, 1, 1},      {1000, 0, 0},
                                  {1000, 1, 1}, {1000, 1, 0},  {65539, 0, 0},
                                  {65539, 3, 3}, {65539, 2, 1}};

}  // namespace

TEST_CASE("cuda adamw_step equals the CPU reference over several steps, with every copy kind" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const Case& c : kCases) {
    for (DType copy_dt : {DType::U8, DType::BF16, DType::F32}) {  // U8: no copy
      SUBCASE((std::to_string(c.n) + " offsets " + std::to_string(c.offset_state) + "/" +
               std::to_string(c.offset_copy) + " copy " +
               (copy_dt == DType::U8 ? "none" : dtype_name(copy_dt)))
                  .c_str()) {
        Owned p = randn({c.n}, DType::F32, "adamw.p");
        Owned m = zeros({c.n}, DType::F32, Device::CPU), v = zeros({c.n}, DType::F32, Device::CPU);
        const bool copy = copy_dt != DType::U8;
        Owned copy_host = empty({c.n}, copy ? copy_dt : DType::F32, Device::CPU);
        DeviceTensor dp = to_gpu(p, c.offset_state), dm = to_gpu(m, c.offset_state);
        DeviceTensor dv = to_gpu(v, c.offset_state), dcopy = to_gpu(copy_host, c.offset_copy);
        ops::AdamWParams o;
        o.lr = 3e-3f;
        o.weight_decay = 0.1f;
        o.grad_scale = 0.7f;
        o.beta2 = 0.999f;
        int64_t bits_differ = 0;
        for (int64_t step = 1; step <= 5; ++step) {
          CAPTURE(step);
          o.step = step;
          Owned g = randn({c.n}, DType::F32, "adamw.g" + std::to_string(step), step == 3 ? 1e-4 : 1.0);
          DeviceTensor dg = to_gpu(g, c.offset_state);
          if (copy) poison(dcopy.t);
          ops::adamw_step(p, g, m, v, o, copy ? copy_host.t : Tensor{});
          ops::adamw_step(dp.t, dg.t, dm.t, dv.t, o, copy ? dcopy.t : Tensor{});
          CHECK_CLOSE(dp.t, p.t, 1e-6);
          CHECK_CLOSE(dm.t, m.t, 1e-6);
          CHECK_CLOSE(dv.t, v.t, 1e-6);
          if (copy) CHECK_CLOSE(dcopy.t, copy_host.t, copy_dt == DType::BF16 ? 1e-2 : 1e-6);
          bits_differ += differing_elements(dp.t, p) + differing_elements(dm.t, m) +
                         differing_elements(dv.t, v) +
                         (copy ? differing_elements(dcopy.t, copy_host) : 0);
        }
        INFO("elements whose bits differ from the CPU over all steps and buffers: ", bits_differ);
        WARN(bits_differ == 0);
      }
    }
  }
}

TEST_CASE("cuda adamw_step rejects wrong dtypes, lengths and steps" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  Owned p = zeros({16}, DType::F32, Device::CUDA), g = zeros({16}, DType::F32, Device::CUDA);
  Owned m = zeros({16}, DType::F32, Device::CUDA), v = zeros({16}, DType::F32, Device::CUDA);
  Owned g16 = zeros({16}, DType::BF16, Device::CUDA), short_v = zeros({15}, DType::F32, Device::CUDA);
  Owned copy_i32 = zeros({16}, DType::I32, Device::CUDA);
  ops::AdamWParams o;
  CHECK_THROWS_AS(ops::adamw_step(p, g16, m, v, o, Tensor{}), Error);
  CHECK_THROWS_AS(ops::adamw_step(p, g, m, short_v, o, Tensor{}), Error);
  CHECK_THROWS_AS(ops::adamw_step(p, g, m, v, o, copy_i32), Error);
  o.step = 0;
  CHECK_THROWS_AS(ops::adamw_step(p, g, m, v, o, Tensor{}), Error);
}

TEST_CASE("cuda adamw_step with decay runs and lr scales: one call, the CPU reference's bits" * doctest::test_suite("gpu")) {
  // 450 runs of 1 to 300 elements (more than one launch's table of 200), decays 0 / 0.1 / 0.03,
  // buffers at offsets that peel a head or run element by element.
  if (!gpu_available_or_skip()) return;
  std::vector<ops::DecayRun> runs;
  for (int64_t end = 0, k = 0; k < 450; ++k) {
    end += 1 + (k * 7919) % 300;
    // learning-rate scales (optimizer.lr_scale) 1, 0 (no update), 0.5 and 0.37
    const float scale = k % 4 == 0 ? 1.f : k % 4 == 1 ? 0.f : k % 4 == 2 ? 0.5f : 0.37f;
    runs.push_back({end, k % 3 == 0 ? 0.f : k % 3 == 1 ? 0.1f : 0.03f, scale});
  }
  const int64_t n = runs.back().end;
  for (const auto& [offset_state, offset_copy] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}, {2, 1}}) {
    CAPTURE(offset_state);
    CAPTURE(offset_copy);
    Owned p = randn({n}, DType::F32, "adamw.runs.p"), g = randn({n}, DType::F32, "adamw.runs.g");
    Owned m = zeros({n}, DType::F32, Device::CPU), v = zeros({n}, DType::F32, Device::CPU);
    Owned copy_host = empty({n}, DType::BF16, Device::CPU);
    DeviceTensor dp = to_gpu(p, offset_state), dg = to_gpu(g, offset_state);
    DeviceTensor dm = to_gpu(m, offset_state), dv = to_gpu(v, offset_state);
    DeviceTensor dcopy = to_gpu(copy_host, offset_copy);
    poison(dcopy.t);
    ops::AdamWParams o;
    o.lr = 3e-3f;
    o.step = 2;
    o.decay_runs = runs;
    ops::adamw_step(p, g, m, v, o, copy_host.t);
    ops::adamw_step(dp.t, dg.t, dm.t, dv.t, o, dcopy.t);
    CHECK_CLOSE(dp.t, p.t, 1e-6);
    CHECK(differing_elements(dp.t, p) + differing_elements(dm.t, m) + differing_elements(dv.t, v) +
              differing_elements(dcopy.t, copy_host) ==
          0);
  }
}

TEST_CASE("cuda adamw_step on a split master: the CPU reference's bits, odd offsets and decay runs" * doctest::test_suite("gpu")) {
  // A split master (ops/split_master.h): param is the u16 low halves, the bf16 copy the high
  // halves, both read and written. Sizes around the vector width, offsets that peel a head or
  // run element by element (the u16 and bf16 buffers misaligned against the f32 state).
  if (!gpu_available_or_skip()) return;
  for (const Case& c : kCases) {
    SUBCASE((std::to_string(c.n) + " offsets " + std::to_string(c.offset_state) + "/" + std::to_string(c.offset_copy)).c_str()) {
      Owned p = randn({c.n}, DType::F32, "adamw.split.p");
      Owned hi = empty({c.n}, DType::BF16, Device::CPU), lo = empty({c.n}, DType::U16, Device::CPU);
      for (int64_t i = 0; i < c.n; ++i) {
        uint32_t m;
        std::memcpy(&m, p.ptr<float>() + i, 4);
        if (i % 13 == 0) m = (m & 0xffff0000u) | 0x8000u;  // exact ties
        hi.ptr<bf16>()[i].bits = split_master_hi(m);
        lo.ptr<uint16_t>()[i] = split_master_lo(m, hi.ptr<bf16>()[i].bits);
      }
      Owned m = zeros({c.n}, DType::F32, Device::CPU), v = zeros({c.n}, DType::F32, Device::CPU);
      DeviceTensor dlo = to_gpu(lo, c.offset_copy), dhi = to_gpu(hi, c.offset_state);
      DeviceTensor dm = to_gpu(m, c.offset_state), dv = to_gpu(v, c.offset_state);
      ops::AdamWParams o;
      o.lr = 3e-3f;
      o.grad_scale = 0.7f;
      if (c.n > 10) o.decay_runs = {{c.n / 3, 0.1f}, {c.n / 2, 0.f}, {c.n, 0.03f}};
      else o.weight_decay = 0.1f;
      for (int64_t step = 1; step <= 4; ++step) {
        CAPTURE(step);
        o.step = step;
        Owned g = randn({c.n}, DType::F32, "adamw.split.g" + std::to_string(step));
        DeviceTensor dg = to_gpu(g, c.offset_state);
        ops::adamw_step(lo, g, m, v, o, hi);
        ops::adamw_step(dlo.t, dg.t, dm.t, dv.t, o, dhi.t);
        CHECK(differing_elements(dlo.t, lo) == 0);
        CHECK(differing_elements(dhi.t, hi) == 0);
        CHECK(differing_elements(dm.t, m) == 0);
        CHECK(differing_elements(dv.t, v) == 0);
      }
    }
  }
}
