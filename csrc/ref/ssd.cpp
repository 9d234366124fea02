// Mamba-2 mixer ops on the CPU, the formulas of ops/ssd.h written out:
//   scan:  forward per (document, head), the head's P x N state in a small matrix; backward per
//          group (the group's heads in order: dB and dC sum over them) recomputes a document's
//          states, then runs G = dL/dS in reverse: G[t] = dy[t] C[t]^T + a[t+1] G[t+1] with
//          a = exp(delta A), dC[t] += S[t]^T dy[t], dB[t] += delta G[t]^T x[t],
//          dx[t] = delta G[t] B[t] + D dy[t], ddelta = sum G (x B^T + A a S[t-1]),
//          dA += sum_t a delta sum G S[t-1], ddt = ddelta sigmoid(dt + dt_bias) where the clamp
//          passes it, dA_log += dA A, dD += sum_t dy . x.
//   step (generation): the forward's token loop for one token from the cached state.
//   gated_rmsnorm: v = y silu(z) row by row, as ops/ssd.h.
// Heads (forward), groups (backward) and rows (norm) run in parallel (OpenMP), each writing its
// own columns; every result is reproducible bit for bit. Every tensor has one dtype, f32 or f64.
// The shared checks ran (ops/mamba.cpp); here: the float dtype, chunk_states, the row statistics
// and the parameter gradients in the tensors' dtype, and cu_seqlens' values.
#include "ops/ssd.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/common.h"
#include "ref/scan_common.h"

namespace engine::ref {
namespace {

using namespace scan;

struct SsdShape {
  int64_t tokens, heads, p, groups, n, chunks;
  int64_t heads_per_group() const { return heads / groups; }
};

SsdShape ssd_shape(const char* op, const ops::SsdArgs& a, const Tensor& chunk_states) {
  expect_dtype(chunk_states, a.A_log.dtype, op, "chunk_states");
  const int64_t t = a.x.rows();
  return {t, a.A_log.size(0), a.head_dim, a.groups, a.B.width / a.groups, ops::scan_num_chunks(t, a.chunk_len)};
}

// delta = clamp(softplus(pre)) and whether the clamp passes the gradient.
template <typename T>
std::pair<T, bool> clamped_delta(T pre, const ops::SsdArgs& a) {
  const T sp = softplus(pre), lo = static_cast<T>(a.dt_min), hi = static_cast<T>(a.dt_max);
  if (sp < lo) return {lo, false};
  if (a.dt_max > 0 && sp > hi) return {hi, false};
  return {sp, true};
}

}  // namespace

void ssd_scan_forward(const ops::SsdArgs& a, const ColumnBlock& y, const Tensor& chunk_states) {
  const char* op = "ssd_scan_forward";
  const SsdShape s = ssd_shape(op, a, chunk_states);
  const auto docs = documents(a.cu_seqlens, s.tokens, op);
  float_switch(a.A_log.dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T *alog = a.A_log.ptr<T>(), *dd = a.D.ptr<T>(), *bias = a.dt_bias.ptr<T>();
    T* states = chunk_states.ptr<T>();
    const int64_t pn = s.p * s.n, len = a.chunk_len;
    std::fill(states, states + s.heads * pn, T(0));  // chunk 0 starts from nothing
#pragma omp parallel for schedule(static) if (s.tokens * s.heads * pn > (1 << 14))
    for (int64_t h = 0; h < s.heads; ++h) {
      const T A = -std::exp(alog[h]);
      const int64_t g = h / s.heads_per_group();
      std::vector<T> S(static_cast<size_t>(pn));
      for (const auto& [begin, end] : docs) {
        std::fill(S.begin(), S.end(), T(0));
        for (int64_t t = begin; t < end; ++t) {
          const T delta = clamped_delta<T>(at<T>(a.dt, t, h) + bias[h], a).first;
          const T decay = std::exp(delta * A);
          for (int64_t p = 0; p < s.p; ++p) {
            const T u = at<T>(a.x, t, h * s.p + p);
            T acc = T(0);
            for (int64_t n = 0; n < s.n; ++n) {
              T& v = S[static_cast<size_t>(p * s.n + n)];
              v = decay * v + delta * u * at<T>(a.B, t, g * s.n + n);
              acc += v * at<T>(a.C, t, g * s.n + n);
            }
            at<T>(y, t, h * s.p + p) = acc + dd[h] * u;
          }
          if ((t + 1) % len == 0 && t + 1 < s.tokens)
            std::copy(S.begin(), S.end(), states + ((t + 1) / len * s.heads + h) * pn);
        }
      }
    }
  });
}

