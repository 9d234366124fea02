// CUDA distillation losses (cuda/loss/distillation.cu: fused; distillation_vocab_parallel.cu:
// partial, combine, grad) against the CPU reference in f64 run on the very same logits (the
// device's bf16 or f32 values, widened exactly): a table of shapes and logit ranges (odd V,
// misaligned bases, a teacher whose rows are not co-aligned with the logits', logits near +-1000,
// peaked rows), every kind at temperature 1 and 2.5, with and without the label term (z-loss),
// every path and cluster size the shape allows, with and without the gradient, grad_scale != 1,
// masked rows whose labels are invalid and must never be read, poisoned outputs; the
// vocabulary-parallel trio on 1 to 4 shards (uneven, one-column and empty shards); determinism;
// the bad-label error; argument checks.
//
// Tolerances (relative RMS over the tensor, tests/common/testing.h). Both sides see identical
// inputs, so the only error is the kernels' f32 arithmetic (ex2.approx ~2^-22 per term, f32 sums,
// every logit difference formed before scaling):
//   losses    1e-4 per row, relative to max(|loss|, 0.1) (measured ~1e-6 of the loss). A row's
//             log-sum-exps are each ~1 after the shift, so their f32 rounding leaves ~6e-8
//             absolute whatever the loss: the KL of a near-identical pair (~1e-4 and below) is off
//             by a few 1e-4 of itself (H200, TEST_SEED=864235171: 6.4e-8 on 3.3e-4, one row,
//             V = 2), which a bound relative to the loss alone, or to the tensor's RMS, rejects.
//   gradient  f32 output: 1e-4; ReverseKL 2e-3: its gradient s_v ((x_v - y_v) / tau - c) cancels
//             at the dominant columns of peaked rows, where the f32 rounding of c (~|c| 2^-24)
//             is what is left (a naive f32 computation is ~100x worse there). bf16 output: at
//             most 2x the error of rounding the f64 reference to bf16, plus that f32 allowance.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "cuda/loss/distillation.cuh"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ref/loss.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;
using engine::cuda::DistillPath;
using ops::DistillKind;
using ops::DistillParams;

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
    {16, 50257, 0, 0, 1, 0.37f},           // GPT-2 vocabulary: odd V
    {4, 128256, 0, 0, 1, 0.25f},           // Llama-3 vocabulary: the benchmark's rows
    {9, 3001, 1000, -1000, 1, 1.f},        // large magnitudes, opposite shifts
    {11, 3001, 0, 0, 4, 1.f},              // peaked rows
    {6, 50257, -1000, 500, 2, 2.f, 0, 5},  // large, shifted, not co-aligned
};

std::string mix_name(const DistillParams& p) {
  return std::string(ops::distill_kind_name(p.kind)) + " tau " + std::to_string(p.temperature) +
         (p.label_weight != 0 ? " +label+z" : "");
}

// Every kind at tau 1 and 2.5, alone and with the label term; for large rows a third of them
// (every kind, each temperature and label setting at least once) to keep the f64 reference quick.
std::vector<DistillParams> mixes(int64_t v) {
  std::vector<DistillParams> all;
  for (DistillKind kind : {DistillKind::SoftCE, DistillKind::ForwardKL, DistillKind::ReverseKL})
    for (float tau : {1.f, 2.5f})
      for (bool label : {false, true})
        all.push_back({kind, tau, label ? 0.6f : 0.f, label ? 0.4f : 1.f, label ? 1e-3f : 0.f});
  if (v < 20000) return all;
  std::vector<DistillParams> some;
  for (size_t i = 0; i < all.size(); i += 3) some.push_back(all[i]);
  return some;
}

