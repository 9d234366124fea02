// Pointwise MLP activations, f32 math on bf16 or f32 tensors, grid-stride over 16-byte packs.
//   gelu (tanh form; the formulas and their fast / accurate variants: gelu.cuh; bf16 tensors take
//     the fast exp / divide, f32 the accurate)
//   swiglu: row t of gate_up is [g | u] (F each), y = silu(g) u, silu(g) = g sig(g)
//     dg = dy u sig(g) (1 + g (1 - sig(g))),  du = dy silu(g)
// Layout: gelu sees the tensor as a flat array (packs of 8 bf16 / 4 f32 when every pointer is
// 16-byte aligned, the n % N tail element-wise; else all element-wise), two packs per thread in
// flight, one pass of a plain grid (no thread loops more than once). swiglu walks (row, pack)
// of y with the row and column advanced incrementally (no division in the loop); packs when F is
// a multiple of the vector width and pointers aligned.
// Every output element depends only on the inputs at its own index, read by the same thread
// before the write: y may alias x, dx may alias dy, dgate_up may alias gate_up.
// The shared preconditions ran before (ops/activation.cpp); the launchers check the dtype they
// take: every tensor of a call bf16, or every one f32.
#include "ops/activation.h"

#include "cuda/activation/gelu.cuh"

#include <algorithm>
#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"
#include "cuda/fp8/amax.cuh"

namespace engine::cuda {

constexpr int kThreads = 256;
constexpr int kMapUnroll = 2;  // gelu: packs per thread, loaded together

// 1 / (1 + e^-z): fast intrinsics for bf16 outputs, IEEE exp and division for f32.
template <typename T>
static __device__ __forceinline__ float sigmoid_for(float z) {
  return sigmoid<sizeof(T) == 2>(z);
}

struct GeluForward {
  template <typename T>
  static __device__ __forceinline__ float apply(float x, float /*unused*/) {
    return gelu::forward<sizeof(T) == 2>(x);
  }
};

struct GeluBackward {  // (dy, x) -> dx
  template <typename T>
  static __device__ __forceinline__ float apply(float dy, float x) {
    return dy * gelu::grad<sizeof(T) == 2>(x);
  }
};

// The exact (erf) GELU and its derivative in f32 with the library's erff and expf.
struct GeluErfForward {
  template <typename T>
  static __device__ __forceinline__ float apply(float x, float /*unused*/) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  }
};

struct GeluErfBackward {  // (dy, x) -> dx
  template <typename T>
  static __device__ __forceinline__ float apply(float dy, float x) {
    return dy * (0.5f * (1.f + erff(x * 0.70710678118654752f)) + x * expf(-0.5f * x * x) * 0.39894228040143268f);
  }
};

// out = Op(a, b) element-wise over n elements (b unused when !kBinary).
template <typename T, int N, typename Op, bool kBinary>
static __device__ __forceinline__ void map_pack(const T* a, const T* b, T* out, int64_t i) {
  float va[N], vb[N], o[N];
  load_pack<T, N>(a + i, va);
  if constexpr (kBinary) {
    load_pack<T, N>(b + i, vb);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) vb[j] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) o[j] = Op::template apply<T>(va[j], vb[j]);
  store_pack<T, N>(out + i, o);
}

