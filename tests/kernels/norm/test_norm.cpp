// GPU tests of cuda/norm (layernorm, rmsnorm) against the f64 CPU reference (csrc/ref/norm.cpp),
// on fresh random inputs of odd sizes, with poisoned outputs.
// Tolerances: a bf16 output must be within twice the error of rounding the exact (f64) result to
// bf16, plus a floor of 1e-4 (the kernel computes in f32 and rounds once, so its error is that
// rounding plus f32 noise); the reference runs on the same bf16-rounded inputs. f32 outputs
// (all-f32 runs, statistics, weight gradients) within 1e-5. Weight gradients accumulate into
// random prefills; results are bitwise reproducible; dx may alias dy. The residual forms are
// checked against the separate add kernels and plain norms (the sum bitwise, the rest within the
// tolerances above: the fused kernels reduce in another order when they take another path, and
// the compiler contracts their arithmetic differently, so the bits are not the separate ops'),
// and against f64. The amax the forwards write beside y (FP8) is fp8_amax of y, bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/fp8.h"
#include "ops/norm.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr float kEps = 1e-5f;
constexpr double kF32Tol = 1e-5;

struct NormCase {
  int64_t t, c;
  int64_t offset;  // 1: every tensor starts one element past a 16-byte boundary (scalar kernels)
  std::string name() const {
    return "T" + std::to_string(t) + " C" + std::to_string(c) + (offset ? " misaligned" : "");
  }
};
// Vector rows of 64, 320, 768, 2048 and 4096 columns take every packs-per-lane instantiation of
// the warp-per-row layernorm forward (bf16 1, 2, 4, 8, 16; f32 1, 4, 8, 16) and the backward's
// shared-memory and register column sums. The warp-per-row backward (C <= 128 packs) takes rows
// of 8, 64, 264, 320, 768 and 1000 columns: bf16 1, 1, 2, 2, 3 and 4 packs per lane (8 and 264
// with idle lanes), f32 1, 1, 3, 3 (768 and 1000: the block kernel). The plain layernorm
// backward's four-row blocks (128-thread rows: bf16 C 1025..2048, f32 C 513..1024) run at 2048
// (bf16, a row a group), 768 and 1000 (f32, several rows a group and a remainder) and 1032 (bf16:
// 129 packs in 96 threads of 2, so idle packs, and a remainder of 3 rows).
// The persistent grids hold thousands of rows at once, so a warp or block takes several rows
// (the next row's prefetch, the per-lane column sums over rows) only on thousands of rows: the
// small tier does so once, on cheap 64-column rows (2999 rows); the large tier on every layout.
const std::vector<NormCase> kSmallCases = {
    {1, 11, 0},   {7, 64, 0},   {3, 8192, 0}, {5, 8190, 0}, {33, 64, 1},  {6, 2047, 1},
    {2, 768, 1},  {5, 320, 0},  {9, 768, 0},  {64, 2048, 0}, {2, 8, 0},   {3, 1000, 0},
    {5, 264, 0},  {7, 1032, 0}, {2999, 64, 0}};
const std::vector<NormCase> kLargeCases = {{1000, 2047, 0}, {300, 4096, 0},  {4099, 768, 0},
                                           {3301, 264, 0},  {3333, 1000, 0}, {2051, 1032, 0}};
using Cases = std::vector<NormCase>;

Owned random_x(const NormCase& k) {
  Owned x = randn({k.t, k.c}, DType::F32, "norm.x");
  for (int64_t i = 0; i < x.t.numel(); ++i) set(x, i, get(x, i) + 0.7);  // a mean to remove
  return x;
}

Owned random_weight(int64_t c, const std::string& name) {
  Owned w = randn({c}, DType::F32, name, 0.5);
  for (int64_t i = 0; i < c; ++i) set(w, i, get(w, i) + 1.0);
  return w;
}

const char* dname(DType d) { return dtype_name(d); }

