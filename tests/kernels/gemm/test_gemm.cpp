// CUDA GEMM (cuBLASLt) and sum_rows against the CPU reference in f64 on the same bf16-rounded
// inputs: odd sizes, all four transpose combinations, f32 and bf16 outputs, beta 0 (poisoned C)
// and beta 1 into f32, bias bf16/f32, pointers at odd element offsets (misaligned, odd leading
// dimensions), K = 0. The richer launcher cuda::gemm: bias gradients (fused BGRADA/BGRADB and the
// fallback kernels), GELU with and without its saved input. sum_rows / sum_columns: f32 sums in
// a fixed order, so two runs give the same bits.
// Tolerances (relative RMS vs the f64 reference): bf16 output 1e-2 (one bf16 rounding ~2e-3);
// f32 output 1e-5 (f32 accumulation over K <= 1000 terms); GELU applied by cuBLASLt into f32
// 1e-3 (its tanh may be a hardware approximation).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/gemm.h"
#include "tests/common/gpu_testing.h"

#ifdef ENGINE_CUDA
#include "cuda/gemm/gemm.cuh"
#endif

using namespace engine;
using namespace engine::testing;

namespace {

Shape stored(int64_t rows, int64_t cols, bool trans) {
  return trans ? Shape{cols, rows} : Shape{rows, cols};
}

double tol_for(DType out) { return out == DType::BF16 ? 1e-2 : 1e-5; }

struct Dims {
  int64_t m, n, k;
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
};

// Output dtype, alpha, beta and bias of one matmul; undefined bias dtype (U8) = no bias.
struct Variant {
  DType c;
  float alpha, beta;
  DType bias;
  std::string name() const {
    std::string s = std::string("c ") + dtype_name(c) + " alpha " + std::to_string(alpha) +
                    " beta " + std::to_string(beta);
    return bias == DType::U8 ? s : s + " bias " + dtype_name(bias);
  }
};

const std::vector<Dims> kDims = {{1, 1, 1},       {37, 53, 29},  {67, 131, 259},
                                 {257, 1000, 96}, {5, 3, 0},     {130, 64, 48}};
const std::vector<Variant> kVariants = {
    {DType::F32, 1.f, 0.f, DType::U8},     {DType::F32, 1.f, 1.f, DType::F32},
    {DType::BF16, 1.f, 0.f, DType::BF16},  {DType::BF16, -0.7f, 0.5f, DType::U8},
    {DType::F32, 0.5f, 0.f, DType::BF16},  {DType::BF16, 1.f, 1.f, DType::F32},
};

// Runs ops::matmul on the GPU (operands at the given element offsets) and compares with
// ref::matmul in f64 on the same rounded values. With `addend` C's initial values come as a
// separate tensor (MatmulOptions::addend) and c itself starts poisoned.
void check_matmul(const Dims& d, bool ta, bool tb, const Variant& v, int64_t offset, bool addend = false) {
  const std::string tag = d.name() + (ta ? "T" : "N") + (tb ? "T" : "N") + v.name();
  Owned a = randn(stored(d.m, d.k, ta), DType::BF16, "gemm.a " + tag);
  Owned b = randn(stored(d.k, d.n, tb), DType::BF16, "gemm.b " + tag);
  Owned c0 = randn({d.m, d.n}, v.c, "gemm.c " + tag);
  const bool has_bias = v.bias != DType::U8;
  Owned bias = randn({d.n}, has_bias ? v.bias : DType::F32, "gemm.bias " + tag);

  DeviceTensor da = to_gpu(a, offset), db = to_gpu(b, offset), dc = to_gpu(c0, offset);
  DeviceTensor dbias = to_gpu(bias, offset);
  DeviceTensor dr = to_gpu(c0, offset);
  if (v.beta == 0.f || addend) poison(dc.t);  // beta = 0 must not read C, nor an addend
  ops::MatmulOptions o{v.alpha, v.beta, has_bias ? dbias.t : Tensor{}};
  if (addend) o.addend = dr.t;
  ops::matmul(da.t, ta, db.t, tb, dc.t, o);

  Owned a64 = to_host(a, DType::F64), b64 = to_host(b, DType::F64);
  Owned c64 = to_host(c0, DType::F64), bias64 = to_host(bias, DType::F64);
  Owned before_bias = to_host(c0, DType::F64);
  ref::matmul(a64, ta, b64, tb, c64, {v.alpha, v.beta, has_bias ? bias64.t : Tensor{}});
  ref::matmul(a64, ta, b64, tb, before_bias, {v.alpha, v.beta, Tensor{}});
  // A bf16 C rounds alpha AB + beta C before the bias is added (when the epilogue is a separate
  // kernel): when the bias cancels that sum (1x1x1 cases) the error is relative to the sum and
  // the bias, not to the small result. Measure it against the largest of the three.
  auto cmp = compare(dc.t, c64.t, tag);
  auto rms = [](const Tensor& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += get(t, i) * get(t, i);
    return std::sqrt(s / std::max<int64_t>(1, t.numel()));
  };
  const double scale = std::max({cmp.scale, rms(before_bias), has_bias ? rms(bias64) : 0.0});
  INFO(cmp.report << "\n  error measured against scale " << scale);
  CHECK(cmp.nonfinite == 0);
  const double err = cmp.scale > 0 ? cmp.rel_rms * cmp.scale : cmp.rel_rms;  // rms(got - ref)
  CHECK(err <= tol_for(v.c) * std::max(scale, 1e-30));
}

}  // namespace

