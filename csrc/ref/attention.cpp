// CPU reference of varlen grouped-query attention (ops/attention.h; f32 or f64, lse in the dtype
// of qkv). Exact softmax (max-subtracted) in double, one (sequence, head) at a time; backward
// recomputes the probabilities from lse and sums dk, dv over the q heads of each kv group in head
// order, so results do not depend on the thread count.
// Attention over packed sequences. Sequence s has len_q = Lq queries (rows of qkv starting at
// b = cu_seqlens[s]) and len_k = Lk >= Lq keys (rows of kv starting at cu_seqlens_k[s], or, without
// kv, qkv's own k and v heads of the same rows: Lk = Lq). Query i is at key position i + off,
// off = Lk - Lq (the queries are the last Lq positions). With q head h and kv head
// g = h / (H / Hkv), query i sees key j (0 <= i < Lq, 0 <= j < Lk) iff
//   (!causal || j <= i + off) && (window == 0 || i + off - j < window)
// so the visible keys of i are the range [lo(i), hi(i)] with lo = max(0, i + off - window + 1)
// when window > 0 (else 0) and hi = i + off when causal (else Lk - 1). With s_ij = scale q_i . k_j:
//   forward:  P_ij = exp(s_ij - lse_i),  lse_i = m_i + log sum_j exp(s_ij - m_i),  m_i = max_j s_ij
//             out_i = sum_j P_ij v_j
//   backward: D_i = dout_i . out_i,  dS_ij = P_ij (dout_i . v_j - D_i)
//             dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_(h in group, i) dS_ij q_i,
//             dv_j = sum_(h in group, i) P_ij dout_i
// The visible range always contains j = i + off, so no query row is empty; key rows no query
// sees get dk = dv = 0. Layout of a qkv row: H q heads, then Hkv k heads, then Hkv v heads, D
// values each; of a kv row: Hkv k heads, then Hkv v heads.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/common.h"

