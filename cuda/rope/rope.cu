// Rotary position embedding in place on x (T, NH, D), "rotate half" pairing as csrc/ref/rope.cpp:
// in each of the first rotated_heads heads of row t, dimension i < D/2 pairs with i + D/2 and
// turns by the angle a = pos(t) inv_freq(i), scaled by m:
//   forward  (a, b) -> m (a cos - b sin, b cos + a sin)
//   backward (a, b) -> m (a cos + b sin, b cos - a sin)   (the transposed map)
// Angles as the reference: inv_freq(i) and m by the functions of ops/rope_params.h the reference
// calls, in double (inv_freq once per block, in shared memory), angle = pos * inv_freq in double.
// cos and sin of the angle in a few double fused multiply-adds instead of the library's sincos:
// a = k pi/2 + r with k = rint(a 2/pi) and r by two fmas with pi/2 split in two doubles
// (|r| <= pi/4, error ~1e-16 for any |a| < 2^31), then Taylor polynomials in double (truncation
// < 1e-13), times m in double, and the quadrant of k. Rounded to f32 once, they equalled the
// reference's f32-rounded std::cos / std::sin in all of 3.9M angles sampled on the host with the
// same arithmetic (D 10..2048, theta up to 1e6, |pos| < 2^31; m = 1). The rotation runs in f32.
// Work item: (row, group of kHeadGroup heads, pack p of N dims): a thread asks for the packs
// x[i..] and x[i + D/2..] of the group's heads (2 kHeadGroup vectors in flight), computes the N
// (cos, sin) pairs of its dims i in [pN, pN + N) while they are on the way, rotates and stores. A
// pack is a 16-byte vector (8 bf16 / 4 f32) when D/2 is a multiple of it and x is 16-byte
// aligned, else one element. Consecutive threads take consecutive packs of one half-head: a
// warp's accesses are runs of whole 32-byte sectors. One item per thread, a plain grid: blocks
// start as others finish (faster than a persistent grid whose threads looped over items with the
// next item's loads in flight; figures: docs/PERF.md).
// Memory: x bf16 or f32 (T, NH, D); positions i32 (T). Heads past rotated_heads are not touched;
// each element is read and written by one thread.
// Limits: D even and D <= 2048 (shared memory), T < 2^31.
// The shared preconditions ran before (ops/rope.cpp); the launcher checks what is its own: x in
// bf16 or f32, D within the shared memory, the sizes within 32-bit indices.
#include "ops/rope.h"

#include <algorithm>
#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"