TEST_CASE("cuda matmul matches the f64 reference: sizes x transposes x output dtype, alpha, beta, bias" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const Dims& d : kDims) {
    SUBCASE(d.name().c_str()) {
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (const Variant& v : kVariants) {
            CAPTURE(ta);
            CAPTURE(tb);
            INFO(v.name());
            check_matmul(d, ta, tb, v, 0);
          }
    }
  }
}

TEST_CASE("cuda matmul with operands at odd element offsets (2-byte aligned pointers)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const Dims& d : {Dims{37, 53, 29}, Dims{64, 128, 96}, Dims{33, 40, 16}}) {
    SUBCASE(d.name().c_str()) {
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (const Variant& v : {kVariants[1], kVariants[2]}) {
            CAPTURE(ta);
            CAPTURE(tb);
            INFO(v.name());
            check_matmul(d, ta, tb, v, 1);
          }
    }
  }
}

TEST_CASE("cuda matmul with an addend read in place of c (the residual epilogue), aligned and not" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const Dims& d : kDims) {  // 5x3x0: no GEMM runs, the addend is copied first
    SUBCASE(d.name().c_str()) {
      for (int ta = 0; ta < 2; ++ta)
        for (int64_t offset : {0, 1})
          for (const Variant& v : {kVariants[1], kVariants[3], kVariants[5], kVariants[0]}) {
            CAPTURE(ta);
            CAPTURE(offset);
            INFO(v.name());
            check_matmul(d, ta, true, v, offset, true);
          }
    }
  }
}

TEST_CASE("cuda matmul rejects what the GPU does not take" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  Owned a = empty({4, 3}, DType::F32, Device::CUDA), b = empty({3, 5}, DType::BF16, Device::CUDA);
  Owned c = empty({4, 5}, DType::F32, Device::CUDA), a16 = empty({4, 3}, DType::BF16, Device::CUDA);
  CHECK_THROWS_AS(ops::matmul(a, false, b, false, c, {}), Error);              // f32 input
  CHECK_THROWS_AS(ops::matmul(a16, false, b, true, c, {}), Error);             // inner dims differ
  Owned bias = empty({4}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(ops::matmul(a16, false, b, false, c, {1.f, 0.f, bias}), Error);  // bias (M)
  Owned c64 = empty({4, 5}, DType::F64, Device::CUDA);
  CHECK_THROWS_AS(ops::matmul(a16, false, b, false, c64, {}), Error);
}

TEST_CASE("cuda sum_rows matches f64 column sums, applies beta, and repeats bit for bit" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t m, n;
  };
  const std::vector<Case> cases = {{1, 1},     {37, 53},  {1000, 257}, {16387, 77}, {200, 300},
                                   {3, 5000},  {0, 9},    {4096, 2048}, {777, 1024}, {32768, 768}};
  for (const Case& cs : cases) {
    SUBCASE((std::to_string(cs.m) + "x" + std::to_string(cs.n)).c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        // One input per dtype, its exact column sums computed once (row by row, in f64).
        const std::string xtag = std::to_string(cs.m) + dtype_name(dt);
        Owned x = randn({cs.m, cs.n}, dt, "sum_rows.x " + xtag);
        Owned x64 = to_host(x, DType::F64);
        std::vector<double> sums(static_cast<size_t>(cs.n), 0.0);
        for (int64_t i = 0; i < cs.m; ++i)
          for (int64_t j = 0; j < cs.n; ++j) sums[static_cast<size_t>(j)] += x64.ptr<double>()[i * cs.n + j];
        for (float beta : {0.f, 1.f, 0.5f})
          for (int64_t offset : {0, 1}) {
            INFO(dtype_name(dt), " beta ", beta, " offset ", offset);
            const std::string tag = xtag + std::to_string(beta);
            Owned out0 = randn({cs.n}, DType::F32, "sum_rows.out " + tag);
            DeviceTensor dx = to_gpu(x, offset), dout = to_gpu(out0, offset);
            if (beta == 0.f) poison(dout.t);
            ops::sum_rows(dx.t, dout.t, beta);
            Owned want = empty({cs.n}, DType::F64, Device::CPU);
            for (int64_t j = 0; j < cs.n; ++j)
              set(want, j, sums[static_cast<size_t>(j)] + (beta != 0.f ? beta * get(out0, j) : 0.0));
            CHECK_CLOSE(dout.t, want.t, 1e-5);
            if (beta == 0.f) {  // same input, same bits
              Owned first = to_host(dout.t, DType::F32);
              ops::sum_rows(dx.t, dout.t, 0.f);
              Owned second = to_host(dout.t, DType::F32);
              CHECK(bitwise_equal(first, second));
            }
          }
      }
    }
  }
}

