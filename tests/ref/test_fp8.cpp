// FP8 numerics on the CPU (ops/fp8.h): the encodings against a brute-force nearest-value search
// over all 256 bytes, named cases (ties, subnormals, saturation, NaN, signed zero), amax and the
// quantisation per tensor, per row and transposed, the scaled product against an f64 product of
// the decoded bytes, and the argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/fp8.h"
#include "ops/gemm.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;
using ops::Fp8Format;

namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};

// The nearest finite value of the format, ties to the even byte (an even mantissa's last bit),
// found by looking at every byte; beyond the largest magnitude, that magnitude (saturation).
uint8_t nearest_by_search(float x, Fp8Format f) {
  int best = -1;
  double best_gap = 0;
  for (int v = 0; v < 256; ++v) {
    const float d = ops::fp8_decode(static_cast<uint8_t>(v), f);
    if (!std::isfinite(d) || std::signbit(d) != std::signbit(x)) continue;
    const double gap = std::fabs(static_cast<double>(d) - x);
    if (best < 0 || gap < best_gap || (gap == best_gap && (v & 1) == 0)) {
      best = v;
      best_gap = gap;
    }
  }
  return static_cast<uint8_t>(best);
}

Owned u8(Shape s) { return empty(s, DType::U8, Device::CPU); }
Owned f32(Shape s) { return empty(s, DType::F32, Device::CPU); }

}  // namespace

TEST_CASE("fp8 encoding: named cases of rounding, subnormals, saturation, NaN and signed zero") {
  const auto e4 = [](float x) { return static_cast<int>(ops::fp8_encode(x, Fp8Format::E4M3)); };
  const auto e5 = [](float x) { return static_cast<int>(ops::fp8_encode(x, Fp8Format::E5M2)); };
  CHECK(e4(1.f) == 0x38);
  CHECK(e4(-2.f) == 0xc0);
  CHECK(e4(1.0625f) == 0x38);  // the tie of 1 and 1.125 goes to the even 1
  CHECK(e4(1.1875f) == 0x3a);  // the tie of 1.125 and 1.25 goes to the even 1.25
  CHECK(e4(448.f) == 0x7e);
  CHECK(e4(464.f) == 0x7e);    // the tie of 448 and 480 (not a value: 0x7f is NaN) saturates
  CHECK(e4(1e6f) == 0x7e);
  CHECK(e4(-INFINITY) == 0xfe);
  CHECK(e4(std::ldexp(1.f, -9)) == 0x01);   // the smallest subnormal
  CHECK(e4(std::ldexp(1.f, -10)) == 0x00);  // half of it: the tie goes to the even zero
  CHECK(e4(std::ldexp(1.5f, -9)) == 0x02);  // between 1 and 2 quanta: the even 2
  CHECK(e4(std::ldexp(1.f, -6)) == 0x08);   // the smallest normal
  CHECK(e4(-0.f) == 0x80);
  CHECK(e4(-1e-30f) == 0x80);
  CHECK(e4(NAN) == 0x7f);
  CHECK(e4(-NAN) == 0x7f);
  CHECK(e5(1.f) == 0x3c);
  CHECK(e5(57344.f) == 0x7b);
  CHECK(e5(61440.f) == 0x7b);  // the tie of 57344 and 65536 (infinity's place) saturates
  CHECK(e5(INFINITY) == 0x7b);
  CHECK(e5(std::ldexp(1.f, -16)) == 0x01);
  CHECK(e5(-NAN) == 0x7f);
  CHECK(ops::fp8_decode(0x7f, Fp8Format::E4M3) != ops::fp8_decode(0x7f, Fp8Format::E4M3));
  CHECK(ops::fp8_decode(0x7c, Fp8Format::E5M2) == INFINITY);
  CHECK(ops::fp8_decode(0x7e, Fp8Format::E4M3) == 448.f);
  CHECK(ops::fp8_decode(0xfb, Fp8Format::E5M2) == -57344.f);
}

