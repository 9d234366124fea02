// Device helpers shared by the distillation kernels (distillation.cu: fused;
// distillation_vocab_parallel.cu: partial, combine, grad). Included by .cu files only.
// Contract and formulas: csrc/ops/loss.h. With x the student's and y the teacher's logits of a
// row, tau the temperature and k = log2(e) / tau:
//   Frame     a_v = x_v k - x_0 k, b_v = y_v k - y_0 k: the tempered logits in log2 units,
//             relative to the row's first logits (x_0, y_0), formed by one fma each, so they keep
//             f32 accuracy whatever the logits' magnitude (the references cancel in every
//             quantity that leaves these helpers).
//   DStat     one thread's (or block's) running statistics: the raw maxima mx, my and, relative
//             to ma = mx k - x_0 k and mb = my k - y_0 k,
//               ss = sum 2^(a - ma), sq = sum 2^(b - mb), sx = sum 2^(tau (a - ma)) = sum e^(x -
//               mx), w  = SoftCE sum 2^(b - mb) a, ForwardKL sum 2^(b - mb) (b - a),
//                    ReverseKL sum 2^(a - ma) (a - b)
//             online: a batch that raises a maximum rescales the sums relative to it first; two
//             statistics merge bitwise symmetrically (explicit roundings), so butterflies leave
//             the same value in every lane.
//   DPart     the statistics of ops/loss.h's distillation_partial (natural units, relative to
//             the raw maxima), from a DStat.
//   combine   ops/loss.h's distillation_combine of P parts: the row statistics
//             (Mx, log Sx, log Ss, My, log Sq, c), D and the weighted loss.
//   DGrad     a row's gradient constants and one element's gradient.
//   stream_*  a warp or block streaming a row pair: its statistics, its gradient, a zero row.
// exp is ex2.approx on log2-unit arguments, as in ce_device.cuh; the combine uses expf / logf.
// The logits must be finite.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/loss/ce_device.cuh"

namespace engine::cuda::dl {

using cuda::from_float;
using cuda::to_float;

enum Kind : int { kSoftCE = 0, kForwardKL = 1, kReverseKL = 2 };

// What a row's statistics pass needs.
struct Frame {
  float k;  // log2(e) / tau
  float tau;
  float xr;  // x_0 k
  float yr;  // y_0 k
  int kind;  // Kind
  bool sx;   // accumulate sx separately (label term on and tau != 1)
};

struct DStat {
  float mx, my;  // raw maxima (-inf: nothing yet)
  float ss, sq, sx, w;
};

__device__ __forceinline__ DStat empty_stat() { return {-INFINITY, -INFINITY, 0.f, 0.f, 0.f, 0.f}; }

// Folds the pairs (x[j], y[j]) into st: at most one rescale per maximum per batch.
template <int N>
__device__ __forceinline__ void accumulate(DStat& st, const float (&x)[N], const float (&y)[N],
                                           const Frame& f) {
  float bx = x[0], by = y[0];
#pragma unroll
  for (int j = 1; j < N; ++j) {
    bx = fmaxf(bx, x[j]);
    by = fmaxf(by, y[j]);
  }
  const bool rev = f.kind == kReverseKL;
  if (bx > st.mx) {  // 2^(old - new): 0 while the old maximum is still -inf
    const float d = fmaf(st.mx, f.k, -f.xr) - fmaf(bx, f.k, -f.xr);
    const float r = ex2(d);
    st.ss *= r;
    if (rev) st.w *= r;
    if (f.sx) st.sx *= ex2(f.tau * d);
    st.mx = bx;
  }
  if (by > st.my) {
    const float r = ex2(fmaf(st.my, f.k, -f.yr) - fmaf(by, f.k, -f.yr));
    st.sq *= r;
    if (!rev) st.w *= r;
    st.my = by;
  }
  const float ma = fmaf(st.mx, f.k, -f.xr), mb = fmaf(st.my, f.k, -f.yr);
  // w's weight and difference: SoftCE (eb, a), ForwardKL (eb, b - a), ReverseKL (ea, a - b).
  const float ca = f.kind == kForwardKL ? -1.f : 1.f;
  const float cb = f.kind == kSoftCE ? 0.f : -ca;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float a = fmaf(x[j], f.k, -f.xr), b = fmaf(y[j], f.k, -f.yr);
    const float ea = ex2(a - ma), eb = ex2(b - mb);
    st.ss += ea;
    st.sq += eb;
    if (f.sx) st.sx += ex2(f.tau * (a - ma));
    st.w = fmaf(rev ? ea : eb, fmaf(ca, a, cb * b), st.w);
  }
}

