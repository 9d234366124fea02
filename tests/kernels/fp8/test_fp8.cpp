// GPU tests of the FP8 ops (cuda/fp8/fp8.cu, cuda/gemm/gemm_fp8.cu) against the CPU reference
// (csrc/ref/fp8.cpp): amax and the quantised bytes bit for bit (one layout, or both from
// fp8_quantize_pair) (every bf16 value through the
// cast; random f32 and bf16 tensors of odd shapes, per tensor, per row and transposed, with
// NaN and zero rows, aligned (the 8-element kernels where rows allow) and one element off (the
// one-element kernels)), and the scaled product of every format pair, per tensor and per row, into
// bf16 and f32 (beta 1), within the f32 accumulation's error of the f64 reference product of the
// same bytes (f32: kF32Tol; bf16 outputs: bf16_tol). NaN amax and scales compare equal to any NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/fp8.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;
using ops::Fp8Format;

namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};
// An f32 product against the f64 one of the same bytes: Hopper's FP8 tensor cores keep fewer
// bits than f32 in their accumulator between promotions to f32, so the error is above f32's
// rounding and grows with K (docs/PERF.md has the measured figures).
constexpr double kF32Tol = 1e-4;

Owned cpu(Shape s, DType dt) { return empty(s, dt, Device::CPU); }

// f32 tensors equal bit for bit, a NaN equal to any NaN (the contract fixes no NaN payload).
bool same_floats(const Tensor& got, const Tensor& ref) {
  Owned g = to_host(got, DType::F32), r = to_host(ref, DType::F32);
  for (int64_t i = 0; i < g->numel(); ++i) {
    const float a = g.ptr<float>()[i], b = r.ptr<float>()[i];
    if (std::isnan(a) && std::isnan(b)) continue;
    if (std::memcmp(&a, &b, sizeof(a)) != 0) return false;
  }
  return true;
}

// u8 tensors equal; else the first differing byte and the x value it came from (x_of(i)).
template <typename F>
bool same_bytes(const Tensor& got_gpu, const Tensor& ref, F&& x_of) {
  Owned got = to_host(got_gpu, DType::U8);
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < got->numel(); ++i)
    if (got.ptr<uint8_t>()[i] != ref.ptr<uint8_t>()[i]) {
      if (first < 0) first = i;
      ++differ;
    }
  INFO("first differing byte ", first, ": gpu ", first >= 0 ? int(got.ptr<uint8_t>()[first]) : 0, " cpu ",
       first >= 0 ? int(ref.ptr<uint8_t>()[first]) : 0, " of x ", first >= 0 ? double(x_of(first)) : 0.0);
  return differ == 0;
}

// Runs amax and quantize on the GPU and on the CPU (x as the GPU holds it, in f32) and checks
// both bit for bit.
void check_scaling(const Tensor& host_x, DType dtype, bool per_row, bool transpose, Fp8Format f,
                   const Tensor* given_amax = nullptr, int64_t offset = 0) {
  const int64_t rows = transpose ? host_x.size(1) : host_x.size(0), cols = transpose ? host_x.size(0) : host_x.size(1);
  CAPTURE(host_x.shape.str());
  CAPTURE(dtype_name(dtype));
  CAPTURE(per_row);
  CAPTURE(transpose);
  CAPTURE(ops::fp8_format_name(f));
  CAPTURE(offset);
  DeviceTensor x = to_gpu(host_x, dtype, offset);
  Owned x32 = to_host(x.t, DType::F32);  // the values the GPU holds
  const int64_t ns = per_row ? rows : 1;
  Owned amax_ref = cpu({ns}, DType::F32), inv_ref = cpu({ns}, DType::F32), out_ref = cpu({rows, cols}, DType::U8);
  DeviceTensor amax = gpu_poisoned({ns}, DType::F32), inv = gpu_poisoned({ns}, DType::F32);
  DeviceTensor out = gpu_poisoned({rows, cols}, DType::U8, offset);
  if (given_amax) {
    std::memcpy(amax_ref.ptr<float>(), given_amax->data, sizeof(float) * static_cast<size_t>(ns));
    amax = to_gpu(amax_ref);
  } else {
    ops::fp8_amax(x32, transpose, amax_ref);
    ops::fp8_amax(x.t, transpose, amax.t);
    CHECK(same_floats(amax.t, amax_ref));
  }
  ops::fp8_quantize(x32, transpose, amax_ref, f, out_ref, inv_ref);
  ops::fp8_quantize(x.t, transpose, amax.t, f, out.t, inv.t);
  CHECK(same_floats(inv.t, inv_ref));
  CHECK(same_bytes(out.t, out_ref, [&](int64_t i) { return x32.ptr<float>()[transpose ? (i % cols) * rows + i / cols : i]; }));
}

