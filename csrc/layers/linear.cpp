#include "layers/linear.h"

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

// The amax quantize() takes: of the whole operand (per tensor), or of each row of op(x).
Owned amax_of(const LinearPrecision& p, const Tensor& x, bool transpose, Cut cut) {
  const bool rowwise = p.fp8 == Fp8Recipe::Rowwise;
  Owned amax = empty({rowwise ? (transpose ? x.size(1) : x.size(0)) : 1}, DType::F32, x.device);
  ops::fp8_amax(x, transpose, amax);
  // Per tensor, any cut splits the amax; per row, a cut of op(x)'s rows (x's columns, or its
  // rows with transpose) does.
  const bool partial = rowwise ? cut == (transpose ? Cut::Rows : Cut::Cols) : cut != Cut::None;
  if (p.tp && partial) p.tp->all_reduce(amax, ReduceOp::Max);
  return amax;
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
                    const Tensor& y, const Tensor& addend) {
  if (p.fp8 != Fp8Recipe::Off) {
    const Cuts c = cuts(p);
    const Fp8Operand xq = quantize(p, x.rows(), false, c.x, Fp8Format::E4M3);
    const Fp8Operand wq = quantize(p, weight, false, c.w, Fp8Format::E4M3);
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
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const Tensor dy2 = dy.rows();
  if (p.fp8 != Fp8Recipe::Off) {
    const Cuts c = cuts(p);
    const Fp8Format g = gradient_format(p.fp8);
    // Per tensor, dy's one amax serves both products.
    Owned dy_amax;
    if (p.fp8 == Fp8Recipe::Tensorwise && dx.data && dweight.data) dy_amax = amax_of(p, dy2, false, c.dy);
    if (dx.data) {  // dx = dy W: b = W^T (in, out), contracted over out
      const Fp8Operand dyq = quantize(p, dy2, false, c.dy, g, dy_amax);
      const Fp8Operand wt = quantize(p, weight, true, c.w, Fp8Format::E4M3);
      ops::fp8_matmul(dyq.q, g, dyq.scale_inv, wt.q, Fp8Format::E4M3, wt.scale_inv, dx.rows(), 0.f);
    }
    if (dweight.data && dy2.size(0) > 0) {  // dW += dy^T x: a = dy^T (out, T), b = x^T (in, T), contracted over T
      const Fp8Operand dyt = quantize(p, dy2, true, c.dy, g, dy_amax);
      const Fp8Operand xt = quantize(p, x.rows(), true, c.x, Fp8Format::E4M3);
      ops::fp8_matmul(dyt.q, g, dyt.scale_inv, xt.q, Fp8Format::E4M3, xt.scale_inv, dweight, 1.f);
    }
  } else {
    if (dx.data) ops::matmul(dy2, false, weight, false, dx.rows(), {});                  // dx = dy W
    if (dweight.data) ops::matmul(dy2, true, x.rows(), false, dweight, {1.f, 1.f, {}});  // dW += dy^T x
  }
  if (dbias.data) ops::sum_rows(dy2, dbias, 1.f);  // db += sum_t dy
}

}  // namespace engine::layers
