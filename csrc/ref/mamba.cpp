// Mamba mixer ops on the CPU, the formulas of ops/mamba.h written out:
//   conv:  pre[t] = bias + sum_k w[k] x[t - (K-1) + k] (taps before the document are 0),
//          y = silu(pre) or pre;
//          dpre = dy * silu'(pre), dx[s] = sum_k w[k] dpre[s + (K-1) - k] (taps past the document's
//          end are 0), dw[k] += sum_t dpre[t] x[t - (K-1) + k], dbias += sum_t dpre[t]
//   scan:  forward per (document, channel), the states of one channel in a small vector;
//          backward recomputes a document's states h[t, n] (len x N per channel), then runs
//          g = dL/dh in reverse: g[t] = gy[t] + a[t+1] g[t+1] with gy = dy silu(z) C,
//          dB[t, n] += g delta x, dC[t, n] += dy silu(z) h, dx += delta sum_n g B + D dy silu(z),
//          ddelta = sum_n g (B x + A a h[t-1]), dA[d, n] += sum_t g a h[t-1] delta,
//          ddt = ddelta sigmoid(dt + dt_bias), dA_log += dA A.
// The conv backward runs channels in parallel (each writes its own columns and parameter rows);
// the scan backward runs them in order (dB and dC are sums over channels).
// The forwards run channels in parallel too (OpenMP); every result is reproducible bit for bit.
// Every tensor has one dtype, f32 or f64, in that precision (exp, log1p too); the scan backward
// ignores chunk_states (checked for shape and dtype only). The shared checks ran (ops/mamba.cpp);
// here: the float dtype (float_switch), chunk_states and the parameter gradients in the tensors'
// dtype, and cu_seqlens' values.
#include "ops/mamba.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/common.h"
#include "ref/scan_common.h"

namespace engine::ref {
namespace {

using namespace scan;

struct ConvShape {
  int64_t tokens, channels, k;
};

// The shapes (checked before, ops/mamba.cpp).
ConvShape conv_shape(const ColumnBlock& x, const Tensor& weight) {
  return {x.rows(), weight.size(0), weight.size(1)};
}

template <typename T>
T conv_pre(const ColumnBlock& x, const T* w, const T* bias, int64_t begin, int64_t t, int64_t d,
           int64_t k) {
  T acc = bias ? bias[d] : T(0);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t src = t - (k - 1) + j;
    if (src >= begin) acc += w[d * k + j] * at<T>(x, src, d);
  }
  return acc;
}

}  // namespace

void causal_conv1d_forward(const ColumnBlock& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& cu_seqlens, bool silu_out, const ColumnBlock& y) {
  const char* op = "causal_conv1d_forward";
  const DType dtype = x.base.dtype;
  const ConvShape s = conv_shape(x, weight);
  const auto docs = documents(cu_seqlens, s.tokens, op);
  float_switch(dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    const T* w = weight.ptr<T>();
    const T* b = bias.data ? bias.ptr<T>() : nullptr;
    for (const auto& [begin, end] : docs) {
#pragma omp parallel for schedule(static) if ((end - begin) * s.channels > (1 << 14))
      for (int64_t t = begin; t < end; ++t)
        for (int64_t d = 0; d < s.channels; ++d) {
          const T pre = conv_pre<T>(x, w, b, begin, t, d, s.k);
          at<T>(y, t, d) = silu_out ? silu(pre) : pre;
        }
    }
  });
}