namespace engine::cuda {

constexpr int kThreads = 256;
constexpr int kHeadGroup = 4;  // heads per work item: their loads are in flight together
// Register cap (kThreads x kMinBlocks resident): no spills; uncapped (fewer resident blocks) was
// slower, and so was a tighter cap that spills (figures: docs/PERF.md).
constexpr int kMinBlocks = 3;
constexpr int kMaxHeadDim = 2048;

template <typename T>
struct RopeLaunch {
  T* x;                      // (rows, heads, head_dim), rotated in place
  const int32_t* positions;  // (rows)
  int64_t items;             // rows * groups * packs
  int64_t row_elems;         // heads * head_dim
  int head_dim;              // D
  int half;                  // D / 2
  int rotated;               // heads [0, rotated) are rotated
  int packs;                 // packs per half-head: half / N
  int groups;                // ceil(rotated / kHeadGroup)
  ops::RopeParams rope;      // the frequencies (ops/rope_params.h)
  double scale;              // m, cos and sin are multiplied by it
  float sign;  // +1 forward, -1 backward (the sign of sin)
};

// m cos(a) and m sin(a) rounded to f32, a in double with |a| < 2^31 (see the header comment).
static __device__ __forceinline__ void angle_cos_sin(double a, double m, float& c_out, float& s_out) {
  const double k = rint(a * 0.63661977236758134308);          // 2 / pi
  double r = fma(-k, 1.5707963267948965580e+00, a);           // pi/2, high part (the double)
  r = fma(-k, 6.1232339957367660359e-17, r);                  // pi/2 - high part
  const double r2 = r * r;
  double ps = fma(r2, 1.0 / 6227020800.0, -1.0 / 39916800.0);  // sin: r^13 / 13!, -r^11 / 11!
  ps = fma(r2, ps, 1.0 / 362880.0);
  ps = fma(r2, ps, -1.0 / 5040.0);
  ps = fma(r2, ps, 1.0 / 120.0);
  ps = fma(r2, ps, -1.0 / 6.0);
  const double s = fma(r * r2, ps, r) * m;
  double pc = fma(r2, -1.0 / 87178291200.0, 1.0 / 479001600.0);  // cos: -r^14/14!, r^12/12!
  pc = fma(r2, pc, -1.0 / 3628800.0);
  pc = fma(r2, pc, 1.0 / 40320.0);
  pc = fma(r2, pc, -1.0 / 720.0);
  pc = fma(r2, pc, 1.0 / 24.0);
  pc = fma(r2, pc, -0.5);
  const double c = fma(r2, pc, 1.0) * m;
  // a = k pi/2 + r: quadrant q = k mod 4 (two's complement, so negative k works too).
  const int q = static_cast<int>(static_cast<long long>(k) & 3);
  const float sf = static_cast<float>(s), cf = static_cast<float>(c);
  const float so = (q & 1) ? cf : sf, co = (q & 1) ? sf : cf;
  s_out = q >= 2 ? -so : so;
  c_out = (q == 1 || q == 2) ? -co : co;
}

// One work item per thread, a plain grid (blocks scheduled as others finish): the thread asks
// for its 2 kHeadGroup packs first, computes the N (cos, sin) pairs while they are on the way,
// then rotates and stores. Dynamic shared memory: inv_freq (half doubles). Index: uint32_t when
// the items fit in 31 bits (cheap divisions), else int64_t.
template <typename T, int N, typename Index>
static __global__ void __launch_bounds__(kThreads, kMinBlocks) rope_kernel(const RopeLaunch<T> p) {
  extern __shared__ double inv_freq[];
  for (int i = threadIdx.x; i < p.half; i += blockDim.x)
    inv_freq[i] = ops::rope_inv_freq(p.rope, i, p.head_dim);
  wait_for_previous_kernel();  // the angles' table is computed while the kernel ahead finishes
  __syncthreads();
  const Index item = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= static_cast<Index>(p.items)) return;
  const Index rest = item / static_cast<Index>(p.packs);
  const int i0 = static_cast<int>(item - rest * static_cast<Index>(p.packs)) * N;
  const Index row = rest / static_cast<Index>(p.groups);
  const int h0 = static_cast<int>(rest - row * static_cast<Index>(p.groups)) * kHeadGroup;
  const int hn = min(kHeadGroup, p.rotated - h0);
  T* const a_ptr =
      p.x + static_cast<int64_t>(row) * p.row_elems + static_cast<int64_t>(h0) * p.head_dim + i0;
  Pack<T, N> ra[kHeadGroup], rb[kHeadGroup];
#pragma unroll
  for (int u = 0; u < kHeadGroup; ++u) {
    if (u < hn) {
      ra[u] = *reinterpret_cast<const Pack<T, N>*>(a_ptr + u * p.head_dim);
      rb[u] = *reinterpret_cast<const Pack<T, N>*>(a_ptr + u * p.head_dim + p.half);
    }
  }
  const int32_t pos = p.positions[row];
  float c[N], s[N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    angle_cos_sin(static_cast<double>(pos) * inv_freq[i0 + j], p.scale, c[j], s[j]);
    s[j] *= p.sign;
  }
#pragma unroll
  for (int u = 0; u < kHeadGroup; ++u) {
    if (u < hn) {
      float a[N], b[N], oa[N], ob[N];
      unpack<T, N>(ra[u], a);
      unpack<T, N>(rb[u], b);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        oa[j] = a[j] * c[j] - b[j] * s[j];
        ob[j] = b[j] * c[j] + a[j] * s[j];
      }
      store_pack<T, N>(a_ptr + u * p.head_dim, oa);
      store_pack<T, N>(a_ptr + u * p.head_dim + p.half, ob);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

template <typename T, int N>
static void launch(const RopeLaunch<T>& p, const char* op) {
  const size_t smem = static_cast<size_t>(p.half) * sizeof(double);
  const auto grid = static_cast<unsigned>(ceil_div(p.items, kThreads));
  if (p.items <= (int64_t{1} << 31))
    launch_dependent(rope_kernel<T, N, uint32_t>, grid, kThreads, smem, p);
  else
    launch_dependent(rope_kernel<T, N, int64_t>, grid, kThreads, smem, p);
  check_launch(op);
}

static void rope_apply(const Tensor& x, const Tensor& positions, int rotated_heads,
                       const ops::RopeParams& rope, float sign, const char* op, const char* xname) {
  ENSURE(x.dtype == DType::BF16 || x.dtype == DType::F32, op, ": ", xname, " is ",
         dtype_name(x.dtype), ", expected bf16 or f32");
  ENSURE(positions.ndim() == 1, op, ": 2-D positions (an image's patch rows and columns) have no CUDA kernel yet");
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2);
  ENSURE(d <= kMaxHeadDim, op, ": head_dim ", d, " is larger than the kernel takes (", kMaxHeadDim,
         ")");
  ENSURE(rows < (int64_t{1} << 31) && heads * d < (int64_t{1} << 31), op, ": ", xname, " ",
         x.shape.str(), " is too large");
  if (rows == 0 || rotated_heads == 0 || d == 0) return;

  const int half = static_cast<int>(d / 2);
  const int vec = static_cast<int>(16 / dtype_size(x.dtype));
  const bool use_vec = half % vec == 0 && aligned16(x.data);
  const int n = use_vec ? vec : 1;
  float_switch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    RopeLaunch<T> p{};
    p.x = static_cast<T*>(x.data);
    p.positions = static_cast<const int32_t*>(positions.data);
    p.row_elems = heads * d;
    p.head_dim = static_cast<int>(d);
    p.half = half;
    p.rotated = rotated_heads;
    p.packs = half / n;
    p.groups = static_cast<int>(ceil_div(rotated_heads, kHeadGroup));
    p.items = rows * p.groups * p.packs;
    p.rope = rope;
    p.scale = ops::rope_output_scale(rope);
    p.sign = sign;
    if (use_vec)
      launch<T, 16 / sizeof(T)>(p, op);
    else
      launch<T, 1>(p, op);
  });
}

void rope_forward(const Tensor& x, const Tensor& positions, int rotated_heads, const ops::RopeParams& rope) {
  rope_apply(x, positions, rotated_heads, rope, 1.f, "rope_forward", "x");
}

void rope_backward(const Tensor& dx, const Tensor& positions, int rotated_heads,
                   const ops::RopeParams& rope) {
  rope_apply(dx, positions, rotated_heads, rope, -1.f, "rope_backward", "dx");
}

}  // namespace engine::cuda
