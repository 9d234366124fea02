// CUDA vocabulary-parallel distillation (cuda/loss/distillation_vocab_parallel.cu: partial,
// combine, grad) against the CPU reference in f64 run on the very same logits, on 1 to 4 shards
// (uneven, one-column and empty shards), every kind at temperature 1 and 2.5, with and without
// the label term; against the fused kernel on one shard; determinism; the bad-label error;
// argument checks. Helpers and tolerances: distillation_testing.h.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "ops/loss.h"
#include "tests/common/gpu_testing.h"
#include "tests/kernels/loss/distillation_testing.h"

using namespace engine;
using namespace engine::testing;
using namespace engine::testing::distill;

namespace {

struct VpCase {
  int64_t t, v;
  std::vector<int64_t> cuts;  // shard q holds columns [cuts[q], cuts[q + 1])
  double shift = 0, teacher_shift = 0, mul = 1;
  float grad_scale = 1.f;
  int64_t offset = 0, teacher_offset = 0;
  std::string name() const {
    std::string s = "T" + std::to_string(t) + " V" + std::to_string(v) + " cuts";
    for (int64_t c : cuts) s += " " + std::to_string(c);
    return s + " shifts " + std::to_string(shift) + " " + std::to_string(teacher_shift) + " x" +
           std::to_string(mul) + " offsets " + std::to_string(offset) + " " +
           std::to_string(teacher_offset);
  }
};

const std::vector<VpCase> kVpCases = {
    {1, 2, {0, 2}},
    {7, 29, {0, 13, 29}, 0, 0, 1, 0.37f},
    {33, 1000, {0, 333, 667, 1000}},                    // a warp per row
    {33, 1000, {0, 1, 999, 1000}, 0, 0, 1, 1.f, 1, 1},  // one-column shards, misaligned bases
    {20, 1000, {0, 400, 1000}, 0, 0, 1, 0.5f, 0, 3},    // teacher not co-aligned: scalar rows
    {9, 20, {0, 20, 20}},                               // an empty shard
    {16, 50257, {0, 25129, 50257}, 0, 0, 1, 0.37f},     // a block per row, odd V
    {4, 128256, {0, 32064, 64128, 96192, 128256}, 0, 0, 1, 0.25f},
    {9, 3001, {0, 1500, 3001}, 1000, -1000},
    {11, 3001, {0, 700, 3001}, 0, 0, 4},  // peaked rows
};

// A contiguous copy of columns [c0, c1) of x (T, V) on the CPU.
Owned columns(const Tensor& x, int64_t c0, int64_t c1) {
  const int64_t t = x.size(0), v = x.size(1);
  Owned out = empty({t, c1 - c0}, x.dtype, Device::CPU);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = c0; j < c1; ++j) set(out, r * (c1 - c0) + (j - c0), get(x, r * v + j));
  return out;
}

struct VpRun {
  std::vector<Owned> xs64, ys64;  // each shard's inputs, f64
  Owned partials;                 // (P, 7, T) f32
  Owned row_stats;                // (6, T) f32
  Owned losses, distill;          // (T) f32
  Owned grad;                     // (T, V) reassembled, f64
};

