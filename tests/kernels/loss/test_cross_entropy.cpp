// CUDA fused cross-entropy (cuda/loss/cross_entropy.cu) against the CPU reference in f64 run on
// the very same logits (the device's bf16 or f32 values, widened exactly): a table of shapes and
// logit ranges, every path and cluster size the shape allows, with and without the gradient,
// grad_scale != 1, masked rows (whose labels are invalid and must never be read), labels at 0
// and V-1, logits whose base is not 16-byte aligned; determinism; the bad-label error; checks.
//
// Tolerances (relative RMS over the tensor, tests/common/testing.h):
//   losses    bf16 logits 1e-3, f32 logits 1e-5, per row, relative to max(|loss|, 1). Both
//             sides see identical inputs, so the only error is the kernel's f32 arithmetic
//             (ex2.approx ~2^-22 relative per term, f32 sums, x - m formed before scaling):
//             ~1e-6 of the loss, whatever the logits' magnitude, except that the sum of
//             exp(x - m) is at least 1, so its f32 rounding leaves an absolute error of ~6e-8 in
//             log-sum-exp: a row whose loss is ~0.005 (the target far above the rest) is off by
//             ~1e-5 of itself, which a bound relative to the loss alone would reject.
//   gradient  bf16: 1e-2, and at most 2x the error of the naive answer, the f64 reference
//             gradient rounded to bf16 (DESIGN.md's rule). The output is bf16, so its rounding
//             (2^-9 relative at worst, ~1.1e-3 RMS) is the floor and the f32 math adds ~1e-6;
//             1e-2 leaves room for tensors dominated by a few large entries (near one-hot rows
//             at 30x scale), where the RMS of the rounding is set by those few. f32: 1e-5.
//             Both plus an absolute RMS floor of grad_scale / sqrt(V) x 4 x 2^-24 (at most the
//             RMS of p - onehot times the rounding of a probability near one): a row whose
//             target's p is near one has a gradient p - 1 that cancels to far below its error
//             relative to p.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "cuda/common/arch.h"
#include "cuda/loss/cross_entropy.cuh"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;
using engine::cuda::ClusterExchange;
using engine::cuda::CrossEntropyChoice;
using engine::cuda::CrossEntropyPath;

