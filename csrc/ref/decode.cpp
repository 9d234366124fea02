// One-token decode ops on the CPU, the formulas of ops/decode.h written out in the tensors'
// precision (f32 or f64; softmax, exp and log1p too). The attention runs heads in order and keys
// in order; the conv and the scan run channels in order: results are reproducible bit for bit.
// The shared checks ran (ops/decode.cpp); here: the float dtype and the scan state's dtype.
#include "ops/decode.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/common.h"

namespace engine::ref {
namespace {

using ops::ColumnBlock;

template <typename T> T& at(const ColumnBlock& b, int64_t j) { return static_cast<T*>(b.base.data)[b.col + j]; }
template <typename T> T sigmoid(T v) { return T(1) / (T(1) + std::exp(-v)); }
template <typename T> T silu(T v) { return v * sigmoid(v); }
template <typename T> T softplus(T v) { return v > T(0) ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v)); }

}  // namespace

void attention_decode(const ops::DecodeAttentionParams& p) {
  const char* op = "attention_decode";
  const int64_t H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim, L = p.cache.size(0);
  const int64_t first = p.window > 0 ? std::max<int64_t>(0, L - p.window) : 0;  // oldest visible key
  float_switch(p.qkv.dtype, op, "qkv", [&](auto tag) {
    using T = decltype(tag);
    const T* q = p.qkv.ptr<T>();
    const T* kv = p.cache.ptr<T>();
    T* out = p.out.ptr<T>();
    std::vector<T> s(static_cast<size_t>(L - first));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      const T* qh = q + h * D;
      T m = -INFINITY;
      for (int64_t j = first; j < L; ++j) {
        const T* k = kv + (j * 2 * Hkv + g) * D;
        T dot = T(0);
        for (int64_t i = 0; i < D; ++i) dot += qh[i] * k[i];
        s[static_cast<size_t>(j - first)] = dot * static_cast<T>(p.softmax_scale);
        m = std::max(m, s[static_cast<size_t>(j - first)]);
      }
      T sum = T(0);
      for (T& v : s) sum += (v = std::exp(v - m));
      T* oh = out + h * D;
      std::fill(oh, oh + D, T(0));
      for (int64_t j = first; j < L; ++j) {
        const T w = s[static_cast<size_t>(j - first)] / sum;
        const T* v = kv + (j * 2 * Hkv + Hkv + g) * D;
        for (int64_t i = 0; i < D; ++i) oh[i] += w * v[i];
      }
    }
  });
}

void causal_conv1d_step(const ColumnBlock& x, const Tensor& state, const Tensor& weight, const Tensor& bias,
                        bool use_silu, const ColumnBlock& y) {
  const char* op = "causal_conv1d_step";
  const int64_t di = weight.size(0), k = weight.size(1);
  float_switch(weight.dtype, op, "weight", [&](auto tag) {
    using T = decltype(tag);
    const T *w = weight.ptr<T>(), *b = bias.data ? bias.ptr<T>() : nullptr;
    T* st = k > 1 ? state.ptr<T>() : nullptr;
    for (int64_t d = 0; d < di; ++d) {
      const T u = at<T>(x, d);
      T acc = b ? b[d] : T(0);
      for (int64_t j = 0; j + 1 < k; ++j) acc += w[d * k + j] * st[j * di + d];
      acc += w[d * k + k - 1] * u;
      for (int64_t j = 0; j + 2 < k; ++j) st[j * di + d] = st[(j + 1) * di + d];
      if (k > 1) st[(k - 2) * di + d] = u;
      at<T>(y, d) = use_silu ? silu(acc) : acc;
    }
  });
}

void selective_scan_step(const ops::ScanArgs& a, const Tensor& state, const ColumnBlock& y) {
  const char* op = "selective_scan_step";
  expect_dtype(state, a.A_log.dtype, op, "state");
  const int64_t di = a.A_log.size(0), n_states = a.A_log.size(1);
  float_switch(a.A_log.dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T *alog = a.A_log.ptr<T>(), *dt = a.dt.ptr<T>(), *dd = a.D.ptr<T>(), *bias = a.dt_bias.ptr<T>();
    T* h = state.ptr<T>();
    for (int64_t d = 0; d < di; ++d) {
      const T delta = softplus(dt[d] + bias[d]);
      const T u = at<T>(a.x, d);
      T acc = T(0);
      for (int64_t n = 0; n < n_states; ++n) {
        T& hn = h[d * n_states + n];
        hn = std::exp(delta * -std::exp(alog[d * n_states + n])) * hn + delta * at<T>(a.B, n) * u;
        acc += at<T>(a.C, n) * hn;
      }
      at<T>(y, d) = (acc + dd[d] * u) * silu(at<T>(a.z, d));
    }
  });
}

}  // namespace engine::ref