VpRun run_vp(const VpCase& c, const Inputs& in, const DistillParams& p, DType dtype) {
  const int64_t np = static_cast<int64_t>(c.cuts.size()) - 1, k = ops::kDistillStats;
  VpRun out;
  DeviceTensor partials = gpu_poisoned({np, k, c.t}, DType::F32);
  DeviceTensor rs = gpu_poisoned({ops::kDistillRowStats, c.t}, DType::F32);
  DeviceTensor losses = gpu_poisoned({c.t}, DType::F32), distill = gpu_poisoned({c.t}, DType::F32);
  std::vector<DeviceTensor> xs, ys;
  for (int64_t q = 0; q < np; ++q) {
    out.xs64.push_back(columns(in.x64, c.cuts[q], c.cuts[q + 1]));
    out.ys64.push_back(columns(in.y64, c.cuts[q], c.cuts[q + 1]));
    xs.push_back(gpu_poisoned(out.xs64.back()->shape, dtype, c.offset));
    ys.push_back(gpu_poisoned(out.ys64.back()->shape, dtype, c.teacher_offset));
    copy_tensor(xs.back().t, to_host(out.xs64.back(), dtype));
    copy_tensor(ys.back().t, to_host(out.ys64.back(), dtype));
    ops::distillation_partial(xs.back().t, ys.back().t, labels_arg(in, p), in.mask, c.cuts[q], c.v,
                              p, partials.t.slice(q, q + 1).view({k, c.t}));
  }
  ops::distillation_combine(partials.t, in.mask, p, rs.t, losses.t, distill.t);
  out.grad = empty({c.t, c.v}, DType::F64, Device::CPU);
  for (int64_t q = 0; q < np; ++q) {
    ops::distillation_grad(xs[q].t, ys[q].t, labels_arg(in, p), in.mask, c.cuts[q], p, rs.t,
                           c.grad_scale);
    const Owned g = to_host(xs[q].t, DType::F64);
    const int64_t w = c.cuts[q + 1] - c.cuts[q];
    for (int64_t r = 0; r < c.t; ++r)
      for (int64_t j = 0; j < w; ++j)
        out.grad.ptr<double>()[r * c.v + c.cuts[q] + j] = g.ptr<double>()[r * w + j];
  }
  out.partials = to_host(partials.t, DType::F32);
  out.row_stats = to_host(rs.t, DType::F32);
  out.losses = to_host(losses.t, DType::F32);
  out.distill = to_host(distill.t, DType::F32);
  return out;
}

}  // namespace

TEST_CASE("distillation vocab-parallel cuda matches the f64 reference (partial, combine, grad)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const VpCase& c : kVpCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dtype : {DType::BF16, DType::F32}) {
        INFO("logits ", dtype_name(dtype));
        const int64_t np = static_cast<int64_t>(c.cuts.size()) - 1, k = ops::kDistillStats;
        const Inputs in = make_inputs(c.t, c.v, c.shift, c.teacher_shift, c.mul, 0, 0, dtype);
        const uint8_t* msk = in.mask_host.ptr<uint8_t>();
        for (const DistillParams& p : mixes(c.v)) {
          INFO(mix_name(p));
          const VpRun d = run_vp(c, in, p, dtype);
          // Each shard's stats against the reference on the same values.
          for (int64_t q = 0; q < np; ++q) {
            INFO("shard ", q, " [", c.cuts[q], ", ", c.cuts[q + 1], ")");
            Owned ref = empty({k, c.t}, DType::F64, Device::CPU);
            ref::distillation_partial(d.xs64[q], d.ys64[q], in.labels_host, in.mask_host, c.cuts[q],
                                      c.v, p, ref);
            const Tensor got = d.partials->slice(q, q + 1).view({k, c.t});
            if (c.cuts[q + 1] == c.cuts[q]) {  // empty: (-inf, 0, 0, 0, -inf, 0, 0) where masked in
              for (int64_t r = 0; r < c.t; ++r)
                for (int64_t i = 0; i < k; ++i)
                  CHECK(get(got, i * c.t + r) == ((i == 0 || i == 4) && msk[r] ? -INFINITY : 0.0));
              continue;
            }
            const double tol[] = {0.0, 1e-5, 0.0, 1e-5, 0.0, 1e-5, 1e-4};  // maxima and z exact
            for (int64_t i = 0; i < k; ++i) {
              INFO("stats row ", i);
              CHECK_CLOSE(got.slice(i, i + 1), ref->slice(i, i + 1), tol[i]);
            }
            for (int64_t r = 0; r < c.t; ++r)
              if (!msk[r])
                for (int64_t i = 0; i < k; ++i) CHECK(get(got, i * c.t + r) == 0.0);
          }
          // Combine against the reference combine of the device's partials, and the fused op.
          Owned rs_ref = empty({ops::kDistillRowStats, c.t}, DType::F64, Device::CPU);
          Owned loss_ref = empty({c.t}, DType::F64, Device::CPU),
                d_ref = empty({c.t}, DType::F64, Device::CPU);
          ref::distillation_combine(to_host(d.partials, DType::F64), in.mask_host, p, rs_ref,
                                    loss_ref, d_ref);
          for (int64_t i = 0; i < ops::kDistillRowStats; ++i) {
            INFO("row_stats row ", i);
            CHECK_CLOSE(d.row_stats->slice(i, i + 1), rs_ref->slice(i, i + 1), 1e-4);
          }
          check_rows(d.losses.t, loss_ref.t, 1e-4, "losses");
          check_rows(d.distill.t, d_ref.t, 1e-4, "distill");
          Owned fused_grad = to_host(in.x64, DType::F64);
          Owned fused_losses = empty({c.t}, DType::F64, Device::CPU),
                fused_distill = empty({c.t}, DType::F64, Device::CPU);
          ref::distillation_loss(fused_grad, in.y64, in.labels_host, in.mask_host, p, fused_losses,
                                 fused_distill, true, c.grad_scale);
          check_rows(d.losses.t, fused_losses.t, 1e-4, "losses against the fused reference");
          check_rows(d.distill.t, fused_distill.t, 1e-4, "distill against the fused reference");
          // Gradient against the reference from the device's row statistics, then the fused one.
          Owned own_ref = empty({c.t, c.v}, DType::F64, Device::CPU);
          for (int64_t q = 0; q < np; ++q) {
            Owned g = to_host(d.xs64[q], DType::F64);
            ref::distillation_grad(g, d.ys64[q], in.labels_host, in.mask_host, c.cuts[q], p,
                                   to_host(d.row_stats, DType::F64), c.grad_scale);
            const int64_t w = c.cuts[q + 1] - c.cuts[q];
            for (int64_t r = 0; r < c.t; ++r)
              for (int64_t j = 0; j < w; ++j)
                own_ref.ptr<double>()[r * c.v + c.cuts[q] + j] = g.ptr<double>()[r * w + j];
          }
          check_grad(d.grad, own_ref, dtype, p, "gradient vs reference from own row stats");
          check_grad(d.grad, fused_grad, dtype, p, "gradient vs fused reference");
          int64_t nonzero_masked = 0;
          for (int64_t r = 0; r < c.t; ++r) {
            if (msk[r]) continue;
            CHECK((get(d.losses, r) == 0.0 && get(d.distill, r) == 0.0));
            for (int64_t i = 0; i < ops::kDistillRowStats; ++i)
              CHECK(get(d.row_stats, i * c.t + r) == 0.0);
            for (int64_t v = 0; v < c.v; ++v) nonzero_masked += get(d.grad, r * c.v + v) != 0.0;
          }
          CHECK(nonzero_masked == 0);
        }
      }
    }
  }
}