// The pair: both layouts from one call equal two CPU quantisations bit for bit.
void check_pair(const Tensor& host_x, DType dtype, bool per_row, Fp8Format f, int64_t offset) {
  const int64_t rows = host_x.size(0), cols = host_x.size(1);
  CAPTURE(host_x.shape.str());
  CAPTURE(dtype_name(dtype));
  CAPTURE(per_row);
  CAPTURE(ops::fp8_format_name(f));
  CAPTURE(offset);
  DeviceTensor x = to_gpu(host_x, dtype, offset);
  Owned x32 = to_host(x.t, DType::F32);
  const int64_t nr = per_row ? rows : 1, nc = per_row ? cols : 1;
  Owned amax = cpu({nr}, DType::F32), amax_t = cpu({nc}, DType::F32);
  ops::fp8_amax(x32, false, amax);
  ops::fp8_amax(x32, true, amax_t);
  Owned out_ref = cpu({rows, cols}, DType::U8), out_t_ref = cpu({cols, rows}, DType::U8);
  Owned inv_ref = cpu({nr}, DType::F32), inv_t_ref = cpu({nc}, DType::F32);
  ops::fp8_quantize(x32, false, amax, f, out_ref, inv_ref);
  ops::fp8_quantize(x32, true, amax_t, f, out_t_ref, inv_t_ref);
  DeviceTensor gamax = to_gpu(amax), gamax_t = to_gpu(amax_t);
  DeviceTensor out = gpu_poisoned({rows, cols}, DType::U8, offset), out_t = gpu_poisoned({cols, rows}, DType::U8, offset);
  DeviceTensor inv = gpu_poisoned({nr}, DType::F32), inv_t = gpu_poisoned({nc}, DType::F32);
  // Per tensor, one amax tensor serves both layouts.
  ops::fp8_quantize_pair(x.t, gamax.t, per_row ? gamax_t.t : gamax.t, f, out.t, inv.t, out_t.t, inv_t.t);
  CHECK(same_floats(inv.t, inv_ref));
  CHECK(same_floats(inv_t.t, inv_t_ref));
  CHECK(same_bytes(out.t, out_ref, [&](int64_t i) { return x32.ptr<float>()[i]; }));
  CHECK(same_bytes(out_t.t, out_t_ref, [&](int64_t i) { return x32.ptr<float>()[(i % rows) * cols + i / rows]; }));
}

}  // namespace

TEST_CASE("GPU fp8: every bf16 value casts to the CPU reference's byte (scale 1, both formats)" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  Owned x = cpu({256, 256}, DType::BF16);
  for (int i = 0; i < 65536; ++i) static_cast<uint16_t*>(x->data)[i] = static_cast<uint16_t>(i);
  Owned x32 = to_host(x, DType::F32);
  for (Fp8Format f : kFormats) {
    Owned amax = cpu({1}, DType::F32);
    amax.ptr<float>()[0] = ops::fp8_max(f);  // scale = max / amax = 1 exactly
    check_scaling(x32, DType::BF16, false, false, f, &amax.t);
    check_scaling(x32, DType::BF16, false, true, f, &amax.t);
  }
}

TEST_CASE("GPU fp8: amax and quantize equal the CPU bit for bit (odd shapes, rows, transposes, NaN)" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t r, c;
  };
  // (48, 200) and (1040, 24): the 16-byte transposed kernel with partial tiles on both sides.
  for (Case k : {Case{1, 1}, Case{37, 53}, Case{300, 257}, Case{64, 2048}, Case{2051, 96}, Case{48, 200}, Case{1040, 24}}) {
    Owned x = randn({k.r, k.c}, DType::F32, "fp8.gpu.x", 2.0);
    for (int64_t i = 0; i < x->numel(); i += 7) set(x, i, get(x, i) * 1e-4);  // subnormal territory after the scale
    if (k.r > 3) {
      for (int64_t j = 0; j < k.c; ++j) set(x, 2 * k.c + j, 0.0);  // a zero row
      set(x, 3 * k.c + k.c / 2, NAN);                              // a NaN in row 3
    }
    for (DType dt : {DType::F32, DType::BF16})
      for (bool per_row : {false, true})
        for (bool transpose : {false, true})
          for (Fp8Format f : kFormats)
            for (int64_t offset : {0, 1}) check_scaling(x, dt, per_row, transpose, f, nullptr, offset);
  }
}

