// FP8 numerics on the CPU (ops/fp8.h): the definition the GPU kernels are checked against bit
// for bit (amax, scales, encodings) and within their f32 accumulation (the product).
// amax compares magnitudes as f32 bit patterns (their order is the values' order, NaN above
// infinity), so a NaN makes its row's amax NaN, as on the GPU. Rows run in parallel; every
// result is independent of the thread count.
// The shared checks ran before (ops/fp8.cpp); x f32 or f64, c f32 or f64.
#include "ops/fp8.h"

#include <algorithm>
#include <vector>

#include "ref/common.h"

namespace engine::ref {
namespace {

uint32_t magnitude_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u & 0x7fffffffu;
}
float from_bits(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// op(x)(r, j) as f32.
template <typename T>
float element(const T* x, int64_t cols, bool transpose, int64_t r, int64_t j) {
  return static_cast<float>(transpose ? x[j * cols + r] : x[r * cols + j]);
}

}  // namespace

void fp8_amax(const Tensor& x, bool transpose, const Tensor& amax) {
  const int64_t xr = x.size(0), xc = x.size(1);
  const int64_t rows = transpose ? xc : xr, cols = transpose ? xr : xc;
  float_switch(x.dtype, "fp8_amax", "x", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.ptr<T>();
    std::vector<uint32_t> row_max(static_cast<size_t>(rows), 0);
#pragma omp parallel for schedule(static) if (x.numel() > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
      uint32_t m = 0;
      for (int64_t j = 0; j < cols; ++j) m = std::max(m, magnitude_bits(element(px, xc, transpose, r, j)));
      row_max[static_cast<size_t>(r)] = m;
    }
    float* out = amax.ptr<float>();
    if (amax.size(0) == rows) {
      for (int64_t r = 0; r < rows; ++r) out[r] = from_bits(row_max[static_cast<size_t>(r)]);
    } else {
      out[0] = from_bits(rows ? *std::max_element(row_max.begin(), row_max.end()) : 0u);
    }
  });
}

void fp8_quantize(const Tensor& x, bool transpose, const Tensor& amax, ops::Fp8Format format,
                  const Tensor& out, const Tensor& scale_inv) {
  const int64_t xc = x.size(1), rows = out.size(0), cols = out.size(1);
  const bool per_row = amax.size(0) == rows && rows != 1;
  const float* pa = amax.ptr<float>();
  float* ps = scale_inv.ptr<float>();
  for (int64_t i = 0; i < amax.size(0); ++i) ps[i] = 1.f / ops::fp8_scale(pa[i], format);
  float_switch(x.dtype, "fp8_quantize", "x", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.ptr<T>();
    uint8_t* po = out.ptr<uint8_t>();
#pragma omp parallel for schedule(static) if (x.numel() > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
      const float scale = ops::fp8_scale(pa[per_row ? r : 0], format);
      for (int64_t j = 0; j < cols; ++j)
        po[r * cols + j] = ops::fp8_encode(element(px, xc, transpose, r, j) * scale, format);
    }
  });
}

void fp8_quantize_pair(const Tensor& x, const Tensor& amax, const Tensor& amax_t, ops::Fp8Format format,
                       const Tensor& out, const Tensor& scale_inv, const Tensor& out_t, const Tensor& scale_inv_t) {
  ref::fp8_quantize(x, false, amax, format, out, scale_inv);
  ref::fp8_quantize(x, true, amax_t, format, out_t, scale_inv_t);
}

void fp8_matmul(const Tensor& a, ops::Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                ops::Fp8Format b_format, const Tensor& b_scale_inv, const Tensor& c, const ops::Fp8MatmulOptions& o) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  // The decoded bytes, once: a 256-entry table per format.
  float table_a[256], table_b[256];
  for (int v = 0; v < 256; ++v) {
    table_a[v] = ops::fp8_decode(static_cast<uint8_t>(v), a_format);
    table_b[v] = ops::fp8_decode(static_cast<uint8_t>(v), b_format);
  }
  const uint8_t* pa = a.ptr<uint8_t>();
  const uint8_t* pb = b.ptr<uint8_t>();
  const float* sa = a_scale_inv.ptr<float>();
  const float* sb = b_scale_inv.ptr<float>();
  const bool row_a = a_scale_inv.size(0) == m && m != 1, row_b = b_scale_inv.size(0) == n && n != 1;
  float_switch(c.dtype, "fp8_matmul", "c", [&](auto tag) {
    using T = decltype(tag);
    T* pc = c.ptr<T>();
    const T* pd = o.addend.data ? o.addend.ptr<T>() : pc;
    const T* bias = o.bias.data ? o.bias.ptr<T>() : nullptr;
#pragma omp parallel for schedule(static) if (m * n * k > (1 << 18))
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q)
          s += static_cast<double>(table_a[pa[i * k + q]]) * table_b[pb[j * k + q]];
        s *= static_cast<double>(sa[row_a ? i : 0]) * sb[row_b ? j : 0];
        if (o.beta != 0.f) s += static_cast<double>(pd[i * n + j]);
        if (bias) s += static_cast<double>(bias[j]);
        pc[i * n + j] = static_cast<T>(s);
      }
    }
  });
}

}  // namespace engine::ref