namespace {

struct Case {
  int64_t t, v;
  double shift = 0, mul = 1;  // logits = mul * N(0, 2^2) + shift
  float grad_scale = 1.f;
  int64_t offset = 0;  // elements between the allocation and logits[0] (misaligned base)
  std::string name() const {
    return "T" + std::to_string(t) + " V" + std::to_string(v) + " shift " + std::to_string(shift) +
           " x" + std::to_string(mul) + " scale " + std::to_string(grad_scale) + " offset " +
           std::to_string(offset);
  }
};

const std::vector<Case> kCases = {
    {1, 2, 0, 1, 1.f},           // no full vector: scalars only
    {7, 29, 0, 1, 0.37f},        // rows start at every alignment
    {33, 1000, 0, 1, 1.f},       // aligned rows, several per WarpRows block
    {33, 1000, 0, 1, 0.5f, 3},   // same with a misaligned base: head and tail scalars in every row
    {16, 50257, 0, 1, 0.37f},    // GPT-2 vocabulary: odd V
    {5, 128256, 0, 1, 1.f / 5},  // Llama-3 vocabulary: the benchmark's rows
    {9, 1000, 1000, 1, 1.f},     // large magnitudes: lse - x_label must not lose the tail
    {9, 1000, -1000, 1, 0.37f},  // ... and below
    {11, 3001, 0, 30, 1.f},      // near one-hot rows
    {6, 50257, -1000, 30, 2.f},
};

struct Variant {
  CrossEntropyChoice choice;
  std::string name() const {
    const char* n[] = {"Auto", "WarpRows", "BlockRows", "Cluster"};
    const CrossEntropyChoice& c = choice;
    return std::string(n[static_cast<int>(c.path)]) +
           (c.cluster ? " C" + std::to_string(c.cluster) : "") +
           (c.exchange == ClusterExchange::Push ? " push" : "");
  }
};

// Every path and cluster size that can run a row of v logits of this dtype, with both exchanges.
std::vector<Variant> variants_for(int64_t v, DType dtype) {
  std::vector<Variant> out;
#ifdef ENGINE_CUDA
  using P = CrossEntropyPath;
  constexpr ClusterExchange kPush = ClusterExchange::Push;
  const CrossEntropyChoice all[] = {
      {P::Auto},          {P::WarpRows},      {P::BlockRows},        {P::Cluster, 1},
      {P::Cluster, 2},    {P::Cluster, 4},    {P::Cluster, 8},       {P::Cluster, 2, kPush},
      {P::Cluster, 4, kPush},                 {P::Cluster, 8, kPush},
  };
  for (const CrossEntropyChoice& c : all)
    if (cuda::cross_entropy_plan(v, dtype, c)) out.push_back({c});
#endif
  return out;
}

// Auto goes through the op's dispatch; forced paths call the launcher directly.
void run_ce(const Tensor& logits, const Tensor& labels, const Tensor& mask, const Tensor& losses,
            bool with_grad, float grad_scale, const Variant& var, float z_loss = 0.f,
            float label_smoothing = 0.f, int64_t columns = 0) {
  if (var.choice.path == CrossEntropyPath::Auto) {
    ops::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale, z_loss,
                       label_smoothing, columns);
    return;
  }
#ifdef ENGINE_CUDA
  cuda::cross_entropy(logits, labels, mask, losses, with_grad, grad_scale, var.choice, z_loss,
                      label_smoothing, columns);
#else
  FAIL("forced CUDA paths need a CUDA build");
#endif
}

// Device inputs: labels uniform in [0, V) with labels at 0 and V-1, every 5th row (from row 3)
// masked with an out-of-range label that must be ignored.
struct Inputs {
  DeviceTensor logits;  // (T, V) on the device, `offset` elements into its allocation
  int64_t offset = 0;
  Owned labels_host, mask_host, labels, mask;
};

Inputs make_inputs(const Case& c, DType dtype) {
  Inputs in;
  Owned x = randn({c.t, c.v}, DType::F32, "ce.logits", 2.0);
  for (int64_t i = 0; i < x->numel(); ++i)
    x.ptr<float>()[i] = static_cast<float>(c.mul * x.ptr<float>()[i] + c.shift);
  in.offset = c.offset;
  in.logits = to_gpu(x.t, dtype, c.offset);
  in.labels_host = randint({c.t}, 0, c.v, "ce.labels");
  in.mask_host = empty({c.t}, DType::U8, Device::CPU);
  int32_t* lab = in.labels_host.ptr<int32_t>();
  uint8_t* msk = in.mask_host.ptr<uint8_t>();
  for (int64_t r = 0; r < c.t; ++r) {
    msk[r] = r % 5 != 3;
    if (!msk[r]) lab[r] = r % 2 ? -7 : static_cast<int32_t>(c.v + 3);
  }
  lab[0] = static_cast<int32_t>(c.v - 1);
  if (c.t > 1) lab[1] = 0;
  if (c.t > 2) lab[2] = static_cast<int32_t>(c.v - 1);
  in.labels = to_device(in.labels_host.t, Device::CUDA);
  in.mask = to_device(in.mask_host.t, Device::CUDA);
  return in;
}

// The device kernel's outputs, on the host: losses (T) f32, logits (T, V) in their dtype.
struct Outputs {
  Owned losses, logits;
};