TEST_CASE("GPU fp8_quantize_pair: both layouts equal the CPU's two quantisations bit for bit" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t r, c;
  };
  // (64, 2048), (48, 200) and (1040, 24): one pass, partial tiles; the rest and offset 1: two.
  for (Case k : {Case{1, 1}, Case{37, 53}, Case{64, 2048}, Case{2051, 96}, Case{48, 200}, Case{1040, 24}}) {
    Owned x = randn({k.r, k.c}, DType::F32, "fp8.gpu.pair", 2.0);
    for (int64_t i = 0; i < x->numel(); i += 7) set(x, i, get(x, i) * 1e-4);
    if (k.r > 3) set(x, 3 * k.c + k.c / 2, NAN);
    for (DType dt : {DType::F32, DType::BF16})
      for (bool per_row : {false, true})
        for (Fp8Format f : kFormats)
          for (int64_t offset : {0, 1}) check_pair(x, dt, per_row, f, offset);
  }
}

TEST_CASE("GPU fp8_matmul matches the f64 product of the same bytes (formats, scale modes, bf16 / f32 += )" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t m, n, k;
  };
  for (Case s : {Case{33, 48, 32}, Case{256, 128, 4096}, Case{1000, 512, 1040}}) {
    for (Fp8Format fa : kFormats)
      for (Fp8Format fb : kFormats) {
        if (fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2) continue;
        for (bool per_row : {false, true}) {
          CAPTURE(s.m);
          CAPTURE(s.n);
          CAPTURE(s.k);
          CAPTURE(ops::fp8_format_name(fa));
          CAPTURE(ops::fp8_format_name(fb));
          CAPTURE(per_row);
          Owned xa = randn({s.m, s.k}, DType::F32, "fp8.mm.a"), xb = randn({s.n, s.k}, DType::F32, "fp8.mm.b");
          Owned a = cpu({s.m, s.k}, DType::U8), b = cpu({s.n, s.k}, DType::U8);
          Owned sa = cpu({per_row ? s.m : 1}, DType::F32), sb = cpu({per_row ? s.n : 1}, DType::F32);
          Owned ma = cpu({per_row ? s.m : 1}, DType::F32), mb = cpu({per_row ? s.n : 1}, DType::F32);
          ops::fp8_amax(xa, false, ma);
          ops::fp8_amax(xb, false, mb);
          ops::fp8_quantize(xa, false, ma, fa, a, sa);
          ops::fp8_quantize(xb, false, mb, fb, b, sb);
          Owned ref = cpu({s.m, s.n}, DType::F64);
          ops::fp8_matmul(a, fa, sa, b, fb, sb, ref, 0.f);
          DeviceTensor ga = to_gpu(a), gb = to_gpu(b), gsa = to_gpu(sa), gsb = to_gpu(sb);
          DeviceTensor c16 = gpu_poisoned({s.m, s.n}, DType::BF16);
          ops::fp8_matmul(ga.t, fa, gsa.t, gb.t, fb, gsb.t, c16.t, 0.f);
          CHECK_CLOSE(c16.t, ref, bf16_tol(ref));
          // f32 accumulation: c starts as the reference, so c = 2 ref afterwards.
          Owned ref32 = to_host(ref, DType::F32);
          DeviceTensor c32 = to_gpu(ref32);
          ops::fp8_matmul(ga.t, fa, gsa.t, gb.t, fb, gsb.t, c32.t, 1.f);
          for (int64_t i = 0; i < ref->numel(); ++i) set(ref, i, 2 * get(ref, i));
          CHECK_CLOSE(c32.t, ref, kF32Tol);
        }
      }
  }
}

TEST_CASE("GPU fp8_matmul refuses what the GPU product cannot take, naming it" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  DeviceTensor a = gpu_empty({16, 24}, DType::U8), b = gpu_empty({16, 24}, DType::U8);
  DeviceTensor s = gpu_empty({1}, DType::F32), c = gpu_empty({16, 16}, DType::BF16);
  CHECK(error_of([&] { ops::fp8_matmul(a.t, Fp8Format::E4M3, s.t, b.t, Fp8Format::E4M3, s.t, c.t, 0.f); })
            .find("K and N multiples of 16") != std::string::npos);
  DeviceTensor a2 = gpu_empty({16, 32}, DType::U8, 1), b2 = gpu_empty({16, 32}, DType::U8);
  CHECK(error_of([&] { ops::fp8_matmul(a2.t, Fp8Format::E4M3, s.t, b2.t, Fp8Format::E4M3, s.t, c.t, 0.f); })
            .find("16-byte aligned") != std::string::npos);
}