TEST_CASE("distillation vocab-parallel cuda with one shard agrees with the fused kernel" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const VpCase& c :
       {VpCase{33, 1000, {0, 1000}, 0, 0, 1, 0.5f}, VpCase{8, 50257, {0, 50257}, 0, 0, 1, 0.25f},
        VpCase{9, 1000, {0, 1000}, 1000, -1000}}) {
    INFO(c.name());
    for (DType dtype : {DType::BF16, DType::F32}) {
      INFO(dtype_name(dtype));
      const Inputs in = make_inputs(c.t, c.v, c.shift, c.teacher_shift, c.mul, 0, 0, dtype);
      for (const DistillParams& p : {DistillParams{DistillKind::ReverseKL, 2.5f, 0.5f, 0.5f, 1e-3f},
                                     DistillParams{DistillKind::SoftCE, 1.f, 0.f, 1.f, 0.f}}) {
        INFO(mix_name(p));
        const VpRun d = run_vp(c, in, p, dtype);
        const Outputs f = run_device(in, p, true, c.grad_scale, {DistillPath::Auto, 0});
        check_rows(d.losses.t, f.losses.t, 1e-5, "losses against the fused kernel");
        check_rows(d.distill.t, f.distill.t, 1e-5, "distill against the fused kernel");
        // bf16: the two kernels may round a gradient element to neighbouring bf16 values.
        CHECK_CLOSE(d.grad.t, f.logits.t, (dtype == DType::BF16 ? 8e-3 : 0.0) + grad_allowance(p));
      }
    }
  }
}

TEST_CASE("distillation vocab-parallel cuda is deterministic (bitwise equal twice)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const VpCase& c : {VpCase{6, 128256, {0, 64128, 128256}, 0, 0, 1, 0.25f},
                          VpCase{33, 1000, {0, 333, 667, 1000}}}) {
    INFO(c.name());
    const Inputs in = make_inputs(c.t, c.v, 0, 0, 1, 0, 0, DType::BF16);
    const DistillParams p{DistillKind::ReverseKL, 2.f, 0.5f, 0.5f, 1e-3f};
    const VpRun a = run_vp(c, in, p, DType::BF16), b = run_vp(c, in, p, DType::BF16);
    CHECK(bitwise_equal(a.partials, b.partials));
    CHECK(bitwise_equal(a.row_stats, b.row_stats));
    CHECK(bitwise_equal(a.losses, b.losses));
    CHECK(bitwise_equal(a.grad, b.grad));
  }
}