TEST_CASE("fp8 encoding: every byte decodes and encodes back; random values go to the nearest byte") {
  for (Fp8Format f : kFormats) {
    CAPTURE(ops::fp8_format_name(f));
    for (int v = 0; v < 256; ++v) {
      const float d = ops::fp8_decode(static_cast<uint8_t>(v), f);
      if (!std::isfinite(d)) continue;
      CHECK(ops::fp8_encode(d, f) == v);
    }
    // Values of every binade the format has, and beyond, with their midpoints.
    const PhiloxKey key = test_key(std::string("fp8.encode.") + ops::fp8_format_name(f));
    const int lo = f == Fp8Format::E4M3 ? -12 : -19, hi = f == Fp8Format::E4M3 ? 10 : 17;
    int wrong = 0;
    for (int i = 0; i < 20000; ++i) {
      const Philox4 r = philox4x32(key, static_cast<uint64_t>(i));
      const double u = bits_to_unit(r.v[0]);
      const float x = static_cast<float>((r.v[1] & 1 ? -1 : 1) * std::ldexp(u, lo + i % (hi - lo)));
      wrong += ops::fp8_encode(x, f) != nearest_by_search(x, f);
    }
    for (int v = 0; v + 1 < 127; ++v) {  // the exact midpoints of neighbouring bytes
      const double a = ops::fp8_decode(static_cast<uint8_t>(v), f), b = ops::fp8_decode(static_cast<uint8_t>(v + 1), f);
      if (!std::isfinite(b)) continue;
      const float mid = static_cast<float>((a + b) / 2);
      wrong += ops::fp8_encode(mid, f) != nearest_by_search(mid, f);
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("fp8 amax and quantize: per tensor, per row and transposed; zero rows and NaN") {
  Owned x = randn({5, 7}, DType::F32, "fp8.x", 3.0);
  x.ptr<float>()[2 * 7 + 3] = -40.f;  // row 2's and column 3's largest magnitude
  for (int j = 0; j < 7; ++j) x.ptr<float>()[4 * 7 + j] = 0.f;  // row 4 is zero
  Owned xt = f32({7, 5});
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j) xt.ptr<float>()[j * 5 + i] = x.ptr<float>()[i * 7 + j];
  for (Fp8Format f : kFormats) {
    for (bool per_row : {false, true}) {
      for (bool transpose : {false, true}) {
        CAPTURE(ops::fp8_format_name(f));
        CAPTURE(per_row);
        CAPTURE(transpose);
        const int64_t rows = transpose ? 7 : 5, cols = transpose ? 5 : 7;
        const Tensor& view = transpose ? xt.t : x.t;  // op(x) written out
        Owned amax = f32({per_row ? rows : 1}), scale_inv = f32({per_row ? rows : 1}), out = u8({rows, cols});
        ops::fp8_amax(x, transpose, amax);
        for (int64_t r = 0; r < amax->numel(); ++r) {
          float want = 0;
          for (int64_t j = 0; j < cols; ++j)
            if (per_row) want = std::max(want, std::fabs(view.ptr<float>()[r * cols + j]));
          if (!per_row)
            for (int64_t i = 0; i < 35; ++i) want = std::max(want, std::fabs(x.ptr<float>()[i]));
          CHECK(amax.ptr<float>()[r] == want);
        }
        ops::fp8_quantize(x, transpose, amax, f, out, scale_inv);
        for (int64_t r = 0; r < rows; ++r) {
          const float a = amax.ptr<float>()[per_row ? r : 0];
          const float scale = a == 0.f ? 1.f : ops::fp8_max(f) / a;
          CHECK(scale_inv.ptr<float>()[per_row ? r : 0] == 1.f / scale);
          for (int64_t j = 0; j < cols; ++j) {
            const float v = view.ptr<float>()[r * cols + j];
            CHECK(out.ptr<uint8_t>()[r * cols + j] == ops::fp8_encode(v * scale, f));
            // A row's largest magnitude lands on the format's largest finite value.
            if (std::fabs(v) == a && a != 0.f)
              CHECK(std::fabs(ops::fp8_decode(out.ptr<uint8_t>()[r * cols + j], f)) == ops::fp8_max(f));
          }
        }
      }
    }
  }
  x.ptr<float>()[1 * 7 + 5] = NAN;
  Owned rows = f32({5}), all = f32({1});
  ops::fp8_amax(x, false, rows);
  ops::fp8_amax(x, false, all);
  CHECK(std::isnan(rows.ptr<float>()[1]));
  CHECK(rows.ptr<float>()[2] == 40.f);
  CHECK(std::isnan(all.ptr<float>()[0]));
}

TEST_CASE("fp8_matmul equals the f64 product of the decoded bytes times the scales; beta accumulates") {
  const int64_t m = 6, n = 5, k = 9;
  for (Fp8Format fa : kFormats) {
    for (Fp8Format fb : kFormats) {
      if (fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2) continue;
      for (bool per_row : {false, true}) {
        CAPTURE(per_row);
        Owned xa = randn({m, k}, DType::F32, "fp8.mm.a"), xb = randn({n, k}, DType::F32, "fp8.mm.b");
        Owned a = u8({m, k}), b = u8({n, k});
        Owned amax_a = f32({per_row ? m : 1}), amax_b = f32({per_row ? n : 1});
        Owned sa = f32({per_row ? m : 1}), sb = f32({per_row ? n : 1});
        ops::fp8_amax(xa, false, amax_a);
        ops::fp8_amax(xb, false, amax_b);
        ops::fp8_quantize(xa, false, amax_a, fa, a, sa);
        ops::fp8_quantize(xb, false, amax_b, fb, b, sb);
        // The decoded, rescaled operands in f64 and their product through the f64 GEMM.
        Owned da = empty({m, k}, DType::F64, Device::CPU), db = empty({n, k}, DType::F64, Device::CPU);
        for (int64_t i = 0; i < m * k; ++i)
          da.ptr<double>()[i] = double(ops::fp8_decode(a.ptr<uint8_t>()[i], fa)) * sa.ptr<float>()[per_row ? i / k : 0];
        for (int64_t i = 0; i < n * k; ++i)
          db.ptr<double>()[i] = double(ops::fp8_decode(b.ptr<uint8_t>()[i], fb)) * sb.ptr<float>()[per_row ? i / k : 0];
        Owned want = empty({m, n}, DType::F64, Device::CPU);
        ops::matmul(da, false, db, true, want, {});
        Owned c = empty({m, n}, DType::F64, Device::CPU);
        ops::fp8_matmul(a, fa, sa, b, fb, sb, c, 0.f);
        CHECK_CLOSE(c, want, 1e-14);
        // The product approximates the unquantised one to FP8's precision (not much worse).
        Owned exact = empty({m, n}, DType::F64, Device::CPU);
        Owned xa64 = to_host(xa, DType::F64), xb64 = to_host(xb, DType::F64);
        ops::matmul(xa64, false, xb64, true, exact, {});
        CHECK(compare(c, exact).rel_rms < (fa == Fp8Format::E4M3 && fb == Fp8Format::E4M3 ? 0.08 : 0.15));
        ops::fp8_matmul(a, fa, sa, b, fb, sb, c, 1.f);
        for (int64_t i = 0; i < m * n; ++i) want.ptr<double>()[i] *= 2;
        CHECK_CLOSE(c, want, 1e-14);
      }
    }
  }
}

TEST_CASE("fp8 ops name the argument they refuse") {
  Owned x = f32({4, 6}), a = u8({4, 16}), b = u8({8, 16}), s1 = f32({1}), s4 = f32({4}), s8 = f32({8});
  Owned c = f32({4, 8}), cb = empty({4, 8}, DType::BF16, Device::CPU), out = u8({4, 6});
  CHECK(error_of([&] { ops::fp8_amax(x, false, f32({5})); }).find("amax has shape (5)") != std::string::npos);
  CHECK(error_of([&] { ops::fp8_quantize(x, true, s1, Fp8Format::E4M3, out, s1); }).find("out has shape") !=
        std::string::npos);
  Owned out_t = u8({6, 4}), s6 = f32({6}), inv = f32({1}), inv_t = f32({1});
  CHECK(error_of([&] { ops::fp8_quantize_pair(x, s1, s1, Fp8Format::E4M3, out, inv, out, inv_t); })
            .find("out_t has shape (4, 6)") != std::string::npos);
  CHECK(error_of([&] { ops::fp8_quantize_pair(x, s4, s4, Fp8Format::E4M3, out, f32({4}), out_t, s6); })
            .find("amax_t has shape (4)") != std::string::npos);  // one a column of x (6)
  CHECK(error_of([&] { ops::fp8_quantize_pair(x, s1, s1, Fp8Format::E4M3, out, inv, out_t, inv); })
            .find("must not alias") != std::string::npos);
  CHECK(error_of([&] { ops::fp8_quantize_pair(x, s1, s1, Fp8Format::E4M3, out, inv, out_t, inv_t); }).empty());
  CHECK(error_of([&] { ops::fp8_matmul(a, Fp8Format::E5M2, s1, b, Fp8Format::E5M2, s1, c, 0.f); })
            .find("e5m2 x e5m2") != std::string::npos);
  CHECK(error_of([&] { ops::fp8_matmul(a, Fp8Format::E4M3, s4, b, Fp8Format::E4M3, s1, c, 0.f); })
            .find("mix per-tensor and per-row") != std::string::npos);
  ops::Fp8MatmulOptions with_addend(0.f);
  with_addend.addend = c;
  CHECK(error_of([&] { ops::fp8_matmul(a, Fp8Format::E4M3, s1, b, Fp8Format::E4M3, s1, c, with_addend); })
            .find("addend is read with beta = 1") != std::string::npos);
  with_addend.beta = 1.f;
  with_addend.addend = cb;
  CHECK(error_of([&] { ops::fp8_matmul(a, Fp8Format::E4M3, s1, b, Fp8Format::E4M3, s1, c, with_addend); })
            .find("addend is bf16") != std::string::npos);
  with_addend.addend = c->slice(1, 4);
  CHECK(error_of([&] { ops::fp8_matmul(a, Fp8Format::E4M3, s1, b, Fp8Format::E4M3, s1, c, with_addend); })
            .find("addend has shape") != std::string::npos);
  ops::Fp8MatmulOptions with_bias;
  with_bias.bias = f32({4});
  CHECK(error_of([&] { ops::fp8_matmul(a, Fp8Format::E4M3, s1, b, Fp8Format::E4M3, s1, c, with_bias); })
            .find("bias has shape (4)") != std::string::npos);
  CHECK(error_of([&] { ops::fp8_matmul(a, Fp8Format::E4M3, s1, a, Fp8Format::E4M3, s1, c, 0.f); })
            .find("c has shape") != std::string::npos);
  CHECK(error_of([&] { ops::fp8_matmul(a, Fp8Format::E4M3, s4, b, Fp8Format::E4M3, s8, c, 0.f); }).empty());
}