// One call on a fresh copy of the inputs' logits (at the same misalignment).
Outputs run_device(const Inputs& in, bool with_grad, float grad_scale, const Variant& var) {
  const DeviceTensor logits = gpu_empty(in.logits.t.shape, in.logits.t.dtype, in.offset);
  copy_tensor(logits.t, in.logits.t);
  Owned losses = empty({in.logits.t.size(0)}, DType::F32, Device::CUDA);
  poison(losses);
  run_ce(logits.t, in.labels, in.mask, losses, with_grad, grad_scale, var);
  return {to_host(losses, DType::F32), to_host(logits.t, logits.t.dtype)};
}

}  // namespace

TEST_CASE("cross_entropy cuda matches the f64 reference (shapes, dtypes, paths, grad on/off)" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  for (const Case& c : kCases) {
    SUBCASE(c.name().c_str()) {
      for (DType dtype : {DType::BF16, DType::F32}) {
        INFO("logits ", dtype_name(dtype));
        const Inputs in = make_inputs(c, dtype);
        const Owned before = to_host(in.logits.t, dtype);
        // The reference in f64 on exactly the device's values.
        Owned ref_grad = to_host(in.logits.t, DType::F64);
        Owned ref_losses = empty({c.t}, DType::F64, Device::CPU);
        ref::cross_entropy(ref_grad, in.labels_host, in.mask_host, ref_losses, true, c.grad_scale,
                           0.f, 0.f, 0);
        double naive = 0;  // the bf16 rounding of the exact gradient
        if (dtype == DType::BF16) {
          Owned rounded = empty(ref_grad.t.shape, DType::BF16, Device::CPU);
          ops::cast(ref_grad, rounded);
          naive = compare(rounded, ref_grad).rel_rms;
        }
        const double loss_tol = dtype == DType::BF16 ? 1e-3 : 1e-5;
        const double grad_tol = dtype == DType::BF16 ? 1e-2 : 1e-5;
        const std::vector<Variant> vars = variants_for(c.v, dtype);
        REQUIRE(vars.size() >= 3);
        for (const Variant& var : vars) {
          for (bool with_grad : {false, true}) {
            INFO(var.name(), with_grad ? ", with grad" : ", losses only");
            const Outputs out = run_device(in, with_grad, c.grad_scale, var);
            CHECK_ROWS_CLOSE(out.losses.t, ref_losses.t, loss_tol, 1.0);
            for (int64_t r = 0; r < c.t; ++r)
              if (!in.mask_host.ptr<uint8_t>()[r]) CHECK(out.losses.ptr<float>()[r] == 0.f);
            if (!with_grad) {
              CHECK(bitwise_equal(out.logits, before));  // untouched
              continue;
            }
            const Comparison g = compare(out.logits, ref_grad, "gradient");
            INFO(g.report);
            CHECK(g.nonfinite == 0);
            // (plus the absolute floor of the header: grad_tol alone failed the vocab-parallel
            // twin of this test on T1 V2, TEST_SEED=60761218)
            const double grad_abs = c.grad_scale / std::sqrt(static_cast<double>(c.v)) * 4 * std::ldexp(1.0, -24) /
                                    std::max(g.scale, 1e-30);
            CHECK(g.rel_rms <= grad_tol + grad_abs);
            if (dtype == DType::BF16) CHECK(g.rel_rms <= 2 * naive + 1e-7 + grad_abs);
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

TEST_CASE("cross_entropy cuda picks the cluster path for large rows and WarpRows for small ones" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
#ifdef ENGINE_CUDA
  auto plan = [](int64_t v, DType dt) { return *cuda::cross_entropy_plan(v, dt); };
  if (!cuda::arch::current().clusters) {  // the portable choices (cuda/common/arch.h)
    MESSAGE("cross_entropy: no thread-block clusters here (", cuda::arch::describe(cuda::arch::current()),
            "): Auto takes WarpRows / BlockRows");
    CHECK(plan(1000, DType::BF16).path == CrossEntropyPath::WarpRows);
    for (int64_t v : {32000, 50304, 128256}) CHECK(plan(v, DType::BF16).path == CrossEntropyPath::BlockRows);
    CHECK_FALSE(cuda::cross_entropy_plan(32000, DType::BF16, CrossEntropyPath::Cluster).has_value());
    return;
  }
  CHECK(plan(1000, DType::BF16).path == CrossEntropyPath::WarpRows);
  CHECK(plan(32000, DType::BF16).path == CrossEntropyPath::Cluster);
  // One block per row while two fit on a multiprocessor (no cluster exchange), e.g. GPT-2's.
  CHECK(plan(50304, DType::BF16).path == CrossEntropyPath::Cluster);
  CHECK(plan(50304, DType::BF16).cluster == 1);
  CHECK(plan(128256, DType::BF16).path == CrossEntropyPath::Cluster);
  CHECK(plan(128256, DType::BF16).cluster >= 2);
  CHECK(plan(128256, DType::BF16).exchange == ClusterExchange::Push);  // no GPU-scope fence
  CHECK(plan(128256, DType::F32).path == CrossEntropyPath::Cluster);
  CHECK(plan(128256, DType::F32).cluster >= 4);
  // Beyond 8 slices of the shared memory: the streaming fallback.
  CHECK(plan(8 * 128 * 1024, DType::BF16).path == CrossEntropyPath::BlockRows);
  CHECK_FALSE(
      cuda::cross_entropy_plan(128256, DType::BF16, CrossEntropyPath::Cluster, 1).has_value());
  CHECK_FALSE(
      cuda::cross_entropy_plan(1000, DType::BF16, CrossEntropyPath::Cluster, 3).has_value());
  using P = CrossEntropyPath;
  CHECK_FALSE(cuda::cross_entropy_plan(1000, DType::BF16,
                                       {P::BlockRows, 0, ClusterExchange::Push})
                  .has_value());
  CHECK_FALSE(
      cuda::cross_entropy_plan(1000, DType::BF16, {P::Auto, 0, ClusterExchange::Push}).has_value());
  // The largest row an 8-block cluster holds: the push kernel's static shared memory is larger
  // than the barrier kernel's, so there Auto exchanges by Barrier; one logit more takes BlockRows.
  auto fits8 = [](int64_t v, ClusterExchange x) {
    return cuda::cross_entropy_plan(v, DType::BF16, {P::Cluster, 8, x}).has_value();
  };
  int64_t lo = 8 * 1024, hi = int64_t{1} << 24;  // lo fits, hi does not
  REQUIRE(fits8(lo, ClusterExchange::Barrier));
  while (hi - lo > 1) (fits8((lo + hi) / 2, ClusterExchange::Barrier) ? lo : hi) = (lo + hi) / 2;
  INFO("largest 8-block row: ", lo, " bf16 logits");
  CHECK_FALSE(fits8(lo, ClusterExchange::Push));
  CHECK(plan(lo, DType::BF16).path == P::Cluster);
  CHECK(plan(lo, DType::BF16).cluster == 8);
  CHECK(plan(lo, DType::BF16).exchange == ClusterExchange::Barrier);
  CHECK(plan(lo + 1, DType::BF16).path == P::BlockRows);
#endif
}

TEST_CASE("cross_entropy cuda: the push exchange gives bitwise the barrier exchange's results" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
#ifdef ENGINE_CUDA
  if (!cuda::arch::current().clusters) {
    engine::testing::skip_test("cross_entropy: the Cluster exchanges need thread-block clusters, which " +
                               cuda::arch::describe(cuda::arch::current()) + " lacks");
    return;
  }
#endif
  using P = CrossEntropyPath;
  constexpr ClusterExchange kBar = ClusterExchange::Barrier, kPush = ClusterExchange::Push;
  const Case c{13, 50257, 0, 1, 0.5f, 1};
  const Inputs in = make_inputs(c, DType::BF16);
  const CrossEntropyChoice pairs[][2] = {
      {{P::Cluster, 2, kBar}, {P::Cluster, 2, kPush}},
      {{P::Cluster, 4, kBar}, {P::Cluster, 4, kPush}},
      {{P::Cluster, 8, kBar}, {P::Cluster, 8, kPush}},
  };
  for (const auto& pair : pairs) {
    const Variant a{pair[0]}, b{pair[1]};
    INFO(a.name());
    for (auto [z, eps] : {std::pair{0.f, 0.f}, std::pair{1e-4f, 0.1f}}) {
      INFO("z ", z, " eps ", eps);
      const DeviceTensor la = gpu_empty(in.logits.t.shape, DType::BF16, in.offset),
                         lb = gpu_empty(in.logits.t.shape, DType::BF16, in.offset);
      copy_tensor(la.t, in.logits.t);
      copy_tensor(lb.t, in.logits.t);
      Owned sa = empty({c.t}, DType::F32, Device::CUDA), sb = empty({c.t}, DType::F32, Device::CUDA);
      run_ce(la.t, in.labels, in.mask, sa, true, c.grad_scale, a, z, eps);
      run_ce(lb.t, in.labels, in.mask, sb, true, c.grad_scale, b, z, eps);
      CHECK(bitwise_equal(to_host(sa, DType::F32), to_host(sb, DType::F32)));
      CHECK(bitwise_equal(to_host(la.t, DType::BF16), to_host(lb.t, DType::BF16)));
    }
  }
}

TEST_CASE("cross_entropy cuda is deterministic (bitwise equal twice, every path)" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  // The last case launches several waves of clusters of every size.
  for (const Case& c : {Case{6, 128256, 0, 1, 0.25f}, Case{19, 50257, 0, 3, 1.f},
                        Case{33, 1000, 0, 1, 1.f}, Case{600, 8200, 0, 1, 1.f / 600}}) {
    INFO(c.name());
    const Inputs in = make_inputs(c, DType::BF16);
    for (const Variant& var : variants_for(c.v, DType::BF16)) {
      INFO(var.name());
      const Outputs a = run_device(in, true, c.grad_scale, var);
      const Outputs b = run_device(in, true, c.grad_scale, var);
      CHECK(bitwise_equal(a.losses, b.losses));
      CHECK(bitwise_equal(a.logits, b.logits));
    }
  }
}

TEST_CASE("cross_entropy cuda reports an out-of-range label where the mask is set (every path)" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  const Case c{8, 1000};
  for (const Variant& var : variants_for(c.v, DType::BF16)) {
    INFO(var.name());
    Inputs in = make_inputs(c, DType::BF16);
    int32_t* lab = in.labels_host.ptr<int32_t>();
    uint8_t* msk = in.mask_host.ptr<uint8_t>();
    Owned losses = empty({c.t}, DType::F32, Device::CUDA);
    auto call = [&] {
      in.labels = to_device(in.labels_host.t, Device::CUDA);
      in.mask = to_device(in.mask_host.t, Device::CUDA);
      run_ce(in.logits.t, in.labels, in.mask, losses, true, 1.f, var);
    };
    lab[5] = 1000;
    CHECK_THROWS_WITH_AS(call(), doctest::Contains("labels[5] = 1000 out of range [0, 1000)"),
                         Error);
    lab[2] = -3;  // the first bad position is the one reported
    CHECK_THROWS_WITH_AS(call(), doctest::Contains("labels[2] = -3"), Error);
    msk[2] = 0;  // masked out: ignored
    CHECK_THROWS_WITH_AS(call(), doctest::Contains("labels[5] = 1000"), Error);
    lab[5] = 999;
    CHECK_NOTHROW(call());  // the flag does not stick between calls
  }
}

TEST_CASE("cross_entropy cuda rejects bad dtypes, shapes and forced paths that cannot hold a row" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  const int64_t t = 5, v = 7;
  Owned logits = zeros({t, v}, DType::BF16, Device::CUDA);
  Owned labels = zeros({t}, DType::I32, Device::CUDA), mask = zeros({t}, DType::U8, Device::CUDA);
  Owned losses = zeros({t}, DType::F32, Device::CUDA);
  Owned losses64 = zeros({t}, DType::F64, Device::CUDA),
        mask32 = zeros({t}, DType::I32, Device::CUDA);
  Owned labels_short = zeros({t - 1}, DType::I32, Device::CUDA);
  Owned logits64 = zeros({t, v}, DType::F64, Device::CUDA),
        flat = zeros({t * v}, DType::BF16, Device::CUDA);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, labels, mask, losses64, false, 1.f, 0.f, 0.f, 0),
                       doctest::Contains("losses is f64, expected f32"), Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, labels, mask32, losses, false, 1.f, 0.f, 0.f, 0),
                       doctest::Contains("mask is i32, expected u8"), Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, labels_short, mask, losses, false, 1.f, 0.f, 0.f,
                                          0),
                       doctest::Contains("labels has shape (4), expected (5)"), Error);
  // f64 logits with the f64 losses of their stat dtype: only the kernel's dtype is wrong.
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits64, labels, mask, losses64, false, 1.f, 0.f, 0.f, 0),
                       doctest::Contains("expected bf16 or f32"), Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(flat, labels, mask, losses, false, 1.f, 0.f, 0.f, 0),
                       doctest::Contains("must be 2-D"), Error);
#ifdef ENGINE_CUDA
  CHECK_THROWS_WITH_AS(
      cuda::cross_entropy(logits, labels, mask, losses, false, 1.f, CrossEntropyPath::Cluster, 3),
      doctest::Contains("cannot run a row"), Error);
#endif
  CHECK_NOTHROW(ops::cross_entropy(logits, labels, mask, losses, true, 1.f, 0.f, 0.f, 0));
}