void causal_conv1d_backward(const ColumnBlock& dy, const ColumnBlock& x, const Tensor& weight,
                            const Tensor& bias, const Tensor& cu_seqlens, bool silu_out,
                            const ColumnBlock& dx, const Tensor& dweight, const Tensor& dbias) {
  const char* op = "causal_conv1d_backward";
  const DType dtype = x.base.dtype;
  const ConvShape s = conv_shape(x, weight);
  expect_dtype(dweight, dtype, op, "dweight");
  if (dbias.data) expect_dtype(dbias, dtype, op, "dbias");
  const auto docs = documents(cu_seqlens, s.tokens, op);
  float_switch(dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    const T* w = weight.ptr<T>();
    const T* b = bias.data ? bias.ptr<T>() : nullptr;
    T* dw = dweight.ptr<T>();
    T* db = dbias.data ? dbias.ptr<T>() : nullptr;
#pragma omp parallel for schedule(static) if (s.tokens * s.channels > (1 << 14))
    for (int64_t d = 0; d < s.channels; ++d) {
      std::vector<T> dpre;
      for (const auto& [begin, end] : docs) {
        dpre.assign(static_cast<size_t>(end - begin), T(0));
        for (int64_t t = begin; t < end; ++t) {
          const T g = at<T>(dy, t, d);
          dpre[static_cast<size_t>(t - begin)] =
              silu_out ? g * dsilu(conv_pre<T>(x, w, b, begin, t, d, s.k)) : g;
        }
        for (int64_t t = begin; t < end; ++t) {
          const T g = dpre[static_cast<size_t>(t - begin)];
          if (db) db[d] += g;
          for (int64_t j = 0; j < s.k; ++j) {
            const int64_t src = t - (s.k - 1) + j;
            if (src >= begin) dw[d * s.k + j] += g * at<T>(x, src, d);
          }
        }
        for (int64_t src = begin; src < end; ++src) {
          T acc = T(0);
          for (int64_t j = 0; j < s.k; ++j) {
            const int64_t t = src + (s.k - 1) - j;
            if (t < end) acc += w[d * s.k + j] * dpre[static_cast<size_t>(t - begin)];
          }
          at<T>(dx, src, d) = acc;
        }
      }
    }
  });
}

namespace {

struct ScanShape {
  int64_t tokens, channels, states, chunks;
};

// The shapes (checked before, ops/mamba.cpp); chunk_states in A_log's dtype.
ScanShape check_scan(const char* op, const ops::ScanArgs& a, const Tensor& chunk_states) {
  expect_dtype(chunk_states, a.A_log.dtype, op, "chunk_states");
  const int64_t t = a.x.rows();
  return {t, a.A_log.size(0), a.A_log.size(1), ops::scan_num_chunks(t, a.chunk_len)};
}

}  // namespace

void selective_scan_forward(const ops::ScanArgs& a, const ColumnBlock& y,
                            const Tensor& chunk_states) {
  const char* op = "selective_scan_forward";
  const ScanShape s = check_scan(op, a, chunk_states);
  const DType dtype = a.A_log.dtype;
  const auto docs = documents(a.cu_seqlens, s.tokens, op);
  float_switch(dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T *alog = a.A_log.ptr<T>(), *dt = a.dt.ptr<T>(), *dd = a.D.ptr<T>(),
            *bias = a.dt_bias.ptr<T>();
    T* states = chunk_states.ptr<T>();
    const int64_t n_states = s.states, di = s.channels, len = a.chunk_len;
    // Chunk 0 starts from nothing; every other entry is written at its chunk boundary below.
    std::fill(states, states + n_states * di, T(0));
#pragma omp parallel for schedule(static) if (s.tokens * di * n_states > (1 << 14))
    for (int64_t d = 0; d < di; ++d) {
      std::vector<T> A(static_cast<size_t>(n_states)), h(static_cast<size_t>(n_states));
      for (int64_t n = 0; n < n_states; ++n) A[static_cast<size_t>(n)] = -std::exp(alog[d * n_states + n]);
      for (const auto& [begin, end] : docs) {
        std::fill(h.begin(), h.end(), T(0));
        for (int64_t t = begin; t < end; ++t) {
          const T delta = softplus(dt[t * di + d] + bias[d]);
          const T u = at<T>(a.x, t, d);
          T acc = T(0);
          for (int64_t n = 0; n < n_states; ++n) {
            T& hn = h[static_cast<size_t>(n)];
            hn = std::exp(delta * A[static_cast<size_t>(n)]) * hn + delta * at<T>(a.B, t, n) * u;
            acc += at<T>(a.C, t, n) * hn;
          }
          at<T>(y, t, d) = (acc + dd[d] * u) * silu(at<T>(a.z, t, d));
          if ((t + 1) % len == 0 && t + 1 < s.tokens)
            for (int64_t n = 0; n < n_states; ++n)
              states[((t + 1) / len * n_states + n) * di + d] = h[static_cast<size_t>(n)];
        }
      }
    }
  });
}

