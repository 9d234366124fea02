// Mixture of experts on the CPU (contract: ops/moe.h), written for reading:
//   routing   per token: softmax in double, top-k by repeated argmax over the logits (strictly
//             greater wins, so equal logits go to the lower expert index), the chosen
//             probabilities as weights, renormalised or not;
//             the aux / z losses and their gradient through the softmax (formulas in ops/moe.h)
//   dispatch  a histogram, padded prefix sums, then one pass in (token, slot) order handing out
//             rows from a cursor per expert (stable)
//   permute / unpermute   row copies and weighted row sums
//   grouped linear        one plain triple loop per expert over its row range
//   shared gate           a sigmoid and a dot product per token
// The shared checks ran (ops/moe.cpp); the reference checks what is its own: f32 or f64 floats
// (float_switch), one dtype for all of them, and every index it reads (expert ids, rows, offsets,
// counts) in range before anything is written.
#include "ops/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/common.h"

namespace engine::ref {
namespace {

constexpr int64_t kParallelWork = 1 << 15;

// Every entry of an i32 tensor in [0, bound).
void check_range(const Tensor& t, int64_t bound, const char* op, const char* name) {
  const int32_t* p = t.ptr<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    ENSURE(p[i] >= 0 && p[i] < bound, op, ": ", name, "[", i, "] = ", p[i], " outside [0, ",
           bound, ")");
}

// Every entry of counts (E) >= 0.
void check_counts_nonnegative(const Tensor& counts, const char* op) {
  for (int64_t i = 0; i < counts.numel(); ++i)
    ENSURE(counts.ptr<int32_t>()[i] >= 0, op, ": counts[", i, "] is negative");
}

// f_e = counts_e / sum counts (= counts_e / (T k)); zeros when nothing was routed.
std::vector<double> fractions(const Tensor& counts) {
  const int32_t* c = counts.ptr<int32_t>();
  double total = 0;
  for (int64_t e = 0; e < counts.numel(); ++e) total += c[e];
  std::vector<double> f(counts.numel(), 0.0);
  if (total > 0)
    for (int64_t e = 0; e < counts.numel(); ++e) f[e] = c[e] / total;
  return f;
}

// Expert row ranges (offsets, counts) of an (R, ...) buffer: checks each lies inside [0, R).
void check_ranges(const Tensor& offsets, const Tensor& counts, int64_t rows, int64_t experts,
                  const char* op) {
  const int32_t *o = offsets.ptr<int32_t>(), *c = counts.ptr<int32_t>();
  for (int64_t e = 0; e < experts; ++e)
    ENSURE(o[e] >= 0 && c[e] >= 0 && int64_t{o[e]} + c[e] <= rows, op, ": expert ", e,
           " has rows [", o[e], ", ", int64_t{o[e]} + c[e], "), outside the ", rows,
           " rows of the buffer");
}

// Pointer to row n (of N = all stacks) of expert e's weight matrix W_e (N, K).
template <typename T>
T* weight_row(T* w, const ops::GroupedWeight& g, int64_t e, int64_t n) {
  const int64_t nps = g.n_per_stack();
  return w + (((n / nps) * g.experts + e) * nps + n % nps) * g.k;
}

}  // namespace

// ---- Routing ----------------------------------------------------------------------------------

void moe_route_forward(const Tensor& logits, const Tensor& probs, const Tensor& lse,
                       const Tensor& expert_idx, const Tensor& weights, bool renormalize) {
  const char* op = "moe_route_forward";
  const int64_t T = logits.size(0), E = logits.size(1), k = expert_idx.size(1);
  float_switch(logits.dtype, op, "logits", [&](auto tag) {
    using F = decltype(tag);
    const F* l = logits.ptr<F>();
    F *p = probs.ptr<F>(), *ls = lse.ptr<F>(), *w = weights.ptr<F>();
    int32_t* idx = expert_idx.ptr<int32_t>();
#pragma omp parallel for schedule(static) if (T * E > kParallelWork)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> row(l + t * E, l + (t + 1) * E);  // probs may alias logits
      const double m = *std::max_element(row.begin(), row.end());
      double s = 0;
      for (double v : row) s += std::exp(v - m);
      const double lse_t = m + std::log(s);
      std::vector<bool> taken(E, false);
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e)
          if (!taken[e] && (best < 0 || row[e] > row[best])) best = e;
        taken[best] = true;
        idx[t * k + j] = static_cast<int32_t>(best);
        sum += std::exp(row[best] - lse_t);
      }
      if (!renormalize) sum = 1;
      for (int64_t j = 0; j < k; ++j)
        w[t * k + j] = static_cast<F>(std::exp(row[idx[t * k + j]] - lse_t) / sum);
      for (int64_t e = 0; e < E; ++e) p[t * E + e] = static_cast<F>(std::exp(row[e] - lse_t));
      ls[t] = static_cast<F>(lse_t);
    }
  });
}