void layernorm_forward_sweep(const Cases& cases) {
  if (!gpu_available_or_skip()) return;
  for (const NormCase& k : cases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        for (bool with_bias : {true, false}) {
          INFO(dname(dt), with_bias ? " with bias" : " without bias");
          auto [gx, x64] = device_input(random_x(k), dt, k.offset);
          auto [gw, w64] = device_input(random_weight(k.c, "norm.w"), dt, k.offset);
          auto [gb, b64] = device_input(randn({k.c}, DType::F32, "norm.b", 0.3), dt, k.offset);
          Owned y64 = empty({k.t, k.c}, DType::F64, Device::CPU),
                mean64 = empty({k.t}, DType::F64, Device::CPU),
                rstd64 = empty({k.t}, DType::F64, Device::CPU);
          ops::layernorm_forward(x64, w64, with_bias ? b64.t : Tensor(), kEps, y64, mean64, rstd64, {});

          DeviceTensor gy = gpu_poisoned({k.t, k.c}, dt, k.offset);
          DeviceTensor gmean = gpu_poisoned({k.t}, DType::F32),
              grstd = gpu_poisoned({k.t}, DType::F32);
          ops::layernorm_forward(gx.t, gw.t, with_bias ? gb.t : Tensor(), kEps, gy.t, gmean.t,
                                 grstd.t, {});
          CHECK_CLOSE(gy.t, y64.t, output_tol(dt, y64, kF32Tol));
          CHECK_CLOSE(gmean.t, mean64.t, kF32Tol);
          CHECK_CLOSE(grstd.t, rstd64.t, kF32Tol);
        }
      }
    }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda layernorm forward matches the f64 reference (bf16 and f32, with and without bias)", layernorm_forward_sweep, kSmallCases, kLargeCases)

namespace {
void rmsnorm_forward_sweep(const Cases& cases) {
  if (!gpu_available_or_skip()) return;
  for (const NormCase& k : cases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dname(dt));
        auto [gx, x64] = device_input(random_x(k), dt, k.offset);
        auto [gw, w64] = device_input(random_weight(k.c, "norm.w"), dt, k.offset);
        Owned y64 = empty({k.t, k.c}, DType::F64, Device::CPU),
              rstd64 = empty({k.t}, DType::F64, Device::CPU);
        ops::rmsnorm_forward(x64, w64, kEps, y64, rstd64, {});

        DeviceTensor gy = gpu_poisoned({k.t, k.c}, dt, k.offset);
        DeviceTensor grstd = gpu_poisoned({k.t}, DType::F32);
        ops::rmsnorm_forward(gx.t, gw.t, kEps, gy.t, grstd.t, {});
        CHECK_CLOSE(gy.t, y64.t, output_tol(dt, y64, kF32Tol));
        CHECK_CLOSE(grstd.t, rstd64.t, kF32Tol);
      }
    }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda rmsnorm forward matches the f64 reference (bf16 and f32)", rmsnorm_forward_sweep, kSmallCases, kLargeCases)