#ifdef ENGINE_CUDA

TEST_CASE("cuda sum_columns (row sums) matches f64 and applies beta" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (auto [m, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {53, 37}, {300, 1000}, {9, 0}}) {
    for (DType dt : {DType::BF16, DType::F32})
      for (float beta : {0.f, 1.f})
        for (int64_t offset : {0, 1}) {
          INFO(m, "x", n, " ", dtype_name(dt), " beta ", beta, " offset ", offset);
          Owned x = randn({m, n}, dt, "sum_columns.x");
          Owned out0 = randn({m}, DType::F32, "sum_columns.out");
          DeviceTensor dx = to_gpu(x, offset), dout = to_gpu(out0, offset);
          if (beta == 0.f) poison(dout.t);
          cuda::sum_columns(dx.t, dout.t, beta);
          Owned want = empty({m}, DType::F64, Device::CPU);
          for (int64_t i = 0; i < m; ++i) {
            double s = 0;
            for (int64_t j = 0; j < n; ++j) s += get(x, i * n + j);
            set(want, i, s + (beta != 0.f ? beta * get(out0, i) : 0.0));
          }
          CHECK_CLOSE(dout.t, want.t, 1e-5);
        }
  }
}

namespace {

// Fused (cuBLASLt epilogue) vs fallback counts, printed once per test case.
struct FuseCount {
  int fused = 0, fallback = 0;
  void note() {
    const cuda::GemmLastCall last = cuda::gemm_last_call();
    fused += last.fused_epilogue;
    fallback += last.fallback_kernels;
  }
  void print(const char* what) const {
    std::printf("%s: %d calls with the epilogue fused in cuBLASLt, %d with separate kernels\n",
                what, fused, fallback);
  }
};

}  // namespace