void ssd_scan_backward(const ops::SsdArgs& a, const ColumnBlock& dy, const Tensor& chunk_states,
                       const ops::SsdGrads& g) {
  const char* op = "ssd_scan_backward";
  const SsdShape s = ssd_shape(op, a, chunk_states);
  const DType dtype = a.A_log.dtype;
  expect_dtype(g.dA_log, dtype, op, "dA_log");
  expect_dtype(g.dD, dtype, op, "dD");
  expect_dtype(g.ddt_bias, dtype, op, "ddt_bias");
  const auto docs = documents(a.cu_seqlens, s.tokens, op);
  float_switch(dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T *alog = a.A_log.ptr<T>(), *dd = a.D.ptr<T>(), *bias = a.dt_bias.ptr<T>();
    T *dalog = g.dA_log.ptr<T>(), *dD = g.dD.ptr<T>(), *dbias = g.ddt_bias.ptr<T>();
    const int64_t pn = s.p * s.n;
#pragma omp parallel for schedule(static) if (s.tokens * s.heads * pn > (1 << 14))
    for (int64_t grp = 0; grp < s.groups; ++grp) {
      for (int64_t t = 0; t < s.tokens; ++t)
        for (int64_t n = 0; n < s.n; ++n) at<T>(g.dB, t, grp * s.n + n) = at<T>(g.dC, t, grp * s.n + n) = T(0);
      std::vector<T> S, G(static_cast<size_t>(pn));
      for (int64_t h = grp * s.heads_per_group(); h < (grp + 1) * s.heads_per_group(); ++h) {
        const T A = -std::exp(alog[h]);
        T dA = T(0), dDh = T(0), db = T(0);
        for (const auto& [begin, end] : docs) {
          // The head's states over the document: S[(t - begin) * P N + p N + n].
          S.assign(static_cast<size_t>((end - begin) * pn), T(0));
          for (int64_t t = begin; t < end; ++t) {
            const T delta = clamped_delta<T>(at<T>(a.dt, t, h) + bias[h], a).first;
            const T decay = std::exp(delta * A);
            T* cur = &S[static_cast<size_t>((t - begin) * pn)];
            const T* prev = t > begin ? cur - pn : nullptr;
            for (int64_t p = 0; p < s.p; ++p)
              for (int64_t n = 0; n < s.n; ++n)
                cur[p * s.n + n] = (prev ? decay * prev[p * s.n + n] : T(0)) +
                                   delta * at<T>(a.x, t, h * s.p + p) * at<T>(a.B, t, grp * s.n + n);
          }
          std::fill(G.begin(), G.end(), T(0));  // a[t+1] G[t+1]: what flows into t from t + 1
          for (int64_t t = end - 1; t >= begin; --t) {
            const T pre = at<T>(a.dt, t, h) + bias[h];
            const auto [delta, passes] = clamped_delta<T>(pre, a);
            const T decay = std::exp(delta * A);
            const T* cur = &S[static_cast<size_t>((t - begin) * pn)];
            const T* prev = t > begin ? cur - pn : nullptr;
            T ddelta = T(0);
            for (int64_t p = 0; p < s.p; ++p) {
              const T u = at<T>(a.x, t, h * s.p + p), gy = at<T>(dy, t, h * s.p + p);
              dDh += gy * u;
              T du = dd[h] * gy;
              for (int64_t n = 0; n < s.n; ++n) {
                const int64_t col = grp * s.n + n;
                const size_t i = static_cast<size_t>(p * s.n + n);
                const T bn = at<T>(a.B, t, col);
                const T gt = gy * at<T>(a.C, t, col) + G[i];
                const T before = prev ? prev[i] : T(0);
                at<T>(g.dC, t, col) += gy * cur[i];
                at<T>(g.dB, t, col) += delta * gt * u;
                du += delta * gt * bn;
                ddelta += gt * (u * bn + A * decay * before);
                dA += gt * decay * before * delta;
                G[i] = decay * gt;
              }
              at<T>(g.dx, t, h * s.p + p) = du;
            }
            const T gdt = passes ? ddelta * sigmoid(pre) : T(0);
            at<T>(g.ddt, t, h) = gdt;
            db += gdt;
          }
        }
        dalog[h] += dA * A;
        dD[h] += dDh;
        dbias[h] += db;
      }
    }
  });
}

void ssd_scan_step(const ops::SsdArgs& a, const Tensor& state, const ColumnBlock& y) {
  const char* op = "ssd_scan_step";
  expect_dtype(state, a.A_log.dtype, op, "state");
  const int64_t heads = a.A_log.size(0), p = a.head_dim, g_heads = heads / a.groups, n = a.B.width / a.groups;
  float_switch(a.A_log.dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T *alog = a.A_log.ptr<T>(), *dd = a.D.ptr<T>(), *bias = a.dt_bias.ptr<T>();
    T* S = state.ptr<T>();
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / g_heads;
      const T delta = clamped_delta<T>(at<T>(a.dt, 0, h) + bias[h], a).first;
      const T decay = std::exp(delta * -std::exp(alog[h]));
      for (int64_t i = 0; i < p; ++i) {
        const T u = at<T>(a.x, 0, h * p + i);
        T acc = T(0);
        for (int64_t j = 0; j < n; ++j) {
          T& v = S[(h * p + i) * n + j];
          v = decay * v + delta * u * at<T>(a.B, 0, g * n + j);
          acc += v * at<T>(a.C, 0, g * n + j);
        }
        at<T>(y, 0, h * p + i) = acc + dd[h] * u;
      }
    }
  });
}