namespace engine::ref {
namespace {

struct Layout {
  int64_t rows, heads, kv_heads, dim, seqs;  // T, H, Hkv, D, S
  const int32_t* cu;                         // (S + 1) query rows
  const int32_t* cu_k;                       // (S + 1) key rows (cu without kv)
  int64_t q_row;                             // elements per qkv row: (H + 2 Hkv) D
  int64_t kv_row;                            // elements per key row (of qkv or of kv)
  int64_t k_off, v_off;                      // k head 0, v head 0 within a key row
  int64_t work;                              // sum over sequences of Lq Lk H D
};

// The (S + 1) offsets into `total` rows (their shape and dtype checked by ops/attention.cpp),
// each length at most max_len: values only the reference reads on the host.
const int32_t* check_offsets(const Tensor& cu, int64_t total, int max_len, const char* op,
                             const char* name, const char* total_name, const char* max_name) {
  const int32_t* c = cu.ptr<int32_t>();
  const int64_t seqs = cu.size(0) - 1;
  ENSURE(c[0] == 0, op, ": ", name, "[0] = ", c[0], ", expected 0");
  ENSURE(c[seqs] == total, op, ": ", name, "[S] = ", c[seqs], ", expected ", total_name, " = ",
         total);
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t len = c[s + 1] - c[s];
    ENSURE(len >= 0, op, ": ", name, " decreases at ", s, ": ", c[s], " > ", c[s + 1]);
    ENSURE(len <= max_len, op, ": sequence ", s, " has length ", len, " > ", max_name, " = ",
           max_len);
  }
  return c;
}

// The shared checks ran (ops/attention.cpp); the layout of the call, after the checks of the
// offsets' values.
Layout layout_of(const ops::AttentionParams& p, const char* op) {
  const int64_t t = p.qkv.size(0), h = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim;
  Layout l{t, h, hkv, d, 0, nullptr, nullptr, (h + 2 * hkv) * d, 0, 0, 0, 0};
  l.cu = check_offsets(p.cu_seqlens, t, p.max_seqlen, op, "cu_seqlens", "T", "max_seqlen");
  l.seqs = p.cu_seqlens.size(0) - 1;
  if (p.separate_kv()) {
    l.cu_k = check_offsets(p.cu_seqlens_k, p.kv.size(0), p.max_seqlen_k, op, "cu_seqlens_k", "Tk",
                           "max_seqlen_k");
    for (int64_t s = 0; s < l.seqs; ++s)
      ENSURE(l.cu_k[s + 1] - l.cu_k[s] >= l.cu[s + 1] - l.cu[s], op, ": sequence ", s, " has ",
             l.cu_k[s + 1] - l.cu_k[s], " keys (cu_seqlens_k) for ", l.cu[s + 1] - l.cu[s],
             " queries (cu_seqlens); it needs at least one per query");
    l.kv_row = 2 * hkv * d;
    l.k_off = 0;
    l.v_off = hkv * d;
  } else {
    l.cu_k = l.cu;
    l.kv_row = l.q_row;
    l.k_off = h * d;
    l.v_off = (h + hkv) * d;
  }
  for (int64_t s = 0; s < l.seqs; ++s)
    l.work += int64_t{l.cu[s + 1] - l.cu[s]} * (l.cu_k[s + 1] - l.cu_k[s]) * h * d;
  return l;
}

template <typename T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// The rows of sequence s: queries [b, b + len) of qkv, keys [bk, bk + len_k) of the key rows;
// query i sits at key position i + off.
struct Seq {
  int64_t b, len, bk, len_k, off;
};
Seq seq_of(const Layout& l, int64_t s) {
  const int64_t b = l.cu[s], len = l.cu[s + 1] - b, bk = l.cu_k[s], len_k = l.cu_k[s + 1] - bk;
  return {b, len, bk, len_k, len_k - len};
}

template <typename T>
void forward(const ops::AttentionParams& p, const Layout& l) {
  const T* qkv = p.qkv.ptr<T>();
  const T* keys = p.separate_kv() ? p.kv.ptr<T>() : qkv;  // rows of kv_row elements
  T* out = p.out.ptr<T>();
  T* lse = p.lse.ptr<T>();
  const int64_t d = l.dim, group = l.heads / l.kv_heads;
  const double scale = p.softmax_scale;
#pragma omp parallel for schedule(dynamic) if (l.work > (1 << 15))
  for (int64_t task = 0; task < l.seqs * l.heads; ++task) {
    const int64_t s = task / l.heads, h = task % l.heads, g = h / group;
    const auto [b, len, bk, len_k, off] = seq_of(l, s);
    const T* k0 = keys + bk * l.kv_row + l.k_off + g * d;
    const T* v0 = keys + bk * l.kv_row + l.v_off + g * d;
    std::vector<double> score(static_cast<size_t>(len_k)), o(static_cast<size_t>(d));
    for (int64_t i = 0; i < len; ++i) {
      const int64_t pos = i + off;
      const int64_t lo = p.window ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      const int64_t hi = p.causal ? pos : len_k - 1;
      const T* q = qkv + (b + i) * l.q_row + h * d;
      double m = -INFINITY;
      for (int64_t j = lo; j <= hi; ++j) {
        score[j] = scale * dot(q, k0 + j * l.kv_row, d);
        m = std::max(m, score[j]);
      }
      double sum = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = lo; j <= hi; ++j) {
        const double e = std::exp(score[j] - m);
        const T* v = v0 + j * l.kv_row;
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
  const bool separate = p.separate_kv();
  const T *qkv = p.qkv.ptr<T>(), *out = p.out.ptr<T>(), *lse = p.lse.ptr<T>();
  const T* keys = separate ? p.kv.ptr<T>() : qkv;
  const T* dout = bp.dout.ptr<T>();
  T* dqkv = bp.dqkv.ptr<T>();
  T* dkeys = separate ? bp.dkv.ptr<T>() : dqkv;  // dk, dv: rows of kv_row elements
  const int64_t d = l.dim, group = l.heads / l.kv_heads;
  const double scale = p.softmax_scale;
#pragma omp parallel for schedule(dynamic) if (l.work > (1 << 14))
  for (int64_t task = 0; task < l.seqs * l.kv_heads; ++task) {
    const int64_t s = task / l.kv_heads, g = task % l.kv_heads;
    const auto [b, len, bk, len_k, off] = seq_of(l, s);
    const T* k0 = keys + bk * l.kv_row + l.k_off + g * d;
    const T* v0 = keys + bk * l.kv_row + l.v_off + g * d;
    std::vector<double> dk(static_cast<size_t>(len_k * d)), dv(static_cast<size_t>(len_k * d));
    std::vector<double> dq(static_cast<size_t>(d));
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        const int64_t pos = i + off;
        const int64_t lo = p.window ? std::max<int64_t>(0, pos - p.window + 1) : 0;
        const int64_t hi = p.causal ? pos : len_k - 1;
        const T* q = qkv + (b + i) * l.q_row + h * d;
        const T* dout_i = dout + ((b + i) * l.heads + h) * d;
        const double di = dot(dout_i, out + ((b + i) * l.heads + h) * d, d);
        const double lse_i = lse[(b + i) * l.heads + h];
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t j = lo; j <= hi; ++j) {
          const T* k = k0 + j * l.kv_row;
          const T* v = v0 + j * l.kv_row;
          const double pij = std::exp(scale * dot(q, k, d) - lse_i);
          const double ds = pij * (dot(dout_i, v, d) - di);
          for (int64_t c = 0; c < d; ++c) {
            dv[j * d + c] += pij * dout_i[c];
            dk[j * d + c] += ds * q[c];
            dq[c] += ds * k[c];
          }
        }
        T* dq_out = dqkv + (b + i) * l.q_row + h * d;
        for (int64_t c = 0; c < d; ++c) dq_out[c] = static_cast<T>(scale * dq[c]);
      }
    }
    for (int64_t j = 0; j < len_k; ++j) {
      T* dk_out = dkeys + (bk + j) * l.kv_row + l.k_off + g * d;
      T* dv_out = dkeys + (bk + j) * l.kv_row + l.v_off + g * d;
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
  const Layout l = layout_of(p, op);
  float_switch(p.qkv.dtype, op, "qkv", [&](auto tag) { forward<decltype(tag)>(p, l); });
}

void attention_backward(const ops::AttentionBackwardParams& bp) {
  const char* op = "attention_backward";
  const Layout l = layout_of(bp.fwd, op);
  float_switch(bp.fwd.qkv.dtype, op, "qkv", [&](auto tag) { backward<decltype(tag)>(bp, l); });
}

}  // namespace engine::ref
