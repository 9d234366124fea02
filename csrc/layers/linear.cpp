#include "layers/linear.h"

#include "ops/gemm.h"

namespace engine::layers {

void linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                    const Tensor& addend) {
  ops::MatmulOptions o;
  o.bias = bias;
  if (addend.data) {
    o.addend = addend.rows();
    o.beta = 1.f;
  }
  ops::matmul(x.rows(), false, weight, true, y.rows(), o);
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                     const Tensor& dweight, const Tensor& dbias) {
  const Tensor dy2 = dy.rows();
  if (dx.data) ops::matmul(dy2, false, weight, false, dx.rows(), {});        // dx = dy W
  if (dweight.data) ops::matmul(dy2, true, x.rows(), false, dweight, {1.f, 1.f, {}});  // dW += dy^T x
  if (dbias.data) ops::sum_rows(dy2, dbias, 1.f);                            // db += sum_t dy
}

}  // namespace engine::layers
