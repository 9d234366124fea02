// Rotary position embedding in place on x (T, NH, D), "rotate half" pairing as csrc/ref/rope.cpp:
// in each of the first rotated_heads heads of row t, dimension i < D/2 pairs with i + D/2 and
// turns by the angle a = pos(t) theta^(-2i/D):
//   forward  (a, b) -> (a cos - b sin, b cos + a sin)
//   backward (a, b) -> (a cos + b sin, b cos - a sin)   (the inverse rotation)
// Angles exactly as the reference: inv_freq = pow(double(theta), -2i/D), angle = pos * inv_freq,
// cos and sin, all in double; they are rounded to f32 once and the rotation runs in f32.
// Grid: persistent, one row per block at a time. For its row a block first computes the D/2
// (cos, sin) pairs into shared memory (two buffers used in turn, so one barrier per row), then
// each thread rotates a pair of packs x[i, i+N) and x[i+D/2, i+D/2+N) of one head. A pack is a
// 16-byte vector (8 bf16 / 4 f32) when D/2 is a multiple of it and x is 16-byte aligned, else
// one element. A thread loads its first pair before the angles are computed, hiding the load.
// Memory: x bf16 or f32 (T, NH, D); positions i32 (T). Heads past rotated_heads are not touched.
// Limits: D even and D <= 2048 (shared memory), T < 2^31.
#include "cuda/rope/rope.cuh"

#include <algorithm>
#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"

