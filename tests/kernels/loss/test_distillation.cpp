// CUDA fused distillation losses (cuda/loss/distillation.cu) against the CPU reference in f64
// run on the very same logits (the device's bf16 or f32 values, widened exactly): a table of
// shapes and logit ranges (odd V, misaligned bases, a teacher whose rows are not co-aligned with
// the logits', logits near +-1000, peaked rows), every kind at temperature 1 and 2.5, with and
// without the label term (z-loss), every path and cluster size the shape allows, with and
// without the gradient, grad_scale != 1, masked rows whose labels are invalid and must never be
// read, poisoned outputs; determinism; the bad-label error; argument checks. The
// vocabulary-parallel trio: test_distillation_vocab_parallel.cpp; helpers and tolerances:
// distillation_testing.h.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "cuda/common/arch.h"
#include "cuda/loss/distillation.cuh"
#include "ops/loss.h"
#include "tests/common/gpu_testing.h"
#include "tests/kernels/loss/distillation_testing.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::testing::distill;

namespace {

struct Case {
  int64_t t, v;
  double shift = 0, teacher_shift = 0,
         mul = 1;  // x = mul N(0, 2^2) + shift, y = mul N(0, 3^2) + ...
  float grad_scale = 1.f;
  int64_t offset = 0, teacher_offset = 0;  // elements between each allocation and element 0
  std::string name() const {
    return "T" + std::to_string(t) + " V" + std::to_string(v) + " shifts " + std::to_string(shift) +
           " " + std::to_string(teacher_shift) + " x" + std::to_string(mul) + " scale " +
           std::to_string(grad_scale) + " offsets " + std::to_string(offset) + " " +
           std::to_string(teacher_offset);
  }
};

const std::vector<Case> kCases = {
    {1, 2, 0, 0, 1, 1.f},                  // no full vector: scalars only
    {7, 29, 0, 0, 1, 0.37f},               // rows start at every alignment
    {33, 1000, 0, 0, 1, 1.f},              // WarpRows, several rows per block
    {33, 1000, 0, 0, 1, 0.5f, 3, 3},       // misaligned bases, co-aligned: head and tail scalars
    {20, 1000, 0, 0, 1, 0.5f, 0, 1},       // the teacher's rows at another offset: scalar rows
    {5, 50257, 0, 0, 1, 0.37f},            // GPT-2 vocabulary: odd V
    {2, 128256, 0, 0, 1, 0.25f},           // Llama-3 vocabulary: the benchmark's rows
    {9, 3001, 1000, -1000, 1, 1.f},        // large magnitudes, opposite shifts
    {11, 3001, 0, 0, 4, 1.f},              // peaked rows
    {6, 50257, -1000, 500, 2, 2.f, 0, 5},  // large, shifted, not co-aligned
};

std::vector<Variant> variants_for(int64_t v, DType dtype, bool coaligned) {
  std::vector<Variant> out;
#ifdef ENGINE_CUDA
  const Variant all[] = {{DistillPath::Auto, 0},      {DistillPath::WarpRows, 0},
                         {DistillPath::BlockRows, 0}, {DistillPath::Cluster, 1},
                         {DistillPath::Cluster, 2},   {DistillPath::Cluster, 4},
                         {DistillPath::Cluster, 8}};
  for (const Variant& var : all)
    if (cuda::distillation_plan(v, dtype, coaligned, var.path, var.cluster)) out.push_back(var);
#endif
  return out;
}

Inputs make_inputs(const Case& c, DType dtype) {
  return distill::make_inputs(c.t, c.v, c.shift, c.teacher_shift, c.mul, c.offset,
                              c.teacher_offset, dtype);
}

}  // namespace

