// Gated DeltaNet ops on the CPU, the formulas of ops/delta.h written out:
//   forward per (value head, document): the dk x dv state in a small matrix, token by token.
//   backward per key head (its value heads in order: dq and dk sum over them): a document's
//   states recomputed, then G = dL/dS[t] in reverse: G += q^ do^T, dq^ = S[t] do,
//   ddelta = G^T k^, dk^ += G delta - beta S' ddelta, dv = beta ddelta,
//   dbeta = ddelta . (v - S'^T k^), dS' = G - beta k^ ddelta^T, dg = sum S' dS',
//   G[t-1] = exp(g) dS'; then through the l2 norms, sigmoid(b) and -exp(A_log) softplus(a + dt_bias).
//   step (generation): the forward's token loop for one token from the cached state.
//   head_rmsnorm_gated: per (token, head), as ops/delta.h.
// Value heads (forward), key heads (backward) and rows (norm forward) run in parallel (OpenMP),
// each writing its own columns; every result is reproducible bit for bit. Every tensor has one
// dtype, f32 or f64. The shared checks ran (ops/delta.cpp); here: the float dtype, rstd and the
// parameter gradients in it, and cu_seqlens' values.
#include "ops/delta.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/common.h"
#include "ref/scan_common.h"

namespace engine::ref {
namespace {

using namespace scan;

constexpr double kL2Eps = 1e-6;  // the l2 norms' epsilon (HF's l2norm, FLA's)

struct DeltaShape {
  int64_t tokens, hk, dk, hv, dv;
  int64_t per_key() const { return hv / hk; }
};

DeltaShape delta_shape(const ops::DeltaArgs& a) {
  const int64_t hk = a.key_heads, hv = a.A_log.size(0);
  return {a.q.rows(), hk, a.q.width / hk, hv, a.v.width / hv};
}

// The unit vector of row t, key head i of a block (times scale), and its norm sqrt(|x|^2 + eps).
template <typename T>
T unit(const ColumnBlock& x, int64_t t, int64_t i, int64_t d, T scale, T* out) {
  T ss = T(0);
  for (int64_t j = 0; j < d; ++j) ss += at<T>(x, t, i * d + j) * at<T>(x, t, i * d + j);
  const T n = std::sqrt(ss + static_cast<T>(kL2Eps));
  for (int64_t j = 0; j < d; ++j) out[j] = at<T>(x, t, i * d + j) / n * scale;
  return n;
}

// dx of x^ = scale x / n from dx^ (accumulated into the block's row).
template <typename T>
void unit_backward(const ColumnBlock& x, const ColumnBlock& dx, int64_t t, int64_t i, int64_t d, T scale, T n,
                   const T* dunit) {
  T dot = T(0);
  for (int64_t j = 0; j < d; ++j) dot += at<T>(x, t, i * d + j) * dunit[j];
  for (int64_t j = 0; j < d; ++j)
    at<T>(dx, t, i * d + j) += scale * (dunit[j] / n - at<T>(x, t, i * d + j) * dot / (n * n * n));
}

// beta, g of token t, value head h.
template <typename T>
void gates(const ops::DeltaArgs& a, int64_t t, int64_t h, T* beta, T* g) {
  const T A = std::exp(a.A_log.ptr<T>()[h]);
  *beta = sigmoid(at<T>(a.b, t, h));
  *g = -A * softplus(at<T>(a.a, t, h) + a.dt_bias.ptr<T>()[h]);
}

// One token's step: S = exp(g) S; u = S^T k^; delta = beta (v - u); S += k^ delta^T. Leaves S' in
// `decayed` when given.
template <typename T>
void step(const ops::DeltaArgs& a, const DeltaShape& s, int64_t t, int64_t h, const T* kh, T beta, T g, T* S,
          T* decayed) {
  const T e = std::exp(g);
  for (int64_t i = 0; i < s.dk * s.dv; ++i) S[i] *= e;
  if (decayed) std::copy(S, S + s.dk * s.dv, decayed);
  for (int64_t j = 0; j < s.dv; ++j) {
    T u = T(0);
    for (int64_t i = 0; i < s.dk; ++i) u += S[i * s.dv + j] * kh[i];
    const T delta = beta * (at<T>(a.v, t, h * s.dv + j) - u);
    for (int64_t i = 0; i < s.dk; ++i) S[i * s.dv + j] += kh[i] * delta;
  }
}

}  // namespace

void gated_delta_forward(const ops::DeltaArgs& a, const ColumnBlock& o) {
  const char* op = "gated_delta_forward";
  const DeltaShape s = delta_shape(a);
  const auto docs = documents(a.cu_seqlens, s.tokens, op);
  float_switch(a.A_log.dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T scale = T(1) / std::sqrt(static_cast<T>(s.dk));
#pragma omp parallel for schedule(static) if (s.tokens * s.hv * s.dk * s.dv > (1 << 14))
    for (int64_t h = 0; h < s.hv; ++h) {
      const int64_t kh = h / s.per_key();
      std::vector<T> S(static_cast<size_t>(s.dk * s.dv)), qh(static_cast<size_t>(s.dk)), kn(static_cast<size_t>(s.dk));
      for (const auto& [begin, end] : docs) {
        std::fill(S.begin(), S.end(), T(0));
        for (int64_t t = begin; t < end; ++t) {
          T beta, g;
          gates<T>(a, t, h, &beta, &g);
          unit<T>(a.q, t, kh, s.dk, scale, qh.data());
          unit<T>(a.k, t, kh, s.dk, T(1), kn.data());
          step<T>(a, s, t, h, kn.data(), beta, g, S.data(), nullptr);
          for (int64_t j = 0; j < s.dv; ++j) {
            T acc = T(0);
            for (int64_t i = 0; i < s.dk; ++i) acc += S[static_cast<size_t>(i * s.dv + j)] * qh[static_cast<size_t>(i)];
            at<T>(o, t, h * s.dv + j) = acc;
          }
        }
      }
    }
  });
}