void selective_scan_backward(const ops::ScanArgs& a, const ColumnBlock& dy,
                             const Tensor& chunk_states, const ops::ScanGrads& g) {
  const char* op = "selective_scan_backward";
  const ScanShape s = check_scan(op, a, chunk_states);
  const DType dtype = a.A_log.dtype;
  const int64_t tokens = s.tokens, di = s.channels, n_states = s.states;
  expect_dtype(g.dA_log, dtype, op, "dA_log");
  expect_dtype(g.dD, dtype, op, "dD");
  expect_dtype(g.ddt_bias, dtype, op, "ddt_bias");
  const auto docs = documents(a.cu_seqlens, tokens, op);
  float_switch(dtype, op, "A_log", [&](auto tag) {
    using T = decltype(tag);
    const T *alog = a.A_log.ptr<T>(), *dt = a.dt.ptr<T>(), *dd = a.D.ptr<T>(),
            *bias = a.dt_bias.ptr<T>();
    T *ddt = g.ddt.ptr<T>(), *dalog = g.dA_log.ptr<T>(), *dD = g.dD.ptr<T>(),
      *dbias = g.ddt_bias.ptr<T>();
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t n = 0; n < n_states; ++n) at<T>(g.dB, t, n) = at<T>(g.dC, t, n) = T(0);
    std::vector<T> A(static_cast<size_t>(n_states)), G(static_cast<size_t>(n_states)),
        dA(static_cast<size_t>(n_states)), h;
    for (int64_t d = 0; d < di; ++d) {
      for (int64_t n = 0; n < n_states; ++n) {
        A[static_cast<size_t>(n)] = -std::exp(alog[d * n_states + n]);
        dA[static_cast<size_t>(n)] = T(0);
      }
      for (const auto& [begin, end] : docs) {
        // States of this channel over the document: h[(t - begin) * N + n].
        h.assign(static_cast<size_t>((end - begin) * n_states), T(0));
        for (int64_t t = begin; t < end; ++t) {
          const T delta = softplus(dt[t * di + d] + bias[d]), u = at<T>(a.x, t, d);
          for (int64_t n = 0; n < n_states; ++n) {
            const T prev = t > begin ? h[static_cast<size_t>((t - 1 - begin) * n_states + n)] : T(0);
            h[static_cast<size_t>((t - begin) * n_states + n)] =
                std::exp(delta * A[static_cast<size_t>(n)]) * prev + delta * at<T>(a.B, t, n) * u;
          }
        }
        std::fill(G.begin(), G.end(), T(0));  // a[t+1] g[t+1]: what flows into t from t + 1
        for (int64_t t = end - 1; t >= begin; --t) {
          const T pre = dt[t * di + d] + bias[d], delta = softplus(pre), u = at<T>(a.x, t, d);
          const T zz = at<T>(a.z, t, d), gy = at<T>(dy, t, d), gs = gy * silu(zz);
          const T* ht = &h[static_cast<size_t>((t - begin) * n_states)];
          T yssm = dd[d] * u;
          for (int64_t n = 0; n < n_states; ++n) yssm += at<T>(a.C, t, n) * ht[n];
          at<T>(g.dz, t, d) = gy * yssm * dsilu(zz);
          dD[d] += gs * u;
          T du = dd[d] * gs, ddelta = T(0);
          for (int64_t n = 0; n < n_states; ++n) {
            const size_t ni = static_cast<size_t>(n);
            const T bn = at<T>(a.B, t, n), cn = at<T>(a.C, t, n);
            const T gn = gs * cn + G[ni];
            const T decay = std::exp(delta * A[ni]);
            const T prev = t > begin ? ht[n - n_states] : T(0);
            at<T>(g.dC, t, n) += gs * ht[n];
            at<T>(g.dB, t, n) += gn * delta * u;
            du += gn * delta * bn;
            ddelta += gn * (bn * u + A[ni] * decay * prev);
            dA[ni] += gn * decay * prev * delta;
            G[ni] = decay * gn;
          }
          at<T>(g.dx, t, d) = du;
          const T gdt = ddelta * sigmoid(pre);
          ddt[t * di + d] = gdt;
          dbias[d] += gdt;
        }
      }
      for (int64_t n = 0; n < n_states; ++n)
        dalog[d * n_states + n] += dA[static_cast<size_t>(n)] * A[static_cast<size_t>(n)];
    }
  });
}

}  // namespace engine::ref