// Backward inputs: the statistics are the reference's, rounded to f32 (what the kernel takes),
// and the reference runs on exactly those values.
namespace {
void layernorm_backward_sweep(const Cases& cases) {
  if (!gpu_available_or_skip()) return;
  for (const NormCase& k : cases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        for (bool with_bias : {true, false}) {
          INFO(dname(dt), with_bias ? " with dbias" : " without dbias");
          auto [gx, x64] = device_input(random_x(k), dt, k.offset);
          auto [gw, w64] = device_input(random_weight(k.c, "norm.w"), dt, k.offset);
          auto [gdy, dy64] = device_input(randn({k.t, k.c}, DType::F32, "norm.dy"), dt, k.offset);
          Owned y64 = empty({k.t, k.c}, DType::F64, Device::CPU),
                mean64 = empty({k.t}, DType::F64, Device::CPU),
                rstd64 = empty({k.t}, DType::F64, Device::CPU);
          ops::layernorm_forward(x64, w64, Tensor(), kEps, y64, mean64, rstd64, {});
          auto [gmean, mean_r] = device_input(mean64, DType::F32);
          auto [grstd, rstd_r] = device_input(rstd64, DType::F32);

          Owned dw0 = randn({k.c}, DType::F32, "norm.dw0"),
                db0 = randn({k.c}, DType::F32, "norm.db0");
          Owned dx64 = empty({k.t, k.c}, DType::F64, Device::CPU);
          Owned dw64 = to_host(dw0, DType::F64), db64 = to_host(db0, DType::F64);
          ops::layernorm_backward(dy64, x64, w64, mean_r, rstd_r, dx64, dw64,
                                  with_bias ? db64.t : Tensor());

          DeviceTensor gdx = gpu_poisoned({k.t, k.c}, dt, k.offset);
          DeviceTensor gdw = to_gpu(dw0, DType::F32), gdb = to_gpu(db0, DType::F32);
          ops::layernorm_backward(gdy.t, gx.t, gw.t, gmean.t, grstd.t, gdx.t, gdw.t,
                                  with_bias ? gdb.t : Tensor());
          CHECK_CLOSE(gdx.t, dx64.t, output_tol(dt, dx64, kF32Tol));
          CHECK_CLOSE(gdw.t, dw64.t, kF32Tol);
          if (with_bias)
            CHECK_CLOSE(gdb.t, db64.t, kF32Tol);
          else
            CHECK(bitwise_equal(gdb.t, to_gpu(db0, DType::F32).t));  // untouched
        }
      }
    }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda layernorm backward matches the f64 reference and accumulates dweight, dbias", layernorm_backward_sweep, kSmallCases, kLargeCases)

namespace {
void rmsnorm_backward_sweep(const Cases& cases) {
  if (!gpu_available_or_skip()) return;
  for (const NormCase& k : cases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dname(dt));
        auto [gx, x64] = device_input(random_x(k), dt, k.offset);
        auto [gw, w64] = device_input(random_weight(k.c, "norm.w"), dt, k.offset);
        auto [gdy, dy64] = device_input(randn({k.t, k.c}, DType::F32, "norm.dy"), dt, k.offset);
        Owned y64 = empty({k.t, k.c}, DType::F64, Device::CPU),
              rstd64 = empty({k.t}, DType::F64, Device::CPU);
        ops::rmsnorm_forward(x64, w64, kEps, y64, rstd64, {});
        auto [grstd, rstd_r] = device_input(rstd64, DType::F32);

        Owned dw0 = randn({k.c}, DType::F32, "norm.dw0");
        Owned dx64 = empty({k.t, k.c}, DType::F64, Device::CPU), dw64 = to_host(dw0, DType::F64);
        ops::rmsnorm_backward(dy64, x64, w64, rstd_r, dx64, dw64);

        DeviceTensor gdx = gpu_poisoned({k.t, k.c}, dt, k.offset);
        DeviceTensor gdw = to_gpu(dw0, DType::F32);
        ops::rmsnorm_backward(gdy.t, gx.t, gw.t, grstd.t, gdx.t, gdw.t);
        CHECK_CLOSE(gdx.t, dx64.t, output_tol(dt, dx64, kF32Tol));
        CHECK_CLOSE(gdw.t, dw64.t, kF32Tol);
      }
    }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda rmsnorm backward matches the f64 reference and accumulates dweight", rmsnorm_backward_sweep, kSmallCases, kLargeCases)

namespace {
void reproducible_sweep(const Cases& cases) {
  if (!gpu_available_or_skip()) return;
  for (const NormCase& k : cases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dname(dt));
        Owned x = random_x(k), w = random_weight(k.c, "norm.w"),
              b = randn({k.c}, DType::F32, "norm.b", 0.3),
              dy = randn({k.t, k.c}, DType::F32, "norm.dy"),
              dw0 = randn({k.c}, DType::F32, "norm.dw0");
        DeviceTensor gx = to_gpu(x, dt, k.offset), gw = to_gpu(w, dt, k.offset),
            gb = to_gpu(b, dt, k.offset), gdy = to_gpu(dy, dt, k.offset);
        DeviceTensor mean = gpu_poisoned({k.t}, DType::F32),
            rstd = gpu_poisoned({k.t}, DType::F32);

        // Forward twice, then in place.
        DeviceTensor y1 = gpu_poisoned({k.t, k.c}, dt, k.offset),
            y2 = gpu_poisoned({k.t, k.c}, dt, k.offset);
        ops::layernorm_forward(gx.t, gw.t, gb.t, kEps, y1.t, mean.t, rstd.t, {});
        ops::layernorm_forward(gx.t, gw.t, gb.t, kEps, y2.t, mean.t, rstd.t, {});
        CHECK(bitwise_equal(y1.t, y2.t));
        DeviceTensor inplace = to_gpu(x, dt, k.offset);
        ops::layernorm_forward(inplace.t, gw.t, gb.t, kEps, inplace.t, mean.t, rstd.t, {});
        CHECK(bitwise_equal(y1.t, inplace.t));

        // Backward twice (layernorm and rmsnorm), then dx = dy in place.
        for (bool layer : {true, false}) {
          INFO((layer ? "layernorm" : "rmsnorm"));
          if (layer)
            ops::layernorm_forward(gx.t, gw.t, gb.t, kEps, y1.t, mean.t, rstd.t, {});
          else
            ops::rmsnorm_forward(gx.t, gw.t, kEps, y1.t, rstd.t, {});
          auto backward = [&](const Tensor& dyt, const Tensor& dxt, const Tensor& dwt,
                              const Tensor& dbt) {
            if (layer)
              ops::layernorm_backward(dyt, gx.t, gw.t, mean.t, rstd.t, dxt, dwt, dbt);
            else
              ops::rmsnorm_backward(dyt, gx.t, gw.t, rstd.t, dxt, dwt);
          };
          DeviceTensor dx1 = gpu_poisoned({k.t, k.c}, dt, k.offset),
              dx2 = gpu_poisoned({k.t, k.c}, dt, k.offset);
          DeviceTensor dw1 = to_gpu(dw0, DType::F32), dw2 = to_gpu(dw0, DType::F32),
              dw3 = to_gpu(dw0, DType::F32);
          DeviceTensor db1 = to_gpu(dw0, DType::F32), db2 = to_gpu(dw0, DType::F32),
              db3 = to_gpu(dw0, DType::F32);
          backward(gdy.t, dx1.t, dw1.t, db1.t);
          backward(gdy.t, dx2.t, dw2.t, db2.t);
          CHECK(bitwise_equal(dx1.t, dx2.t));
          CHECK(bitwise_equal(dw1.t, dw2.t));
          CHECK(bitwise_equal(db1.t, db2.t));
          DeviceTensor alias = to_gpu(dy, dt, k.offset);
          backward(alias.t, alias.t, dw3.t, db3.t);
          CHECK(bitwise_equal(dx1.t, alias.t));
          CHECK(bitwise_equal(dw1.t, dw3.t));
        }
      }
    }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda norms are bitwise reproducible and allow y = x and dx = dy in place", reproducible_sweep, kSmallCases, kLargeCases)

// ---- residual forms ---------------------------------------------------------------------------
// *_residual_forward / *_residual_backward against the separate path (ops::add / add_inplace
// kernels around the plain norm kernels), bitwise: the fused kernels normalise the sum rounded to
// the dtype and round dx before adding dresidual, as the separate kernels do. And against the
// f64 reference: sum against x + residual exactly, y and the statistics against the reference
// norm of the device's (rounded) sum, dx against the reference on the device's statistics.
// Aliases: sum over x, y over residual, dx over dresidual. res_offset: the element offset of
// residual and dresidual alone (1 with aligned others: the scalar kernels, chosen by them).

namespace {

void residual_forward(bool layer, const Tensor& x, const Tensor& r, const Tensor& w,
                      const Tensor& b, const Tensor& sum, const Tensor& y, const Tensor& mean,
                      const Tensor& rstd, const Tensor& amax = {}) {
  if (layer)
    ops::layernorm_residual_forward(x, r, w, b, kEps, sum, y, mean, rstd, amax);
  else
    ops::rmsnorm_residual_forward(x, r, w, kEps, sum, y, rstd, amax);
}

void plain_forward(bool layer, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd, const Tensor& amax = {}) {
  if (layer)
    ops::layernorm_forward(x, w, b, kEps, y, mean, rstd, amax);
  else
    ops::rmsnorm_forward(x, w, kEps, y, rstd, amax);
}

// The amax a forward wrote beside y (FP8) is fp8_amax of y as stored, bit for bit.
void check_amax(const Tensor& amax, const Tensor& y) {
  DeviceTensor want = gpu_poisoned({1}, DType::F32);
  ops::fp8_amax(y, false, want.t);
  CHECK(bitwise_equal(amax, want.t));
}

void residual_backward(bool layer, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const Tensor& mean, const Tensor& rstd, const Tensor& dres,
                       const Tensor& dx, const Tensor& dw, const Tensor& db,
                       const Tensor& dx_colsum = {}) {
  if (layer)
    ops::layernorm_residual_backward(dy, x, w, mean, rstd, dres, dx, dw, db, dx_colsum);
  else
    ops::rmsnorm_residual_backward(dy, x, w, rstd, dres, dx, dw, dx_colsum);
}

void plain_backward(bool layer, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dw,
                    const Tensor& db) {
  if (layer)
    ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
  else
    ops::rmsnorm_backward(dy, x, w, rstd, dx, dw);
}

// bf16 tolerance of a result rounded twice: `inner` (exact) rounded to bf16, added to something
// exact, and the sum (`outer`, exact) rounded again. Each element's error is at most half a bf16
// ulp of inner plus (the second rounding, of a sum already off by the first) one ulp of outer:
// the RMS of those bounds over the RMS of outer, plus the 1e-4 floor. A bound, not twice the
// expected error as bf16_tol: with few elements the expected error says little.
double bf16_tol2(const Tensor& inner, const Tensor& outer) {
  auto ulp = [](double v) { return v == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(v) - 7); };
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < outer.numel(); ++i) {
    const double v = get(outer, i), e = 0.5 * ulp(get(inner, i)) + ulp(v);
    err2 += e * e;
    ref2 += v * v;
  }
  return (ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0) + 1e-4;
}