TEST_CASE("distillation vocab-parallel cuda: bad labels with a label term, and argument checks" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  const VpCase c{8, 1000, {0, 400, 1000}};
  Inputs in = make_inputs(c.t, c.v, 0, 0, 1, 0, 0, DType::BF16);
  int32_t* lab = in.labels_host.ptr<int32_t>();
  DeviceTensor x = to_gpu(columns(in.x64, 400, 1000), DType::BF16),
               y = to_gpu(columns(in.y64, 400, 1000), DType::BF16);
  DeviceTensor stats = gpu_poisoned({ops::kDistillStats, c.t}, DType::F32);
  const DistillParams with_label{DistillKind::SoftCE, 1.f, 1.f, 1.f, 0.f};
  const DistillParams without{DistillKind::SoftCE, 1.f, 0.f, 1.f, 0.f};
  auto call = [&](const DistillParams& p) {
    in.labels = to_device(in.labels_host.t, Device::CUDA);
    ops::distillation_partial(x.t, y.t, in.labels, in.mask, 400, c.v, p, stats.t);
  };
  lab[5] = 1000;
  CHECK_THROWS_WITH_AS(
      call(with_label),
      doctest::Contains("distillation_partial: labels[5] = 1000 out of range [0, 1000) "
                        "at a masked-in token (position 5)"),
      Error);
  CHECK_NOTHROW(call(without));
  lab[5] = 0;  // in another shard: z = 0
  CHECK_NOTHROW(call(with_label));
  CHECK(get(to_host(stats.t, DType::F64), 2 * c.t + 5) == 0.0);
  lab[5] = 999;  // the shard's last column
  CHECK_NOTHROW(call(with_label));
  CHECK(get(to_host(stats.t, DType::F64), 2 * c.t + 5) == get(in.x64, 5 * c.v + 999));

  Owned stats3 = zeros({3, c.t}, DType::F32, Device::CUDA),
        rs = zeros({6, c.t}, DType::F32, Device::CUDA);
  Owned losses = zeros({c.t}, DType::F32, Device::CUDA),
        stats64 = zeros({7, c.t}, DType::F64, Device::CUDA),
        rs64 = zeros({6, c.t}, DType::F64, Device::CUDA),
        losses64 = zeros({c.t}, DType::F64, Device::CUDA);
  CHECK_THROWS_WITH_AS(
      ops::distillation_partial(x.t, y.t, in.labels, in.mask, 400, c.v, without, stats3),
      doctest::Contains("stats has shape (3, 8), expected (7, 8)"), Error);
  CHECK_THROWS_WITH_AS(
      ops::distillation_partial(x.t, y.t, in.labels, in.mask, 401, c.v, without, stats.t),
      doctest::Contains("not a shard of a vocabulary of 1000"), Error);
  CHECK_THROWS_WITH_AS(
      ops::distillation_combine(stats3.t.view({1, 3, c.t}), in.mask, without, rs, losses, Tensor{}),
      doctest::Contains("partials must be (P, 7, T)"), Error);
  // f64 partials with f64 outputs (the shared checks pass): only the kernel's dtype is wrong.
  CHECK_THROWS_WITH_AS(ops::distillation_combine(stats64.t.view({1, 7, c.t}), in.mask, without,
                                                 rs64, losses64, Tensor{}),
                       doctest::Contains("partials is f64, expected f32"), Error);
  CHECK_THROWS_WITH_AS(
      ops::distillation_grad(x.t, y.t, in.labels, in.mask, 400, without, stats3, 1.f),
      doctest::Contains("row_stats has shape (3, 8), expected (6, 8)"), Error);
  CHECK_NOTHROW(
      ops::distillation_combine(stats.t.view({1, 7, c.t}), in.mask, without, rs, losses, Tensor{}));
  CHECK_NOTHROW(ops::distillation_grad(x.t, y.t, Tensor{}, in.mask, 400, without, rs, 1.f));
}
