#include "layers/linear.h"

#include <utility>

#include "core/buffer.h"
#include "ops/fp8.h"
#include "ops/gemm.h"

namespace engine::layers {
namespace {

using ops::Fp8Format;

// Which of a stored matrix's dimensions the tensor-parallel split cuts (layers/common.h).
enum class Cut { None, Rows, Cols };

// op(x) (x, or x^T with transpose) in FP8: its bytes and the inverse scales the product takes,
// one for the tensor or one a row of op(x).
struct Fp8Operand {
  Owned q, scale_inv;
};

// Per tensor, any cut splits the amax; per row, a cut of op(x)'s rows (x's columns, or its rows
// with transpose) does.
bool partial_amax(const LinearPrecision& p, bool transpose, Cut cut) {
  if (!p.tp) return false;
  return p.fp8 == Fp8Recipe::Rowwise ? cut == (transpose ? Cut::Rows : Cut::Cols) : cut != Cut::None;
}

// The amax quantize() takes: of the whole operand (per tensor), or of each row of op(x).
Owned amax_of(const LinearPrecision& p, const Tensor& x, bool transpose, Cut cut) {
  const bool rowwise = p.fp8 == Fp8Recipe::Rowwise;
  Owned amax = empty({rowwise ? (transpose ? x.size(1) : x.size(0)) : 1}, DType::F32, x.device);
  ops::fp8_amax(x, transpose, amax);
  if (partial_amax(p, transpose, cut)) p.tp->all_reduce(amax, ReduceOp::Max);
  return amax;
}

// x's per-tensor amax through a slot the caller holds (tensorwise; the header): what the slot
// has, reduced over the group where it is not yet, or computed into it.
const Tensor& shared_amax(const LinearPrecision& p, const Tensor& x, Cut cut, Fp8Amax& slot) {
  if (!slot) {
    slot = {amax_of(p, x, false, cut), true};
  } else if (!slot.reduced) {
    if (partial_amax(p, false, cut)) p.tp->all_reduce(slot.t, ReduceOp::Max);
    slot.reduced = true;
  }
  return slot.t;
}

// amax: from amax_of (a per-tensor one serves x and x^T alike), or undefined to compute it here.
Fp8Operand quantize(const LinearPrecision& p, const Tensor& x, bool transpose, Cut cut, Fp8Format format,
                    const Tensor& amax = {}) {
  Owned own;
  const Tensor& a = amax.data ? amax : (own = amax_of(p, x, transpose, cut)).t;
  const int64_t rows = transpose ? x.size(1) : x.size(0), cols = transpose ? x.size(0) : x.size(1);
  Fp8Operand out{empty({rows, cols}, DType::U8, x.device), empty(a.shape, DType::F32, x.device)};
  ops::fp8_quantize(x, transpose, a, format, out.q, out.scale_inv);
  return out;
}

// Both layouts of x from one read: {x, x^T} in FP8; amax and amax_t as quantize() takes them.
std::pair<Fp8Operand, Fp8Operand> quantize_pair(const LinearPrecision& p, const Tensor& x, Cut cut, Fp8Format format,
                                                const Tensor& amax) {
  Owned own, own_t;
  const Tensor& a = amax.data ? amax : (own = amax_of(p, x, false, cut)).t;
  const Tensor& at = p.fp8 == Fp8Recipe::Tensorwise ? a : (own_t = amax_of(p, x, true, cut)).t;
  Fp8Operand q{empty(x.shape, DType::U8, x.device), empty(a.shape, DType::F32, x.device)};
  Fp8Operand qt{empty({x.size(1), x.size(0)}, DType::U8, x.device), empty(at.shape, DType::F32, x.device)};
  ops::fp8_quantize_pair(x, a, at, format, q.q, q.scale_inv, qt.q, qt.scale_inv);
  return {std::move(q), std::move(qt)};
}

Fp8Format gradient_format(Fp8Recipe r) { return r == Fp8Recipe::Rowwise ? Fp8Format::E4M3 : Fp8Format::E5M2; }

// The cuts of x (T, in), W (out, in) and dy (T, out).
struct Cuts {
  Cut x = Cut::None, w = Cut::None, dy = Cut::None;
};
Cuts cuts(const LinearPrecision& p) {
  if (!p.tp || p.split == TpSplit::None) return {};
  if (p.split == TpSplit::Out) return {Cut::None, Cut::Rows, Cut::Cols};
  return {Cut::Cols, Cut::Cols, Cut::None};
}

}  // namespace

void linear_forward(const LinearPrecision& p, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& y, const Tensor& addend, LinearAmaxes* saved) {
  if (p.fp8 != Fp8Recipe::Off) {
    const Cuts c = cuts(p);
    const bool share = saved && p.fp8 == Fp8Recipe::Tensorwise;
    const Tensor x2 = x.rows();
    const Fp8Operand xq = quantize(p, x2, false, c.x, Fp8Format::E4M3, share ? shared_amax(p, x2, c.x, saved->x) : Tensor{});
    if (share) saved->w = {};  // the weight's amax anew each forward (the optimizer changed it)
    const Fp8Operand wq = quantize(p, weight, false, c.w, Fp8Format::E4M3, share ? shared_amax(p, weight, c.w, saved->w) : Tensor{});
    ops::Fp8MatmulOptions o(addend.data ? 1.f : 0.f);
    if (addend.data) o.addend = addend.rows();
    o.bias = bias;
    ops::fp8_matmul(xq.q, Fp8Format::E4M3, xq.scale_inv, wq.q, Fp8Format::E4M3, wq.scale_inv, y.rows(), o);
    return;
  }
  ops::MatmulOptions o;
  o.bias = bias;
  if (addend.data) {
    o.addend = addend.rows();
    o.beta = 1.f;
  }
  ops::matmul(x.rows(), false, weight, true, y.rows(), o);
}

void linear_backward(const LinearPrecision& p, const Tensor& dy, const Tensor& x, const Tensor& weight,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const LinearAmaxes* saved,
                     Fp8Amax* dy_amax) {
  const Tensor dy2 = dy.rows();
  if (p.fp8 != Fp8Recipe::Off) {
    const Cuts c = cuts(p);
    const Fp8Format g = gradient_format(p.fp8);
    const bool tensorwise = p.fp8 == Fp8Recipe::Tensorwise;
    const bool wgrad = dweight.data && dy2.size(0) > 0;
    // Per tensor, dy's one amax serves both products (and, through dy_amax, a later call's).
    Fp8Amax own;
    Tensor dya;
    if (tensorwise && (dy_amax || (dx.data && wgrad))) dya = shared_amax(p, dy2, c.dy, dy_amax ? *dy_amax : own);
    const auto saved_amax = [&](const Fp8Amax LinearAmaxes::*m) {
      return tensorwise && saved && saved->*m ? (saved->*m).t.t : Tensor{};
    };
    // dx = dy W: b = W^T (in, out), contracted over out; dW += dy^T x: a = dy^T (out, T),
    // b = x^T (in, T), contracted over T.
    std::pair<Fp8Operand, Fp8Operand> dyq;
    if (dx.data && wgrad) dyq = quantize_pair(p, dy2, c.dy, g, dya);
    if (dx.data) {
      if (!wgrad) dyq.first = quantize(p, dy2, false, c.dy, g, dya);
      const Fp8Operand wt = quantize(p, weight, true, c.w, Fp8Format::E4M3, saved_amax(&LinearAmaxes::w));
      ops::fp8_matmul(dyq.first.q, g, dyq.first.scale_inv, wt.q, Fp8Format::E4M3, wt.scale_inv, dx.rows(), 0.f);
    }
    if (wgrad) {
      if (!dx.data) dyq.second = quantize(p, dy2, true, c.dy, g, dya);
      const Fp8Operand xt = quantize(p, x.rows(), true, c.x, Fp8Format::E4M3, saved_amax(&LinearAmaxes::x));
      ops::fp8_matmul(dyq.second.q, g, dyq.second.scale_inv, xt.q, Fp8Format::E4M3, xt.scale_inv, dweight, 1.f);
    }
  } else {
    if (dx.data) ops::matmul(dy2, false, weight, false, dx.rows(), {});                  // dx = dy W
    if (dweight.data) ops::matmul(dy2, true, x.rows(), false, dweight, {1.f, 1.f, {}});  // dW += dy^T x
  }
  if (dbias.data) ops::sum_rows(dy2, dbias, 1.f);  // db += sum_t dy
}

}  // namespace engine::layers