void moe_aux_losses(const Tensor& probs, const Tensor& lse, const Tensor& counts,
                    const ops::MoeAuxCoefs& coefs, const Tensor& losses) {
  const char* op = "moe_aux_losses";
  check_counts_nonnegative(counts, op);
  const int64_t T = probs.size(0), E = probs.size(1);
  const std::vector<double> f = fractions(counts);
  float_switch(probs.dtype, op, "probs", [&](auto tag) {
    using F = decltype(tag);
    const F *p = probs.ptr<F>(), *ls = lse.ptr<F>();
    double aux = 0, z = 0;
    if (T > 0) {
      for (int64_t e = 0; e < E; ++e) {
        double pe = 0;
        for (int64_t t = 0; t < T; ++t) pe += p[t * E + e];
        aux += f[e] * pe / static_cast<double>(T);
      }
      for (int64_t t = 0; t < T; ++t) z += static_cast<double>(ls[t]) * ls[t];
      aux *= static_cast<double>(coefs.aux_loss_coef) * E;
      z *= static_cast<double>(coefs.z_loss_coef) / T;
    }
    losses.ptr<F>()[0] = static_cast<F>(aux);
    losses.ptr<F>()[1] = static_cast<F>(z);
  });
}

void moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                        const Tensor& expert_idx, const Tensor& weights, const Tensor& counts,
                        const ops::MoeAuxCoefs& coefs, float aux_grad_scale, bool renormalize,
                        const Tensor& dlogits) {
  const char* op = "moe_route_backward";
  check_counts_nonnegative(counts, op);
  const int64_t T = probs.size(0), E = probs.size(1), k = expert_idx.size(1);
  check_range(expert_idx, E, op, "expert_idx");
  expect_dtype(dlogits, probs.dtype, op, "dlogits");
  const std::vector<double> f = fractions(counts);
  const double aux_g = T ? static_cast<double>(aux_grad_scale) * coefs.aux_loss_coef * E / T : 0;
  const double z_g = T ? static_cast<double>(aux_grad_scale) * coefs.z_loss_coef * 2.0 / T : 0;
  float_switch(probs.dtype, op, "probs", [&](auto tag) {
    using F = decltype(tag);
    const F *p = probs.ptr<F>(), *ls = lse.ptr<F>(), *w = weights.ptr<F>(), *dw = dweights.ptr<F>();
    const int32_t* idx = expert_idx.ptr<int32_t>();
    F* dl = dlogits.ptr<F>();
#pragma omp parallel for schedule(static) if (T * E > kParallelWork)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> g(E);
      for (int64_t e = 0; e < E; ++e) g[e] = aux_g * f[e];
      double s = 0, wdw = 0;
      for (int64_t j = 0; j < k; ++j) {
        s += p[t * E + idx[t * k + j]];
        wdw += static_cast<double>(w[t * k + j]) * dw[t * k + j];
      }
      for (int64_t j = 0; j < k; ++j)
        g[idx[t * k + j]] += renormalize ? (dw[t * k + j] - wdw) / s : dw[t * k + j];
      double pg = 0;
      for (int64_t e = 0; e < E; ++e) pg += p[t * E + e] * g[e];
      for (int64_t e = 0; e < E; ++e) {
        const double pe = p[t * E + e];
        dl[t * E + e] = static_cast<F>(pe * (g[e] - pg) + z_g * ls[t] * pe);
      }
    }
  });
}

// ---- Dispatch ---------------------------------------------------------------------------------

void moe_dispatch(const Tensor& expert_idx, const Tensor& counts, const Tensor& offsets,
                  const Tensor& row_of) {
  const char* op = "moe_dispatch";
  const int64_t T = expert_idx.size(0), k = expert_idx.size(1), E = counts.size(0);
  check_range(expert_idx, E, op, "expert_idx");
  const int32_t* idx = expert_idx.ptr<int32_t>();
  int32_t *c = counts.ptr<int32_t>(), *o = offsets.ptr<int32_t>(), *row = row_of.ptr<int32_t>();
  std::fill(c, c + E, 0);
  for (int64_t a = 0; a < T * k; ++a) ++c[idx[a]];
  o[0] = 0;
  for (int64_t e = 0; e < E; ++e)
    o[e + 1] = static_cast<int32_t>(o[e] + (c[e] + ops::kMoeRowAlign - 1) / ops::kMoeRowAlign *
                                               ops::kMoeRowAlign);
  std::vector<int32_t> cursor(o, o + E);
  for (int64_t a = 0; a < T * k; ++a) row[a] = cursor[idx[a]]++;
}