void gated_delta_step(const ops::DeltaArgs& a, const Tensor& state, const ColumnBlock& o) {
  const char* op = "gated_delta_step";
  expect_dtype(state, a.A_log.dtype, op, "state");
  const DeltaShape s = delta_shape(a);
  float_switch(a.A_log.dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T scale = T(1) / std::sqrt(static_cast<T>(s.dk));
    std::vector<T> qh(static_cast<size_t>(s.dk)), kn(static_cast<size_t>(s.dk));
    for (int64_t h = 0; h < s.hv; ++h) {
      const int64_t kh = h / s.per_key();
      T* S = state.ptr<T>() + h * s.dk * s.dv;
      T beta, g;
      gates<T>(a, 0, h, &beta, &g);
      unit<T>(a.q, 0, kh, s.dk, scale, qh.data());
      unit<T>(a.k, 0, kh, s.dk, T(1), kn.data());
      step<T>(a, s, 0, h, kn.data(), beta, g, S, nullptr);
      for (int64_t j = 0; j < s.dv; ++j) {
        T acc = T(0);
        for (int64_t i = 0; i < s.dk; ++i) acc += S[i * s.dv + j] * qh[static_cast<size_t>(i)];
        at<T>(o, 0, h * s.dv + j) = acc;
      }
    }
  });
}