// Fused against separate: one bf16 rounding apart at most where their f32 values differ (1e-2
// relative RMS, the bf16 output tolerance of the GEMM and loss tests), f32 within kF32Tol.
double close_tol(DType dt) { return dt == DType::BF16 ? 1e-2 : kF32Tol; }

void check_residual(const NormCase& k, int64_t res_offset) {
  const Shape shape{k.t, k.c};
  for (DType dt : {DType::BF16, DType::F32}) {
    for (int variant : {0, 1, 2}) {  // layernorm with bias, layernorm without, rmsnorm
      const bool layer = variant < 2, with_bias = variant == 0;
      INFO(dname(dt), layer ? " layernorm" : " rmsnorm", with_bias ? " with bias" : "");
      Owned xh = random_x(k), rh = randn(shape, DType::F32, "norm.res"),
            dresh = randn(shape, DType::F32, "norm.dres"), dw0 = randn({k.c}, DType::F32, "norm.dw0"),
            db0 = randn({k.c}, DType::F32, "norm.db0"),
            cs0 = randn({k.c}, DType::F32, "norm.cs0");
      auto [gx, x64] = device_input(xh, dt, k.offset);
      auto [gr, r64] = device_input(rh, dt, res_offset);
      auto [gw, w64] = device_input(random_weight(k.c, "norm.w"), dt, k.offset);
      auto [gb, b64] = device_input(randn({k.c}, DType::F32, "norm.b", 0.3), dt, k.offset);
      auto [gdy, dy64] = device_input(randn(shape, DType::F32, "norm.dy"), dt, k.offset);
      auto [gdres, dres64] = device_input(dresh, dt, res_offset);
      const Tensor bias = with_bias ? gb.t : Tensor(), bias64 = with_bias ? b64.t : Tensor();

      // Forward: separate, fused, fused in place.
      DeviceTensor hs = gpu_poisoned(shape, dt, k.offset), ys = gpu_poisoned(shape, dt, k.offset),
          means = gpu_poisoned({k.t}, DType::F32), rstds = gpu_poisoned({k.t}, DType::F32);
      ops::add(gx.t, gr.t, hs.t);
      DeviceTensor amax = gpu_poisoned({1}, DType::F32);
      plain_forward(layer, hs.t, gw.t, bias, ys.t, means.t, rstds.t, amax.t);
      check_amax(amax.t, ys.t);
      DeviceTensor h = gpu_poisoned(shape, dt, k.offset), y = gpu_poisoned(shape, dt, k.offset),
          mean = gpu_poisoned({k.t}, DType::F32), rstd = gpu_poisoned({k.t}, DType::F32);
      residual_forward(layer, gx.t, gr.t, gw.t, bias, h.t, y.t, mean.t, rstd.t, amax.t);
      check_amax(amax.t, y.t);
      CHECK(bitwise_equal(h.t, hs.t));
      const Owned ys64 = to_host(ys.t, DType::F64);
      CHECK_CLOSE(y.t, ys64.t, close_tol(dt));
      CHECK_CLOSE(rstd.t, rstds.t, kF32Tol);
      if (layer) CHECK_CLOSE(mean.t, means.t, kF32Tol);
      DeviceTensor xa = to_gpu(xh, dt, k.offset), ra = to_gpu(rh, dt, res_offset);
      DeviceTensor mean2 = gpu_poisoned({k.t}, DType::F32), rstd2 = gpu_poisoned({k.t}, DType::F32);
      residual_forward(layer, xa.t, ra.t, gw.t, bias, xa.t, ra.t, mean2.t, rstd2.t);
      CHECK(bitwise_equal(xa.t, hs.t));
      CHECK_CLOSE(ra.t, ys64.t, close_tol(dt));

      // Forward against f64: the sum exactly, the norm of the device's sum.
      Owned s64 = empty(shape, DType::F64, Device::CPU);
      for (int64_t i = 0; i < s64->numel(); ++i) set(s64, i, get(x64, i) + get(r64, i));
      CHECK_CLOSE(h.t, s64.t, output_tol(dt, s64, kF32Tol));
      Owned h64 = to_host(h.t, DType::F64);
      Owned y64 = empty(shape, DType::F64, Device::CPU), mean64 = empty({k.t}, DType::F64, Device::CPU),
            rstd64 = empty({k.t}, DType::F64, Device::CPU);
      plain_forward(layer, h64, w64, bias64, y64, mean64, rstd64);
      CHECK_CLOSE(y.t, y64.t, output_tol(dt, y64, kF32Tol));
      CHECK_CLOSE(rstd.t, rstd64.t, kF32Tol);
      if (layer) CHECK_CLOSE(mean.t, mean64.t, kF32Tol);

      // Backward on the device's statistics: separate, fused, fused with dx over dresidual.
      const Tensor gmean = layer ? mean.t : Tensor();
      DeviceTensor dxs = gpu_poisoned(shape, dt, k.offset);
      DeviceTensor dws = to_gpu(dw0, DType::F32), dbs = to_gpu(db0, DType::F32);
      plain_backward(layer, gdy.t, h.t, gw.t, gmean, rstd.t, dxs.t, dws.t, with_bias ? dbs.t : Tensor());
      ops::add_inplace(dxs.t, gdres.t);
      // The fused form also sums dx's columns into dx_colsum (+=, from cs0).
      DeviceTensor dx = gpu_poisoned(shape, dt, k.offset);
      DeviceTensor dwf = to_gpu(dw0, DType::F32), dbf = to_gpu(db0, DType::F32);
      DeviceTensor csf = to_gpu(cs0, DType::F32);
      residual_backward(layer, gdy.t, h.t, gw.t, gmean, rstd.t, gdres.t, dx.t, dwf.t,
                        with_bias ? dbf.t : Tensor(), csf.t);
      const Owned dxs64 = to_host(dxs.t, DType::F64);
      CHECK_CLOSE(dx.t, dxs64.t, close_tol(dt));
      CHECK_CLOSE(dwf.t, dws.t, kF32Tol);
      if (with_bias) CHECK_CLOSE(dbf.t, dbs.t, kF32Tol);
      DeviceTensor css = to_gpu(cs0, DType::F32);  // the same sums by sum_rows over the fused dx
      ops::sum_rows(dx.t, css.t, 1.f);
      CHECK_CLOSE(csf.t, css.t, kF32Tol);
      DeviceTensor dxa = to_gpu(dresh, dt, res_offset);
      DeviceTensor dwa = to_gpu(dw0, DType::F32), dba = to_gpu(db0, DType::F32);
      DeviceTensor csa = to_gpu(cs0, DType::F32);
      residual_backward(layer, gdy.t, h.t, gw.t, gmean, rstd.t, dxa.t, dxa.t, dwa.t,
                        with_bias ? dba.t : Tensor(), csa.t);
      CHECK(bitwise_equal(dxa.t, dx.t));  // dx over dresidual: the same kernel, the same bits
      CHECK(bitwise_equal(dwa.t, dwf.t));
      CHECK(bitwise_equal(csa.t, csf.t));

      // Backward against f64, on the values the device holds (sum, statistics).
      Owned meanr = to_host(mean.t, DType::F64), rstdr = to_host(rstd.t, DType::F64);
      Owned dx64 = empty(shape, DType::F64, Device::CPU);
      Owned dw64 = to_host(dw0, DType::F64), db64 = to_host(db0, DType::F64);
      residual_backward(layer, dy64, h64, w64, layer ? meanr.t : Tensor(), rstdr, dres64, dx64, dw64,
                        with_bias ? db64.t : Tensor());
      // The kernel rounds the norm's dx to dt, then dx + dresidual (two roundings, as the separate
      // kernels do): bf16 is held to the bound of both roundings, so rows where dresidual cancels
      // much of dx do not fail on the first rounding alone (seen: T 2, C 8, 0.0044 against
      // twice one rounding's error, 0.0023).
      Owned dxn64 = empty(shape, DType::F64, Device::CPU), dwn64 = to_host(dw0, DType::F64),
            dbn64 = to_host(db0, DType::F64);
      plain_backward(layer, dy64, h64, w64, layer ? meanr.t : Tensor(), rstdr, dxn64, dwn64,
                     with_bias ? dbn64.t : Tensor());
      CHECK_CLOSE(dx.t, dx64.t, dt == DType::BF16 ? bf16_tol2(dxn64, dx64) : kF32Tol);
      // The column sums are of dx as written (rounded to dt): in f64 over the device's dx.
      Owned cs64 = to_host(cs0, DType::F64), dxr64 = to_host(dx.t, DType::F64);
      ops::sum_rows(dxr64, cs64, 1.f);
      CHECK_CLOSE(csf.t, cs64.t, kF32Tol);
      CHECK_CLOSE(dwf.t, dw64.t, kF32Tol);
      if (with_bias) CHECK_CLOSE(dbf.t, db64.t, kF32Tol);
    }
  }
}