TEST_CASE("distillation cuda matches the f64 reference (kinds, temperatures, paths, grad on/off)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const Case& c : kCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dtype : {DType::BF16, DType::F32}) {
        INFO("logits ", dtype_name(dtype));
        const Inputs in = make_inputs(c, dtype);
        const Owned before = to_host(in.logits.t, dtype);
        const bool coaligned =
            (c.offset - c.teacher_offset) * static_cast<int64_t>(dtype_size(dtype)) % 16 == 0;
        const std::vector<Variant> vars = variants_for(c.v, dtype, coaligned);
        REQUIRE(vars.size() >= 3);
        for (const DistillParams& p : mixes(c.v)) {
          INFO(mix_name(p));
          Owned ref_grad = to_host(in.x64, DType::F64);
          Owned ref_losses = empty({c.t}, DType::F64, Device::CPU),
                ref_distill = empty({c.t}, DType::F64, Device::CPU);
          ref::distillation_loss(ref_grad, in.y64, in.labels_host, in.mask_host, p, ref_losses,
                                 ref_distill, true, c.grad_scale);
          for (const Variant& var : vars) {
            for (bool with_grad : {false, true}) {
              INFO(var.name(), with_grad ? ", with grad" : ", losses only");
              const Outputs out = run_device(in, p, with_grad, c.grad_scale, var);
              check_rows(out.losses.t, ref_losses.t, 1e-4, "losses");
              check_rows(out.distill.t, ref_distill.t, 1e-4, "distill");
              for (int64_t r = 0; r < c.t; ++r)
                if (!in.mask_host.ptr<uint8_t>()[r])
                  CHECK((out.losses.ptr<float>()[r] == 0.f && out.distill.ptr<float>()[r] == 0.f));
              if (!with_grad) {
                CHECK(bitwise_equal(out.logits, before));  // untouched
                continue;
              }
              check_grad(out.logits, ref_grad, dtype, p, "gradient");
              int64_t nonzero_masked = 0;
              for (int64_t r = 0; r < c.t; ++r)
                if (!in.mask_host.ptr<uint8_t>()[r])
                  for (int64_t v = 0; v < c.v; ++v)
                    nonzero_masked += get(out.logits, r * c.v + v) != 0.0;
              CHECK(nonzero_masked == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("distillation cuda picks Cluster up to 4 blocks per row, else BlockRows" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
#ifdef ENGINE_CUDA
  auto plan = [](int64_t v, DType dt, bool aligned) {
    return *cuda::distillation_plan(v, dt, aligned);
  };
  if (!cuda::arch::current().clusters) {  // the portable choices (cuda/common/arch.h)
    MESSAGE("distillation: no thread-block clusters here (", cuda::arch::describe(cuda::arch::current()),
            "): Auto takes WarpRows / BlockRows");
    CHECK(plan(1000, DType::BF16, true).path == DistillPath::WarpRows);
    for (int64_t v : {32000, 50257, 128256}) CHECK(plan(v, DType::BF16, true).path == DistillPath::BlockRows);
    CHECK_FALSE(cuda::distillation_plan(32000, DType::BF16, true, DistillPath::Cluster).has_value());
    return;
  }
  CHECK(plan(1000, DType::BF16, true).path == DistillPath::WarpRows);
  CHECK(plan(1000, DType::BF16, false).path == DistillPath::WarpRows);
  CHECK(plan(32000, DType::BF16, true).path == DistillPath::Cluster);
  CHECK(plan(32000, DType::BF16, true).cluster == 2);
  CHECK(plan(50257, DType::BF16, true).path == DistillPath::Cluster);
  CHECK(plan(50257, DType::BF16, true).cluster == 4);
  CHECK(plan(32000, DType::BF16, false).path == DistillPath::BlockRows);
  // Two 128256-logit rows need 8 blocks: BlockRows measured faster; forcing Cluster takes 8.
  CHECK(plan(128256, DType::BF16, true).path == DistillPath::BlockRows);
  CHECK(cuda::distillation_plan(128256, DType::BF16, true, DistillPath::Cluster)->cluster == 8);
  CHECK(plan(8 * 64 * 1024, DType::BF16, true).path == DistillPath::BlockRows);
  CHECK_FALSE(
      cuda::distillation_plan(128256, DType::BF16, true, DistillPath::Cluster, 1).has_value());
  CHECK_FALSE(
      cuda::distillation_plan(1000, DType::BF16, false, DistillPath::Cluster, 1).has_value());
  CHECK_FALSE(
      cuda::distillation_plan(1000, DType::BF16, true, DistillPath::Cluster, 3).has_value());
#endif
}

TEST_CASE("distillation cuda is deterministic (bitwise equal twice, every path)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const Case& c : {Case{6, 128256, 0, 0, 1, 0.25f}, Case{19, 50257, 0, 0, 3, 1.f},
                        Case{33, 1000, 0, 0, 1, 1.f}}) {
    INFO(c.name());
    const Inputs in = make_inputs(c, DType::BF16);
    for (const DistillParams& p : {DistillParams{DistillKind::ReverseKL, 2.f, 0.5f, 0.5f, 1e-3f},
                                   DistillParams{DistillKind::ForwardKL, 1.f, 0.f, 1.f, 0.f}}) {
      INFO(mix_name(p));
      for (const Variant& var : variants_for(c.v, DType::BF16, true)) {
        INFO(var.name());
        const Outputs a = run_device(in, p, true, c.grad_scale, var);
        const Outputs b = run_device(in, p, true, c.grad_scale, var);
        CHECK(bitwise_equal(a.losses, b.losses));
        CHECK(bitwise_equal(a.distill, b.distill));
        CHECK(bitwise_equal(a.logits, b.logits));
      }
    }
  }
}

TEST_CASE("distillation cuda reports an out-of-range label with a label term (every path)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const Case c{8, 5000};
  const DistillParams with_label{DistillKind::ForwardKL, 2.f, 0.5f, 0.5f, 0.f};
  const DistillParams without{DistillKind::ForwardKL, 2.f, 0.f, 1.f, 0.f};
  for (const Variant& var : variants_for(c.v, DType::BF16, true)) {
    INFO(var.name());
    Inputs in = make_inputs(c, DType::BF16);
    int32_t* lab = in.labels_host.ptr<int32_t>();
    uint8_t* msk = in.mask_host.ptr<uint8_t>();
    auto call = [&](const DistillParams& p) {
      in.labels = to_device(in.labels_host.t, Device::CUDA);
      in.mask = to_device(in.mask_host.t, Device::CUDA);
      Owned losses = empty({c.t}, DType::F32, Device::CUDA);
      if (var.path == DistillPath::Auto) {
        ops::distillation_loss(in.logits.t, in.teacher.t, in.labels, in.mask, p, losses, Tensor{},
                               true, 1.f);
      } else {
#ifdef ENGINE_CUDA
        cuda::distillation_loss(in.logits.t, in.teacher.t, in.labels, in.mask, p, losses, Tensor{},
                                true, 1.f, var.path, var.cluster);
#endif
      }
    };
    lab[5] = 5000;
    CHECK_THROWS_WITH_AS(
        call(with_label),
        doctest::Contains("distillation_loss: labels[5] = 5000 out of range [0, 5000)"), Error);
    CHECK_NOTHROW(call(without));  // no label term: labels are never read
    lab[2] = -3;                   // the first bad position is the one reported
    CHECK_THROWS_WITH_AS(call(with_label), doctest::Contains("labels[2] = -3"), Error);
    msk[2] = 0;  // masked out: ignored
    CHECK_THROWS_WITH_AS(call(with_label), doctest::Contains("labels[5] = 5000"), Error);
    lab[5] = 4999;
    CHECK_NOTHROW(call(with_label));  // the flag does not stick between calls
  }
}

TEST_CASE("distillation cuda rejects bad dtypes, shapes, parameters and impossible paths" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const int64_t t = 5, v = 7;
  Owned logits = zeros({t, v}, DType::BF16, Device::CUDA),
        teacher = zeros({t, v}, DType::BF16, Device::CUDA);
  Owned labels = zeros({t}, DType::I32, Device::CUDA), mask = zeros({t}, DType::U8, Device::CUDA);
  Owned losses = zeros({t}, DType::F32, Device::CUDA);
  Owned teacher32 = zeros({t, v}, DType::F32, Device::CUDA),
        narrow = zeros({t, v - 1}, DType::BF16, Device::CUDA);
  Owned logits64 = zeros({t, v}, DType::F64, Device::CUDA),
        teacher64 = zeros({t, v}, DType::F64, Device::CUDA),
        losses64 = zeros({t}, DType::F64, Device::CUDA);
  const DistillParams p{DistillKind::SoftCE, 1.f, 0.f, 1.f, 0.f};
  auto call = [&](const Tensor& x, const Tensor& y, const Tensor& l, const DistillParams& q) {
    ops::distillation_loss(x, y, labels, mask, q, l, Tensor{}, true, 1.f);
  };
  CHECK_THROWS_WITH_AS(call(logits, teacher32, losses, p),
                       doctest::Contains("teacher is f32, expected bf16"), Error);
  CHECK_THROWS_WITH_AS(call(logits, narrow, losses, p),
                       doctest::Contains("teacher has shape (5, 6), expected (5, 7)"), Error);
  // f64 logits with an f64 teacher and losses (the shared checks pass): the kernel's dtype.
  CHECK_THROWS_WITH_AS(call(logits64, teacher64, losses64, p),
                       doctest::Contains("expected bf16 or f32"), Error);
  CHECK_THROWS_WITH_AS(call(logits, teacher, losses64, p),
                       doctest::Contains("losses is f64, expected f32"), Error);
  CHECK_THROWS_WITH_AS(call(logits, teacher, losses, {DistillKind::SoftCE, -1.f, 0.f, 1.f, 0.f}),
                       doctest::Contains("temperature = -1"), Error);
  CHECK_THROWS_WITH_AS(ops::distillation_loss(logits, teacher, Tensor{}, mask,
                                              {DistillKind::SoftCE, 1.f, 1.f, 1.f, 0.f}, losses,
                                              Tensor{}, true, 1.f),
                       doctest::Contains("labels are undefined, but label_weight = 1 needs them"),
                       Error);
#ifdef ENGINE_CUDA
  DeviceTensor shifted = gpu_poisoned({t, 1000}, DType::BF16, 1);
  Owned wide = zeros({t, 1000}, DType::BF16, Device::CUDA);
  CHECK_THROWS_WITH_AS(cuda::distillation_loss(wide, shifted.t, labels, mask, p, losses, Tensor{},
                                               true, 1.f, DistillPath::Cluster, 1),
                       doctest::Contains("not co-aligned"), Error);
#endif
  CHECK_NOTHROW(call(logits, teacher, losses, p));
  DeviceTensor none = gpu_poisoned({0, v}, DType::BF16), none_m = gpu_poisoned({0}, DType::U8),
               none_l = gpu_poisoned({0}, DType::F32);
  CHECK_NOTHROW(
      ops::distillation_loss(none.t, none.t, Tensor{}, none_m.t, p, none_l.t, Tensor{}, true, 1.f));
}