TEST_CASE("cuda gemm bias gradients: dbias_a = sum_k op(A), dbias_b = sum_k op(B), fused and not" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  FuseCount count;
  for (const Dims& d : {Dims{37, 53, 29}, Dims{67, 131, 259}, Dims{256, 512, 128}, Dims{6, 5, 0}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int which = 0; which < 2; ++which)    // 0: dbias_a, 1: dbias_b
          for (int fuse = 0; fuse < 2; ++fuse)
            for (DType cdt : {DType::F32, DType::BF16}) {
              INFO(d.name(), " ta ", ta, " tb ", tb, which ? " dbias_b" : " dbias_a", " fuse ",
                   fuse, " c ", dtype_name(cdt));
              const std::string tag = d.name() + std::to_string(ta * 8 + tb * 4 + which * 2 + fuse);
              Owned a = randn(stored(d.m, d.k, ta), DType::BF16, "bgrad.a " + tag);
              Owned b = randn(stored(d.k, d.n, tb), DType::BF16, "bgrad.b " + tag);
              Owned c0 = randn({d.m, d.n}, cdt, "bgrad.c " + tag);
              const float beta = cdt == DType::F32 ? 1.f : 0.f;  // wgrad: accumulate into f32
              DeviceTensor da = to_gpu(a), db = to_gpu(b), dc = to_gpu(c0);
              if (beta == 0.f) poison(dc.t);
              const int64_t len = which ? d.n : d.m;
              Owned dbias = empty({len}, DType::F32, Device::CUDA);
              poison(dbias);
              cuda::GemmParams p;
              p.a = da.t, p.trans_a = ta, p.b = db.t, p.trans_b = tb, p.c = dc.t, p.beta = beta;
              (which ? p.dbias_b : p.dbias_a) = dbias.t;
              p.fuse_epilogue = fuse;
              cuda::gemm(p);
              count.note();

              Owned a64 = to_host(a, DType::F64), b64 = to_host(b, DType::F64),
                    c64 = to_host(c0, DType::F64);
              ref::matmul(a64, ta, b64, tb, c64, {1.f, beta, {}});
              CHECK_CLOSE(dc.t, c64.t, tol_for(cdt));
              Owned want = empty({len}, DType::F64, Device::CPU);
              for (int64_t i = 0; i < len; ++i) {
                double s = 0;
                for (int64_t kk = 0; kk < d.k; ++kk)
                  s += which ? get(b, tb ? i * d.k + kk : kk * d.n + i)
                             : get(a, ta ? kk * d.m + i : i * d.k + kk);
                set(want, i, s);
              }
              CHECK_CLOSE(dbias.t, want.t, 1e-5);
            }
  }
  count.print("bias gradients");
}

TEST_CASE("cuda gemm GELU epilogue with bias and saved input, fused and not" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  FuseCount count;
  for (const Dims& d : {Dims{37, 53, 29}, Dims{64, 96, 80}, Dims{67, 136, 259}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (DType cdt : {DType::BF16, DType::F32})
          for (DType bias_dt : {DType::U8, DType::BF16, DType::F32})
            for (int save = 0; save < 2; ++save)
              for (int fuse = 0; fuse < 2; ++fuse) {
                INFO(d.name(), " ta ", ta, " tb ", tb, " c ", dtype_name(cdt), " bias ",
                     bias_dt == DType::U8 ? "none" : dtype_name(bias_dt), " save ", save,
                     " fuse ", fuse);
                const std::string tag = d.name() + std::to_string(ta * 2 + tb);
                const bool has_bias = bias_dt != DType::U8;
                Owned a = randn(stored(d.m, d.k, ta), DType::BF16, "gelu.a " + tag, 0.2);
                Owned b = randn(stored(d.k, d.n, tb), DType::BF16, "gelu.b " + tag, 0.2);
                Owned bias = randn({d.n}, has_bias ? bias_dt : DType::F32, "gelu.bias " + tag);
                DeviceTensor da = to_gpu(a), db = to_gpu(b), dbias = to_gpu(bias);
                Owned c = empty({d.m, d.n}, cdt, Device::CUDA), pre = empty({d.m, d.n}, cdt, Device::CUDA);
                poison(c);
                poison(pre);
                cuda::GemmParams p;
                p.a = da.t, p.trans_a = ta, p.b = db.t, p.trans_b = tb, p.c = c.t;
                if (has_bias) p.bias = dbias.t;
                p.gelu = true;
                if (save) p.gelu_input = pre.t;
                p.fuse_epilogue = fuse;
                cuda::gemm(p);
                count.note();

                Owned a64 = to_host(a, DType::F64), b64 = to_host(b, DType::F64),
                      bias64 = to_host(bias, DType::F64);
                Owned want_pre = empty({d.m, d.n}, DType::F64, Device::CPU);
                ref::matmul(a64, ta, b64, tb, want_pre, {1.f, 0.f, has_bias ? bias64.t : Tensor{}});
                Owned want = empty({d.m, d.n}, DType::F64, Device::CPU);
                for (int64_t i = 0; i < want.t.numel(); ++i) {
                  const double x = get(want_pre, i);
                  set(want, i, 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))));
                }
                const bool fused = cuda::gemm_last_call().fused_epilogue;
                CHECK_CLOSE(c.t, want.t, cdt == DType::BF16 ? 1e-2 : (fused ? 1e-3 : 1e-5));
                if (save) CHECK_CLOSE(pre.t, want_pre.t, tol_for(cdt));
              }
  }
  count.print("GELU");
}