template <typename T, int N, int U, typename Op, bool kBinary>
static __global__ void __launch_bounds__(kThreads)
    map_kernel(const T* a, const T* b, T* out, int64_t n) {
  wait_for_previous_kernel();
  const int64_t packs = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t q = tid;
  // U packs per iteration, all loaded before any is stored (loads in flight; aliasing out with a
  // or b is harmless because each element is read before it is written); the last iteration's
  // packs past the end are skipped, not run one after another.
  for (; q < packs; q += U * stride) {
    Pack<T, N> ra[U], rb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (q + u * stride < packs) {
        ra[u] = *reinterpret_cast<const Pack<T, N>*>(a + (q + u * stride) * N);
        if constexpr (kBinary)
          rb[u] = *reinterpret_cast<const Pack<T, N>*>(b + (q + u * stride) * N);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (q + u * stride < packs) {
        float va[N], vb[N], o[N];
        unpack<T, N>(ra[u], va);
        if constexpr (kBinary) {
          unpack<T, N>(rb[u], vb);
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) vb[j] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < N; ++j) o[j] = Op::template apply<T>(va[j], vb[j]);
        store_pack<T, N>(out + (q + u * stride) * N, o);
      }
    }
  }
  if constexpr (N > 1) {
    const int64_t i = packs * N + tid;  // the n % N tail
    if (i < n) map_pack<T, 1, Op, kBinary>(a, b, out, i);
  }
}

// Calls f(row, col) for the (row, pack) pairs of this thread of a grid-stride loop over a
// (rows, per_row) grid of packs, the row and column advanced incrementally (no division in the
// loop).
template <typename F>
static __device__ __forceinline__ void for_each_row_pack(int64_t rows, int64_t per_row, F&& f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t srow = stride / per_row, scol = stride % per_row;
  int64_t row = start / per_row, col = start % per_row;
  while (row < rows) {
    f(row, col);
    row += srow;
    col += scol;
    if (col >= per_row) {
      col -= per_row;
      ++row;
    }
  }
}

// y (rows, f) = silu(g) u with gate_up (rows, 2f) = [g | u]; N elements per pack along f.
template <typename T, int N>
static __global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const T* gate_up, T* y, int64_t rows, int64_t f, float* amax) {
  wait_for_previous_kernel();
  unsigned m = 0;
  for_each_row_pack(rows, f / N, [&](int64_t row, int64_t col) {
    const T* g = gate_up + row * 2 * f + col * N;
    float vg[N], vu[N], o[N];
    load_pack<T, N>(g, vg);
    load_pack<T, N>(g + f, vu);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      o[j] = vg[j] * sigmoid_for<T>(vg[j]) * vu[j];
      m = max(m, stored_magnitude<T>(o[j]));
    }
    store_pack<T, N>(y + row * f + col * N, o);
  });
  commit_amax(m, amax);
}

template <typename T, int N>
static __global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* dy, const T* gate_up, T* dgate_up, int64_t rows, int64_t f, float* amax) {
  wait_for_previous_kernel();
  unsigned m = 0;
  for_each_row_pack(rows, f / N, [&](int64_t row, int64_t col) {
    const int64_t gi = row * 2 * f + col * N;
    float vd[N], vg[N], vu[N], dg[N], du[N];
    load_pack<T, N>(dy + row * f + col * N, vd);
    load_pack<T, N>(gate_up + gi, vg);
    load_pack<T, N>(gate_up + gi + f, vu);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float s = sigmoid_for<T>(vg[j]);
      dg[j] = vd[j] * vu[j] * s * (1.f + vg[j] * (1.f - s));
      du[j] = vd[j] * vg[j] * s;
      m = max(m, max(stored_magnitude<T>(dg[j]), stored_magnitude<T>(du[j])));
    }
    store_pack<T, N>(dgate_up + gi, dg);
    store_pack<T, N>(dgate_up + gi + f, du);
  });
  commit_amax(m, amax);
}

// ---------------------------------------------------------------------------------------------
// Host side.

template <typename Op, bool kBinary>
static void launch_map(const Tensor& a, const Tensor* b, const Tensor& out, const char* op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool vec = aligned16(a.data) && aligned16(out.data) && (!b || aligned16(b->data));
  float_switch(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const T* pa = static_cast<const T*>(a.data);
    const T* pb = b ? static_cast<const T*>(b->data) : nullptr;
    T* po = static_cast<T*>(out.data);
    // One pass of kMapUnroll packs per thread over the tensor, at least one block (enough
    // threads for the n % V tail). This plain grid, blocks scheduled as others finish, is faster
    // than one wave of blocks striding over the tensor (figures: docs/PERF.md).
    const int64_t items = vec ? n / V : n;
    const auto grid = static_cast<unsigned>(
        std::max<int64_t>(1, ceil_div(ceil_div(items, kMapUnroll), kThreads)));
    if (vec)
      launch_dependent(map_kernel<T, V, kMapUnroll, Op, kBinary>, grid, kThreads, 0, pa, pb, po, n);
    else
      launch_dependent(map_kernel<T, 1, kMapUnroll, Op, kBinary>, grid, kThreads, 0, pa, pb, po, n);
    check_launch(op);
  });
}