void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor& xp) {
  const char* op = "moe_permute";
  const int64_t T = x.size(0), C = x.size(1), k = row_of.size(1);
  check_range(row_of, xp.size(0), op, "row_of");
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using F = decltype(tag);
    const F* src = x.ptr<F>();
    F* dst = xp.ptr<F>();
    const int32_t* row = row_of.ptr<int32_t>();
    for (int64_t a = 0; a < T * k; ++a)
      std::copy(src + (a / k) * C, src + (a / k + 1) * C, dst + int64_t{row[a]} * C);
  });
}

void moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, const Tensor& y) {
  const char* op = "moe_unpermute";
  const int64_t T = y.size(0), C = y.size(1), k = row_of.size(1);
  const bool weighted = weights.defined() && weights.ndim() > 0;
  if (weighted) expect_dtype(weights, y.dtype, op, "weights");
  check_range(row_of, yp.size(0), op, "row_of");
  float_switch(y.dtype, op, "y", [&](auto tag) {
    using F = decltype(tag);
    const F* src = yp.ptr<F>();
    const F* w = weighted ? weights.ptr<F>() : nullptr;
    F* dst = y.ptr<F>();
    const int32_t* row = row_of.ptr<int32_t>();
#pragma omp parallel for schedule(static) if (T * k * C > kParallelWork)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t j = 0; j < k; ++j)
          s += (w ? static_cast<double>(w[t * k + j]) : 1.0) * src[int64_t{row[t * k + j]} * C + c];
        dst[t * C + c] = static_cast<F>(s);
      }
  });
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& weights, const Tensor& dyp, const Tensor& dweights) {
  const char* op = "moe_unpermute_backward";
  const int64_t T = dy.size(0), C = dy.size(1), k = row_of.size(1);
  expect_dtype(weights, dy.dtype, op, "weights");
  expect_dtype(dweights, dy.dtype, op, "dweights");
  check_range(row_of, yp.size(0), op, "row_of");
  float_switch(dy.dtype, op, "dy", [&](auto tag) {
    using F = decltype(tag);
    const F *g = dy.ptr<F>(), *src = yp.ptr<F>(), *w = weights.ptr<F>();
    F *dst = dyp.ptr<F>(), *dw = dweights.ptr<F>();
    const int32_t* row = row_of.ptr<int32_t>();
#pragma omp parallel for schedule(static) if (T * k * C > kParallelWork)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row[t * k + j];
        double s = 0;
        for (int64_t c = 0; c < C; ++c) s += static_cast<double>(g[t * C + c]) * src[r * C + c];
        dw[t * k + j] = static_cast<F>(s);
        for (int64_t c = 0; c < C; ++c)
          dst[r * C + c] = static_cast<F>(static_cast<double>(w[t * k + j]) * g[t * C + c]);
      }
  });
}

// ---- Grouped linear ---------------------------------------------------------------------------

// The options choose among the CUDA kernels; the reference has one loop and ignores them.
void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& counts, const Tensor& y,
                            const ops::GroupedLinearOptions&) {
  const char* op = "grouped_linear_forward";
  const ops::GroupedWeight g = ops::grouped_weight(w, op);
  check_ranges(offsets, counts, x.size(0), g.experts, op);
  float_switch(w.dtype, op, "w", [&](auto tag) {
    using F = decltype(tag);
    const F *px = x.ptr<F>(), *pw = w.ptr<F>();
    F* py = y.ptr<F>();
    for (int64_t e = 0; e < g.experts; ++e) {
      const int64_t r0 = offsets.ptr<int32_t>()[e], rows = counts.ptr<int32_t>()[e];
#pragma omp parallel for schedule(static) if (rows * g.n * g.k > kParallelWork)
      for (int64_t r = r0; r < r0 + rows; ++r)
        for (int64_t n = 0; n < g.n; ++n) {
          const F* wr = weight_row(pw, g, e, n);
          double s = 0;
          for (int64_t kk = 0; kk < g.k; ++kk) s += static_cast<double>(px[r * g.k + kk]) * wr[kk];
          py[r * g.n + n] = static_cast<F>(s);
        }
    }
  });
}

// The options are ignored (as in the forward).
void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& counts, const Tensor& dx,
                                   const ops::GroupedLinearOptions&) {
  const char* op = "grouped_linear_backward_input";
  const ops::GroupedWeight g = ops::grouped_weight(w, op);
  check_ranges(offsets, counts, dy.size(0), g.experts, op);
  float_switch(w.dtype, op, "w", [&](auto tag) {
    using F = decltype(tag);
    const F *pdy = dy.ptr<F>(), *pw = w.ptr<F>();
    F* pdx = dx.ptr<F>();
    for (int64_t e = 0; e < g.experts; ++e) {
      const int64_t r0 = offsets.ptr<int32_t>()[e], rows = counts.ptr<int32_t>()[e];
#pragma omp parallel for schedule(static) if (rows * g.n * g.k > kParallelWork)
      for (int64_t r = r0; r < r0 + rows; ++r) {
        std::vector<double> acc(g.k, 0.0);
        for (int64_t n = 0; n < g.n; ++n) {
          const F* wr = weight_row(pw, g, e, n);
          const double d = pdy[r * g.n + n];
          for (int64_t kk = 0; kk < g.k; ++kk) acc[kk] += d * wr[kk];
        }
        for (int64_t kk = 0; kk < g.k; ++kk) pdx[r * g.k + kk] = static_cast<F>(acc[kk]);
      }
    }
  });
}