TEST_CASE("cuda gemm GELU backward epilogue (dgelu_input) with and without its bias gradient, fused and not" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // The MLP's backward: dh = (dy W) * gelu'(h), db = column sums of dh (DGELU_BGRAD).
  FuseCount count;
  for (const Dims& d : {Dims{37, 53, 29}, Dims{64, 96, 80}, Dims{67, 136, 259}, Dims{130, 3072, 64}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (DType cdt : {DType::BF16, DType::F32})
          for (DType db_dt : {DType::U8, DType::F32})
            for (int fuse = 0; fuse < 2; ++fuse) {
              INFO(d.name(), " ta ", ta, " tb ", tb, " c ", dtype_name(cdt), " dbias ",
                   db_dt == DType::U8 ? "none" : dtype_name(db_dt), " fuse ", fuse);
              const std::string tag = d.name() + std::to_string(ta * 2 + tb);
              const bool has_db = db_dt != DType::U8;
              Owned a = randn(stored(d.m, d.k, ta), DType::BF16, "dgelu.a " + tag, 0.3);
              Owned b = randn(stored(d.k, d.n, tb), DType::BF16, "dgelu.b " + tag, 0.3);
              Owned h = randn({d.m, d.n}, cdt, "dgelu.h " + tag, 1.5);
              DeviceTensor da = to_gpu(a), db = to_gpu(b), dh = to_gpu(h);
              Owned c = empty({d.m, d.n}, cdt, Device::CUDA), dbias = empty({d.n}, DType::F32, Device::CUDA);
              poison(c);
              poison(dbias);
              cuda::GemmParams p;
              p.a = da.t, p.trans_a = ta, p.b = db.t, p.trans_b = tb, p.c = c.t;
              p.alpha = 0.75f;
              p.dgelu_input = dh.t;
              if (has_db) p.dbias_out = dbias.t;
              p.fuse_epilogue = fuse;
              cuda::gemm(p);
              count.note();

              Owned a64 = to_host(a, DType::F64), b64 = to_host(b, DType::F64), h64 = to_host(h, DType::F64);
              Owned want = empty({d.m, d.n}, DType::F64, Device::CPU);
              ref::matmul(a64, ta, b64, tb, want, {0.75f, 0.f, {}});
              for (int64_t i = 0; i < want.t.numel(); ++i) {
                const double x = get(h64, i), th = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
                set(want, i, get(want, i) * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * 0.7978845608028654 *
                                                                  (1 + 3 * 0.044715 * x * x)));
              }
              const bool fused = cuda::gemm_last_call().fused_epilogue;
              CHECK_CLOSE(c.t, want.t, cdt == DType::BF16 ? 1e-2 : (fused ? 1e-3 : 1e-5));
              if (has_db) {
                Owned want_db = zeros({d.n}, DType::F64, Device::CPU);
                ref::sum_rows(want, want_db, 0.f);
                CHECK_CLOSE(dbias.t, want_db.t, cdt == DType::BF16 ? 1e-2 : (fused ? 1e-3 : 1e-5));
              }
            }
  }
  count.print("DGELU");
}

TEST_CASE("cuda gemm rejects inconsistent epilogue requests" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  Owned a = empty({4, 3}, DType::BF16, Device::CUDA), b = empty({3, 5}, DType::BF16, Device::CUDA);
  Owned c = empty({4, 5}, DType::F32, Device::CUDA);
  Owned dm = empty({4}, DType::F32, Device::CUDA), dn = empty({5}, DType::F32, Device::CUDA);
  cuda::GemmParams p;
  p.a = a.t, p.b = b.t, p.c = c.t;
  cuda::GemmParams both = p;
  both.dbias_a = dm.t, both.dbias_b = dn.t;
  CHECK_THROWS_AS(cuda::gemm(both), Error);
  cuda::GemmParams scaled = p;
  scaled.dbias_b = dn.t, scaled.alpha = 2.f;
  CHECK_THROWS_AS(cuda::gemm(scaled), Error);
  cuda::GemmParams with_bias = p;
  with_bias.dbias_a = dm.t, with_bias.bias = dn.t;
  CHECK_THROWS_AS(cuda::gemm(with_bias), Error);
  cuda::GemmParams wrong_len = p;
  wrong_len.dbias_a = dn.t;  // (N) where (M) is due
  CHECK_THROWS_AS(cuda::gemm(wrong_len), Error);
  cuda::GemmParams aux_no_gelu = p;
  Owned pre = empty({4, 5}, DType::F32, Device::CUDA);
  aux_no_gelu.gelu_input = pre.t;
  CHECK_THROWS_AS(cuda::gemm(aux_no_gelu), Error);
}

#endif  // ENGINE_CUDA
