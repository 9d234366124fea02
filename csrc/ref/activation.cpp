// Pointwise activations, element by element in double.
//   gelu (tanh form): u = c (x + 0.044715 x^3), c = sqrt(2/pi);  y = 0.5 x (1 + tanh u)
//     dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 * 0.044715 x^2)
//     computed as s = sigmoid(2u) = 0.5 (1 + tanh u): y = x s, dy/dx = s (1 + 2x (1 - s) c (1 +
//     3 * 0.044715 x^2)); 1 + tanh u cancels in the negative tail (x = -6.4: 2e-4 relative error
//     in double, and exactly 0 below x = -7), where the sigmoid keeps full precision.
//   swiglu: row t of gate_up is [g | u] (F each);  y = silu(g) u,  silu(g) = g sigmoid(g)
//     dg = dy u sigmoid(g) (1 + g (1 - sigmoid(g))),  du = dy silu(g)
// Every output element depends only on inputs at the same (row, column), read before the write,
// so y may alias x and dx may alias dy (and dgate_up may alias gate_up).
// The shared checks ran before (ops/activation.cpp); the reference takes f32 or f64.
#include "ops/activation.h"
#include "ops/fp8.h"

#include <cmath>

#include "ref/common.h"

namespace engine::ref {
namespace {

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;
constexpr int64_t kParallelElems = 1 << 15;

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// gate_up (R, 2F) and y (R, F) with the same leading dimensions (checked); returns {R, F}.
std::pair<int64_t, int64_t> swiglu_shape(const Tensor& gate_up, const Tensor& y) {
  const int64_t f = gate_up.size(-1) / 2;
  return {f ? y.numel() / f : 0, f};
}

// out[i] = f(x[i]) (f: the activation), or with dy: out[i] = dy[i] f(x[i]) (f: its derivative).
template <typename F>
void map_elements(const char* op, const Tensor& x, const Tensor* dy, const Tensor& out, F&& f) {
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.ptr<T>(), *pdy = dy ? dy->ptr<T>() : nullptr;
    T* po = out.ptr<T>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) {
      const double v = f(static_cast<double>(px[i]));
      po[i] = static_cast<T>(pdy ? pdy[i] * v : v);
    }
  });
}

double gelu_s(double v) { return sigmoid(2.0 * kGeluC * (v + kGeluA * v * v * v)); }

}  // namespace

void gelu_forward(const Tensor& x, const Tensor& y) {
  map_elements("gelu_forward", x, nullptr, y, [](double v) { return v * gelu_s(v); });
}

void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  map_elements("gelu_backward", x, &dy, dx, [](double v) {
    const double sg = gelu_s(v);
    return sg * (1.0 + 2.0 * v * (1.0 - sg) * kGeluC * (1.0 + 3.0 * kGeluA * v * v));
  });
}

void gelu_erf_forward(const Tensor& x, const Tensor& y) {
  map_elements("gelu_erf_forward", x, nullptr, y, [](double v) { return 0.5 * v * (1.0 + std::erf(v * M_SQRT1_2)); });
}

void gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  map_elements("gelu_erf_backward", x, &dy, dx, [](double v) {
    return 0.5 * (1.0 + std::erf(v * M_SQRT1_2)) + v * std::exp(-0.5 * v * v) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
  });
}

void swiglu_forward(const Tensor& gate_up, const Tensor& y, const Tensor& amax) {
  const char* op = "swiglu_forward";
  auto [rows, f] = swiglu_shape(gate_up, y);
  float_switch(gate_up.dtype, op, "gate_up", [&](auto tag) {
    using T = decltype(tag);
    const T* gu = gate_up.ptr<T>();
    T* py = y.ptr<T>();
#pragma omp parallel for schedule(static) if (rows * f > kParallelElems)
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < f; ++j) {
        const double g = gu[t * 2 * f + j], u = gu[t * 2 * f + f + j];
        py[t * f + j] = static_cast<T>(g * sigmoid(g) * u);
      }
  });
  if (amax.data) ref::fp8_amax(y.view({y.numel(), 1}), false, amax);
}

void swiglu_backward(const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up, const Tensor& amax) {
  const char* op = "swiglu_backward";
  auto [rows, f] = swiglu_shape(gate_up, dy);
  float_switch(gate_up.dtype, op, "gate_up", [&](auto tag) {
    using T = decltype(tag);
    const T *gu = gate_up.ptr<T>(), *pdy = dy.ptr<T>();
    T* dgu = dgate_up.ptr<T>();
#pragma omp parallel for schedule(static) if (rows * f > kParallelElems)
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < f; ++j) {
        const double g = gu[t * 2 * f + j], u = gu[t * 2 * f + f + j], d = pdy[t * f + j];
        const double s = sigmoid(g);
        dgu[t * 2 * f + j] = static_cast<T>(d * u * s * (1.0 + g * (1.0 - s)));
        dgu[t * 2 * f + f + j] = static_cast<T>(d * g * s);
      }
  });
  if (amax.data) ref::fp8_amax(dgate_up.view({dgate_up.numel(), 1}), false, amax);
}

}  // namespace engine::ref