void residual_sweep(const Cases& cases) {
  if (!gpu_available_or_skip()) return;
  for (const NormCase& k : cases) {
    SUBCASE(k.name().c_str()) { check_residual(k, k.offset); }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda residual norms match the separate add and norm and the f64 reference", residual_sweep, kSmallCases, kLargeCases)

TEST_CASE("cuda residual norms with only residual / dresidual misaligned take the scalar kernels" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const NormCase& k : std::vector<NormCase>{{9, 768, 0}, {5, 4096, 0}}) {
    SUBCASE(k.name().c_str()) { check_residual(k, 1); }
  }
}

TEST_CASE("cuda norm launchers reject mismatched dtypes and shapes" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  Owned x = randn({4, 16}, DType::F32, "norm.x"), w = randn({16}, DType::F32, "norm.w");
  DeviceTensor gx = to_gpu(x, DType::BF16), gw32 = to_gpu(w, DType::F32),
      gw = to_gpu(w, DType::BF16), gy = gpu_poisoned({4, 16}, DType::BF16),
      rstd = gpu_poisoned({4}, DType::F32), rstd_bf = gpu_poisoned({4}, DType::BF16),
      short_w = to_gpu(randn({15}, DType::F32, "norm.w15"), DType::BF16);
  CHECK_THROWS_AS(ops::rmsnorm_forward(gx.t, gw32.t, kEps, gy.t, rstd.t, {}), Error);     // weight f32
  CHECK_THROWS_AS(ops::rmsnorm_forward(gx.t, gw.t, kEps, gy.t, rstd_bf.t, {}), Error);    // rstd bf16
  CHECK_THROWS_AS(ops::rmsnorm_forward(gx.t, short_w.t, kEps, gy.t, rstd.t, {}), Error);  // (15)
  DeviceTensor wide = gpu_poisoned({2, 8200}, DType::BF16, 1);
  DeviceTensor wide_w = gpu_poisoned({8200}, DType::BF16, 1),
      wide_r = gpu_poisoned({2}, DType::F32);
  CHECK_THROWS_AS(ops::rmsnorm_forward(wide.t, wide_w.t, kEps, wide.t, wide_r.t, {}),
                  Error);  // C > 8192
}