// ---- z-loss and label smoothing: the same kernels with the extra terms (the loss adds
// z lse^2 and eps (m - mean x), the gradient is a p - b - (label ? c : 0)), every path, against
// the f64 reference with the same coefficients. Tolerances as above; the bf16 bound allows 1e-5
// beyond 2x the rounding error, for the f32 error of elements where a p and eps / V nearly cancel.
TEST_CASE("cross_entropy cuda with z-loss and label smoothing matches the f64 reference" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  const std::vector<Case> cases = {
      {7, 29, 0, 1, 0.37f},     {33, 1000, 0, 1, 0.5f, 3}, {16, 50257, 0, 1, 0.37f},
      {4, 128256, 0, 1, 0.25f}, {9, 1000, 1000, 1, 1.f},   {9, 3001, -1000, 3, 0.37f},
  };
  const std::vector<std::pair<float, float>> regs = {{1e-3f, 0.f}, {0.f, 0.1f}, {1e-4f, 0.25f}};
  for (const Case& c : cases) {
    SUBCASE(c.name().c_str()) {
      for (DType dtype : {DType::BF16, DType::F32}) {
        INFO("logits ", dtype_name(dtype));
        const Inputs in = make_inputs(c, dtype);
        for (auto [z, eps] : regs) {
          INFO("z ", z, " eps ", eps);
          Owned ref_grad = to_host(in.logits.t, DType::F64);
          Owned ref_losses = empty({c.t}, DType::F64, Device::CPU);
          ref::cross_entropy(ref_grad, in.labels_host, in.mask_host, ref_losses, true, c.grad_scale,
                             z, eps, 0);
          double naive = 0;
          if (dtype == DType::BF16) {
            Owned rounded = empty(ref_grad.t.shape, DType::BF16, Device::CPU);
            ops::cast(ref_grad, rounded);
            naive = compare(rounded, ref_grad).rel_rms;
          }
          for (const Variant& var : variants_for(c.v, dtype)) {
            INFO(var.name());
            const DeviceTensor logits = gpu_empty(in.logits.t.shape, dtype, in.offset);
            copy_tensor(logits.t, in.logits.t);
            Owned losses = empty({c.t}, DType::F32, Device::CUDA);
            poison(losses);
            run_ce(logits.t, in.labels, in.mask, losses, true, c.grad_scale, var, z, eps);
            CHECK_CLOSE(losses.t, ref_losses.t, dtype == DType::BF16 ? 1e-4 : 1e-5);
            const Comparison g = compare(logits.t, ref_grad, "gradient");
            INFO(g.report);
            CHECK(g.nonfinite == 0);
            if (dtype == DType::BF16)
              CHECK(g.rel_rms <= 2 * naive + 1e-5);
            else
              CHECK(g.rel_rms <= 1e-5);
          }
        }
      }
    }
  }
}