struct Variant {
  DistillPath path;
  int cluster;
  std::string name() const {
    const char* n[] = {"Auto", "WarpRows", "BlockRows", "Cluster"};
    return std::string(n[static_cast<int>(path)]) + (cluster ? " C" + std::to_string(cluster) : "");
  }
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

// Device inputs: labels uniform in [0, V) with labels at 0 and V - 1, every 5th row (from row 3)
// masked with an out-of-range label that must be ignored.
struct Inputs {
  DeviceTensor logits, teacher;
  int64_t offset = 0;
  Owned x64, y64;  // the device values in f64 on the CPU
  Owned labels_host, mask_host, labels, mask;
};

Inputs make_inputs(int64_t t, int64_t v, double shift, double teacher_shift, double mul,
                   int64_t offset, int64_t teacher_offset, DType dtype) {
  Inputs in;
  Owned x = randn({t, v}, DType::F32, "dl.logits", 2.0),
        y = randn({t, v}, DType::F32, "dl.teacher", 3.0);
  for (int64_t i = 0; i < t * v; ++i) {
    x.ptr<float>()[i] = static_cast<float>(mul * x.ptr<float>()[i] + shift);
    y.ptr<float>()[i] = static_cast<float>(mul * y.ptr<float>()[i] + teacher_shift);
  }
  in.offset = offset;
  in.logits = to_gpu(x.t, dtype, offset);
  in.teacher = to_gpu(y.t, dtype, teacher_offset);
  in.x64 = to_host(in.logits.t, DType::F64);
  in.y64 = to_host(in.teacher.t, DType::F64);
  in.labels_host = randint({t}, 0, v, "dl.labels");
  in.mask_host = empty({t}, DType::U8, Device::CPU);
  int32_t* lab = in.labels_host.ptr<int32_t>();
  uint8_t* msk = in.mask_host.ptr<uint8_t>();
  for (int64_t r = 0; r < t; ++r) {
    msk[r] = r % 5 != 3;
    if (!msk[r]) lab[r] = r % 2 ? -7 : static_cast<int32_t>(v + 3);
  }
  lab[0] = static_cast<int32_t>(v - 1);
  if (t > 1) lab[1] = 0;
  in.labels = to_device(in.labels_host.t, Device::CUDA);
  in.mask = to_device(in.mask_host.t, Device::CUDA);
  return in;
}
Inputs make_inputs(const Case& c, DType dtype) {
  return make_inputs(c.t, c.v, c.shift, c.teacher_shift, c.mul, c.offset, c.teacher_offset, dtype);
}

// The labels argument: undefined without a label term (it must then never be read).
Tensor labels_arg(const Inputs& in, const DistillParams& p) {
  return p.label_weight != 0 ? in.labels.t : Tensor{};
}

struct Outputs {
  Owned losses, distill, logits;  // host copies: (T) f32, (T) f32, (T, V) in the logits' dtype
};

Outputs run_device(const Inputs& in, const DistillParams& p, bool with_grad, float scale,
                   const Variant& var) {
  const DeviceTensor logits = gpu_empty(in.logits.t.shape, in.logits.t.dtype, in.offset);
  copy_tensor(logits.t, in.logits.t);
  const int64_t t = in.logits.t.size(0);
  DeviceTensor losses = gpu_poisoned({t}, DType::F32), distill = gpu_poisoned({t}, DType::F32);
  if (var.path == DistillPath::Auto) {
    ops::distillation_loss(logits.t, in.teacher.t, labels_arg(in, p), in.mask, p, losses.t,
                           distill.t, with_grad, scale);
  } else {
#ifdef ENGINE_CUDA
    cuda::distillation_loss(logits.t, in.teacher.t, labels_arg(in, p), in.mask, p, losses.t,
                            distill.t, with_grad, scale, var.path, var.cluster);
#endif
  }
  return {to_host(losses.t, DType::F32), to_host(distill.t, DType::F32),
          to_host(logits.t, logits.t.dtype)};
}

double rounding_error(const Tensor& ref, DType dtype) {
  if (dtype != DType::BF16) return 0;
  Owned rounded = empty(ref.shape, DType::BF16, Device::CPU);
  ops::cast(ref, rounded);
  return compare(rounded, ref).rel_rms;
}

// Losses (T values, any dtype) against a reference, row by row: |got - ref| <= tol max(|ref|, 0.1)
// (the tolerances at the top of this file).
void check_rows(const Tensor& got, const Tensor& ref, double tol, const char* what) {
  INFO(what);
  CHECK_ROWS_CLOSE(got, ref, tol, 0.1);
}

double grad_allowance(const DistillParams& p) {
  return p.kind == DistillKind::ReverseKL ? 2e-3 : 1e-4;
}

// Checks a device gradient against the f64 reference.
void check_grad(const Tensor& got, const Tensor& ref, DType dtype, const DistillParams& p,
                const std::string& what) {
  const Comparison g = compare(got, ref, what);
  INFO(g.report);
  CHECK(g.nonfinite == 0);
  CHECK(g.rel_rms <= 2 * rounding_error(ref, dtype) + grad_allowance(p));
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
        losses64 = zeros({t}, DType::F64, Device::CUDA);
  const DistillParams p{DistillKind::SoftCE, 1.f, 0.f, 1.f, 0.f};
  auto call = [&](const Tensor& x, const Tensor& y, const Tensor& l, const DistillParams& q) {
    ops::distillation_loss(x, y, labels, mask, q, l, Tensor{}, true, 1.f);
  };
  CHECK_THROWS_WITH_AS(call(logits, teacher32, losses, p),
                       doctest::Contains("teacher is f32, expected bf16"), Error);
  CHECK_THROWS_WITH_AS(call(logits, narrow, losses, p),
                       doctest::Contains("teacher has shape (5, 6), expected (5, 7)"), Error);
  CHECK_THROWS_WITH_AS(call(logits64, teacher, losses, p),
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

// ---- Vocabulary-parallel trio.

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
        stats64 = zeros({7, c.t}, DType::F64, Device::CUDA);
  CHECK_THROWS_WITH_AS(
      ops::distillation_partial(x.t, y.t, in.labels, in.mask, 400, c.v, without, stats3),
      doctest::Contains("stats has shape (3, 8), expected (7, 8)"), Error);
  CHECK_THROWS_WITH_AS(
      ops::distillation_partial(x.t, y.t, in.labels, in.mask, 401, c.v, without, stats.t),
      doctest::Contains("not a shard of a vocabulary of 1000"), Error);
  CHECK_THROWS_WITH_AS(
      ops::distillation_combine(stats3.t.view({1, 3, c.t}), in.mask, without, rs, losses, Tensor{}),
      doctest::Contains("partials must be (P, 7, T)"), Error);
  CHECK_THROWS_WITH_AS(ops::distillation_combine(stats64.t.view({1, 7, c.t}), in.mask, without, rs,
                                                 losses, Tensor{}),
                       doctest::Contains("partials is f64, expected f32"), Error);
  CHECK_THROWS_WITH_AS(
      ops::distillation_grad(x.t, y.t, in.labels, in.mask, 400, without, stats3, 1.f),
      doctest::Contains("row_stats has shape (3, 8), expected (6, 8)"), Error);
  CHECK_NOTHROW(
      ops::distillation_combine(stats.t.view({1, 7, c.t}), in.mask, without, rs, losses, Tensor{}));
  CHECK_NOTHROW(ops::distillation_grad(x.t, y.t, Tensor{}, in.mask, 400, without, rs, 1.f));
}