// Bitwise symmetric in a and b (explicit roundings, no contraction).
__device__ __forceinline__ DStat merge(const DStat& a, const DStat& b, const Frame& f) {
  DStat r;
  r.mx = fmaxf(a.mx, b.mx);
  r.my = fmaxf(a.my, b.my);
  const float mx = fmaf(r.mx, f.k, -f.xr), my = fmaf(r.my, f.k, -f.yr);
  // 2^(m_a - m) relative to the merged maximum: exactly 1 for the side that holds it (also when
  // both are still -inf), 0 for a side that is -inf while the other is not.
  const bool xa = a.mx == r.mx, xb = b.mx == r.mx, ya = a.my == r.my, yb = b.my == r.my;
  const float dxa = xa ? 0.f : fmaf(a.mx, f.k, -f.xr) - mx;
  const float dxb = xb ? 0.f : fmaf(b.mx, f.k, -f.xr) - mx;
  const float fxa = xa ? 1.f : ex2(dxa), fxb = xb ? 1.f : ex2(dxb);
  const float fya = ya ? 1.f : ex2(fmaf(a.my, f.k, -f.yr) - my);
  const float fyb = yb ? 1.f : ex2(fmaf(b.my, f.k, -f.yr) - my);
  r.ss = __fadd_rn(__fmul_rn(a.ss, fxa), __fmul_rn(b.ss, fxb));
  r.sq = __fadd_rn(__fmul_rn(a.sq, fya), __fmul_rn(b.sq, fyb));
  r.sx = f.sx ? __fadd_rn(__fmul_rn(a.sx, xa ? 1.f : ex2(__fmul_rn(f.tau, dxa))),
                          __fmul_rn(b.sx, xb ? 1.f : ex2(__fmul_rn(f.tau, dxb))))
              : 0.f;
  const bool rev = f.kind == kReverseKL;
  r.w = __fadd_rn(__fmul_rn(a.w, rev ? fxa : fya), __fmul_rn(b.w, rev ? fxb : fyb));
  return r;
}

__device__ __forceinline__ DStat shfl_xor(const DStat& s, int o) {
  return {__shfl_xor_sync(0xffffffffu, s.mx, o), __shfl_xor_sync(0xffffffffu, s.my, o),
          __shfl_xor_sync(0xffffffffu, s.ss, o), __shfl_xor_sync(0xffffffffu, s.sq, o),
          __shfl_xor_sync(0xffffffffu, s.sx, o), __shfl_xor_sync(0xffffffffu, s.w, o)};
}

__device__ __forceinline__ DStat warp_reduce(DStat st, const Frame& f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) st = merge(st, shfl_xor(st, o), f);
  return st;
}

// Block-wide statistics, the same in every thread. red: kThreads / 32 entries.
template <int kThreads>
__device__ __forceinline__ DStat block_reduce(DStat st, DStat* red, const Frame& f) {
  st = warp_reduce(st, f);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = st;
  __syncthreads();
  DStat r = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) r = merge(r, red[w], f);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Parts, combine, gradient.

// distillation_partial's statistics without z (ops/loss.h), natural units.
struct DPart {
  float mx, sx, ss, my, sq, w;
};

// label: the label term is on (sx is reported, else 0).
__device__ __forceinline__ DPart to_part(const DStat& st, const Frame& f, bool label) {
  if (st.mx == -INFINITY) return {-INFINITY, 0.f, 0.f, -INFINITY, 0.f, 0.f};  // no column
  const float ma = fmaf(st.mx, f.k, -f.xr), mb = fmaf(st.my, f.k, -f.yr);
  float w;
  switch (f.kind) {
    case kSoftCE:
      w = fmaf(-ma, st.sq, st.w);
      break;  // sum eb (a - ma)
    case kForwardKL:
      w = fmaf(ma - mb, st.sq, st.w);
      break;  // sum eb ((b - mb) - (a - ma))
    default:
      w = fmaf(-(ma - mb), st.ss, st.w);
      break;  // sum ea ((a - ma) - (b - mb))
  }
  return {st.mx, label ? (f.sx ? st.sx : st.ss) : 0.f, st.ss, st.my, st.sq, w * kLn2};
}

// Constants of the combine and the gradient.
struct DConst {
  int kind;
  float tau, inv_tau;
  float label_weight, distill_weight, z_loss;
  bool label;  // label_weight != 0
};

// A row's combined statistics (ops/loss.h's row_stats) and losses.
struct DRow {
  float mx, lsx, lss, my, lsq, c;
  float d;      // the distillation term D
  float total;  // label_weight C + distill_weight D
};