void gated_delta_backward(const ops::DeltaArgs& a, const ColumnBlock& do_, const ops::DeltaGrads& g) {
  const char* op = "gated_delta_backward";
  const DeltaShape s = delta_shape(a);
  const DType dtype = a.A_log.dtype;
  expect_dtype(g.dA_log, dtype, op, "dA_log");
  expect_dtype(g.ddt_bias, dtype, op, "ddt_bias");
  const auto docs = documents(a.cu_seqlens, s.tokens, op);
  float_switch(dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T scale = T(1) / std::sqrt(static_cast<T>(s.dk));
    const int64_t kv = s.dk * s.dv;
#pragma omp parallel for schedule(static) if (s.tokens * s.hv * kv > (1 << 14))
    for (int64_t kh = 0; kh < s.hk; ++kh) {
      for (int64_t t = 0; t < s.tokens; ++t)
        for (int64_t i = 0; i < s.dk; ++i) at<T>(g.dq, t, kh * s.dk + i) = at<T>(g.dk, t, kh * s.dk + i) = T(0);
      std::vector<T> states, decayed(static_cast<size_t>(kv)), G(static_cast<size_t>(kv)), dS(static_cast<size_t>(kv));
      std::vector<T> qh(static_cast<size_t>(s.dk)), kn(static_cast<size_t>(s.dk)), dqh(static_cast<size_t>(s.dk)),
          dkh(static_cast<size_t>(s.dk)), ddelta(static_cast<size_t>(s.dv));
      for (int64_t h = kh * s.per_key(); h < (kh + 1) * s.per_key(); ++h) {
        const T A = std::exp(a.A_log.ptr<T>()[h]);
        T dalog = T(0), dbias = T(0);
        for (const auto& [begin, end] : docs) {
          // The states after each token of the document: states[(t - begin) * kv ..].
          states.assign(static_cast<size_t>((end - begin) * kv), T(0));
          for (int64_t t = begin; t < end; ++t) {
            T beta, gt;
            gates<T>(a, t, h, &beta, &gt);
            unit<T>(a.k, t, kh, s.dk, T(1), kn.data());
            T* cur = &states[static_cast<size_t>((t - begin) * kv)];
            if (t > begin) std::copy(cur - kv, cur, cur);
            step<T>(a, s, t, h, kn.data(), beta, gt, cur, nullptr);
          }
          std::fill(G.begin(), G.end(), T(0));
          for (int64_t t = end - 1; t >= begin; --t) {
            T beta, gt;
            gates<T>(a, t, h, &beta, &gt);
            const T nq = unit<T>(a.q, t, kh, s.dk, scale, qh.data());
            const T nk = unit<T>(a.k, t, kh, s.dk, T(1), kn.data());
            const T* cur = &states[static_cast<size_t>((t - begin) * kv)];
            const T e = std::exp(gt);
            for (int64_t i = 0; i < kv; ++i) decayed[static_cast<size_t>(i)] = t > begin ? e * cur[i - kv] : T(0);
            // o = S^T q^: G += q^ do^T, dq^ = S do.
            for (int64_t i = 0; i < s.dk; ++i) {
              T acc = T(0);
              for (int64_t j = 0; j < s.dv; ++j) {
                const T gd = at<T>(do_, t, h * s.dv + j);
                G[static_cast<size_t>(i * s.dv + j)] += qh[static_cast<size_t>(i)] * gd;
                acc += cur[i * s.dv + j] * gd;
              }
              dqh[static_cast<size_t>(i)] = acc;
            }
            // S = S' + k^ delta^T, delta = beta (v - S'^T k^).
            T dbeta = T(0);
            std::fill(dkh.begin(), dkh.end(), T(0));
            for (int64_t j = 0; j < s.dv; ++j) {
              T dd = T(0), u = T(0);
              for (int64_t i = 0; i < s.dk; ++i) {
                dd += G[static_cast<size_t>(i * s.dv + j)] * kn[static_cast<size_t>(i)];
                u += decayed[static_cast<size_t>(i * s.dv + j)] * kn[static_cast<size_t>(i)];
              }
              const T vj = at<T>(a.v, t, h * s.dv + j), delta = beta * (vj - u);
              ddelta[static_cast<size_t>(j)] = dd;
              at<T>(g.dv, t, h * s.dv + j) = beta * dd;
              dbeta += dd * (vj - u);
              for (int64_t i = 0; i < s.dk; ++i)
                dkh[static_cast<size_t>(i)] += G[static_cast<size_t>(i * s.dv + j)] * delta -
                                               beta * decayed[static_cast<size_t>(i * s.dv + j)] * dd;
            }
            T dg = T(0);
            for (int64_t i = 0; i < s.dk; ++i)
              for (int64_t j = 0; j < s.dv; ++j) {
                const size_t x = static_cast<size_t>(i * s.dv + j);
                dS[x] = G[x] - beta * kn[static_cast<size_t>(i)] * ddelta[static_cast<size_t>(j)];
                dg += decayed[x] * dS[x];
                G[x] = e * dS[x];  // into token t - 1
              }
            unit_backward<T>(a.q, g.dq, t, kh, s.dk, scale, nq, dqh.data());
            unit_backward<T>(a.k, g.dk, t, kh, s.dk, T(1), nk, dkh.data());
            at<T>(g.db, t, h) = dbeta * beta * (T(1) - beta);
            const T pre = at<T>(a.a, t, h) + a.dt_bias.ptr<T>()[h];
            const T da = dg * -A * sigmoid(pre);
            at<T>(g.da, t, h) = da;
            dbias += da;
            dalog += dg * gt;  // d g / d A_log = g
          }
        }
        g.dA_log.ptr<T>()[h] += dalog;
        g.ddt_bias.ptr<T>()[h] += dbias;
      }
    }
  });
}