void gated_rmsnorm_sumsq(const ColumnBlock& y, const ColumnBlock& z, const Tensor& sumsq) {
  const char* op = "gated_rmsnorm_sumsq";
  const DType dtype = y.base.dtype;
  expect_dtype(sumsq, dtype, op, "sumsq");
  float_switch(dtype, op, "y", [&](auto tag) {
    using T = decltype(tag);
    T* out = sumsq.ptr<T>();
#pragma omp parallel for schedule(static) if (y.rows() * y.width > (1 << 14))
    for (int64_t t = 0; t < y.rows(); ++t) {
      T acc = T(0);
      for (int64_t i = 0; i < y.width; ++i) {
        const T v = at<T>(y, t, i) * silu(at<T>(z, t, i));
        acc += v * v;
      }
      out[t] = acc;
    }
  });
}

void gated_rmsnorm_forward(const ColumnBlock& y, const ColumnBlock& z, const Tensor& weight,
                           const Tensor& sumsq, int64_t total_width, float eps, const ColumnBlock& out) {
  const char* op = "gated_rmsnorm_forward";
  const DType dtype = y.base.dtype;
  expect_dtype(sumsq, dtype, op, "sumsq");
  float_switch(dtype, op, "y", [&](auto tag) {
    using T = decltype(tag);
    const T *w = weight.ptr<T>(), *ss = sumsq.ptr<T>();
#pragma omp parallel for schedule(static) if (y.rows() * y.width > (1 << 14))
    for (int64_t t = 0; t < y.rows(); ++t) {
      const T r = T(1) / std::sqrt(ss[t] / static_cast<T>(total_width) + static_cast<T>(eps));
      for (int64_t i = 0; i < y.width; ++i) at<T>(out, t, i) = w[i] * (at<T>(y, t, i) * silu(at<T>(z, t, i)) * r);
    }
  });
}

void gated_rmsnorm_dot(const ColumnBlock& dout, const ColumnBlock& y, const ColumnBlock& z, const Tensor& weight,
                       const Tensor& dot) {
  const char* op = "gated_rmsnorm_dot";
  const DType dtype = y.base.dtype;
  expect_dtype(dot, dtype, op, "dot");
  float_switch(dtype, op, "y", [&](auto tag) {
    using T = decltype(tag);
    const T* w = weight.ptr<T>();
    T* out = dot.ptr<T>();
#pragma omp parallel for schedule(static) if (y.rows() * y.width > (1 << 14))
    for (int64_t t = 0; t < y.rows(); ++t) {
      T acc = T(0);
      for (int64_t i = 0; i < y.width; ++i) acc += at<T>(dout, t, i) * w[i] * at<T>(y, t, i) * silu(at<T>(z, t, i));
      out[t] = acc;
    }
  });
}

void gated_rmsnorm_backward(const ColumnBlock& dout, const ColumnBlock& y, const ColumnBlock& z,
                            const Tensor& weight, const Tensor& sumsq, const Tensor& dot, int64_t total_width,
                            float eps, const ColumnBlock& dy, const ColumnBlock& dz, const Tensor& dweight) {
  const char* op = "gated_rmsnorm_backward";
  const DType dtype = y.base.dtype;
  expect_dtype(sumsq, dtype, op, "sumsq");
  expect_dtype(dot, dtype, op, "dot");
  expect_dtype(dweight, dtype, op, "dweight");
  float_switch(dtype, op, "y", [&](auto tag) {
    using T = decltype(tag);
    const T *w = weight.ptr<T>(), *ss = sumsq.ptr<T>(), *dp = dot.ptr<T>();
    T* dw = dweight.ptr<T>();
    const T width = static_cast<T>(total_width);
    // Rows in order: dweight sums over them.
    for (int64_t t = 0; t < y.rows(); ++t) {
      const T r = T(1) / std::sqrt(ss[t] / width + static_cast<T>(eps));
      const T k = r * r * r * dp[t] / width;
      for (int64_t i = 0; i < y.width; ++i) {
        const T yi = at<T>(y, t, i), zi = at<T>(z, t, i), go = at<T>(dout, t, i);
        const T v = yi * silu(zi);
        const T dv = r * w[i] * go - v * k;
        dw[i] += r * go * v;
        at<T>(dy, t, i) = dv * silu(zi);
        at<T>(dz, t, i) = dv * yi * dsilu(zi);
      }
    }
  });
}

}  // namespace engine::ref