// Combines the parts part(0), ..., part(np - 1) in order; zsum: the sum of the parts' z.
template <typename Part>
__device__ __forceinline__ DRow combine(int np, Part&& part, float zsum, const DConst& c) {
  float mx = -INFINITY, my = -INFINITY;
  for (int q = 0; q < np; ++q) {
    const DPart p = part(q);
    mx = fmaxf(mx, p.mx);
    my = fmaxf(my, p.my);
  }
  float sx = 0.f, ss = 0.f, sq = 0.f, w = 0.f;
  for (int q = 0; q < np; ++q) {
    const DPart p = part(q);
    if (p.mx == -INFINITY) continue;  // a shard without columns
    const float dx = (p.mx - mx) * c.inv_tau, dy = (p.my - my) * c.inv_tau;
    const float ex = expf(dx), ey = expf(dy);
    if (c.label) sx += p.sx * expf(p.mx - mx);
    ss += p.ss * ex;
    sq += p.sq * ey;
    switch (c.kind) {
      case kSoftCE:
        w += ey * fmaf(dx, p.sq, p.w);
        break;
      case kForwardKL:
        w += ey * fmaf(dy - dx, p.sq, p.w);
        break;
      default:
        w += ex * fmaf(dx - dy, p.ss, p.w);
        break;
    }
  }
  DRow r;
  r.mx = mx;
  r.my = my;
  r.lss = logf(ss);
  r.lsq = logf(sq);
  r.c = 0.f;
  switch (c.kind) {
    case kSoftCE:
      r.d = r.lss - w / sq;
      break;
    case kForwardKL:
      r.d = (r.lss - r.lsq) + w / sq;
      break;
    default:
      r.c = w / ss;
      r.d = (r.lsq - r.lss) + r.c;
      break;
  }
  r.lsx = c.label ? logf(sx) : 0.f;
  r.total = c.distill_weight * r.d;
  if (c.label) {
    const float lse = mx + r.lsx;
    const float ce = fmaf(c.z_loss * lse, lse, (mx - zsum) + r.lsx);
    r.total = fmaf(c.label_weight, ce, r.total);
  }
  return r;
}

// One row's gradient constants (ops/loss.h's distillation_grad), from its row statistics.
struct DGrad {
  float mx, my;
  float k;  // log2(e) / tau
  float inv_tau;
  float l2ss, l2sq;  // log2 Ss, log2 Sq
  float c;           // ReverseKL's c
  float cd;          // grad_scale distill_weight / tau
  float l2sx;        // label: log2 Sx
  float cl;          // label: grad_scale label_weight (1 + 2 z lse)
  float cl1;         // label: grad_scale label_weight
  int kind;
  bool label;
  bool unit_tau;  // tau == 1: the label term's softmax is s
};

__device__ __forceinline__ DGrad make_grad(float mx, float lsx, float lss, float my, float lsq,
                                           float cc, const DConst& c, float grad_scale) {
  DGrad g;
  g.mx = mx;
  g.my = my;
  g.k = kLog2e * c.inv_tau;
  g.inv_tau = c.inv_tau;
  g.l2ss = lss * kLog2e;
  g.l2sq = lsq * kLog2e;
  g.c = cc;
  g.cd = grad_scale * c.distill_weight * c.inv_tau;
  g.l2sx = lsx * kLog2e;
  const float lse = mx + lsx;
  g.cl = c.label ? grad_scale * c.label_weight * fmaf(2.f * c.z_loss, lse, 1.f) : 0.f;
  g.cl1 = grad_scale * c.label_weight;
  g.kind = c.kind;
  g.label = c.label;
  g.unit_tau = c.tau == 1.f;
  return g;
}

// The gradient of one element; is_label: this column is the row's label.
__device__ __forceinline__ float grad_elem(float x, float y, bool is_label, const DGrad& g) {
  const float dx = x - g.mx, dy = y - g.my;
  const float s = ex2(fmaf(dx, g.k, -g.l2ss));
  const float gd =
      g.kind == kReverseKL ? s * fmaf(dx - dy, g.inv_tau, -g.c) : s - ex2(fmaf(dy, g.k, -g.l2sq));
  float out = g.cd * gd;
  if (g.label) {
    const float p = g.unit_tau ? s : ex2(fmaf(dx, kLog2e, -g.l2sx));
    out = fmaf(g.cl, p, out);
    if (is_label) out -= g.cl1;
  }
  return out;
}