TEST_CASE("cross_entropy cuda over padded rows (columns < width) matches the f64 reference, padding untouched" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  // Rows of W = round_up(V, 8) (+8) elements of which the first V are the vocabulary; the
  // padding holds NaN, so reading it would show in the losses, and must keep its bits.
  for (auto [t, v] : {std::pair<int64_t, int64_t>{37, 50257}, {64, 257}, {19, 1000}, {5, 129}}) {
    const int64_t w = (v + 7) / 8 * 8 + 8;
    CAPTURE(t);
    CAPTURE(v);
    for (DType dtype : {DType::BF16, DType::F32}) {
      INFO("logits ", dtype_name(dtype));
      Owned x = randn({t, w}, DType::F32, "ce.pad.logits", 2.0);
      for (int64_t r = 0; r < t; ++r)
        for (int64_t c = v; c < w; ++c) x.ptr<float>()[r * w + c] = NAN;
      const DeviceTensor padded = to_gpu(x.t, dtype);
      const Owned before = to_host(padded.t, dtype);
      Owned labels_host = randint({t}, 0, v, "ce.pad.labels"), mask_host = empty({t}, DType::U8, Device::CPU);
      for (int64_t r = 0; r < t; ++r) mask_host.ptr<uint8_t>()[r] = r % 5 != 3;
      labels_host.ptr<int32_t>()[0] = static_cast<int32_t>(v - 1);
      const Owned labels = to_device(labels_host.t, Device::CUDA), mask = to_device(mask_host.t, Device::CUDA);
      // The reference on the compact (t, v) values the device holds.
      Owned ref_grad = empty({t, v}, DType::F64, Device::CPU);
      ops::copy_columns(to_host(padded.t, DType::F64), 0, ref_grad, 0, v, false);
      Owned ref_losses = empty({t}, DType::F64, Device::CPU);
      ref::cross_entropy(ref_grad, labels_host, mask_host, ref_losses, true, 0.5f, 1e-4f, 0.1f, 0);
      for (const Variant& var : variants_for(v, dtype)) {
        INFO(var.name());
        const DeviceTensor logits = gpu_empty({t, w}, dtype);
        copy_tensor(logits.t, padded.t);
        Owned losses = empty({t}, DType::F32, Device::CUDA);
        poison(losses);
        run_ce(logits.t, labels, mask, losses, true, 0.5f, var, 1e-4f, 0.1f, v);
        CHECK_CLOSE(losses.t, ref_losses.t, dtype == DType::BF16 ? 1e-3 : 1e-5);
        const Owned out = to_host(logits.t, dtype);
        Owned grad = empty({t, v}, dtype, Device::CPU);
        ops::copy_columns(out, 0, grad, 0, v, false);
        CHECK_CLOSE(grad.t, ref_grad.t, dtype == DType::BF16 ? 1e-2 : 1e-5);
        bool padding_kept = true;
        const size_t es = dtype_size(dtype);
        for (int64_t r = 0; r < t; ++r)
          padding_kept &= std::memcmp(static_cast<const char*>(out->data) + (r * w + v) * es,
                                      static_cast<const char*>(before->data) + (r * w + v) * es, (w - v) * es) == 0;
        CHECK(padding_kept);
      }
    }
  }
}
