// Attention over packed sequences. For a sequence starting at row b with length L, q head h and
// kv head g = h / (H / Hkv), query i sees key j (0 <= i, j < L) iff
//   (!causal || j <= i) && (window == 0 || i - j < window)
// so the visible keys of i are the range [lo(i), hi(i)] with lo = max(0, i - window + 1) when
// window > 0 (else 0) and hi = i when causal (else L - 1). With s_ij = scale * q_i . k_j:
//   forward:  P_ij = exp(s_ij - lse_i),  lse_i = m_i + log sum_j exp(s_ij - m_i),  m_i = max_j s_ij
//             out_i = sum_j P_ij v_j
//   backward: D_i = dout_i . out_i,  dS_ij = P_ij (dout_i . v_j - D_i)
//             dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_(h in group, i) dS_ij q_i,
//             dv_j = sum_(h in group, i) P_ij dout_i
// The visible range always contains j = i, so no row is empty. Layout of a qkv row: H q heads,
// then Hkv k heads, then Hkv v heads, D values each.
#include "ref/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/common.h"

namespace engine::ref {
namespace {

struct Layout {
  int64_t rows, heads, kv_heads, dim, seqs;  // T, H, Hkv, D, S
  const int32_t* cu;                         // (S + 1)
  int64_t work;                              // sum over sequences of L^2 * H * D
  int64_t nh() const { return heads + 2 * kv_heads; }
};

Layout check_params(const ops::AttentionParams& p, const char* op) {
  expect_cpu(p.qkv, op, "qkv");
  expect_ndim(p.qkv, 3, op, "qkv");
  ENSURE(p.num_heads > 0 && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0, op,
         ": num_heads = ", p.num_heads, " must be a positive multiple of num_kv_heads = ",
         p.num_kv_heads);
  ENSURE(p.head_dim > 0, op, ": head_dim = ", p.head_dim);
  const int64_t t = p.qkv.size(0), h = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim;
  expect_shape(p.qkv, {t, h + 2 * hkv, d}, op, "qkv (T, H + 2*Hkv, D)");
  expect(p.out, p.qkv.dtype, {t, h, d}, op, "out");
  expect(p.lse, p.qkv.dtype, {t, h}, op, "lse");
  expect_cpu(p.cu_seqlens, op, "cu_seqlens");
  expect_dtype(p.cu_seqlens, DType::I32, op, "cu_seqlens");
  ENSURE(p.cu_seqlens.ndim() == 1 && p.cu_seqlens.size(0) >= 1, op,
         ": cu_seqlens must be (S + 1), got shape ", p.cu_seqlens.shape.str());
  ENSURE(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.f, op, ": softmax_scale = ",
         p.softmax_scale, " (usually 1 / sqrt(head_dim))");
  ENSURE(p.window >= 0, op, ": window = ", p.window, " (0 = unlimited)");
  Layout l{t, h, hkv, d, p.cu_seqlens.size(0) - 1, p.cu_seqlens.ptr<int32_t>(), 0};
  ENSURE(l.cu[0] == 0, op, ": cu_seqlens[0] = ", l.cu[0], ", expected 0");
  ENSURE(l.cu[l.seqs] == t, op, ": cu_seqlens[S] = ", l.cu[l.seqs], ", expected T = ", t);
  for (int64_t s = 0; s < l.seqs; ++s) {
    const int64_t len = l.cu[s + 1] - l.cu[s];
    ENSURE(len >= 0, op, ": cu_seqlens decreases at ", s, ": ", l.cu[s], " > ", l.cu[s + 1]);
    ENSURE(len <= p.max_seqlen, op, ": sequence ", s, " has length ", len, " > max_seqlen = ",
           p.max_seqlen);
    l.work += len * len * h * d;
  }
  return l;
}

template <typename T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

template <typename T>
void forward(const ops::AttentionParams& p, const Layout& l) {
  const T* qkv = p.qkv.ptr<T>();
  T* out = p.out.ptr<T>();
  T* lse = p.lse.ptr<T>();
  const int64_t nh = l.nh(), d = l.dim, group = l.heads / l.kv_heads;
  const double scale = p.softmax_scale;
#pragma omp parallel for schedule(dynamic) if (l.work > (1 << 15))
  for (int64_t task = 0; task < l.seqs * l.heads; ++task) {
    const int64_t s = task / l.heads, h = task % l.heads, g = h / group;
    const int64_t b = l.cu[s], len = l.cu[s + 1] - b;
    std::vector<double> score(static_cast<size_t>(len)), o(static_cast<size_t>(d));
    for (int64_t i = 0; i < len; ++i) {
      const int64_t lo = p.window ? std::max<int64_t>(0, i - p.window + 1) : 0;
      const int64_t hi = p.causal ? i : len - 1;
      const T* q = qkv + ((b + i) * nh + h) * d;
      double m = -INFINITY;
      for (int64_t j = lo; j <= hi; ++j) {
        const T* k = qkv + ((b + j) * nh + l.heads + g) * d;
        score[j] = scale * dot(q, k, d);
        m = std::max(m, score[j]);
      }
      double sum = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = lo; j <= hi; ++j) {
        const double e = std::exp(score[j] - m);
        const T* v = qkv + ((b + j) * nh + l.heads + l.kv_heads + g) * d;
        sum += e;
        for (int64_t c = 0; c < d; ++c) o[c] += e * v[c];
      }
      T* out_i = out + ((b + i) * l.heads + h) * d;
      for (int64_t c = 0; c < d; ++c) out_i[c] = static_cast<T>(o[c] / sum);
      lse[(b + i) * l.heads + h] = static_cast<T>(m + std::log(sum));
    }
  }
}

template <typename T>
void backward(const ops::AttentionBackwardParams& bp, const Layout& l) {
  const ops::AttentionParams& p = bp.fwd;
  const T *qkv = p.qkv.ptr<T>(), *out = p.out.ptr<T>(), *lse = p.lse.ptr<T>();
  const T* dout = bp.dout.ptr<T>();
  T* dqkv = bp.dqkv.ptr<T>();
  const int64_t nh = l.nh(), d = l.dim, group = l.heads / l.kv_heads;
  const double scale = p.softmax_scale;
#pragma omp parallel for schedule(dynamic) if (l.work > (1 << 14))
  for (int64_t task = 0; task < l.seqs * l.kv_heads; ++task) {
    const int64_t s = task / l.kv_heads, g = task % l.kv_heads;
    const int64_t b = l.cu[s], len = l.cu[s + 1] - b;
    std::vector<double> dk(static_cast<size_t>(len * d)), dv(static_cast<size_t>(len * d));
    std::vector<double> dq(static_cast<size_t>(d));
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        const int64_t lo = p.window ? std::max<int64_t>(0, i - p.window + 1) : 0;
        const int64_t hi = p.causal ? i : len - 1;
        const T* q = qkv + ((b + i) * nh + h) * d;
        const T* dout_i = dout + ((b + i) * l.heads + h) * d;
        const double di = dot(dout_i, out + ((b + i) * l.heads + h) * d, d);
        const double lse_i = lse[(b + i) * l.heads + h];
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t j = lo; j <= hi; ++j) {
          const T* k = qkv + ((b + j) * nh + l.heads + g) * d;
          const T* v = qkv + ((b + j) * nh + l.heads + l.kv_heads + g) * d;
          const double pij = std::exp(scale * dot(q, k, d) - lse_i);
          const double ds = pij * (dot(dout_i, v, d) - di);
          for (int64_t c = 0; c < d; ++c) {
            dv[j * d + c] += pij * dout_i[c];
            dk[j * d + c] += ds * q[c];
            dq[c] += ds * k[c];
          }
        }
        T* dq_out = dqkv + ((b + i) * nh + h) * d;
        for (int64_t c = 0; c < d; ++c) dq_out[c] = static_cast<T>(scale * dq[c]);
      }
    }
    for (int64_t j = 0; j < len; ++j) {
      T* dk_out = dqkv + ((b + j) * nh + l.heads + g) * d;
      T* dv_out = dqkv + ((b + j) * nh + l.heads + l.kv_heads + g) * d;
      for (int64_t c = 0; c < d; ++c) {
        dk_out[c] = static_cast<T>(scale * dk[j * d + c]);
        dv_out[c] = static_cast<T>(dv[j * d + c]);
      }
    }
  }
}

}  // namespace

void attention_forward(const ops::AttentionParams& p) {
  const char* op = "attention_forward";
  const Layout l = check_params(p, op);
  float_switch(p.qkv.dtype, op, "qkv", [&](auto tag) { forward<decltype(tag)>(p, l); });
}

void attention_backward(const ops::AttentionBackwardParams& bp) {
  const char* op = "attention_backward";
  const Layout l = check_params(bp.fwd, op);
  const int64_t t = l.rows;
  expect(bp.dout, bp.fwd.qkv.dtype, {t, l.heads, l.dim}, op, "dout");
  expect(bp.dqkv, bp.fwd.qkv.dtype, bp.fwd.qkv.shape, op, "dqkv");
  float_switch(bp.fwd.qkv.dtype, op, "qkv", [&](auto tag) { backward<decltype(tag)>(bp, l); });
}

}  // namespace engine::ref