// The options are ignored (as in the forward). dy and x share a dtype (the shared checks); here
// also dw's.
void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& counts, const Tensor& dw,
                                    const ops::GroupedLinearOptions&) {
  const char* op = "grouped_linear_backward_weight";
  expect_dtype(dy, dw.dtype, op, "dy");
  const ops::GroupedWeight g = ops::grouped_weight(dw, op);
  check_ranges(offsets, counts, dy.size(0), g.experts, op);
  float_switch(dw.dtype, op, "dw", [&](auto tag) {
    using F = decltype(tag);
    const F *pdy = dy.ptr<F>(), *px = x.ptr<F>();
    F* pdw = dw.ptr<F>();
    for (int64_t e = 0; e < g.experts; ++e) {
      const int64_t r0 = offsets.ptr<int32_t>()[e], rows = counts.ptr<int32_t>()[e];
      if (rows == 0) continue;
#pragma omp parallel for schedule(static) if (rows * g.n * g.k > kParallelWork)
      for (int64_t n = 0; n < g.n; ++n) {
        F* wr = weight_row(pdw, g, e, n);
        std::vector<double> acc(g.k, 0.0);
        for (int64_t r = r0; r < r0 + rows; ++r) {
          const double d = pdy[r * g.n + n];
          for (int64_t kk = 0; kk < g.k; ++kk) acc[kk] += d * px[r * g.k + kk];
        }
        for (int64_t kk = 0; kk < g.k; ++kk) wr[kk] = static_cast<F>(wr[kk] + acc[kk]);
      }
    }
  });
}

// ---- Shared expert's gate ----------------------------------------------------------------------

namespace {
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

void moe_shared_gate_forward(const Tensor& logits, const Tensor& shared, const Tensor& y) {
  const char* op = "moe_shared_gate_forward";
  expect_dtype(logits, shared.dtype, op, "logits");
  const int64_t T = shared.size(0), C = shared.size(1);
  float_switch(shared.dtype, op, "shared", [&](auto tag) {
    using F = decltype(tag);
    const F *l = logits.ptr<F>(), *s = shared.ptr<F>();
    F* py = y.ptr<F>();
    for (int64_t t = 0; t < T; ++t) {
      const double g = sigmoid(l[t]);
      for (int64_t c = 0; c < C; ++c) py[t * C + c] = static_cast<F>(py[t * C + c] + g * s[t * C + c]);
    }
  });
}

void moe_shared_gate_backward(const Tensor& dy, const Tensor& logits, const Tensor& shared,
                              const Tensor& dshared, const Tensor& dlogits) {
  const char* op = "moe_shared_gate_backward";
  expect_dtype(logits, shared.dtype, op, "logits");
  expect_dtype(dlogits, shared.dtype, op, "dlogits");
  const int64_t T = shared.size(0), C = shared.size(1);
  float_switch(shared.dtype, op, "shared", [&](auto tag) {
    using F = decltype(tag);
    const F *l = logits.ptr<F>(), *s = shared.ptr<F>(), *pdy = dy.ptr<F>();
    F *ds = dshared.ptr<F>(), *dl = dlogits.ptr<F>();
    for (int64_t t = 0; t < T; ++t) {
      const double g = sigmoid(l[t]);
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dot += static_cast<double>(pdy[t * C + c]) * s[t * C + c];
        ds[t * C + c] = static_cast<F>(g * pdy[t * C + c]);
      }
      dl[t] = static_cast<F>(g * (1.0 - g) * dot);
    }
  });
}

// ---- Jitter -----------------------------------------------------------------------------------

void moe_jitter(const Tensor& x, const Tensor& y, uint64_t seed, float eps) {
  const char* op = "moe_jitter";
  const PhiloxKey key = ops::moe_jitter_key(seed);
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using F = decltype(tag);
    const F* px = x.ptr<F>();
    F* py = y.ptr<F>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double u = bits_to_unit(philox4x32(key, static_cast<uint64_t>(i)).v[0]);
      py[i] = static_cast<F>(px[i] * (1.0 + eps * (2.0 * u - 1.0)));
    }
  });
}

}  // namespace engine::ref