void head_rmsnorm_gated_forward(const ColumnBlock& y, const ColumnBlock& z, const Tensor& weight, float eps,
                                const ColumnBlock& out, const Tensor& rstd) {
  const char* op = "head_rmsnorm_gated_forward";
  const DType dtype = y.base.dtype;
  expect_dtype(rstd, dtype, op, "rstd");
  const int64_t d = weight.size(0), heads = y.width / d;
  float_switch(dtype, op, "y", [&](auto tag) {
    using T = decltype(tag);
    const T* w = weight.ptr<T>();
    T* r = rstd.ptr<T>();
#pragma omp parallel for schedule(static) if (y.rows() * y.width > (1 << 14))
    for (int64_t t = 0; t < y.rows(); ++t)
      for (int64_t h = 0; h < heads; ++h) {
        T ss = T(0);
        for (int64_t i = 0; i < d; ++i) ss += at<T>(y, t, h * d + i) * at<T>(y, t, h * d + i);
        const T rs = T(1) / std::sqrt(ss / static_cast<T>(d) + static_cast<T>(eps));
        r[t * heads + h] = rs;
        for (int64_t i = 0; i < d; ++i)
          at<T>(out, t, h * d + i) = w[i] * (at<T>(y, t, h * d + i) * rs) * silu(at<T>(z, t, h * d + i));
      }
  });
}

void head_rmsnorm_gated_backward(const ColumnBlock& dout, const ColumnBlock& y, const ColumnBlock& z,
                                 const Tensor& weight, const Tensor& rstd, const ColumnBlock& dy,
                                 const ColumnBlock& dz, const Tensor& dweight) {
  const char* op = "head_rmsnorm_gated_backward";
  const DType dtype = y.base.dtype;
  expect_dtype(rstd, dtype, op, "rstd");
  expect_dtype(dweight, dtype, op, "dweight");
  const int64_t d = weight.size(0), heads = y.width / d;
  float_switch(dtype, op, "y", [&](auto tag) {
    using T = decltype(tag);
    const T *w = weight.ptr<T>(), *r = rstd.ptr<T>();
    T* dw = dweight.ptr<T>();
    for (int64_t t = 0; t < y.rows(); ++t)  // in order: dweight sums over rows and heads
      for (int64_t h = 0; h < heads; ++h) {
        const T rs = r[t * heads + h];
        T dot = T(0);
        for (int64_t i = 0; i < d; ++i)
          dot += w[i] * silu(at<T>(z, t, h * d + i)) * at<T>(dout, t, h * d + i) * at<T>(y, t, h * d + i);
        for (int64_t i = 0; i < d; ++i) {
          const int64_t c = h * d + i;
          const T yi = at<T>(y, t, c), zi = at<T>(z, t, c), go = at<T>(dout, t, c);
          const T u = w[i] * silu(zi) * go;
          at<T>(dy, t, c) = rs * u - yi * rs * rs * rs * dot / static_cast<T>(d);
          at<T>(dz, t, c) = go * w[i] * yi * rs * dsilu(zi);
          dw[i] += go * yi * rs * silu(zi);
        }
      }
  });
}

}  // namespace engine::ref
