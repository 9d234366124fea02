// Whole-tensor operations. Values are read into a compute type (float for f32 and bf16, double
// for f64), so an f32 add is the plain IEEE single-precision add; scale_inplace and the
// reductions use double. bf16 results round to nearest even (core/dtype.h).
// Operands of one call share dtype and shape, except cast (any two of f32, f64, bf16), and
// copy_columns (any two float dtypes). Reductions accumulate in double over fixed chunks combined
// in order, so they are deterministic whatever the thread count. The shared checks ran before
// (ops/elementwise.cpp); the reference takes f32, f64 or bf16.
#include "ops/elementwise.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "ref/common.h"

namespace engine::ref {
namespace {

constexpr int64_t kParallelElems = 1 << 16;
constexpr int64_t kChunk = 4096;  // reduction chunk: fixed, so the sum order never changes

template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T> Compute<T> load(T v) { return static_cast<Compute<T>>(v); }
template <typename T, typename V> T store(V v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16(static_cast<float>(v));
  else return static_cast<T>(v);
}

// f(T{}) for f32, f64 or bf16.
template <typename F>
decltype(auto) any_float_switch(DType dtype, const char* op, const char* name, F&& f) {
  if (dtype == DType::BF16) return std::forward<F>(f)(bf16{});
  ENSURE(dtype == DType::F32 || dtype == DType::F64, op, ": ", name, " is ", dtype_name(dtype),
         ", expected f32, f64 or bf16");
  return float_switch(dtype, op, name, std::forward<F>(f));
}

// Sum of f(x_i) in double: chunks of kChunk in parallel, chunk partials added in order.
template <typename T, typename F>
double reduce(const T* x, int64_t n, F f) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (n > kParallelElems)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
      s += f(static_cast<double>(load(x[i])));
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* op = "add";
  any_float_switch(a.dtype, op, "a", [&](auto tag) {
    using T = decltype(tag);
    const T *pa = a.ptr<T>(), *pb = b.ptr<T>();
    T* po = out.ptr<T>();
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) po[i] = store<T>(load(pa[i]) + load(pb[i]));
  });
}

void add_inplace(const Tensor& acc, const Tensor& x) { add(acc, x, acc); }

void scale_inplace(const Tensor& x, double s) {
  const char* op = "scale_inplace";
  any_float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    T* px = x.ptr<T>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) px[i] = store<T>(static_cast<double>(load(px[i])) * s);
  });
}

void cast(const Tensor& src, const Tensor& dst) {
  const char* op = "cast";
  any_float_switch(src.dtype, op, "src", [&](auto stag) {
    using S = decltype(stag);
    any_float_switch(dst.dtype, op, "dst", [&](auto dtag) {
      using D = decltype(dtag);
      const S* ps = src.ptr<S>();
      D* pd = dst.ptr<D>();
      const int64_t n = src.numel();
      // Through double: exact for every source value, so each result rounds once (f64 -> bf16
      // rounds to f32 first, the one conversion that may round twice).
#pragma omp parallel for schedule(static) if (n > kParallelElems)
      for (int64_t i = 0; i < n; ++i) pd[i] = store<D>(static_cast<double>(load(ps[i])));
    });
  });
}

double sum(const Tensor& x) {
  return any_float_switch(x.dtype, "sum", "x", [&](auto tag) {
    using T = decltype(tag);
    return reduce(x.ptr<T>(), x.numel(), [](double v) { return v; });
  });
}

double sum_squares(const Tensor& x) {
  return any_float_switch(x.dtype, "sum_squares", "x", [&](auto tag) {
    using T = decltype(tag);
    return reduce(x.ptr<T>(), x.numel(), [](double v) { return v * v; });
  });
}

int64_t count_nonfinite(const Tensor& x) {
  return any_float_switch(x.dtype, "count_nonfinite", "x", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.ptr<T>();
    const int64_t n = x.numel();
    int64_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) count += std::isfinite(load(px[i])) ? 0 : 1;
    return count;
  });
}

void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width,
                  bool accumulate) {
  const char* op = "copy_columns";
  any_float_switch(src.dtype, op, "src", [&](auto stag) {
    using S = decltype(stag);
    any_float_switch(dst.dtype, op, "dst", [&](auto dtag) {
      using D = decltype(dtag);
      using A = std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>, double, float>;
      const int64_t rows = src.size(0), cs = src.size(1), cd = dst.size(1);
      const S* ps = src.ptr<S>() + src_col;
      D* pd = dst.ptr<D>() + dst_col;
#pragma omp parallel for schedule(static) if (rows * width > kParallelElems)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < width; ++c) {
          const A v = static_cast<A>(load(ps[r * cs + c]));
          D& d = pd[r * cd + c];
          d = store<D>(accumulate ? static_cast<A>(load(d)) + v : v);
        }
    });
  });
}

}  // namespace engine::ref