// t in bf16 or f32 (the other tensors of the call have its dtype: ops/activation.cpp).
static void expect_float(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
         dtype_name(t.dtype), ", expected bf16 or f32");
}

void gelu_forward(const Tensor& x, const Tensor& y) {
  const char* op = "gelu_forward";
  expect_float(x, op, "x");
  launch_map<GeluForward, false>(x, nullptr, y, op);
}

void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const char* op = "gelu_backward";
  expect_float(x, op, "x");
  launch_map<GeluBackward, true>(dy, &x, dx, op);
}

void gelu_erf_forward(const Tensor& x, const Tensor& y) {
  const char* op = "gelu_erf_forward";
  expect_float(x, op, "x");
  launch_map<GeluErfForward, false>(x, nullptr, y, op);
}

void gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const char* op = "gelu_erf_backward";
  expect_float(x, op, "x");
  launch_map<GeluErfBackward, true>(dy, &x, dx, op);
}

// gate_up (..., 2F) and y (..., F) with equal leading dimensions (checked); gate_up in bf16 or
// f32; returns {rows, F}.
static std::pair<int64_t, int64_t> swiglu_shape(const Tensor& gate_up, const Tensor& y,
                                                const char* op) {
  expect_float(gate_up, op, "gate_up");
  const int64_t f = gate_up.size(-1) / 2;
  return {f ? y.numel() / f : 0, f};
}

void swiglu_forward(const Tensor& gate_up, const Tensor& y, const Tensor& amax) {
  const char* op = "swiglu_forward";
  auto [rows, f] = swiglu_shape(gate_up, y, op);
  float* pa = zero_amax(amax);
  if (rows == 0 || f == 0) return;
  float_switch(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const T* gu = static_cast<const T*>(gate_up.data);
    T* py = static_cast<T*>(y.data);
    const bool vec = f % V == 0 && aligned16(gu) && aligned16(py);
    const unsigned grid = stream_blocks(rows * (vec ? f / V : f), kThreads);
    if (vec)
      launch_dependent(swiglu_forward_kernel<T, V>, grid, kThreads, 0, gu, py, rows, f, pa);
    else
      launch_dependent(swiglu_forward_kernel<T, 1>, grid, kThreads, 0, gu, py, rows, f, pa);
    check_launch(op);
  });
}

void swiglu_backward(const Tensor& dy, const Tensor& gate_up, const Tensor& dgate_up, const Tensor& amax) {
  const char* op = "swiglu_backward";
  auto [rows, f] = swiglu_shape(gate_up, dy, op);
  float* pa = zero_amax(amax);
  if (rows == 0 || f == 0) return;
  float_switch(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const T* pdy = static_cast<const T*>(dy.data);
    const T* gu = static_cast<const T*>(gate_up.data);
    T* dgu = static_cast<T*>(dgate_up.data);
    const bool vec = f % V == 0 && aligned16(pdy) && aligned16(gu) && aligned16(dgu);
    const unsigned grid = stream_blocks(rows * (vec ? f / V : f), kThreads);
    if (vec)
      launch_dependent(swiglu_backward_kernel<T, V>, grid, kThreads, 0, pdy, gu, dgu, rows, f, pa);
    else
      launch_dependent(swiglu_backward_kernel<T, 1>, grid, kThreads, 0, pdy, gu, dgu, rows, f, pa);
    check_launch(op);
  });
}

}  // namespace engine::cuda