// One 16-byte vector pair's gradient; col: the row index of the vector's first element.
template <typename T>
__device__ __forceinline__ uint4 grad_vec(const uint4& ux, const uint4& uy, int col, int label,
                                          const DGrad& g) {
  float x[ce::kVec<T>], y[ce::kVec<T>], o[ce::kVec<T>];
  ce::unpack(ux, x, T{});
  ce::unpack(uy, y, T{});
#pragma unroll
  for (int j = 0; j < ce::kVec<T>; ++j) o[j] = grad_elem(x[j], y[j], col + j == label, g);
  return ce::pack(o, T{});
}

// ---------------------------------------------------------------------------------------------
// Streaming a row pair: kGroup threads (a warp or a block) over x and y laid out as `l` (the
// same layout for both: co-aligned rows, or everything scalar, l = {V, 0, 0}), kUnroll vector
// pairs in flight per thread.

// This thread's unreduced statistics of the row pair.
template <typename T, int kGroup, int kUnroll>
__device__ __forceinline__ DStat stream_stats(const T* x, const T* y, const ce::RowLayout& l,
                                              int lane, const Frame& f) {
  constexpr int kN = ce::kVec<T>;
  const uint4* xb = reinterpret_cast<const uint4*>(x + l.head);
  const uint4* yb = reinterpret_cast<const uint4*>(y + l.head);
  DStat st = empty_stat();
  for (int i = lane; i < l.nvec; i += kGroup * kUnroll) {
    uint4 ux[kUnroll], uy[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = i + k * kGroup;
      if (j < l.nvec) {
        ux[k] = xb[j];
        uy[k] = yb[j];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (i + k * kGroup < l.nvec) {
        float xv[kN], yv[kN];
        ce::unpack(ux[k], xv, T{});
        ce::unpack(uy[k], yv, T{});
        accumulate(st, xv, yv, f);
      }
    }
  }
  for (int e = lane; e < l.head + l.tail; e += kGroup) {
    const int col = ce::extra_col<T>(e, l);
    const float xv[1] = {to_float(x[col])}, yv[1] = {to_float(y[col])};
    accumulate(st, xv, yv, f);
  }
  return st;
}

// Writes the gradient over x; label: the row's label column in x, or -1.
template <typename T, int kGroup, int kUnroll>
__device__ __forceinline__ void stream_grad(T* x, const T* y, const ce::RowLayout& l, int lane,
                                            int label, const DGrad& g) {
  constexpr int kN = ce::kVec<T>;
  uint4* xb = reinterpret_cast<uint4*>(x + l.head);
  const uint4* yb = reinterpret_cast<const uint4*>(y + l.head);
  for (int i = lane; i < l.nvec; i += kGroup * kUnroll) {
    uint4 ux[kUnroll], uy[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = i + k * kGroup;
      if (j < l.nvec) {
        ux[k] = xb[j];
        uy[k] = yb[j];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = i + k * kGroup;
      if (j < l.nvec) xb[j] = grad_vec<T>(ux[k], uy[k], l.head + j * kN, label, g);
    }
  }
  for (int e = lane; e < l.head + l.tail; e += kGroup) {
    const int col = ce::extra_col<T>(e, l);
    x[col] = from_float<T>(grad_elem(to_float(x[col]), to_float(y[col]), col == label, g));
  }
}

template <typename T, int kGroup>
__device__ __forceinline__ void zero_row(T* x, const ce::RowLayout& l, int lane) {
  uint4* xb = reinterpret_cast<uint4*>(x + l.head);
  for (int i = lane; i < l.nvec; i += kGroup) xb[i] = make_uint4(0, 0, 0, 0);
  for (int e = lane; e < l.head + l.tail; e += kGroup)
    x[ce::extra_col<T>(e, l)] = from_float<T>(0.f);
}

// The row statistics of a group: warp butterflies (kGroup = 32) or a block reduction.
template <int kGroup, int kThreads>
__device__ __forceinline__ DStat group_reduce(DStat st, const Frame& f) {
  if constexpr (kGroup == 32) {
    return warp_reduce(st, f);
  } else {
    __shared__ DStat red[kThreads / 32];
    return block_reduce<kThreads>(st, red, f);
  }
}

// Host: whether two tensors' rows start at the same offset modulo 16 bytes (rows of one length),
// so the vector paths can read student and teacher rows together.
inline bool coaligned(const void* a, const void* b) {
  return (reinterpret_cast<uintptr_t>(a) - reinterpret_cast<uintptr_t>(b)) % 16 == 0;
}

}  // namespace engine::cuda::dl