namespace engine::cuda {

constexpr int kMaxThreads = 512;
constexpr int kMaxHeadDim = 2048;

template <typename T>
struct RopeParams {
  T* x;                      // (rows, heads, head_dim), rotated in place
  const int32_t* positions;  // (rows)
  int64_t rows;
  int heads;     // NH
  int head_dim;  // D
  int half;      // D / 2
  int rotated;   // heads [0, rotated) are rotated
  float theta;
  double direction;  // +1 forward, -1 backward (the sign of sin)
};

template <typename T, int N>
static __device__ __forceinline__ void rotate(T* a_ptr, T* b_ptr, const float (&a)[N],
                                              const float (&b)[N], const float2* cs) {
  float oa[N], ob[N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float2 r = cs[j];  // (cos, direction * sin)
    oa[j] = a[j] * r.x - b[j] * r.y;
    ob[j] = b[j] * r.x + a[j] * r.y;
  }
  store_pack<T, N>(a_ptr, oa);
  store_pack<T, N>(b_ptr, ob);
}

// Dynamic shared memory: inv_freq (half doubles), then (cos, sin) (2 x half float2).
template <typename T, int N>
static __global__ void __launch_bounds__(kMaxThreads) rope_kernel(const RopeParams<T> p) {
  extern __shared__ double inv_freq[];
  float2* cs_buf = reinterpret_cast<float2*>(inv_freq + p.half);
  // Each thread fills and later reads the same entries i: no barrier needed here.
  for (int i = threadIdx.x; i < p.half; i += blockDim.x)
    inv_freq[i] = pow(static_cast<double>(p.theta),
                      -2.0 * static_cast<double>(i) / static_cast<double>(p.head_dim));
  const int packs_per_head = p.half / N;
  const int work = p.rotated * packs_per_head;  // pack pairs per row
  const int64_t row_elems = static_cast<int64_t>(p.heads) * p.head_dim;
  int phase = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    T* xr = p.x + row * row_elems;
    // The first pair of this thread, loaded while the angles are computed.
    const int q0 = threadIdx.x;
    T *a0 = nullptr, *b0 = nullptr;
    float a[N], b[N];
    if (q0 < work) {
      const int h = q0 / packs_per_head, i0 = (q0 - h * packs_per_head) * N;
      a0 = xr + h * p.head_dim + i0;
      b0 = a0 + p.half;
      load_pack<T, N>(a0, a);
      load_pack<T, N>(b0, b);
    }
    float2* cs = cs_buf + (phase & 1) * p.half;
    ++phase;
    const double pos = static_cast<double>(p.positions[row]);
    for (int i = threadIdx.x; i < p.half; i += blockDim.x) {
      double s, c;
      sincos(pos * inv_freq[i], &s, &c);
      cs[i] = make_float2(static_cast<float>(c), static_cast<float>(p.direction * s));
    }
    // Buffers alternate: cs is rewritten two rows later, after every thread passed the barrier
    // of the row in between, so after it finished reading it.
    __syncthreads();
    if (q0 < work) {
      const int h = q0 / packs_per_head, i0 = (q0 - h * packs_per_head) * N;
      rotate<T, N>(a0, b0, a, b, cs + i0);
    }
    for (int q = q0 + blockDim.x; q < work; q += blockDim.x) {
      const int h = q / packs_per_head, i0 = (q - h * packs_per_head) * N;
      T* ap = xr + h * p.head_dim + i0;
      T* bp = ap + p.half;
      float aa[N], bb[N];
      load_pack<T, N>(ap, aa);
      load_pack<T, N>(bp, bb);
      rotate<T, N>(ap, bp, aa, bb, cs + i0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

template <typename T, int N>
static void launch(const RopeParams<T>& p, int threads, const char* op) {
  auto kernel = rope_kernel<T, N>;
  const size_t smem = static_cast<size_t>(p.half) * (sizeof(double) + 2 * sizeof(float2));
  const int grid = persistent_grid(kernel, threads, smem, p.rows);
  kernel<<<grid, threads, smem, stream()>>>(p);
  check_launch(op);
}

static void rope_apply(const Tensor& x, const Tensor& positions, int rotated_heads, float theta,
                       double direction, const char* op, const char* xname) {
  expect_cuda_float(x, op, xname);
  ENSURE(x.ndim() == 3, op, ": ", xname, " must be 3-D (T, NH, D), got shape ", x.shape.str());
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2);
  expect_cuda(positions, DType::I32, {rows}, op, "positions");
  ENSURE(d % 2 == 0, op, ": head_dim of ", xname, " ", x.shape.str(), " must be even");
  ENSURE(d <= kMaxHeadDim, op, ": head_dim ", d, " is larger than the kernel takes (", kMaxHeadDim,
         ")");
  ENSURE(rotated_heads >= 0 && rotated_heads <= heads, op, ": rotated_heads = ", rotated_heads,
         " not in [0, ", heads, "] for ", xname, " ", x.shape.str());
  ENSURE(theta > 0.f, op, ": theta must be > 0, got ", theta);
  ENSURE(rows < (int64_t{1} << 31) && heads * d < (int64_t{1} << 31), op, ": ", xname, " ",
         x.shape.str(), " is too large");
  if (rows == 0 || rotated_heads == 0 || d == 0) return;

  const int half = static_cast<int>(d / 2);
  const int vec = static_cast<int>(16 / dtype_size(x.dtype));
  const bool use_vec = half % vec == 0 && aligned16(x.data);
  const int n = use_vec ? vec : 1;
  const int64_t work = static_cast<int64_t>(rotated_heads) * (half / n);
  const int threads =
      static_cast<int>(std::clamp<int64_t>(ceil_div(work, 32) * 32, 32, kMaxThreads));
  float_switch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    RopeParams<T> p{};
    p.x = static_cast<T*>(x.data);
    p.positions = static_cast<const int32_t*>(positions.data);
    p.rows = rows;
    p.heads = static_cast<int>(heads);
    p.head_dim = static_cast<int>(d);
    p.half = half;
    p.rotated = rotated_heads;
    p.theta = theta;
    p.direction = direction;
    if (use_vec)
      launch<T, 16 / sizeof(T)>(p, threads, op);
    else
      launch<T, 1>(p, threads, op);
  });
}

void rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads, float theta) {
  rope_apply(x, positions, rotated_heads, theta, +1.0, "rope_forward", "x");
}

void rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads, float theta) {
  rope_apply(dx, positions, rotated_heads, theta, -1.0, "rope_backward", "dx");
}

}  // namespace engine::cuda
